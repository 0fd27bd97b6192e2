"""server.mode external: a server someone else runs, at ``server.url``, checked once before use."""

from __future__ import annotations

from typing import ClassVar

from regen.fingerprint import server_numerics
from regen.runconfig import ServerConfig
from regen.serving.base import ServerError, ServerMode, api_key_from
from regen.serving.probes import (
    effective_max_running,
    fetch_server_info,
    one_token_generation,
    radix_cache_on,
    served_model,
    server_running_cap,
)
from regen.sglang.config import PlanFile
from regen.types import Endpoint

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
        server_running_cap=server_running_cap(info, plan),
        version=info.get("version"),
        model=served_model(info, model),
        api_key=api_key,
        numerics=server_numerics(info) if info else None,  # None: the client asks again
        radix_cache=radix_cache_on(info),
    )


class RemoteEndpoint(ServerMode):
    """An external endpoint: nothing launched, the configured URL checked (``external_endpoint``)."""

    name: ClassVar[str] = "external"
    launches: ClassVar[bool] = False

    def endpoint(self, cfg: ServerConfig, plan: PlanFile | None) -> Endpoint:
        return external_endpoint(cfg, plan)
