"""The stall watch (``regen.serving.progress.ProgressWatch``) against a simulated server's own signals."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.request
from pathlib import Path

from regen.serving.progress import ProgressWatch
from regen.simulated.launcher import start_simulated_server


def looks(watch: ProgressWatch, seconds: float, every: float = 0.1) -> list[str]:
    """Every stall cause the watch names while looking for ``seconds``."""
    causes = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cause = watch.look()
        if cause is not None:
            causes.append(cause)
        time.sleep(every)
    return causes


def chat(url: str, max_tokens: int) -> None:
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": %d}' % max_tokens
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    with contextlib.suppress(OSError):
        urllib.request.urlopen(req, timeout=20).read()


def test_an_idle_server_is_never_stalled_and_idle_time_does_not_count_against_new_work(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    url, stop = start_simulated_server(token_rate=200, log_file=str(log), log_interval_s=0.2)
    try:
        watch = ProgressWatch(url, log, timeout_s=1.0, server_pid=os.getpid(), model="demo-model")
        assert looks(watch, 1.5) == [], "idle: a one-token generation answers, nothing is owed"
        # work arrives after the idle time: answers of 200 tokens at 200 tok/s take ~1 s each, so the token
        # counter stands still for ~1 s at a time while the decode lines go on
        workers = [threading.Thread(target=chat, args=(url, 200), daemon=True) for _ in range(4)]
        for w in workers:
            w.start()
        assert looks(watch, 2.5) == []
        assert watch.state().stalled_since is None
    finally:
        stop()


def test_requests_in_flight_and_no_progress_is_a_stall_named_with_its_load(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    url, stop = start_simulated_server(token_rate=50, log_file=str(log), log_interval_s=0.2)
    try:
        watch = ProgressWatch(url, log, timeout_s=1.0, server_pid=os.getpid(), model="demo-model")
        for _ in range(3):
            threading.Thread(target=chat, args=(url, 400), daemon=True).start()
        time.sleep(0.5)
        urllib.request.urlopen(urllib.request.Request(url + "/_sim/stall", method="POST"), timeout=5)
        t0 = time.monotonic()
        causes = []
        while not causes and time.monotonic() - t0 < 5:
            causes = looks(watch, 0.1)
        assert causes and causes[0].startswith(
            "no tokens generated for 1 s with 3 requests in flight; mamba usage"
        )
        assert 1.0 <= time.monotonic() - t0 <= 1.0 + 0.1 + 1.0  # timeout, one look, slack (busy machine)
        assert watch.state().stalled_since is not None
    finally:
        stop()


def test_a_server_stalled_while_idle_fails_the_one_token_generation(tmp_path: Path) -> None:
    """A scheduler stuck while idle keeps its gauges at zero however many requests wait: after half the
    stall timeout with no sign of life, a one-token generation must answer within the other half."""
    log = tmp_path / "server.log"
    url, stop = start_simulated_server(token_rate=200, log_file=str(log))
    try:
        watch = ProgressWatch(url, log, timeout_s=0.5, server_pid=os.getpid(), model="demo-model")
        urllib.request.urlopen(urllib.request.Request(url + "/_sim/stall", method="POST"), timeout=5)
        causes = looks(watch, 2.0)
        assert causes and "a one-token generation failed in 0.25 s" in causes[0], causes
    finally:
        stop()
