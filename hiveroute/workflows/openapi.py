"""The OpenAPI description of the control API, served at /openapi.json.

Written by hand to match hiveroute/workflows/api.py; the schemathesis test (tests/faults)
generates requests from it and checks every answer against it, so the two cannot drift apart
unnoticed.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

# Ids are printable, without whitespace, at most 256 characters. The server accepts any
# printable Unicode; the description names the ASCII part, which every client can rely on.
ID = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[!-~]+$"}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
WORKFLOW = {
    "type": "object",
    "required": ["id", "state", "agents", "requests", "totals"],
    "properties": {
        "id": {"type": "string"},
        "state": {"enum": ["active", "ended", "expired"]},
        "home_engine": {"type": ["string", "null"]},
        "engines": {"type": "object"},
        "agents": {"type": "array"},
        "requests": {"type": "array"},
        "handoffs": {"type": "array"},
        "totals": {"type": "object"},
    },
}
SUMMARY_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array"}},
}
WORKFLOW_LIST = {
    "type": "object",
    "required": ["object", "data", "total"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array"},
        "total": {"type": "integer", "minimum": 0},
    },
}
CONTEXT = {
    "type": "object",
    "required": ["id", "bytes"],
    "properties": {
        "id": {"type": "string"},
        "workflow_id": {"type": ["string", "null"]},
        "bytes": {"type": "integer"},
        "text": {"type": "string"},
    },
}
NEW_WORKFLOW = {
    "type": "object",
    "properties": {
        "id": ID,
        "agents": {
            "type": "array",
            "items": {"type": "object", "required": ["id"], "properties": {"id": ID, "role": ID}},
        },
        "expected_fanout": {"type": "integer", "minimum": 1},
        "context_ids": {"type": "array", "items": ID},
        "ttl_s": {"type": "number", "exclusiveMinimum": 0},
        "shared_prefix_layout": {"type": "boolean"},
        "priority_scheduling": {"type": "boolean"},
    },
}
NEW_CONTEXT = {
    "type": "object",
    "required": ["text"],
    "properties": {"id": ID, "text": {"type": "string"}, "workflow_id": ID, "name": ID},
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    words = {400: "bad input", 401: "no or unknown key", 403: "not yours", 404: "unknown id",
             409: "conflict", 413: "too large", 429: "overloaded"}  # fmt: skip
    return {str(s): _json(ERROR, words[s]) for s in statuses}


def _path_id(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": ID}


TENANT_QUERY = {"name": "tenant", "in": "query", "required": False, "schema": ID}
LIMIT_QUERY = {
    "name": "limit",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": 10_000},
}

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "hiveroute control API", "version": "1"},
    "paths": {
        "/v1/workflows": {
            "get": {
                "parameters": [TENANT_QUERY, LIMIT_QUERY],
                "responses": {"200": _json(WORKFLOW_LIST, "workflows"), **_errors(400, 401)},
            },
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": NEW_WORKFLOW}},
                },
                "responses": {
                    "201": _json(WORKFLOW, "declared"),
                    **_errors(400, 401, 403, 409, 413),
                },
            },
        },
        "/v1/workflows/{workflow_id}": {
            "get": {
                "parameters": [_path_id("workflow_id"), TENANT_QUERY],
                "responses": {"200": _json(WORKFLOW, "the workflow"), **_errors(400, 401, 404)},
            },
            "delete": {
                "parameters": [_path_id("workflow_id"), TENANT_QUERY],
                "responses": {"200": _json({"type": "object"}, "ended"), **_errors(400, 401, 404)},
            },
        },
        "/v1/contexts": {
            "get": {
                "parameters": [
                    {"name": "workflow_id", "in": "query", "required": False, "schema": ID},
                    TENANT_QUERY,
                ],
                "responses": {"200": _json(SUMMARY_LIST, "contexts"), **_errors(400, 401)},
            },
            "post": {
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": NEW_CONTEXT}},
                },
                "responses": {
                    "201": _json(CONTEXT, "registered"),
                    **_errors(400, 401, 403, 404, 409, 413),
                },
            },
        },
        "/v1/contexts/{context_id}": {
            "get": {
                "parameters": [_path_id("context_id"), TENANT_QUERY],
                "responses": {"200": _json(CONTEXT, "the context"), **_errors(400, 401, 404)},
            },
            "delete": {
                "parameters": [_path_id("context_id"), TENANT_QUERY],
                "responses": {
                    "200": _json({"type": "object"}, "deleted"),
                    **_errors(400, 401, 404),
                },
            },
        },
    },
}


async def handle_openapi(request: web.Request) -> web.Response:
    return web.json_response(SPEC)
