"""Server faults at generation level: the real client against real simulated server processes.

Every test goes through ``regen.serving.lifecycle.acquire_server`` with ``mode: simulated`` (a detached
supervisor process owning a ``python -m regen.simulated`` process), drives a shard with
``regen.generate.client.generate_shard`` and checks that every sample ends exactly once in the records or
in the failures, what the logs say, and (through the simulator's request log, which survives server
restarts) what the server really received.
"""

from __future__ import annotations

import html
import logging
import os
import random
import re
import signal
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.generate.client import ShardFailedError, ShardJob, ShardStats, generate_shard
from regen.generate.lending import SlotLenders
from regen.layout.run import RunLayout
from regen.observe.report import server_restarts_table
from regen.runconfig import GenerateConfig, ServerConfig
from regen.serving.base import ServerError
from regen.serving.lifecycle import acquire_server, stop_all_servers
from regen.serving.ports import port_is_free
from regen.serving.procfs import read_url_state
from regen.serving.progress import SlotRestarts, read_restarts
from regen.simulated.options import REQUEST_LOG_ENV
from regen.simulated.requestlog import read_request_log
from regen.types import Message, Sample


def make_samples(n: int, prefix: str = "f") -> list[Sample]:
    return [
        Sample(
            id=f"{prefix}{i:03d}",
            messages=(
                Message("user", f"tell me about item {i}"),
                Message("assistant", "old answer"),
            ),
        )
        for i in range(n)
    ]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def server_pids_in(root: Path) -> list[int]:
    """Supervisors and simulated servers whose working directory is ``root``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if cwd == str(root) and b"regen.sglang." in argv:
            found.append(int(entry))
    return found


class Rig:
    """A working directory with a free port range, a request log and server cleanup."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.request_log = root / "work" / "requests.jsonl"
        monkeypatch.setenv(REQUEST_LOG_ENV, str(self.request_log))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        rng = random.Random()
        for _ in range(200):
            self.port_base = rng.randint(20000, 60000)
            if port_is_free("127.0.0.1", self.port_base):
                break
        self.journal = root / "work" / "journal" / "00000.jsonl"
        self.records = root / "results" / "generations" / "00000.jsonl"
        self.failed = root / "results" / "generations" / "00000.failed.jsonl"

    def server_cfg(self, faults: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
        sim = {"token_rate": 4000, "startup_delay_s": 0.1, "max_running_requests": 16}
        sim.update(over.pop("simulated", {}))
        sim["faults"] = faults or {}
        cfg = {
            "mode": "simulated",
            "model_path": "demo-model",
            "gpus": 1,
            "port_base": self.port_base,
            "startup_timeout_s": 20,
            "idle_timeout_s": 30,
            "max_restarts": 3,
            "simulated": sim,
        }
        cfg.update(over)
        return cfg

    def generate(
        self,
        server_cfg: dict[str, Any],
        samples: list[Sample],
        follow_restarts: bool = True,
        on_exhausted: Callable[[], None] | None = None,
        **gen: Any,
    ) -> tuple[ShardStats, dict[str, Any]]:
        """One shard as a generate job runs it (``follow_restarts``: requests lost to a server restart are
        sent again, as ``regen.generate.generation`` has it; off: only the client's own retry budget)."""
        gen_cfg = {"request_timeout_s": 10, "max_attempts": 4, "backoff_base_s": 0.01, "concurrency": 16}
        gen_cfg.update(gen)
        servers = self.root / "work" / "servers"
        with acquire_server(
            ServerConfig.from_mapping(server_cfg), None, owner_pid=os.getpid(), poll_s=0.05
        ) as ep:
            restarts = SlotRestarts.of(servers, ep) if follow_restarts else None
            stats = generate_shard(ShardJob(
                samples, self.journal, self.records, self.failed, GenerateConfig.from_dict(gen_cfg), ep,
                "00000", restarts=restarts, on_exhausted=on_exhausted,
            ))  # fmt: skip
        return stats, gen_cfg

    def events(self) -> list[dict[str, Any]]:
        return read_request_log(self.request_log)

    def supervisor_log(self) -> str:
        path = self.root / "logs" / "servers" / "gpu0.log"
        return path.read_text() if path.exists() else ""

    def cleanup(self) -> None:
        stop_all_servers(self.root / "work" / "servers", grace_s=5)
        for pid in server_pids_in(self.root):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def rig(tmp_workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    r = Rig(tmp_workdir, monkeypatch)
    yield r
    r.cleanup()


def assert_each_sample_once(rig: Rig, samples: list[Sample]) -> tuple[list[dict], list[dict]]:
    """Every sample exactly once in records or failures; nothing else there."""
    recs, fails = read_jsonl(rig.records), read_jsonl(rig.failed)
    ids = [r["id"] for r in recs] + [f["id"] for f in fails]
    assert sorted(ids) == sorted(s.id for s in samples), "records + failures must be the shard, once each"
    for f in fails:
        assert f["reason"] and f["attempts"] >= 1 and f["error"]
    return recs, fails


def received_counts(rig: Rig) -> Counter[str]:
    return Counter(e["id"] for e in rig.events() if e["event"] == "received" and e["id"])


# --------------------------------------------------------------------------------------------------


def test_crash_mid_shard_is_restarted_by_the_supervisor_and_the_shard_finishes(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    samples = make_samples(90)
    cfg = rig.server_cfg({"crash_after": 35}, max_restarts=4)
    caplog.set_level(logging.INFO, logger="regen")
    # a retry budget (0.2+0.4+...+6.4 s) that outlasts a server restart
    stats, _ = rig.generate(cfg, samples, follow_restarts=False, max_attempts=7, backoff_base_s=0.2)
    recs, fails = assert_each_sample_once(rig, samples)
    assert not fails and stats.completed == 90 and stats.retried_requests > 0
    crashes = [e for e in rig.events() if e["event"] == "fault:crash"]
    assert len(crashes) == 2, "35 + 35 completions crash two server lifetimes; the third finishes"
    assert len({e["pid"] for e in rig.events() if e["event"] == "received"}) == 3
    log = rig.supervisor_log()
    assert log.count("crash_after=35 reached: exiting") == 2
    assert "exited with code 3" in log and "restart 1/4" in log and "restart 2/4" in log
    # the client says why it retried: connection errors while the server was down
    assert "connection_error" in caplog.text and "retrying" in caplog.text
    # a finished id was never sent again: every id completes exactly once at the server...
    completed = Counter(e["id"] for e in rig.events() if e["event"] == "completed" and e["id"])
    lost_in_crash = {e["id"] for e in crashes}  # the reply that triggered the crash was delivered
    assert all(completed[s.id] == 1 for s in samples), completed.most_common(3)
    assert lost_in_crash <= {r["id"] for r in recs}


def test_crash_with_a_short_retry_budget_fails_the_shard_then_a_rerun_finishes_without_resending(
    rig: Rig,
) -> None:
    samples = make_samples(60)
    cfg = rig.server_cfg({"crash_after": 30}, max_restarts=3)
    with pytest.raises(ShardFailedError, match="server level"):
        rig.generate(cfg, samples, follow_restarts=False, max_attempts=2, backoff_base_s=0.001)
    assert not rig.records.exists() and not rig.failed.exists(), "a failed shard writes no outputs"
    journaled = {e["id"] for e in read_jsonl(rig.journal)}
    assert 0 < len(journaled) <= 30
    n_before = len(rig.events())
    stats, _ = rig.generate(cfg, samples, max_attempts=6, backoff_base_s=0.2)  # the same slot, restarted
    assert stats.skipped_resumed == len(journaled)
    assert_each_sample_once(rig, samples)
    resent = [e for e in rig.events()[n_before:] if e["event"] == "received" and e["id"] in journaled]
    assert resent == [], "a journaled sample must not be requested again"
    assert "restart 1/3" in rig.supervisor_log()


def faults_samples_met(rig: Rig, kind: str) -> list[str]:
    """The ids of the samples whose requests met a fault event starting with ``kind``: the server's readiness
    probe (no sample id) draws faults too, and the supervisor, not the client, retries it (CI once drew a
    malformed probe: 11 injected against 10 retried; a hung probe: 6 hangs against 5 retried)."""
    return [e["id"] for e in rig.events() if e["event"].startswith(kind) and e["id"] is not None]


def test_partly_wedged_server_requests_time_out_and_are_retried(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    samples = make_samples(40)
    caplog.set_level(logging.INFO, logger="regen")
    cfg = rig.server_cfg({"hang_rate": 0.15, "seed": 3})
    t0 = time.monotonic()
    stats, _ = rig.generate(cfg, samples, request_timeout_s=0.5, max_attempts=8)
    recs, fails = assert_each_sample_once(rig, samples)
    assert not fails and time.monotonic() - t0 < 25
    hangs = faults_samples_met(rig, "fault:hang")
    assert hangs and stats.retried_requests >= len(hangs)
    by_id = {r["id"]: r for r in recs}
    for sid in set(hangs):
        assert by_id[sid]["attempts"] >= 2
    assert "timeout: no response within 0.5 s" in caplog.text


STALL_TIMEOUT_S = 1.5
#: the supervisor looks at its server every 0.5 s (``--poll``); detection may take one look more
SUPERVISOR_POLL_S = 0.5
#: answers of at most 200 tokens take well under the stall timeout at the rates used here: the simulated
#: server logs a decode line every 5 s (SGLang every 40 decode steps) and counts tokens when a request
#: finishes (as SGLang does), so a lone 4,096-token answer would show no progress for seconds
SHORT_ANSWERS = {"max_tokens": 200}


def stall_restarts(rig: Rig, slot: int = 0) -> list[dict[str, Any]]:
    return read_restarts(rig.root / "work" / "servers" / f"gpu{slot}.restarts.jsonl")


def assert_sent_again_once_per_restart(rig: Rig, samples: list[Sample]) -> None:
    """Each id completes once at the server; no id is received again after it completed; an id is
    received at most once per server lifetime (a request lost to a restart goes again once)."""
    events = rig.events()
    completed = Counter(e["id"] for e in events if e["event"] == "completed" and e["id"])
    assert all(completed[s.id] == 1 for s in samples), completed.most_common(3)
    done_at: dict[str, float] = {e["id"]: e["t"] for e in events if e["event"] == "completed" and e["id"]}
    late = [e for e in events if e["event"] == "received" and e["id"] and e["t"] > done_at[e["id"]]]
    assert late == [], "a finished sample must not be sent again"
    per_lifetime = Counter((e["id"], e["pid"]) for e in events if e["event"] == "received" and e["id"])
    assert max(per_lifetime.values()) == 1, per_lifetime.most_common(3)


def test_server_stalled_mid_shard_is_restarted_and_the_shard_finishes(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """SGLang's stall: alive, healthy, taking requests, generating nothing. The supervisor sees no token
    for stall_timeout_s with requests in flight, restarts the server, and the requests lost go again
    once, without using an attempt (max_attempts 1 would fail any sample that used one)."""
    samples = make_samples(90)
    caplog.set_level(logging.INFO, logger="regen")
    cfg = rig.server_cfg({"stall_after_tokens": 4000}, max_restarts=6, stall_timeout_s=STALL_TIMEOUT_S)
    t0 = time.monotonic()
    stats, _ = rig.generate(cfg, samples, request_timeout_s=120, max_attempts=1, sampling=SHORT_ANSWERS)
    recs, fails = assert_each_sample_once(rig, samples)
    assert not fails and stats.completed == 90 and stats.retried_requests == 0
    assert time.monotonic() - t0 < 60
    stalls = [e for e in rig.events() if e["event"] == "fault:stall"]
    restarts = [r for r in stall_restarts(rig) if r["kind"] == "stall"]
    assert len(stalls) >= 2 and len(restarts) == len(stalls), "every stall restarted the server"
    for stall, restart in zip(stalls, restarts, strict=True):
        assert re.fullmatch(
            r"server PID \d+ stalled: no tokens generated for \d+ s with \d+ requests in flight; "
            r"mamba usage [0-9.]+",
            restart["cause"],
        ), restart["cause"]
        assert restart["at"] - stall["t"] <= STALL_TIMEOUT_S + SUPERVISOR_POLL_S + 1.0
    log = rig.supervisor_log()
    assert "stalled: no tokens generated for" in log and "restart 1/6" in log
    table = server_restarts_table(RunLayout.under(rig.root).restart_files())  # the report's
    assert f"server restarts: {len(restarts)}" in table
    for n, restart in enumerate(restarts, 1):
        assert f"<td>gpu0</td><td>stall</td><td>{n}/6</td><td>{html.escape(restart['cause'])}</td>" in table
    assert "lost to a server restart" in caplog.text
    assert_sent_again_once_per_restart(rig, samples)
    assert any(r["attempts"] > 1 for r in recs), "the requests in flight at a stall went again"


def test_server_stalled_during_the_drain_is_restarted_and_the_last_samples_finish(rig: Rig) -> None:
    """Every sample handed out, the last ones in flight: the server stalls then (as a slot's server
    does while its job drains), is restarted, and those samples finish."""
    samples = make_samples(40)
    cfg = rig.server_cfg(max_restarts=2, stall_timeout_s=STALL_TIMEOUT_S)
    cfg["simulated"]["token_rate"] = 400  # requests stay in flight long enough to be caught by the stall
    urls: list[str] = []

    def stall_now() -> None:
        state = read_url_state(rig.root / "work" / "servers" / "gpu0.url")
        assert state is not None and state.url is not None
        urls.append(state.url)
        urllib.request.urlopen(urllib.request.Request(state.url + "/_sim/stall", method="POST"), timeout=5)

    stats, _ = rig.generate(
        cfg, samples, request_timeout_s=120, max_attempts=1, on_exhausted=stall_now, sampling=SHORT_ANSWERS
    )
    recs, fails = assert_each_sample_once(rig, samples)
    assert urls and not fails and stats.completed == 40
    events = rig.events()
    stall_t = next(e["t"] for e in events if e["event"] == "fault:stall")
    first_sent = {}
    for e in events:
        if e["event"] == "received" and e["id"]:
            first_sent.setdefault(e["id"], e["t"])
    assert max(first_sent.values()) <= stall_t, "the stall came after every sample was handed out"
    assert [r["kind"] for r in stall_restarts(rig)] == ["stall"]
    assert sum(r["attempts"] == 2 for r in recs) >= 1
    assert_sent_again_once_per_restart(rig, samples)


def test_stall_repeating_past_max_restarts_fails_the_shard_with_its_cause(rig: Rig) -> None:
    samples = make_samples(30)
    cfg = rig.server_cfg({"stall_after_tokens": 300}, max_restarts=1, stall_timeout_s=STALL_TIMEOUT_S)
    t0 = time.monotonic()
    with pytest.raises(ShardFailedError) as failed:
        rig.generate(cfg, samples, request_timeout_s=120, max_attempts=3, sampling=SHORT_ANSWERS)
    message = str(failed.value)
    assert "its server gave up" in message and "no tokens generated for" in message, message
    assert "max_restarts=1 used up" in message and "timeout" not in message
    assert time.monotonic() - t0 < 30, "caught in seconds, not at the request timeout"
    assert [r["kind"] for r in stall_restarts(rig)] == ["stall", "gave_up"]
    assert "giving up: server PID" in rig.supervisor_log()
    assert not rig.records.exists() and not rig.failed.exists()
    journaled = {e["id"] for e in read_jsonl(rig.journal)}
    assert journaled and all(e["kind"] == "record" for e in read_jsonl(rig.journal))


def test_stall_on_one_of_two_servers_of_a_node_restarts_only_that_one(rig: Rig) -> None:
    """Two GPU slots, a shard on each; gpu0's server stalls mid-shard. gpu0's server is restarted, gpu1's
    is not, and both shards finish with every sample once (gpu1 may take some of gpu0's samples)."""
    cfg = rig.server_cfg(gpus=2, max_restarts=2, stall_timeout_s=STALL_TIMEOUT_S)
    cfg["simulated"]["token_rate"] = 800
    servers = rig.root / "work" / "servers"
    shards = {name: make_samples(60, prefix=f"{name}-") for name in ("a", "b")}
    results: dict[str, Any] = {}
    both_up = threading.Barrier(2, timeout=30)

    def job(name: str) -> None:
        out = rig.root / "results" / "generations"
        # a request lent to the other server and lost to its restart is retried here (an attempt)
        gen_cfg = {"request_timeout_s": 120, "max_attempts": 3, "backoff_base_s": 0.01, "concurrency": 16,
                   "sampling": SHORT_ANSWERS}  # fmt: skip
        try:
            with acquire_server(
                ServerConfig.from_mapping(cfg), None, owner_pid=os.getpid(), poll_s=0.05
            ) as ep:
                both_up.wait()
                if ep.server_id == "gpu0":
                    threading.Thread(target=stall_after, args=(ep.url, 15), daemon=True).start()
                assert ep.slot is not None
                lenders = SlotLenders(servers, ep.slot, 16, poll_s=0.2)
                try:
                    results[name] = (ep.server_id, generate_shard(ShardJob(
                        shards[name], rig.root / "work" / "journal" / f"{name}.jsonl", out / f"{name}.jsonl",
                        out / f"{name}.failed.jsonl", GenerateConfig.from_dict(gen_cfg), ep, name,
                        lenders=lenders, restarts=SlotRestarts.of(servers, ep),
                    )))  # fmt: skip
                finally:
                    lenders.close()
        except BaseException as exc:  # reported by the assertion below
            results[name] = exc

    threads = [threading.Thread(target=job, args=(name,)) for name in shards]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert all(isinstance(results.get(n), tuple) for n in shards), results
    for name, samples in shards.items():
        recs = read_jsonl(rig.root / "results" / "generations" / f"{name}.jsonl")
        assert sorted(r["id"] for r in recs) == sorted(s.id for s in samples)
    assert [r["kind"] for r in stall_restarts(rig, 0)] == ["stall"]
    assert stall_restarts(rig, 1) == [], "the other server never stalled and was never restarted"
    assert_sent_again_once_per_restart(rig, [s for samples in shards.values() for s in samples])


def stall_after(url: str, completed: int) -> None:
    """Stall the simulated server at ``url`` once it has completed ``completed`` requests."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/_sim/stats", timeout=5) as resp:
            if sum(orjson.loads(resp.read())["completed"].values()) >= completed:
                break
        time.sleep(0.02)
    urllib.request.urlopen(urllib.request.Request(url + "/_sim/stall", method="POST"), timeout=5)


def test_server_wedged_from_the_start_never_passes_readiness(rig: Rig) -> None:
    cfg = rig.server_cfg({"hang_rate": 1.0}, startup_timeout_s=1.5)
    with pytest.raises(ServerError, match=r"startup deadline.*last probe: TimeoutError"):
        rig.generate(cfg, make_samples(3))
    assert not rig.journal.exists() or rig.journal.read_bytes() == b""


def test_slow_start_beyond_the_readiness_deadline_is_a_clear_error_and_leaves_no_process(rig: Rig) -> None:
    cfg = rig.server_cfg(simulated={"startup_delay_s": 60}, startup_timeout_s=1.5, max_restarts=2)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"startup deadline 1.5 s \(server.startup_timeout_s\)"):
        rig.generate(cfg, make_samples(3))
    assert time.monotonic() - t0 < 20
    deadline = time.monotonic() + 10
    while server_pids_in(rig.root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_pids_in(rig.root) == [], "no supervisor or server may outlive a failed start"
    assert port_is_free("127.0.0.1", rig.port_base)
    assert "server not ready within startup deadline" in rig.supervisor_log()
    assert not rig.records.exists()


@pytest.mark.parametrize(
    ("faults", "category"),
    [
        ({"error_rate": 0.1}, "server_error: HTTP 5"),
        ({"disconnect_rate": 0.1}, "connection_error"),
        ({"malformed_rate": 0.1}, "malformed_response"),
        ({"truncate_rate": 0.1}, "truncated_response"),
    ],
)
def test_flaky_responses_are_retried_and_every_sample_lands_once(
    rig: Rig, caplog: pytest.LogCaptureFixture, faults: dict[str, Any], category: str
) -> None:
    samples = make_samples(80)
    caplog.set_level(logging.INFO, logger="regen")
    stats, _ = rig.generate(rig.server_cfg({**faults, "seed": 11}), samples, max_attempts=6)
    recs, fails = assert_each_sample_once(rig, samples)
    assert not fails
    injected = faults_samples_met(rig, "fault:")
    assert injected, "the fault rate must have hit some requests"
    assert stats.retried_requests == len(injected) == sum(r["attempts"] - 1 for r in recs)
    received = received_counts(rig)
    for r in recs:  # one request per attempt, nothing more
        assert received[r["id"]] == r["attempts"]
    assert category in caplog.text and "retrying" in caplog.text


def test_poison_samples_and_bad_requests_are_recorded_as_failed_with_reasons(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    samples = make_samples(40)
    caplog.set_level(logging.INFO, logger="regen")
    cfg = rig.server_cfg({"error_rate": 0.05, "error_for": ["f007"], "bad_request_for": ["f013"], "seed": 2})
    stats, _ = rig.generate(cfg, samples, max_attempts=3)
    recs, fails = assert_each_sample_once(rig, samples)
    by_id = {f["id"]: f for f in fails}
    assert set(by_id) == {"f007", "f013"}
    assert by_id["f007"]["reason"] == "server_error" and by_id["f007"]["attempts"] == 3
    assert by_id["f013"]["reason"].startswith("client_error: HTTP 400") and by_id["f013"]["attempts"] == 1
    assert (stats.completed, stats.failed) == (38, 2) and len(recs) == 38
    assert received_counts(rig)["f013"] == 1, "a 4xx is not retried"
    assert "wrote 38 records, 2 failures" in caplog.text
