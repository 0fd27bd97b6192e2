"""bench/efficiency.py reads the run's generation records through the layout (compressed, as the
generate job writes them): its floor counts every completion token."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from regen.generate.journal import Journal
from regen.layout.run import RunLayout

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("efficiency", ROOT / "bench" / "efficiency.py")
assert spec is not None and spec.loader is not None
efficiency = importlib.util.module_from_spec(spec)
spec.loader.exec_module(efficiency)


def test_generated_tokens_counts_the_compressed_records_of_every_shard(tmp_path: Path) -> None:
    layout = RunLayout.under(tmp_path)
    for shard, lengths in {"00000": [5, 7], "00001": [11]}.items():
        with Journal.open(layout.journal(shard)) as journal:
            for i, n in enumerate(lengths):
                journal.append(
                    {
                        "kind": "record",
                        "id": f"{shard}-{i}",
                        "fingerprint": "f",
                        "usage": {"completion_tokens": n},
                    }
                )
            journal.append({"kind": "failed", "id": f"{shard}-x", "fingerprint": "f", "reason": "r"})
            current = {f"{shard}-{i}": "f" for i in range(len(lengths))} | {f"{shard}-x": "f"}
            journal.finalize(layout.records(shard), layout.failed(shard), current)
    assert layout.records("00000").read_bytes()[:4] == b"\x28\xb5\x2f\xfd", "zstd, as the job writes it"
    assert efficiency.generated_tokens(layout) == (23, 3)
