"""Provenance for the manifest: what produced the dataset, exactly, and when.

What decided the answers is read from the records themselves (their ``settings_fingerprint`` and the
settings it hashes, ``regen.fingerprint``), never from the config of the run that merged them: a config
edited after generation cannot make the manifest lie. Each sampling variant (``generate.variants``) has
its own settings (``variants``: fingerprint, rows, settings); a variant whose rows hold more than one
settings fingerprint is marked ``mixed`` here and refused by the re-audit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regen import __version__
from regen.fingerprint import chat_template_hash
from regen.io import read_json
from regen.layout.run import RUN
from regen.layout.slots import realized_files
from regen.runconfig import DEFAULT_VARIANT


@dataclass(frozen=True, slots=True)
class SettingsGroup:
    """The rows generated under one settings fingerprint."""

    fingerprint: str
    rows: int
    settings: dict[str, Any]

    @property
    def variant(self) -> str:
        """The sampling variant the settings are of (absent from settings made without variants)."""
        return str(self.settings.get("variant") or DEFAULT_VARIANT)


def settings_in_records(valid_paths: list[str]) -> list[SettingsGroup]:
    """Every settings fingerprint in the valid shards, with its row count and settings; most rows first."""
    rows: dict[str, int] = {}
    settings: dict[str, str] = {}
    for path in valid_paths:
        table = pq.read_table(
            path, columns=["settings_fingerprint", "settings"]
        )  # regen.records.VALID_SCHEMA
        if table.num_rows == 0:
            continue
        counts = table.group_by(["settings_fingerprint", "settings"]).aggregate([("settings", "count")])
        for fp, text, n in zip(
            counts.column("settings_fingerprint").to_pylist(),
            counts.column("settings").to_pylist(),
            counts.column("settings_count").to_pylist(),
            strict=True,
        ):
            rows[fp] = rows.get(fp, 0) + int(n)
            settings.setdefault(fp, text)
    groups = [SettingsGroup(fp, n, orjson.loads(settings[fp])) for fp, n in rows.items()]
    return sorted(groups, key=lambda g: (-g.rows, g.fingerprint))


def realized_servers(workdir: str | os.PathLike[str] = RUN.servers_root) -> list[dict[str, Any]]:
    """What each GPU server reported at start-up (version, flags, memory), recorded by the server module
    per node or per Slurm job (``regen.layout.slots.realized_files``)."""
    return [read_json(p) for p in realized_files(workdir)]


def generation_window(valid_paths: list[str]) -> tuple[float | None, float | None]:
    """Earliest request start and latest request end over the valid records (column-wise)."""
    start = end = None
    for path in valid_paths:
        table = pq.read_table(path, columns=["started_at", "latency_s"])  # regen.records.VALID_SCHEMA
        if table.num_rows == 0:
            continue
        began = table.column("started_at")
        ended = pc.add(began, table.column("latency_s"))
        lo, hi = pc.min(began).as_py(), pc.max(ended).as_py()
        if lo is not None:
            start = lo if start is None else min(start, lo)
            end = hi if end is None else max(end, hi)
    return start, end


def build_provenance(
    *, plan: Mapping[str, Any], tokenizer_dir: str, valid_paths: list[str]
) -> dict[str, Any]:
    """Everything the manifest records about how the dataset was made (no credentials: only env var names).

    The generation settings come from the records; ``chat_template_sha256`` is the template the merge
    renders token ids with (``generation_chat_template_sha256`` the one the answers were made under).
    """
    groups = settings_in_records(valid_paths)
    only = groups[0].settings if len(groups) == 1 else {}
    names = sorted({g.variant for g in groups})
    # what every variant shares (the model, the server, the template): from any one of them when unmixed
    shared = groups[0].settings if groups and len(names) == len(groups) else only
    servers = realized_servers()
    start, end = generation_window(valid_paths)
    sampling_keys = ("temperature", "top_p", "top_k", "max_tokens", "n", "seed")
    return {
        "regen_version": __version__,
        "settings_fingerprint": groups[0].fingerprint if len(groups) == 1 else None,
        "settings_fingerprints": {g.fingerprint: g.rows for g in groups},
        "mixed_settings": len(groups) > len(names),
        "settings": only or None,
        # one entry per sampling variant: its rows and settings (and the fingerprint they hash to)
        "variants": {
            g.variant: {"settings_fingerprint": g.fingerprint, "rows": g.rows, "settings": g.settings}
            for g in sorted(groups, key=lambda g: g.variant)
            if len(names) == len(groups)
        },
        "model_path": shared.get("model_path"),
        "model_revision": shared.get("model_revision"),
        "server_mode": shared.get("server_mode"),
        "sglang_version": next(
            (s.get("version") for s in servers if s.get("version")), plan.get("sglang_version")
        ),
        "server_flags": list(plan.get("launch_args") or []),
        "servers": [
            {k: s.get(k) for k in ("server_id", "version", "launch_command") if k in s} for s in servers
        ],
        "chat_template_sha256": chat_template_hash(tokenizer_dir),
        "generation_chat_template_sha256": shared.get("chat_template_sha256"),
        "sampling": {k: only[k] for k in sampling_keys if k in only} or None,
        "seed_rule": "seed = derive_seed(sampling.seed, key) (blake2b, 31-bit); key: the sample id for the "
        "first completion of the default variant, else {sample_id}/{variant}/{k}",
        "thinking": only.get("thinking"),
        "generation_started_at": start,
        "generation_ended_at": end,
        "merged_at": time.time(),
    }
