"""Systems under test, named ``KIND[:POLICY]`` on the command line:

- ``hiveroute:POLICY`` - hiveroute's router in a subprocess (``hiveroute serve``); ``best``
  names the most capable policy this build has;
- ``hiveroute-inproc:POLICY`` - the same router inside the harness's process;
- ``sglang[:POLICY]`` / ``smg[:POLICY]`` / ``vllm-router[:POLICY]`` - a peer router, installed
  on first use (see `peers`);
- ``engine`` - the first engine directly, no router;
- ``http://HOST:PORT`` - a deployment already running (a router, or an engine): no engines are
  started for it, requests go to that URL, and the model is the first it lists.

Each target runs in front of its own engines (see `compare`), so no target warms another's cache.
A router target may run as several replicas (`replicas`): that many router processes in front
of the same engines, each request sent to the next of them, as a load balancer in front of a
highly available router would. A hiveroute target's replicas keep their state each in memory
(`state="memory"`, the router's default) or share it in a private Redis that the harness starts
for the target (`state="redis"`), as the README's "Several replicas" section deploys them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hiveroute.bench.engines import Fleet
from hiveroute.bench.peers import PEERS, ensure_peer, peer_argv
from hiveroute.bench.procs import ChildProcess, wait_http_ok
from hiveroute.bench.redis_server import RedisServer
from hiveroute.errors import ConfigError
from hiveroute.runtime import free_port

# Most capable first: `hiveroute:best` (and the demo) takes the first one this build has.
POLICY_PREFERENCE = ("workflow", "kv", "prefix", "session", "least_load", "round_robin")


def best_policy() -> str:
    from hiveroute.routing.registry import BUILTIN_POLICIES

    return next(p for p in POLICY_PREFERENCE if p in BUILTIN_POLICIES)


TARGET_KINDS = ("hiveroute", "hiveroute-inproc", "sglang", "smg", "vllm-router", "engine")
URL_KIND = "url"  # a running deployment, given as http(s)://HOST:PORT
ROUTER_STATES = ("memory", "redis")  # where a hiveroute target's replicas keep their state


@dataclass(frozen=True)
class TargetSpec:
    kind: str
    policy: str | None
    url: str | None = None  # URL_KIND only

    @property
    def label(self) -> str:
        if self.url is not None:
            return self.url
        return f"{self.kind}:{self.policy}" if self.policy else self.kind

    @property
    def external(self) -> bool:
        """Already running: the harness starts no engines and no router for it."""
        return self.kind == URL_KIND

    @property
    def file_tag(self) -> str:
        """The label as a part of a file name (its logs, its Redis directory)."""
        return self.label.replace(":", "-")

    @property
    def is_hiveroute(self) -> bool:
        """A hiveroute router the harness starts (its state store is the harness's to choose)."""
        return self.kind.startswith("hiveroute")

    @classmethod
    def parse(cls, text: str) -> TargetSpec:
        if text.strip().startswith(("http://", "https://")):
            return cls.parse_url(text.strip())
        kind, _, policy = text.strip().partition(":")
        if kind not in TARGET_KINDS:
            raise ConfigError(
                f"unknown target {text!r}; use one of {', '.join(TARGET_KINDS)} "
                "(with :POLICY for routers, e.g. hiveroute:kv, sglang:cache_aware)"
            )
        if kind.startswith("hiveroute"):
            from hiveroute.routing.registry import policy_names

            policy = policy or "round_robin"
            if policy == "best":
                policy = best_policy()
            known = policy_names(user_policies())
            if policy not in known:
                raise ConfigError(
                    f"unknown hiveroute policy {policy!r} in target {text!r}; known: "
                    f"{', '.join(known)} (define more in HIVEROUTE_POLICIES or HIVEROUTE_CONFIG)"
                )
            return cls(kind, policy)
        if kind in PEERS:
            peer = PEERS[kind]
            policy = policy or peer.default_policy
            if policy not in peer.policies:
                raise ConfigError(
                    f"{kind} has no policy {policy!r}; choose one of {', '.join(peer.policies)}"
                )
            return cls(kind, policy)
        if policy:
            raise ConfigError(f"target {kind!r} takes no policy (got {text!r})")
        return cls(kind, None)

    @classmethod
    def parse_url(cls, text: str) -> TargetSpec:
        split = urlsplit(text)
        try:
            split.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            split = split._replace(netloc="")
        if not split.hostname or split.path.strip("/") or split.query or split.fragment:
            raise ConfigError(
                f"target {text!r}: give a running deployment as http://HOST:PORT "
                "(no path: requests go to its /v1/...)"
            )
        return cls(URL_KIND, None, url=f"{split.scheme}://{split.netloc}")


MAX_REPLICAS = 16


def check_replicas(replicas: int, name: str = "replicas") -> None:
    """Router processes per target: one at least, and few enough to share one machine's
    cores with the engines. `name` is what the caller calls the count (a CLI flag, say)."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"{name} must be between 1 and {MAX_REPLICAS}, got {replicas}")


def check_router_state(state: str, name: str = "state") -> None:
    if state not in ROUTER_STATES:
        raise ConfigError(f"{name} must be one of {', '.join(ROUTER_STATES)}, got {state!r}")


@dataclass
class RunningTarget:
    """A started target: the URLs to send requests to (one per router replica)."""

    spec: TargetSpec
    urls: list[str]
    _children: list[ChildProcess] = field(default_factory=list)
    _inproc: list[Any] = field(default_factory=list)
    _redis: RedisServer | None = None  # the replicas' shared state, stopped after them

    @property
    def url(self) -> str:
        return self.urls[0]

    def cpu_seconds(self) -> float | None:
        """CPU the router processes the harness started have used so far, every replica and
        worker: None for a target that has none (an in-process router, a running deployment,
        the engine) or where it cannot be read. A replicas' Redis is not the router's."""
        if not self._children:
            return None
        used = [child.cpu_seconds() for child in self._children]
        return None if None in used else sum(u for u in used if u is not None)

    async def stop(self) -> None:
        for child in self._children:
            await child.stop()
        for running in self._inproc:
            await running.stop()
        if self._redis is not None:
            self._redis.stop()


async def start_target(
    spec: TargetSpec,
    fleet: Fleet,
    log_dir: Path,
    timeout_s: float = 60.0,
    log_level: str = "warning",
    replicas: int = 1,
    state: str = "memory",
) -> RunningTarget:
    """Start `spec` in front of `fleet` (as `replicas` router processes) and wait until every
    one answers.

    `log_level` is a `hiveroute serve` target's: at `info` its log (in `log_dir`) has one JSON
    line per request with the engine, policy and reason, which is how a benchmark's decisions
    are read afterwards. `state` is a hiveroute target's state store (ROUTER_STATES); peers
    have none. The `engine` target has no router, so no replicas either."""
    check_replicas(replicas)
    check_router_state(state)
    if spec.url is not None:  # running already: check it answers
        await wait_http_ok(
            spec.url + "/v1/models", None, min(timeout_s, 5.0), f"target {spec.label}"
        )
        return RunningTarget(spec, [spec.url])
    if spec.kind == "engine":
        return RunningTarget(spec, [fleet.urls[0]])
    target = RunningTarget(spec, [])
    try:
        store = "memory"
        if state == "redis" and spec.is_hiveroute:
            redis_dir = log_dir / f"redis-{spec.file_tag}"
            redis_dir.mkdir(parents=True, exist_ok=True)
            target._redis = RedisServer(workdir=redis_dir)
            target._redis.start()  # blocks for the few ms redis-server takes to answer
            store = target._redis.url
        for i in range(replicas):
            suffix = "" if i == 0 else f"-replica{i + 1}"
            log = log_dir / f"target-{spec.file_tag}{suffix}.log"
            await _start_replica(spec, fleet, log, timeout_s, log_level, target, store)
    except BaseException:
        await target.stop()
        raise
    return target


async def _start_replica(
    spec: TargetSpec,
    fleet: Fleet,
    log: Path,
    timeout_s: float,
    log_level: str,
    target: RunningTarget,
    store: str,
) -> None:
    """Start one router for `spec` and add it (its URL and its process) to `target`; a
    hiveroute router keeps its state in `store` ("memory" or a Redis URL)."""
    if spec.kind == "hiveroute-inproc":
        from hiveroute.config import RouterConfig
        from hiveroute.server import start_router

        config = RouterConfig(
            host="127.0.0.1",
            port=0,
            engine=list(fleet.specs),
            policy=spec.policy or "",
            policies=user_policies(),
            state=store,
        )
        running = await start_router(config.validate())
        target._inproc.append(running)
        await wait_http_ok(running.url + "/health", None, timeout_s, f"target {spec.label}")
        target.urls.append(running.url)
        return
    port = free_port()
    if spec.kind == "hiveroute":
        argv = [sys.executable, "-m", "hiveroute", "serve", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--policy", spec.policy or "", "--log-level", log_level]
        if store != "memory":  # else what HIVEROUTE_CONFIG says, if anything
            argv += ["--state", store]
        for engine in fleet.specs:
            argv += ["--engine", engine]
        ready = "/health"
    else:
        peer = PEERS[spec.kind]
        python = await ensure_peer(peer, log.parent / f"install-{peer.name}.log")
        argv = peer_argv(peer, python, port, free_port(), fleet.urls, spec.policy or "")
        ready = "/v1/models"
    child = await ChildProcess.start(argv, log, f"target {spec.label}")
    target._children.append(child)
    url = f"http://127.0.0.1:{port}"
    await wait_http_ok(url + ready, child, timeout_s, f"target {spec.label}")
    target.urls.append(url)


def user_policies() -> dict[str, Any]:
    """Policies the user defined for `hiveroute serve` (HIVEROUTE_POLICIES, or the file named by
    HIVEROUTE_CONFIG): router subprocesses inherit the environment, so targets may name them."""
    from hiveroute.config import RouterConfig, load_config

    config: RouterConfig = load_config({}, cls=RouterConfig)
    return dict(config.policies)
