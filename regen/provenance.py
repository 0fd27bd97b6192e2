"""Provenance for the manifest: what produced the dataset, exactly, and when."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regen import __version__
from regen.io import read_json
from regen.layout import RUN, realized_files


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the validated config (defaults filled in), keys sorted."""
    return hashlib.sha256(orjson.dumps(config, option=orjson.OPT_SORT_KEYS)).hexdigest()


def chat_template_hash(tokenizer_dir: str) -> str | None:
    """sha256 of the chat template string the prompts were rendered with, if there is one."""
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    if not path.exists():
        return None
    template = json.loads(path.read_text()).get("chat_template")
    if not isinstance(template, str):
        return None
    return hashlib.sha256(template.encode()).hexdigest()


def model_revision(model_path: str) -> str | None:
    """The checkpoint revision when the model directory says (HF cache snapshot or a `.revision` file)."""
    path = Path(model_path)
    if (path / ".revision").exists():
        return (path / ".revision").read_text().strip()
    if path.parent.name == "snapshots":
        return path.name
    return None


def realized_servers(workdir: str | os.PathLike[str] = RUN.servers_root) -> list[dict[str, Any]]:
    """What each GPU server reported at start-up (version, flags, memory), recorded by the server module
    per node or per Slurm job (``regen.layout.realized_files``)."""
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
    *, plan: Mapping[str, Any], config: Mapping[str, Any], tokenizer_dir: str, valid_paths: list[str]
) -> dict[str, Any]:
    """Everything the manifest records about how the dataset was made (no credentials: only env var names)."""
    server = config.get("server", {})
    generate = config.get("generate", {})
    servers = realized_servers()
    start, end = generation_window(valid_paths)
    return {
        "regen_version": __version__,
        "config_hash": config_hash(config),
        "model_path": server.get("model_path"),
        "model_revision": model_revision(str(server.get("model_path", ""))),
        "server_mode": server.get("mode"),
        "sglang_version": next(
            (s.get("version") for s in servers if s.get("version")), plan.get("sglang_version")
        ),
        "server_flags": list(plan.get("launch_args") or server.get("args") or []),
        "servers": [
            {k: s.get(k) for k in ("server_id", "version", "launch_command") if k in s} for s in servers
        ],
        "chat_template_sha256": chat_template_hash(tokenizer_dir),
        "sampling": dict(generate.get("sampling", {})),
        "seed_rule": "seed = derive_seed(sampling.seed, sample id) (blake2b, 31-bit)",
        "thinking": generate.get("thinking"),
        "generation_started_at": start,
        "generation_ended_at": end,
        "merged_at": time.time(),
    }
