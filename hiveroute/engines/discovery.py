"""Engine discovery: where the pool's members come from.

Two sources: the static list of ``--engine`` values, which the pool is built with, and
Kubernetes, where a router component watches engine pods and adds and removes them as they
come and go. Discovery only ever touches the engines it added itself, so static engines and
discovered ones can be mixed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hiveroute.config import RouterConfig

if TYPE_CHECKING:
    from hiveroute.gateway.router import Component


def build_discovery(config: RouterConfig) -> Component | None:
    """The component that keeps the pool's membership current, or None for a static list."""
    if config.discovery == "static":
        return None
    if config.discovery == "kubernetes":
        from hiveroute.extras import require

        require("kubernetes", "k8s")
        from hiveroute.engines.discovery_k8s import KubernetesDiscovery, PodEndpoints

        return KubernetesDiscovery(
            namespace=config.k8s_namespace,
            label_selector=config.k8s_label_selector,
            endpoints=PodEndpoints(
                port=config.k8s_port,
                scheme=config.k8s_scheme,
                events_port=config.k8s_events_port,
                replay_port=config.k8s_replay_port,
            ),
            kubeconfig=config.k8s_kubeconfig,
            context=config.k8s_context,
        )
    raise ValueError(f"unknown discovery {config.discovery!r}")  # validate() prevents this
