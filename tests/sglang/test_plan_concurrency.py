"""Concurrency for attention-only models from the expected lengths, never below SGLang's defaults.

SGLang's rules the plan is checked against: the default running cap is
``KVCacheConfigurator.resolve_max_num_reqs`` (clamp(tokens / context_len x 512, 2048, 4096), at most
tokens // 2); the default decode graphs stop at 256 on an H200 at tp 1 (``handle_gpu_memory_settings``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from pathlib import Path

import pytest

from regen.sglang.flags import parse_flags
from regen.sglang.models import ModelShape
from regen.sglang.plan import MemoryPlan, Workload, plan
from regen.sglang.recommend import Recommendation, recommend
from regen.sglang.search import MAX_PLANNED_DECODE_GRAPH_BS, PLANNED_PAGE_SIZE
from regen.sglang.workload import page_waste
from regen.tune.tune import cli

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
NO_TRADEOFFS = {"allow_fp8_kv": False, "allow_bf16_state": False}
#: the H200 bench workload (issue 33): 300-token prompts, answers with mean ~1,450, max_tokens 8,192
BENCH = Workload(prompt_p50=300, prompt_p99=2000, max_tokens=8192, expected_output_tokens=1450)
#: what a request holds beyond its context in the planned KV pages (the last page half full, on average)
PAGED = page_waste(PLANNED_PAGE_SIZE)


@pytest.fixture(scope="module")
def dense() -> ModelShape:
    return ModelShape.from_config(MODELS / "qwen3-8b")


def assert_at_least_sglangs_cap_where_it_fits(rec: Recommendation, default: MemoryPlan) -> None:
    """The recommended cap is SGLang's own, or the largest batch whose decode step fits beside the CUDA
    graphs where a step at SGLang's would not (issue 49): never a batch that runs out of memory."""
    p = rec.recommended
    assert p.decode_step_fits and p.decode_headroom is not None
    fitting = p.decode_headroom.fitting_batch
    assert p.effective_max_running_requests >= min(default.effective_max_running_requests, fitting)


def sglang_default_cap(tokens: int, context_len: int) -> int:
    """KVCacheConfigurator.resolve_max_num_reqs without --max-running-requests (0.5.17 and 0.5.23)."""
    return min(max(min(int(tokens / context_len * 512), 4096), 2048), tokens // 2)


def test_the_kv_fills_at_the_expected_context(dense: ModelShape) -> None:
    rec = recommend(dense, H200_MIB, 1, [], BENCH, "0.5.17", **NO_TRADEOFFS)
    p = rec.recommended
    n = p.client_concurrency
    assert n is not None and n > 256
    assert p.kv_cache_tokens >= n * (300 + 1450 + PAGED)  # every request at the expected context fits
    assert p.kv_cache_tokens < (n + 2) * (300 + 1450 + PAGED)  # and the KV is filled, not left idle
    flags = parse_flags(list(rec.args))
    assert flags.cuda_graph_max_bs == n  # decode graphs up to the planned batch
    # SGLang's own cap (4,096 here) is above n, but an eager decode step at 4,096 would not fit beside the
    # CUDA graphs at --mem-fraction-static 0.92 (issue 49): the cap given is the largest batch that does
    default_cap = sglang_default_cap(p.kv_cache_tokens, dense.context_length)
    assert flags.max_running_requests is not None and n <= flags.max_running_requests < default_cap
    assert p.effective_max_running_requests == flags.max_running_requests and p.decode_step_fits
    # the worst case (prompt p99 + max_tokens) would hold only a fifth of that
    assert n > 4 * (p.kv_cache_tokens // BENCH.tokens_per_request)
    assert "expected answer 1,450" in rec.reasons[0] and "retract" in rec.reasons[0]


def test_without_an_expected_length_it_says_so_and_keeps_sglangs_defaults(dense: ModelShape) -> None:
    wl = dataclasses.replace(BENCH, expected_output_tokens=None)
    rec = recommend(dense, H200_MIB, 1, [], wl, "0.5.17", **NO_TRADEOFFS)
    p = rec.recommended
    assert p.kv_cache_tokens // (300 + 8192) < 256  # max_tokens would fill the KV below the default
    assert p.client_concurrency == 256  # so the decode-graph default, not fewer
    flags = parse_flags(list(rec.args))
    assert flags.cuda_graph_max_bs is None
    # SGLang's own cap (4,096) would run an eager step out of memory at --mem-fraction-static 0.92: the
    # cap given is the largest batch that fits (issue 49)
    assert flags.max_running_requests is not None and 256 < flags.max_running_requests < 4096
    assert p.decode_step_fits
    assert "no expected answer length given" in rec.reasons[0]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("expected", [None, 200, 1450, 6000])
def test_never_below_sglangs_defaults(name: str, version: str, expected: int | None) -> None:
    model = ModelShape.from_config(MODELS / name)
    wl = dataclasses.replace(BENCH, expected_output_tokens=expected)
    rec = recommend(model, H200_MIB, 1, [], wl, version, **NO_TRADEOFFS)
    default = plan(model, H200_MIB, 1, [], wl, version)
    assert_at_least_sglangs_cap_where_it_fits(rec, default)
    assert rec.recommended.cuda_graph_max_bs >= default.cuda_graph_max_bs
    assert rec.recommended.client_concurrency >= min(default.cuda_graph_max_bs, 256)
    assert rec.recommended.client_concurrency <= rec.recommended.effective_max_running_requests


def test_a_short_answer_stops_at_the_decode_graphs(dense: ModelShape) -> None:
    """Short answers would fill the KV with more than 4,096 requests, past SGLang's default cap; the plan
    stops at the decode graphs it captures, because above them SGLang decodes eagerly, and eager decode
    was measured no faster than the defaults' graphs (issue 49: gpt-oss-20b at 2,130 running)."""
    small_vocab = ModelShape.from_dict({**dense.raw, "vocab_size": 32000}, source="qwen3-8b, vocab 32,000")
    wl = Workload(prompt_p50=50, prompt_p99=100, max_tokens=8192, expected_output_tokens=60)
    rec = recommend(small_vocab, H200_MIB, 1, [], wl, "0.5.23", **NO_TRADEOFFS)
    p, flags = rec.recommended, parse_flags(list(rec.args))
    assert flags.cuda_graph_max_bs == MAX_PLANNED_DECODE_GRAPH_BS == 1024
    assert p.client_concurrency == MAX_PLANNED_DECODE_GRAPH_BS
    assert p.kv_cache_tokens > 4096 * wl.paged_tokens_per_request(1)  # the KV alone would allow more
    assert any("decodes eagerly" in r and "in flight bounded to 1,024" in r for r in rec.reasons)


def test_tune_json_reports_the_client_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--model-config", str(MODELS / "qwen3-8b"), "--sglang-version", "0.5.17", "--gpu-memory-mib",
        str(H200_MIB), "--prompt-p50", "300", "--prompt-p99", "2000", "--max-tokens", "8192",
        "--expected-output-tokens", "1450", "--json",
    ]  # fmt: skip
    assert cli(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rec = out["recommended"]
    assert rec["client_concurrency"] > 256 and rec["cuda_graph_max_bs"] == rec["client_concurrency"]
    assert "--cuda-graph-max-bs-decode" in rec["args"]
    assert out["client_concurrency"] >= 256  # the given (default) flags: as many, eagerly past 256


def test_hybrids_keep_the_state_pool_cap() -> None:
    hybrid = ModelShape.from_config(MODELS / "gpu-qwen3.6-27b-text")
    rec = recommend(hybrid, H200_MIB, 1, [], BENCH, "0.5.17", **NO_TRADEOFFS)
    p = rec.recommended
    assert p.client_concurrency == p.effective_max_running_requests
    assert p.kv_cache_tokens >= p.effective_max_running_requests * BENCH.tokens_per_request


def test_the_tune_rule_takes_the_expected_length_from_the_old_answers(tmp_path: Path) -> None:
    from regen.io import write_json
    from regen.runconfig import ServerConfig
    from regen.sglang.config import PlanFile
    from regen.tune.tune import write_plan_for_workflow

    summary = tmp_path / "summary.json"
    old_answers = {"count": 1000, "mean": 1450.4, "buckets": []}
    write_json(
        summary,
        {
            "prompt_tokens_p50": 300,
            "prompt_tokens_p99": 2000,
            "histograms": {"supervised_tokens": old_answers},
        },
    )
    cfg = {"mode": "sglang", "model_path": "unused", "model_config": str(MODELS / "qwen3-8b")}
    cfg |= {"gpu_memory_mib": H200_MIB, "tp": 1, "args": [], "use_tuner": True, "sglang_version": "0.5.17"}
    out = tmp_path / "server.json"
    write_plan_for_workflow(
        server_cfg=ServerConfig.from_mapping(cfg),
        max_tokens=8192,
        audit_summary=str(summary),
        out_path=str(out),
    )
    plan_file = PlanFile.read(out)
    n = plan_file.client_concurrency
    assert n is not None and n > 256  # the KV filled at 300 + 1,450, not at max_tokens
    assert plan_file.recommended["kv_cache_tokens"] // (300 + 1450 + PAGED) in (n, n + 1)
    assert "the old answers' mean (audit)" in plan_file.recommended["reasons"][0]


def test_llama_on_the_h200_bench_workload() -> None:
    """The issue-33 bench (Llama-3.1-8B, 300-token prompts, answers of mean ~1,450, max_tokens 8,192):
    SGLang's defaults ran 256 in flight (graphs to 256); the plan fills the KV at 1,750 tokens a request
    and the half page each holds beyond it."""
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    rec = recommend(llama, H200_MIB, 1, [], BENCH, "0.5.17", **NO_TRADEOFFS)
    p, flags = rec.recommended, parse_flags(list(rec.args))
    assert p.client_concurrency == flags.cuda_graph_max_bs
    per_request = 1750 + PAGED
    assert p.client_concurrency * per_request <= p.kv_cache_tokens < (p.client_concurrency + 1) * per_request
    assert p.client_concurrency >= 2 * 256  # twice the default's in-flight count
    assert flags.mem_fraction_static == 0.92 and p.decode_step_fits
    # SGLang's own cap (3,539) would not fit an eager step beside the graphs at 0.92 (issue 49)
    assert flags.max_running_requests == p.effective_max_running_requests < 3539


#: the bench's answers: log-normal, median 1,200, mean 1,450, so cv = sqrt(exp(sigma^2) - 1) ~ 0.678
BENCH_CV = math.sqrt(1450 / 1200 * 1450 / 1200 - 1)


def test_with_the_spread_known_the_kv_fills_at_the_running_sets_mean_context() -> None:
    """Llama-3.1-8B on the H200 bench workload: 1,450 x (1 + 0.678^2) / 2 = 1,059 answer tokens of
    context on average across a running set (and half a page of 64), so 665 in flight fill the 925k-token
    KV (519 at 300 + 1,450)."""
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    wl = dataclasses.replace(BENCH, expected_output_cv=BENCH_CV, expected_output_cv_source="the test")
    assert wl.expected_tokens_per_request == 300 + math.ceil(1450 * (1 + BENCH_CV**2) / 2) == 1359
    rec = recommend(llama, H200_MIB, 1, [], wl, "0.5.17", **NO_TRADEOFFS)
    p, flags = rec.recommended, parse_flags(list(rec.args))
    assert p.client_concurrency == flags.cuda_graph_max_bs == p.kv_cache_tokens // (1359 + PAGED) == 665
    assert "E[L](1+cv^2)/2" in rec.reasons[0] and "cv the test" in rec.reasons[0]
    assert "spread known" in p.rules()["client_concurrency"]
    conservative = recommend(llama, H200_MIB, 1, [], BENCH, "0.5.17", **NO_TRADEOFFS).recommended
    assert conservative.client_concurrency == conservative.kv_cache_tokens // (1750 + PAGED) == 519
    assert "spread unknown" in conservative.rules()["client_concurrency"]


def test_the_running_context_matches_a_closed_loop() -> None:
    """A closed loop of slots, each decoding one token a step and replacing a finished request at once:
    its time-averaged context per slot is what the planner plans at, for a narrow and a wide spread."""
    rng = random.Random(7)
    for sigma in (0.3, 1.2):
        draws = [min(400, max(1, round(rng.lognormvariate(math.log(40), sigma)))) for _ in range(40_000)]
        mean, cv = statistics.fmean(draws), statistics.pstdev(draws) / statistics.fmean(draws)
        wl = Workload(prompt_p50=10, prompt_p99=10, max_tokens=400, expected_output_tokens=round(mean),
                      expected_output_cv=cv)  # fmt: skip
        it = iter(draws)
        slots = [[next(it), 0] for _ in range(64)]  # [length, generated]
        total = samples = 0
        for step in range(12_000):
            for slot in slots:
                slot[1] += 1
                if slot[1] >= slot[0]:
                    slot[:] = [next(it), 0]
            if step > 2_000:  # past a few lifetimes
                total += sum(10 + g for _, g in slots)
                samples += len(slots)
        simulated = total / samples
        assert wl.expected_tokens_per_request == pytest.approx(simulated, rel=0.05)
        conservative = dataclasses.replace(wl, expected_output_cv=None).expected_tokens_per_request
        assert (conservative > simulated) == (cv < 1)  # p50 + E[L] errs long only while cv < 1


def test_the_answer_part_is_capped_at_half_max_tokens() -> None:
    wl = Workload(prompt_p50=100, prompt_p99=100, max_tokens=8192, expected_output_tokens=4000,
                  expected_output_cv=3.0)  # fmt: skip
    assert wl.running_answer_tokens == 4096  # E[X^2] / E[X] <= max_tokens for X = min(L, max_tokens)


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-30b-a3b", "llama-3.1-8b"])
@pytest.mark.parametrize("cv", [0.0, 0.68, 2.0])
def test_never_below_sglangs_defaults_with_the_spread_known(name: str, cv: float) -> None:
    model = ModelShape.from_config(MODELS / name)
    wl = dataclasses.replace(BENCH, expected_output_cv=cv)
    rec = recommend(model, H200_MIB, 1, [], wl, "0.5.23", **NO_TRADEOFFS)
    default = plan(model, H200_MIB, 1, [], wl, "0.5.23")
    assert_at_least_sglangs_cap_where_it_fits(rec, default)
    assert rec.recommended.cuda_graph_max_bs >= default.cuda_graph_max_bs
    assert rec.recommended.client_concurrency >= min(default.cuda_graph_max_bs, 256)


def test_the_tune_rule_takes_the_spread_from_the_old_answers_std(tmp_path: Path) -> None:
    from regen.ingest.audit_summary import Log2Histogram
    from regen.io import write_json
    from regen.runconfig import ServerConfig
    from regen.sglang.config import PlanFile
    from regen.tune.tune import write_plan_for_workflow

    hist = Log2Histogram()
    rng = random.Random(3)
    for _ in range(5000):
        hist.add(min(8192, round(rng.lognormvariate(math.log(1200), 0.62))))
    old = hist.to_json()
    summary = tmp_path / "summary.json"
    write_json(summary, {"prompt_tokens_p50": 300, "prompt_tokens_p99": 2000,
                         "histograms": {"supervised_tokens": old}})  # fmt: skip
    cfg = {"mode": "sglang", "model_path": "unused", "model_config": str(MODELS / "llama-3.1-8b")}
    cfg |= {"gpu_memory_mib": H200_MIB, "tp": 1, "args": [], "use_tuner": True, "sglang_version": "0.5.17"}
    out = tmp_path / "server.json"
    write_plan_for_workflow(server_cfg=ServerConfig.from_mapping(cfg), max_tokens=8192,
                            audit_summary=str(summary), out_path=str(out))  # fmt: skip
    rec = PlanFile.read(out).recommended
    cv = old["std"] / old["mean"]
    per_request = 300 + math.ceil(round(old["mean"]) * (1 + cv**2) / 2) + PAGED
    assert rec["client_concurrency"] == rec["kv_cache_tokens"] // per_request > 600
    assert "the old answers' std / mean (audit)" in rec["reasons"][0]


def test_tune_cli_takes_the_spread(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--model-config", str(MODELS / "llama-3.1-8b"), "--sglang-version", "0.5.17", "--gpu-memory-mib",
        str(H200_MIB), "--prompt-p50", "300", "--prompt-p99", "300", "--max-tokens", "8192",
        "--expected-output-tokens", "1450", "--expected-output-cv", f"{BENCH_CV:.3f}", "--json",
    ]  # fmt: skip
    assert cli(argv) == 0
    rec = json.loads(capsys.readouterr().out)["recommended"]
    assert rec["client_concurrency"] == 665 and rec["kv_cache_tokens"] == 925440  # 64-token pages
    assert "spread known" in rec["rules"]["client_concurrency"]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_a_plain_attention_model_gets_kv_pages(name: str) -> None:
    model = ModelShape.from_config(MODELS / name)
    rec = recommend(model, H200_MIB, 1 if name != "mixtral-8x7b" else 2, [], BENCH, "0.5.17", **NO_TRADEOFFS)
    flags = parse_flags(list(rec.args))
    assert flags.page_size == PLANNED_PAGE_SIZE
    assert rec.recommended.kv_cache_tokens % PLANNED_PAGE_SIZE == 0  # SGLang's pool is page-aligned
    page_reasons = [r for r in rec.reasons if r.startswith(f"--page-size {PLANNED_PAGE_SIZE}:")]
    assert len(page_reasons) == 1 and "_page_size_default" in page_reasons[0]


@pytest.mark.parametrize(
    "name, why",
    [
        ("gpu-qwen3.6-27b-text", "linear-attention state"),
        ("nemotron-3-nano-30b-a3b", "Mamba2 state"),
        ("gpt-oss-20b", "sliding-window layers"),
        ("deepseek-v3", "MLA"),
    ],
)
def test_models_beyond_plain_attention_keep_sglangs_page(name: str, why: str) -> None:
    model = ModelShape.from_config(MODELS / name)
    tp = 8 if name == "deepseek-v3" else 1
    rec = recommend(model, H200_MIB, tp, [], BENCH, "0.5.17", **NO_TRADEOFFS)
    assert "--page-size" not in rec.args, why
    assert parse_flags(list(rec.args)).page_size == 1


@pytest.mark.parametrize(
    "given",
    [["--page-size", "16"], ["--attention-backend", "flashinfer"], ["--decode-attention-backend=triton"]],
)
def test_a_given_page_or_attention_backend_stands(given: list[str]) -> None:
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    rec = recommend(llama, H200_MIB, 1, given, BENCH, "0.5.17", **NO_TRADEOFFS)
    assert rec.args.count("--page-size") == given.count("--page-size")
    assert parse_flags(list(rec.args)).page_size == (16 if "16" in given else 1)
    per_request = 1750 + page_waste(parse_flags(list(rec.args)).page_size)
    assert rec.recommended.client_concurrency == rec.recommended.kv_cache_tokens // per_request


def test_the_plan_under_given_pages_fills_at_the_paged_context() -> None:
    """``regen tune -- --page-size 64`` (the plan of given flags) counts the half page as the search does."""
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    given = plan(llama, H200_MIB, 1, ["--page-size", "64"], BENCH, "0.5.17")
    assert given.client_concurrency == given.kv_cache_tokens // (1750 + 32) > 256
    assert BENCH.paged_tokens_per_request(1) == BENCH.expected_tokens_per_request == 1750


#: the H100 race's workload (measurements/race-2026-12-07d-h100-n4-p1024): 1,024-token prompts, answers of
#: mean 159 and std 118 (the audit's), four completions a prompt sent back to back with the radix cache on
RACE_N4 = Workload(
    prompt_p50=1024, prompt_p99=1024, max_tokens=1024, expected_output_tokens=159,
    expected_output_cv=118 / 159, shared_prefixes=("4 completions per prompt",), completions_per_prompt=4,
)  # fmt: skip
H100_MIB = 81559


def test_a_prompts_completions_share_its_pages_in_the_planned_fill() -> None:
    """Four completions of a 1,024-token prompt hold its 15 whole pages once between them (SGLang's prefix
    match: all but the last token, whole pages) for as long as the longest runs; the client concurrency
    fills the KV at that, not at four prompts' worth. With the cache off, or one completion, as before."""
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    alone = dataclasses.replace(RACE_N4, completions_per_prompt=1, shared_prefixes=())
    shared = recommend(llama, H100_MIB, 1, ["--load-format", "dummy"], RACE_N4, "0.5.17", **NO_TRADEOFFS)
    single = recommend(llama, H100_MIB, 1, ["--load-format", "dummy"], alone, "0.5.17", **NO_TRADEOFFS)
    s, u = shared.recommended, single.recommended
    assert "--disable-radix-cache" in u.args and "--disable-radix-cache" not in s.args
    # the H100 race planned 396 for this workload without the sharing (its realized plan)
    assert u.client_concurrency == u.kv_cache_tokens // (1024 + RACE_N4.running_answer_tokens + PAGED) == 396
    held = 64 + math.ceil(960 * RACE_N4.prompt_share()) + RACE_N4.running_answer_tokens + PAGED
    assert RACE_N4.paged_tokens_per_request(64, radix_cache=True) == held
    assert RACE_N4.paged_tokens_per_request(64) == 1024 + RACE_N4.running_answer_tokens + PAGED  # cache off
    # the KV has room for 706 at that; the decode step's memory beside the graphs bounds the plan at 619
    assert s.kv_cache_tokens // held == 706 and s.client_concurrency == 619 == s.cuda_graph_max_bs
    assert "room for 706" in shared.reasons[0]
    assert "the prompt's 960 tokens in whole pages held once by its 4 completions" in shared.reasons[0]
    assert "held once" not in single.reasons[0]
    # what the race's server held: ~490 running in ~200k tokens (four completions of equal length, all
    # running together: a quarter of each prompt) under the plan's per-request share
    assert held > 200_000 / 490


def test_a_given_disable_radix_cache_is_kept_and_planned_without_shared_pages() -> None:
    """The user's ``--disable-radix-cache`` stands where the prompts share prefixes: the plan fills the KV
    at a whole prompt per request (the race's 396, not 619), and the reason and a warning say what the flag
    costs (each request prefills its prompt in full)."""
    llama = ModelShape.from_config(MODELS / "llama-3.1-8b")
    given = ["--load-format", "dummy", "--disable-radix-cache"]
    rec = recommend(llama, H100_MIB, 1, given, RACE_N4, "0.5.17", **NO_TRADEOFFS)
    r = rec.recommended
    assert "--disable-radix-cache" in r.args and "--enable-cache-report" not in r.args
    assert r.client_concurrency == r.kv_cache_tokens // (1024 + RACE_N4.running_answer_tokens + PAGED) == 396
    kept = [line for line in rec.reasons if line.startswith("--disable-radix-cache (given, kept)")]
    assert len(kept) == 1 and "4 completions per prompt" in kept[0]
    assert not any("prompts are unique" in line for line in rec.reasons)
    assert any(w.startswith("--disable-radix-cache (given) kept") for w in rec.warnings)
    # without the flag the planner keeps the cache (the race's plan), and warns of nothing
    plain = recommend(llama, H100_MIB, 1, given[:2], RACE_N4, "0.5.17", **NO_TRADEOFFS)
    assert "--disable-radix-cache" not in plain.recommended.args
    assert not any("radix" in w for w in plain.warnings)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("cv", [0.3, 0.74, 1.2])
def test_the_prompt_share_bounds_the_time_averaged_share_of_independent_answers(n: int, cv: float) -> None:
    """E[max of n] / (n E[L]) for log-normal answers of that cv, drawn: at most the planned share (the
    Hartley-David bound), and not far below it (the plan does not give away the sharing)."""
    rng = random.Random(n * 1000 + int(cv * 100))
    sigma = math.sqrt(math.log(1 + cv * cv))
    draws = [[rng.lognormvariate(0.0, sigma) for _ in range(n)] for _ in range(20_000)]
    held = statistics.fmean(max(d) for d in draws) / (n * statistics.fmean(x for d in draws for x in d))
    planned = dataclasses.replace(RACE_N4, completions_per_prompt=n, expected_output_cv=cv).prompt_share()
    assert held <= planned * 1.01 and held > 0.75 * planned, (held, planned)
