"""Hand-made input conversations shared by the tests that run a shard through the simulated server."""

from __future__ import annotations

from regen.types import Message, Sample


def two_turn_samples(n: int, id_prefix: str) -> list[Sample]:
    """``n`` conversations: a system message and two user/assistant turns; ids ``{id_prefix}{i}``."""
    return [
        Sample(
            id=f"{id_prefix}{i}",
            messages=(
                Message("system", "you are terse"),
                Message("user", f"question number {i}"),
                Message("assistant", "old answer one", "old reasoning"),
                Message("user", "and then?"),
                Message("assistant", "old answer two"),
            ),
        )
        for i in range(n)
    ]
