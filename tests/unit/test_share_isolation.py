"""The share-partition leader under share.isolation.level (KIP-932), sans-IO.

A fake partition log holds real record batches (transactional data and COMMIT/ABORT
control batches) with Kafka's LSO and aborted-transaction rules; the manager runs on an
in-memory share coordinator and a ManualClock. read_committed acquires only below the
LSO and archives the batches of aborted transactions and every control batch as gaps;
read_uncommitted delivers every data record and never a control record; the archived
gaps are what the share coordinator stores, so a reload never delivers them.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from broker.share.manager import FetchedPartition, SharePartitionManager
from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.clock import ManualClock
from persister.txn_index import AbortedTxn
from protocol.records import NewRecord, build_batch, build_end_txn_marker_batch, iter_batches
from tests.unit.test_share_manager import FakeGroups

TOPIC_ID = uuid.uuid4()
KEY = ShareStateKey("g", TOPIC_ID, 0)
ACCEPT = 1
ARCHIVED = 4
LOCK_MS = 30_000


class TxnLog:
    """A partition log in memory: offsets, HW, LSO and the aborted-transaction index as a
    topic partition keeps them (every append durable at once)."""

    topic = "t"
    index = 0
    log_start_offset = 0

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.next_offset = 0
        self.open: dict[int, int] = {}  # producer id -> first offset of its transaction
        self.aborted: list[AbortedTxn] = []

    @property
    def high_watermark(self) -> int:
        return self.next_offset

    @property
    def last_stable_offset(self) -> int:
        return min([*self.open.values(), self.high_watermark])

    @property
    def log_end_offset(self) -> int:
        return self.next_offset

    async def wait_durable(
        self, last_offset: int, timeout_s: float, *, delivery: bool = False
    ) -> None:
        assert last_offset < self.high_watermark  # every append is durable at once

    def data(self, count: int, *, pid: int = -1) -> tuple[int, int]:
        """Append `count` records, transactional when `pid` is given."""
        first = self.next_offset
        self.batches.append(
            build_batch(
                [NewRecord(None, f"r{first + i}".encode()) for i in range(count)],
                base_offset=first,
                producer_id=pid,
                producer_epoch=0 if pid >= 0 else -1,
                is_transactional=pid >= 0,
            )
        )
        if pid >= 0:
            self.open.setdefault(pid, first)
        self.next_offset += count
        return first, first + count - 1

    def end(self, pid: int, *, commit: bool) -> int:
        offset = self.next_offset
        self.batches.append(
            build_end_txn_marker_batch(
                producer_id=pid,
                producer_epoch=0,
                commit=commit,
                coordinator_epoch=0,
                timestamp=0,
                base_offset=offset,
            )
        )
        self.next_offset += 1
        first = self.open.pop(pid)
        if not commit:
            self.aborted.append(AbortedTxn(pid, first, offset, self.last_stable_offset))
        return offset

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        committed_only: bool = False,
        beyond_high_watermark: bool = False,
    ) -> bytes:
        upper = self.last_stable_offset if committed_only else self.high_watermark
        out = b""
        for batch in self.batches:
            (_, header), *_ = iter_batches(batch)
            if header.last_offset >= offset and header.base_offset < upper:
                out += batch
        return out

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        return [
            txn
            for txn in self.aborted
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound
        ]


class Groups(FakeGroups):
    """The group configs of test_share_manager, with share.isolation.level to switch."""

    def __init__(self, persister: InMemoryPersister, isolation: str) -> None:
        super().__init__(persister, delivery_count_limit=5)
        self.set_isolation(isolation)

    def set_isolation(self, isolation: str) -> None:
        self.group_config = replace(self.group_config, isolation_level=isolation)  # type: ignore[arg-type]


def manager(
    log: TxnLog, isolation: str, persister: InMemoryPersister | None = None
) -> tuple[SharePartitionManager, InMemoryPersister, Groups, ManualClock]:
    persister = persister or InMemoryPersister()
    groups = Groups(persister, isolation)
    clock = ManualClock()
    mgr = SharePartitionManager(
        persister, groups, lambda t, p: log, lambda part, ts: None, clock=clock
    )
    return mgr, persister, groups, clock


async def fetch(mgr: SharePartitionManager, member: str = "m") -> FetchedPartition:
    return await mgr.acquire(KEY, member, max_records=1_000, batch_size=1_000, max_bytes=1 << 20)


def offsets(fetched: FetchedPartition) -> list[int]:
    return [o for r in fetched.acquired for o in range(r.first_offset, r.last_offset + 1)]


def delivered_values(fetched: FetchedPartition) -> list[bytes | None]:
    """The data records of the returned batches that the member acquired."""
    from protocol.records import decode_records

    wanted = set(offsets(fetched))
    values = []
    for pos, header in iter_batches(fetched.records):
        assert not header.is_control, "a control batch was handed to a share consumer"
        values += [
            r.value for r in decode_records(fetched.records, pos, header) if r.offset in wanted
        ]
    return values


def interleaved() -> TxnLog:
    """Two producers' transactions interleaved with plain data:
    0-1 pid 1 (aborted) | 2-3 pid 2 (committed) | 4 pid 1 ABORT | 5 plain | 6 pid 2 COMMIT
    | 7-8 pid 1 (aborted) | 9 pid 1 ABORT | 10 plain."""
    log = TxnLog()
    log.data(2, pid=1)
    log.data(2, pid=2)
    log.end(1, commit=False)
    log.data(1)
    log.end(2, commit=True)
    log.data(2, pid=1)
    log.end(1, commit=False)
    log.data(1)
    return log


def durable(persister: InMemoryPersister) -> tuple[int, list[PersistedBatch]]:
    state = persister.shard.state(KEY)
    assert state is not None
    return state.start_offset, list(state.batches)


async def test_read_committed_gets_committed_records_once_and_archives_the_rest() -> None:
    log = interleaved()
    mgr, persister, _, clock = manager(log, "read_committed")
    fetched = await fetch(mgr)
    assert offsets(fetched) == [2, 3, 5, 10]
    assert delivered_values(fetched) == [b"r2", b"r3", b"r5", b"r10"]
    # The aborted records at the front are done: SPSO moved over them. The markers and
    # the second aborted transaction are stored ARCHIVED, so no reload delivers them.
    spso, batches = durable(persister)
    assert spso == 2
    archived = sorted(
        (b.first_offset, b.last_offset) for b in batches if b.delivery_state == ARCHIVED
    )
    assert archived == [(4, 4), (6, 9)]
    # Lock timeout: the same committed records come back, nothing else.
    clock.advance(LOCK_MS)
    await mgr.settle()
    again = await fetch(mgr, "m2")
    assert offsets(again) == [2, 3, 5, 10]
    assert {r.delivery_count for r in again.acquired} == {2}
    code, _ = await mgr.acknowledge(KEY, "m2", [(2, 10, (ACCEPT,))])
    assert code.name == "invalid_record_state"  # 4 and 6-9 were never acquired
    for first, last in [(2, 3), (5, 5), (10, 10)]:
        code, _ = await mgr.acknowledge(KEY, "m2", [(first, last, (ACCEPT,))])
        assert code.name == "none"
    assert durable(persister) == (11, [])
    assert offsets(await fetch(mgr)) == []
    mgr.stop()


async def test_a_reloaded_read_committed_partition_never_delivers_archived_records() -> None:
    log = interleaved()
    mgr, persister, _, _ = manager(log, "read_committed")
    assert offsets(await fetch(mgr)) == [2, 3, 5, 10]
    mgr.stop()
    # A new leader reads the stored state: the acquisitions come back as available.
    reloaded, _, _, _ = manager(log, "read_committed", persister)
    assert offsets(await fetch(reloaded)) == [2, 3, 5, 10]
    reloaded.stop()


async def test_read_uncommitted_delivers_every_data_record_and_no_marker() -> None:
    log = interleaved()
    mgr, persister, _, _ = manager(log, "read_uncommitted")
    fetched = await fetch(mgr)
    assert offsets(fetched) == [0, 1, 2, 3, 5, 7, 8, 10]
    assert len(delivered_values(fetched)) == 8
    _, batches = durable(persister)
    assert sorted(
        (b.first_offset, b.last_offset) for b in batches if b.delivery_state == ARCHIVED
    ) == [(4, 4), (6, 6), (9, 9)]
    mgr.stop()


async def test_an_open_transaction_holds_read_committed_back_until_it_ends() -> None:
    log = TxnLog()
    log.data(2, pid=1)  # 0-1, open
    log.data(1)  # 2
    mgr, _, _, _ = manager(log, "read_committed")
    assert offsets(await fetch(mgr)) == []  # the LSO is 0
    log.end(1, commit=True)  # 3
    assert offsets(await fetch(mgr)) == [0, 1, 2]
    log.data(1, pid=1)  # 4, open again
    log.data(1)  # 5
    assert offsets(await fetch(mgr)) == []
    log.end(1, commit=False)  # 6
    assert offsets(await fetch(mgr)) == [5]
    mgr.stop()


async def test_switching_a_live_group_to_read_committed_takes_effect_on_the_next_fetch() -> None:
    log = TxnLog()
    log.data(1)  # 0
    mgr, _, groups, _ = manager(log, "read_uncommitted")
    assert offsets(await fetch(mgr)) == [0]
    assert KEY in mgr.partitions  # loaded: the change must reach the live partition
    log.data(2, pid=1)  # 1-2
    log.end(1, commit=False)  # 3
    log.data(1)  # 4
    log.data(1, pid=2)  # 5, open
    groups.set_isolation("read_committed")
    assert offsets(await fetch(mgr)) == [4]
    groups.set_isolation("read_uncommitted")
    assert offsets(await fetch(mgr)) == [5]
    mgr.stop()
