"""Optional dependencies: each lives in a pip extra, imported only by the feature that needs it.

The core install (`pip install hiveroute`) runs the router, the simulator and `demo`; Redis state,
Kubernetes discovery, OpenTelemetry traces, the MCP server, bench plots and the client
integrations each need their extra. `require` imports a module of one, or says which extra to
install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hiveroute.errors import ConfigError

# what each extra is for (pyproject.toml's [project.optional-dependencies] names them)
EXTRAS = {
    "redis": "shared state in Redis (state: redis://...)",
    "k8s": "Kubernetes discovery (discovery: kubernetes)",
    "otel": "OpenTelemetry traces (otlp_endpoint)",
    "mcp": "the MCP server (hiveroute mcp)",
    "bench": "benchmark plots (PNG files beside each report)",
    "openai": "hiveroute.client, the OpenAI-client helper",
    "beeai": "hiveroute.integrations.beeai, the BeeAI framework hook",
}


class MissingExtra(ConfigError):
    """An optional package is not installed; the message names the extra that brings it."""


def install_hint(extra: str) -> str:
    return f"pip install 'hiveroute[{extra}]'"


def require(module: str, extra: str) -> ModuleType:
    """Import `module` (from the optional `extra`), or raise MissingExtra saying what to run."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{EXTRAS[extra]} needs the '{extra}' extra: {install_hint(extra)} "
            f"(import of {module} failed: {exc})"
        ) from None
