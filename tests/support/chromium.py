"""Drive a real headless Chromium over the Chrome DevTools Protocol, from asyncio.

Just enough CDP for tests: open a page, evaluate JavaScript, take a screenshot. Chromium picks
its own debugging port (port 0) and writes it to DevToolsActivePort in its profile directory.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-port=0",
    "--remote-debugging-address=127.0.0.1",
)


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no chromium on PATH: scripts/test installs Debian's chromium")


class CdpError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium process with one page, controlled over its websocket."""

    def __init__(self, window: tuple[int, int] = (1280, 900)) -> None:
        self.window = window
        self._profile = Path(tempfile.mkdtemp(prefix="hiveroute-chromium-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Chromium:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout_s: float = 20.0) -> None:
        width, height = self.window
        self._process = subprocess.Popen(
            [
                chromium_binary(),
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its debugging port in time")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Runtime.enable")

    async def stop(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                await asyncio.to_thread(self._process.wait, 10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                await asyncio.to_thread(self._process.wait, 10)
        shutil.rmtree(self._profile, ignore_errors=True)

    async def send(self, method: str, timeout_s: float = 15.0, **params: Any) -> dict[str, Any]:
        """One CDP command; events that arrive meanwhile are dropped (tests poll instead)."""
        assert self._ws is not None, "Chromium.start() first"
        call_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer to {method}")
            message = await self._ws.receive(timeout=remaining)
            if message.type != aiohttp.WSMsgType.TEXT:
                raise CdpError(f"devtools connection closed during {method}")
            data = json.loads(message.data)
            if data.get("id") == call_id:
                if "error" in data:
                    raise CdpError(f"{method}: {data['error']}")
                result: dict[str, Any] = data.get("result", {})
                return result

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (promises are awaited)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise CdpError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 15.0) -> Any:
        """Poll until `expression` is truthy; return its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied: {expression}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        """A PNG of the whole page (not just the viewport)."""
        metrics = await self.send("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        result = await self.send(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))
