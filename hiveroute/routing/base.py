"""The small interfaces every routing plugin implements.

A routing decision runs in one cycle: filters narrow the candidate engines, each scorer gives
every remaining engine a score in [0, 1], the policy adds the scores up with their weights, and
the picker chooses. Plugins share intermediate results (token ids, prefix matches) through the
per-request CycleState so nothing is computed twice. After the request, plugins hear how it went
(`on_routed`, `on_first_token`, `on_completed`), which is how the `prefix` and `kv` policies learn.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from hiveroute.engines.engine import Engine
from hiveroute.metadata import RequestMetadata

if TYPE_CHECKING:
    from hiveroute.kvindex.blocks import BlockKey
    from hiveroute.kvindex.tokenizer import Prompt, Tokenizer
    from hiveroute.routing.request_tokens import PromptHead


def load_bound(candidates: Sequence[Engine], load_factor: float, slack: int = 0) -> int:
    """Bounded load (Mirrokni et al., "Consistent Hashing with Bounded Loads"): the most
    requests an engine may hold, this one included: ceil(load_factor × the average) + slack."""
    total = sum(e.load.queue_depth for e in candidates) + 1  # count this request too
    return math.ceil(load_factor * total / len(candidates)) + slack


class ScorerCategory(enum.Enum):
    """What a scorer trades for: where state already is, or spreading the load."""

    AFFINITY = "affinity"
    DISTRIBUTION = "distribution"
    BALANCE = "balance"


@dataclass
class DerivedFromPrompt:
    """What was derived from a request's prompt once, for every plugin and hook of it: a
    16k-token prompt is tokenized and keyed once, not once per reader
    (`routing/request_tokens.py` fills it)."""

    # by tokenizer name; None: the prompt cannot be tokenized with it
    token_ids: dict[str, list[int] | None] = field(default_factory=dict)
    # by tokenizer name: what its API says the engine tokenizes (read once)
    prompts: dict[str, Prompt] = field(default_factory=dict)
    # by tokenizer name: the first ids, while the prompt is tokenized only that far
    heads: dict[str, PromptHead] = field(default_factory=dict)
    # by (block size, tokens keyed): a router tokenizes with one tokenizer
    block_keys: dict[tuple[int, int], list[BlockKey]] = field(default_factory=dict)


@dataclass
class RoutingRequest:
    """What a policy may look at: the cleaned body, its metadata, and the endpoint path."""

    request_id: str
    path: str  # "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"
    body: dict[str, Any]
    metadata: RequestMetadata
    tenant: str | None = None
    # The prompt the engine will tokenize, read as its API does (gateway/apis.py); None: a
    # completions or chat body, read by kvindex.tokenizer.prompt_of.
    prompt: Callable[[Tokenizer, dict[str, Any]], Prompt] | None = field(
        default=None, compare=False, repr=False
    )
    derived: DerivedFromPrompt = field(default_factory=DerivedFromPrompt, compare=False, repr=False)

    @property
    def model(self) -> str | None:
        model = self.body.get("model")
        return model if isinstance(model, str) else None

    @property
    def is_chat(self) -> bool:
        return self.path.endswith("/chat/completions")


T = TypeVar("T")
D = TypeVar("D")


class StateKey(Generic[T]):
    """A typed slot in a CycleState (llm-d's StateKey), declared once, beside what fills it.
    Plugins read and write the slot through the key object, never by a string, so two plugins
    cannot collide on a name and a reader gets the writer's type."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name  # for repr and errors only: keys compare by identity

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class CycleState:
    """Scratch space for one routing cycle: what one plugin computed for another, by StateKey."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[StateKey[Any], Any] = {}

    def __contains__(self, key: StateKey[Any]) -> bool:
        return key in self._values

    def __getitem__(self, key: StateKey[T]) -> T:
        value: T = self._values[key]
        return value

    def __setitem__(self, key: StateKey[T], value: T) -> None:
        self._values[key] = value

    @overload
    def get(self, key: StateKey[T]) -> T | None: ...

    @overload
    def get(self, key: StateKey[T], default: D) -> T | D: ...

    def get(self, key: StateKey[Any], default: Any = None) -> Any:
        return self._values.get(key, default)

    def setdefault(self, key: StateKey[T], default: T) -> T:
        value: T = self._values.setdefault(key, default)
        return value

    @overload
    def pop(self, key: StateKey[T]) -> T | None: ...

    @overload
    def pop(self, key: StateKey[T], default: D) -> T | D: ...

    def pop(self, key: StateKey[Any], default: Any = None) -> Any:
        return self._values.pop(key, default)


@dataclass
class Decision:
    """The chosen engine, why, and every engine's total score (for logs and metrics)."""

    engine: Engine
    reason: str
    scores: dict[str, float] = field(default_factory=dict)


@dataclass
class RequestOutcome:
    """How a request went, as the gateway measured it. `engine`: None when it was refused
    before any engine was chosen (plugins only hear of requests they routed)."""

    engine: Engine | None
    status: int
    ttft_s: float | None = None
    duration_s: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status < 400 and self.error is None


class Plugin:
    """Base of every plugin: a name and optional feedback hooks (no-ops by default)."""

    name: str = "plugin"

    async def prepare(self, request: RoutingRequest, state: CycleState) -> None:
        """Async work before the (synchronous) decision, e.g. tokenizing the prompt."""

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        """The request was sent to `engine` (may be called again on a retry). The router calls
        it once the request is written (`Policy.decide_then_send`), when the engine already
        counts it in flight: what must be seen as the decision saw it, keep in the state then
        (a price keeps the engine's load it read)."""

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        """A streamed request's first token arrived: its prefill is over (not called for
        whole responses, whose first byte is their end)."""

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        """The request finished (successfully or not)."""


class Filter(Plugin):
    def filter(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> list[Engine]:
        """Return the candidates still allowed; returning none means none of them may serve."""
        raise NotImplementedError


class Scorer(Plugin):
    category: ScorerCategory = ScorerCategory.DISTRIBUTION

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        """A score in [0, 1] per engine name; higher is better."""
        raise NotImplementedError


class Picker(Plugin):
    def pick(
        self, request: RoutingRequest, ranked: list[tuple[Engine, float]], state: CycleState
    ) -> Engine:
        """Choose one engine from (engine, total score) pairs, best first."""
        raise NotImplementedError
