"""Fit and validity, the per-number rules and the one plan-file writer, through ``regen tune`` and the
``tune`` rule's entry, on real public configs (resources/models/*/SOURCE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.io import write_json
from regen.runconfig import ServerConfig
from regen.sglang.config import PlanFile
from regen.sglang.models import ModelShape
from regen.sglang.plan import PlanError, Workload, plan
from regen.sglang.recommend import plan_file, recommend
from regen.tune.tune import cli, write_plan_for_workflow

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200 = [
    "--sglang-version",
    "0.5.17",
    "--gpu-memory-mib",
    "143771",
    "--prompt-p50",
    "300",
    "--prompt-p99",
    "2000",
]
H200 += ["--max-tokens", "8192"]


def tune(capsys: pytest.CaptureFixture[str], name: str, *extra: str) -> tuple[int, str, str]:
    rc = cli(["--model-config", str(MODELS / name), *H200, *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_model_that_does_not_fit_names_the_smallest_tp(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = tune(capsys, "deepseek-v3", "--tp", "1")
    assert rc != 0
    assert "leave no KV cache memory" in err and "the smallest tp that fits: 8" in err


def test_a_tp_sglang_refuses_is_refused_with_its_cause(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = tune(capsys, "qwen3-30b-a3b-fp8", "--tp", "4")
    assert rc != 0 and "tp 4 refused by SGLang" in err and "block_n 128" in err
    with pytest.raises(PlanError, match="tp 8 refused"):  # Qwen3-235B-FP8: expert width 1536 / 8 = 192
        plan(ModelShape.from_config(MODELS / "qwen3-235b-a22b-fp8"), 143771, 8, [], None, "0.5.17")


def test_an_unmodelled_architecture_gets_sglangs_own_planning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    given = ["--context-length", "8192"]
    out_file = tmp_path / "server.json"
    rc, out, _ = tune(capsys, "llama-4-scout", "--tp", "8", "--json", "--out", str(out_file), "--", *given)
    assert rc == 0
    report = json.loads(out)
    assert "is_hybrid_swa_model" in report["unmodelled"]
    assert report["recommended"]["args"] == given  # nothing that changes memory
    written = PlanFile.read(out_file)
    assert written.launch_args == tuple(given) and written.launched == "given" and not written.given
    assert "SGLang plans its own memory" in written.warnings[0]


def test_tune_json_reports_the_numbers_and_their_rules(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--mem-fraction-static", "0.92", "--max-running-requests", "267", "--disable-radix-cache"]
    rc, out, _ = tune(capsys, "gpt-oss-20b", "--json", "--", *flags)
    assert rc == 0
    report = json.loads(out)
    assert report["kv_cache_tokens"] == pytest.approx(4_852_022, rel=0.01)  # the H200 log (issue 33)
    assert report["weights_gib"] == pytest.approx(15.0, rel=0.02)
    assert report["swa_tokens"] == 85_004
    rules = report["rules"]
    assert "SWAChunkCapPoolConfigurator" in rules["kv_cache_tokens"] == rules["swa_tokens"]
    assert (
        "mxfp4" in rules["weights_gib"] and "resolve_max_num_reqs" in rules["effective_max_running_requests"]
    )
    assert set(report["recommended"]["rules"]) >= {"kv_cache_tokens", "weights_gib", "client_concurrency"}
    rc, table, _ = tune(capsys, "gpt-oss-20b", "--", *flags)
    assert "sliding-window tokens" in table and "kv_cache_tokens: pool_configurator." in table


def test_the_plan_file_is_written_once_and_reads_back(tmp_path: Path) -> None:
    model = ModelShape.from_config(MODELS / "llama-3.1-8b")
    rec = recommend(model, 143771, 1, [], Workload(300, 2000, 8192), "0.5.17", allow_fp8_kv=False,
                    allow_bf16_state=False)  # fmt: skip
    built = plan_file(rec, sglang_version="0.5.17", model_config="m", gpu_memory_mib=143771)
    built.write(tmp_path / "server.json")
    assert PlanFile.read(tmp_path / "server.json") == built
    assert built.launched_section["client_concurrency"] == rec.recommended.client_concurrency
    external = tmp_path / "external.json"
    summary = tmp_path / "summary.json"
    write_json(summary, {"prompt_tokens_p50": 300, "prompt_tokens_p99": 900})
    cfg = {"mode": "external", "model_path": "unused", "model_config": str(MODELS / "llama-3.1-8b")}
    write_plan_for_workflow(
        server_cfg=ServerConfig.from_mapping(cfg),
        max_tokens=512,
        audit_summary=str(summary),
        out_path=str(external),
    )
    assert PlanFile.read(external) == PlanFile.for_external_server()
