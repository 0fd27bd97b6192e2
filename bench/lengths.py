"""Per-sample ``max_tokens`` for benchmarks: an output-length spread emulated with ``ignore_eos`` on dummy
weights (the live sweep, ``tests/tune/test_sweep.py``), through ``GenerateConfig.max_tokens_for``, the
client's hook. It is no config key: a run's configs give every sample ``sampling.max_tokens``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from regen.runconfig import GenerateConfig


@dataclass(frozen=True, slots=True)
class PerSampleMaxTokens(GenerateConfig):
    """``GenerateConfig`` whose listed samples get their own ``max_tokens``."""

    max_tokens_by_id: Mapping[str, int] = field(default_factory=dict, compare=False)

    def max_tokens_for(self, sample_id: str) -> int:
        if sample_id in self.max_tokens_by_id:
            return int(self.max_tokens_by_id[sample_id])
        return self.sampling.max_tokens


def with_lengths(cfg: GenerateConfig, by_id: Mapping[str, int] | None) -> GenerateConfig:
    """``cfg`` with per-sample ``max_tokens`` (``cfg`` itself when there are none)."""
    if not by_id:
        return cfg
    own = {f.name: getattr(cfg, f.name) for f in fields(GenerateConfig)}
    return PerSampleMaxTokens(**own, max_tokens_by_id=dict(by_id))
