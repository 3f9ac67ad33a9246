"""The engine pool: which engines exist, which are healthy, and how loaded each is."""

from hiveroute.engines.engine import Engine, EngineLoad, EngineSpec
from hiveroute.engines.pool import EnginePool

__all__ = ["Engine", "EngineLoad", "EnginePool", "EngineSpec"]
