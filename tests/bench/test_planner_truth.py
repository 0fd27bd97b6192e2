"""The GPU truth benches' own logic on CPU (bench/gpu/planner_truth.py, bench/gpu/dense.py): reading
SGLang 0.5.17's startup log (real lines from the H200, and lines formatted as 0.5.17's source prints
them where no real log exists), the comparison and its verdicts, the dense workload and its report."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from bench.gpu import dense, planner_truth, truth_run
from bench.gpu.planner_truth import RegenPlan, Startup, read_startup

DATA = Path(__file__).resolve().parents[1] / "data"
HYBRID_LOG = (DATA / "sglang" / "startup-0.5.17-h200-hybrid.log").read_text()
MTP_LOG = (DATA / "sglang" / "startup-0.5.17-h200-mtp.log").read_text()

# gpt-oss-20b's pools (issue 33's H200 numbers) in 0.5.17's wording: pool_configurator.py
# HybridSWAPoolConfigurator._solve_pool_sizes, memory_pool.py's "<label> KV Cache is allocated." with the
# "Full"/"SWA" labels of swa_memory_pool.py, kv_cache_configurator.py's "Memory pool end."
SWA_LOG = """\
[2026-12-01 20:00:01] Load weight end. elapsed=3.10 s, type=GptOssForCausalLM, quant=mxfp4, \
avail mem=124.10 GB, mem usage=15.00 GB.
[2026-12-01 20:00:02] Use sliding window memory pool. full_layer_tokens=4852022, swa_layer_tokens=85004
[2026-12-01 20:00:02] Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4852022, K size: 55.53 GB, \
V size: 55.53 GB
[2026-12-01 20:00:02] SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 85004, K size: 0.97 GB, \
V size: 0.97 GB
[2026-12-01 20:00:02] SWAKVPool mem usage: 113.00 GB, swa size: 85004, full size: 4852022
[2026-12-01 20:00:02] Memory pool end. avail mem=10.20 GB
"""
# an MLA pool logs one size (memory_pool.py, the non-tuple branch)
MLA_LINE = (
    "[2026-12-01 20:00:02] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1234567, KV size: 80.1 GB"
)
FAILED_IMPORT = """\
[2026-12-01 20:00:01] Ignore import error when loading sglang.srt.models.inkling: No module named 'helion'
Traceback (most recent call last):
  File "/tmp/site/sglang/srt/layers/quantization/mxfp4.py", line 988, in process_weights_after_loading
    from triton_kernels.numerics_details.mxfp import upcast_from_mxfp
ModuleNotFoundError: No module named 'triton_kernels'
"""


def test_real_hybrid_startup_is_read_up_to_the_pool():
    s = read_startup(HYBRID_LOG)
    assert (s.weights_gib, s.kv_tokens, s.swa_tokens) == (50.16, 206302, None)
    assert s.kv_dtype == "torch.bfloat16"
    assert s.mamba_cache_size == 454
    assert (s.max_total_num_tokens, s.max_running_requests) == (206302, 454)
    assert s.mem_fraction_static == 0.92 and s.pool_end_avail_gib == 10.66
    assert s.pool_allocated and s.missing_package is None  # the ignored 'helion' import does not count


def test_the_pool_is_allocated_before_capture_ends():
    """What the truth bench reads is all there once "Memory pool end." is (it kills the server there)."""
    cut = HYBRID_LOG[: HYBRID_LOG.index(planner_truth.POOL_END) + 200]
    s = read_startup(cut)
    assert s.pool_allocated and (s.weights_gib, s.kv_tokens, s.mamba_cache_size) == (50.16, 206302, 454)
    assert s.max_running_requests is None  # logged only after CUDA-graph capture


def test_mtp_start_takes_the_target_not_the_draft():
    s = read_startup(MTP_LOG)
    assert s.weights_gib == 50.16  # not the draft's 5.53
    assert s.kv_tokens == 124421 and s.mamba_cache_size == 200


def test_sliding_window_pools_full_and_swa():
    s = read_startup(SWA_LOG)
    assert (s.kv_tokens, s.swa_tokens, s.weights_gib) == (4852022, 85004, 15.0)
    only_summary = "\n".join(line for line in SWA_LOG.splitlines() if "KV Cache" not in line)
    assert (read_startup(only_summary).kv_tokens, read_startup(only_summary).swa_tokens) == (4852022, 85004)


def test_mla_single_size_line():
    assert read_startup(MLA_LINE).kv_tokens == 1234567


def test_a_failed_import_is_a_missing_package_not_a_refusal():
    s = read_startup(FAILED_IMPORT)
    assert not s.pool_allocated and s.missing_package == "triton_kernels"
    assert "ModuleNotFoundError" in (s.error or "")


def test_trimmed_log_keeps_every_memory_line():
    trimmed = planner_truth.trimmed_log(HYBRID_LOG, head=2, tail=2)
    assert read_startup(trimmed) == read_startup(HYBRID_LOG)
    assert len(trimmed) < len(HYBRID_LOG)


def _row(target: str, startup: Startup, plan: RegenPlan) -> dict:
    row = {"name": target, "sglang_started": startup.pool_allocated, "regen_refused": plan.refused,
           "sglang": startup.to_json()}  # fmt: skip
    if row["sglang_started"] and not plan.refused:
        row["kv_error"] = planner_truth.relative_error(plan.number("kv_cache_tokens"), startup.kv_tokens)
        row["weights_error"] = planner_truth.relative_error(plan.number("weights_gib"), startup.weights_gib)
        swa = plan.number("swa_tokens")
        row["swa_error"] = (
            planner_truth.relative_error(swa, startup.swa_tokens) if startup.swa_tokens else None
        )
        row["swa_missing_in_regen"] = startup.swa_tokens is not None and swa is None
    row["verdict"] = planner_truth.verdict(row, startup)
    return row


def test_verdicts_and_the_last_line():
    swa = read_startup(SWA_LOG)
    good = RegenPlan(0, {"kv_cache_tokens": 4852022 * 1.005, "weights_gib": 15.2, "swa_tokens": 85004}, "")
    no_swa = RegenPlan(0, {"kv_cache_tokens": 2721467, "weights_gib": 3.348}, "")
    refused = RegenPlan(2, None, "does not fit")
    failed = Startup(error="RuntimeError: Not enough memory", pool_allocated=False)
    rows = [
        _row("ok", swa, good),
        _row("off", swa, no_swa),
        _row("refused", failed, refused),
        _row("planned", failed, no_swa),
        _row("missing", read_startup(FAILED_IMPORT), no_swa),
    ]
    verdicts = [r["verdict"] for r in rows]
    assert verdicts[0] == "ok"
    assert (
        verdicts[1].startswith("off:") and "kv_error" in verdicts[1] and "swa_tokens missing" in verdicts[1]
    )
    assert verdicts[2:] == [
        "refused as SGLang",
        "SGLang failed, regen planned",
        "not measured: the host lacks triton_kernels",
    ]
    s = planner_truth.summary(rows)
    assert s["refused_as_sglang"] == 1 and s["sglang_failed"] == 2 and s["not_measured"] == ["missing"]
    assert s["max_kv_error_model"] == "off" and s["max_kv_error"] == pytest.approx(1 - 2721467 / 4852022)
    line = planner_truth.final_line(s)
    assert line.startswith(
        "truth: models=5 max_kv_error=43.91% max_weights_error=77.68% max_swa_error=0.00% "
    )
    assert line.endswith("refused_as_sglang=1/2")


def test_multimodal_checkpoint_is_served_as_its_text_model(tmp_path):
    target = next(t for t in planner_truth.TARGETS if t.model == "qwen3.5-35b-a3b")
    out = planner_truth.model_dir_for(target, tmp_path)
    text = json.loads((out / "config.json").read_text())
    real = json.loads((planner_truth.MODELS / "qwen3.5-35b-a3b" / "config.json").read_text())
    assert text["architectures"] == ["Qwen3_5MoeForCausalLM"] and text["model_type"] == "qwen3_5_moe_text"
    assert {k: v for k, v in text.items() if k != "architectures"} == {
        **real["text_config"],
        "tie_word_embeddings": real["tie_word_embeddings"],
    }
    plain = next(t for t in planner_truth.TARGETS if t.model == "llama-3.1-8b")
    assert planner_truth.model_dir_for(plain, tmp_path) == planner_truth.MODELS / "llama-3.1-8b"


def test_every_target_has_a_real_config():
    for target in planner_truth.TARGETS:
        assert (planner_truth.MODELS / target.model / "config.json").is_file(), target
    for model in dense.MODEL_NAMES:
        assert "vocab_size" in json.loads((planner_truth.MODELS / model / "config.json").read_text())


def test_dense_workload_is_the_issues_and_fixed():
    w = dense.Workload(vocab=128256)
    lengths = [w.max_new_tokens(i) for i in range(20000)]
    assert statistics.median(lengths) == pytest.approx(1200, rel=0.03)
    assert statistics.fmean(lengths) == pytest.approx(1450, rel=0.03)  # the cap at 8,192 trims a little
    assert max(lengths) <= 8192 and min(lengths) >= 1
    assert lengths[:50] == [dense.Workload(vocab=128256).max_new_tokens(i) for i in range(50)]
    ids = w.prompt_ids(7)
    assert len(ids) == 300 and ids == w.prompt_ids(7) and ids != w.prompt_ids(8) and max(ids) < 128256
    assert dense.lognormal_sigma(1200, 1450) == pytest.approx(math.sqrt(2 * math.log(1450 / 1200)))
    body = dense.generate_body(w, 3)
    assert body["sampling_params"] == {
        "max_new_tokens": w.max_new_tokens(3),
        "ignore_eos": True,
        "temperature": 0.0,
    }


def test_dense_reads_both_answer_shapes_and_writes_its_line():
    assert dense.completion_tokens({"output_ids": [1, 2], "meta_info": {"completion_tokens": 2}}) == 2
    assert dense.completion_tokens({"usage": {"completion_tokens": 5}}) == 5
    row = {
        "model": "llama-3.1-8b",
        "regen_tps": 15000.4,
        "default256_tps": 12827.0,
        "default512_tps": 13639.0,
        "vs_default": 15000.4 / 12827.0,
        "predicted_kv": 925447,
        "realized_kv": 925436,
    }
    assert dense.final_line(row) == (
        "dense: model=llama-3.1-8b regen_tps=15000 default256_tps=12827 default512_tps=13639 "
        "vs_default=1.169 best_default_in_flight=na steady_windows=na predicted_kv=925447 realized_kv=925436 "
        "regen_log_tps=na default256_log_tps=na "
        "fp8kv_tps=na fp8kv_log_tps=na page1_tps=na page1_log_tps=na page16_tps=na page16_log_tps=na"
    )
    assert dense.flag_value(["--mem-fraction-static", "0.92", "--max-running-requests", "90"],
                            "--max-running-requests") == "90"  # fmt: skip


# ------------------------------------------------------------------------------------ the hold phase

RETRACT_LINE = (
    "[2026-12-04 07:00:00] KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
    "#new_tokens_gained: 1234, #new_token_ratio: 0.4000 -> 0.5000\n"
)
OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.19 GiB. GPU 0 has a total capacity of "
    "139.81 GiB of which 712.31 MiB is free.\n"
)


def _samples(running: list[int], start: float = 100.0) -> list:
    from bench.gpu import hold

    return [hold.Sample(start + i, r, 0) for i, r in enumerate(running)]


def _assess(
    running: list[int], log: str = "", *, alive: bool = True, planned: int = 1000, hold_s: float = 60
):
    from bench.gpu import hold

    samples = _samples(running)
    return hold.assess(samples, log, planned=1000, hold_s=hold_s, alive=alive, ready_at=90.0,
                       ended_at=samples[-1].t if samples else 100.0)  # fmt: skip


def test_a_hold_counts_only_at_the_planned_batch_for_its_whole_length():
    ramp = [100, 400, 800]
    held = _assess([*ramp, *[990] * 62])
    assert held.verdict == "held" and held.held
    assert held.reached_after_s == 13.0 and held.held_s == 61.0 and held.median_running == 990
    short = _assess([*ramp, *[990] * 30])
    assert short.verdict == "held 29 s of the 60 s asked"
    assert (
        _assess([*ramp, 850, 880]).verdict == "did not reach the planned batch: at most 880 running of 1,000"
    )
    sagging = _assess([*ramp, 950, *[600] * 61])
    assert sagging.verdict.startswith("did not hold the planned batch: median 600")


def test_a_server_that_stops_decoding_is_not_holding():
    from bench.gpu import hold

    samples = _samples([995] * 40)  # lines until t=139, then nothing while the process lives on
    stalled = hold.assess(samples, "", planned=1000, hold_s=60, alive=True, ready_at=90.0, ended_at=170.0)
    assert stalled.verdict == "stalled: no decode line in the last 31 s"


def test_a_crash_or_a_retraction_storm_is_not_a_hold():
    crashed = _assess([*[990] * 5], OOM_LINE, alive=False)
    assert crashed.verdict.startswith(
        "crashed: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.19"
    )
    assert crashed.oom is not None and "712.31 MiB is free" in crashed.oom
    few = RETRACT_LINE.format(n=20)  # 20 requests in a minute: 2% of the batch
    ok = _assess([990] * 61, few)
    assert ok.verdict == "held" and (ok.retract_events, ok.retracted_reqs) == (1, 20)
    storm = _assess([990] * 61, few + RETRACT_LINE.format(n=70))
    assert storm.verdict.startswith("retraction storm: 90 requests retracted in 60 s (2 events)")


def test_the_hold_plans_for_the_issues_workload_and_samples():
    from bench.gpu import hold

    assert hold.HOLD_WORKLOAD_ARGS[hold.HOLD_WORKLOAD_ARGS.index("--expected-output-tokens") + 1] == "1437"
    body = hold.sampled_body(dense.Workload(vocab=201088), 3)
    assert body["sampling_params"]["temperature"] == 1.0  # the sampler's softmax path, not argmax
    assert body["sampling_params"]["max_new_tokens"] == dense.Workload(vocab=201088).max_new_tokens(3)
    plan = RegenPlan(
        0, {"recommended": {"args": ["--max-running-requests", "9"], "client_concurrency": 8}}, ""
    )
    assert hold.recommended(plan)[:2] == (["--max-running-requests", "9"], 8)


def test_dry_run_holds_the_recommended_server_and_says_so(tmp_path):
    """The whole sequence against regen's simulated server: the startup check, then the hold."""
    out = tmp_path / "out"
    rc = truth_run.main(["--dry-cpu", "--out", str(out), "--work", str(tmp_path / "work"),
                         "--only", "qwen3.6-27b-text", "--hold-s", "3"])  # fmt: skip
    assert rc == 0
    doc = json.loads(next(out.glob("planner-truth-*-dry.json")).read_text())
    row = doc["rows"][0]
    h = row["hold"]
    assert h["verdict"] == "held" and h["alive"] and h["held_s"] >= 3
    assert h["median_running"] >= 0.9 * h["client_concurrency"] > 0
    assert "--max-running-requests" in " ".join(h["args"]) or h["client_concurrency"] > 0
    assert doc["summary"]["held"] == ["qwen3.6-27b-text"]
    assert planner_truth.final_line(doc["summary"]).endswith("held=1/1")
    assert "Hold at the planned batch" in next(out.glob("planner-truth-*-dry.md")).read_text()
    assert (tmp_path / "work" / "logs" / "qwen3.6-27b-text-hold.trimmed.log").is_file()


def test_dry_run_a_server_that_dies_mid_hold_does_not_count(tmp_path):
    from bench.gpu import hold

    target = next(t for t in planner_truth.TARGETS if t.name == "qwen3.6-27b-text")
    (tmp_path / "logs").mkdir()
    settings = hold.HoldSettings(dry=True, work=tmp_path, hold_s=30, dry_faults={"crash_after": 3})
    result = hold.hold_target(target, settings)
    assert result["verdict"].startswith("crashed") and not result["alive"]
