"""server.mode sglang: ``python -m sglang.launch_server`` per GPU slot, flags checked by SGLang's parser."""

from __future__ import annotations

import logging
import sys
import time
from typing import ClassVar

from regen.runconfig import ServerConfig
from regen.serving.base import ServerError, ServerMode
from regen.serving.launch_args import launch_args_for, with_launch_defaults
from regen.sglang.config import PlanFile
from regen.sglang.flags import check_flags

log = logging.getLogger("regen.serving.local_sglang")


def check_sglang_flags(argv: list[str]) -> None:
    """Validate a launch command's flags (what follows ``sglang.launch_server``) with
    ``regen.sglang.flags.check_flags`` - SGLang's own parser where sglang is importable."""
    if "sglang.launch_server" in argv:
        argv = argv[argv.index("sglang.launch_server") + 1 :]
    started = time.monotonic()
    try:
        done = check_flags(argv)  # raises on a bad flag; returns which check ran
    except ValueError as exc:
        raise ServerError(f"bad sglang launch flags: {exc}") from exc
    log.info("launch flags checked by %s in %.1f s", done.method, time.monotonic() - started)


def build_sglang_command(
    cfg: ServerConfig,
    plan: PlanFile | None,
    port: int,
    model_path: str,
    *,
    launch_defaults: bool = True,
    check: bool = True,
) -> list[str]:
    """``python -m sglang.launch_server`` for one slot (``LAUNCH_DEFAULT_FLAGS`` included unless
    ``launch_defaults`` is False: a baseline launched as a user would launch SGLang), checked with
    ``regen.sglang.flags`` unless ``check`` is False (:meth:`LocalSGLang.launch_check` checks it then,
    while the server starts)."""
    extra = launch_args_for(cfg, plan)
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
        *(with_launch_defaults(extra) if launch_defaults else extra),
    ]
    if check:
        check_sglang_flags(argv)
    return argv


class LocalSGLang(ServerMode):
    """SGLang launched on each GPU slot (``build_sglang_command``)."""

    name: ClassVar[str] = "sglang"

    def command(self, cfg: ServerConfig, plan: PlanFile | None, port: int, model_path: str) -> list[str]:
        return build_sglang_command(cfg, plan, port, model_path, check=False)

    def launch_check(self, argv: list[str]) -> None:
        """SGLang's own parser on the launch flags (``check_sglang_flags``): importing it took 18.5 s on
        the H200 host, so it runs while the server loads instead of before its start."""
        check_sglang_flags(argv)

    def planned_args(self, cfg: ServerConfig) -> list[str]:
        """``server.args`` with the launch defaults they leave in place (``LAUNCH_DEFAULT_FLAGS``), as the
        planner must see them."""
        return with_launch_defaults(list(cfg.args))
