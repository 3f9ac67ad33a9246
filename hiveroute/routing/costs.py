"""What every pricing plugin (kv, workflow) shares: the records a price is computed from
(`routing/cost.py` computes it).

One predictor learns each engine's prefill cost, one backlog counts the prefill work routed to
each engine, one live set remembers which blocks each engine wrote lately, one retention record
measures what each engine's cache kept of the prompts that came back, and one sharing record
counts how many requests lately built on each cached prefix. Two plugins that predict must see
the same ones, or each would count a routed request on its own; so the assembly builds one
CostModel and every plugin gets its ledger (and cost) from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hiveroute.kvindex.index import KvIndex
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.cost import RoutingCost
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.retention import Retention
from hiveroute.routing.sharing import SharedPrefixes
from hiveroute.routing.ttft import TtftPredictor
from hiveroute.routing.ttft_ledger import TtftLedger


@dataclass
class CostModel:
    predictor: TtftPredictor = field(default_factory=TtftPredictor)
    backlog: PrefillBacklog = field(default_factory=PrefillBacklog)
    live: LiveSet = field(default_factory=LiveSet)
    retention: Retention = field(default_factory=Retention)
    sharing: SharedPrefixes = field(default_factory=SharedPrefixes)

    def ledger(self, *, drain_backlog: bool = True) -> TtftLedger:
        """A ledger over this model's predictor and backlog (`drain_backlog`: backlog.py)."""
        return TtftLedger(self.predictor, self.backlog, drain_backlog=drain_backlog)

    def forget(self, engine: str) -> None:
        """The engine left the pool: drop what was learned of it, which would otherwise stay
        for good (a pool that churns, as Kubernetes discovery's does, would grow it without
        bound) and price an engine that returns under its name by its predecessor's cache.
        Its backlog empties as its requests end."""
        self.predictor.forget(engine)
        self.live.forget(engine)
        self.retention.forget(engine)

    def routing_cost(self, index: KvIndex, ledger: TtftLedger | None = None) -> RoutingCost:
        """The price of a prefill on each engine, over this model and the KV index (and a
        ledger of this model's, if the caller keeps one of its own)."""
        return RoutingCost(ledger or self.ledger(), self.live, index, self.retention, self.sharing)
