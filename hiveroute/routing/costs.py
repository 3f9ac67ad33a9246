"""The router's one TTFT cost model: what every predicting plugin (kv, workflow) shares.

One predictor learns each engine's prefill cost, one backlog counts the prefill work routed to
each engine, one footprint remembers recent cache writes and one record keeps recent TTFTs. Two
plugins that predict must see the same ones, or each would count a routed request on its own;
so the assembly builds one CostModel and every plugin gets its ledger from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.footprint import KvFootprint
from hiveroute.routing.ttft import RecentTtfts, TtftPredictor
from hiveroute.routing.ttft_ledger import TtftLedger


@dataclass
class CostModel:
    predictor: TtftPredictor = field(default_factory=TtftPredictor)
    backlog: PrefillBacklog = field(default_factory=PrefillBacklog)
    footprint: KvFootprint = field(default_factory=KvFootprint)
    recent: RecentTtfts = field(default_factory=RecentTtfts)

    def ledger(self, *, drain_backlog: bool = True) -> TtftLedger:
        """A ledger over this model's parts (`drain_backlog`: see backlog.py)."""
        return TtftLedger(
            self.predictor,
            self.backlog,
            self.footprint,
            self.recent,
            drain_backlog=drain_backlog,
        )
