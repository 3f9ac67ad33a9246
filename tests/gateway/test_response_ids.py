"""The Responses API's id -> engine map: what a streamed answer's first event waits for."""

from hiveroute.engines.pool import EnginePool
from hiveroute.gateway.response_ids import ORDER_KEY, ResponseIds, id_key
from tests.support.stores import RoundCountingStore


async def test_an_id_is_recorded_in_one_round_trip_and_the_bound_holds() -> None:
    """The first event of a stored response is relayed once its id is recorded (a follow-up
    may name it at once): that took two round trips in turn, three once the bound was reached,
    each a wait for another process under `serve --workers`. Ids the bound pushes out are
    deleted with the next record."""
    store = RoundCountingStore()
    ids = ResponseIds(store, EnginePool(), max_ids=2)
    for n in range(5):
        store.rounds = 0
        await ids.record(None, f"resp_{n}", f"e{n}")
        assert store.rounds == 1
    assert await store.lrange(ORDER_KEY) == [id_key(None, "resp_3"), id_key(None, "resp_4")]
    kept = [n for n in range(5) if await store.get(id_key(None, f"resp_{n}")) is not None]
    assert kept == [2, 3, 4]  # resp_2 goes with the next record
    assert await ids.engine_of(None, "resp_4") == "e4"
