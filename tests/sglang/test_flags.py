"""Flag checks against the bundled 0.5.23 option list, and against SGLang's real parser when installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from regen.runconfig import ServerConfig
from regen.sglang import flags
from regen.sglang.config import PlanFile
from regen.sglang.flags import FlagError, bundled_flags, check_flags


def _bundled_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flags, "_real_parser", lambda: None)


def test_bundled_list_has_the_planner_flags() -> None:
    names = bundled_flags("0.5.23")
    assert len(names) > 500
    for flag in ("--mem-fraction-static", "--max-mamba-cache-size", "--mamba-radix-cache-strategy",
                 "--cuda-graph-max-bs-decode", "--tp-size", "--skip-server-warmup",
                 "--disable-prefill-cuda-graph", "--cuda-graph-backend-prefill"):  # fmt: skip
        assert flag in names
    assert "--cuda-graph-max-bs" not in names and "--mamba-scheduler-strategy" not in names


def test_good_flags_pass_with_bundled_list(monkeypatch: pytest.MonkeyPatch) -> None:
    _bundled_only(monkeypatch)
    result = check_flags(["--mem-fraction-static", "0.9", "--tp-size=2", "--disable-radix-cache"])
    assert result.method == "bundled-list-0.5.23"


@pytest.mark.parametrize(
    ("argv", "flag", "suggestion"),
    [
        (["--mem-fraction-statc", "0.9"], "--mem-fraction-statc", "--mem-fraction-static"),
        (["--tp", "2"], "--tp", "--tp-size"),
        (
            ["--mamba-scheduler-strategy", "no_buffer"],
            "--mamba-scheduler-strategy",
            "--mamba-radix-cache-strategy",
        ),
        (["--cuda-graph-max-bs", "512"], "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
    ],
)
def test_typos_prefixes_and_renames_rejected(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], flag: str, suggestion: str
) -> None:
    _bundled_only(monkeypatch)
    with pytest.raises(FlagError) as info:
        check_flags(argv)
    assert info.value.flag == flag and info.value.suggestion == suggestion
    assert suggestion in str(info.value)


def test_the_launch_command_skips_sglangs_warmup_once_and_passes_the_flag_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from regen.serving.local_sglang import build_sglang_command

    _bundled_only(monkeypatch)
    cfg = {"host": "127.0.0.1", "reasoning_parser": "qwen3", "use_tuner": False}
    argv = build_sglang_command(ServerConfig.from_mapping({**cfg, "args": []}), None, 30000, "/models/x")
    assert argv.count("--skip-server-warmup") == 1
    given = ServerConfig.from_mapping({**cfg, "args": ["--skip-server-warmup", "--tp-size", "1"]})
    assert build_sglang_command(given, None, 30000, "/models/x").count("--skip-server-warmup") == 1
    plain = build_sglang_command(ServerConfig.from_mapping({**cfg, "args": []}), None, 30000, "/models/x",
                                 launch_defaults=False)  # fmt: skip
    assert not {"--skip-server-warmup", "--disable-prefill-cuda-graph"} & set(plain)  # a baseline as given


@pytest.mark.parametrize(
    "given",
    [
        [],
        ["--cuda-graph-backend-prefill", "breakable"],
        ["--disable-prefill-cuda-graph"],
        ["--disable-cuda-graph"],
    ],
)
def test_the_launch_command_keeps_sglangs_prefill_graphs_unless_server_args_turn_them_off(
    monkeypatch: pytest.MonkeyPatch, given: list[str]
) -> None:
    """At regen's full batch each small prefill cost 64 ms with SGLang's prefill graphs and 141 ms without
    (measurements/known-target-2026-12-02-n800.md): regen no longer turns them off."""
    from regen.serving.local_sglang import build_sglang_command
    from regen.sglang.flags import parse_flags

    _bundled_only(monkeypatch)
    cfg = {"host": "127.0.0.1", "reasoning_parser": "qwen3", "use_tuner": False, "args": given}
    argv = build_sglang_command(ServerConfig.from_mapping(cfg), None, 30000, "/models/x")
    assert argv.count("--disable-prefill-cuda-graph") == given.count("--disable-prefill-cuda-graph")
    off = parse_flags(argv[argv.index("--model-path") :]).prefill_graphs_off
    assert off is (given in (["--disable-prefill-cuda-graph"], ["--disable-cuda-graph"]))


def test_non_strict_tolerates_unknown_but_not_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    _bundled_only(monkeypatch)
    check_flags(["--some-future-flag", "1"], strict=False)
    with pytest.raises(FlagError):
        check_flags(["--tp", "2"], strict=False)


# tests/ is on sys.path, so without SGLang installed this folder (tests/sglang/) is found as a namespace
# package named ``sglang``: only a spec with an origin (a real package's __init__.py) is SGLang.
_sglang_spec = importlib.util.find_spec("sglang")
has_sglang = _sglang_spec is not None and _sglang_spec.origin is not None


@pytest.mark.sglang
@pytest.mark.skipif(not has_sglang, reason="sglang not importable (parse-only install: /work/sgvenv)")
def test_real_parser_checks_names_and_values() -> None:
    result = check_flags(["--mem-fraction-static", "0.9", "--reasoning-parser", "qwen3"])
    assert result.method == "sglang-parser"
    with pytest.raises(FlagError) as info:
        check_flags(["--tp", "2"])
    assert info.value.suggestion == "--tp-size"
    with pytest.raises(FlagError, match="--reasoning-parser"):
        check_flags(["--reasoning-parser", "bogus"])
    with pytest.raises(FlagError, match="--max-running-requests"):
        check_flags(["--max-running-requests", "many"])


@pytest.mark.sglang
@pytest.mark.skipif(not has_sglang, reason="sglang not importable (parse-only install: /work/sgvenv)")
def test_the_built_launch_command_passes_sglangs_own_parser() -> None:
    """regen's whole launch command (interpreter and -m included) is checked on its flags only."""
    from regen.serving.base import ServerError
    from regen.serving.local_sglang import build_sglang_command

    cfg = {"host": "127.0.0.1", "reasoning_parser": "qwen3", "use_tuner": True, "args": []}
    plan = PlanFile.from_json({"launch_args": ["--mem-fraction-static", "0.92", "--disable-radix-cache"]})
    argv = build_sglang_command(ServerConfig.from_mapping(cfg), plan, 30000, "/models/x")
    assert argv[1:3] == ["-m", "sglang.launch_server"] and "--disable-radix-cache" in argv
    assert argv.count("--skip-server-warmup") == 1  # SGLang's own warm-up does not hold readiness
    assert "--disable-prefill-cuda-graph" not in argv  # SGLang's prefill graphs stay on
    with pytest.raises(ServerError, match="--max-running-request"):
        build_sglang_command(
            ServerConfig.from_mapping({**cfg, "args": ["--max-running-request", "8"]}),
            plan,
            30000,
            "/models/x",
        )


@pytest.mark.sglang
@pytest.mark.skipif(not has_sglang, reason="sglang not importable (parse-only install: /work/sgvenv)")
def test_every_tuner_candidate_passes_sglangs_own_parser() -> None:
    """The static recommendation, every scheduler candidate (ReplaySSM decode too) and MTP candidate."""
    from regen.sglang.models import ModelShape
    from regen.sglang.plan import Workload
    from regen.sglang.recommend import recommend

    model = ModelShape.from_config(Path(__file__).parents[2] / "resources/models/gpu-qwen3.6-27b-text")
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=2048, expected_output_tokens=636)
    rec = recommend(model, 143771, 1, ["--load-format", "dummy"], wl, "0.5.23", allow_bf16_state=True,
                    allow_replay_decode=True, allow_fp8_kv=False)  # fmt: skip
    launched = [c.args for c in (*rec.candidates, *rec.speculative)]
    assert any("--enable-linear-replayssm" in args for args in launched)
    assert any("--speculative-algorithm" in args for args in launched)  # the sweep's MTP candidates too
    for args in launched:
        assert check_flags(list(args)).method == "sglang-parser", args


def test_the_local_mode_builds_its_command_at_once_and_checks_it_while_the_server_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from regen.serving.base import ServerError
    from regen.serving.local_sglang import LocalSGLang

    _bundled_only(monkeypatch)
    cfg = {
        "host": "127.0.0.1",
        "reasoning_parser": "qwen3",
        "use_tuner": False,
        "args": ["--max-running-request", "8"],
    }
    mode = LocalSGLang()
    argv = mode.command(ServerConfig.from_mapping(cfg), None, 30000, "/models/x")  # built, not yet checked
    assert "--max-running-request" in argv
    with pytest.raises(ServerError, match="--max-running-request"):
        mode.launch_check(argv)  # regen.serving.slots.check_while_starting runs it


@pytest.mark.sglang
@pytest.mark.skipif(not has_sglang, reason="sglang not importable (parse-only install: /work/sgvenv)")
@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_a_dense_and_a_moe_recommendation_pass_sglangs_own_parser(name: str) -> None:
    """The attention-only plan's own flags: KV pages, decode graphs to the planned batch, refills batched
    and the prefill graphs sized for them."""
    from regen.sglang.models import ModelShape
    from regen.sglang.plan import Workload
    from regen.sglang.recommend import recommend

    model = ModelShape.from_config(Path(__file__).parents[2] / "resources/models" / name)
    wl = Workload(prompt_p50=300, prompt_p99=2000, max_tokens=8192, expected_output_tokens=1450)
    rec = recommend(model, 143771, 1, ["--load-format", "dummy"], wl, "0.5.23", allow_fp8_kv=False,
                    allow_bf16_state=False)  # fmt: skip
    assert "--page-size" in rec.args and "--cuda-graph-max-bs-decode" in rec.args
    assert check_flags(list(rec.args)).method == "sglang-parser", rec.args
