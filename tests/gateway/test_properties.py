"""Property-based tests: every parser either accepts its input or raises a clear client error."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiveroute.config import RouterConfig, load_config
from hiveroute.engines.engine import EngineSpec
from hiveroute.engines.prom_text import parse_prometheus_text
from hiveroute.errors import BadRequest, ConfigError, HiverouteError
from hiveroute.gateway.body import check_openai_fields, parse_json_object
from hiveroute.metadata import (
    RequestMetadata,
    extract_metadata,
    metadata_from_mcp_meta,
    parse_baggage,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
header_maps = st.dictionaries(
    st.sampled_from(
        ["X-Workflow-Id", "X-Agent-Id", "X-Session-Id", "X-Hiveroute-Priority", "baggage", "Other"]
    ),
    st.text(max_size=300),
)


@given(
    body=st.dictionaries(st.sampled_from(["hiveroute", "metadata", "model", "x"]), json_values),
    headers=header_maps,
)
def test_metadata_extraction_accepts_or_raises_bad_request(
    body: dict[str, Any], headers: dict[str, str]
) -> None:
    try:
        meta, clean = extract_metadata(body, headers)
    except BadRequest as exc:
        assert exc.status == 400 and exc.message
        return
    assert isinstance(meta, RequestMetadata)
    assert "hiveroute" not in clean
    assert {k: v for k, v in body.items() if k != "hiveroute"} == clean


@given(obj=st.fixed_dictionaries({}, optional={
    "workflow_id": st.text(max_size=300), "agent_id": st.text(max_size=10), "priority": st.integers(),
    "context_refs": st.lists(st.text(max_size=5), max_size=80),
}))  # fmt: skip
def test_well_typed_body_objects_round_trip_or_hit_a_stated_bound(obj: dict[str, Any]) -> None:
    try:
        meta, _ = extract_metadata({"hiveroute": obj}, {})
    except BadRequest as exc:
        assert any(word in exc.message for word in ("longer than", "between", "more than"))
        return
    assert meta.workflow_id == (obj.get("workflow_id") or None) or obj.get("workflow_id") == ""
    assert meta.priority == obj.get("priority")
    assert list(meta.context_refs) == obj.get("context_refs", [])


@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_body_parser_never_crashes(raw: bytes) -> None:
    try:
        value = parse_json_object(raw)
    except BadRequest:
        return
    assert isinstance(value, dict)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(depth=st.integers(min_value=1, max_value=200_000))
def test_deep_nesting_is_a_400_not_a_crash(depth: int) -> None:
    raw = b'{"a":' * depth + b"1" + b"}" * depth
    try:
        assert isinstance(parse_json_object(raw), dict)
    except BadRequest as exc:
        assert "nested" in exc.message


@given(
    body=st.dictionaries(
        st.sampled_from(["model", "stream", "messages", "prompt", "metadata"]), json_values
    ),
    chat=st.booleans(),
)
def test_openai_field_checks_raise_only_bad_request(body: dict[str, Any], chat: bool) -> None:
    try:
        check_openai_fields(body, chat=chat)
    except BadRequest as exc:
        assert exc.param is not None


@given(text=st.text(max_size=300))
def test_baggage_and_prometheus_parsers_never_crash(text: str) -> None:
    assert isinstance(parse_baggage(text), dict)
    assert all(isinstance(v, float) for v in parse_prometheus_text(text).values())


@given(meta=st.dictionaries(st.text(max_size=30), json_values, max_size=6))
def test_mcp_meta_mapping_raises_only_bad_request(meta: dict[str, Any]) -> None:
    try:
        found = metadata_from_mcp_meta(meta)
    except BadRequest as exc:
        assert "_meta" in exc.message or "baggage" in exc.message
        return
    assert isinstance(found, RequestMetadata)


@given(text=st.text(max_size=80))
def test_engine_spec_parser_raises_only_config_errors(text: str) -> None:
    try:
        spec = EngineSpec.parse(text)
    except ConfigError:
        return
    assert spec.url.startswith(("http://", "https://"))


@given(
    values=st.dictionaries(
        st.sampled_from(
            [
                "HIVEROUTE_PORT",
                "HIVEROUTE_RETRIES",
                "HIVEROUTE_POLICIES",
                "HIVEROUTE_ENGINE",
                "HIVEROUTE_MAX_BODY_BYTES",
            ]
        ),
        st.text(max_size=30),
    )
)
def test_config_from_environment_raises_only_config_errors(values: dict[str, str]) -> None:
    try:
        config = load_config({}, env=values, cls=RouterConfig)
    except HiverouteError as exc:
        assert isinstance(exc, ConfigError)
        return
    assert json.dumps(config.policies) is not None
