"""HTTP probes of a server (loopback, stdlib only: the supervisor imports this module)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from regen.serving.launch_args import flag_name, split_flags
from regen.sglang.config import PlanFile

#: what a GET or POST to a server raises when it gets no usable answer: no connection or a timeout
#: (OSError), a body that does not parse (ValueError), a reply cut short (http.client.IncompleteRead and
#: the other HTTPExceptions, which are no OSError)
NO_ANSWER: tuple[type[Exception], ...] = (OSError, ValueError, http.client.HTTPException)


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
    except NO_ANSWER as exc:
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
        except NO_ANSWER:
            continue
        if isinstance(info, dict):
            return info
    return {}


def effective_max_running(info: Mapping[str, Any], plan: PlanFile | None) -> int | None:
    """The requests a client keeps running on this server: the plan's ``client_concurrency`` (the KV filled
    at the expected length, for models whose running cap the planner leaves at SGLang's default, which can
    be thousands) within the server's own cap; else the server's cap (``/server_info`` internal state, else
    its args, else the launch flags)."""
    cap = server_running_cap(info, plan)
    planned = plan.client_concurrency if plan is not None else None
    if planned and cap:
        return min(planned, cap)
    return planned or cap


def server_running_cap(info: Mapping[str, Any], plan: PlanFile | None) -> int | None:
    """The server's effective concurrency cap: /server_info internal state, else its args, else the plan."""
    states = info.get("internal_states") or []
    if isinstance(states, list) and states and isinstance(states[0], dict):
        for key in ("effective_max_running_requests_per_dp", "max_running_requests"):
            if states[0].get(key):
                return int(states[0][key])
    if info.get("max_running_requests"):
        return int(info["max_running_requests"])
    if plan is not None:
        flags = split_flags(list(plan.launch_args))
        for group in flags:
            if flag_name(group[0]) == "--max-running-requests":
                value = group[0].split("=", 1)[1] if "=" in group[0] else (group[1] if len(group) > 1 else "")
                if value.isdigit():
                    return int(value)


def radix_cache_on(info: Mapping[str, Any]) -> bool | None:
    """Whether the server keeps its radix cache (/server_info's ``disable_radix_cache``); None: unknown."""
    disabled = info.get("disable_radix_cache")
    return None if disabled is None else not disabled


def served_model(info: Mapping[str, Any], default: str) -> str:
    """The model name the server answers to (``/server_info``), else ``default``."""
    return str(info.get("served_model_name") or info.get("model_path") or default)
