"""Decode-step cost model of a Qwen3.5/3.6-style hybrid (gated-delta + full attention) model.

Counts, per decode step of a batch, the bytes that must cross HBM (weights once, the
linear-attention state read and written per request, the KV cache of the full-attention
layers per context token) and the GEMM FLOPs, from the model's ``config.json`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class HybridShape:
    """The dimensions that decide a decode step's traffic and compute."""

    hidden: int
    intermediate: int
    vocab: int
    n_layers: int
    n_full: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    attn_output_gate: bool
    lin_k_heads: int
    lin_v_heads: int
    lin_k_dim: int
    lin_v_dim: int
    conv_kernel: int

    @property
    def n_linear(self) -> int:
        return self.n_layers - self.n_full

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> HybridShape:
        tc = cfg.get("text_config", cfg)
        n_layers = int(tc["num_hidden_layers"])
        types = tc.get("layer_types")
        if types:
            n_full = sum(1 for t in types[:n_layers] if t == "full_attention")
        else:
            interval = int(tc["full_attention_interval"])
            n_full = sum(1 for i in range(n_layers) if (i + 1) % interval == 0)
        return cls(
            hidden=int(tc["hidden_size"]),
            intermediate=int(tc["intermediate_size"]),
            vocab=int(tc["vocab_size"]),
            n_layers=n_layers,
            n_full=n_full,
            n_heads=int(tc["num_attention_heads"]),
            n_kv_heads=int(tc["num_key_value_heads"]),
            head_dim=int(tc["head_dim"]),
            attn_output_gate=bool(tc.get("attn_output_gate", False)),
            lin_k_heads=int(tc["linear_num_key_heads"]),
            lin_v_heads=int(tc["linear_num_value_heads"]),
            lin_k_dim=int(tc["linear_key_head_dim"]),
            lin_v_dim=int(tc["linear_value_head_dim"]),
            conv_kernel=int(tc["linear_conv_kernel_dim"]),
        )

    # -- parameters of the matrices a decode step multiplies by (embedding rows are a gather)
    def full_attn_params(self) -> int:
        q_out = self.n_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        kv_out = 2 * self.n_kv_heads * self.head_dim
        return self.hidden * (q_out + kv_out) + self.n_heads * self.head_dim * self.hidden

    def conv_dim(self) -> int:
        return self.lin_v_heads * self.lin_v_dim + 2 * self.lin_k_heads * self.lin_k_dim

    def linear_attn_params(self) -> int:
        v = self.lin_v_heads * self.lin_v_dim
        qkvz = self.hidden * (self.conv_dim() + v)
        ba = self.hidden * 2 * self.lin_v_heads
        conv = self.conv_dim() * self.conv_kernel
        return qkvz + ba + conv + v * self.hidden

    def mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    def gemm_params(self) -> int:
        """Parameters multiplied per token: every layer's matrices plus the LM head."""
        layers = self.n_full * self.full_attn_params() + self.n_linear * self.linear_attn_params()
        return layers + self.n_layers * self.mlp_params() + self.vocab * self.hidden

    def decode_gemms(self) -> list[tuple[str, int, int, int]]:
        """(name, in_features, out_features, times per step) of the matrices a decode step multiplies by:
        the projections of both layer kinds, the MLP and the LM head (the depthwise conv is no GEMM)."""
        v = self.lin_v_heads * self.lin_v_dim
        q_out = self.n_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        return [
            ("full_attn.qkv", self.hidden, q_out + 2 * self.n_kv_heads * self.head_dim, self.n_full),
            ("full_attn.o", self.n_heads * self.head_dim, self.hidden, self.n_full),
            ("linear_attn.in_qkvz", self.hidden, self.conv_dim() + v, self.n_linear),
            ("linear_attn.in_ba", self.hidden, 2 * self.lin_v_heads, self.n_linear),
            ("linear_attn.out", v, self.hidden, self.n_linear),
            ("mlp.gate_up", self.hidden, 2 * self.intermediate, self.n_layers),
            ("mlp.down", self.intermediate, self.hidden, self.n_layers),
            ("lm_head", self.hidden, self.vocab, 1),
        ]

    def total_params(self) -> int:
        return self.gemm_params() + self.vocab * self.hidden  # + input embedding table

    # -- per-request and per-token state
    def state_bytes_per_request(self, ssm_dtype: str, conv_dtype: str = "bfloat16") -> int:
        ssm = self.lin_v_heads * self.lin_v_dim * self.lin_k_dim * DTYPE_BYTES[ssm_dtype]
        conv = self.conv_dim() * (self.conv_kernel - 1) * DTYPE_BYTES[conv_dtype]
        return self.n_linear * (ssm + conv)

    def ssm_bytes_per_request(self, ssm_dtype: str) -> int:
        return self.n_linear * self.lin_v_heads * self.lin_v_dim * self.lin_k_dim * DTYPE_BYTES[ssm_dtype]

    def replay_record_bytes(self, ssm_dtype: str) -> int:
        """One decode step's ReplaySSM ring record per request: d [HV, V] and k [H, K] in the SSM dtype,
        g [HV] fp32, over the linear-attention layers (SGLang's MambaPool ring layout)."""
        e = DTYPE_BYTES[ssm_dtype]
        per_layer = self.lin_v_heads * self.lin_v_dim * e + self.lin_k_heads * self.lin_k_dim * e
        return self.n_linear * (per_layer + self.lin_v_heads * 4)

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        return self.n_full * 2 * self.n_kv_heads * self.head_dim * kv_dtype_bytes


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one decode step of ``batch`` requests with ``mean_context`` tokens each costs."""

    batch: int
    mean_context: float
    weight_bytes: float
    state_bytes: float
    kv_bytes: float
    gemm_flops: float
    attn_flops: float

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.state_bytes + self.kv_bytes

    def bandwidth_bound_tps(self, hbm_bytes_per_s: float) -> float:
        """Tokens/s if every byte moved at the measured copy bandwidth and compute were free."""
        return self.batch / (self.total_bytes / hbm_bytes_per_s)

    def gemm_peak_bound_tps(self, flops_per_s: float, hbm_bytes_per_s: float) -> float:
        """Tokens/s with the GEMMs at measured peak plus state/KV traffic at measured bandwidth."""
        return self.bound_tps(self.gemm_flops / flops_per_s, hbm_bytes_per_s)

    def bound_tps(self, gemm_s: float, hbm_bytes_per_s: float) -> float:
        """Tokens/s when the GEMMs take ``gemm_s`` and state/KV move at the bandwidth (the weights stream
        while the GEMMs run, so they are inside the GEMM time)."""
        gemm_s = max(gemm_s, self.weight_bytes / hbm_bytes_per_s)
        return self.batch / (gemm_s + (self.state_bytes + self.kv_bytes) / hbm_bytes_per_s)

    def to_json(self) -> dict[str, float]:
        return {
            "batch": self.batch,
            "mean_context": round(self.mean_context, 1),
            "weight_gb": round(self.weight_bytes / 1e9, 2),
            "state_rw_gb": round(self.state_bytes / 1e9, 2),
            "kv_gb": round(self.kv_bytes / 1e9, 2),
            "total_gb": round(self.total_bytes / 1e9, 2),
            "gemm_tflop": round(self.gemm_flops / 1e12, 2),
            "attn_tflop": round(self.attn_flops / 1e12, 3),
        }


def decode_step_cost(
    shape: HybridShape, batch: int, mean_context: float, ssm_dtype: str, replay_ring_len: int | None = None
) -> StepCost:
    """Bytes and FLOPs of one decode step (bf16 weights and KV).

    The state is read and written every step. With ``replay_ring_len`` L (SGLang's
    ``--enable-linear-replayssm``) the SSM state is read every step and written once every L steps; each
    step appends one ring record and reads the records buffered so far ((L - 1) / 2 on average)."""
    state = 2.0 * batch * shape.state_bytes_per_request(ssm_dtype)  # read + write
    if replay_ring_len:
        ssm = shape.ssm_bytes_per_request(ssm_dtype)
        record = shape.replay_record_bytes(ssm_dtype)
        state -= batch * ssm * (1.0 - 1.0 / replay_ring_len)
        state += batch * record * (1.0 + (replay_ring_len - 1) / 2.0)
    kv = batch * mean_context * shape.kv_bytes_per_token()
    attn_flops = 4.0 * batch * mean_context * shape.n_full * shape.n_heads * shape.head_dim
    return StepCost(
        batch=batch,
        mean_context=mean_context,
        weight_bytes=2.0 * shape.gemm_params(),
        state_bytes=state,
        kv_bytes=kv,
        gemm_flops=2.0 * batch * shape.gemm_params(),
        attn_flops=attn_flops,
    )
