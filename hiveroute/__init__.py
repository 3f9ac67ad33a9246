"""hiveroute: an agent-aware, KV-cache-aware router for fleets of vLLM-compatible engines."""

__version__ = "0.1.0"
