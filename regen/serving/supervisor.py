"""The per-GPU server supervisor: ``python -m regen.serving.supervisor [options] -- <server command>``.

Started detached by :func:`regen.serving.lifecycle.acquire_server`. It owns one server process (its own
process group, killed with the supervisor through ``PR_SET_PDEATHSIG``) and

* writes ``--url-file`` atomically: ``starting PID`` at once, ``URL PID SERVER_PID`` once a real one-token
  generation succeeds, ``failed PID`` when it gives up;
* restarts a server that dies, or that stalls: requests in flight and no token generated for
  ``--stall-timeout`` seconds (``regen.serving.progress``); at most ``--max-restarts`` times, each logged
  with its cause here and in ``--restarts-file``; its latest look at the server goes to ``--progress-file``;
* holds its port (``regen.serving.ports.hold_port``: a lock file every run on the node respects) from
  before the server starts until it stops, so no other run starts a server there; takes another free
  port, not counting it as a crash, when the port is held by another run or was taken by a process
  outside regen between the check and the server's bind;
* exits, stopping the server, on SIGTERM/SIGINT; when ``--idle-timeout`` has passed with no lease held
  (it takes LOCK_EX on ``--lease-file`` and removes the url file under that lock, so a job cannot pick
  up a server that is going away); or
  promptly when its owner is gone and no lease is held: ``--owner-pid`` (the Snakemake process), or with
  ``--owner-slurm-job`` the Slurm job (its ``slurmstepd: [JOB.batch]`` process on this node, else
  ``squeue``): the members of a group job come and go, the job stays until its last member is done, and
  while Slurm surely says it runs, the idle timeout does not end its server (the job holds the GPU; its
  next member reuses the server).

A server that crashed or stalled is stopped with SIGTERM to its group and SIGKILL after ``--grace``
seconds, so SGLang can dump what it was doing. A planned exit (signal, idle, owner gone) kills the group
at once: the server holds nothing a job needs (the journal is the client's), and SGLang turns a SIGTERM
into a watched-child crash that sleeps 5 s before its own SIGKILL of the tree
(``SGLANG_PYSPY_DUMP_BEFORE_CRASH``, 0.5.17's ``dump_requests_before_crash``): 6 s at the end of every
run, on the wall time of the workflow, measured on the H200 (``known-target-2026-12-02-n800``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from regen.serving.ports import PortHold, group_listens_on, hold_free_port, hold_port, port_is_free
from regen.serving.probes import one_token_generation
from regen.serving.procfs import (
    SERVER_READY_MARK,
    SERVER_START_MARK,
    UrlState,
    pid_alive,
    proc_stat,
    read_url_state,
    startup_log_text,
    write_url_state,
)
from regen.serving.progress import ProgressWatch, record_restart, write_progress

PR_SET_PDEATHSIG = 1
#: relaunches on another port (a port lost to another process) before the supervisor gives up
MAX_PORT_MOVES = 10


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    slot: int
    url: str
    url_file: Path
    lease_file: Path
    log_file: Path
    idle_timeout_s: float
    startup_timeout_s: float
    max_restarts: int
    owner_pid: int
    model: str
    host: str
    port: int
    api_key_env: str | None
    command: list[str]
    poll_s: float
    grace_s: float
    progress_file: Path | None = None
    restarts_file: Path | None = None
    stall_timeout_s: float | None = None
    owner_slurm_job: str | None = None


#: seconds between two ``squeue`` looks at the owning Slurm job (only when its slurmstepd is not visible)
SQUEUE_EVERY_S = 10.0


class SlurmJobWatch:
    """Is a Slurm job still running? Its batch step's ``slurmstepd: [JOB.batch]`` on this node (a look at
    /proc, free), or, where that process cannot be seen, ``squeue`` at most every :data:`SQUEUE_EVERY_S`."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.local = self.stepd_alive()
        self.last_look = -SQUEUE_EVERY_S
        #: squeue's last answer; None: it did not answer (the job counts as alive, but not surely)
        self.last_answer: bool | None = True

    def stepd_alive(self) -> bool:
        prefix = f"slurmstepd: [{self.job}.batch]".encode()  # the job's own, not one of its steps
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    if fh.read(64).startswith(prefix):
                        return True
            except OSError:
                continue
        return False

    def alive(self) -> bool:
        if self.local:
            return self.stepd_alive()
        now = time.monotonic()
        if now - self.last_look >= SQUEUE_EVERY_S:
            self.last_look = now
            self.last_answer = squeue_running(self.job)
        return self.last_answer is not False

    def surely_alive(self) -> bool:
        """The job runs, as Slurm itself says (its slurmstepd seen, or squeue answered): it still has
        group members to run, and holds its GPUs whether its server idles or not."""
        return self.alive() and (self.local or self.last_answer is True)


def squeue_running(job: str) -> bool | None:
    """``squeue`` says the job is pending, running or completing; None when it did not answer (the job
    then counts as alive, but the idle timeout still ends a supervisor whose job is gone)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return False if "Invalid job id" in out.stderr else None
    return out.stdout.strip() in {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}


class Stop(Exception):
    """Raised inside the loops when the supervisor must exit (reason in args[0])."""


class Supervisor:
    def __init__(self, cfg: SupervisorConfig, log: IO[str]) -> None:
        self.cfg = cfg
        self.log_fh = log
        self.pid = os.getpid()
        self.signalled: str | None = None
        self.owner_start = _start_time(cfg.owner_pid)
        self.owner_job = SlurmJobWatch(cfg.owner_slurm_job) if cfg.owner_slurm_job else None
        self.lease_fd = os.open(cfg.lease_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        self.child: subprocess.Popen[bytes] | None = None
        self.last_busy = time.monotonic()
        # the port can change (lost to another process); the url file records the one in use
        self.port, self.url, self.command = cfg.port, cfg.url, list(cfg.command)
        self.port_moves = 0
        self.restarts = 0
        #: the lock on ``self.port`` (``regen.serving.ports``), held while a server may run there
        self.port_hold: PortHold | None = None

    # -- logging and state -------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.log_fh.write(f"[regen-supervisor gpu{self.cfg.slot} pid {self.pid} {stamp}] {msg}\n")
        self.log_fh.flush()

    def write_state(self, state: UrlState) -> None:
        write_url_state(self.cfg.url_file, state)

    def remove_url_file_if_ours(self) -> None:
        state = read_url_state(self.cfg.url_file)
        if state is not None and state.supervisor_pid == self.pid:
            with contextlib.suppress(FileNotFoundError):
                self.cfg.url_file.unlink()

    # -- conditions ---------------------------------------------------------------------------------
    def owner(self) -> str:
        if self.owner_job is not None:
            return f"Slurm job {self.cfg.owner_slurm_job}"
        return f"owner PID {self.cfg.owner_pid}"

    def owner_gone(self) -> bool:
        if self.owner_job is not None:
            return not self.owner_job.alive()
        stat = proc_stat(self.cfg.owner_pid)
        if stat is None or stat[0] in ("Z", "X"):
            return True
        return self.owner_start is not None and stat[3] != self.owner_start

    def try_exclusive_lease(self) -> bool:
        """LOCK_EX on the lease without blocking: True when no job holds it (the lock is then ours)."""
        try:
            fcntl.flock(self.lease_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release_lease(self) -> None:
        fcntl.flock(self.lease_fd, fcntl.LOCK_UN)

    def check_exit(self) -> None:
        """Raise Stop when a signal came, or when idle/orphaned with no lease held (lock kept)."""
        if self.signalled:
            raise Stop(f"received {self.signalled}")
        if not self.try_exclusive_lease():
            self.last_busy = time.monotonic()
            return
        idle_for = time.monotonic() - self.last_busy
        if self.owner_gone():
            raise Stop(f"{self.owner()} is gone and no job holds the lease")
        if idle_for >= self.cfg.idle_timeout_s and not self.group_job_running():
            raise Stop(f"idle for {idle_for:.1f} s with no job holding the lease")
        self.release_lease()

    def group_job_running(self) -> bool:
        """Owned by a Slurm (group) job that surely still runs: its next member reuses the server, and the
        job holds the GPU anyway, so the idle timeout counts only once the job (its last member) is done;
        then the owner is gone and the supervisor exits at once (issue 58 item 2)."""
        return self.owner_job is not None and self.owner_job.surely_alive()

    # -- the server process -------------------------------------------------------------------------
    def launch(self, attempt: int) -> subprocess.Popen[bytes]:
        if self.port_hold is None or self.port_hold.port != self.port:
            self.port_hold = hold_port(self.cfg.host, self.port)
            if self.port_hold is None and not self.move_port("is held by another run or in use"):
                self.port_hold = self.wait_hold(15)
        deadline = time.monotonic() + 15
        while not port_is_free(self.cfg.host, self.port):  # a command whose port cannot be moved
            if time.monotonic() > deadline:
                raise Stop(f"port {self.port} on {self.cfg.host} is in use by another process")
            time.sleep(0.25)
        self.say(f"{SERVER_START_MARK} (attempt {attempt}): {' '.join(self.command)}")
        self.say(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')} url={self.url}")
        parent = self.pid
        child = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self.log_fh,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
            preexec_fn=lambda: _die_with_parent(parent),
        )
        self.say(f"server PID {child.pid}")
        return child

    def wait_ready(self, child: subprocess.Popen[bytes]) -> bool:
        """True once a one-token generation succeeds; False if the server died first."""
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        last_problem = "not tried"
        while True:
            if self.signalled:
                raise Stop(f"received {self.signalled} during startup")
            if child.poll() is not None:
                return False
            if self.owner_gone() and self.try_exclusive_lease():
                raise Stop(f"{self.owner()} is gone and no job holds the lease")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Stop(
                    f"server not ready within startup deadline {self.cfg.startup_timeout_s:g} s "
                    f"(server.startup_timeout_s); last probe: {last_problem}",
                )
            wait = probe_timeout(self.cfg.startup_timeout_s, remaining)
            problem = one_token_generation(self.url, self.cfg.model, self.api_key, timeout=wait)
            if problem is None and group_listens_on(child.pid, self.port) is False:
                return False  # another process answers on our port; ours cannot bind it (port_lost)
            if problem is None:
                return True
            last_problem = problem
            time.sleep(min(self.cfg.poll_s, max(0.0, deadline - time.monotonic())))

    def stop_server(self, *, planned: bool = False) -> None:
        """Stop the server's process group: at once when ``planned`` (see the module's docstring), else
        SIGTERM and SIGKILL after the grace period."""
        child = self.child
        if child is None:
            return
        if planned and child.poll() is None:
            self.say(f"stopping server PID {child.pid} (SIGKILL to its process group: a planned stop)")
        elif child.poll() is None:
            self.say(f"stopping server PID {child.pid} (SIGTERM to its process group)")
            _signal_group(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=self.cfg.grace_s)
            except subprocess.TimeoutExpired:
                self.say(f"server PID {child.pid} still running after {self.cfg.grace_s:g} s; SIGKILL")
        _signal_group(child.pid, signal.SIGKILL)  # stragglers left in the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)
        self.child = None

    # -- port ---------------------------------------------------------------------------------------
    def port_lost(self) -> bool:
        """After our server failed to start: another process listens on its port (or it said so)."""
        if self.child is not None and self.child.poll() is None:
            return True  # it never bound: wait_ready found another process answering there
        return not port_is_free(self.cfg.host, self.port) or (
            "address already in use" in startup_log_text(self.cfg.log_file).lower()
        )

    def move_port(self, why: str) -> bool:
        """Take another free port for the next launch (the url file records it once the server is
        ready); False when the command names no ``--port`` to change."""
        held = hold_free_port(self.cfg.host)
        new = held.port
        command = _with_port(self.command, new)
        if command is None:
            held.release()
            return False
        self.port_moves += 1
        if self.port_moves > MAX_PORT_MOVES:
            raise Stop(f"port {self.port} on {self.cfg.host} is in use by another process")
        cause = f"port {self.port} on {self.cfg.host} {why}; relaunching at once on free port {new}"
        self.say(f"{cause} (not a crash: no restart counted)")
        self.record("port", cause)
        self.port, self.command = new, command
        self.url = f"{self.url.rsplit(':', 1)[0]}:{new}"
        if self.port_hold is not None:
            self.port_hold.release()
        self.port_hold = held
        return True

    def wait_hold(self, timeout_s: float) -> PortHold:
        """Hold ``self.port`` (a command whose port cannot be moved), waiting ``timeout_s`` for it."""
        deadline = time.monotonic() + timeout_s
        while (held := hold_port(self.cfg.host, self.port)) is None:
            if time.monotonic() > deadline:
                raise Stop(f"port {self.port} on {self.cfg.host} is in use by another process")
            time.sleep(0.25)
        return held

    def record(self, kind: str, cause: str, server_pid: int | None = None) -> None:
        if self.cfg.restarts_file is None:
            return
        record_restart(
            self.cfg.restarts_file,
            slot=self.cfg.slot,
            kind=kind,
            cause=cause,
            restart=self.restarts,
            max_restarts=self.cfg.max_restarts,
            server_pid=server_pid,
            url=self.url,
        )

    # -- main loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        self.write_state(UrlState(self.pid))
        try:
            while True:
                self.child = self.launch(self.restarts + 1)
                stall = None
                if self.wait_ready(self.child):
                    self.say(f"{SERVER_READY_MARK}{self.url}")
                    self.write_state(UrlState(self.pid, url=self.url, server_pid=self.child.pid))
                    stall = self.monitor(self.child)
                elif self.port_lost() and self.move_port(
                    "was taken by another process before our server bound it"
                ):
                    self.stop_server()
                    continue
                if stall is not None:
                    kind, cause = "stall", f"server PID {self.child.pid} stalled: {stall}"
                    self.write_state(UrlState(self.pid))  # jobs wait for the restart, not for a dead url
                else:
                    kind, cause = "crash", f"server PID {self.child.pid} exited with code {self.child.poll()}"
                self.say(cause)
                server_pid = self.child.pid
                self.stop_server()
                if self.restarts >= self.cfg.max_restarts:
                    self.say(f"giving up: {cause}; max_restarts={self.cfg.max_restarts} is used up")
                    self.record(
                        "gave_up", f"{cause}; max_restarts={self.cfg.max_restarts} used up", server_pid
                    )
                    self.write_state(UrlState(self.pid, failed=True))
                    return 1
                self.restarts += 1
                self.say(f"restart {self.restarts}/{self.cfg.max_restarts}")
                self.record(kind, cause, server_pid)
                self.write_state(UrlState(self.pid))
        except Stop as stop:
            reason = str(stop)
            failed = "startup deadline" in reason or "in use by another" in reason
            self.say(f"exiting: {reason}")
            if failed:
                self.stop_server()
                self.record("gave_up", reason)
                self.write_state(UrlState(self.pid, failed=True))
                return 1
            # an idle or orphan exit holds LOCK_EX on the lease here: no job can pick up the url
            # file until the server is gone and this process exits (closing the lock)
            self.remove_url_file_if_ours()
            self.stop_server(planned=True)
            return 0
        finally:
            self.stop_server()

    def monitor(self, child: subprocess.Popen[bytes]) -> str | None:
        """Return None when the server died, the cause when it stalled; raise Stop when the supervisor
        must exit."""
        self.last_busy = time.monotonic()
        timeout = self.cfg.stall_timeout_s
        watch = (
            ProgressWatch(self.url, self.cfg.log_file, timeout, child.pid, self.cfg.model, self.api_key)
            if timeout
            else None
        )
        while child.poll() is None:
            self.check_exit()
            if watch is not None:
                stall = watch.look()
                if self.cfg.progress_file is not None:
                    write_progress(self.cfg.progress_file, watch.state())
                if stall is not None:
                    return stall
            time.sleep(self.cfg.poll_s)
        return None


def _with_port(command: list[str], port: int) -> list[str] | None:
    """``command`` with its ``--port`` value replaced (None when it has none)."""
    out = list(command)
    for i, token in enumerate(out):
        if token == "--port" and i + 1 < len(out):
            out[i + 1] = str(port)
            return out
        if token.startswith("--port="):
            out[i] = f"--port={port}"
            return out
    return None


def _start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[3] if stat is not None else None


def _die_with_parent(parent: int) -> None:
    """In the server child: get SIGKILL when the supervisor dies (Linux PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(1)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


#: a readiness probe waits at most this long, and at most a quarter of the startup deadline, so one probe
#: that a server drops (a wedged request) leaves time for more before the deadline (on real SGLang the
#: first sampled request after a fresh start took ~75 s of one-time JIT builds: the next probe then finds
#: the kernels built)
PROBE_TIMEOUT_MAX_S = 60.0
PROBE_SHARE_OF_STARTUP = 0.25


def probe_timeout(startup_timeout_s: float, remaining_s: float) -> float:
    """How long one readiness probe waits: at most a quarter of the startup deadline and 60 s, never past
    the deadline, at least 1 s."""
    return max(1.0, min(PROBE_TIMEOUT_MAX_S, PROBE_SHARE_OF_STARTUP * startup_timeout_s, remaining_s))


def parse_args(argv: list[str]) -> SupervisorConfig:
    if "--" not in argv:
        raise SystemExit("regen supervisor: missing '-- <server command>'")
    split = argv.index("--")
    own, command = argv[:split], argv[split + 1 :]
    if not command:
        raise SystemExit("regen supervisor: empty server command after '--'")
    p = argparse.ArgumentParser(prog="python -m regen.serving.supervisor")
    p.add_argument("--slot", type=int, required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--url-file", type=Path, required=True)
    p.add_argument("--lease-file", type=Path, required=True)
    p.add_argument("--log-file", type=Path, required=True)
    # the server section's values, always passed by regen.serving.slots (their defaults are the schema's)
    p.add_argument("--idle-timeout", type=float, required=True)
    p.add_argument("--startup-timeout", type=float, required=True)
    p.add_argument("--max-restarts", type=int, required=True)
    p.add_argument("--owner-pid", type=int, required=True)
    p.add_argument("--owner-slurm-job", default=None, help="the Slurm job owning the server (not the PID)")
    p.add_argument("--model", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key-env", default=None)
    p.add_argument("--poll", type=float, default=0.5, help="seconds between checks")
    p.add_argument("--grace", type=float, default=20, help="seconds from SIGTERM to SIGKILL of the server")
    p.add_argument("--progress-file", type=Path, default=None)
    p.add_argument("--restarts-file", type=Path, default=None)
    p.add_argument("--stall-timeout", type=float, default=None, help="seconds with no progress: a stall")
    a = p.parse_args(own)
    return SupervisorConfig(
        slot=a.slot,
        url=a.url,
        url_file=a.url_file,
        lease_file=a.lease_file,
        log_file=a.log_file,
        idle_timeout_s=a.idle_timeout,
        startup_timeout_s=a.startup_timeout,
        max_restarts=a.max_restarts,
        owner_pid=a.owner_pid,
        model=a.model,
        host=a.host,
        port=a.port,
        api_key_env=a.api_key_env,
        command=command,
        poll_s=a.poll,
        grace_s=a.grace,
        progress_file=a.progress_file,
        restarts_file=a.restarts_file,
        stall_timeout_s=a.stall_timeout,
        owner_slurm_job=a.owner_slurm_job,
    )


def main(argv: list[str]) -> int:
    cfg = parse_args(argv)
    cfg.log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(cfg.log_file, "a", buffering=1) as log:
        sup = Supervisor(cfg, log)

        def on_signal(signum: int, _frame: object) -> None:
            sup.signalled = signal.Signals(signum).name

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if sup.owner_job is not None:
            how = "its slurmstepd on this node" if sup.owner_job.local else "squeue"
            sup.say(f"supervising slot {cfg.slot}; owner {sup.owner()} (watched through {how})")
        else:
            sup.say(f"supervising slot {cfg.slot}; {sup.owner()} alive={pid_alive(cfg.owner_pid)}")
        return sup.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
