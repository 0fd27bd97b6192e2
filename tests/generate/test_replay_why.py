"""``snakemake -n``'s why (issue 47 item 9): one line per real difference, however many earlier settings
fingerprints share it, and no ``server_numerics`` difference made up because no server was asked."""

from __future__ import annotations

from pathlib import Path

import orjson

from regen.fingerprint import GenerationSettings
from regen.generate.replay import JournalIndex, numerics_last_reported, plan_replay_fingerprints
from regen.runconfig import GenerateConfig


def settings(temperature: float, numerics: dict[str, str] | None = None) -> GenerationSettings:
    s = GenerationSettings.of(GenerateConfig.from_dict({"sampling": {"temperature": temperature}}))
    return s.served_by(numerics) if numerics is not None else s


def journal(path: Path, entries: list[tuple[str, GenerationSettings]]) -> Path:
    lines = [
        {
            "kind": "record",
            "id": sample_id,
            "fingerprint": f"{sample_id}-{s.fingerprint}",
            "settings_fingerprint": s.fingerprint,
            "settings": s.to_json(),
        }
        for sample_id, s in entries
    ]
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    return path


def test_one_line_per_real_change_and_no_made_up_numerics(tmp_path: Path) -> None:
    old_a = settings(0.6, {"version": "0.5.23"})
    old_b = settings(0.6, {"version": "0.5.24"})  # same sampling, another server version
    index = JournalIndex.read([journal(tmp_path / "00000.jsonl", [("s0", old_a), ("s1", old_b)])])
    now = settings(0.9)  # a dry run: no server asked
    served = numerics_last_reported(index, now.run)
    assert served == {"version": "0.5.24"}, "the numerics the same model's server reported last"
    # no server numerics known: the sampling change alone, once for both earlier fingerprints
    plan = plan_replay_fingerprints([("s0", "x0"), ("s1", "x1")], index, now, retry_failed=True)
    assert plan.settings_changed == 2
    assert [line.strip() for line in plan.lines() if "→" in line] == ["temperature 0.6→0.9"], plan.lines()
    # assuming the last reported numerics: the version really differs for s0 only, each change said once
    plan = plan_replay_fingerprints(
        [("s0", "x0"), ("s1", "x1")], index, now.served_by(served), retry_failed=True
    )
    changes = [line.strip() for line in plan.lines() if "→" in line]
    assert changes == ["server_numerics {'version': '0.5.23'}→{'version': '0.5.24'}", "temperature 0.6→0.9"]
