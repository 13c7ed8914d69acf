"""ShareFetchService: a ShareFetch is answered by its MaxWaitMs on the injected clock,
whatever other requests hold (Kafka always completes a DelayedShareFetch by MaxWait).

Driven with a ManualClock: nothing here sleeps, and every await is bounded so that a
fetch that would wait for ever fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio

from broker.share.fetch import ShareFetchParams, ShareFetchService
from broker.share.session import ShareSessionCache
from persister.clock import ManualClock
from protocol.errors import ErrorCode
from tests.unit.test_share_manager import (
    ACCEPT,
    KEY,
    TOPIC_ID,
    FakeLog,
    FlakyPersister,
    manager,
)

MAX_WAIT_MS = 500
BOUND_S = 5.0
TP = (TOPIC_ID, 0)


def service(
    log: FakeLog | None = None,
) -> tuple[ShareFetchService, FlakyPersister, ManualClock]:
    mgr, persister, clock = manager(log)
    return (
        ShareFetchService(
            mgr, ShareSessionCache(), lambda tid: tid == TOPIC_ID, lambda t, p: None, clock=clock
        ),
        persister,
        clock,
    )


def params(epoch: int, member: str = "m", **overrides: object) -> ShareFetchParams:
    fields: dict[str, object] = {
        "group_id": "g",
        "member_id": member,
        "member_id_raw": member,
        "epoch": epoch,
        "partitions": [TP],
        "forgotten": [],
        "acks": {},
        "max_wait_ms": MAX_WAIT_MS,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "max_records": 500,
        "batch_size": 500,
        **overrides,
    }
    return ShareFetchParams(**fields)  # type: ignore[arg-type]


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_fetch_with_nothing_to_acquire_is_answered_at_max_wait_on_the_clock() -> None:
    svc, _, clock = service(FakeLog(high_watermark=0, last_stable_offset=0))
    fetch = asyncio.ensure_future(svc.share_fetch(params(0)))
    await turns()
    assert not fetch.done()
    clock.advance(MAX_WAIT_MS - 1)
    await turns()
    assert not fetch.done()
    clock.advance(1)
    result = await asyncio.wait_for(fetch, BOUND_S)
    assert result.error_code == ErrorCode.none
    entry = result.partitions[TP]
    assert (entry.error_code, entry.acquired, entry.records) == (ErrorCode.none, [], b"")
    svc.manager.stop()


async def test_a_fetch_is_answered_by_max_wait_while_another_request_holds_its_partition() -> None:
    svc, persister, clock = service()
    got = await asyncio.wait_for(svc.share_fetch(params(0)), BOUND_S)
    assert [r.delivery_count for r in got.partitions[TP].acquired] == [1]
    # "m" acknowledges through ShareFetch; its write never finishes (held at the gate),
    # so the partition's lock stays held for as long as the test runs.
    persister.gate = asyncio.Event()
    holder = asyncio.ensure_future(svc.share_fetch(params(1, acks={TP: [(0, 9, (ACCEPT,))]})))
    await turns()
    assert not holder.done()
    # Another member's fetch skips the busy partition and parks; MaxWaitMs answers it.
    other = asyncio.ensure_future(svc.share_fetch(params(0, member="n")))
    await turns()
    assert not other.done()
    clock.advance(MAX_WAIT_MS)
    result = await asyncio.wait_for(other, BOUND_S)
    assert result.error_code == ErrorCode.none and result.partitions[TP].acquired == []
    persister.gate.set()
    acked = await asyncio.wait_for(holder, BOUND_S)
    assert acked.partitions[TP].acknowledge_error_code == ErrorCode.none
    assert svc.manager.partitions[KEY].spso == 10
    svc.manager.stop()


async def test_a_final_fetch_applies_its_acknowledgements_then_releases_the_session() -> None:
    svc, _, _ = service()
    await svc.share_fetch(params(0))
    final = await asyncio.wait_for(
        svc.share_fetch(params(-1, partitions=[], acks={TP: [(0, 4, (ACCEPT,))]})), BOUND_S
    )
    assert final.partitions[TP].acknowledge_error_code == ErrorCode.none
    assert svc.sessions.get("g", "m") is None
    sp = svc.manager.partitions[KEY]
    # 0-4 accepted; 5-9 released by the session's end, delivery made.
    assert (sp.spso, sp.acquired_count) == (5, 0)
    svc.manager.stop()
