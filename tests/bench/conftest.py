from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.bench.helpers import timed_engine
from tests.support.fake_engine import FakeEngine


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = await timed_engine().start()
    try:
        yield engine
    finally:
        await engine.stop()
