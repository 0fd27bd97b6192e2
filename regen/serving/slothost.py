"""A Slurm group job's slot host: ``python -m regen.serving.slothost``, the Slurm profile's ``precommand``.

The members of a group job each run in a job step of their own (``srun -n1``, from the executor's jobstep
plugin). Where Slurm tracks processes by cgroup (``ProctrackType=proctrack/cgroup``, most sites) every
process of a step dies when the step ends, however detached, so a server the first member started died
with it and each member loaded the model again. The job's **batch step** lasts as long as the job, and
Snakemake's ``--precommand`` runs there, in the ``sbatch`` script before the group's own ``snakemake``
(read in snakemake-interface-executor-plugins' ``format_job_exec`` and checked on the CI cluster: the
precommand's cgroup is ``…/job_N/step_batch``, the members' ``…/step_0``, ``…/step_1``).

So the precommand starts this host there, detached (it stays in the batch step's cgroup) and returns at
once. The host listens on an abstract Unix socket named after the uid and the job (node-local, no file on
the shared filesystem; only a peer of the same uid is served, checked with ``SO_PEERCRED``). A member
that needs a supervisor (:func:`regen.serving.slots.start_supervisor`) asks the host to start it as the
host's child, in the batch step, with the member's argv and environment; the next members find it live
in the slot's url file and reuse it, as before. The supervisor's lifecycle is unchanged
(``regen.serving.supervisor``): it exits when the job is gone, when idle, or on a signal. Without a
host (a local run, another executor, a profile without the precommand) the member starts the supervisor
itself, as before.

The host exits when its job is gone (where Slurm tracks by parent PID the host outlives the batch step
otherwise); under cgroup tracking Slurm ends it with the batch step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.layout.names import SLOT_HOST_LOG
from regen.layout.run import RUN
from regen.layout.slots import slurm_job_id
from regen.serving.base import ServerError
from regen.serving.procfs import SUPERVISOR_MODULE, is_supervisor, proc_cmdline, proc_stat
from regen.serving.supervisor import SlurmJobWatch

HOST_MODULE = "regen.serving.slothost"
#: the longest request a host reads (argv and environment of one supervisor)
MAX_REQUEST = 1 << 20
#: how long a member waits for the host's answer (the host only forks and execs)
ANSWER_TIMEOUT_S = 60.0


def socket_address(job: str, uid: int | None = None) -> bytes:
    """The host's abstract socket address for Slurm job ``job`` (per user: two users' jobs never meet)."""
    return f"\0regen-slot-host.{os.getuid() if uid is None else uid}.{job}".encode()


def host_log(job: str) -> Path:
    """The host's log, beside the job's server logs (``logs/servers/slurm-{job}/host.log``)."""
    return RUN.server_logs_dir(job) / SLOT_HOST_LOG


# -- the member's side ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostedSupervisor:
    """A supervisor the slot host started for this member: a handle shaped like ``subprocess.Popen``.

    It is the host's child, not ours: it is seen through /proc, and verified to be the supervisor of
    ``url_file`` before any signal (never a bare PID). The host answers once /proc shows it as one
    (:func:`wait_exec`). It counts as running until that very process (its PID and start time) is a
    zombie or gone: an exiting process loses its cmdline before it stops running."""

    pid: int
    url_file: Path
    start_time: int | None = None

    def __post_init__(self) -> None:
        if self.start_time is None and is_supervisor(self.pid, self.url_file):
            stat = proc_stat(self.pid)
            object.__setattr__(self, "start_time", None if stat is None else stat[3])

    def poll(self) -> int | None:
        stat = proc_stat(self.pid)
        running = stat is not None and stat[0] not in ("Z", "X") and stat[3] == self.start_time
        return None if running else 0

    def _signal(self, sig: signal.Signals) -> None:
        if is_supervisor(self.pid, self.url_file):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([SUPERVISOR_MODULE], timeout or 0.0)
            time.sleep(0.1)
        return 0


def ask_host(
    job: str, request: Mapping[str, Any], timeout_s: float = ANSWER_TIMEOUT_S
) -> dict[str, Any] | None:
    """Send one request to job ``job``'s slot host on this node; its answer, or None when no host listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        try:
            conn.connect(socket_address(job))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        conn.sendall(json.dumps(request).encode() + b"\n")
        answer = _read_line(conn)
    try:
        out = json.loads(answer)
    except ValueError:
        raise ServerError(f"the slot host of Slurm job {job} answered {answer[:200]!r}") from None
    if not isinstance(out, dict):
        raise ServerError(f"the slot host of Slurm job {job} answered {answer[:200]!r}")
    return out


def start_hosted(
    job: str, args: Sequence[str], env: Mapping[str, str], log_file: Path, url_file: Path
) -> HostedSupervisor | None:
    """Have job ``job``'s slot host start ``python -m regen.serving.supervisor ARGS`` (output appended to
    ``log_file``); None when the job has no host on this node (the caller starts it itself)."""
    answer = ask_host(job, {"op": "start", "args": list(args), "env": dict(env), "log": str(log_file)})
    if answer is None:
        return None
    if "error" in answer or not isinstance(answer.get("pid"), int):
        raise ServerError(f"the slot host of Slurm job {job} could not start the supervisor: {answer}")
    return HostedSupervisor(answer["pid"], url_file)


# -- the host's side --------------------------------------------------------------------------------


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ServerError(f"slot host: a message longer than {MAX_REQUEST} bytes")
    return data.strip()


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class SlotHost:
    """The serving loop: start supervisors on request, reap them, exit when the job is gone."""

    def __init__(self, listener: socket.socket, job: str) -> None:
        self.listener = listener
        self.job = job
        self.children: list[subprocess.Popen[bytes]] = []
        self.watch = SlurmJobWatch(job)
        self.stopped = False

    def say(self, msg: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"[regen-slot-host job {self.job} pid {os.getpid()} {stamp}] {msg}", flush=True)

    def reap(self) -> None:
        for child in list(self.children):
            code = child.poll()
            if code is not None:
                self.say(f"supervisor PID {child.pid} exited with code {code}")
                self.children.remove(child)

    def serve(self, poll_s: float = 1.0) -> int:
        self.listener.settimeout(poll_s)
        while not self.stopped:
            self.reap()
            if not self.watch.alive():
                self.say("the job is gone; exiting")
                return 0
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except InterruptedError:
                continue
            with conn:
                try:
                    answer = self.handle(conn)
                except (OSError, ServerError, ValueError) as exc:
                    answer = {"error": str(exc)}
                    self.say(f"request refused: {exc}")
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps(answer).encode() + b"\n")
        self.say("stopped by a signal")
        return 0

    def handle(self, conn: socket.socket) -> dict[str, Any]:
        conn.settimeout(10.0)
        uid = peer_uid(conn)
        if uid != os.getuid():
            raise ServerError(f"a process of uid {uid} is not this host's user ({os.getuid()})")
        request = json.loads(_read_line(conn))
        op = request.get("op") if isinstance(request, dict) else None
        if op == "ping":
            return {"pid": os.getpid(), "job": self.job, "children": [c.pid for c in self.children]}
        if op != "start":
            raise ServerError(f"unknown request {op!r}")
        return {"pid": self.start(request)}

    def start(self, request: Mapping[str, Any]) -> int:
        args, env, log = request.get("args"), request.get("env"), request.get("log")
        if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
            raise ServerError("'args' must be a list of strings")
        if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise ServerError("'env' must map strings to strings")
        if not isinstance(log, str) or not log:
            raise ServerError("'log' must name the supervisor's log file")
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        # only ever a supervisor: the host runs no other command for anyone
        argv = [sys.executable, "-m", SUPERVISOR_MODULE, *args]
        with open(log, "ab") as out:
            child = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, close_fds=True,
                start_new_session=True,
            )  # fmt: skip
        self.children.append(child)
        shown = wait_exec(child)
        self.say(f"started supervisor PID {child.pid} (log {log})" + ("" if shown else "; it exited at once"))
        return child.pid


def wait_exec(child: subprocess.Popen[bytes], timeout_s: float = 10.0) -> bool:
    """Wait until /proc shows ``child`` running the supervisor (True) or it exited (False): right after
    ``Popen`` returns, its /proc cmdline can still be empty (measured), and a member that looked then
    would take a starting supervisor for a dead one."""
    deadline = time.monotonic() + timeout_s
    while child.poll() is None and time.monotonic() < deadline:
        if SUPERVISOR_MODULE in proc_cmdline(child.pid):
            return True
        time.sleep(0.01)
    return child.poll() is None


def launch(job: str, log_file: Path) -> int | None:
    """Bind the job's socket here (so a member that connects right after finds it), then start the host
    detached with it; the host's PID, or None when a host of this job already listens on this node."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(socket_address(job))
    except OSError:
        listener.close()
        return None
    with listener:
        listener.listen(64)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", HOST_MODULE, "--serve-fd", str(listener.fileno()), "--job", job],
                pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
    return proc.pid


def cgroup_of_self() -> str:
    """This process's Slurm cgroup (the freezer or unified line), for the log: which step it lives in."""
    with contextlib.suppress(OSError):
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        for line in lines:
            if "slurm" in line:
                return line.split(":", 2)[-1]
    return "?"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {HOST_MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--serve-fd", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--job", default=None, help="the Slurm job (default: SLURM_JOB_ID)")
    a = p.parse_args(argv)
    if a.serve_fd is not None:
        listener = socket.socket(fileno=a.serve_fd)
        host = SlotHost(listener, a.job)

        def on_signal(signum: int, _frame: object) -> None:
            host.stopped = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        host.say(f"serving Slurm job {a.job}'s members on this node (cgroup {cgroup_of_self()})")
        return host.serve()
    job = a.job or slurm_job_id()
    if job is None:
        print("regen slot host: not in a Slurm job (no SLURM_JOB_ID); nothing to do", file=sys.stderr)
        return 0
    if os.environ.get("SLURM_STEP_ID") and a.job is None:
        # a host in a member's own step would die with it: only the batch step outlives the members
        print(f"regen slot host: in step {os.environ['SLURM_STEP_ID']} of job {job}, not its batch step; "
              "not started", file=sys.stderr)  # fmt: skip
        return 0
    log_file = host_log(job)
    try:
        pid = launch(job, log_file)
    except OSError as exc:  # the job runs on without a host: each member then starts its own server
        print(f"regen slot host: not started for Slurm job {job}: {exc}", file=sys.stderr)
        return 0
    if pid is None:
        print(f"regen slot host: job {job} already has one on this node", file=sys.stderr)
    else:
        print(f"regen slot host: PID {pid} for Slurm job {job} ({log_file})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
