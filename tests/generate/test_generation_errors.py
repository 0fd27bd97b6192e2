"""A server that cannot start fails every shard on it for one reason: the first shard states the
cause in full, the others in one line pointing there."""

from __future__ import annotations

from pathlib import Path

from regen.generate.generation import once_per_cause
from regen.serving.base import ServerError


def test_one_full_message_per_cause(tmp_path: Path) -> None:
    causes = tmp_path / "failures"
    tail = "Traceback ...\nModuleNotFoundError: No module named 'sglang'"
    first = once_per_cause(
        ServerError(f"GPU slot 0: the server supervisor gave up; logs/servers/gpu0.log ends with:\n{tail}"),
        "00000",
        "logs/generate/00000.log",
        causes,
    )
    second = once_per_cause(
        ServerError(f"GPU slot 1: the server supervisor gave up; logs/servers/gpu1.log ends with:\n{tail}"),
        "00001",
        "logs/generate/00001.log",
        causes,
    )
    other = once_per_cause(ServerError("GPU slot 1: server not ready after 60 s"), "00002", None, causes)
    assert first.startswith("shard 00000: GPU slot 0") and "No module named 'sglang'" in first
    assert "No module named" not in second and len(second.splitlines()) == 2
    assert "same cause as shard 00000 (logs/generate/00000.log)" in second
    assert other == "shard 00002: GPU slot 1: server not ready after 60 s"  # a different cause: in full
