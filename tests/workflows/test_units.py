import random

from hiveroute.kvindex.blocks import block_keys
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from hiveroute.workflows.accounting import CrossAgentAccountant
from hiveroute.workflows.prefix_text import common_prefix
from hiveroute.workflows.priorities import plas_priority


def test_plas_levels_rise_with_service_and_are_capped() -> None:
    assert plas_priority(0) == 0
    assert plas_priority(1000, quantum_tokens=2048) == 0
    assert plas_priority(2048, quantum_tokens=2048) == 1
    assert plas_priority(3 * 2048, quantum_tokens=2048) == 2
    assert plas_priority(1e12, quantum_tokens=1, max_level=7) == 7


def test_common_prefix() -> None:
    assert common_prefix("abcdef", "abcxyz") == "abc"
    assert common_prefix("", "abc") == ""
    assert common_prefix("same", "same") == "same"


def test_cross_agent_accounting_counts_only_other_agents_earlier_blocks() -> None:
    acc = CrossAgentAccountant(BuiltinTokenizer(), block_size=4)
    shared = list(range(100, 132))  # 8 blocks
    planner = block_keys([*shared, 1, 2, 3, 4], 4)
    executor = block_keys([*shared, 5, 6, 7, 8], 4)
    assert acc.account("w", "planner", "e1", planner, 0, started_at=1.0) == 0
    # executor hits the 32 shared tokens the planner stored on e1
    assert acc.account("w", "executor", "e1", executor, 32, started_at=2.0) == 32
    # the planner again: its own blocks are not cross-agent
    assert acc.account("w", "planner", "e1", planner, 36, started_at=3.0) == 0
    # another engine: nobody stored anything there before
    assert acc.account("w", "executor", "e2", executor, 32, started_at=4.0) == 0
    # another workflow shares nothing
    assert acc.account("w2", "executor", "e1", executor, 32, started_at=5.0) == 0
    # hits are capped by what the engine reported
    assert acc.account("w", "validator", "e1", executor, 8, started_at=6.0) == 8
    acc.forget("w")
    assert acc.account("w", "validator", "e1", executor, 32, started_at=7.0) == 0


class ReferenceAccountant:
    """The accounting rule block by block, as its docstring states it: the specification the
    fast accountant must match."""

    def __init__(self, block_size: int, max_blocks: int) -> None:
        self.block_size, self.max_blocks = block_size, max_blocks
        self.origins: dict[tuple[str, str], dict[int, tuple[float, str]]] = {}
        self.sizes: dict[str, int] = {}

    def account(
        self, workflow: str, agent: str, engine: str, chain: list[int], cached: int, at: float
    ) -> int:
        blocks = self.origins.setdefault((workflow, engine), {})
        hits = min(len(chain), cached // self.block_size)
        cross = 0
        for i, key in enumerate(chain):
            origin = blocks.get(key)
            if i < hits and origin is not None and origin[1] != agent and origin[0] <= at:
                cross += 1
            if origin is None:
                if self.sizes.get(workflow, 0) >= self.max_blocks:
                    continue
                self.sizes[workflow] = self.sizes.get(workflow, 0) + 1
                blocks[key] = (at, agent)
            elif origin[0] > at:
                blocks[key] = (at, agent)
        return cross * self.block_size


def test_cross_agent_accounting_matches_the_block_by_block_rule() -> None:
    """Random agents of two workflows on two engines, prompts that share prefixes with recent
    ones, requests finishing out of start order (one that started earlier recorded after a
    later one stored its blocks), and a per-workflow bound that fills up: every answer equals
    the block-by-block rule's."""
    rng = random.Random(3)
    fast = CrossAgentAccountant(BuiltinTokenizer(), block_size=4, max_blocks_per_workflow=300)
    reference = ReferenceAccountant(4, 300)
    contexts = [list(range(c * 1000, c * 1000 + 64)) for c in range(40)]
    crossed = overtaken = 0
    for step in range(2000):
        recent = contexts[max(0, step // 50 - 2) : step // 50 + 1]  # contexts come and go
        context = rng.choice(recent)[: 4 * rng.randint(1, 16)]
        chain = block_keys([*context, *(rng.randrange(50) for _ in range(rng.randint(0, 12)))], 4)
        late = rng.random() < 0.3  # it started before the last few requests it overlaps
        args = (
            rng.choice(("w1", "w2")),
            rng.choice(("planner", "executor", "critic")),
            rng.choice(("e1", "e2")),
            chain,
            4 * rng.randint(0, len(chain)),
            step - (3.5 if late else 0.0),
        )
        expected = reference.account(*args)
        assert fast.account(*args) == expected, step
        crossed += expected > 0
        overtaken += late and expected > 0
    assert crossed > 100 and overtaken > 25  # both paths were exercised, not only misses


def test_config_rejects_bad_workflow_settings() -> None:
    import pytest

    from hiveroute.config import RouterConfig
    from hiveroute.errors import ConfigError

    for bad in (
        {"workflow_ttl_s": 0},
        {"max_workflows": 0},
        {"context_max_bytes": -1},
        {"keep_warm_max_rps": -1},
        {"state": "mysql://db"},
    ):
        with pytest.raises(ConfigError):
            RouterConfig(**bad).validate()  # type: ignore[arg-type]
    assert RouterConfig(state="redis://127.0.0.1:6379/0").validate().state.startswith("redis")
