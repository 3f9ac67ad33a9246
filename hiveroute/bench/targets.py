"""Systems under test, named ``KIND[:POLICY]`` on the command line:

- ``hiveroute:POLICY`` - hiveroute's router in a subprocess (``hiveroute serve``); ``best``
  names the most capable policy this build has;
- ``hiveroute-inproc:POLICY`` - the same router inside the harness's process;
- ``sglang[:POLICY]`` / ``vllm-router[:POLICY]`` - a peer router, installed on first use;
- ``engine`` - the first engine directly, no router.

Each target runs in front of its own engines (see `compare`), so no target warms another's cache.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hiveroute.bench.engines import Fleet
from hiveroute.bench.peers import PEERS, ensure_peer, peer_argv
from hiveroute.bench.procs import ChildProcess, free_port, wait_http_ok
from hiveroute.errors import ConfigError

# Most capable first: `hiveroute:best` (and the demo) takes the first one this build has.
POLICY_PREFERENCE = ("workflow", "kv", "prefix", "session", "least_load", "round_robin")


def best_policy() -> str:
    from hiveroute.routing.registry import BUILTIN_POLICIES

    return next(p for p in POLICY_PREFERENCE if p in BUILTIN_POLICIES)


TARGET_KINDS = ("hiveroute", "hiveroute-inproc", "sglang", "vllm-router", "engine")


@dataclass(frozen=True)
class TargetSpec:
    kind: str
    policy: str | None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.policy}" if self.policy else self.kind

    @classmethod
    def parse(cls, text: str) -> TargetSpec:
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


@dataclass
class RunningTarget:
    spec: TargetSpec
    url: str
    _child: ChildProcess | None = None
    _inproc: Any = None

    async def stop(self) -> None:
        if self._child is not None:
            await self._child.stop()
        if self._inproc is not None:
            await self._inproc.stop()


async def start_target(
    spec: TargetSpec,
    fleet: Fleet,
    log_dir: Path,
    timeout_s: float = 60.0,
    log_level: str = "warning",
) -> RunningTarget:
    """Start `spec` in front of `fleet` and wait until it answers.

    `log_level` is a `hiveroute serve` target's: at `info` its log (in `log_dir`) has one JSON
    line per request with the engine, policy and reason, which is how a benchmark's decisions
    are read afterwards."""
    log = log_dir / f"target-{spec.label.replace(':', '-')}.log"
    if spec.kind == "engine":
        return RunningTarget(spec, fleet.urls[0])
    if spec.kind == "hiveroute-inproc":
        from hiveroute.config import RouterConfig
        from hiveroute.gateway.server import start_router

        config = RouterConfig(
            host="127.0.0.1",
            port=0,
            engine=list(fleet.specs),
            policy=spec.policy or "",
            policies=user_policies(),
        )
        running = await start_router(config.validate())
        await wait_http_ok(running.url + "/health", None, timeout_s, f"target {spec.label}")
        return RunningTarget(spec, running.url, _inproc=running)
    port = free_port()
    if spec.kind == "hiveroute":
        argv = [sys.executable, "-m", "hiveroute", "serve", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--policy", spec.policy or "", "--log-level", log_level]
        for engine in fleet.specs:
            argv += ["--engine", engine]
        ready = "/health"
    else:
        peer = PEERS[spec.kind]
        python = await ensure_peer(peer, log_dir / f"install-{peer.name}.log")
        argv = peer_argv(peer, python, port, free_port(), fleet.urls, spec.policy or "")
        ready = "/v1/models"
    child = await ChildProcess.start(argv, log, f"target {spec.label}")
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http_ok(url + ready, child, timeout_s, f"target {spec.label}")
    except BaseException:
        await child.stop()
        raise
    return RunningTarget(spec, url, _child=child)


def user_policies() -> dict[str, Any]:
    """Policies the user defined for `hiveroute serve` (HIVEROUTE_POLICIES, or the file named by
    HIVEROUTE_CONFIG): router subprocesses inherit the environment, so targets may name them."""
    from hiveroute.config import RouterConfig, load_config

    config: RouterConfig = load_config({}, cls=RouterConfig)
    return dict(config.policies)
