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
