"""What the driver measures: one record per request and one per unit (workflow, session)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    request_id: str
    unit_id: str
    target: str
    workload: str
    endpoint: str  # "chat", "completion", "responses" or "messages"
    t_send_s: float  # from the start of the cell
    max_tokens: int
    agent_role: str | None = None
    stage: str | None = None
    workflow_id: str | None = None
    session_id: str | None = None
    status: int | None = None
    error: str | None = None
    cut: bool = False  # stopped by the run's time bound, not a failure of the target
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None  # (last token - first token) / (completion tokens - 1)
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    engine: str | None = None  # X-Hiveroute-Engine, when the target says
    sent_to: str | None = None  # the target URL it went to (one of its replicas, if several)
    parents: list[str] = field(default_factory=list)
    planned_gap_s: float = 0.0
    handoff_s: float | None = None  # parent's last token -> this request's first token

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["itl_s"] = [round(x, 6) for x in self.itl_s]
        return data


@dataclass
class UnitRecord:
    unit_id: str
    kind: str
    target: str
    workload: str
    arrival_s: float
    start_s: float
    end_s: float | None = None
    requests: int = 0
    error: str | None = None
    cut: bool = False

    @property
    def duration_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "duration_s": self.duration_s}


@dataclass
class LoadSample:
    """One scrape of one engine's /metrics during a run."""

    t_s: float
    engine: str
    running: float
    waiting: float
    kv_usage: float
    prefix_queries: float | None
    prefix_hits: float | None
    requests_done: float | None = None  # vllm:request_success_total, all finish reasons
    # vllm:time_to_first_token_seconds' sum and count: the engine's own TTFT, without the router
    ttft_sum: float | None = None
    ttft_count: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
