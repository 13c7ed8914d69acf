"""A small transactional client for the admin tools: Fetch (read_committed), Produce in
a transaction, and the transaction's requests, spoken with kio entities through the
admin client's connections (`protocol.admin.AdminClient`).

It does what Kafka's consume-transform-produce loop does with a transactional producer
(KIP-98, KIP-447) and no consumer group membership: InitProducerId with a
transactional id (which fences an older instance and aborts its open transaction),
AddPartitionsToTxn, Produce with transactional batches numbered per partition from
sequence 0 of the epoch, AddOffsetsToTxn + TxnOffsetCommit for the offsets read (as an
admin commit: generation -1, no member), and EndTxn. The coordinator lookups
(FindCoordinator, key type GROUP or TRANSACTION) retry NOT_COORDINATOR,
COORDINATOR_LOAD_IN_PROGRESS and COORDINATOR_NOT_AVAILABLE, and the transaction
requests also CONCURRENT_TRANSACTIONS (the markers of the transaction before are still
being written), with backoff until the call's timeout. Any other failure is an
`AdminError` with Kafka's error name and message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from protocol.admin import (
    CLIENT_VERSIONS,
    FIND_COORDINATOR,
    OFFSET_FETCH,
    AdminClient,
    AdminError,
    Node,
    _Connection,
    _Retry,
    check,
)
from protocol.errors import CorruptRecordError, ErrorCode
from protocol.records import (
    NewRecord,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    read_end_txn_marker,
)

T = TypeVar("T")

PRODUCE, FETCH = 0, 1
INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 22, 24, 25, 26
TXN_OFFSET_COMMIT = 28
KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION = 0, 1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1

TXN_VERSIONS: dict[int, tuple[int, int]] = {
    **CLIENT_VERSIONS,
    PRODUCE: (3, 9),  # v3+: the transactional id
    FETCH: (4, 12),  # v4+: isolation level and aborted transactions; v13 names topic ids
    OFFSET_FETCH: (8, 9),
    INIT_PRODUCER_ID: (0, 4),
    ADD_PARTITIONS_TO_TXN: (0, 3),  # v4+ is the brokers' batched form
    ADD_OFFSETS_TO_TXN: (0, 3),
    TXN_OFFSET_COMMIT: (0, 3),  # v3+: generation and member (-1 and "": an admin commit)
    END_TXN: (0, 4),  # v5 means transaction.version 2 (KIP-890)
}
TXN_RETRY = frozenset(
    {
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.concurrent_transactions,
    }
)


@dataclass(frozen=True, slots=True)
class Fetched:
    """One partition's Fetch answer: the committed data records at or after the fetch
    offset, and `next_offset`, the offset after the last batch the answer held (control
    and aborted batches count: they are read past)."""

    records: tuple[Record, ...]
    next_offset: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    producer_id: int
    producer_epoch: int


def committed_records(
    data: bytes, fetch_offset: int, aborted: Iterable[tuple[int, int]] | None
) -> tuple[list[Record], int]:
    """The data records of a fetched partition a read_committed consumer keeps, and the
    offset after the last whole batch (`fetch_offset` when there is none).

    As Kafka's fetcher: a transactional batch whose producer has an aborted transaction
    (`aborted`: producer id, first offset) starting at or before the batch is dropped,
    until that producer's ABORT marker; control batches are never records; records
    before `fetch_offset` (a batch read from its start) are left out. `aborted` None
    (read_uncommitted) keeps every transactional batch."""
    pending = sorted(aborted or (), key=lambda a: a[1])
    aborting: set[int] = set()
    out: list[Record] = []
    next_offset = fetch_offset
    for pos, header in iter_batches(data, validate=False):
        next_offset = max(next_offset, header.next_offset)
        while pending and pending[0][1] <= header.last_offset:
            aborting.add(pending.pop(0)[0])
        if header.is_control:
            if header.producer_id in aborting:
                for record in decode_records(data, pos, header):
                    marker = read_end_txn_marker(record)
                    if marker is not None and not marker.commit:
                        aborting.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in aborting:
            continue
        out.extend(r for r in decode_records(data, pos, header) if r.offset >= fetch_offset)
    return out, next_offset


class TxnClient(AdminClient):
    """Use as `async with await TxnClient.connect(...) as client: ...`; one transaction
    at a time (`init_producer_id`, then per transaction `add_partitions`, `produce`,
    `add_offsets`, `commit_offsets`, `end_txn`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._txn_coordinator: Node | None = None
        self._sequences: dict[tuple[str, int], int] = {}

    @staticmethod
    def _version(conn: _Connection, api_key: int) -> int:
        ours = TXN_VERSIONS[api_key]
        theirs = conn.versions.get(api_key)
        if theirs is None or max(ours[0], theirs[0]) > min(ours[1], theirs[1]):
            return AdminClient._version(conn, api_key)
        return min(ours[1], theirs[1])

    async def _find(self, key: str, key_type: int, deadline: float) -> Node:
        address = self._any_address()
        conn = await self._connection(address, deadline)
        version = self._version(conn, FIND_COORDINATOR)
        body = {"key": key, "key_type": key_type, "coordinator_keys": [key]}
        resp = await self._send(address, FIND_COORDINATOR, body, deadline)
        if version >= 4:
            (c,) = resp.coordinators
            code, message = c.error_code, c.error_message
            node = Node(int(c.node_id), c.host, int(c.port))
        else:
            code, message = resp.error_code, resp.error_message
            node = Node(int(resp.node_id), resp.host, int(resp.port))
        if code in TXN_RETRY:
            raise _Retry(code, message)
        check(code, message, f"cannot find the coordinator of {key!r}")
        return node

    async def _retrying(self, call: Callable[[float], Awaitable[T]]) -> T:
        return await self._retry_until_deadline(call, self._forget_txn_coordinator)

    def _forget_txn_coordinator(self) -> None:
        self._txn_coordinator = None

    @staticmethod
    def _check(code: ErrorCode, message: str | None, context: str) -> None:
        if code in TXN_RETRY:
            raise _Retry(code, message)
        check(code, message, context)

    async def _to_txn_coordinator(
        self, transactional_id: str, api_key: int, body: Mapping[str, Any], deadline: float
    ) -> Any:
        if self._txn_coordinator is None:
            self._txn_coordinator = await self._find(
                transactional_id, KEY_TYPE_TRANSACTION, deadline
            )
        node = self._txn_coordinator
        return await self._send((node.host, node.port), api_key, body, deadline)

    async def _to_group_coordinator(
        self, group: str, api_key: int, body: Mapping[str, Any], deadline: float
    ) -> Any:
        node = await self._find(group, KEY_TYPE_GROUP, deadline)
        return await self._send((node.host, node.port), api_key, body, deadline)

    # --- reading --------------------------------------------------------------------------

    async def committed_offsets(
        self, group: str, topic: str, partitions: Sequence[int]
    ) -> dict[int, int]:
        """OffsetFetch with require_stable: the group's committed offset per partition of
        `topic` (none: left out). A pending transactional commit is waited out
        (UNSTABLE_OFFSET_COMMIT is retried), as a read_committed consumer does."""
        wanted = [{"name": topic, "partition_indexes": list(partitions)}]

        async def call(deadline: float) -> dict[int, int]:
            body = {
                "groups": [
                    {"group_id": group, "member_id": None, "member_epoch": -1, "topics": wanted}
                ],
                "require_stable": True,
            }
            resp = await self._to_group_coordinator(group, OFFSET_FETCH, body, deadline)
            (g,) = resp.groups
            self._check(g.error_code, None, f"OffsetFetch of group {group!r}")
            out: dict[int, int] = {}
            for t in g.topics:
                for p in t.partitions:
                    if p.error_code == ErrorCode.unstable_offset_commit:
                        raise _Retry(p.error_code, "a transactional offset commit is pending")
                    check(p.error_code, None, f"OffsetFetch of {t.name}-{p.partition_index}")
                    if t.name == topic and int(p.committed_offset) >= 0:
                        out[int(p.partition_index)] = int(p.committed_offset)
            return out

        return await self._retrying(call)

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        read_committed: bool = True,
        max_bytes: int = 1 << 20,
    ) -> Fetched:
        """Fetch one partition from its leader at `offset` (no wait). OFFSET_OUT_OF_RANGE
        and every other partition error is an AdminError."""
        deadline = self._deadline()
        leader = await self._leader(topic, partition, deadline)
        body = {
            "replica_id": -1,
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": max_bytes,
            "isolation_level": READ_COMMITTED if read_committed else READ_UNCOMMITTED,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "fetch_offset": offset,
                            "partition_max_bytes": max_bytes,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
        }
        resp = await self._send((leader.host, leader.port), FETCH, body, deadline)
        check(resp.error_code, None, f"Fetch of {topic}-{partition}")
        (t,) = resp.responses
        (p,) = t.partitions
        check(p.error_code, None, f"Fetch of {topic}-{partition} at offset {offset}")
        aborted = (
            [(int(a.producer_id), int(a.first_offset)) for a in p.aborted_transactions or ()]
            if read_committed
            else None
        )
        try:
            records, next_offset = committed_records(bytes(p.records or b""), offset, aborted)
        except CorruptRecordError as exc:
            raise AdminError("CORRUPT_MESSAGE", f"{topic}-{partition}: {exc}") from None
        return Fetched(
            tuple(records),
            next_offset,
            int(p.high_watermark),
            int(p.last_stable_offset),
            int(p.log_start_offset),
        )

    async def _leader(self, topic: str, partition: int, deadline: float) -> Node:
        meta = await self._metadata([topic], deadline)
        for t in meta.topics:
            check(t.error_code, None, f"topic {t.name!r}: {t.error_code.name.upper()}")
            for p in t.partitions:
                if int(p.partition_index) == partition:
                    node = self._nodes.get(int(p.leader_id))
                    if node is None:
                        raise AdminError(
                            "LEADER_NOT_AVAILABLE", f"partition {topic}-{partition} has no leader"
                        )
                    return node
        raise AdminError(
            "UNKNOWN_TOPIC_OR_PARTITION", f"partition {topic}-{partition} does not exist"
        )

    # --- the transaction ------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, transaction_timeout_ms: int = 60_000
    ) -> ProducerIdentity:
        """InitProducerId: the producer id and a new epoch for `transactional_id`; an
        older instance is fenced and its open transaction aborted first."""

        async def call(deadline: float) -> ProducerIdentity:
            body = {
                "transactional_id": transactional_id,
                "transaction_timeout": transaction_timeout_ms,
                "producer_id": -1,
                "producer_epoch": -1,
            }
            resp = await self._to_txn_coordinator(
                transactional_id, INIT_PRODUCER_ID, body, deadline
            )
            self._check(resp.error_code, None, f"InitProducerId of {transactional_id!r}")
            return ProducerIdentity(int(resp.producer_id), int(resp.producer_epoch))

        identity = await self._retrying(call)
        self._sequences = {}
        return identity

    async def add_partitions(
        self,
        transactional_id: str,
        producer: ProducerIdentity,
        partitions: Iterable[tuple[str, int]],
    ) -> None:
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(set(partitions)):
            topics.setdefault(topic, []).append(partition)
        if not topics:
            return

        async def call(deadline: float) -> None:
            body = {
                "v3_and_below_transactional_id": transactional_id,
                "v3_and_below_producer_id": producer.producer_id,
                "v3_and_below_producer_epoch": producer.producer_epoch,
                "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
            }
            resp = await self._to_txn_coordinator(
                transactional_id, ADD_PARTITIONS_TO_TXN, body, deadline
            )
            for t in resp.results_by_topic_v3_and_below:
                for p in t.results_by_partition:
                    self._check(
                        p.partition_error_code,
                        None,
                        f"AddPartitionsToTxn of {t.name}-{p.partition_index}",
                    )

        await self._retrying(call)

    async def produce(
        self,
        transactional_id: str,
        producer: ProducerIdentity,
        records: Mapping[tuple[str, int], Sequence[NewRecord]],
        timestamp_ms: int,
    ) -> dict[tuple[str, int], int]:
        """Produce (acks=all) one transactional batch per partition, in the partition's
        next sequence numbers; the base offset each got."""
        deadline = self._deadline()
        topics = sorted({t for t, _ in records})
        meta = await self._metadata(topics, deadline)
        leaders: dict[tuple[str, int], int] = {}
        for t in meta.topics:
            check(t.error_code, None, f"topic {t.name!r}: {t.error_code.name.upper()}")
            for p in t.partitions:
                leaders[(t.name, int(p.partition_index))] = int(p.leader_id)
        by_leader: dict[int, dict[str, list[dict[str, Any]]]] = {}
        counts: dict[tuple[str, int], int] = {}
        for (topic, partition), batch in sorted(records.items()):
            if not batch:
                continue
            leader = leaders.get((topic, partition))
            if leader is None or leader not in self._nodes:
                raise AdminError(
                    "LEADER_NOT_AVAILABLE", f"partition {topic}-{partition} has no leader"
                )
            sequence = self._sequences.get((topic, partition), 0)
            data = build_batch(
                batch,
                default_timestamp=timestamp_ms,
                producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch,
                base_sequence=sequence,
                is_transactional=True,
            )
            counts[(topic, partition)] = len(batch)
            by_leader.setdefault(leader, {}).setdefault(topic, []).append(
                {"index": partition, "records": data}
            )
        out: dict[tuple[str, int], int] = {}
        for leader, data_by_topic in by_leader.items():
            node = self._nodes[leader]
            body = {
                "transactional_id": transactional_id,
                "acks": -1,
                "timeout": int(self.timeout_s * 1000),
                "topic_data": [
                    {"name": t, "partition_data": ps} for t, ps in data_by_topic.items()
                ],
            }
            resp = await self._send((node.host, node.port), PRODUCE, body, deadline)
            for t in resp.responses:
                for p in t.partition_responses:
                    check(p.error_code, p.error_message, f"Produce to {t.name}-{p.index}")
                    tp = (t.name, int(p.index))
                    self._sequences[tp] = self._sequences.get(tp, 0) + counts[tp]
                    out[tp] = int(p.base_offset)
        return out

    async def add_offsets(
        self, transactional_id: str, producer: ProducerIdentity, group: str
    ) -> None:
        async def call(deadline: float) -> None:
            body = {
                "transactional_id": transactional_id,
                "producer_id": producer.producer_id,
                "producer_epoch": producer.producer_epoch,
                "group_id": group,
            }
            resp = await self._to_txn_coordinator(
                transactional_id, ADD_OFFSETS_TO_TXN, body, deadline
            )
            self._check(resp.error_code, None, f"AddOffsetsToTxn of group {group!r}")

        await self._retrying(call)

    async def commit_offsets(
        self,
        transactional_id: str,
        producer: ProducerIdentity,
        group: str,
        offsets: Mapping[tuple[str, int], int],
    ) -> None:
        """TxnOffsetCommit to the group's coordinator, as an admin commit (generation -1,
        no member): visible when the transaction commits, dropped when it aborts."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "committed_offset": offset,
                    "committed_leader_epoch": -1,
                    "committed_metadata": "",
                }
            )

        async def call(deadline: float) -> None:
            body = {
                "transactional_id": transactional_id,
                "group_id": group,
                "producer_id": producer.producer_id,
                "producer_epoch": producer.producer_epoch,
                "generation_id": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
            }
            resp = await self._to_group_coordinator(group, TXN_OFFSET_COMMIT, body, deadline)
            for t in resp.topics:
                for p in t.partitions:
                    self._check(
                        p.error_code, None, f"TxnOffsetCommit of {t.name}-{p.partition_index}"
                    )

        await self._retrying(call)

    async def end_txn(
        self, transactional_id: str, producer: ProducerIdentity, commit: bool
    ) -> None:
        async def call(deadline: float) -> None:
            body = {
                "transactional_id": transactional_id,
                "producer_id": producer.producer_id,
                "producer_epoch": producer.producer_epoch,
                "committed": commit,
            }
            resp = await self._to_txn_coordinator(transactional_id, END_TXN, body, deadline)
            self._check(resp.error_code, None, f"EndTxn({'commit' if commit else 'abort'})")

        await self._retrying(call)
