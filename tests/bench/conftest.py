from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.bench.fake_engine import FakeEngine


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = await FakeEngine().start()
    try:
        yield engine
    finally:
        await engine.stop()
