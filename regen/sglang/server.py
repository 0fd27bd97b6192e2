"""One long-lived inference server per GPU slot, shared by the shard jobs that run on that slot.

Design "B" of docs/notes (self-managed per-GPU servers, no Snakemake service rules):

* a shard job takes an exclusive ``flock`` on the first free ``gpu{k}.lock`` (its GPU slot ``k``;
  the kernel drops it when the job dies), then a shared ``flock`` on ``gpu{k}.lease`` for its life;
* it reuses the live supervisor recorded in ``gpu{k}.url`` or starts one, detached
  (``python -m regen.sglang.supervisor``), and waits until the server answers a one-token generation;
* the supervisor owns the server process: restarts it when it crashes (bounded), and exits when told
  to, when idle with no lease held, or when the Snakemake process that owns the run is gone.

``acquire_server`` is the only entry point that starts servers; ``stop_all_servers`` is for the
Snakefile's ``onsuccess``/``onerror`` handlers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.fingerprint import server_numerics
from regen.io import write_json
from regen.layout import RUN, SlotFiles, url_files
from regen.runconfig import ServerConfig
from regen.sglang.config import PlanFile
from regen.sglang.flags import check_flags
from regen.sglang.plan import parse_flags
from regen.sglang.realized import compare, parse_startup_log, realized_from_server_info
from regen.types import Endpoint

log = logging.getLogger("regen.sglang.server")

SUPERVISOR_MODULE = "regen.sglang.supervisor"
#: flags regen sets itself; the same flag in ``server.args`` or the plan is dropped (with a warning)
MANAGED_FLAGS: frozenset[str] = frozenset(
    {"--model-path", "--model", "--host", "--port", "--reasoning-parser", "--enable-metrics"}
)
#: how long a job waits for a slot's preferred port to be released before taking any free port
PORT_WAIT_S = 1.0


class ServerError(RuntimeError):
    """A server could not be started, became unreachable, or its supervisor gave up."""


# --------------------------------------------------------------------------------------------------
# per-slot files and process checks


@dataclass(frozen=True, slots=True)
class UrlState:
    """Content of a ``gpu{k}.url`` file: ``starting PID`` | ``URL PID SERVER_PID`` | ``failed PID``."""

    supervisor_pid: int
    url: str | None = None
    server_pid: int | None = None
    failed: bool = False

    def to_line(self) -> str:
        if self.failed:
            return f"failed {self.supervisor_pid}\n"
        if self.url is None:
            return f"starting {self.supervisor_pid}\n"
        return f"{self.url} {self.supervisor_pid} {self.server_pid or 0}\n"


def read_url_state(path: str | os.PathLike[str]) -> UrlState | None:
    """Parse a url file; ``None`` when it is missing or unreadable."""
    try:
        fields = Path(path).read_text().split()
        pid = int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    head = fields[0]
    if head == "failed":
        return UrlState(pid, failed=True)
    if head.startswith("http"):
        server_pid = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None
        return UrlState(pid, url=head, server_pid=server_pid or None)
    return UrlState(pid)


def write_url_state(path: str | os.PathLike[str], state: UrlState) -> None:
    """Replace the url file atomically (temp file + rename)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(state.to_line())
    os.replace(tmp, target)


def proc_cmdline(pid: int) -> list[str]:
    """The argv of a running (non-zombie) process, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, starttime) from /proc/PID/stat, or None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[19])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def is_supervisor(pid: int, url_file: str | os.PathLike[str] | None = None) -> bool:
    """True when ``pid`` is a live regen supervisor (for ``url_file`` if given): never trust a bare PID."""
    argv = proc_cmdline(pid)
    if SUPERVISOR_MODULE not in argv:
        return False
    if url_file is None:
        return True
    try:
        recorded = argv[argv.index("--url-file") + 1]
    except (ValueError, IndexError):
        return False
    return os.path.realpath(recorded) == os.path.realpath(url_file)


def find_owner_pid() -> int:
    """The Snakemake process that owns this job, else the parent.

    Walks up from the parent to the first ancestor with ``snakemake`` in its argv, then keeps going
    while the next ancestors mention snakemake too: a ``run:`` job runs in a per-job snakemake
    process below the main one, which must not count as the owner (it exits after each job).
    """
    parent = os.getppid()
    owner: int | None = None
    pid = parent
    for _ in range(64):
        if pid <= 1:
            break
        mentions = any("snakemake" in a for a in proc_cmdline(pid))
        if mentions:
            owner = pid
        elif owner is not None:
            break
        stat = proc_stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return owner if owner is not None else parent


def log_tail(path: str | os.PathLike[str], lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when absent)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def startup_log_text(path: str | os.PathLike[str], limit: int = 512 * 1024) -> str:
    """The log of the latest server start: from the last start marker forward (``limit`` bytes),
    so the allocation lines are found however many decode lines followed them."""
    mark = SERVER_START_MARK.encode()
    start = 0
    try:
        with open(path, "rb") as fh:
            offset, carry = 0, b""
            while chunk := fh.read(1 << 20):
                found = (carry + chunk).rfind(mark)
                if found >= 0:
                    start = offset - len(carry) + found
                carry = chunk[-len(mark) :]
                offset += len(chunk)
            fh.seek(start)
            return fh.read(limit).decode(errors="replace")
    except OSError:
        return ""


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (TIME_WAIT sockets do not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _listener_inodes(port: int) -> set[str] | None:
    """The socket inodes listening on ``port`` (any address); None when /proc/net cannot be read."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{f[9]}]")
    return found if readable else None


def group_listens_on(pgid: int, port: int) -> bool | None:
    """Whether a process of group ``pgid`` (a server and its workers) holds the socket listening on
    ``port``: False when another process is seen holding it (a server answering there may be another
    run's that took the port first); None when no holder can be seen (the kernel's tables or the
    processes' file descriptors cannot be read)."""
    inodes = _listener_inodes(port)
    if not inodes:
        return None
    other = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    stat = proc_stat(int(entry))
                    if stat is not None and stat[2] == pgid:
                        return True
                    other = True
    return False if other else None


def client_host(host: str) -> str:
    """The address a client uses to reach a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


# --------------------------------------------------------------------------------------------------
# the server command


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0].replace("_", "-")


def split_flags(args: Sequence[str]) -> list[list[str]]:
    """Group a flat argv into ``[flag, value...]`` groups (``--a=1`` stays one token)."""
    groups: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def merge_launch_args(plan_args: Sequence[str], user_args: Sequence[str]) -> list[str]:
    """The plan's flags overridden by the user's explicit ones (each override logged)."""
    user_groups = split_flags(user_args)
    user_by_name = {_flag_name(g[0]): g for g in user_groups}
    merged: list[str] = []
    for group in split_flags(plan_args):
        name = _flag_name(group[0])
        if name in user_by_name:
            if list(user_by_name[name]) != list(group):  # the plan repeats the user's args as given
                log.warning("server.args sets %s; it overrides the tuner's %s", name, " ".join(group))
            continue
        merged.extend(group)
    for group in user_groups:
        merged.extend(group)
    return merged


def _drop_managed(args: Sequence[str], origin: str) -> list[str]:
    kept: list[str] = []
    for group in split_flags(args):
        name = _flag_name(group[0])
        if name in MANAGED_FLAGS:
            log.warning("%s sets %s, which regen manages from server config; ignored", origin, name)
            continue
        kept.extend(group)
    return kept


def launch_args_for(cfg: ServerConfig, plan: PlanFile | None) -> list[str]:
    """Extra launch flags: the tuner's (``use_tuner`` and a plan) with the user's ``args`` on top."""
    user = list(cfg.args)
    if cfg.use_tuner and plan is not None:
        plan_args = list(plan.launch_args)
        args = merge_launch_args(_drop_managed(plan_args, "the plan"), user)
    else:
        args = list(user)
    args = _drop_managed(args, "server.args")
    tp = cfg.tp
    names = {_flag_name(g[0]) for g in split_flags(args)}
    if tp > 1 and not names & {"--tp-size", "--tp", "--tensor-parallel-size"}:
        args += ["--tp-size", str(tp)]
    return args


def check_sglang_flags(argv: list[str]) -> None:
    """Validate a launch command's flags (what follows ``sglang.launch_server``) with
    ``regen.sglang.flags.check_flags`` - SGLang's own parser where sglang is importable."""
    if "sglang.launch_server" in argv:
        argv = argv[argv.index("sglang.launch_server") + 1 :]
    try:
        check_flags(argv)  # raises on a bad flag; returns which check ran
    except ValueError as exc:
        raise ServerError(f"bad sglang launch flags: {exc}") from exc


def build_sglang_command(cfg: ServerConfig, plan: PlanFile | None, port: int, model_path: str) -> list[str]:
    """``python -m sglang.launch_server`` for one slot, checked with ``regen.sglang.flags``."""
    argv = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path,
        "--host",
        cfg.host,
        "--port",
        str(port),
        "--reasoning-parser",
        cfg.reasoning_parser,
        "--enable-metrics",
        *launch_args_for(cfg, plan),
    ]
    check_sglang_flags(argv)
    return argv


def simulated_running_cap(cfg: ServerConfig, plan: PlanFile | None) -> int:
    """The simulated server's concurrency cap: explicit config, else the launched plan section's
    effective cap (so the simulated server behaves like the SGLang the tuner planned), else 64."""
    explicit = cfg.simulated.max_running_requests
    if explicit:
        return int(explicit)
    planned = plan.launched_section.get("effective_max_running_requests") if plan is not None else None
    return int(planned) if planned else 64


def build_simulated_command(
    cfg: ServerConfig, port: int, model_path: str, plan: PlanFile | None = None
) -> list[str]:
    """``python -m regen.sglang.simulated`` with the ``server.simulated`` behaviour."""
    sim = cfg.simulated
    return [
        sys.executable,
        "-m",
        "regen.sglang.simulated",
        "--host",
        cfg.host,
        "--port",
        str(port),
        "--model-path",
        model_path,
        "--max-running-requests",
        str(simulated_running_cap(cfg, plan)),
        "--token-rate",
        str(sim.token_rate),
        "--startup-delay",
        str(sim.startup_delay_s),
        "--faults",
        json.dumps(dict(sim.faults), sort_keys=True),
        *(["--half-speed-running", str(sim.half_speed_running)] if sim.half_speed_running else []),
        *(["--tokenizer-path", str(sim.tokenizer_path)] if sim.tokenizer_path else []),
        *(["--virtual", json.dumps(dict(sim.virtual), sort_keys=True)] if sim.virtual else []),
        *simulated_plan_options(plan),
    ]


def simulated_plan_options(plan: PlanFile | None) -> list[str]:
    """``--options`` making the simulated server report the memory map of the launched plan section and
    the state/KV dtypes of its launch flags (an SGLang started with those flags reports its own)."""
    planned = plan.launched_section if plan is not None else {}
    flags = parse_flags(list(plan.launch_args)) if plan is not None else None
    fields = {
        "weights_gib": planned.get("weights_gib"),
        "kv_cache_gib": planned.get("kv_cache_gib"),
        "max_total_num_tokens": planned.get("kv_cache_tokens"),
        "mem_fraction_static": planned.get("mem_fraction_static"),
        "available_gpu_mem_gib": planned.get("free_gib"),
        "replay_ring_gib": planned.get("replay_ring_gib") or None,
        "max_mamba_cache_size": planned.get("max_mamba_cache_size"),
        "kv_cache_dtype": flags.kv_cache_dtype if flags is not None else None,
        "mamba_ssm_dtype": flags.mamba_ssm_dtype if flags is not None else None,
    }
    options = {k: v for k, v in fields.items() if v is not None}
    return ["--options", json.dumps(options, sort_keys=True)] if options else []


#: (server config, plan, port, model_path) -> argv; tests pass their own stand-in builder
CommandBuilder = Callable[[ServerConfig, PlanFile | None, int, str], list[str]]


def build_server_command(cfg: ServerConfig, plan: PlanFile | None, port: int, model_path: str) -> list[str]:
    """The server command for ``server.mode`` (sglang or simulated)."""
    mode = cfg.mode
    if mode == "sglang":
        return build_sglang_command(cfg, plan, port, model_path)
    if mode == "simulated":
        return build_simulated_command(cfg, port, model_path, plan)
    raise ServerError(f"server.mode {mode!r} does not launch a server")


def visible_devices_for(slot: int, tp: int, inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for slot ``k``: devices k*tp..k*tp+tp-1, mapped onto a scheduler's list."""
    wanted = list(range(slot * tp, slot * tp + tp))
    if not inherited:
        return ",".join(str(d) for d in wanted)
    visible = [d for d in inherited.split(",") if d.strip()]
    if len(visible) == tp:  # the scheduler gave this job exactly its devices
        return ",".join(visible)
    if wanted[-1] >= len(visible):
        raise ServerError(
            f"GPU slot {slot} needs device(s) {wanted} but CUDA_VISIBLE_DEVICES={inherited!r} "
            f"lists only {len(visible)}; lower server.gpus / --resources gpu="
        )
    return ",".join(visible[d] for d in wanted)


def slot_count(cfg: ServerConfig, gpu_slots: int | None) -> int:
    """Server slots on this node: GPUs (``gpu_slots`` or ``server.gpus``) divided by ``server.tp``."""
    gpus = int(gpu_slots if gpu_slots else cfg.gpus)
    tp = cfg.tp
    if gpus < tp:
        raise ServerError(f"server.tp={tp} needs at least {tp} GPUs, but only {gpus} are available")
    return gpus // tp


# --------------------------------------------------------------------------------------------------
# HTTP probes (loopback, stdlib only: the supervisor imports this module)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def one_token_generation(url: str, model: str, api_key: str | None, timeout: float) -> str | None:
    """POST a one-token chat completion; None on success, else why it failed.

    SGLang's ``/health`` can answer OK while the scheduler cannot serve; a real generation cannot.
    The token is sampled with top-k/top-p filters, as a run's requests are: SGLang 0.5.17 builds
    flashinfer's sampling kernels on the first such request (~110 s on a fresh H200 machine, the
    scheduler serving nothing meanwhile), so that cost belongs to startup, not to the first shard's
    requests or a sweep's measurement window. A greedy probe never builds them.
    """
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
    }
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers=_headers(api_key),
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if not isinstance(payload, dict) or not payload.get("choices"):
        return f"no choices in reply: {str(payload)[:200]}"
    return None


def get_json(url: str, api_key: str | None = None, timeout: float = 10.0) -> Any:
    """GET ``url`` and decode JSON."""
    req = urllib.request.Request(url, headers=_headers(api_key))
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def fetch_server_info(url: str, api_key: str | None) -> dict[str, Any]:
    """``/server_info`` (older SGLang: ``/get_server_info``); {} when neither answers."""
    for path in ("/server_info", "/get_server_info"):
        try:
            info = get_json(url.rstrip("/") + path, api_key)
        except (OSError, ValueError):
            continue
        if isinstance(info, dict):
            return info
    return {}


def effective_max_running(info: Mapping[str, Any], plan: PlanFile | None) -> int | None:
    """The server's effective concurrency cap: /server_info internal state, else its args, else the plan."""
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        for key in ("effective_max_running_requests_per_dp", "max_running_requests"):
            if states[0].get(key):
                return int(states[0][key])
    if info.get("max_running_requests"):
        return int(info["max_running_requests"])
    if plan is not None:
        flags = split_flags(list(plan.launch_args))
        for group in flags:
            if _flag_name(group[0]) == "--max-running-requests":
                value = group[0].split("=", 1)[1] if "=" in group[0] else (group[1] if len(group) > 1 else "")
                if value.isdigit():
                    return int(value)
    return None


# --------------------------------------------------------------------------------------------------
# slots, leases and the supervisor


def take_slot(lock_dir: Path, slots: int, poll_s: float = 0.5) -> tuple[int, int]:
    """Exclusive flock on the first free ``gpu{k}.lock``: (k, fd). Blocks until one is free."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for k in range(slots):
            fd = os.open(lock_dir / f"gpu{k}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return k, fd
        time.sleep(poll_s)


def api_key_from(cfg: ServerConfig) -> str | None:
    """The API key from the environment variable named by ``server.api_key_env``."""
    name = cfg.api_key_env
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise ServerError(f"server.api_key_env names {name!r}, but that environment variable is not set")
    return key


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one slot's supervisor."""

    files: SlotFiles
    url: str
    host: str
    port: int
    model: str
    command: list[str]
    env: dict[str, str]
    idle_timeout_s: float
    startup_timeout_s: float
    max_restarts: int
    owner_pid: int
    api_key_env: str | None
    #: no generated token for this long with requests in flight restarts the server; None: not watched
    stall_timeout_s: float | None = None


def supervisor_argv(spec: LaunchSpec) -> list[str]:
    """``python -m regen.sglang.supervisor …  -- <server command>``."""
    argv = [
        sys.executable,
        "-m",
        SUPERVISOR_MODULE,
        "--slot",
        str(spec.files.slot),
        "--url",
        spec.url,
        "--url-file",
        str(spec.files.url.resolve()),
        "--lease-file",
        str(spec.files.lease.resolve()),
        "--log-file",
        str(spec.files.log.resolve()),
        "--progress-file",
        str(spec.files.progress.resolve()),
        "--restarts-file",
        str(spec.files.restarts.resolve()),
        "--idle-timeout",
        str(spec.idle_timeout_s),
        "--startup-timeout",
        str(spec.startup_timeout_s),
        "--max-restarts",
        str(spec.max_restarts),
        "--owner-pid",
        str(spec.owner_pid),
        "--model",
        spec.model,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
    ]
    if spec.api_key_env:
        argv += ["--api-key-env", spec.api_key_env]
    if spec.stall_timeout_s is not None:
        argv += ["--stall-timeout", str(spec.stall_timeout_s)]
    return [*argv, "--", *spec.command]


def start_supervisor(spec: LaunchSpec) -> subprocess.Popen[bytes]:
    """Start the slot's supervisor detached (own session, no inherited fds)."""

    spec.files.log.parent.mkdir(parents=True, exist_ok=True)
    with open(spec.files.log, "ab") as out:
        proc = subprocess.Popen(
            supervisor_argv(spec),
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
        )
    log.info("GPU slot %d: started server supervisor PID %d (%s)", spec.files.slot, proc.pid, spec.url)
    return proc


def wait_supervisor_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has exited; True if it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def wait_until_ready(
    files: SlotFiles,
    supervisor_pid: int,
    deadline_s: float,
    poll_s: float,
    started: subprocess.Popen[bytes] | None = None,
) -> UrlState:
    """Poll the url file until the supervisor reports its server ready; ServerError if it gives up.

    ``started`` is the Popen when this job started the supervisor (its /proc cmdline is the job's
    own until it execs, so liveness comes from the Popen then).
    """
    deadline = time.monotonic() + deadline_s
    while True:
        state = read_url_state(files.url)
        alive = started.poll() is None if started is not None else is_supervisor(supervisor_pid, files.url)
        if state is not None and state.supervisor_pid == supervisor_pid:
            if state.url is not None and alive:
                return state
            if state.failed:
                raise ServerError(
                    f"GPU slot {files.slot}: the server supervisor gave up; {files.log} ends with:\n"
                    f"{log_tail(files.log)}"
                )
        if not alive:
            raise ServerError(
                f"GPU slot {files.slot}: server supervisor PID {supervisor_pid} exited before the server "
                f"was ready; {files.log} ends with:\n{log_tail(files.log)}"
            )
        if time.monotonic() > deadline:
            raise ServerError(f"GPU slot {files.slot}: server not ready after {deadline_s:.0f} s")
        time.sleep(poll_s)


def write_realized(
    files: SlotFiles, plan: PlanFile | None, info: Mapping[str, Any], server_id: str, url: str
) -> None:
    """``gpu{k}.realized.json``: the memory map the server really got vs. the plan; drift logged."""
    out: dict[str, Any] = {
        "server_id": server_id,
        "url": url,
        "written_at": time.time(),
        "server_info": {k: info.get(k) for k in ("version", "internal_states") if k in info},
    }
    startup = parse_startup_log(startup_log_text(files.log))
    realized = realized_from_server_info(dict(info), startup)
    out["startup_log"] = _jsonable(startup)
    out["realized"] = _jsonable(realized)
    if plan is not None:
        predicted = plan.launched_section
        out["predicted"] = _jsonable(predicted)
        drift = compare(predicted, realized)
        out["drift"] = _jsonable(drift)
        for item in drift or []:
            log.warning("GPU slot %d: plan vs. realized drift: %s", files.slot, item)
    write_json(files.realized, out)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


#: the supervisor writes this line to the log before each server start
SERVER_START_MARK = "=== regen supervisor: starting server"


#: an external server's first sampled request may build sampling kernels (see one_token_generation)
EXTERNAL_PROBE_TIMEOUT_S = 300.0


def external_endpoint(cfg: ServerConfig, plan: PlanFile | None) -> Endpoint:
    """mode external: the configured URL, checked once with a one-token generation."""
    if not cfg.url:
        raise ServerError("server.mode is external but server.url is not set")
    url = cfg.url.rstrip("/")
    api_key = api_key_from(cfg)
    model = cfg.model_path
    problem = one_token_generation(url, model, api_key, timeout=EXTERNAL_PROBE_TIMEOUT_S)
    if problem is not None:
        raise ServerError(f"external server {url} failed a one-token generation: {problem}")
    info = fetch_server_info(url, api_key)
    return Endpoint(
        url=url,
        server_id="external",
        max_running_requests=effective_max_running(info, plan),
        version=info.get("version"),
        model=_served_model(info, model),
        api_key=api_key,
        numerics=server_numerics(info) if info else None,  # None: the client asks again
    )


def _served_model(info: Mapping[str, Any], default: str) -> str:
    return str(info.get("served_model_name") or info.get("model_path") or default)


@contextlib.contextmanager
def acquire_server(
    cfg: ServerConfig,
    plan: PlanFile | None = None,
    workdir: str | os.PathLike[str] = RUN.servers_root,
    log_dir: str | os.PathLike[str] = RUN.server_logs_root,
    *,
    gpu_slots: int | None = None,
    owner_pid: int | None = None,
    command_builder: CommandBuilder | None = None,
    poll_s: float = 0.25,
    on_slot: Callable[[Callable[[], None]], None] | None = None,
) -> Iterator[Endpoint]:
    """Hold a GPU slot and its server for the duration of the ``with`` block; yields the Endpoint.

    ``gpu_slots`` overrides ``server.gpus`` (Snakemake's ``--resources gpu=N``); ``owner_pid`` is the
    process whose death (with no lease held) stops the server (default: the Snakemake ancestor);
    ``command_builder`` replaces :func:`build_server_command` (tests use a stand-in server).
    ``on_slot`` is called with a function that gives the slot up before the block ends (idempotent): the
    next job waiting for a slot takes it and shares the server while this job's last requests drain
    (this job's lease keeps the server up until the block ends).
    """
    if cfg.mode == "external":
        yield external_endpoint(cfg, plan)
        return
    api_key = api_key_from(cfg)
    slots = slot_count(cfg, gpu_slots)
    slot, lock_fd = take_slot(Path(workdir), slots, poll_s=max(poll_s, 0.1))
    files = SlotFiles.of(slot, workdir, log_dir)
    held = [lock_fd]

    def give_slot_up() -> None:
        if held:
            os.close(held.pop())
            log.info("GPU slot %d: given up to the next job (this one drains)", slot)

    try:
        lease_fd = os.open(files.lease, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # blocks while the previous supervisor is exiting (it holds LOCK_EX while it stops)
            fcntl.flock(lease_fd, fcntl.LOCK_SH)
            found = _live_or_start(files, cfg, plan, api_key, owner_pid, command_builder)
            pid = found.pid if isinstance(found, subprocess.Popen) else found.supervisor_pid
            started = found if isinstance(found, subprocess.Popen) else None
            budget = cfg.startup_timeout_s * (cfg.max_restarts + 1) + 120
            state = wait_until_ready(files, pid, budget, poll_s, started)
            assert state.url is not None
            info = fetch_server_info(state.url, api_key)
            server_id = f"gpu{slot}"
            if started is not None or not files.realized.exists():  # once per server start
                try:
                    write_realized(files, plan, info, server_id, state.url)
                except (OSError, ValueError, TypeError, KeyError) as exc:
                    log.warning("GPU slot %d: could not write %s: %s", slot, files.realized, exc)
            if on_slot is not None:
                on_slot(give_slot_up)
            yield Endpoint(
                url=state.url,
                server_id=server_id,
                max_running_requests=effective_max_running(info, plan),
                version=info.get("version"),
                model=_served_model(info, cfg.model_path),
                api_key=api_key,
                numerics=server_numerics(info) if info else None,  # None: the client asks again
            )
        finally:
            os.close(lease_fd)
    finally:
        if held:
            os.close(held.pop())


def _live_or_start(
    files: SlotFiles,
    cfg: ServerConfig,
    plan: PlanFile | None,
    api_key: str | None,
    owner_pid: int | None,
    command_builder: CommandBuilder | None,
) -> UrlState | subprocess.Popen[bytes]:
    """The slot's live supervisor (its url state, reused) or a freshly started one (its Popen)."""
    state = read_url_state(files.url)
    if state is not None and is_supervisor(state.supervisor_pid, files.url):
        if not state.failed:
            log.info("GPU slot %d: reusing server supervisor PID %d", files.slot, state.supervisor_pid)
            return state
        wait_supervisor_gone(state.supervisor_pid, 30)
    host = cfg.host
    port = pick_port(host, cfg.port_base + files.slot, files.slot)
    model = cfg.model_path
    builder = command_builder or build_server_command
    command = builder(cfg, plan, port, model)
    tp = cfg.tp
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = visible_devices_for(files.slot, tp, os.environ.get("CUDA_VISIBLE_DEVICES"))
    spec = LaunchSpec(
        files=files,
        url=f"http://{client_host(host)}:{port}",
        host=host,
        port=port,
        model=model,
        command=command,
        env=env,
        idle_timeout_s=cfg.idle_timeout_s,
        startup_timeout_s=cfg.startup_timeout_s,
        max_restarts=cfg.max_restarts,
        owner_pid=owner_pid if owner_pid is not None else find_owner_pid(),
        api_key_env=cfg.api_key_env if api_key else None,
        stall_timeout_s=cfg.stall_timeout_s,
    )
    return start_supervisor(spec)


def pick_port(host: str, preferred: int, slot: int) -> int:
    """``preferred`` (port_base + slot) when free, else a free port the kernel picks.

    Another run or checkout on this node may hold the preferred port; the port actually used is
    recorded in the slot's url file (``UrlState.url``), which is where every job and ``regen status``
    read it from, so side-by-side runs never need to agree on ports.
    """
    if _wait_port_free(host, preferred, PORT_WAIT_S):
        return preferred
    port = any_free_port(host)
    log.info(
        "GPU slot %d: port %d on %s is in use (another run?); using free port %d", slot, preferred, host, port
    )
    return port


def any_free_port(host: str) -> int:
    """A port free on ``host`` now, as the kernel picks one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


# --------------------------------------------------------------------------------------------------
# shutdown


def live_supervisors(workdir: str | os.PathLike[str]) -> list[tuple[Path, UrlState]]:
    """(url file, state) of every slot whose recorded supervisor PID is really a live supervisor, in
    ``workdir`` and in its per-Slurm-job slot directories (``regen.layout.url_files``)."""
    found = []
    for url_file in url_files(workdir):
        state = read_url_state(url_file)
        if state is not None and is_supervisor(state.supervisor_pid, url_file):
            found.append((url_file, state))
    return found


def stop_all_servers(workdir: str | os.PathLike[str] = RUN.servers_root, grace_s: float = 30.0) -> int:
    """SIGTERM every live supervisor (verified PIDs), wait, then SIGKILL; returns how many were stopped.

    ``workdir`` is the run's slot root: its per-node slots and every per-Slurm-job slot directory.

    Safe to call from Snakemake's ``onsuccess``/``onerror`` when no server runs.
    """
    targets = live_supervisors(workdir)
    for url_file, state in targets:
        log.info("stopping server supervisor PID %d (%s)", state.supervisor_pid, url_file)
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for url_file, state in targets:
        while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if is_supervisor(state.supervisor_pid, url_file):
            log.warning("supervisor PID %d ignored SIGTERM; killing it", state.supervisor_pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.supervisor_pid, signal.SIGKILL)
        if state.server_pid:
            _kill_orphan_group(state.server_pid)
    return len(targets)


def _kill_orphan_group(pgid: int) -> None:
    """SIGKILL a server's process group left behind by a killed supervisor (if it still leads it)."""
    stat = proc_stat(pgid)
    if stat is None or stat[2] != pgid or stat[0] in ("Z", "X"):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
