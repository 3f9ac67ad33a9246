"""Kubernetes discovery: engine pods found by namespace and label selector, kept current.

The official client is synchronous, so the list-then-watch loop runs in one thread and hands
every change to the event loop, where the pool is changed. The loop follows the API's
protocol: list (which gives a resourceVersion), watch from that version, watch again from the
last version seen when a watch ends or its connection drops, list again when the server says
the version is gone (410), and back off on errors. A pod is an engine while it is Running and
Ready with an IP and not being deleted; its URL and KV-event endpoints come from that IP and
the port settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hiveroute.engines.engine import EngineSpec
from hiveroute.errors import ConfigError

if TYPE_CHECKING:
    from hiveroute.engines.pool import EnginePool

log = logging.getLogger("hiveroute.discovery")

Pod = dict[str, Any]
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class PodEndpoints:
    """How a pod's IP becomes an engine: HTTP port and scheme, KV-event and replay ports."""

    port: int = 8000
    scheme: str = "http"
    events_port: int = 5557
    replay_port: int = 0

    def spec_for(self, ip: str) -> EngineSpec:
        host = f"[{ip}]" if ":" in ip else ip
        return EngineSpec(
            url=f"{self.scheme}://{host}:{self.port}",
            events=f"tcp://{host}:{self.events_port}" if self.events_port else None,
            replay=f"tcp://{host}:{self.replay_port}" if self.replay_port else None,
        )


def pod_key(pod: Pod) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def serving_ip(pod: Pod) -> str | None:
    """The pod's IP if it can take requests now (Running, Ready, not terminating), else None."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    ip = status.get("podIP")
    return ip if ready and isinstance(ip, str) and ip else None


class _Gone(Exception):
    """The resourceVersion we watch from is too old: list again."""


class Backoff:
    """Exponential backoff with jitter, so a fleet of replicas does not retry in step."""

    def __init__(self, initial_s: float = 0.5, maximum_s: float = 30.0) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self._next = initial_s

    def reset(self) -> None:
        self._next = self.initial_s

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum_s, self._next * 2)
        return delay * random.uniform(0.5, 1.0)


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Split a chunked watch stream into its JSON lines, however the chunks fall."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


class PodWatcher:
    """The synchronous list-then-watch loop; runs in its own thread until `stop()`.

    `on_snapshot` receives every matching pod after each (re-)list; `on_event` each change.
    """

    def __init__(
        self,
        api: Any,
        namespace: str,
        label_selector: str,
        *,
        on_snapshot: Callable[[list[Pod]], None],
        on_event: Callable[[str, Pod], None],
        watch_timeout_s: int = 300,
        connect_timeout_s: float = 5.0,
        backoff: Backoff | None = None,
        page_size: int = 500,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_snapshot = on_snapshot
        self.on_event = on_event
        self.watch_timeout_s = watch_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.backoff = backoff or Backoff()
        self.page_size = page_size
        self.last_error: str | None = None
        self.lists = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None
        self._events_seen = 0
        self.version: str | None = None  # the last resourceVersion seen; None: list again

    def stop(self) -> None:
        """Ask the loop to end and break off the request it is blocked in."""
        self._stop.set()
        with self._lock:
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def run(self) -> None:
        self.version = None
        while not self._stop.is_set():
            started, events = time.monotonic(), self._events_seen
            try:
                if self.version is None:
                    self.version = self._list()
                    self.backoff.reset()
                started, events = time.monotonic(), self._events_seen
                self._watch()
                if self._worked(started, events):
                    self.backoff.reset()  # a later failure waits from the start
                else:
                    self._stop.wait(self.backoff.next())  # a watch that ends at once: slow down
            except _Gone:
                log.info("pod watch: resourceVersion %s is gone; listing again", self.version)
                self.version = None
                self._stop.wait(self.backoff.next())  # bounded, should the server insist
            except Exception as exc:
                if self._stop.is_set():
                    break
                if _status(exc) == 410:
                    self.version = None
                self.last_error = _describe(exc)
                if self._worked(started, events):
                    self.backoff.reset()  # a watch that worked, then dropped: not a failing run
                delay = self.backoff.next()
                log.warning("pod discovery: %s; retrying in %.1fs", self.last_error, delay)
                self._stop.wait(delay)

    def _worked(self, started: float, events: int) -> bool:
        """Whether the watch begun at `started` (with `events` seen before) worked: it
        delivered an event, or stayed open a second."""
        return self._events_seen > events or time.monotonic() - started >= 1.0

    def _request(self, **kwargs: Any) -> Any:
        read_timeout = self.watch_timeout_s + 30 if kwargs.get("watch") else 30
        response = self.api.list_namespaced_pod(
            self.namespace,
            label_selector=self.label_selector,
            _preload_content=False,
            _request_timeout=(self.connect_timeout_s, read_timeout),
            **kwargs,
        )
        with self._lock:
            self._response = response
        if self._stop.is_set():
            response.shutdown()
        return response

    def _done(self, response: Any) -> None:
        with self._lock:
            self._response = None
        with contextlib.suppress(Exception):
            response.release_conn()

    def _list(self) -> str:
        pods: list[Pod] = []
        token: str | None = None
        for _page in range(10_000):
            kwargs: dict[str, Any] = {"limit": self.page_size}
            if token:
                kwargs["_continue"] = token
            response = self._request(**kwargs)
            try:
                payload = json.loads(response.data)
            finally:
                self._done(response)
            pods.extend(payload.get("items") or [])
            meta = payload.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        version = str(meta.get("resourceVersion") or "")
        self.lists += 1
        self.last_error = None
        self.on_snapshot(pods)
        return version

    def _watch(self) -> None:
        """Watch from `self.version`, advancing it with every event (so a drop resumes there)."""
        response = self._request(
            watch=True,
            resource_version=self.version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
        )
        try:
            for line in _lines(response.stream(65536, decode_content=True)):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                self.version = (obj.get("metadata") or {}).get("resourceVersion") or self.version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._events_seen += 1
                    self.on_event(kind, obj)
        finally:
            self._done(response)


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _describe(exc: Exception) -> str:
    status = _status(exc)
    if status in (401, 403):
        return (
            f"the API server refused to list pods ({status} {getattr(exc, 'reason', '')}); "
            "the router's service account needs get/list/watch on pods"
        )
    if status is not None:
        return f"the API server answered {status} {getattr(exc, 'reason', '')}".rstrip()
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def load_api(kubeconfig: str = "", context: str = "") -> tuple[Any, str]:
    """A CoreV1Api and the namespace the credentials point at.

    With a kubeconfig file, that file; else inside a cluster, the pod's service account; else
    the user's default kubeconfig.
    """
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    namespace = "default"
    try:
        if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)
            with contextlib.suppress(OSError):
                namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or namespace
        else:
            path = kubeconfig or None
            kube_config.load_kube_config(
                config_file=path, context=context or None, client_configuration=configuration
            )
            contexts, active = kube_config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c.get("name") == context), active)
            namespace = ((chosen or {}).get("context") or {}).get("namespace") or namespace
    except (kube_config.ConfigException, OSError) as exc:
        where = kubeconfig or "in-cluster service account / ~/.kube/config"
        raise ConfigError(
            f"kubernetes discovery: cannot load credentials from {where}: {exc}; "
            "set --k8s-kubeconfig or run inside a cluster"
        ) from None
    return client.CoreV1Api(client.ApiClient(configuration)), namespace


class KubernetesDiscovery:
    """A router component that keeps the pool equal to the serving engine pods."""

    def __init__(
        self,
        pool: EnginePool,
        *,
        namespace: str = "",
        label_selector: str,
        endpoints: PodEndpoints | None = None,
        kubeconfig: str = "",
        context: str = "",
        api: Any = None,
        initial_sync_timeout_s: float = 10.0,
        watch_timeout_s: int = 300,
        backoff: Backoff | None = None,
        page_size: int = 500,
    ) -> None:
        self.namespace = namespace
        self.label_selector = label_selector
        self.endpoints = endpoints or PodEndpoints()
        self.kubeconfig = kubeconfig
        self.context = context
        self.initial_sync_timeout_s = initial_sync_timeout_s
        self.watch_timeout_s = watch_timeout_s
        self._api = api
        self._backoff = backoff
        self.page_size = page_size
        self._owned: dict[str, EngineSpec] = {}  # pod key -> the engine we added for it
        self._pool = pool
        self._loop: asyncio.AbstractEventLoop | None = None
        self._synced = asyncio.Event()
        self.watcher: PodWatcher | None = None
        self._thread: threading.Thread | None = None

    @property
    def engines(self) -> dict[str, str]:
        """Pod key -> engine URL, for the pods currently in the pool."""
        return {key: spec.url for key, spec in self._owned.items()}

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._api is None:
            self._api, default_namespace = await asyncio.to_thread(
                load_api, self.kubeconfig, self.context
            )
            self.namespace = self.namespace or default_namespace
        self.namespace = self.namespace or "default"
        self.watcher = PodWatcher(
            self._api,
            self.namespace,
            self.label_selector,
            on_snapshot=lambda pods: self._post(self._apply_snapshot, pods),
            on_event=lambda kind, pod: self._post(self._apply_event, kind, pod),
            watch_timeout_s=self.watch_timeout_s,
            backoff=self._backoff,
            page_size=self.page_size,
        )
        self._thread = threading.Thread(
            target=self.watcher.run, name="k8s-pod-discovery", daemon=True
        )
        self._thread.start()
        log.info(
            "discovering engines: pods in namespace %s with labels %s",
            self.namespace,
            self.label_selector,
        )
        try:
            await asyncio.wait_for(self._synced.wait(), self.initial_sync_timeout_s)
        except TimeoutError:
            log.warning(
                "no pod list from the Kubernetes API after %.0fs; starting without discovered "
                "engines and retrying in the background (%s)",
                self.initial_sync_timeout_s,
                self.watcher.last_error or "no answer yet",
            )

    async def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
            if self._thread.is_alive():
                log.warning("pod discovery thread did not end within 10s")
            self._thread = None

    # applying changes (on the event loop) ---------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed while the thread was ending
            self._loop.call_soon_threadsafe(fn, *args)

    def _apply_snapshot(self, pods: list[Pod]) -> None:
        present = {pod_key(p) for p in pods}
        for key in [k for k in self._owned if k not in present]:
            self._set(key, None)
        for pod in pods:
            self._apply_event("ADDED", pod)
        self._synced.set()

    def _apply_event(self, kind: str, pod: Pod) -> None:
        ip = None if kind == "DELETED" else serving_ip(pod)
        self._set(pod_key(pod), self.endpoints.spec_for(ip) if ip else None)

    def _set(self, key: str, spec: EngineSpec | None) -> None:
        old = self._owned.get(key)
        if old == spec:
            return
        if old is not None:
            del self._owned[key]
            if not any(s.name == old.name for s in self._owned.values()):
                self._pool.remove(old.name)
            log.info("engine pod %s left: %s", key, old.url)
        if spec is not None:
            ours = any(s.name == spec.name for s in self._owned.values())
            if not ours and self._pool.get(spec.name) is not None:
                # an engine given with --engine at this address: it stays as it was given (a
                # pod's spec replacing it, its removal would then have removed it too)
                log.warning(
                    "engine pod %s is at %s, an engine given statically; left as given",
                    key,
                    spec.url,
                )
                return
            self._owned[key] = spec
            self._pool.add(spec)
            log.info("engine pod %s joined: %s", key, spec.url)
