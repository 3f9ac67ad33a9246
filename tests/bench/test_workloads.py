from __future__ import annotations

import random

import pytest

from hiveroute.bench.workloads.agentic import AgenticConfig, AgenticWorkload
from hiveroute.bench.workloads.base import GapDistribution
from hiveroute.bench.workloads.multiturn import MultiturnConfig, MultiturnWorkload
from hiveroute.bench.workloads.text import filler, labelled_filler
from hiveroute.errors import ConfigError
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from tests.bench.helpers import run_units

TOK = BuiltinTokenizer()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def tokens(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_filler_has_exact_token_counts_and_is_prefix_stable() -> None:
    for n in (1, 2, 3, 10, 511, 512):
        assert len(tokens(filler(n, "k"))) == n
        assert len(tokens(labelled_filler("lbl", n, "k"))) == n
    assert filler(512, "k").startswith(filler(100, "k"))
    assert filler(64, "k") != filler(64, "other")


def small_agentic(**kw: object) -> AgenticWorkload:
    config = AgenticConfig(
        workflows=3,
        fan_out=2,
        rounds=2,
        kb_tokens=400,
        task_tokens=40,
        role_tokens=30,
        tool_gap=GapDistribution("exp", 0.2),
        **kw,  # type: ignore[arg-type]
    )
    return AgenticWorkload(config)


async def test_agentic_is_reproducible_for_a_seed_and_differs_across_seeds() -> None:
    first = await run_units(list(small_agentic(seed=1).units()))
    again = await run_units(list(small_agentic(seed=1).units()))
    other = await run_units(list(small_agentic(seed=2).units()))
    dump = lambda cs: [(r.messages, r.max_tokens, r.headers()) for c in cs for r in c.sent]  # noqa: E731
    assert dump(first) == dump(again)
    assert [c.slept for c in first] == [c.slept for c in again]
    assert dump(first) != dump(other)


async def test_agentic_request_count_roles_and_metadata() -> None:
    workload = small_agentic()
    units = list(workload.units())
    assert len(units) == 3
    contexts = await run_units(units)
    for unit, ctx in zip(units, contexts, strict=True):
        assert len(ctx.sent) == unit.planned_requests == 2 * (2 + 2 * 2)
        roles = [r.agent_role for r in ctx.sent]
        assert roles.count("planner") == 2 and roles.count("validator") == 2
        assert roles.count("executor") == 8
        for request in ctx.sent:
            headers = request.headers()
            assert headers["X-Workflow-Id"] == unit.unit_id
            assert headers["X-Agent-Role"] == request.agent_role
            assert headers["X-Agent-Id"].startswith(unit.unit_id + "/")
        # one tool call per executor per round: a gap between its two model calls
        assert len(ctx.slept) == 2 * 2
        # executors hand off from the planner; the validator from both executors
        validator = next(r for r in ctx.sent if r.agent_role == "validator")
        assert len(validator.parents) == 2


async def test_context_first_shares_the_context_across_agents_of_a_workflow() -> None:
    ctx = (await run_units([next(small_agentic(layout="context_first").units())]))[0]
    planner = tokens(ctx.sent[0].messages[0]["content"])  # type: ignore[index]
    executor = tokens(
        next(r for r in ctx.sent if r.agent_role == "executor").messages[0]["content"]  # type: ignore[index]
    )
    assert common_prefix(planner, executor) >= 400 + 40  # the whole task + knowledge base


async def test_role_first_shares_roles_across_workflows_not_context_across_roles() -> None:
    contexts = await run_units(list(small_agentic(layout="role_first").units())[:2])
    plan_a = tokens(contexts[0].sent[0].messages[0]["content"])  # type: ignore[index]
    plan_b = tokens(contexts[1].sent[0].messages[0]["content"])  # type: ignore[index]
    exec_a = tokens(
        next(r for r in contexts[0].sent if r.agent_role == "executor").messages[0]["content"]  # type: ignore[index]
    )
    assert common_prefix(plan_a, plan_b) >= 30  # same planner role prompt in both workflows
    assert common_prefix(plan_a, plan_b) < 40  # ...and not the other workflow's context
    assert common_prefix(plan_a, exec_a) < 5  # different roles share nothing up front


async def test_different_workflows_do_not_share_their_context() -> None:
    contexts = await run_units(list(small_agentic().units())[:2])
    a = tokens(contexts[0].sent[0].messages[0]["content"])  # type: ignore[index]
    b = tokens(contexts[1].sent[0].messages[0]["content"])  # type: ignore[index]
    assert common_prefix(a, b) < 2


async def test_histories_grow_within_an_agent() -> None:
    ctx = (await run_units([next(small_agentic().units())]))[0]
    planner = [r.messages for r in ctx.sent if r.agent_role == "planner"]
    assert planner[1][: len(planner[0])] == planner[0]  # type: ignore[index]
    assert len(planner[1]) > len(planner[0])  # type: ignore[arg-type]


async def test_namespace_comes_first_in_every_prompt() -> None:
    ctx = (await run_units([next(small_agentic(namespace="runabc").units())]))[0]
    assert all(r.messages[0]["content"].startswith("runabc\n") for r in ctx.sent)  # type: ignore[index]


def test_arrivals_follow_the_rate_and_zero_means_at_once() -> None:
    at_once = [u.arrival_s for u in small_agentic(rate=0.0).units()]
    assert at_once == [0.0, 0.0, 0.0]
    spread = [u.arrival_s for u in small_agentic(rate=2.0).units()]
    assert spread == sorted(spread) and spread[-1] > 0


async def test_multiturn_shares_the_system_prompt_and_grows_history() -> None:
    workload = MultiturnWorkload(MultiturnConfig(users=3, turns=3, system_tokens=100))
    contexts = await run_units(list(workload.units()))
    systems = {c.sent[0].messages[0]["content"] for c in contexts}  # type: ignore[index]
    assert len(systems) == 1 and len(tokens(systems.pop())) == 100
    for ctx in contexts:
        assert len(ctx.sent) == 3 and len(ctx.slept) == 2
        for before, after in zip(ctx.sent, ctx.sent[1:], strict=False):
            assert after.messages[: len(before.messages)] == before.messages  # type: ignore[index]
            assert after.parents  # hands off from the previous turn
    firsts = [tokens(str(c.sent[0].messages[1]["content"])) for c in contexts]  # type: ignore[index]
    assert common_prefix(firsts[0], firsts[1]) == 0  # each user's own history


@pytest.mark.parametrize(
    "text,expected",
    [("exp:0.5", GapDistribution("exp", 0.5)), ("0.2", GapDistribution("const", 0.2))],
)
def test_gap_distribution_parses(text: str, expected: GapDistribution) -> None:
    assert GapDistribution.parse(text) == expected


@pytest.mark.parametrize("text", ["poisson:1", "exp:-1", "exp:x", "uniform:nan"])
def test_gap_distribution_rejects_bad_text(text: str) -> None:
    with pytest.raises(ConfigError):
        GapDistribution.parse(text)


@pytest.mark.parametrize("kind", ["const", "exp", "uniform", "lognormal"])
def test_gap_samples_are_non_negative_with_about_the_mean(kind: str) -> None:
    dist = GapDistribution(kind, 0.5)
    rng = random.Random(0)
    samples = [dist.sample(rng) for _ in range(4000)]
    assert min(samples) >= 0
    assert 0.4 < sum(samples) / len(samples) < 0.6


async def test_multiturn_system_share_sizes_the_shared_prompt_and_the_conversation() -> None:
    config = MultiturnConfig(
        users=2, turns=3, conversation_tokens=2000, system_share=0.25, answer_tokens=40
    )
    contexts = await run_units(list(MultiturnWorkload(config).units()))
    systems = {c.sent[0].messages[0]["content"] for c in contexts}  # type: ignore[index]
    assert len(systems) == 1 and len(tokens(systems.pop())) == 500
    # the last turn's prompt is about the conversation's size (the fake answers are short)
    last = contexts[0].sent[-1].messages
    words = sum(len(tokens(str(m["content"]))) for m in last)  # type: ignore[union-attr]
    assert 2000 - 3 * 40 <= words <= 2000
    none = MultiturnWorkload(MultiturnConfig(users=2, conversation_tokens=2000, system_share=0))
    firsts = [(await run_units([u]))[0].sent[0].messages for u in none.units()]
    assert firsts[0][0]["role"] == "user" and firsts[0][0] != firsts[1][0]  # type: ignore[index]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"conversation_tokens": 500, "system_share": 0.5, "turns": 10}, "cannot hold"),
        ({"system_share": 0.1}, "needs --conversation-tokens"),
        ({"conversation_tokens": 5000, "system_share": 1.0}, r"\[0, 1\)"),
        ({"active_users": 4}, "go together"),
    ],
)
def test_multiturn_rejects_sizes_and_pacing_that_do_not_fit(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        MultiturnWorkload(MultiturnConfig(**kw))


async def test_multiturn_paced_by_request_rate_keeps_slots_and_intervals() -> None:
    config = MultiturnConfig(users=6, turns=3, active_users=3, request_rate=1.5)
    units = list(MultiturnWorkload(config).units())
    # three slots 1/1.5 s apart; a slot's next session starts when the first's 3 turns of
    # 3/1.5 = 2 s are over
    assert [u.arrival_s for u in units] == pytest.approx([0, 2 / 3, 4 / 3, 6, 20 / 3, 22 / 3])
    fast = (await run_units(units[:1], latency_s=0.5))[0]
    assert fast.sent_at == [0.0, 2.0, 4.0]  # start to start, whatever the latency
    slow = (await run_units(units[:1], latency_s=3.0))[0]
    assert slow.sent_at == [0.0, 3.0, 6.0]  # a late answer: the next question right away


async def test_context_refs_register_the_context_once_and_reference_it() -> None:
    workload = small_agentic(layout="role_first", context_refs=True, namespace="runx")
    unit = next(workload.units())
    ctx = (await run_units([unit]))[0]
    workflow, context, end = ctx.controls
    assert workflow == ("POST", "/v1/workflows", {"id": unit.unit_id, "shared_prefix_layout": True})
    method, path, body = context
    assert (method, path) == ("POST", "/v1/contexts")
    assert body is not None and body["workflow_id"] == unit.unit_id
    assert body["text"].startswith("runx\n") and len(tokens(body["text"])) >= 400 + 40
    assert end == ("DELETE", f"/v1/workflows/{unit.unit_id}", None)
    for request in ctx.sent:
        assert request.context_refs == [body["id"]]
        system = request.messages[0]["content"]  # type: ignore[index]
        assert body["text"] not in system and len(tokens(system)) < 60  # the role prompt only
    inline = (await run_units([next(small_agentic(layout="role_first").units())]))[0]
    assert inline.controls == [] and all(r.context_refs == [] for r in inline.sent)
