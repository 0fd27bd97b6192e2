"""The SGLang planner against hand derivations from SGLang's source and measured H200 startups."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from regen.pilot_file import PilotFile
from regen.runconfig import ServerConfig
from regen.sglang.models import ModelShape
from regen.sglang.plan import PlanError, Workload, plan
from regen.sglang.realized import compare, parse_startup_log, realized_from_server_info
from regen.sglang.recommend import flag_warnings, recommend
from regen.sglang.weights import parameter_count
from regen.sglang.workload import workload_from_audit
from regen.tune.tune import cli

MODELS = Path(__file__).parents[2] / "resources" / "models"
H200_MIB = 143771  # nvidia-smi memory.total on the project's H200
#: the quality trade-offs recommend() may choose (server.allow_fp8_kv, server.allow_bf16_state): neither,
#: as the schema's defaults have it, or the bf16 linear-attention state only
NO_TRADEOFFS = {"allow_fp8_kv": False, "allow_bf16_state": False}
BF16_STATE = {"allow_fp8_kv": False, "allow_bf16_state": True}
GIB = 1 << 30


@pytest.fixture(scope="module")
def gpu_model() -> ModelShape:
    return ModelShape.from_config(MODELS / "gpu-qwen3.6-27b-text")


def test_state_bytes_per_request_follow_mamba_utils(gpu_model: ModelShape) -> None:
    # conv_dim = Hv*dv + 2*Hk*dk; conv = conv_dim*(K-1)*2 (bf16); ssm = Hv*dv*dk*4 (float32); 48 linear layers
    conv_dim = 48 * 128 + 2 * 16 * 128
    per_layer = conv_dim * (4 - 1) * 2 + 48 * 128 * 128 * 4
    assert gpu_model.linear_attention_layers == 64 - 64 // 4
    assert gpu_model.state_bytes_per_request(tp=1) == 48 * per_layer
    # bf16 SSM state halves the ssm term only; tp=2 splits heads
    assert gpu_model.state_bytes_per_request(tp=1, ssm_dtype="bfloat16") == 48 * (
        conv_dim * 3 * 2 + 48 * 128 * 128 * 2
    )
    assert gpu_model.state_bytes_per_request(tp=2) == 48 * (conv_dim // 2 * 3 * 2 + 24 * 128 * 128 * 4)


def test_kv_cell_sizes_dense_moe_hybrid(gpu_model: ModelShape) -> None:
    dense = ModelShape.from_config(MODELS / "qwen3-8b")
    moe = ModelShape.from_config(MODELS / "qwen3-30b-a3b")
    nxt = ModelShape.from_config(MODELS / "qwen3-next-80b-a3b")
    # kv_heads_per_tp * (head_dim + v_head_dim) * layers * bytes
    assert dense.kv_cell_bytes(tp=1) == 8 * (128 + 128) * 36 * 2
    assert dense.kv_cell_bytes(tp=16) == 1 * (128 + 128) * 36 * 2  # max(1, kv_heads // tp)
    assert moe.kv_cell_bytes(tp=1, kv_dtype="fp8_e4m3") == 4 * 256 * 48 * 1
    assert nxt.full_attention_layers == 48 // 4 and nxt.is_hybrid and nxt.is_moe
    assert nxt.kv_cell_bytes(tp=1) == 2 * 512 * 12 * 2
    assert gpu_model.kv_cell_bytes(tp=1) == 4 * 512 * 16 * 2
    assert gpu_model.kv_cell_bytes(tp=1, draft_layers=1) == 4 * 512 * 17 * 2  # EAGLE/NEXTN: MTP layer KV


def test_weights_from_index_and_from_config() -> None:
    dense = ModelShape.from_config(MODELS / "qwen3-8b")
    index = json.loads((MODELS / "qwen3-8b" / "model.safetensors.index.json").read_text())
    assert dense.weights_bytes_from_index == index["metadata"]["total_size"]
    # SGLang's parameter layout from the config alone lands within 0.1% of the real checkpoint
    assert abs(parameter_count(dense).total * 2 / dense.weights_bytes_from_index - 1) < 1e-3


def test_nested_text_config_is_multimodal() -> None:
    vlm = ModelShape.from_config(MODELS / "qwen3.5-27b" / "config.json")
    assert vlm.architecture == "Qwen3_5ForConditionalGeneration" and vlm.is_multimodal
    assert (vlm.full_attention_layers, vlm.linear_attention_layers, vlm.mtp_layers) == (16, 48, 1)


def test_default_mem_fraction_from_memory_hook(gpu_model: ModelShape) -> None:
    # H200 tier: chunk 8192, decode max_bs 256; 58 prefill graph sizes up to 8192
    prefill_sizes = 8 + 14 + 8 + 8 + 12 + 8
    reserved = 512 + 8192 * 1.5 + 1 / 8 * 1024 + 256 * 2 + prefill_sizes * 8
    p = plan(gpu_model, H200_MIB, 1, [], None, "0.5.17")
    assert p.mem_fraction_static == round((H200_MIB - reserved) / H200_MIB, 3) == 0.903
    # a 512 decode graph adds 2 MiB per batch slot: the measured 0.900
    p512 = plan(gpu_model, H200_MIB, 1, ["--cuda-graph-max-bs", "512"], None, "0.5.17")
    assert p512.mem_fraction_static == round((H200_MIB - reserved - 256 * 2) / H200_MIB, 3) == 0.900


def test_prefill_graph_reserve_follows_the_prefill_backend(gpu_model: ModelShape) -> None:
    """reserve_for_graph_mb (0.5.17 ServerArgs, 0.5.23 arg_groups/memory_hook): no prefill part with the
    prefill backend disabled (regen's launch default), an explicit --cuda-graph-backend-prefill wins over
    the off-switch, --cuda-graph-max-bs-prefill sizes the capture list, 1.5 GiB for an MLA backend."""
    base = 512 + 8192 * 1.5 + 1 / 8 * 1024 + 256 * 2
    for version in ("0.5.17", "0.5.23"):
        off = plan(gpu_model, H200_MIB, 1, ["--disable-prefill-cuda-graph"], None, version)
        assert off.mem_fraction_static == round((H200_MIB - base) / H200_MIB, 3) == 0.907
        wins = ["--disable-prefill-cuda-graph", "--cuda-graph-backend-prefill", "breakable"]
        assert plan(gpu_model, H200_MIB, 1, wins, None, version).mem_fraction_static == 0.903
        small = plan(gpu_model, H200_MIB, 1, ["--cuda-graph-max-bs-prefill", "512"], None, version)
        assert small.mem_fraction_static == round((H200_MIB - base - 30 * 8) / H200_MIB, 3)
    mla = ModelShape.from_config(MODELS / "deepseek-v3")
    tp8 = ["--tp-size", "8"]
    with_graphs = plan(mla, H200_MIB, 8, tp8, None, "0.5.23").mem_fraction_static
    without = plan(
        mla, H200_MIB, 8, [*tp8, "--disable-prefill-cuda-graph"], None, "0.5.23"
    ).mem_fraction_static
    assert round(with_graphs - without, 3) == -round(1.5 * 1024 / H200_MIB, 3)


def test_reproduces_measured_h200_default(gpu_model: ModelShape) -> None:
    p = plan(gpu_model, H200_MIB, 1, [], None, "0.5.17")
    assert p.mamba_slots_per_request == 3  # Qwen3_5ForCausalLM is not extra_buffer-capable in 0.5.17
    assert p.max_mamba_cache_size == 248
    assert p.effective_max_running_requests == 248 // 3 == 82
    assert p.binding_constraint == "mamba_pool"
    assert abs(p.kv_cache_tokens / 651_426 - 1) < 0.01
    assert abs(p.state_pool_gib - 249 * gpu_model.state_bytes_per_request(tp=1) / GIB) < 1e-9
    realized = parse_startup_log(
        "max_running_requests is capped to 82 by the mamba state cache (max_mamba_cache_size=248, "
        "3 state slots per request)\nKV Cache is allocated. dtype: torch.bfloat16, #tokens: 651426, "
        "K size: 19.88 GB, V size: 19.88 GB\nMamba Cache is allocated. max_mamba_cache_size: 248, "
        "conv_state size: 0.68GB, ssm_state size: 35.02GB\n"
    )
    assert compare(p, realized) == []


def test_reproduces_measured_h200_variants(gpu_model: ModelShape) -> None:
    no_radix = plan(gpu_model, H200_MIB, 1, ["--disable-radix-cache"], None, "0.5.17")
    assert (no_radix.mamba_slots_per_request, no_radix.effective_max_running_requests) == (1, 248)
    bf16 = plan(
        gpu_model, H200_MIB, 1, ["--disable-radix-cache", "--mamba-ssm-dtype", "bfloat16"], None, "0.5.17"
    )
    assert bf16.max_mamba_cache_size == 488
    assert abs(bf16.kv_cache_tokens / 650_994 - 1) < 0.01
    capped = plan(
        gpu_model, H200_MIB, 1, ["--disable-radix-cache", "--max-running-requests", "128"], None, "0.5.17"
    )
    assert capped.max_mamba_cache_size == 128 and abs(capped.kv_cache_tokens / 933_306 - 1) < 0.01
    fixed_args = [
        "--max-mamba-cache-size",
        "200",
        "--mem-fraction-static",
        "0.93",
        "--max-running-requests",
        "64",
    ]
    fixed = plan(gpu_model, H200_MIB, 1, fixed_args, None, "0.5.17")
    assert fixed.effective_max_running_requests == 64 and abs(fixed.kv_cache_tokens / 825_753 - 1) < 0.01


def test_version_differences(gpu_model: ModelShape) -> None:
    p23 = plan(gpu_model, H200_MIB, 1, [], None, "0.5.23")
    assert p23.mamba_radix_cache_strategy == "extra_buffer" and p23.mamba_slots_per_request == 3 + 2
    # auto without overlap (page 1) resolves to no_buffer (overrides._mamba_radix_cache_resolution): 3
    assert plan(gpu_model, H200_MIB, 1, ["--disable-overlap-schedule"], None).mamba_slots_per_request == 3
    explicit = ["--mamba-radix-cache-strategy", "extra_buffer", "--disable-overlap-schedule"]
    assert plan(gpu_model, H200_MIB, 1, explicit, None).mamba_slots_per_request == 3 + 1
    lazy = plan(gpu_model, H200_MIB, 1, ["--mamba-radix-cache-strategy", "extra_buffer_lazy"], None)
    assert lazy.mamba_slots_per_request == 4


def test_speculative_scratch_and_auto_k(gpu_model: ModelShape) -> None:
    args = [
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
    ]
    p = plan(gpu_model, H200_MIB, 1, args, None, "0.5.23")
    draft, slots = 3 + 1, 5
    # mrr defaults to 48 under speculative decoding; SGLang reserves P * (min(48, K//S) + 1) * D for the
    # verify buffers and allocates, per slot, one SSM state per draft token and a conv window of D + 2
    # columns (conv kernel 4; the state keeps 3): MambaPool's de-duplicated intermediate_conv_window
    assert p.requested_max_running_requests == 48
    n = min(48, p.max_mamba_cache_size // slots) + 1
    conv = gpu_model.conv_state_bytes_per_layer(1) * 48
    ssm = gpu_model.ssm_state_bytes_per_layer(1) * 48
    assert p.spec_scratch_gib * GIB == n * (ssm * draft + conv * (draft + 2) // 3)
    # a path-less MTP draft (Qwen3.5/3.6: mtp_num_hidden_layers) leaves the draft layer out of the target's
    # cell (eagle_draft_num_layers unset); its own KV pool, one layer per token, comes after the budget
    assert p.kv_cell_bytes == 4 * 512 * 16 * 2
    assert p.draft_kv_gib * GIB == pytest.approx(p.kv_cache_tokens * 4 * 512 * 1 * 2)


def test_dense_model_plan_has_no_state() -> None:
    dense = ModelShape.from_config(MODELS / "qwen3-8b")
    p = plan(dense, 81559, 1, [], Workload(512, 2048, 1024))
    assert p.max_mamba_cache_size is None and p.state_pool_gib == 0
    assert p.kv_cache_tokens == int(p.kv_cache_gib * GIB // dense.kv_cell_bytes(tp=1))
    assert p.workload_concurrency == min(p.effective_max_running_requests, p.kv_cache_tokens // (2048 + 1024))


def test_recommend_holds_kv_and_never_picks_bf16_silently(gpu_model: ModelShape) -> None:
    wl = Workload(prompt_p50=256, prompt_p99=512, max_tokens=1024)
    rec = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", **NO_TRADEOFFS)
    best = rec.recommended
    assert "bfloat16" not in rec.args
    assert best.kv_cache_tokens >= best.effective_max_running_requests * (512 + 1024)
    assert best.effective_max_running_requests > rec.given.effective_max_running_requests
    assert "--disable-radix-cache" in rec.args
    if best.effective_max_running_requests > 256:
        assert "--cuda-graph-max-bs-decode" in rec.args
    allowed = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", **BF16_STATE)
    assert allowed.recommended.effective_max_running_requests >= best.effective_max_running_requests
    for cand in rec.candidates:
        assert cand.plan.kv_cache_tokens >= cand.plan.effective_max_running_requests * wl.tokens_per_request


def test_scheduler_candidates_size_the_cap_for_the_expected_length(gpu_model: ModelShape) -> None:
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=2048, target_concurrency=4096)
    static = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", **BF16_STATE)
    assert not any("expected" in c.reasons[0] for c in static.candidates)  # none without an expectation
    expect = dataclasses.replace(wl, expected_output_tokens=640)
    rec = recommend(gpu_model, H200_MIB, 1, [], expect, "0.5.17", **BF16_STATE)
    assert rec.args == static.args  # the static recommendation keeps its guarantee at max_tokens
    assert rec.candidates[0].args == rec.args
    sized, batched = rec.candidates[1], rec.candidates[2]
    n = sized.plan.effective_max_running_requests
    assert n > rec.recommended.effective_max_running_requests
    assert sized.plan.kv_cache_tokens >= n * (261 + 640)  # holds the expected length, not max_tokens
    assert sized.plan.kv_cache_tokens < n * wl.tokens_per_request
    for flag in ("--mamba-ssm-dtype", "--disable-radix-cache", "--mem-fraction-static"):
        assert flag in sized.args  # same state dtype, radix choice and memory fraction as the best
    graph = sized.args.index("--cuda-graph-max-bs-decode")
    assert sized.args[graph + 1] == str(n)
    # refills 4 at a time, prefill graphs up to them (4 x prompt p99 261 = 1,044 tokens -> 1,280)
    assert batched.args == (*sized.args, "--min-free-slots-delay", "4", "--cuda-graph-max-bs-prefill", "1280")
    assert "expected 640 output tokens" in sized.reasons[0]
    too_long = dataclasses.replace(
        wl, expected_output_tokens=4096
    )  # no less than max_tokens: nothing to gain
    assert not any(
        "expected" in c.reasons[0]
        for c in recommend(gpu_model, H200_MIB, 1, [], too_long, **NO_TRADEOFFS).candidates
    )


def test_replay_ring_follows_mamba_pool_and_sits_outside_the_budget(gpu_model: ModelShape) -> None:
    # MambaPool: replayssm_d [HV, L, V] and replayssm_k [H, L, K] in the SSM dtype, replayssm_g [HV, L] fp32
    bf16_slot = 48 * 16 * (48 * 128 * 2 + 16 * 128 * 2 + 48 * 4)
    assert gpu_model.replay_ring_bytes_per_slot(1, "bfloat16", 16) == bf16_slot
    assert gpu_model.replay_ring_bytes_per_slot(1, None, 16) == 48 * 16 * (
        48 * 128 * 4 + 16 * 128 * 4 + 48 * 4
    )
    assert gpu_model.replay_ring_bytes_per_slot(2, "bfloat16", 8) == 48 * 8 * (
        24 * 128 * 2 + 8 * 128 * 2 + 24 * 4
    )
    base = ["--disable-radix-cache", "--mamba-ssm-dtype", "bfloat16", "--max-running-requests", "608",
            "--mem-fraction-static", "0.92"]  # fmt: skip
    off = plan(gpu_model, H200_MIB, 1, base, None, "0.5.17")
    on = plan(gpu_model, H200_MIB, 1, [*base, "--enable-linear-replayssm"], None, "0.5.17")
    # SGLang's solver charges only the spec-verify ring: the pools are sized exactly as without the flag
    assert (on.kv_cache_tokens, on.max_mamba_cache_size) == (off.kv_cache_tokens, off.max_mamba_cache_size)
    assert on.replay_ring_gib == pytest.approx(609 * bf16_slot / GIB)
    assert off.replay_ring_gib == 0.0 and off.notes == ()
    # 7.2 GiB of an 11.1 GiB slack (5.5 GB was still free after graphs at this cap on the H200): a warning
    assert "out-of-memory" in on.notes[-1] and "--mem-fraction-static 0.868" in on.notes[-1]
    realized = parse_startup_log(
        "GDN ReplaySSM ring buffers allocated (record_len=16, fold=False): d=5.336GB, k=1.779GB, g=0.083GB \n"
    )
    assert realized.replay_ring_gib == pytest.approx(5.336 + 1.779 + 0.083)
    assert [d.field for d in compare(on, realized)] == []
    assert [d.field for d in compare(off, realized)] == ["replay_ring_gib"]  # a ring nobody planned for


def test_replay_candidate_keeps_the_runtime_slack(gpu_model: ModelShape) -> None:
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=2048, target_concurrency=4096,
                  expected_output_tokens=636)  # fmt: skip
    default = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", **BF16_STATE)
    assert not any("--enable-linear-replayssm" in c.args for c in default.candidates)  # opt-in: no H200 gain
    rec = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", **BF16_STATE, allow_replay_decode=True)
    sized, batched, replay = rec.candidates[1:4]
    assert "--enable-linear-replayssm" in replay.args and "--enable-linear-replayssm" not in batched.args
    backend = replay.args.index("--linear-attn-decode-backend")  # SM100 + bf16 state would pick flashinfer
    assert replay.args[backend + 1] == "triton"
    assert replay.args[-4:] == ("--min-free-slots-delay", "4", "--cuda-graph-max-bs-prefill", "1280")
    assert "expected 636 output tokens" in replay.reasons[0]
    ring = replay.plan.replay_ring_gib
    assert ring > 5
    assert (
        replay.plan.slack_gib - ring >= sized.plan.slack_gib
    )  # the ring came out of the pools, not the slack
    assert replay.plan.mem_fraction_static < sized.plan.mem_fraction_static
    assert not any("out-of-memory" in n for n in replay.plan.notes)
    n = replay.plan.effective_max_running_requests
    assert 0.85 * sized.plan.effective_max_running_requests < n < sized.plan.effective_max_running_requests
    assert replay.plan.kv_cache_tokens >= n * (261 + 636)
    # one step more memory fraction and the ring would no longer fit in what was given up
    assert plan(gpu_model, H200_MIB, 1, list(replay.args), None, "0.5.17").replay_ring_gib == pytest.approx(
        ring
    )
    # fp32 state (bf16 not opted in): the ring is fp32 too, and the same rule holds
    fp32 = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", allow_replay_decode=True, **NO_TRADEOFFS)
    r32 = next(c for c in fp32.candidates if "--enable-linear-replayssm" in c.args)
    assert r32.plan.slack_gib - r32.plan.replay_ring_gib >= fp32.candidates[1].plan.slack_gib


def test_replay_flag_refusals_are_warned(gpu_model: ModelShape) -> None:
    radix = flag_warnings(["--enable-linear-replayssm"], gpu_model, "0.5.23")  # auto: extra_buffer
    assert any("no_buffer" in w and "--disable-radix-cache" in w for w in radix)
    backend = [
        "--enable-linear-replayssm",
        "--disable-radix-cache",
        "--linear-attn-decode-backend",
        "flashinfer",
    ]
    assert any("triton" in w for w in flag_warnings(backend, gpu_model, "0.5.17"))
    assert flag_warnings(["--enable-linear-replayssm", "--disable-radix-cache"], gpu_model, "0.5.17") == []
    bf16 = ["--enable-linear-replayssm", "--disable-radix-cache", "--mamba-ssm-dtype", "bfloat16"]
    assert any("SM100" in w for w in flag_warnings(bf16, gpu_model, "0.5.23"))
    named = [*bf16, "--linear-attn-decode-backend", "triton"]
    assert flag_warnings(named, gpu_model, "0.5.23") == []
    dense = ModelShape.from_config(MODELS / "qwen3-8b")
    assert any("no linear-attention" in w for w in flag_warnings(["--enable-linear-replayssm"], dense))
    # a request for shared prefixes keeps the radix cache, where SGLang refuses the flag: no replay candidate
    shared = Workload(prompt_p50=261, prompt_p99=261, max_tokens=2048, shared_prefixes=("n = 4",),
                      expected_output_tokens=636)  # fmt: skip
    rec = recommend(gpu_model, H200_MIB, 1, [], shared, "0.5.23", **BF16_STATE, allow_replay_decode=True)
    assert not any("--enable-linear-replayssm" in c.args for c in rec.candidates)


def test_warnings_for_ignored_and_renamed_flags(gpu_model: ModelShape) -> None:
    args = ["--max-mamba-cache-size", "100", "--mamba-full-memory-ratio", "0.5"]
    args += ["--num-continuous-decode-steps", "4", "--mamba-scheduler-strategy", "no_buffer"]
    args += ["--cuda-graph-max-bs", "64"]
    text = "\n".join(flag_warnings(args, gpu_model, "0.5.23"))
    assert "--mamba-full-memory-ratio is ignored" in text
    assert "--num-continuous-decode-steps has no effect" in text
    assert "--mamba-radix-cache-strategy" in text and "--cuda-graph-max-bs-decode" in text
    assert "requires --disable-overlap-schedule" in text
    dense = ModelShape.from_config(MODELS / "qwen3-8b")
    assert any("no linear-attention" in w for w in flag_warnings(["--max-mamba-cache-size", "9"], dense))


def test_server_info_and_drift(gpu_model: ModelShape) -> None:
    p = plan(gpu_model, H200_MIB, 1, [], None, "0.5.17")
    info = {"max_total_num_tokens": 500_000, "max_running_requests": 2048,
            "internal_states": [{"effective_max_running_requests_per_dp": 82, "max_mamba_cache_size": 248,
                                 "memory_usage": {"weight": 50.16, "kvcache": 30.0}}]}  # fmt: skip
    realized = realized_from_server_info(info)
    drifts = {d.field: d for d in compare(p, realized)}
    assert set(drifts) == {"kv_cache_tokens", "kv_cache_gib"}
    assert drifts["kv_cache_tokens"].relative == pytest.approx(500_000 / p.kv_cache_tokens - 1)


def test_workload_from_audit(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"prompt_tokens_p50": 300, "prompt_tokens_p99": 2000}))
    assert workload_from_audit(path, max_tokens=512) == Workload(300, 2000, 512)
    assert workload_from_audit({"prompt_tokens": {"p50": 10, "p99": 20}}, 64).prompt_p99 == 20


def test_cli_json_and_plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    rc = cli(["--model-config", str(MODELS / "gpu-qwen3.6-27b-text"), "--gpu-memory-mib", str(H200_MIB),
              "--sglang-version", "0.5.17", "--prompt-p99", "512", "--max-tokens", "1024", "--json",
              "--out", str(out), "--", "--mamba-full-memory-ratio", "0.9"])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    keys = {"mem_fraction_static", "max_mamba_cache_size", "mamba_slots_per_request", "mamba_pool_gib",
            "kv_cache_tokens", "kv_cache_gib", "weights_gib", "effective_max_running_requests"}  # fmt: skip
    assert keys <= set(doc) and keys | {"args", "reasons"} <= set(doc["recommended"])
    assert {"warnings", "candidates"} <= set(doc) and doc["effective_max_running_requests"] == 82
    plan_file = json.loads(out.read_text())
    assert plan_file["launch_args"] == doc["recommended"]["args"]
    assert plan_file["sglang_version"] == "0.5.17" and plan_file["gpu_memory_mib"] == H200_MIB
    rc = cli(["--model-config", str(MODELS / "qwen3-8b"), "--gpu-memory-mib", "81559"])
    assert rc == 0 and "binding constraint" in capsys.readouterr().out


def test_workflow_plan_file_from_the_audit_summary(tmp_path: Path) -> None:
    """The tune rule: prompts from the audit, the client sized for the KV at p50 + max_tokens."""
    from regen.io import read_json, write_json
    from regen.tune.tune import write_plan_for_workflow

    summary = tmp_path / "summary.json"
    write_json(summary, {"prompt_tokens_p50": 300, "prompt_tokens_p99": 900, "context_limit": 4096})
    out = tmp_path / "server.json"
    cfg = {
        "mode": "sglang",
        "model_path": "unused",
        "model_config": str(MODELS / "qwen3-8b"),
        "gpu_memory_mib": 81920,
        "tp": 1,
        "args": [],
        "use_tuner": True,
        "sglang_version": "0.5.23",
    }
    write_plan_for_workflow(
        server_cfg=ServerConfig.from_mapping(cfg),
        max_tokens=2048,
        audit_summary=str(summary),
        out_path=str(out),
    )
    written = read_json(out)
    rec = written["recommended"]
    assert written["launched"] == "recommended" and written["launch_args"]
    # no expected answer length: the KV at prompt p50 + max_tokens, never below SGLang's decode graphs
    fill = rec["kv_cache_tokens"] // (300 + 2048)
    assert rec["client_concurrency"] == max(fill, 256) <= rec["effective_max_running_requests"]
    # planned as launched: the local launch's defaults are in the plan, SGLang's prefill graphs kept on
    assert "--skip-server-warmup" in written["launch_args"]
    assert "--disable-prefill-cuda-graph" not in written["launch_args"]
    as_is = tmp_path / "as_is.json"
    write_plan_for_workflow(
        server_cfg=ServerConfig.from_mapping({**cfg, "use_tuner": False}),
        max_tokens=2048,
        audit_summary=str(summary),
        out_path=str(as_is),
    )
    given = read_json(as_is)["given"]
    qwen3_8b = ModelShape.from_config(MODELS / "qwen3-8b")
    launched = plan(qwen3_8b, 81920, 1, ["--skip-server-warmup"], None, "0.5.23")
    assert given["mem_fraction_static"] == launched.mem_fraction_static  # with the prefill-graph reserve
    assert (
        given["mem_fraction_static"]
        < plan(qwen3_8b, 81920, 1, ["--disable-prefill-cuda-graph"], None, "0.5.23").mem_fraction_static
    )
    external = tmp_path / "external.json"
    write_plan_for_workflow(
        server_cfg=ServerConfig.from_mapping({**cfg, "mode": "external"}),
        max_tokens=2048,
        audit_summary=str(summary),
        out_path=str(external),
    )
    assert read_json(external)["launch_args"] == []


# ------------------------------------------------------------------------- speculative (MTP) --
#: SGLang 0.5.17 on the H200, the 27B-shape dummy model, the original run's flags (NEXTN 3 steps topk 1,
#: --max-mamba-cache-size 200 --mem-fraction-static 0.93 --mamba-full-memory-ratio 0.6
#: --max-running-requests 64), 2026-12-01 (measurements/known-target-2026-12-01.logs.tgz, seed baseline)
SEED_FLAGS = [
    "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4", "--max-mamba-cache-size", "200", "--mem-fraction-static", "0.93",
    "--mamba-full-memory-ratio", "0.6", "--max-running-requests", "64",
]  # fmt: skip
SEED_LOG_0517 = """\
[2026-12-01 05:41:10] Load weight end. elapsed=8.80 s, type=Qwen3_5ForCausalLM, avail mem=88.96 GB, mem usage=50.16 GB.
[2026-12-01 05:41:11] Load weight end. elapsed=0.35 s, type=Qwen3_5ForCausalLMMTP, avail mem=83.43 GB, mem usage=5.53 GB.
[2026-12-01 05:41:11] Mamba Cache is allocated. max_mamba_cache_size: 200, conv_state size: 0.55GB, ssm_state size: 28.27GB intermediate_ssm_state_cache size: 36.56GB intermediate_conv_window_cache size: 0.36GB
[2026-12-01 05:41:12] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 124421, K size: 3.80 GB, V size: 3.80 GB
[2026-12-01 05:41:12] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 124421, K size: 0.24 GB, V size: 0.24 GB
[2026-12-01 05:42:07] max_total_num_tokens=124421, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=64, context_len=262144, available_gpu_mem=9.72 GB
"""  # noqa: E501


def test_speculative_memory_matches_the_measured_0517_startup(gpu_model: ModelShape) -> None:
    """The seed flags on the H200: the draft model's weights (its own embedding and lm_head until the pools
    are sized) come out of the KV budget, the draft layer's KV is a pool of its own outside the cell, and
    the verify buffers are allocated as MambaPool does: cap exact, every memory figure within 1%."""
    p = plan(gpu_model, H200_MIB, 1, SEED_FLAGS, None, "0.5.17")
    realized = parse_startup_log(SEED_LOG_0517)
    assert p.effective_max_running_requests == realized.max_running_requests == 64
    assert realized.weights_gib == 50.16 and realized.draft_weights_gib == 5.53
    assert realized.kv_cache_gib == 7.6 and realized.draft_kv_cache_gib == 0.48
    assert realized.spec_scratch_gib == pytest.approx(36.56 + 0.36)
    assert p.kv_cache_tokens == pytest.approx(124421, rel=0.001)
    assert p.state_pool_gib == pytest.approx(28.27 + 0.55, rel=0.01)
    assert (
        compare(p, realized, tolerance=0.012) == []
    )  # draft KV: 0.475 vs 0.24 + 0.24 printed with 2 decimals
    # before: the draft weights were not charged and the draft layer was in the cell: 202,402 KV tokens


def test_mtp_candidates_re_solve_the_running_cap_for_the_verify_buffers(gpu_model: ModelShape) -> None:
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=192)
    rec = recommend(gpu_model, H200_MIB, 1, ["--load-format", "dummy"], wl, "0.5.17", **NO_TRADEOFFS)
    best = rec.candidates[0]
    assert "--speculative-algorithm" not in best.args and rec.mtp_note.startswith("MTP off: not measured")
    spec = rec.speculative
    steps = [int(c.args[c.args.index("--speculative-num-steps") + 1]) for c in spec]
    assert steps == [1, 2, 3]
    caps = [c.plan.effective_max_running_requests for c in spec]
    # each draft token adds a verify buffer of one state per running request: fewer requests fit
    assert caps == sorted(caps, reverse=True) and caps[0] < best.plan.effective_max_running_requests
    for c, n in zip(spec, steps, strict=True):
        assert c.args[c.args.index("--speculative-num-draft-tokens") + 1] == str(n + 1)
        assert c.args[c.args.index("--speculative-eagle-topk") + 1] == "1"
        assert c.plan.kv_cache_tokens >= c.plan.effective_max_running_requests * wl.tokens_per_request
        assert c.plan.spec_scratch_gib > 0 and c.plan.draft_weights_gib > 5
        # the cap is the highest that fits: one more request no longer holds its KV or its pools
        more = [*c.args]
        i = more.index("--max-running-requests")
        more[i + 1] = str(c.plan.effective_max_running_requests + 1)
        bigger = plan(gpu_model, H200_MIB, 1, more, wl, "0.5.17")
        assert bigger.kv_cache_tokens < (c.plan.effective_max_running_requests + 1) * wl.tokens_per_request
    dense = ModelShape.from_config(MODELS / "qwen3-8b")
    assert recommend(dense, 81559, 1, [], Workload(512, 2048, 1024), **NO_TRADEOFFS).speculative == ()
    assert recommend(dense, 81559, 1, [], Workload(512, 2048, 1024), **NO_TRADEOFFS).mtp_note == (
        "MTP off: the model has no MTP layers"
    )


def test_forced_speculative_flags_get_an_mtp_off_alternative(gpu_model: ModelShape) -> None:
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=192)
    rec = recommend(gpu_model, H200_MIB, 1, SEED_FLAGS, wl, "0.5.17", **NO_TRADEOFFS)
    assert "--speculative-algorithm" in rec.args
    assert rec.mtp_note.startswith("MTP on: the given server.args ask for NEXTN")
    off = rec.speculative[0]
    assert "--speculative-algorithm" not in off.args and off.reasons[0].startswith("MTP off")
    assert off.plan.effective_max_running_requests > rec.recommended.effective_max_running_requests
    # the other step counts are measured too, not the one the flags already give
    others = [c.args[c.args.index("--speculative-num-steps") + 1] for c in rec.speculative[1:]]
    assert others == ["1", "2"]
    assert rec.to_json()["speculative_candidates"][0]["args"] == list(off.args)


def test_tune_says_why_mtp_is_off_and_the_sweep_measures_it(
    gpu_model: ModelShape, capsys: pytest.CaptureFixture[str]
) -> None:
    from regen.tune.tune import candidates_from_recommendation, render_result

    args = ["--model-config", str(MODELS / "gpu-qwen3.6-27b-text"), "--gpu-memory-mib", str(H200_MIB)]
    assert cli([*args, "--sglang-version", "0.5.17"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(
        "MTP off: not measured; the static plan keeps it off (`regen tune --sweep` measures 1-3 MTP steps "
        "against it)"
    )
    assert cli(["--model-config", str(MODELS / "qwen3-8b"), "--gpu-memory-mib", "81559"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("MTP off: the model has no MTP layers")
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=192)
    rec = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", **NO_TRADEOFFS)
    labels = [c.label for c, _ in candidates_from_recommendation(rec, 2)]
    assert labels[0] == "recommended" and labels[-1] == "given"
    assert [x for x in labels if x.startswith("mtp")] == ["mtp 1 step", "mtp 2 steps", "mtp 3 steps"]
    report = {
        "candidates": [], "best_index": 0, "best_label": "mtp 3 steps", "best_out_tok_s": 1.0,
        "projection": {"remaining_samples": 0, "tokens_per_sample": 1.0, "servers": 1, "tp": 1, "wall_s": 1.0,
                       "gpu_hours": 0.0},
        "mtp": {"why": "MTP on: measured 1.30x the best without it"},
    }  # fmt: skip
    assert render_result(PilotFile.from_json(report)).endswith("MTP on: measured 1.30x the best without it")


def test_mtp_that_does_not_fit_is_no_candidate(gpu_model: ModelShape) -> None:
    """On an 80 GiB GPU the 27B model's MTP draft (5.5 GiB more weights) leaves no KV at the default memory
    fraction: the recommendation stands, without MTP candidates that SGLang would refuse."""
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=192)
    rec = recommend(gpu_model, 81920, 1, [], wl, "0.5.23", **NO_TRADEOFFS)
    assert rec.recommended.effective_max_running_requests > 0
    for c in rec.speculative:
        assert c.plan.kv_cache_tokens >= c.plan.effective_max_running_requests * wl.tokens_per_request
    with pytest.raises(PlanError, match=r"MTP draft 5\.5 GiB"):
        plan(gpu_model, 81920, 1, [*SEED_FLAGS[:8], "--disable-radix-cache"], None, "0.5.23")


def test_the_recommendation_batches_refills_where_sglang_applies_the_delay(gpu_model: ModelShape) -> None:
    """One prefill pass per freed slot cost 64 ms at 265 running on the H200; ``--min-free-slots-delay 4``
    measured 5,278 tok/s against 4,890 without at 608 (measurements/sweep-2026-11-30.md)."""
    wl = Workload(prompt_p50=261, prompt_p99=261, max_tokens=2048)
    rec = recommend(gpu_model, H200_MIB, 1, [], wl, "0.5.17", **BF16_STATE)
    assert rec.recommended.effective_max_running_requests >= 8
    assert rec.args[-4:-2] == ("--min-free-slots-delay", "4")  # then prefill graphs sized for it
    assert any("prefilled 4 at a time" in r for r in rec.reasons)
    few = recommend(gpu_model, H200_MIB, 1, [], dataclasses.replace(wl, target_concurrency=4), "0.5.17",
                    **BF16_STATE)  # fmt: skip
    assert few.recommended.effective_max_running_requests < 8  # SGLang turns the delay off there
    assert "--min-free-slots-delay" not in few.args
    given = recommend(gpu_model, H200_MIB, 1, ["--min-free-slots-delay", "2"], wl, "0.5.17", **BF16_STATE)
    assert given.args.count("--min-free-slots-delay") == 1
    assert given.args[given.args.index("--min-free-slots-delay") + 1] == "2"  # the user's, as given
