"""Model-config reading for the SGLang server tuner: layer types, state and KV sizes, weight bytes.

Every size here mirrors how SGLang sizes its pools (0.5.17 and 0.5.23 agree on these):
- linear-attention state: ``srt/configs/mamba_utils.py::Mamba2StateShape.create`` and
  ``BaseLinearStateParams.mamba_cache_per_req``;
- layer types: ``srt/configs/qwen3_next.py::Qwen3NextConfig.layers_block_type``;
- KV cell: ``srt/model_executor/pool_configurator.py::DefaultPoolConfigurator._compute_cell_size``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "mxfp8": 1,
    "float8_e4m3fn": 1,
}
# --kv-cache-dtype choices (0.5.23) and their bytes per element; fp4 variants pack two per byte.
KV_DTYPE_BYTES: dict[str, float] = {
    "bf16": 2,
    "bfloat16": 2,
    "float16": 2,
    "fp8_e5m2": 1,
    "fp8_e4m3": 1,
    "mxfp8": 1,
    "nvfp4": 0.5,
    "fp4_mx_block16": 0.5,
}
CONV_STATE_BYTES = 2  # SGLANG_MAMBA_CONV_DTYPE default bfloat16 (mamba_utils.mamba2_state_dtype)


# Fields a real config.json may omit, with the default the transformers config class gives them (SGLang
# reads the config through transformers, so it uses these): ``Gemma3TextConfig.__init__`` (vocab_size
# 262_208, num_key_value_heads 4, head_dim 256, tie_word_embeddings True; T5Gemma2TextConfig copies them),
# ``Gemma2Config`` (vocab_size 256000, the rest alike), ``MixtralConfig`` / ``MistralConfig`` (vocab 32000).
_GEMMA3_TEXT = {"vocab_size": 262208, "num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True}
TRANSFORMERS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": _GEMMA3_TEXT,
    "gemma3": _GEMMA3_TEXT,
    "gemma2": {**_GEMMA3_TEXT, "vocab_size": 256000},
    "mixtral": {"vocab_size": 32000},
    "mistral": {"vocab_size": 32000},
}


class ModelConfigError(ValueError):
    """A model config that cannot be read or lacks a field the planner needs."""


@dataclass(frozen=True, slots=True)
class LinearAttention:
    """Gated-delta-net (Qwen3-Next / Qwen3.5 family) linear-attention geometry."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_dim: int
    ssm_dtype: str  # config mamba_ssm_dtype, default float32 (mamba2_state_dtype)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the planner needs to know about a model, read from its HF config."""

    source: str
    architecture: str
    model_type: str
    is_multimodal: bool
    vision_layers: int
    vision_hidden_size: int
    hidden_size: int
    num_layers: int
    full_attention_layers: int
    linear_attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    attn_output_gate: bool
    context_length: int
    dtype: str
    mtp_layers: int
    linear: LinearAttention | None
    weights_bytes_from_index: int | None
    #: the config as read (``text_config`` not unwrapped): attention-family and pool modules read their own
    #: fields from it; compared by identity only, so a plan's equality stays the shape's
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, hash=False)
    #: the sum of the tensors' bytes in the safetensors headers of the model dir (no index there)
    weights_bytes_from_headers: int | None = None

    @property
    def is_hybrid(self) -> bool:
        return self.linear is not None and self.linear_attention_layers > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_config(cls, path_or_dir: str | Path) -> ModelShape:
        """Read an HF model dir (config.json + optional model.safetensors.index.json) or a config.json."""
        path = Path(path_or_dir)
        config_path = path / "config.json" if path.is_dir() else path
        try:
            raw = json.loads(config_path.read_text())
        except FileNotFoundError as exc:
            raise ModelConfigError(f"{config_path}: model config not found") from exc
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"{config_path}: not valid JSON ({exc})") from exc
        index_path = config_path.parent / "model.safetensors.index.json"
        index_bytes = _index_total_size(index_path) if index_path.exists() else None
        header_bytes = None if index_bytes is not None else _safetensors_header_bytes(config_path.parent)
        shape = cls.from_dict(raw, source=str(config_path), weights_bytes_from_index=index_bytes)
        return replace(shape, weights_bytes_from_headers=header_bytes) if header_bytes else shape

    @classmethod
    def from_dict(
        cls, raw: dict[str, Any], *, source: str = "<dict>", weights_bytes_from_index: int | None = None
    ) -> ModelShape:
        architecture = (raw.get("architectures") or ["unknown"])[0]
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
        vision = raw.get("vision_config") if isinstance(raw.get("vision_config"), dict) else None

        text_type = str(text.get("model_type") or raw.get("model_type", ""))
        defaults = TRANSFORMERS_DEFAULTS.get(text_type, {})

        def need(key: str) -> Any:
            if key in text:
                return text[key]
            if key in defaults:
                return defaults[key]
            raise ModelConfigError(f"{source}: field {key!r} missing from the (text) config")

        num_layers = int(need("num_hidden_layers"))
        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = int(text.get("num_key_value_heads") or defaults.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or defaults.get("head_dim") or hidden // heads)
        layer_types = _layer_types(text, num_layers)
        n_linear = sum(1 for t in layer_types if t == "linear_attention")
        linear = None
        if n_linear:
            linear = LinearAttention(
                num_key_heads=int(need("linear_num_key_heads")),
                num_value_heads=int(need("linear_num_value_heads")),
                key_head_dim=int(need("linear_key_head_dim")),
                value_head_dim=int(need("linear_value_head_dim")),
                conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
                ssm_dtype=str(text.get("mamba_ssm_dtype") or raw.get("mamba_ssm_dtype") or "float32"),
            )
        dtype = str(text.get("torch_dtype") or text.get("dtype") or raw.get("torch_dtype") or "bfloat16")
        mtp = int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)
        return cls(
            source=source,
            architecture=architecture,
            model_type=str(raw.get("model_type", text.get("model_type", ""))),
            is_multimodal=vision is not None,
            vision_layers=int(vision.get("num_hidden_layers", 24) if vision else 0),
            vision_hidden_size=int(vision.get("hidden_size", 1024) if vision else 0),
            hidden_size=hidden,
            num_layers=num_layers,
            full_attention_layers=num_layers - n_linear,
            linear_attention_layers=n_linear,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=int(text.get("v_head_dim") or head_dim),
            intermediate_size=int(text.get("intermediate_size") or 0),
            num_experts=_num_experts(text),
            num_experts_per_tok=int(text.get("num_experts_per_tok") or text.get("experts_per_token") or 0),
            moe_intermediate_size=_expert_width(text),
            shared_expert_intermediate_size=_shared_expert_width(text),
            vocab_size=int(need("vocab_size")),
            tie_word_embeddings=bool(
                text.get(
                    "tie_word_embeddings",
                    raw.get("tie_word_embeddings", defaults.get("tie_word_embeddings", False)),
                )
            ),
            attn_output_gate=bool(text.get("attn_output_gate", False)),
            context_length=int(
                text.get("max_position_embeddings") or raw.get("max_position_embeddings") or 0
            ),
            dtype=dtype,
            mtp_layers=mtp,
            linear=linear,
            weights_bytes_from_index=weights_bytes_from_index,
            raw=raw,
        )

    # ---- per-request linear-attention state (mamba_utils.Mamba2StateShape.create) ----
    def conv_dim(self) -> int:
        lin = self._need_linear()
        return lin.num_value_heads * lin.value_head_dim + 2 * lin.num_key_heads * lin.key_head_dim

    def conv_state_bytes_per_layer(self, tp: int) -> int:
        lin = self._need_linear()
        return (self.conv_dim() // tp) * (lin.conv_kernel_dim - 1) * CONV_STATE_BYTES

    def ssm_state_bytes_per_layer(self, tp: int, ssm_dtype: str | None = None) -> int:
        lin = self._need_linear()
        dtype = ssm_dtype or lin.ssm_dtype
        return (lin.num_value_heads // tp) * lin.value_head_dim * lin.key_head_dim * _dtype_bytes(dtype)

    def state_bytes_per_request(self, tp: int, ssm_dtype: str | None = None) -> int:
        """P: BaseLinearStateParams.mamba_cache_per_req = L_lin * (conv + ssm); 0 for non-hybrid models."""
        if not self.is_hybrid:
            return 0
        per_layer = self.conv_state_bytes_per_layer(tp) + self.ssm_state_bytes_per_layer(tp, ssm_dtype)
        return self.linear_attention_layers * per_layer

    def replay_ring_bytes_per_slot(self, tp: int, ssm_dtype: str | None, ring_len: int) -> int:
        """Bytes per state slot of the ``--enable-linear-replayssm`` decode ring (``MambaPool``'s
        ``replayssm_d`` [HV, L, V] and ``replayssm_k`` [H, L, K] in the SSM dtype, ``replayssm_g`` [HV, L]
        in fp32), over every linear-attention layer; 0 for non-hybrid models."""
        if not self.is_hybrid:
            return 0
        lin = self._need_linear()
        element = _dtype_bytes(ssm_dtype or lin.ssm_dtype)
        v_heads, k_heads = lin.num_value_heads // tp, lin.num_key_heads // tp
        per_layer = ring_len * (
            v_heads * lin.value_head_dim * element + k_heads * lin.key_head_dim * element + v_heads * 4
        )
        return self.linear_attention_layers * per_layer

    # ---- KV cell (DefaultPoolConfigurator._compute_cell_size, MHA branch) ----
    def kv_cell_bytes(self, tp: int, kv_dtype: str = "auto", draft_layers: int = 0) -> float:
        """Bytes of KV per token over the full-attention layers (+ MTP draft layers for EAGLE/NEXTN)."""
        kv_heads_per_tp = max(1, self.num_kv_heads // tp)
        element = _dtype_bytes(self.dtype) if kv_dtype == "auto" else KV_DTYPE_BYTES[kv_dtype]
        layers = self.full_attention_layers + draft_layers
        return kv_heads_per_tp * (self.head_dim + self.v_head_dim) * layers * element

    def _need_linear(self) -> LinearAttention:
        if self.linear is None:
            raise ModelConfigError(f"{self.source}: model has no linear-attention layers")
        return self.linear


def _layer_types(text: dict[str, Any], num_layers: int) -> list[str]:
    """Qwen3NextConfig.layers_block_type: full iff (i+1) % full_attention_interval == 0; layer_types wins."""
    types = text.get("layer_types")
    if isinstance(types, list) and len(types) == num_layers:
        return ["linear_attention" if t == "linear_attention" else "full_attention" for t in types]
    interval = text.get("full_attention_interval")
    if interval and "linear_num_value_heads" in text:
        return [
            "full_attention" if (i + 1) % int(interval) == 0 else "linear_attention"
            for i in range(num_layers)
        ]
    return ["full_attention"] * num_layers


def _num_experts(text: dict[str, Any]) -> int:
    """Routed experts by every spelling: ``n_routed_experts`` (DeepSeek, Kimi, GLM, Nemotron-H),
    ``num_local_experts`` (Mixtral, gpt-oss, Llama-4), ``num_experts`` (Qwen)."""
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if text.get(key):
            return int(text[key])
    return 0


def _expert_width(text: dict[str, Any]) -> int:
    """An expert's intermediate width: ``moe_intermediate_size``, else (Mixtral, gpt-oss, Llama-4, whose
    experts are ``intermediate_size`` wide) ``intermediate_size``; 0 for a dense model."""
    if not _num_experts(text):
        return int(text.get("moe_intermediate_size") or 0)
    return int(text.get("moe_intermediate_size") or text.get("intermediate_size") or 0)


def _shared_expert_width(text: dict[str, Any]) -> int:
    """Shared experts' total width: Qwen ``shared_expert_intermediate_size``, Nemotron-H
    ``moe_shared_expert_intermediate_size``, DeepSeek/Kimi/GLM ``n_shared_experts`` x
    ``moe_intermediate_size``, Llama-4's one shared expert of ``intermediate_size``."""
    for key in ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"):
        if text.get(key):
            return int(text[key])
    if text.get("n_shared_experts") and _num_experts(text):
        return int(text["n_shared_experts"]) * _expert_width(text)
    if "interleave_moe_layer_step" in text and _num_experts(text):  # llama4.py Llama4MoE.shared_expert
        return int(text.get("intermediate_size") or 0)
    return 0


def _safetensors_header_bytes(model_dir: Path) -> int | None:
    """Sum of the tensors' byte ranges in the headers of ``model_dir/*.safetensors`` (8-byte little-endian
    header length, then the JSON header with each tensor's ``data_offsets``); None without such files."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        try:
            with path.open("rb") as fh:
                (length,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(length))
            total += sum(
                end - start
                for k, v in header.items()
                if k != "__metadata__"
                for start, end in [v["data_offsets"]]
            )
        except (OSError, struct.error, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ModelConfigError(f"{path}: not a readable safetensors header ({exc})") from exc
    return total


def _dtype_bytes(dtype: str) -> int:
    key = dtype.replace("torch.", "").lower()
    if key not in DTYPE_BYTES:
        raise ModelConfigError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


def _index_total_size(index_path: Path) -> int:
    try:
        meta = json.loads(index_path.read_text()).get("metadata", {})
        return int(meta["total_size"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ModelConfigError(f"{index_path}: metadata.total_size missing or invalid ({exc})") from exc
