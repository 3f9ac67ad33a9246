"""A small async client for the router's HTTP API: completions, shared contexts, workflows.

The MCP server and the tests use it; the contract it speaks is WORKFLOW_API (POST/GET
/v1/contexts, GET /v1/workflows/{id}) plus the OpenAI endpoints. Every failure is a
RouterAPIError whose message says what the router answered, or that it could not be reached.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp


class RouterAPIError(Exception):
    """The router refused a call (status set) or could not be reached (status None)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class RouterAnswer:
    """A JSON answer and the response headers worth keeping (request id, engine)."""

    body: dict[str, Any]
    request_id: str | None
    engine: str | None


def _error_message(status: int, text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        message = data["error"].get("message")
        if message:
            return f"router answered {status}: {message}"
    snippet = text.strip()[:200] or "(empty body)"
    return f"router answered {status}: {snippet}"


class RouterClient:
    """Calls one router. The aiohttp session is opened on first use; close() releases it."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        base_url = base_url.rstrip("/")
        if base_url.endswith("/v1"):
            base_url = base_url[: -len("/v1")]
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"router URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url
        self.api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> RouterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> RouterAnswer:
        """One JSON call; raises RouterAPIError unless the router answers 2xx with JSON."""
        send_headers = {"Accept": "application/json", **(headers or {})}
        if self.api_key and "Authorization" not in send_headers:
            send_headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url + path
        try:
            async with self._http().request(
                method, url, json=body, headers=send_headers, params=params
            ) as response:
                text = await response.text()
                if response.status >= 400:
                    raise RouterAPIError(
                        _error_message(response.status, text), status=response.status
                    )
                try:
                    data = json.loads(text) if text else {}
                except ValueError:
                    raise RouterAPIError(
                        f"router answered {response.status} with a body that is not JSON",
                        status=response.status,
                    ) from None
                return RouterAnswer(
                    body=data if isinstance(data, dict) else {"data": data},
                    request_id=response.headers.get("X-Request-Id"),
                    engine=response.headers.get("X-Hiveroute-Engine"),
                )
        except aiohttp.ClientError as exc:
            raise RouterAPIError(
                f"cannot reach the router at {self.base_url} ({type(exc).__name__}: {exc}); "
                "is `hiveroute serve` running there?"
            ) from None
        except TimeoutError:
            raise RouterAPIError(f"the router at {self.base_url} did not answer in time") from None

    async def chat(
        self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> RouterAnswer:
        return await self.request("POST", "/v1/chat/completions", body=body, headers=headers)

    async def completion(
        self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> RouterAnswer:
        return await self.request("POST", "/v1/completions", body=body, headers=headers)

    async def models(self) -> list[str]:
        answer = await self.request("GET", "/v1/models")
        return [m["id"] for m in answer.body.get("data", []) if isinstance(m, dict) and "id" in m]

    async def create_context(
        self,
        text: str,
        *,
        context_id: str | None = None,
        workflow_id: str | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"text": text}
        for key, value in (("id", context_id), ("workflow_id", workflow_id), ("name", name)):
            if value is not None:
                body[key] = value
        return (await self.request("POST", "/v1/contexts", body=body)).body

    async def get_context(self, context_id: str) -> dict[str, Any]:
        return (await self.request("GET", f"/v1/contexts/{quote(context_id, safe='')}")).body

    async def list_contexts(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        params = {"workflow_id": workflow_id} if workflow_id else None
        answer = await self.request("GET", "/v1/contexts", params=params)
        return [c for c in answer.body.get("data", []) if isinstance(c, dict)]

    async def create_workflow(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return (await self.request("POST", "/v1/workflows", body=body)).body

    async def get_workflow(self, workflow_id: str) -> dict[str, Any]:
        return (await self.request("GET", f"/v1/workflows/{quote(workflow_id, safe='')}")).body
