"""Per-sample ``max_tokens`` for benchmarks, outside regen: a reverse proxy between regen's client and the
server that rewrites each chat request's ``max_tokens`` from the sample it is for (regen's
``X-Regen-Sample-Id`` header). With ``ignore_eos`` on dummy weights that gives an output-length spread (the
live sweep ``bench.gpu.tune_live``, ``tests/tune/test_sweep.py``) while a run's configs, and regen's client,
give every request ``sampling.max_tokens``. Samples not in the map keep what regen sent.

- :class:`LengthProxy`: the proxy, on its own thread and event loop (the client runs its own).
- :func:`proxied`: an :class:`~regen.types.Endpoint` whose requests go through one.
- :func:`behind_proxy`: ``regen.tune.sweep.run_sweep``'s ``endpoint_wrapper`` that puts every candidate's
  server behind one (the sweep starts its servers itself; its pilot drives the endpoint this yields).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from regen.generate.request import SAMPLE_ID_HEADER
from regen.types import Endpoint

#: request headers the proxy does not pass on (its own connection's; aiohttp sets them again)
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


class LengthProxy:
    """A reverse proxy to ``upstream`` (``http://host:port``) on a free local port (:attr:`url`)."""

    def __init__(self, upstream: str, max_tokens_by_id: Mapping[str, int]) -> None:
        self.upstream = upstream.rstrip("/")
        self.by_id = {str(k): int(v) for k, v in max_tokens_by_id.items()}
        self.rewritten = 0  # chat requests whose max_tokens was set from the map
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="length-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def rewrite(self, body: bytes, header_id: str | None) -> bytes:
        """``body`` with the sample's ``max_tokens`` (as it is when the sample is not in the map)."""
        sid = urllib.parse.unquote(header_id) if header_id else None
        if sid is None or sid not in self.by_id or not body:
            return body
        req: dict[str, Any] = json.loads(body)
        req["max_tokens"] = self.by_id[sid]
        self.rewritten += 1
        return json.dumps(req).encode()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            body = self.rewrite(body, request.headers.get(SAMPLE_ID_HEADER))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        ) as resp:
            data = await resp.read()
            kept = {k: v for k, v in resp.headers.items() if k.lower() == "content-type"}
            return web.Response(body=data, status=resp.status, headers=kept)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> LengthProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()
            self._sock.close()


@contextlib.contextmanager
def proxied(endpoint: Endpoint, max_tokens_by_id: Mapping[str, int] | None) -> Iterator[Endpoint]:
    """``endpoint`` with its requests through a :class:`LengthProxy` (itself when the map is empty)."""
    if not max_tokens_by_id:
        yield endpoint
        return
    with LengthProxy(endpoint.url, max_tokens_by_id) as proxy:
        yield dataclasses.replace(endpoint, url=proxy.url)


def behind_proxy(
    max_tokens_by_id: Mapping[str, int] | None,
) -> Callable[[Endpoint], contextlib.AbstractContextManager[Endpoint]]:
    """``regen.tune.sweep.run_sweep``'s ``endpoint_wrapper``: each candidate's server driven through a
    :class:`LengthProxy` (its supervisor, logs and steady-state reading are the server's own)."""
    return lambda endpoint: proxied(endpoint, max_tokens_by_id)
