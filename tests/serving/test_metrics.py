"""SGLang's throughput readings (regen.serving.metrics) and the closed-loop run model
(regen.tune.closedloop)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from regen.serving.metrics import (
    METHOD_METRICS,
    DecodeSample,
    decode_samples,
    log_since,
    log_size,
    parse_prometheus,
    sample_from_metrics,
    server_steady_state,
    steady_state,
)
from regen.simulated.launcher import start_simulated_server
from regen.tune.closedloop import StepModel, closed_loop_wall_s

REAL_LOG = Path(__file__).parents[1] / "data" / "sglang" / "decode-0.5.17-h200-bf16-512.log"


def test_steady_state_of_a_real_sglang_log_reproduces_the_published_h200_figure() -> None:
    # SGLang 0.5.17 on the H200, 512 running, bf16 state (measurements/gpu-2026-11-29.md: 6,544 tok/s)
    text = REAL_LOG.read_text()
    samples = decode_samples(text)
    assert len(samples) == 25 and "Prefill batch" in text  # prefill lines are not decode samples
    at = time.mktime(time.strptime("2026-11-29 19:19:30", "%Y-%m-%d %H:%M:%S"))
    assert samples[0] == DecodeSample(512, 154094, 1181.91, 0, True, at)
    assert samples[1].at == at + 3  # a line every 40 decode steps, ~3 s at 512 running
    st = steady_state(samples)
    assert st is not None
    assert (st.plateau_running, st.samples) == (512, 24)  # the first plateau line (ramp) is dropped
    assert st.median_tps == pytest.approx(6544.34)
    assert st.peak_tps == pytest.approx(6949.13)
    assert st.mean_context == pytest.approx(800.96, abs=0.01)
    assert st.cuda_graph_fraction == 1.0 and "plateau" in st.method
    assert st.plateau_from == at  # where the plateau starts (the ramp ends), from the log's stamps


def test_plateau_excludes_ramp_and_tail() -> None:
    rows = [(10, 100.0), (50, 400.0), (100, 900.0), (100, 1000.0), (99, 1010.0), (100, 990.0), (40, 300.0)]
    st = steady_state([DecodeSample(r, r * 10, tps, 0) for r, tps in rows])
    assert st is not None and st.plateau_running == 100
    assert st.samples == 3 and st.median_tps == 1000.0  # 1000, 1010, 990 (the first plateau line dropped)
    assert steady_state([DecodeSample(0, 0, 0.0, 5)]) is None


def test_log_since_reads_only_what_a_pilot_added(tmp_path: Path) -> None:
    log = tmp_path / "gpu0.log"
    assert log_size(log) == 0 and log_since(log, 0) == ""
    lines = REAL_LOG.read_text().splitlines()
    log.write_text("\n".join(lines[:10]) + "\n")
    offset = log_size(log)
    with open(log, "a") as fh:
        fh.write("\n".join(lines[10:]) + "\n")
    assert len(decode_samples(log_since(log, offset))) == len(lines) - 10


def test_metrics_page_of_the_simulated_server_is_read_and_used_when_the_log_has_none() -> None:
    url, stop = start_simulated_server(token_rate=50.0, max_running_requests=4, log_interval_s=0.2)
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            values = parse_prometheus(resp.read().decode())
    finally:
        stop()
    assert values["sglang:num_running_reqs"] == 0.0 and "sglang:gen_throughput" in values
    assert sample_from_metrics(values) == DecodeSample(0, 0, values["sglang:gen_throughput"], 0)
    assert sample_from_metrics({"sglang:gen_throughput": 1.0}) is None
    polled = [DecodeSample(8, 0, 100.0, 0), DecodeSample(8, 0, 120.0, 0), DecodeSample(8, 0, 110.0, 0)]
    st = server_steady_state("no decode lines here", polled)
    assert st is not None and st.method == METHOD_METRICS and st.median_tps == 115.0


def test_closed_loop_at_a_constant_per_token_cost_is_tokens_over_rate() -> None:
    step = StepModel(0.0, 0.001)  # 1,000 tok/s at any batch
    est = closed_loop_wall_s([5, 7, 3, 9, 2] * 20, 4, step)
    assert est.wall_s == pytest.approx(sum([5, 7, 3, 9, 2] * 20) * 0.001)
    assert est.output_tokens == 520 and est.requests == 100


def test_closed_loop_counts_the_drain_a_plain_projection_misses() -> None:
    step = StepModel.from_plateau(4, 400.0, fixed_s=0.005)  # 10 ms a step at batch 4, 5 ms fixed
    lengths = [10] * 12 + [100]  # one long request admitted last
    est = closed_loop_wall_s(lengths, 4, step)
    # 3 waves of 10 steps at batch 4, then the long one alone for 100 steps of a batch of 1
    assert est.plateau_s == pytest.approx(30 * 0.010)
    assert est.wall_s == pytest.approx(30 * 0.010 + 100 * step.step_s(1))
    assert closed_loop_wall_s(lengths, 4, step, ramp_s=2.5).wall_s == pytest.approx(est.wall_s + 2.5)
    assert est.drain_s == pytest.approx(100 * 0.00625)
    plain = sum(lengths) / 400.0
    assert est.wall_s > 1.2 * plain


def test_step_model_fit_recovers_the_line_and_falls_back_on_one_batch_size() -> None:
    truth = StepModel(0.012, 0.0001)
    fitted = StepModel.fit([(b, truth.tokens_per_s(b)) for b in (128, 256, 512)])
    assert fitted.fixed_s == pytest.approx(0.012) and fitted.per_request_s == pytest.approx(0.0001)
    one = StepModel.fit([(512, truth.tokens_per_s(512))], fixed_s=0.012)
    assert one.step_s(512) == pytest.approx(truth.step_s(512)) and one.fixed_s == pytest.approx(0.012)
    with pytest.raises(ValueError):
        StepModel.fit([])


#: SGLang 0.5.17 on the H200, the seed flags (NEXTN 3 steps, SGLANG_SIMULATE_ACC_LEN off: the known-answer
#: target's own MTP layer), 2026-12-01: four consecutive decode lines of the plateau (the seed baseline's
#: server log in measurements/known-target-2026-12-01.logs.tgz)
MTP_LINES = """\
[2026-12-01 05:43:00] Decode batch, #running-req: 64, #full token: 30149, full token usage: 0.24, mamba num: 128, mamba usage: 0.64, accept len: 2.95, accept rate: 0.65, cuda graph: True, gen throughput (token/s): 2722.55, #queue-req: 0
[2026-12-01 05:43:03] Decode batch, #running-req: 63, #full token: 27215, full token usage: 0.22, mamba num: 125, mamba usage: 0.62, accept len: 2.98, accept rate: 0.66, cuda graph: True, gen throughput (token/s): 2646.25, #queue-req: 0
[2026-12-01 05:43:06] Decode batch, #running-req: 64, #full token: 26642, full token usage: 0.21, mamba num: 124, mamba usage: 0.62, accept len: 2.99, accept rate: 0.66, cuda graph: True, gen throughput (token/s): 2730.23, #queue-req: 0
[2026-12-01 05:43:08] Decode batch, #running-req: 64, #full token: 27194, full token usage: 0.22, mamba num: 128, mamba usage: 0.64, accept len: 2.98, accept rate: 0.66, cuda graph: True, gen throughput (token/s): 2911.27, #queue-req: 0
"""  # noqa: E501


def test_speculative_decode_lines_give_the_accept_length_next_to_the_rate() -> None:
    samples = decode_samples(MTP_LINES)
    assert [s.accept_len for s in samples] == [2.95, 2.98, 2.99, 2.98]
    steady = steady_state(samples)
    assert steady is not None and steady.plateau_running == 64
    # the rate stays SGLang's gen throughput (accepted tokens/s), the first plateau line dropped
    assert steady.median_tps == 2730.23 and steady.accept_len == 2.98
    assert steady.to_json()["accept_len"] == 2.98
    plain = steady_state(decode_samples(REAL_LOG.read_text()))
    assert plain is not None and plain.accept_len is None
    gauges = {"sglang:gen_throughput": 3000.0, "sglang:num_running_reqs": 64.0}
    assert sample_from_metrics({**gauges, "sglang:spec_accept_length": 2.9}).accept_len == 2.9
    assert sample_from_metrics({**gauges, "sglang:spec_accept_length": 0.0}).accept_len is None


def test_the_falling_batch_after_the_plateau_gives_the_step_its_fixed_part() -> None:
    """A drain decoded by a step of 14 ms + 0.15 ms a request: the plateau alone reads as a per-request cost
    only, and would put the drain's small batches at the plateau's aggregate rate."""
    line = StepModel(0.014, 0.00015)
    ramp = [DecodeSample(r, r * 100, line.tokens_per_s(r) * 0.5, 0) for r in (40, 120)]  # prefill-diluted
    plateau = [DecodeSample(265, 26500, line.tokens_per_s(265), 0) for _ in range(6)]
    drain = [DecodeSample(r, r * 100, line.tokens_per_s(r), 0) for r in (200, 120, 60, 20, 5, 1)]
    st = steady_state([*ramp, *plateau, *drain])
    assert st is not None and [b for b, _ in st.falling] == [200, 120, 60, 20, 5, 1]  # not the ramp's
    fitted = StepModel.fit(st.step_points())
    assert fitted.fixed_s == pytest.approx(0.014, rel=1e-6)
    assert fitted.per_request_s == pytest.approx(0.00015, rel=1e-6)
    assert StepModel.from_plateau(265, st.median_tps).fixed_s == 0.0  # what the plateau alone gives
