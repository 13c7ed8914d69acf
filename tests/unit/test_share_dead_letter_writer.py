"""The dead-letter writer (KIP-1191 phase two) in the share-partition manager: an in-memory
share coordinator, a fake log, a fake sink and a ManualClock; no sockets.

What a run goes through: ARCHIVING durable, then the copy (the sink), then ARCHIVED durable;
retried on the clock while the sink fails retriably, archived uncopied when it refuses, left
ARCHIVING for the next owner when the partition goes away mid-copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
from structlog.testing import capture_logs

from broker.share.dead_letter import LETTERS_PER_WRITE, RETRY_BACKOFF_MS, RefusingSink
from broker.share.dead_letters import (
    DeadLetter,
    DeadLetterOutcome,
    DeadLetterReason,
    DeadLetterRefused,
    DeadLetterRetriable,
)
from broker.share.manager import SharePartitionManager
from broker.share.partition import RecordState
from coordinator.group_config import GroupConfig
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.clock import ManualClock
from tests.unit.test_share_manager import (
    KEY,
    STORAGE,
    TOPIC_ID,
    FakeLog,
    FlakyPersister,
    durable,
    fetch,
)

REJECT = 3
G = RecordState.ARCHIVING


class Groups:
    def __init__(self, persister: FlakyPersister, *, dead_letter: bool, limit: int = 5) -> None:
        self.persister = persister
        base = GroupConfig.effective(
            {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": limit}
        )
        self.group_config = replace(base, dead_letter_topic="dlq.t" if dead_letter else "")

    def config(self, group_id: str) -> GroupConfig:
        return self.group_config

    async def ensure_initialized(self, group_id: str, topic_id: object, partition: int) -> None:
        key = ShareStateKey(group_id, TOPIC_ID, partition)
        if self.persister.shard.state(key) is None:
            await self.persister.initialize_state(key, 0, -1)


class FakeSink:
    """Records each letter with the durable state seen when its write was called, and
    each write's letters (`writes`); fails letters as told, one failure each; `gate`
    holds writes."""

    def __init__(self, persister: FlakyPersister) -> None:
        self.persister = persister
        self.letters: list[DeadLetter] = []
        self.seen: list[tuple[int, list[object]]] = []
        self.failures: list[BaseException | None] = []  # None: that letter is written
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.most_in_flight = 0
        self.writes: list[list[DeadLetter]] = []
        # Answer 0 copies written: the records are gone from the source log.
        self.nothing_left = False

    async def write_all(self, letters: Sequence[DeadLetter]) -> list[DeadLetterOutcome]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.writes.append(list(letters))
        try:
            seen = durable(self.persister)
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)
            outcomes: list[DeadLetterOutcome] = []
            for letter in letters:
                self.seen.append(seen)
                failure = self.failures.pop(0) if self.failures else None
                if isinstance(failure, (DeadLetterRefused, DeadLetterRetriable)):
                    outcomes.append(failure)
                elif failure is not None:
                    raise failure
                else:
                    self.letters.append(letter)
                    outcomes.append(0 if self.nothing_left else letter.record_count)
            return outcomes
        finally:
            self.in_flight -= 1


def setup(
    *, dead_letter: bool = True, limit: int = 5
) -> tuple[SharePartitionManager, FlakyPersister, ManualClock, FakeSink]:
    persister = FlakyPersister()
    clock = ManualClock()
    log = FakeLog()
    sink = FakeSink(persister)
    mgr = SharePartitionManager(
        persister,
        Groups(persister, dead_letter=dead_letter, limit=limit),
        lambda t, p: log,
        lambda part, ts: None,
        clock=clock,
        dead_letter_sink=sink,
    )
    mgr.start()
    return mgr, persister, clock, sink


async def until(condition: Callable[[], bool], turns: int = 500) -> None:
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def settle(turns: int = 50) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def letter(first: int, last: int, count: int, reason: DeadLetterReason) -> DeadLetter:
    return DeadLetter("g", TOPIC_ID, 0, first, last, count, reason)


def dead_lettered(mgr: SharePartitionManager) -> dict[tuple[str, str], int]:
    return mgr.metrics.partition(KEY).dead_lettered


async def test_a_rejected_run_is_copied_after_archiving_is_durable_then_archived() -> None:
    mgr, persister, _clock, sink = setup()
    await fetch(mgr)
    assert await mgr.acknowledge(KEY, "m", [(0, 2, (REJECT,))]) == (0, None)
    await until(lambda: durable(persister)[0] == 3)
    assert sink.letters == [letter(0, 2, 1, DeadLetterReason.REJECTED)]
    # The copy was written only once ARCHIVING was durable.
    assert sink.seen == [(0, [PersistedBatch(0, 2, 3, 1)])]
    await until(lambda: dead_lettered(mgr) == {("rejected", "copied"): 3})
    assert mgr.partitions[KEY].spso == 3
    mgr.stop()


async def test_without_a_dead_letter_topic_nothing_is_archiving() -> None:
    mgr, persister, _clock, sink = setup(dead_letter=False)
    await fetch(mgr)
    await mgr.acknowledge(KEY, "m", [(0, 2, (REJECT,))])
    await settle()
    assert durable(persister)[0] == 3
    assert sink.seen == [] and dead_lettered(mgr) == {}
    mgr.stop()


async def test_archiving_runs_of_an_earlier_owner_are_resumed_on_load() -> None:
    mgr, persister, _clock, sink = setup(limit=3)
    await persister.initialize_state(KEY, 0, 0)
    await persister.write_state(
        KEY, 0, 0, 0, [PersistedBatch(0, 1, 3, 3), PersistedBatch(2, 2, 3, 1)]
    )
    fetched = await fetch(mgr)
    assert fetched.acquired[0].first_offset == 3  # never acquired
    await until(lambda: durable(persister)[0] == 3)
    assert sink.letters == [
        letter(0, 1, 3, DeadLetterReason.DELIVERY_LIMIT),
        letter(2, 2, 1, DeadLetterReason.REJECTED),
    ]
    expected = {("delivery_limit", "copied"): 2, ("rejected", "copied"): 1}
    await until(lambda: dead_lettered(mgr) == expected)
    mgr.stop()


async def test_a_retriable_failure_is_retried_with_backoff_on_the_clock() -> None:
    mgr, persister, clock, sink = setup()
    sink.failures = [DeadLetterRetriable("leader moved"), DeadLetterRetriable("leader moved")]
    await fetch(mgr)
    await mgr.acknowledge(KEY, "m", [(0, 0, (REJECT,))])
    await until(lambda: len(sink.seen) == 1)
    await settle()
    assert durable(persister) == (0, [PersistedBatch(0, 0, 3, 1)])
    clock.advance(RETRY_BACKOFF_MS - 1)
    await settle()
    assert len(sink.seen) == 1  # not before the backoff
    clock.advance(1)
    await until(lambda: len(sink.seen) == 2)
    await settle()
    clock.advance(2 * RETRY_BACKOFF_MS - 1)
    await settle()
    assert len(sink.seen) == 2  # the backoff doubled
    clock.advance(1)
    await until(lambda: durable(persister)[0] == 1)
    assert sink.letters == [letter(0, 0, 1, DeadLetterReason.REJECTED)]
    await until(lambda: dead_lettered(mgr) == {("rejected", "copied"): 1})
    mgr.stop()


async def test_a_refusal_archives_without_a_copy_and_says_why() -> None:
    mgr, persister, _clock, sink = setup()
    sink.failures = [DeadLetterRefused("topic dlq.t lacks errors.deadletterqueue.group.enable")]
    await fetch(mgr)
    with capture_logs() as logs:
        await mgr.acknowledge(KEY, "m", [(0, 1, (REJECT,))])
        await until(lambda: durable(persister)[0] == 2)
    assert sink.letters == []
    await until(lambda: dead_lettered(mgr) == {("rejected", "not_copied"): 2})
    refused = [e for e in logs if e["event"] == "dead_letter_archived_uncopied"]
    assert refused and "group.enable" in refused[0]["reason"]
    assert refused[0]["log_level"] == "warning"
    mgr.stop()


async def test_the_refusing_sink_of_a_broker_without_a_writer_drains_archiving() -> None:
    [outcome] = await RefusingSink("no dead-letter writer in this broker").write_all(
        [letter(0, 0, 1, DeadLetterReason.REJECTED)]
    )
    assert isinstance(outcome, DeadLetterRefused)
    assert "no dead-letter writer" in str(outcome)


async def test_unloaded_mid_copy_stops_and_the_next_load_copies_again() -> None:
    mgr, persister, _clock, sink = setup()
    await fetch(mgr)
    sink.gate = asyncio.Event()
    await mgr.acknowledge(KEY, "m", [(0, 1, (REJECT,))])
    await until(lambda: sink.in_flight == 1)
    assert mgr.drop_partition(TOPIC_ID, 0, "leader moved") == 1
    sink.gate.set()
    await settle()
    # The copy was made, but the partition is gone: the run stays ARCHIVING, durably.
    assert len(sink.letters) == 1
    assert durable(persister) == (0, [PersistedBatch(0, 1, 3, 1)])
    assert dead_lettered(mgr) == {}
    await fetch(mgr)  # loaded again: resumed, copied again (a duplicate the KIP allows)
    await until(lambda: durable(persister)[0] == 2)
    assert sink.letters == [letter(0, 1, 1, DeadLetterReason.REJECTED)] * 2
    await until(lambda: dead_lettered(mgr) == {("rejected", "copied"): 2})
    mgr.stop()


async def test_a_failed_archived_write_stays_archiving_and_is_retried_without_a_new_copy() -> None:
    mgr, persister, clock, sink = setup()
    await fetch(mgr)
    persister.fail_next(STORAGE, after_successes=1)  # the ack's write succeeds, then fails
    await mgr.acknowledge(KEY, "m", [(0, 0, (REJECT,))])
    await until(lambda: len(sink.letters) == 1)
    await settle()
    sp = mgr.partitions[KEY]
    assert sp.record_state(0) is not None and sp.record_state(0).state is G  # type: ignore[union-attr]
    assert durable(persister) == (0, [PersistedBatch(0, 0, 3, 1)])
    clock.advance(RETRY_BACKOFF_MS)
    await until(lambda: durable(persister)[0] == 1)
    assert len(sink.letters) == 1
    await until(lambda: dead_lettered(mgr) == {("rejected", "copied"): 1})
    mgr.stop()


@pytest.mark.parametrize("letters_per_write", [1, 3, LETTERS_PER_WRITE])
async def test_many_acknowledgements_at_once_are_each_copied_once(letters_per_write: int) -> None:
    mgr, persister, _clock, sink = setup()
    mgr.dead_letters.letters_per_write = letters_per_write
    await fetch(mgr)
    sink.gate = asyncio.Event()
    assert await mgr.acknowledge(KEY, "m", [(0, 0, (REJECT,))]) == (0, None)
    await until(lambda: sink.in_flight == 1)
    # While the first copy is being written, nine acknowledgements at once: four runs.
    results = await asyncio.gather(
        *(mgr.acknowledge(KEY, "m", [(o, o, (REJECT if o % 2 == 0 else 1,))]) for o in range(1, 10))
    )
    assert all(r == (0, None) for r in results)
    await settle()
    assert sink.in_flight == 1  # one task per partition: the others wait for its take
    sink.gate.set()
    await until(lambda: durable(persister)[0] == 10)
    # The four were taken together and written in one write each up to the bound, one
    # write after the other.
    assert sink.most_in_flight == 1
    sizes = [len(w) for w in sink.writes[1:]]
    assert sizes == {1: [1, 1, 1, 1], 3: [3, 1]}.get(letters_per_write, [4])
    copied = sorted(o for x in sink.letters for o in range(x.first_offset, x.last_offset + 1))
    assert copied == [0, 2, 4, 6, 8]  # each exactly once
    await until(lambda: dead_lettered(mgr) == {("rejected", "copied"): 5})
    await until(lambda: not mgr.dead_letters.busy(KEY))  # the task ends: nothing is left
    mgr.stop()


async def test_the_delivery_limit_at_a_lock_timeout_is_dead_lettered() -> None:
    mgr, persister, clock, sink = setup(limit=2)
    lock_ms = mgr.groups.config("g").record_lock_duration_ms
    await fetch(mgr)
    clock.advance(lock_ms)
    await until(lambda: durable(persister)[1] == [PersistedBatch(0, 9, 0, 1)])
    await settle()
    fetched = await fetch(mgr)  # delivery 2 of 2
    assert [r.delivery_count for r in fetched.acquired] == [2]
    clock.advance(lock_ms)
    await until(lambda: durable(persister)[0] == 10)
    assert sink.letters == [letter(0, 9, 2, DeadLetterReason.DELIVERY_LIMIT)]
    await until(lambda: dead_lettered(mgr) == {("delivery_limit", "copied"): 10})
    mgr.stop()


async def test_the_runs_of_one_take_are_archived_with_one_write() -> None:
    mgr, persister, _clock, sink = setup()
    await fetch(mgr)
    types = tuple(REJECT if o % 2 == 0 else 1 for o in range(6))  # reject 0, 2, 4
    assert await mgr.acknowledge(KEY, "m", [(0, 5, types)]) == (0, None)
    writes = persister.writes
    await until(lambda: durable(persister)[0] == 6)
    assert [x.first_offset for x in sink.letters] == [0, 2, 4]
    assert persister.writes == writes + 1
    await until(lambda: dead_lettered(mgr) == {("rejected", "copied"): 3})
    mgr.stop()


async def test_what_is_copied_is_archived_before_backing_off_on_a_failing_copy() -> None:
    mgr, persister, clock, sink = setup()
    await fetch(mgr)
    # One write of both runs: 0 is copied, 2 fails retriably.
    sink.failures = [None, DeadLetterRetriable("database down")]
    await mgr.acknowledge(KEY, "m", [(0, 2, (REJECT, 1, REJECT))])
    await until(lambda: durable(persister)[0] == 2)  # 0 archived, 2 still ARCHIVING
    assert durable(persister)[1] == [PersistedBatch(2, 2, 3, 1)]
    await settle()
    clock.advance(RETRY_BACKOFF_MS)
    await until(lambda: durable(persister)[0] == 3)
    assert [x.first_offset for x in sink.letters] == [0, 2]
    mgr.stop()


async def test_a_run_with_no_record_left_to_copy_counts_as_not_copied() -> None:
    mgr, persister, _clock, sink = setup()
    sink.nothing_left = True
    await fetch(mgr)
    await mgr.acknowledge(KEY, "m", [(0, 1, (REJECT,))])
    await until(lambda: durable(persister)[0] == 2)
    await until(lambda: dead_lettered(mgr) == {("rejected", "not_copied"): 2})
    mgr.stop()


async def test_a_writer_task_that_fails_gives_its_runs_back_for_the_next_one() -> None:
    """A bug in the writer (here: the archive step raising) ends its task; the runs it had
    taken are handed out again to the next task, not left ARCHIVING for good."""
    mgr, persister, _clock, sink = setup()
    await fetch(mgr)
    sp = mgr.partitions[KEY]
    real = sp.archive_dead_letters
    calls = 0

    def broken_once(spans: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        return real(spans)

    sp.archive_dead_letters = broken_once  # type: ignore[method-assign]
    await mgr.acknowledge(KEY, "m", [(0, 0, (REJECT,))])
    await until(lambda: calls == 1 and not mgr.dead_letters.busy(KEY))
    assert durable(persister) == (0, [PersistedBatch(0, 0, 3, 1)])
    mgr.dead_letters.poke(KEY, sp)  # as the next committed change of the partition does
    await until(lambda: durable(persister)[0] == 1)
    assert [x.first_offset for x in sink.letters] == [0, 0]  # copied again, then archived
    mgr.stop()


class HoldingPersister(FlakyPersister):
    """Once `hold_next` is set, holds the next write at `gate_next` (and only it)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_next = False
        self.held = False
        self.gate_next = asyncio.Event()

    async def write_state(self, key: ShareStateKey, *args: Any, **kwargs: Any) -> None:
        if self.hold_next:
            self.hold_next, self.held = False, True
            await self.gate_next.wait()
        await super().write_state(key, *args, **kwargs)


async def test_the_next_take_is_copied_while_the_last_one_is_archived() -> None:
    persister = HoldingPersister()
    sink = FakeSink(persister)
    mgr = SharePartitionManager(
        persister,
        Groups(persister, dead_letter=True),
        lambda t, p: FakeLog(),
        lambda part, ts: None,
        clock=ManualClock(),
        dead_letter_sink=sink,
    )
    mgr.start()
    await fetch(mgr)
    sink.gate = asyncio.Event()
    assert await mgr.acknowledge(KEY, "m", [(0, 0, (REJECT,))]) == (0, None)
    await until(lambda: sink.in_flight == 1)
    assert await mgr.acknowledge(KEY, "m", [(2, 2, (REJECT,))]) == (0, None)
    persister.hold_next = True  # the next write: offset 0's ARCHIVED, once copied
    sink.gate.set()
    # Offset 0's ARCHIVED write is held; offset 2 is copied meanwhile, not after it.
    await until(lambda: len(sink.letters) == 2)
    assert [x.first_offset for x in sink.letters] == [0, 2]
    assert persister.held
    assert durable(persister)[0] == 0  # SPSO still at 0: offset 0 not archived yet
    persister.gate_next.set()
    await until(lambda: dead_lettered(mgr) == {("rejected", "copied"): 2})
    await until(lambda: not mgr.dead_letters.busy(KEY))
    # Both archived: SPSO past 0; offset 2 ARCHIVED behind the still acquired 1.
    spso, batches = durable(persister)
    assert spso == 1
    assert (2, 2, int(RecordState.ARCHIVED)) in [
        (b.first_offset, b.last_offset, b.delivery_state) for b in batches
    ]
    mgr.stop()
