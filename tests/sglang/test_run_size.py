"""Pilot size (issue 57 item 6): a run too small to win back the decode CUDA graphs regen's plan adds at
start keeps SGLang's defaults, says why on the console and in the plan's rules; a large run keeps the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.io import read_json, write_json
from regen.runconfig import GenerateConfig, ServerConfig
from regen.sglang.graphs import decode_graph_batch_sizes
from regen.sglang.models import ModelShape
from regen.sglang.recommend import recommend
from regen.sglang.run_size import DECODE_GRAPH_CAPTURE_S, pilot_size_verdict
from regen.sglang.search import CACHE_REPORT_FLAG
from regen.sglang.workload import Workload, run_completions
from regen.tune.tune import write_plan_for_workflow
from regen.tune.workload_plan import variant_shares

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
NO_TRADEOFFS = {"allow_fp8_kv": False, "allow_bf16_state": False}
THROUGHPUT_FLAGS = (
    "--cuda-graph-max-bs-decode",
    "--max-running-requests",
    "--page-size",
    "--mem-fraction-static",
)


def _bench(completions: int | None) -> Workload:
    return Workload(
        prompt_p50=300, prompt_p99=2000, max_tokens=8192,
        expected_output_tokens=1450, expected_output_cv=0.678, completions=completions,
    )  # fmt: skip


def test_decode_graph_sizes_are_sglangs() -> None:
    # the sizes SGLang logged capturing on the H200 (measurements/*-logs: "Capture target decode CUDA graph")
    assert [len(decode_graph_batch_sizes(n)) for n in (256, 443, 562, 1024)] == [36, 48, 54, 68]
    assert decode_graph_batch_sizes(443)[-2:] == [432, 443]


def test_an_800_prompt_run_keeps_sglangs_defaults() -> None:
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    small = recommend(llama, H200_MIB, 1, [], _bench(800), "0.5.23", **NO_TRADEOFFS)
    large = recommend(llama, H200_MIB, 1, [], _bench(100_000), "0.5.23", **NO_TRADEOFFS)
    # the large run keeps the plan: decode graphs above SGLang's 256 and the flags that feed them
    assert large.small_run == "" and all(f in large.args for f in THROUGHPUT_FLAGS)
    added = len(decode_graph_batch_sizes(large.recommended.cuda_graph_max_bs)) - 36
    assert large.recommended.cuda_graph_max_bs > 256 and added > 0
    # the small one: SGLang's defaults (the given flags, none here), the cache report, the defaults' client
    assert not any(f in small.args for f in THROUGHPUT_FLAGS) and "--disable-radix-cache" not in small.args
    assert CACHE_REPORT_FLAG in small.args and small.recommended.cuda_graph_max_bs == 256
    assert small.recommended.client_concurrency == small.given.client_concurrency
    line = small.small_run
    assert line.startswith("regen: SGLang's defaults for this run: 800 completions x 1,450-token answers")
    assert f"({added} sizes x {DECODE_GRAPH_CAPTURE_S:g} s = {added * DECODE_GRAPH_CAPTURE_S:.1f} s)" in line
    assert small.reasons == (line,) and small.recommended.rules()["client_concurrency"].startswith(line)
    # a run whose size is unknown (a provisional plan) is not weighed
    assert recommend(llama, H200_MIB, 1, [], _bench(None), "0.5.23", **NO_TRADEOFFS).args == large.args


def test_the_verdict_turns_at_the_break_even() -> None:
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    rec = recommend(llama, H200_MIB, 1, [], _bench(None), "0.5.23", **NO_TRADEOFFS)
    client = rec.recommended.client_concurrency
    verdicts = {n: pilot_size_verdict(rec.given, rec.recommended, _bench(n)) for n in (800, 2_000, 100_000)}
    assert verdicts[800].takes_defaults and verdicts[2_000].takes_defaults
    assert (
        not verdicts[100_000].takes_defaults
        and verdicts[100_000].most_saved_s > 10 * verdicts[800].extra_start_s
    )
    # the first batch ramps: a run no larger than the client has nothing at the full batch to win
    assert pilot_size_verdict(rec.given, rec.recommended, _bench(client)).most_saved_s == 0
    # no graph added (the given plan against itself): nothing to win back, the plan stands
    assert not pilot_size_verdict(rec.given, rec.given, _bench(800)).takes_defaults


def test_the_tune_rule_says_so_on_the_console(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cfg = {
        "mode": "sglang", "model_path": "unused", "model_config": str(MODELS / "llama-3.1-8b"),
        "gpu_memory_mib": H200_MIB, "tp": 1, "args": [], "use_tuner": True, "sglang_version": "0.5.23",
    }  # fmt: skip
    hist = {"supervised_tokens": {"count": 1, "mean": 1450.0, "std": 983.0}}
    for kept in (800, 100_000):
        summary = tmp_path / f"{kept}.summary.json"
        write_json(summary, {"prompt_tokens_p50": 300, "prompt_tokens_p99": 2000, "total": kept + 5,
                             "excluded": 5, "kept": kept, "histograms": hist})  # fmt: skip
        out = str(tmp_path / f"{kept}.json")
        write_plan_for_workflow(server_cfg=ServerConfig.from_mapping(cfg), max_tokens=8192,
                                audit_summary=str(summary), out_path=out)  # fmt: skip
    err = capfd.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("regen: SGLang's defaults for this run")]
    assert len(lines) == 1 and "800 completions" in lines[0]
    small, large = read_json(tmp_path / "800.json"), read_json(tmp_path / "100000.json")
    assert "--cuda-graph-max-bs-decode" not in small["launch_args"]
    assert small["recommended"]["rules"]["client_concurrency"].startswith(lines[0])
    assert "--cuda-graph-max-bs-decode" in large["launch_args"]


def test_completions_count_the_kept_samples_times_n() -> None:
    four = variant_shares(GenerateConfig.from_dict({"sampling": {"n": 4}}))
    assert run_completions({"kept": 800, "total": 900}, four) == 3200
    assert run_completions({"total": 900, "excluded": 100}, ()) == 800
    assert run_completions({}, four) is None


def test_an_unknown_answer_length_counts_nothing_saved() -> None:
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    unknown = Workload(prompt_p50=300, prompt_p99=2000, max_tokens=1024, completions=100_000)
    rec = recommend(llama, H200_MIB, 1, [], unknown, "0.5.23", **NO_TRADEOFFS)
    assert rec.small_run.startswith("regen: SGLang's defaults for this run: the answers' length is unknown")
    assert "100,000 completions" in rec.small_run and "--cuda-graph-max-bs-decode" not in rec.args
