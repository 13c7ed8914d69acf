"""A broker killed while a transaction is being completed: the PrepareCommit or
PrepareAbort record is durable and only some of the partitions have their marker.

In process, over a real data dir: the partition logs, the transaction log and the
marker writer the broker uses. The crash point is a marker writer that gets through
`written` partitions and then stops, as a process killed there would; the files are
then closed without the clean-shutdown marker and everything is opened again. The
restarted coordinator must finish the transaction the way it was decided, and a
read_committed reader must see exactly that outcome on every partition."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.handlers.produce_fetch import _fetch_once, _Wanted
from broker.handlers.transactions import marker_writer
from broker.partitions import LogManager, Partition, validate_produce_data
from coordinator.transactions import S, TopicPartition, TransactionCoordinator
from persister.commit import GroupCommit
from persister.coordinator_log import RecordLog
from protocol.records import NewRecord, build_batch, decode_records, iter_batches
from tests.unit import test_commit

TOPIC = "payments"
PARTITIONS = 3
TID = "txn-crash"
TIMEOUT_MS = 60_000


class Crash(Exception):
    """The process died here."""


class Node:
    """One broker's transaction pieces on `data`: partition logs and the coordinator."""

    def __init__(
        self, data: Path, commit: GroupCommit, topic_id: uuid.UUID, crash_after: int | None
    ) -> None:
        self.topic_id = topic_id
        self.logs = LogManager(data / "logs", BrokerConfig({}), commit)
        self.logs.open_topic(TOPIC, topic_id, PARTITIONS, {})
        self.record_log = RecordLog(data / "transactions", commit)
        write = marker_writer(self.logs)
        ids = itertools.count(5000)

        async def allocate() -> int:
            return next(ids)

        async def markers(
            producer_id: int, producer_epoch: int, commit: bool, tps: frozenset[TopicPartition]
        ) -> None:
            if crash_after is None:
                await write(producer_id, producer_epoch, commit, tps)
                return
            # Partitions in the writer's order; those before the crash point are durable.
            done = frozenset(sorted(tps)[:crash_after])
            await write(producer_id, producer_epoch, commit, done)
            raise Crash(f"killed after {len(done)} of {len(tps)} markers")

        self.coord = TransactionCoordinator(
            self.record_log, allocate_producer_id=allocate, markers=markers
        )
        self.coord.load()

    def part(self, index: int) -> Partition:
        part = self.logs.get(TOPIC, index)
        assert part is not None
        return part

    async def kill9(self) -> None:
        """Stop every task, then close the files without the clean-shutdown marker."""
        await self.coord.stop()
        for part in self.logs:
            part.log.close(clean=False)
        self.record_log.log.close(clean=False)

    async def close(self) -> None:
        await self.coord.stop()
        await self.logs.flush_all()
        self.logs.close()
        self.coord.close()

    def read_committed(self, index: int) -> list[bytes]:
        """What a read_committed consumer keeps of the partition: the batches up to the
        LSO, without those of the aborted transactions Fetch lists."""
        wanted = [_Wanted(TOPIC, self.topic_id, index, 0, 1 << 20)]
        by_topic, _, errors = _fetch_once(self.logs, 1 << 20, wanted, True)
        assert not errors
        [[entry]] = by_topic.values()
        aborted = {a.producer_id: a.first_offset for a in entry.aborted_transactions or ()}
        values = []
        for pos, header in iter_batches(entry.records or b""):
            start = aborted.get(header.producer_id)
            if header.is_control:
                if start is not None and header.base_offset >= start:
                    del aborted[header.producer_id]
                continue
            if header.is_transactional and start is not None and header.base_offset >= start:
                continue
            values += [r.value or b"" for r in decode_records(entry.records or b"", pos, header)]
        return values


# A started GroupCommit, stopped after the test.
commit = test_commit.commit


async def produce_in_txn(node: Node, pid: int, epoch: int) -> dict[int, list[bytes]]:
    await node.coord.add_partitions(TID, pid, epoch, [(TOPIC, p) for p in range(PARTITIONS)])
    sent = {}
    for p in range(PARTITIONS):
        values = [f"p{p}-{i}".encode() for i in range(3)]
        batch = build_batch(
            [NewRecord(None, v) for v in values],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            is_transactional=True,
        )
        data, batches = validate_produce_data(batch)
        part = node.part(p)
        outcome = part.append(data, batches)
        await part.wait_durable(outcome.last_offset, 10)
        sent[p] = values
    return sent


@pytest.mark.parametrize(
    "written", [0, 1, PARTITIONS], ids=["no-marker", "one-marker", "all-markers"]
)
@pytest.mark.parametrize("commit_txn", [True, False], ids=["commit", "abort"])
async def test_a_restart_completes_a_transaction_killed_while_its_markers_were_written(
    tmp_path: Path, commit: GroupCommit, commit_txn: bool, written: int
) -> None:
    topic_id = uuid.uuid4()
    node = Node(tmp_path, commit, topic_id, crash_after=written)
    pid, epoch = await node.coord.init_producer_id(TID, TIMEOUT_MS)
    sent = await produce_in_txn(node, pid, epoch)
    with pytest.raises(Crash):
        await node.coord.end_txn(TID, pid, epoch, commit_txn)
    prepared = node.coord.get(TID)
    assert prepared is not None
    assert prepared.state == (S.PREPARE_COMMIT if commit_txn else S.PREPARE_ABORT)
    # Before the restart: the partitions with a marker are stable, the others are not.
    for p in range(PARTITIONS):
        part = node.part(p)
        assert (part.last_stable_offset == part.high_watermark) == (p < written)
    await node.kill9()

    node = Node(tmp_path, commit, topic_id, crash_after=None)
    try:
        assert node.coord.get(TID) == prepared  # in doubt after replay
        node.coord.start()
        assert TID in node.coord._completing  # start() drives the in-doubt transaction
        done = S.COMPLETE_COMMIT if commit_txn else S.COMPLETE_ABORT
        # A second caller gets the running task: wait for it.
        await node.coord.complete_in_background(TID)
        assert node.coord.get(TID).state == done  # type: ignore[union-attr]
        for p in range(PARTITIONS):
            part = node.part(p)
            assert part.last_stable_offset == part.high_watermark
            assert node.read_committed(p) == (sent[p] if commit_txn else [])
        # The producer goes on with its next transaction at the same epoch.
        await node.coord.add_partitions(TID, pid, epoch, [(TOPIC, 0)])
    finally:
        await node.close()
    # And the outcome is durable: opened again, nothing is in doubt.
    node = Node(tmp_path, commit, topic_id, crash_after=None)
    try:
        again = node.coord.get(TID)
        assert again is not None and again.state == S.ONGOING and again.producer_id == pid
        for p in range(PARTITIONS):
            assert node.read_committed(p) == (sent[p] if commit_txn else [])
    finally:
        await node.close()
