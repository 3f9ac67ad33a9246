import pytest

from hiveroute.errors import BadRequest
from hiveroute.metadata import extract_metadata, metadata_from_mcp_meta, parse_baggage


def test_body_object_is_read_and_removed() -> None:
    body = {"model": "m", "hiveroute": {"workflow_id": "w1", "agent_id": "a", "priority": 3}}
    meta, clean = extract_metadata(body, {})
    assert meta.workflow_id == "w1" and meta.agent_id == "a" and meta.priority == 3
    assert "hiveroute" not in clean and clean["model"] == "m"
    assert "hiveroute" in body  # the caller's dict is not mutated


def test_each_carrier_alone() -> None:
    assert extract_metadata({}, {"X-Workflow-Id": "h"})[0].workflow_id == "h"
    assert (
        extract_metadata({}, {"baggage": "workflow.id=b,agent.role=planner"})[0].agent_role
        == "planner"
    )
    meta = extract_metadata({"metadata": {"workflow_id": "o", "stage": "s2"}}, {})[0]
    assert meta.workflow_id == "o" and meta.stage == "s2"


def test_first_carrier_wins_per_field() -> None:
    body = {
        "hiveroute": {"workflow_id": "body"},
        "metadata": {"workflow_id": "oa", "agent_id": "oa-agent"},
    }
    headers = {
        "X-Workflow-Id": "header",
        "X-Session-Id": "sess",
        "baggage": "session.id=bag,agent.id=bag-agent",
    }
    meta, _ = extract_metadata(body, headers)
    assert meta.workflow_id == "body"
    assert meta.session_id == "sess"
    assert meta.agent_id == "bag-agent"  # baggage comes before OpenAI metadata


def test_clean_body_keeps_unknown_fields_and_identity_when_nothing_removed() -> None:
    body = {"model": "m", "weird_field": {"x": 1}}
    _, clean = extract_metadata(body, {})
    assert clean is body


@pytest.mark.parametrize(
    "obj",
    [
        "not-an-object",
        {"workflow_id": 5},
        {"priority": "high"},
        {"priority": True},
        {"context_refs": "ctx"},
        {"context_refs": [1]},
        {"unknown": "x"},
        {"agent_id": "a" * 1000},
    ],
)
def test_wrong_types_in_body_object_are_rejected(obj: object) -> None:
    with pytest.raises(BadRequest) as info:
        extract_metadata({"hiveroute": obj}, {})
    assert "hiveroute" in info.value.message


def test_header_priority_must_be_integer() -> None:
    with pytest.raises(BadRequest):
        extract_metadata({}, {"X-Hiveroute-Priority": "soon"})
    assert extract_metadata({}, {"X-Hiveroute-Priority": " 7 "})[0].priority == 7


def test_baggage_parsing_is_lenient_and_decodes() -> None:
    parsed = parse_baggage("a=1;prop=x, b = two%20words ,junk,=novalue")
    assert parsed == {"a": "1", "b": "two words"}


def test_mcp_meta_mapping() -> None:
    meta = metadata_from_mcp_meta(
        {
            "io.hiveroute/workflowId": "w",
            "io.hiveroute/agentRole": "executor",
            "baggage": "agent.id=x",
        }
    )
    assert (meta.workflow_id, meta.agent_role, meta.agent_id) == ("w", "executor", "x")
    assert meta.affinity_key == "w"
