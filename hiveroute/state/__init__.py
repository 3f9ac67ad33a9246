"""Shared state: what router replicas must agree on, behind one small async interface."""

from hiveroute.state.memory import MemoryStateStore
from hiveroute.state.store import StateStore, open_state_store

__all__ = ["MemoryStateStore", "StateStore", "open_state_store"]
