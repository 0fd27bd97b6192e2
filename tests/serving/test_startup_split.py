"""The start split read from real SGLang 0.5.17 server logs (the H200 known-answer run, issue 37)."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from regen.fingerprint import server_numerics
from regen.serving.startup_split import StartupSplit, startup_split

RESULTS = Path(__file__).parents[2] / "measurements"


def _known_target_log(member: str) -> str:
    with tarfile.open(RESULTS / "known-target-2026-12-01.logs.tgz") as tar:
        fh = tar.extractfile(member)
        assert fh is not None
        return fh.read().decode(errors="replace")


def test_regens_own_server_start_splits_as_sglang_printed_it() -> None:
    """05:25:20 launch, 05:26:18 ``Load weight begin``, 05:28:33 the probe answered; SGLang's own line:
    ``load_weight=20.87, kv_cache_allocation=0.03, cuda_graph={prefill=97.90, decode=13.52, ...}``."""
    split = startup_split(_known_target_log("run-logs/servers/gpu0.log"))
    assert split == StartupSplit(
        imports_s=58.0,
        weights_s=20.87,
        pools_s=0.03,
        graphs_s=111.42,
        total_s=193.0,
        other_s=2.68,
        source="engine-timings",
    )


def test_an_mtp_start_counts_the_draft_weights_and_every_graph() -> None:
    split = startup_split(_known_target_log("baseline-seed-logs/gpu0.log"))
    assert (split.weights_s, split.pools_s, split.graphs_s, split.total_s) == (9.15, 1.38, 54.33, 115.0)


def test_without_sglangs_timings_line_the_pools_are_unknown_not_zero() -> None:
    text = re.sub(
        r"[^\n]*Engine startup timings[^\n]*\n", "", _known_target_log("baseline-seed-logs/gpu0.log")
    )
    split = startup_split(text)
    assert split.source == "elapsed-lines"
    assert split.weights_s == 9.15  # 8.80 target + 0.35 MTP draft
    assert split.graphs_s == 54.33  # prefill 32.80 + verify 18.29 + draft decode 3.24
    assert split.pools_s is None and split.other_s is None and split.total_s == 115.0


def test_a_trimmed_log_without_a_ready_line_leaves_the_total_unknown() -> None:
    split = startup_split((RESULTS / "profile-2026-11-30.serverlogs.trimmed.log").read_text(errors="replace"))
    assert split.imports_s == 55.0 and split.weights_s == 0.36  # 12:00:34 launch, 12:01:29 weights begin
    assert split.graphs_s is None and split.total_s is None and split.other_s is None


def test_only_the_latest_start_counts() -> None:
    first = _known_target_log("baseline-default-logs/gpu0.log")
    split = startup_split(first + _known_target_log("run-logs/servers/gpu0.log"))
    assert split.total_s == 193.0 and split.weights_s == 20.87


def test_an_empty_log_knows_nothing() -> None:
    assert startup_split("") == StartupSplit()


@pytest.mark.parametrize("skip", [True, False])
def test_skipping_sglangs_warmup_changes_no_numerics(skip: bool) -> None:
    info = {"version": "0.5.17", "dtype": "auto", "kv_cache_dtype": "auto", "mamba_ssm_dtype": None}
    assert server_numerics({**info, "skip_server_warmup": skip}) == server_numerics(info)
