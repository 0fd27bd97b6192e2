"""Per-sample ``max_tokens`` for benchmarks, outside regen: a reverse proxy between regen's client and the
server that rewrites each chat request's ``max_tokens`` from the sample it is for (regen's
``X-Regen-Sample-Id`` header). With ``ignore_eos`` on dummy weights that gives an output-length spread (the
live sweep ``bench.gpu.tune_live``, ``tests/tune/test_sweep.py``) while a run's configs, and regen's client,
give every request ``sampling.max_tokens``. Samples not in the map keep what regen sent.

- :class:`LengthProxy`: the proxy, in a process of its own (not to share the GIL with regen's client).
- :func:`proxied`: an :class:`~regen.types.Endpoint` whose requests go through one.
- :func:`behind_proxy`: ``regen.tune.sweep.run_sweep``'s ``endpoint_wrapper`` that puts every candidate's
  server behind one (the sweep starts its servers itself; its pilot drives the endpoint this yields).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import socket
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
    """A reverse proxy to ``upstream`` (``http://host:port``) on a free local port (:attr:`url`), served by
    a process of its own: on a thread of the caller's it would share the GIL with regen's client and pace
    the requests it is meant only to pass on (measurements/race-2026-12-07c-h200-n4, its admission)."""

    def __init__(self, upstream: str, max_tokens_by_id: Mapping[str, int]) -> None:
        self.upstream = upstream.rstrip("/")
        self.by_id = {str(k): int(v) for k, v in max_tokens_by_id.items()}
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        ctx = multiprocessing.get_context("spawn")
        self._rewritten = ctx.Value("q", 0)
        self._ready = ctx.Event()
        self._proc = ctx.Process(
            target=_serve,
            args=(self._sock, self.upstream, self.by_id, self._rewritten, self._ready),
            name="length-proxy",
            daemon=True,
        )

    @property
    def rewritten(self) -> int:
        """Chat requests whose ``max_tokens`` was set from the map."""
        return int(self._rewritten.value)

    def rewrite(self, body: bytes, header_id: str | None) -> bytes:
        """``body`` with the sample's ``max_tokens`` (as it is when the sample is not in the map)."""
        return counted_rewrite(body, header_id, self.by_id, self._rewritten)

    def __enter__(self) -> LengthProxy:
        self._proc.start()
        if not self._ready.wait(timeout=60):
            self._proc.kill()
            raise RuntimeError(f"the length proxy did not start listening on {self.url} within 60 s")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._proc.terminate()
            self._proc.join(timeout=30)
        finally:
            self._sock.close()


def rewrite_max_tokens(body: bytes, header_id: str | None, by_id: Mapping[str, int]) -> bytes:
    """``body`` with ``max_tokens`` of the sample the header names; ``body`` itself when it is not listed."""
    sid = urllib.parse.unquote(header_id) if header_id else None
    if sid is None or sid not in by_id or not body:
        return body
    req: dict[str, Any] = json.loads(body)
    req["max_tokens"] = by_id[sid]
    return json.dumps(req).encode()


def counted_rewrite(body: bytes, header_id: str | None, by_id: Mapping[str, int], rewritten: Any) -> bytes:
    """:func:`rewrite_max_tokens`, counting a rewritten body in the shared ``rewritten`` value."""
    out = rewrite_max_tokens(body, header_id, by_id)
    if out is not body:
        with rewritten.get_lock():
            rewritten.value += 1
    return out


def _serve(sock: socket.socket, upstream: str, by_id: Mapping[str, int], rewritten: Any, ready: Any) -> None:
    """The proxy process: serve ``sock`` until terminated, counting rewritten requests in ``rewritten``."""

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            body = counted_rewrite(body, request.headers.get(SAMPLE_ID_HEADER), by_id, rewritten)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with session.request(
            request.method, upstream + request.path_qs, data=body or None, headers=headers
        ) as resp:
            data = await resp.read()
            kept = {k: v for k, v in resp.headers.items() if k.lower() == "content-type"}
            return web.Response(body=data, status=resp.status, headers=kept)

    async def main() -> None:
        nonlocal session
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        ready.set()
        await asyncio.Event().wait()  # until the parent terminates this process

    session: aiohttp.ClientSession
    asyncio.run(main())


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
