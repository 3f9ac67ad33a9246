"""Fault knobs: what a test or demo can make an engine do wrong, changeable while it runs."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from hiveroute.errors import BadRequest, ConfigError

FAULT_FIELDS = (
    "fail_fraction",
    "fail_status",
    "stall_first_token_s",
    "drop_fraction",
    "drop_after_tokens",
)


@dataclass
class FaultKnobs:
    """Mutable per engine. Fractions are drawn from a seeded generator, so runs repeat.

    - fail_fraction: this share of requests is answered with `fail_status` (an OpenAI error).
    - stall_first_token_s: every request waits this long before it may be scheduled.
    - drop_fraction: this share of streamed responses has its connection cut after
      `drop_after_tokens` tokens (no [DONE], no final chunk).
    Restarting the KV-event publisher is an action, not a knob: `SimEngine.restart_events()`.
    """

    fail_fraction: float = 0.0
    fail_status: int = 500
    stall_first_token_s: float = 0.0
    drop_fraction: float = 0.0
    drop_after_tokens: int = 1
    seed: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)

    def validate(self) -> None:
        for name in ("fail_fraction", "drop_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"fault {name} must be between 0 and 1, got {value}")
        if not 400 <= self.fail_status <= 599:
            raise ConfigError(
                f"fault fail_status must be an HTTP error 400..599, got {self.fail_status}"
            )
        if self.stall_first_token_s < 0 or self.drop_after_tokens < 0:
            raise ConfigError("fault stall_first_token_s and drop_after_tokens must be >= 0")

    def should_fail(self) -> bool:
        return self.fail_fraction > 0 and self._rng.random() < self.fail_fraction

    def should_drop(self) -> bool:
        return self.drop_fraction > 0 and self._rng.random() < self.drop_fraction

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_rng", None)
        return data

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a JSON object of knob values; unknown keys and bad values raise BadRequest."""
        known = {f.name: f for f in fields(self) if not f.name.startswith("_")}
        staged = self.to_json()
        for key, value in changes.items():
            if key not in known:
                raise BadRequest(
                    f"unknown fault knob {key!r}; known: {', '.join(sorted(known))}", param=key
                )
            kind = int if known[key].type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BadRequest(f"fault knob {key!r} must be a number", param=key)
            staged[key] = kind(value)
        candidate = FaultKnobs(**staged)
        try:
            candidate.validate()
        except ConfigError as exc:
            raise BadRequest(exc.message) from None
        for key in known:
            setattr(self, key, staged[key])
        if "seed" in changes:
            self._rng.seed(self.seed)
