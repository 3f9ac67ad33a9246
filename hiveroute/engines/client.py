"""EngineClient: the one owner of HTTP from the router to its engines.

Every call the router makes to an engine goes through here: the proxied completion, the health
round (`/health`, `/v1/models`, `/metrics`), keep-warm touches, retention hints and pre-warm. So
the engine's API key, the timeouts and the headers every call carries live in one place; an engine
started with `--api-key` sees the key on all of them, not only on proxied requests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from hiveroute.engines.engine import Engine

RETRY_STATUSES = frozenset({502, 503, 504})


class EngineUnreachable(Exception):
    """The engine could not be reached or sent nothing back: safe to try another engine.

    `slow`: it was reached but did not answer in time (overloaded or hung, not refused).
    """

    def __init__(self, message: str, *, slow: bool = False) -> None:
        super().__init__(message)
        self.slow = slow


@dataclass
class UpstreamAnswer:
    """An engine's response whose headers (and, for streams, first chunk) have arrived."""

    engine: Engine
    response: aiohttp.ClientResponse
    first_chunk: bytes = b""
    first_chunk_at: float | None = None

    @property
    def is_stream(self) -> bool:
        return self.response.content_type == "text/event-stream"


@dataclass
class EngineTimeouts:
    connect_s: float = 5.0
    first_byte_s: float = 60.0
    request_s: float = 600.0
    health_s: float = 2.0
    background_s: float = 30.0  # keep-warm, retention hints, pre-warm


class EngineClient:
    """HTTP to engines, with their auth and timeouts. `start()` opens the connection pool."""

    def __init__(
        self, *, api_key: str | None = None, timeouts: EngineTimeouts | None = None
    ) -> None:
        self.api_key = api_key or None
        self.timeouts = timeouts or EngineTimeouts()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
            # no cookie jar: the session serves every client, so a cookie an engine (or a
            # sticky-session proxy in front of it) set for one client's request must not ride
            # on the next client's; the client's own Set-Cookie still reaches it unchanged
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("EngineClient.start() has not run")
        return self._session

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """`extra` plus the engine's key: what every request to an engine carries."""
        headers = dict(extra or {})
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    # --- the proxied request -------------------------------------------------------------------

    async def send(
        self,
        engine: Engine,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        *,
        stream: bool,
        method: str = "POST",
    ) -> UpstreamAnswer:
        """POST (or `method`) to the engine; raise EngineUnreachable if it cannot be reached or
        stays silent.

        For a stream, returns once the first chunk arrived (a stream's first chunk is its first
        token), so a silent engine is found within the first-byte timeout and retried elsewhere.
        """
        t = self.timeouts
        timeout = aiohttp.ClientTimeout(total=t.request_s, sock_connect=t.connect_s)
        try:
            # asyncio.timeout, not wait_for: no task of its own for each request
            async with asyncio.timeout(t.first_byte_s if stream else t.request_s):
                response = await self.session.request(
                    method,
                    f"{engine.url}{path}",
                    data=payload if method != "GET" else None,
                    headers=self.headers(headers),
                    timeout=timeout,
                )
        except aiohttp.ConnectionTimeoutError:  # (a TimeoutError too) no answer to connecting
            raise EngineUnreachable(f"{engine.name}: connecting timed out") from None
        except TimeoutError:
            raise EngineUnreachable(f"no response from {engine.name} in time", slow=True) from None
        except aiohttp.ClientError as exc:
            raise EngineUnreachable(f"{engine.name}: {type(exc).__name__}: {exc}") from None
        if response.status in RETRY_STATUSES:
            try:  # the start of its reason, if it comes at once: the request goes elsewhere
                async with asyncio.timeout(t.first_byte_s):
                    detail = (await response.content.read(200)).decode(errors="replace")
            except (TimeoutError, aiohttp.ClientError):
                detail = "(no reason given)"
            finally:
                response.close()
            raise EngineUnreachable(f"{engine.name} answered {response.status}: {detail}")
        answer = UpstreamAnswer(engine=engine, response=response)
        if answer.is_stream:
            try:
                async with asyncio.timeout(t.first_byte_s):
                    answer.first_chunk = await response.content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                response.close()
                raise EngineUnreachable(
                    f"{engine.name} sent no first byte ({type(exc).__name__})",
                    slow=isinstance(exc, TimeoutError),
                ) from None
            if not answer.first_chunk:
                response.close()
                raise EngineUnreachable(f"{engine.name} closed the stream before its first byte")
            answer.first_chunk_at = time.perf_counter()
        return answer

    # --- health round --------------------------------------------------------------------------

    async def _get(self, engine: Engine, path: str) -> tuple[int, bytes]:
        # connecting has its own bound, half the check's: the kernel completes a connection
        # even to an overloaded engine, so one that takes that long finds no host (gone), and
        # raises aiohttp.ConnectionTimeoutError, not the plain timeout of one answering late
        t = self.timeouts
        timeout = aiohttp.ClientTimeout(
            total=t.health_s, sock_connect=min(t.connect_s, t.health_s / 2)
        )
        async with self.session.get(
            f"{engine.url}{path}", headers=self.headers(), timeout=timeout
        ) as resp:
            return resp.status, await resp.read()

    async def check_health(self, engine: Engine) -> None:
        """Raise RuntimeError unless the engine's /health answers 200."""
        status, _ = await self._get(engine, "/health")
        if status != 200:
            raise RuntimeError(f"/health answered {status}")

    async def list_models(self, engine: Engine) -> set[str] | None:
        """The ids /v1/models lists, or None if it did not answer 200 (a 401: a wrong key)."""
        status, data = await self._get(engine, "/v1/models")
        if status != 200:
            return None
        payload = json.loads(data)
        entries = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(entries, list):
            raise ValueError("/v1/models answered without a 'data' list")
        return {m["id"] for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str)}

    async def scrape_metrics(self, engine: Engine) -> str | None:
        status, data = await self._get(engine, "/metrics")
        return data.decode(errors="replace") if status == 200 else None

    # --- background requests (keep-warm, retention hints, pre-warm) ----------------------------

    async def post_json(self, engine: Engine, path: str, body: Any) -> tuple[int, Any]:
        """POST a JSON body; (status, the JSON answer or None). Raises aiohttp.ClientError or
        TimeoutError when the engine cannot be reached."""
        timeout = aiohttp.ClientTimeout(total=self.timeouts.background_s)
        async with self.session.post(
            engine.url + path,
            json=body,
            headers=self.headers({"Accept-Encoding": "identity"}),
            timeout=timeout,
        ) as resp:
            data = await resp.read()
            try:
                answer = json.loads(data) if data else None
            except ValueError:
                answer = None
            return resp.status, answer
