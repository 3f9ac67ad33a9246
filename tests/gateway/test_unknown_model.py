"""A client that names a model no engine serves learns which models are served."""

import aiohttp

from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine


async def test_an_unknown_model_404_lists_the_served_models(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fake_engines[1].behaviour.models = ["other-model"]
    r = await router_factory([e.url for e in fake_engines], health_interval_s=0.05)
    body = {"model": "my-model", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{r.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'my-model'" in error["message"]
    assert "served: 'm', 'other-model'" in error["message"]
