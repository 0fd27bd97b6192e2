"""The ``features`` config section, typed once, and the one layer convention.

Layer ids here are indices into transformers' ``output_hidden_states``: 0 is the embedding output and
``i`` the output of decoder layer ``i`` (counted from 1), so ``L`` is the last decoder layer. vLLM and
speculators count the same way (their EAGLE-3 default ``[2, L//2, L-3]``: speculators
``models/utils.py:resolve_target_layer_ids``; SGLang's ``model.layers_to_capture`` holds the same numbers,
capturing the input of layer ``i``). SpecForge, Model-Optimizer and z-lab's DFlash count decoder layers
from 0 by their output (``[1, L//2-1, L-4]``; SGLang's ``set_eagle3_layers_to_capture`` adds one to them):
:func:`from_after_layer` converts. Whether the last layer is stored before or after the final norm is a
separate setting (``last_layer``), recorded in every manifest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the name every manifest records for the convention above
LAYER_CONVENTION = "hf_hidden_states_index"
LAST_LAYER_STATES = ("post_norm", "pre_norm", "none")
#: bytes per stored value, and per token's scale (fp8 only)
VALUE_BYTES = {"bf16": 2, "fp8": 1}
SCALE_BYTES = {"bf16": 0, "fp8": 4}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50}


class FeaturesConfigError(ValueError):
    """A ``features`` setting that cannot be used; the message names the key."""


def parse_bytes(value: str | int | None) -> int | None:
    """``500GB``, ``2 TiB``, ``123`` -> bytes (None stays None)."""
    if value is None or isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise FeaturesConfigError(f"features.max_storage: {value!r} is not a size (e.g. 500GB, 2TiB, bytes)")
    return int(float(m.group(1)) * _UNITS[unit])


def from_after_layer(ids: Sequence[int]) -> tuple[int, ...]:
    """SpecForge/Model-Optimizer/z-lab ids (decoder layer counted from 0, by its output), converted."""
    return tuple(int(i) + 1 for i in ids)


def eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's three auxiliary layers (speculators' and SGLang's default)."""
    return (2, num_layers // 2, num_layers - 3)


def dflash_layers(num_layers: int, draft_layers: int) -> tuple[int, ...]:
    """DFlash's target layers: SpecForge's ``build_target_layer_ids`` (after-layer ids spread over
    ``[1, L-3]``), converted."""
    if draft_layers == 1:
        return from_after_layer([num_layers // 2])
    span = num_layers - 4
    return from_after_layer([round(1 + i * span / (draft_layers - 1)) for i in range(draft_layers)])


def layers_from_drafter_config(path: str | Path) -> tuple[tuple[int, ...], str]:
    """The auxiliary layers a drafter's ``config.json`` names, converted, and where they came from."""
    raw = json.loads(Path(path).read_text())
    if "speculators_model_type" in raw or "speculators_config" in raw:  # speculators: already this convention
        for key in ("eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids", "target_layer_ids"):
            if raw.get(key):
                return tuple(int(i) for i in raw[key]), f"{path}: {key} (speculators, as is)"
    for block, key in (
        ("eagle_config", "eagle_aux_hidden_state_layer_ids"),
        ("dflash_config", "target_layer_ids"),
    ):
        ids = (raw.get(block) or {}).get(key)
        if ids:
            return from_after_layer(ids), f"{path}: {block}.{key} (after-layer ids, plus one)"
    raise FeaturesConfigError(
        f"features.drafter_config ({path}): names no layer ids (eagle_aux_hidden_state_layer_ids, "
        "aux_hidden_state_layer_ids, eagle_config.eagle_aux_hidden_state_layer_ids, "
        "dflash_config.target_layer_ids)"
    )


@dataclass(frozen=True, slots=True)
class RowChoice:
    """Which token rows get features: all, ``count`` of them, or a ``fraction``."""

    count: int | None = None
    fraction: float | None = None

    @classmethod
    def of(cls, value: str | int | float) -> RowChoice:
        if value == "all" or (isinstance(value, float) and value >= 1.0):
            return cls()
        if isinstance(value, int):
            return cls(count=value)
        return cls(fraction=float(value))

    @property
    def everything(self) -> bool:
        return self.count is None and self.fraction is None

    def rows_of(self, total: int) -> int:
        """How many of ``total`` rows this choice takes (a fraction: the expected count)."""
        if self.count is not None:
            return min(self.count, total)
        return round(total * self.fraction) if self.fraction is not None else total

    def describe(self) -> str:
        if self.count is not None:
            return f"rows: {self.count}"
        return f"rows: {self.fraction:g}" if self.fraction is not None else "rows: all"


@dataclass(frozen=True, slots=True)
class FeaturesConfig:
    """The ``features`` section (built by :meth:`from_dict`: the schema's defaults filled in)."""

    enabled: bool
    layers: str | tuple[int, ...]
    drafter_config: str | None
    dflash_draft_layers: int
    last_layer: str
    dtype: str
    rows: RowChoice
    max_storage: int | None
    prefill_tokens_per_s: float | None
    backend: str
    batch_tokens: int
    #: where ``regen.features.publish`` uploads the features (``s3://``); None keeps them local
    output_prefix: str | None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> FeaturesConfig:
        """Validate ``raw`` against the schema's ``features`` section, fill its defaults, and type it."""
        # imported here: the compute job runs in a torch venv (trainers', SGLang's) without the validator
        from regen.runconfig import validated

        f = validated("features", raw)
        layers = f["layers"] if isinstance(f["layers"], str) else tuple(int(i) for i in f["layers"])
        return cls(
            enabled=bool(f["enabled"]),
            layers=layers,
            drafter_config=f["drafter_config"],
            dflash_draft_layers=int(f["dflash_draft_layers"]),
            last_layer=str(f["last_layer"]),
            dtype=str(f["dtype"]),
            rows=RowChoice.of(f["rows"]),
            max_storage=parse_bytes(f["max_storage"]),
            prefill_tokens_per_s=None
            if f["prefill_tokens_per_s"] is None
            else float(f["prefill_tokens_per_s"]),
            backend=str(f["backend"]),
            batch_tokens=int(f["batch_tokens"]),
            output_prefix=f["output_prefix"],
        )

    def aux_layers(self, num_layers: int) -> tuple[tuple[int, ...], str]:
        """The auxiliary layers for a target of ``num_layers`` decoder layers, and where they came from."""
        if self.drafter_config:
            ids, source = layers_from_drafter_config(self.drafter_config)
        elif self.layers == "eagle3":
            ids, source = eagle3_layers(num_layers), "EAGLE-3's default [2, L/2, L-3]"
        elif self.layers == "dflash":
            ids = dflash_layers(num_layers, self.dflash_draft_layers)
            source = f"DFlash's {self.dflash_draft_layers} target layers"
        else:
            ids, source = tuple(self.layers), "features.layers"
        bad = [i for i in ids if not 1 <= i <= num_layers]
        if bad:
            raise FeaturesConfigError(
                f"features.layers ({source}): {bad} outside 1..{num_layers} for a target of {num_layers} "
                "layers "
                f"(convention {LAYER_CONVENTION}: 0 the embedding output, {num_layers} the last layer)"
            )
        return ids, source

    def stored_layers(self, num_layers: int) -> tuple[int, ...]:
        """Every layer stored, in order: the auxiliary ones, then the last unless ``last_layer: none``."""
        aux, source = self.aux_layers(num_layers)
        if self.last_layer != "none" and num_layers in aux:
            raise FeaturesConfigError(
                f"features.layers ({source}): names the last layer {num_layers}, which last_layer: "
                f"{self.last_layer} stores already; drop it, or set last_layer: none"
            )
        return aux if self.last_layer == "none" else (*aux, num_layers)

    @property
    def value_bytes(self) -> int:
        return VALUE_BYTES[self.dtype]

    @property
    def scale_bytes(self) -> int:
        return SCALE_BYTES[self.dtype]
