"""The produce-side verification guard (Kafka's KIP-890 part 1): a transactional batch
is appended only for a partition in its producer's ongoing transaction, at the current
epoch. Driven through the Produce handler over a real LogManager in a temp dir, so the
tests see what the client is answered and that the log is left as it was."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER, Authorizer
from broker.cluster import ClusterView
from broker.config import BrokerConfig
from broker.handlers.produce_fetch import produce
from broker.partitions import LogManager, Partition
from broker.share.remote_persister import Target
from broker.txn_markers import ProduceVerifier
from coordinator.transactions import S, TransactionCoordinator
from persister.commit import GroupCommit
from persister.coordinator_log import MemoryRecordLog
from protocol import api
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.unit.cluster_fakes import alone

TOPIC = "orders"
TID = "txn-produce"
TIMEOUT_MS = 60_000


class _NoTransport:
    """The broker alone leads the transactions log: nothing is ever sent."""

    async def send(self, target: Target, api_key: int, version: int, body: Any) -> Any:
        raise AssertionError("a broker alone verifies locally")

    async def close(self) -> None:
        return None


NO_TRANSPORT = _NoTransport()


@dataclass
class Setup:
    logs: LogManager
    transactions: TransactionCoordinator
    metadata: Any
    authorizer: Authorizer = NO_AUTHORIZER
    cluster: ClusterView = field(default_factory=alone)

    @property
    def txn_verifier(self) -> ProduceVerifier:
        return ProduceVerifier(
            lambda: self.transactions, lambda: self.cluster, NO_TRANSPORT, listener="PLAINTEXT"
        )

    def part(self, index: int) -> Partition:
        part = self.logs.get(TOPIC, index)
        assert part is not None
        return part


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    commit = GroupCommit()
    commit.start()
    topic_id = uuid.uuid4()
    logs = LogManager(tmp_path, BrokerConfig({}), commit)
    logs.open_topic(TOPIC, topic_id, 2, {})
    ids = iter(range(7000, 8000))

    async def allocate() -> int:
        return next(ids)

    transactions = TransactionCoordinator(MemoryRecordLog(), allocate_producer_id=allocate)
    topic = SimpleNamespace(name=TOPIC, topic_id=topic_id, partitions=2)
    metadata = SimpleNamespace(
        state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={topic_id: topic})
    )
    try:
        yield Setup(logs, transactions, metadata)
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()


def transactional_batch(pid: int, epoch: int, seq: int = 0) -> bytes:
    return build_batch(
        [NewRecord(None, b"in-txn"), NewRecord(None, b"in-txn-2")],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
    )


async def send(
    s: Setup, version: int, partition: int, records: bytes, transactional_id: str | None = TID
) -> dict[str, Any]:
    """One Produce request (acks=all) for one partition; its partition response."""
    req = api.build(
        api.request_class(0, version),
        {
            "transactional_id": transactional_id,
            "acks": -1,
            "timeout": 5_000,
            "topic_data": [
                {
                    "name": TOPIC,
                    "topic_id": s.metadata.state.topics[TOPIC].topic_id,
                    "partition_data": [{"index": partition, "records": records}],
                }
            ],
        },
    )
    ctx = SimpleNamespace(
        api_version=version, header=SimpleNamespace(client_id="unit"), listener="PLAINTEXT"
    )
    answer = await produce(ctx, req, s)  # type: ignore[arg-type]
    assert answer is not None
    [topic] = answer.responses
    [entry] = topic.partition_responses
    return entry


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (10, ErrorCode.invalid_txn_state),
        (11, ErrorCode.transaction_abortable),
        (13, ErrorCode.transaction_abortable),
    ],
)
async def test_a_batch_for_a_partition_outside_the_transaction_is_refused_and_not_appended(
    setup: Setup, version: int, expected: ErrorCode
) -> None:
    pid, epoch = await setup.transactions.init_producer_id(TID, TIMEOUT_MS)
    await setup.transactions.add_partitions(TID, pid, epoch, [(TOPIC, 0)])
    entry = await send(setup, version, 1, transactional_batch(pid, epoch))
    assert entry.error_code == expected
    assert "not part of its ongoing transaction" in entry.error_message
    assert entry.base_offset == -1
    outside = setup.part(1)
    assert (outside.log_end_offset, outside.high_watermark) == (0, 0)
    assert outside.producers.entry(pid) is None
    assert outside.last_stable_offset == 0
    # The partition in the transaction takes the same batch.
    inside = await send(setup, version, 0, transactional_batch(pid, epoch))
    assert (inside.error_code, inside.base_offset) == (ErrorCode.none, 0)
    assert setup.part(0).log_end_offset == 2 and setup.part(0).last_stable_offset == 0


@pytest.mark.parametrize("version", [3, 10, 11])
async def test_a_batch_from_a_fenced_epoch_is_invalid_producer_epoch_and_not_appended(
    setup: Setup, version: int
) -> None:
    pid, old_epoch = await setup.transactions.init_producer_id(TID, TIMEOUT_MS)
    # A second producer instance with the same transactional id bumps the epoch and
    # adds the partition; the first one's batch arrives afterwards.
    _, epoch = await setup.transactions.init_producer_id(TID, TIMEOUT_MS)
    await setup.transactions.add_partitions(TID, pid, epoch, [(TOPIC, 0)])
    entry = await send(setup, version, 0, transactional_batch(pid, old_epoch))
    assert entry.error_code == ErrorCode.invalid_producer_epoch
    assert "fenced epoch" in entry.error_message
    part = setup.part(0)
    assert (part.log_end_offset, part.high_watermark) == (0, 0)
    assert part.producers.entry(pid) is None


async def test_a_transactional_batch_without_a_transactional_id_is_refused(
    setup: Setup,
) -> None:
    pid, epoch = await setup.transactions.init_producer_id(TID, TIMEOUT_MS)
    await setup.transactions.add_partitions(TID, pid, epoch, [(TOPIC, 0)])
    entry = await send(setup, 11, 0, transactional_batch(pid, epoch), transactional_id=None)
    assert entry.error_code == ErrorCode.transactional_id_authorization_failed
    assert setup.part(0).log_end_offset == 0


async def test_a_batch_while_its_transaction_completes_is_concurrent_transactions(
    setup: Setup,
) -> None:
    pid, epoch = await setup.transactions.init_producer_id(TID, TIMEOUT_MS)
    await setup.transactions.add_partitions(TID, pid, epoch, [(TOPIC, 0)])
    m = setup.transactions.get(TID)
    assert m is not None
    setup.transactions.transactions[TID] = m.transit(S.PREPARE_COMMIT)
    entry = await send(setup, 11, 0, transactional_batch(pid, epoch))
    assert entry.error_code == ErrorCode.concurrent_transactions
    assert setup.part(0).log_end_offset == 0
