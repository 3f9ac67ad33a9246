from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hiveroute.bench.engines import Fleet
from tests.bench.helpers import timed_engine
from tests.support.fake_engine import FakeEngine


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = await timed_engine().start()
    try:
        yield engine
    finally:
        await engine.stop()


@pytest.fixture
def fake_fleet(fake_engine: FakeEngine) -> Fleet:
    """The fake engine as a target's fleet."""
    return Fleet(specs=[fake_engine.url], urls=[fake_engine.url], kind="fake")
