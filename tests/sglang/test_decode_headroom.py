"""Every batch a plan allows fits (issue 49): a decode step at the running cap allocates, outside the pools
and the CUDA graphs, fp32 logits over the vocab (and their sampling copies) and, above the decode-graph
range, eager activations; the memory CUDA-graph capture leaves must hold it.

The measured failure (H200, SGLang 0.5.17, dummy weights): gpt-oss-20b under regen's plan
``--mem-fraction-static 0.92 --disable-radix-cache --max-running-requests 4096 --cuda-graph-max-bs-decode
1024`` (client 2,921) kept 6.28 GiB after graph capture and died at its first eager decode step allocating
2.19 GiB (2,921 x 201,088 x 4 B of fp32 logits) with 712 MiB free. The counts below are SGLang's
(``layers/logits_processor.py`` ``logits.float()``, ``layers/sampler.py`` softmax, the overlap schedule's
previous result), written out here rather than taken from :mod:`regen.sglang.headroom`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.sglang.flags import parse_flags
from regen.sglang.models import ModelShape
from regen.sglang.plan import MemoryPlan, Workload, plan
from regen.sglang.recommend import recommend

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771
GIB = 1 << 30
#: the issue's workload: 300-token prompts, answers of mean 1,437 (cv 0.65), max_tokens 8,192
ISSUE = Workload(
    prompt_p50=300, prompt_p99=300, max_tokens=8192, expected_output_tokens=1437, expected_output_cv=0.65
)
OLD_PLAN = (
    "--mem-fraction-static", "0.92", "--disable-radix-cache", "--max-running-requests", "4096",
    "--cuda-graph-max-bs-decode", "1024",
)  # fmt: skip
VOCAB = 201_088


@pytest.fixture(scope="module")
def gpt_oss() -> ModelShape:
    return ModelShape.from_config(MODELS / "gpt-oss-20b")


def eager_step_gib(batch: int) -> float:
    """A decode step above the graphs at ``batch`` rows, SGLang's fp32 [batch, vocab] buffers alone:
    the previous step's probabilities (overlap schedule), one stranded block, the logits and the
    sampler's softmax copy of them. Activations come on top, so this is a floor."""
    return 4 * batch * VOCAB * 4 / GIB


def free_after_capture_gib(p: MemoryPlan) -> float:
    assert p.decode_headroom is not None
    return p.decode_headroom.free_after_capture_gib


def test_the_old_plan_does_not_fit_its_cap(gpt_oss: ModelShape) -> None:
    old = plan(gpt_oss, H200_MIB, 1, list(OLD_PLAN), ISSUE, "0.5.17")
    # the pools SGLang allocated under it (the issue's measurement): full KV 3,867,969, SWA 1,069,057;
    # -0.11% since the weights are the replayed load (15.02 GiB, as logged) instead of a constant fitted to
    # 15.00: SGLang's KV is ~0.09 GiB above regen's on gpt-oss 20b and 120b alike, not yet named (issue 49)
    assert old.kv_cache_tokens == pytest.approx(3_867_969, rel=0.002) and old.swa_tokens == 1_069_057
    assert round(2921 * VOCAB * 4 / GIB, 2) == 2.19  # the allocation that failed
    # what capture leaves, as planned: at most the 6.28 GiB measured
    assert 4.5 < free_after_capture_gib(old) <= 6.28
    cap = old.effective_max_running_requests
    assert cap == 4096
    assert free_after_capture_gib(old) < eager_step_gib(cap)  # the rule the test holds plans to ...
    assert free_after_capture_gib(old) < eager_step_gib(2921)  # ... fails at the client too, as measured
    assert not old.decode_step_fits
    assert "decode_headroom" in old.rules()


def test_the_new_plan_fits_every_batch_it_allows(gpt_oss: ModelShape) -> None:
    rec = recommend(gpt_oss, H200_MIB, 1, [], ISSUE, "0.5.17", allow_fp8_kv=False, allow_bf16_state=False)
    p = rec.recommended
    cap, client = p.effective_max_running_requests, p.client_concurrency
    flags = parse_flags(list(rec.args))
    assert flags.max_running_requests == cap  # the cap is given: SGLang's own (4,096) would not fit
    assert client is not None and 256 < client <= cap < 4096
    assert p.cuda_graph_max_bs < cap  # the largest batches run eagerly: the step counted is the eager one
    room = p.decode_headroom
    assert room is not None and room.batch == cap and room.fits
    assert free_after_capture_gib(p) >= eager_step_gib(cap)
    assert room.transient_gib >= eager_step_gib(cap)  # the plan counts the activations on top
    assert "decode_headroom" in p.rules() and f"{cap:,} running" in p.rules()["decode_headroom"]
    assert any("--max-running-requests" in r and "fits" in r for r in rec.reasons)


def test_a_graph_step_holds_less_than_an_eager_one(gpt_oss: ModelShape) -> None:
    """At the decode-graph limit the logits sit in the graphs' buffer (the softmax copy and a stranded
    block remain); one row past it the step is eager."""
    small_chunk = ["--chunked-prefill-size", "512"]  # a prefill chunk's activations stay small beside it
    at = plan(gpt_oss, H200_MIB, 1, [*OLD_PLAN[:4], "1024", *OLD_PLAN[5:], *small_chunk], None, "0.5.17")
    past = plan(gpt_oss, H200_MIB, 1, [*OLD_PLAN[:4], "1025", *OLD_PLAN[5:], *small_chunk], None, "0.5.17")
    assert at.decode_headroom is not None and past.decode_headroom is not None
    graph_step = 2 * 1024 * VOCAB * 4 / GIB
    assert graph_step <= at.decode_headroom.transient_gib < 1.1 * graph_step
    assert past.decode_headroom.transient_gib >= eager_step_gib(1025) > 1.9 * at.decode_headroom.transient_gib


def test_without_the_overlap_schedule_the_previous_step_is_gone(gpt_oss: ModelShape) -> None:
    base = [*OLD_PLAN[:4], "2000", *OLD_PLAN[5:]]
    overlap = plan(gpt_oss, H200_MIB, 1, base, None, "0.5.17").decode_headroom
    serial = plan(gpt_oss, H200_MIB, 1, [*base, "--disable-overlap-schedule"], None, "0.5.17").decode_headroom
    assert overlap is not None and serial is not None
    assert overlap.transient_gib - serial.transient_gib == pytest.approx(2000 * VOCAB * 4 / GIB)
