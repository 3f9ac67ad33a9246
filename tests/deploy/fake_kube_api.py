"""A fake Kubernetes API server for pods: the list and watch protocol, on loopback.

It keeps pods, a resourceVersion counter and a history of changes. A list answers the pods
matching a label selector and the current version; a watch (``watch=1``) answers a chunked
stream of ``{"type", "object"}`` lines from the given version on, or one ``ERROR`` event with
code 410 when that version has been compacted away, as a real API server does. Tests can
drop watch connections, compact history and make the next requests fail.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Pod = dict[str, Any]
_DROP = object()
_GONE = object()


@dataclass
class _Watcher:
    namespace: str
    selector: dict[str, str]
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


def _parse_selector(text: str) -> dict[str, str]:
    selector: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = term.replace("==", "=").partition("=")
        selector[key.strip()] = value.strip()
    return selector


def _matches(pod: Pod, namespace: str, selector: dict[str, str]) -> bool:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    return meta["namespace"] == namespace and all(labels.get(k) == v for k, v in selector.items())


class FakeKubeApi:
    def __init__(self, token: str = "test-token") -> None:
        self.token = token
        self.pods: dict[tuple[str, str], Pod] = {}
        self.version = 100
        self.history: list[tuple[int, str, Pod]] = []
        self.compacted_below = 0
        self.requests: list[dict[str, str]] = []  # query of every pod request, in order
        self.failures: list[int] = []  # statuses to answer the next requests with
        self._watchers: list[_Watcher] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    # server ---------------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, namespace: str = "engines") -> str:
        """A kubeconfig (YAML) that points at this server with a bearer token."""
        return (
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
            f"users:\n- name: fake\n  user:\n    token: {self.token}\n"
            "contexts:\n- name: fake\n  context:\n"
            f"    cluster: fake\n    user: fake\n    namespace: {namespace}\n"
        )

    @property
    def lists(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") is None]

    @property
    def watches(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") is not None]

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append(query)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "no valid bearer token")
        if self.failures:
            code = self.failures.pop(0)
            return _status(code, "Failure", f"injected failure {code}")
        namespace = request.match_info["namespace"]
        selector = _parse_selector(query.get("labelSelector", ""))
        if query.get("watch", "").lower() not in ("1", "true"):
            items = [p for p in self.pods.values() if _matches(p, namespace, selector)]
            start = int(query.get("continue") or 0)
            limit = int(query.get("limit") or 0) or len(items)
            page = items[start : start + limit]
            meta: dict[str, Any] = {"resourceVersion": str(self.version)}
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page}
            return web.json_response(body)
        return await self._watch(request, namespace, selector, query)

    async def _watch(
        self, request: web.Request, namespace: str, selector: dict[str, str], query: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/json"
        response.enable_chunked_encoding()
        await response.prepare(request)
        since = int(query.get("resourceVersion") or self.version)
        if since < self.compacted_below:
            await response.write(_line(_gone_event()))
            await response.write_eof()
            return response
        watcher = _Watcher(namespace, selector)
        for version, kind, pod in self.history:
            if version > since and _matches(pod, namespace, selector):
                watcher.queue.put_nowait((kind, pod))
        self._watchers.append(watcher)
        timeout = float(query.get("timeoutSeconds") or 300)
        try:
            while True:
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), timeout)
                except TimeoutError:
                    break
                if item is _DROP:
                    assert request.transport is not None
                    request.transport.close()  # mid-stream, without the final chunk
                    return response
                if item is _GONE:
                    await response.write(_line(_gone_event()))
                    break
                kind, pod = item
                await response.write(_line({"type": kind, "object": pod}))
            await response.write_eof()
        finally:
            self._watchers.remove(watcher)
        return response

    # changes --------------------------------------------------------------------------------

    def put(
        self,
        name: str,
        *,
        namespace: str = "engines",
        labels: dict[str, str] | None = None,
        phase: str = "Running",
        ready: bool = True,
        ip: str | None = None,
        terminating: bool = False,
        notify: bool = True,
    ) -> Pod:
        """Create or replace a pod (ADDED or MODIFIED); `notify=False` hides it from watches."""
        key = (namespace, name)
        kind = "MODIFIED" if key in self.pods else "ADDED"
        self.version += 1
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        if ip:
            status["podIP"] = ip
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": dict(labels if labels is not None else {"hiveroute.io/role": "engine"}),
            "resourceVersion": str(self.version),
        }
        if terminating:
            metadata["deletionTimestamp"] = "2026-11-29T17:00:00Z"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": status}
        self.pods[key] = pod
        self._record(kind, pod, notify)
        return pod

    def delete(self, name: str, *, namespace: str = "engines", notify: bool = True) -> None:
        pod = self.pods.pop((namespace, name))
        self.version += 1
        pod = {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(self.version)}}
        self._record("DELETED", pod, notify)

    def _record(self, kind: str, pod: Pod, notify: bool) -> None:
        if not notify:
            return
        self.history.append((self.version, kind, pod))
        for watcher in self._watchers:
            if _matches(pod, watcher.namespace, watcher.selector):
                watcher.queue.put_nowait((kind, pod))

    def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(_DROP)

    def expire(self) -> None:
        """Forget all history (as etcd compaction does) and tell open watches 410 Gone."""
        self.history.clear()
        self.compacted_below = self.version
        for watcher in self._watchers:
            watcher.queue.put_nowait(_GONE)


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _gone_event() -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": "too old resource version",
            "reason": "Expired",
            "code": 410,
        },
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)
