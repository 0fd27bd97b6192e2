"""A headless Chromium driven over the DevTools protocol (aiohttp websocket): open a page, run
JavaScript in it or in its frames, and collect every console error and uncaught exception.

Chromium comes from the distribution (`apt-get install chromium`); ``find_chromium`` returns None
when it is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop Chromium and its helpers (renderer, crashpad), which keep writing to the profile after
    the browser process itself has gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def remove_profile(profile: Path, attempts: int = 20) -> None:
    """Remove the throwaway profile; a helper that outlived the group kill may still add a file
    while the tree is being removed, so retry briefly instead of failing the test on cleanup."""
    for _ in range(attempts):
        shutil.rmtree(profile, ignore_errors=True)
        if not profile.exists():
            return
        time.sleep(0.1)


class Browser:
    """One headless Chromium with one page; use as ``async with Browser(binary) as page``."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.errors: list[str] = []
        self.contexts: dict[str, int] = {}  # frameId -> default execution context id
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, asyncio.Event] = {}

    async def __aenter__(self) -> Browser:
        self._profile = Path(tempfile.mkdtemp(prefix="regen-chromium-"))
        self._proc = subprocess.Popen(
            [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise RuntimeError(f"{self.binary} did not open its DevTools port")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._reader.cancel()
        await self._ws.close()
        await self._session.close()
        stop_process_group(self._proc)
        remove_profile(self._profile)

    async def _read(self) -> None:
        async for msg in self._ws:
            data = msg.json()
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
                continue
            self._on_event(data.get("method", ""), data.get("params") or {})

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            text = (details.get("exception") or {}).get("description") or details.get("text")
            self.errors.append(f"uncaught exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args") or [])
            self.errors.append(f"console.error: {args}")
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log error: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Runtime.executionContextCreated":
            ctx = params.get("context") or {}
            aux = ctx.get("auxData") or {}
            if aux.get("isDefault") and aux.get("frameId"):
                self.contexts[aux["frameId"]] = ctx["id"]
        if method in self._events:
            self._events[method].set()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send_json({"id": msg_id, "method": method, "params": params})
        reply = await asyncio.wait_for(fut, 60)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result") or {}

    async def open(self, url: str) -> None:
        loaded = self._events.setdefault("Page.loadEventFired", asyncio.Event())
        loaded.clear()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(loaded.wait(), 60)

    async def eval(self, expression: str, context_id: int | None = None) -> Any:
        params: dict[str, Any] = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context_id is not None:
            params["contextId"] = context_id
        result = await self.send("Runtime.evaluate", **params)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return (result.get("result") or {}).get("value")

    async def child_frames(self) -> list[dict[str, Any]]:
        tree = (await self.send("Page.getFrameTree"))["frameTree"]
        return [child["frame"] for child in tree.get("childFrames") or []]
