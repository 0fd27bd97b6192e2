"""Starting a simulated server: in a thread or a subprocess (tests, benches), or as ``regen serve-simulated``
/ ``python -m regen.simulated`` (the supervisor's server command in ``server.mode: simulated``).

The hook: ``$REGEN_SIM_SERVER`` names ``module:factory``, a :data:`regen.simulated.server.ServerFactory`
that makes the process's server instead of :class:`SimulatedServer` (a bench's subclass: virtual time,
a known target's chain; their settings come from their own environment variables). The environment,
not a config key, carries it: a workflow's servers inherit it through Snakemake and the supervisor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from typing import Any

import orjson
from aiohttp import web

from regen.simulated.faults import Faults
from regen.simulated.options import REQUEST_LOG_ENV, TOOL_CALL_PARSER_ENV, SimOptions, env_options
from regen.simulated.requestlog import LogWriter, LogWriterStderr
from regen.simulated.server import ServerFactory, SimulatedServer

#: ``module:attr`` of the ServerFactory a simulated server process uses (see the module doc)
SERVER_HOOK_ENV = "REGEN_SIM_SERVER"
DESCRIPTION = "run the SGLang-compatible simulated server"


def server_factory_from(environ: Mapping[str, str]) -> ServerFactory:
    """The factory ``$REGEN_SIM_SERVER`` names, else :class:`SimulatedServer`."""
    named = environ.get(SERVER_HOOK_ENV)
    if not named:
        return SimulatedServer
    module, _, attr = named.partition(":")
    if not attr:
        raise SystemExit(f"${SERVER_HOOK_ENV}={named!r}: expected module:factory")
    factory: ServerFactory = getattr(importlib.import_module(module), attr)
    return factory


async def _serve(
    opts: SimOptions,
    host: str,
    port: int,
    log: LogWriter,
    on_crash: Callable[[], None],
    reuse_port: bool = False,
    factory: ServerFactory = SimulatedServer,
) -> tuple[web.AppRunner, int]:
    server = factory(opts, log, on_crash)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, bound


def start_simulated_server(
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    subprocess_mode: bool = False,
    cpus: set[int] | None = None,
    log_file: str | None = None,
    server_factory: ServerFactory | None = None,
    **opts: Any,
) -> tuple[str, Callable[[], None]]:
    """Start a simulated server; return ``(url, stop)``.

    In-thread by default (fast to start; ``crash_after`` closes the listener and every
    connection). ``subprocess_mode=True`` runs the CLI in a child process (optionally pinned
    to ``cpus``); there ``crash_after`` really exits the process. ``server_factory`` makes the
    in-thread server (a bench's subclass); a subprocess takes its hook from ``$REGEN_SIM_SERVER``.
    """
    if subprocess_mode:
        if server_factory is not None:
            raise ValueError(
                "a subprocess server takes its factory from $REGEN_SIM_SERVER, not server_factory"
            )
        return _start_subprocess(port, host, cpus, log_file, opts)
    if "faults" in opts and not isinstance(opts["faults"], Faults):
        opts["faults"] = Faults.from_json(opts["faults"])
    options = SimOptions(**opts)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}
    log = LogWriter(log_file)

    def crash() -> None:
        loop.call_soon(lambda: asyncio.ensure_future(box["runner"].cleanup()))

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            box["runner"], box["port"] = loop.run_until_complete(
                _serve(options, host, port, log, crash, factory=server_factory or SimulatedServer)
            )
        except BaseException as exc:
            box["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=run, name=f"sim-sglang-{port}", daemon=True)
    thread.start()
    started.wait()
    if "error" in box:
        raise box["error"]

    def stop() -> None:
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        log.close()

    return f"http://{host}:{box['port']}", stop


def _start_subprocess(
    port: int, host: str, cpus: set[int] | None, log_file: str | None, opts: dict[str, Any]
) -> tuple[str, Callable[[], None]]:
    argv = [
        sys.executable,
        "-m",
        "regen.simulated",
        "--host",
        host,
        "--port",
        str(port),
        "--print-url",
    ]
    if log_file:
        argv += ["--log-file", log_file]
    faults = opts.pop("faults", None)
    if faults:
        fj = (
            {f.name: getattr(faults, f.name) for f in fields(Faults)}
            if isinstance(faults, Faults)
            else faults
        )
        argv += ["--faults", orjson.dumps(fj).decode()]
    argv += ["--options", orjson.dumps(opts).decode()]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"simulated server did not start (exit {proc.wait()}): {line!r}")

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    return line, stop


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="regen serve-simulated", description="run the SGLang-compatible simulated server"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to listen on; 0 picks a free one")
    p.add_argument("--model-path", default="demo-model", help="model name it reports")
    p.add_argument("--served-model-name", default=None, help="served name (default: --model-path)")
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=64,
        help="concurrent requests decoded at once (default 64)",
    )
    p.add_argument("--token-rate", type=float, default=0.0, help="decode tokens/s per request; 0 = instant")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds until /health answers 200")
    p.add_argument(
        "--half-speed-running",
        type=int,
        default=None,
        help="batch model: per-request rate = token-rate / (1 + running / N); default: no batch effect",
    )
    p.add_argument("--faults", default=None, help="JSON object of Faults fields")
    p.add_argument("--version", default="0.5.23", help="SGLang version it reports and imitates")
    p.add_argument("--log-file", default=None, help="write SGLang-style log lines here (default stderr)")
    p.add_argument("--inline", action="store_true", help="answer inside the handler (no queue, no sleeps)")
    p.add_argument(
        "--context-length", type=int, default=32768, help="context length it reports (default 32768)"
    )
    p.add_argument(
        "--tokenizer-path",
        default=None,
        help="directory with tokenizer.json and the chat template: work in tokens and return token ids",
    )
    p.add_argument("--options", default=None, help="JSON object of further SimOptions fields")
    p.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT (several processes on one port)")
    p.add_argument("--print-url", action="store_true", help="print the bound URL on stdout once listening")
    p.add_argument(
        "--request-log",
        default=os.environ.get(REQUEST_LOG_ENV) or None,
        help=f"append received/completed chat requests as JSONL (default: ${REQUEST_LOG_ENV})",
    )
    a = p.parse_args(argv)
    extra = orjson.loads(a.options) if a.options else {}
    if "faults" in extra:
        raise SystemExit("--options: pass faults with --faults")
    opts = SimOptions(
        model_path=a.model_path,
        served_model_name=a.served_model_name,
        max_running_requests=a.max_running_requests,
        token_rate=a.token_rate,
        half_speed_running=a.half_speed_running,
        startup_delay_s=a.startup_delay,
        version=a.version,
        inline=a.inline,
        context_len=a.context_length,
        request_log=a.request_log,
        tokenizer_path=a.tokenizer_path,
        tool_call_parser=os.environ.get(TOOL_CALL_PARSER_ENV) or None,
        faults=Faults.from_json(orjson.loads(a.faults) if a.faults else None),
    )
    opts = replace(opts, **extra)
    opts = replace(opts, **env_options(os.environ))
    log = LogWriter(a.log_file) if a.log_file else LogWriterStderr()

    def crash() -> None:
        log.close()
        os._exit(3)

    async def main() -> None:
        runner, port = await _serve(
            opts, a.host, a.port, log, crash, a.reuse_port, server_factory_from(os.environ)
        )
        if a.print_url:
            print(f"http://{a.host}:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0
