"""The ``features`` rule's job: one shard's chosen rows of the token export, checked against the space
they need, prefilled on the configured backend, stored (``regen.features.compute``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from regen.features.backends import CaptureBackend, SGLangBackend, TransformersBackend
from regen.features.compute import ShardResult, run_shard
from regen.features.config import LAYER_CONVENTION, FeaturesConfig
from regen.features.projection import bytes_per_token, free_bytes_at, human_bytes
from regen.features.rows import TokenRow, read_token_rows, shard_rows
from regen.features.store import FeatureSettings
from regen.sglang.models import ModelShape


class FeaturesRefused(RuntimeError):
    """The shard's features do not fit where they go; the message names both numbers."""


def check_room(rows: list[TokenRow], cfg: FeaturesConfig, model: ModelShape, where: Path) -> None:
    """Refuse before the first byte when this shard's rows need more than the free space under ``where``."""
    layers = cfg.stored_layers(model.num_layers)
    need = sum(len(r.input_ids) for r in rows) * bytes_per_token(
        len(layers), model.hidden_size, cfg.value_bytes, cfg.scale_bytes
    )
    free = free_bytes_at(where)
    if need > free:
        raise FeaturesRefused(
            f"features: this shard's {len(rows)} rows need {human_bytes(need)}, {where} has "
            f"{human_bytes(free)} "
            f"free; features.rows: {int(1000 * free / need) / 1000} of them would fit"
        )


def backend_for(cfg: FeaturesConfig, model_path: str, model: ModelShape) -> CaptureBackend:
    layers = cfg.stored_layers(model.num_layers)
    if cfg.backend == "sglang":
        return SGLangBackend.from_pretrained(model_path, layers, model.num_layers, cfg.last_layer)
    return TransformersBackend.from_pretrained(model_path, layers, cfg.last_layer)


def features_job(
    *,
    tokenized: str | os.PathLike[str],
    manifest: str | os.PathLike[str],
    shard: str,
    shards: int,
    section: Mapping[str, Any] | None,
    model_path: str,
    model_config: str,
) -> ShardResult:
    """Compute and store the features of shard ``shard`` (of ``shards``); ``manifest`` is written last."""
    cfg = FeaturesConfig.from_dict(section)
    model = ModelShape.from_config(model_config)
    rows = shard_rows(read_token_rows(tokenized), cfg.rows, int(shard), shards)
    shard_dir = Path(manifest).parent
    check_room(rows, cfg, model, shard_dir)
    settings = FeatureSettings(
        model=model_path,
        layer_ids=cfg.stored_layers(model.num_layers),
        layer_convention=LAYER_CONVENTION,
        last_layer=cfg.last_layer,
        dtype=cfg.dtype,
        hidden_size=model.hidden_size,
        backend=cfg.backend,
    )
    _, source = cfg.aux_layers(model.num_layers)
    about = {"tokenized": str(tokenized), "rows_choice": cfg.rows.describe(), "layers_source": source}
    started = time.monotonic()
    backend = backend_for(cfg, model_path, model)
    return run_shard(
        rows=rows,
        shard_dir=shard_dir,
        shard=shard,
        settings=settings,
        backend=backend,
        about=about,
        batch_tokens=cfg.batch_tokens,
        engine_s=time.monotonic() - started,
    )
