"""The one interface of a server mode: how ``server.mode`` turns into a server the client can use.

A mode either launches a server per GPU slot (``launches``: :meth:`ServerMode.command` gives its argv; the
slot, its supervisor and readiness are ``regen.serving.slots``'s) or reaches one that is already running
(:meth:`ServerMode.endpoint`). The modes: ``regen.serving.local_sglang`` (SGLang),
``regen.serving.simulated_mode`` (the simulated server), ``regen.serving.remote`` (an external endpoint).
"""

from __future__ import annotations

import os
from abc import ABC
from collections.abc import Callable
from typing import ClassVar

from regen.runconfig import ServerConfig
from regen.sglang.config import PlanFile
from regen.types import Endpoint


class ServerError(RuntimeError):
    """A server could not be started, became unreachable, or its supervisor gave up."""


#: (server config, plan, port, model_path) -> argv; tests pass their own stand-in builder
CommandBuilder = Callable[[ServerConfig, PlanFile | None, int, str], list[str]]
#: argv -> None, or ServerError: a launch command's check that takes long (SGLang's own parser), run while
#: the server it checks starts (``regen.serving.slots.live_or_start``)
LaunchCheck = Callable[[list[str]], None]


class ServerMode(ABC):
    """One ``server.mode``: a server launched per slot (``command``) or reached as it is (``endpoint``)."""

    #: the ``server.mode`` value
    name: ClassVar[str]
    #: True: a server is started per GPU slot with :meth:`command`; False: :meth:`endpoint` reaches one
    launches: ClassVar[bool] = True

    def command(self, cfg: ServerConfig, plan: PlanFile | None, port: int, model_path: str) -> list[str]:
        """The argv that starts this mode's server on ``port``."""
        raise ServerError(f"server.mode {self.name!r} does not launch a server")

    def launch_check(self, argv: list[str]) -> None:
        """Raise ServerError when ``argv`` (from :meth:`command`) would not start the server meant; run
        once its supervisor has started, while the server loads (none by default)."""
        return None

    def planned_args(self, cfg: ServerConfig) -> list[str]:
        """The flags the planner plans under: ``server.args`` and whatever this mode's launch adds to them
        whatever the plan says (the planner's prediction is for the server as launched)."""
        return list(cfg.args)

    def planned(self, cfg: ServerConfig, plan: PlanFile) -> PlanFile:
        """The plan as this mode's server serves it (the planner's is a GPU's; unchanged by default)."""
        return plan

    def endpoint(self, cfg: ServerConfig, plan: PlanFile | None) -> Endpoint:
        """The running server this mode reaches, checked."""
        raise ServerError(f"server.mode {self.name!r} launches its server on a GPU slot")


def api_key_from(cfg: ServerConfig) -> str | None:
    """The API key from the environment variable named by ``server.api_key_env``."""
    name = cfg.api_key_env
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise ServerError(f"server.api_key_env names {name!r}, but that environment variable is not set")
    return key
