"""ShareFetchService: a ShareFetch is answered by its MaxWaitMs on the injected clock,
whatever other requests hold (Kafka always completes a DelayedShareFetch by MaxWait).

Driven with a ManualClock: nothing here sleeps, and every await is bounded so that a
fetch that would wait for ever fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import dataclasses

from broker.share.fetch import ShareAcknowledgeParams, ShareFetchParams, ShareFetchService
from broker.share.session import ShareSessionCache
from persister.clock import ManualClock
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
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


@dataclasses.dataclass
class TwoBatchLog(FakeLog):
    """Offsets 0-99 and 100-199, one batch each, all durable."""

    high_watermark: int = 200
    last_stable_offset: int = 200

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        committed_only: bool = False,
        beyond_high_watermark: bool = False,
    ) -> bytes:
        batches = [
            build_batch([NewRecord(None, b"x")] * 100, base_offset=base) for base in (0, 100)
        ]
        return b"".join(b for b, base in zip(batches, (0, 100), strict=True) if base + 99 >= offset)


async def test_an_accept_that_frees_record_locks_wakes_a_fetch_parked_at_the_limit() -> None:
    """Kafka's SharePartitionManager.acknowledge re-checks the parked fetches of every
    partition it acknowledged: ACCEPT archives records, which frees room under
    group.share.partition.max.record.locks for a fetch that found none. Without that, a
    member parked at the limit waits out its MaxWaitMs although records are there."""
    svc, _, clock = service(TwoBatchLog())
    groups = svc.manager.groups
    groups.group_config = dataclasses.replace(  # type: ignore[attr-defined]
        groups.group_config,  # type: ignore[attr-defined]
        partition_max_record_locks=100,
    )
    started = clock.now_ms()
    got = await asyncio.wait_for(svc.share_fetch(params(0)), BOUND_S)
    assert [(r.first_offset, r.last_offset) for r in got.partitions[TP].acquired] == [(0, 99)]
    # "n" finds every lock taken (100 in flight, the limit) and parks.
    parked = asyncio.ensure_future(svc.share_fetch(params(0, member="n")))
    await turns()
    assert not parked.done()
    # "m" accepts its records with a ShareAcknowledge (which acquires nothing itself).
    acked = await asyncio.wait_for(
        svc.share_acknowledge(ShareAcknowledgeParams("g", "m", "m", 1, {TP: [(0, 99, (ACCEPT,))]})),
        BOUND_S,
    )
    assert acked.error_code == ErrorCode.none and acked.partitions[TP][0] == ErrorCode.none
    # "n" is answered with the next batch on the same clock reading, not at MaxWaitMs.
    result = await asyncio.wait_for(parked, BOUND_S)
    assert [(r.first_offset, r.last_offset) for r in result.partitions[TP].acquired] == [(100, 199)]
    assert clock.now_ms() == started
    svc.manager.stop()
