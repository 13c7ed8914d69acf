"""The dead-letter copies of a share group's records, written to its dead-letter topic
(KIP-1191).

`DeadLetterTopicSink.write_all` takes the `DeadLetter` runs of one take (offsets of one
share partition, all ARCHIVING; one record rejected in ten is one run each, so what is
not per record is done once per call, not per run) and:

1. resolves the group's `errors.deadletterqueue.topic.name` and
   `errors.deadletterqueue.copy.record.enable`, and checks the topic as Kafka's share-group
   DLQ manager does, refusing (`DeadLetterRefused`, with what to change) when no topic is
   configured, the name starts with "__" or lacks the broker's
   `errors.deadletterqueue.topic.name.prefix`, the topic does not exist and
   `errors.deadletterqueue.auto.create.topics.enable` is off, it lacks the topic config
   `errors.deadletterqueue.group.enable=true`, or it is the source topic itself. With
   auto-creation on, a missing topic is created (num.partitions, the opt-in set, and
   CreateTime timestamps, as Kafka's CreateTopics for it);
2. reads each run's records from the source partition's local log (this broker leads it:
   it is the share-partition leader); control batches and offsets holding no record get
   no copy;
3. builds one record per source offset with the `__dlq.errors.*` headers (source topic,
   partition, offset, group, delivery count, reason; UTF-8 decimal text, encoded once
   per run but for the offset). With copy.record.enable the copy keeps the record's
   key, value, headers (after the `__dlq` ones) and timestamp, spliced from the source
   batch's bytes when it is uncompressed with no offset gap (the usual batch: nothing
   is decoded and encoded again), else from its decoded records; without it (Kafka's
   default) key and value are null and the timestamp is now (wall clock, so retention
   counts from the dead-lettering). Records go in uncompressed batches with no
   producer id, each within the DLQ topic's `max.message.bytes` (a copy larger than
   that on its own is refused before anything is written);
4. appends them to DLQ partition `source partition % DLQ partitions` (Kafka's rule):
   all the runs' copies together, through the Produce path's durable append when this
   broker leads it (returns once fsynced / committed to PostgreSQL, as acks=all; the
   writes made in one turn of the event loop share one append and one durable wait),
   else with Produce acks=-1 to its leader over the inter-broker listener.

Errors that may pass (leader moved, storage or database down, timeouts, lost
connections) are a `DeadLetterRetriable` outcome for the runs they concern; those stay
ARCHIVING and the writer tries again. Those that will not (too large, unknown topic,
authorization) are a `DeadLetterRefused` one (a copy too large refuses its run only).
Each run that got as far as a produce, or was refused, is counted
(`ShareMetrics.dead_letter_produce`: Kafka's DeadLetterQueueTotalProduceRequestsPerSec
and, failed, DeadLetterQueueFailedProduceRequestsPerSec).
"""

from __future__ import annotations

import asyncio
import bisect
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import structlog

from broker.cluster import ClusterView
from broker.metrics import ShareMetrics
from broker.partitions import validate_produce_data
from broker.share.dead_letters import (
    HEADER_DELIVERY_COUNT,
    HEADER_GROUP,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
    DeadLetter,
    DeadLetterOutcome,
    DeadLetterReason,
    DeadLetterRefused,
    DeadLetterRetriable,
)
from broker.share.remote_persister import Target, Transport, TransportError
from coordinator.group_config import (
    DLQ_GROUP_ENABLE,
    DLQ_TOPIC_NAME,
    GroupConfig,
    dead_letter_topic_problem,
)
from persister.clock import Clock
from protocol.errors import CorruptRecordError, ErrorCode, KafkaError
from protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    Record,
    build_batch_of_tails,
    decode_records,
    encode_header,
    encode_record_tail,
    iter_batches,
    record_starts,
    tails_with_headers,
    varint,
)

log = structlog.get_logger("spool.share")

PRODUCE = 0
PRODUCE_VERSION = 13  # the newest spool serves: topics by id (KIP-516)
# How long a write waits for its copies to be durable (locally) or answered (remotely):
# Kafka's share-group DLQ sender uses the inter-broker request timeout of 30 s.
WRITE_TIMEOUT_MS = 30_000
# Source partitions whose last decoded batch is kept at once (then all are dropped).
MAX_DECODED_BATCHES = 256
# Kafka's default max.message.bytes, for a topic whose setting is not given.
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12


# Produce, storage and metadata errors after which a retry may succeed; any other is a
# refusal (UNKNOWN_SERVER_ERROR too, as a Kafka producer gives up on it).
RETRIABLE = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.kafka_storage_error,
        ErrorCode.request_timed_out,
        ErrorCode.network_exception,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.throttling_quota_exceeded,
        # Auto-creating the topic: the metadata log busy or changing under the request.
        ErrorCode.not_controller,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
    }
)


class TopicInfo(Protocol):
    """A topic as the cluster metadata has it (coordinator.metadata.Topic)."""

    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str]


class Topics(Protocol):
    """The cluster metadata's topics (coordinator.metadata.ClusterState)."""

    @property
    def topics(self) -> Mapping[str, Any]: ...
    @property
    def topics_by_id(self) -> Mapping[uuid.UUID, Any]: ...


class SourceLog(Protocol):
    """What is read of the source partition (broker.partitions.Partition)."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...

    def read(self, offset: int, max_bytes: int) -> bytes: ...


class DeadLetterLog(Protocol):
    """What is appended to on the DLQ partition (broker.partitions.Partition)."""

    settings: dict[str, Any]

    def append(self, data: bytearray, batches: list[Any]) -> Any: ...
    async def wait_durable(self, last_offset: int, timeout_s: float) -> None: ...


def _refused(letter: DeadLetter, why: str) -> DeadLetterRefused:
    return DeadLetterRefused(f"dead-letter copies of share group {letter.group_id!r}: {why}")


def destination_partition(source_partition: int, dlq_partitions: int) -> int:
    """The DLQ partition a source partition's copies go to (Kafka's rule)."""
    return source_partition % dlq_partitions


# Bytes asked of the log per read: at least one whole batch comes back, however large.
SOURCE_READ_STEP = 64 * 1024


class SourceBatch:
    """A source batch read for one run, kept for the next runs of the same partition
    (rejections come one or a few offsets at a time, so consecutive runs mostly fall in
    one batch). An uncompressed batch with no offset gap, the usual kind, is indexed the
    first time a copy of its records is asked for (where each record starts, reading
    only lengths) and the copies are spliced from its bytes: one record in ten rejected
    reads a tenth of the batch, and decodes none. Any other is decoded whole once, its
    records found by bisection. A batch with no offset gap needs nothing read for
    headers-only copies: each of its offsets holds a record."""

    __slots__ = (
        "_data",
        "_header",
        "_pos",
        "_records",
        "_starts",
        "base_offset",
        "gapless",
        "next_offset",
    )

    def __init__(self, data: bytes, pos: int, header: BatchHeader) -> None:
        self._data = data
        self._pos = pos
        self.base_offset = header.base_offset
        self.next_offset = header.next_offset
        self._header = header
        self._records: list[Record] | None = None
        self._starts: list[int] | None = None
        self.gapless = header.records_count == header.last_offset_delta + 1
        if header.compression == 0 and self.gapless:
            end = pos + header.size
            if end > len(data):
                raise CorruptRecordError(
                    f"record batch at byte {pos} claims {header.size} bytes but only "
                    f"{len(data) - pos} remain"
                )

    def covers(self, first: int, last: int) -> bool:
        """Whether offsets [first, last] all lie in the batch."""
        return self.base_offset <= first and last < self.next_offset

    def within(self, first: int, last: int) -> list[Record]:
        """The batch's records in [first, last] (an indexed batch is decoded whole the
        first time: only a group whose copy.record.enable changed asks it)."""
        if self._records is None:
            self._records = list(decode_records(self._data, self._pos, self._header))
        records = self._records
        lo = bisect.bisect_left(records, first, key=lambda r: r.offset)
        hi = bisect.bisect_right(records, last, lo, key=lambda r: r.offset)
        return records[lo:hi]

    def copies(self, first: int, last: int, headers: CopyHeaders) -> list[Copy]:
        """The copies (`copy_record`) of the batch's records in [first, last]: an indexed
        batch's records are spliced from its bytes (their key, value and headers as
        stored, the `__dlq` headers put before theirs), not decoded and encoded again."""
        header = self._header
        if self._records is None and header.compression == 0 and self.gapless:
            starts = self._starts
            if starts is None:
                pos = self._pos
                starts = self._starts = record_starts(
                    self._data, header.records_count, pos + HEADER_SIZE, pos + header.size
                )
            lo = max(first, self.base_offset) - self.base_offset
            hi = min(last, self.next_offset - 1) - self.base_offset + 1
            spliced = tails_with_headers(
                self._data, starts, lo, hi, header, headers.of, DLQ_HEADER_COUNT
            )
            if spliced is not None:
                return spliced
            # Offset deltas not 0, 1, 2, ...: decoded whole below.
        return [
            (
                r.timestamp,
                encode_record_tail(
                    r.key, r.value, r.headers, headers.of(r.offset), DLQ_HEADER_COUNT
                ),
            )
            for r in self.within(first, last)
        ]

    def headers_only(self, first: int, last: int, headers: CopyHeaders, now_ms: int) -> list[Copy]:
        """The headers-only copies (no `copy_record`) of the batch's records in [first,
        last], stamped `now_ms`."""
        if self.gapless:
            offsets: Iterable[int] = range(
                max(first, self.base_offset), min(last, self.next_offset - 1) + 1
            )
        else:
            offsets = [r.offset for r in self.within(first, last)]
        return [(now_ms, _NO_RECORD + headers.of(o)) for o in offsets]


# A copy in a dead-letter batch: its timestamp, and its fields after the offset delta
# (protocol.records.encode_record_tail: key, value, header count, headers).
Copy = tuple[int, bytes]
# The `__dlq.errors.*` headers each copy has.
DLQ_HEADER_COUNT = 6


class CopyHeaders:
    """The `__dlq.errors.*` headers of one run's copies, encoded once but for the offset:
    source topic, partition, offset, group, delivery count, reason (UTF-8 decimal text)."""

    __slots__ = ("_after", "_before")

    _OFFSET_NAME = encode_header(HEADER_OFFSET.encode(), b"")[:-1]  # without the value

    def __init__(self, letter: DeadLetter, source_topic: str) -> None:
        self._before = encode_header(HEADER_TOPIC.encode(), source_topic.encode()) + (
            encode_header(HEADER_PARTITION.encode(), str(letter.partition).encode())
        )
        self._after = b"".join(
            (
                encode_header(HEADER_GROUP.encode(), letter.group_id.encode()),
                encode_header(HEADER_DELIVERY_COUNT.encode(), str(letter.delivery_count).encode()),
                encode_header(HEADER_MESSAGE.encode(), letter.reason.value.encode()),
            )
        )

    def of(self, offset: int) -> bytes:
        """The six headers of the copy of `offset`, encoded."""
        text = str(offset).encode()
        return b"".join((self._before, self._OFFSET_NAME, varint(len(text)), text, self._after))


def _source_spans(
    part: SourceLog,
    first: int,
    last: int,
    *,
    last_batch: list[SourceBatch] | None,
) -> Iterator[tuple[SourceBatch, int, int]]:
    """The stretches [lo, hi] of offsets [first, last] in the log, batch by batch, with
    the batch. Control batches and offsets holding no record (below the log start,
    compacted away) are left out. `last_batch` (a one-element list, or empty) keeps the
    last batch read and is consulted first; only the batches that overlap [first, last]
    are read."""
    offset = max(first, part.log_start_offset)
    high_watermark = part.high_watermark
    while offset <= last and offset < high_watermark:
        if last_batch and last_batch[0].base_offset <= offset < last_batch[0].next_offset:
            kept = last_batch[0]
            yield kept, offset, min(last, kept.next_offset - 1)
            offset = kept.next_offset
            continue
        data = part.read(offset, SOURCE_READ_STEP)
        moved = False
        for pos, header in iter_batches(data, validate=False):
            if header.base_offset > last:
                return
            if header.next_offset <= offset:
                continue
            moved = True
            if not header.is_control:
                batch = SourceBatch(data, pos, header)
                if last_batch is not None:
                    last_batch[:] = [batch]
                yield batch, max(offset, header.base_offset), min(last, header.last_offset)
            offset = header.next_offset
            if offset > last:
                return
        if not moved:
            break


def read_source_copies(
    part: SourceLog,
    first: int,
    last: int,
    headers: CopyHeaders,
    *,
    copy_record: bool,
    now_ms: int,
    last_batch: list[SourceBatch] | None = None,
) -> list[Copy]:
    """One dead-letter copy per record of offsets [first, last] in the log, in offset
    order: the `__dlq.errors.*` headers, and with `copy_record` the record's key, value,
    headers (after the `__dlq` ones) and timestamp, spliced from the source batch's
    bytes where it allows (SourceBatch.copies); without it a null key and value and
    the timestamp `now_ms`."""
    kept = last_batch[0] if last_batch else None
    if (
        kept is not None
        and kept.covers(first, last)
        and part.log_start_offset <= first
        and last < part.high_watermark
    ):
        # Most runs fall in the batch the run before was read from: copied from it at
        # once, without `_source_spans`' walk.
        if copy_record:
            return kept.copies(first, last, headers)
        return kept.headers_only(first, last, headers, now_ms)
    out: list[Copy] = []
    for batch, lo, hi in _source_spans(part, first, last, last_batch=last_batch):
        if copy_record:
            out.extend(batch.copies(lo, hi, headers))
        else:
            out.extend(batch.headers_only(lo, hi, headers, now_ms))
    return out


# A headers-only copy's fields before its headers: null key, null value, six headers.
_NO_RECORD = b"\x01\x01" + varint(DLQ_HEADER_COUNT)


def _varint_size(value: int) -> int:
    raw = (value << 1) ^ (value >> 63)
    size = 1
    while raw >= 0x80:
        raw >>= 7
        size += 1
    return size


# The most bytes a record takes in a batch beside its tail: its length, attributes, and
# timestamp and offset deltas (varints of at most 5, 1, 10 and 5 bytes).
MAX_RECORD_OVERHEAD = 21


def alone_size(copy: Copy) -> int:
    """Bytes of a batch holding `copy` alone."""
    body = 3 + len(copy[1])  # attributes, timestamp delta 0, offset delta 0, the tail
    return HEADER_SIZE + _varint_size(body) + body


def split_batches(copies: Sequence[Copy], max_bytes: int) -> list[bytes]:
    """Uncompressed batches of `copies`, in order, each at most `max_bytes` (the DLQ
    topic's max.message.bytes). ValueError when one copy alone does not fit."""
    if (
        HEADER_SIZE + sum(len(tail) for _, tail in copies) + MAX_RECORD_OVERHEAD * len(copies)
        <= max_bytes
    ):
        return [build_batch_of_tails(copies)] if copies else []  # all fit in one, surely
    batches: list[bytes] = []
    start = 0
    size = HEADER_SIZE
    base_ts = 0
    for index, (ts, tail) in enumerate(copies):
        if index > start:
            body = 1 + _varint_size(ts - base_ts) + _varint_size(index - start) + len(tail)
            grown = size + _varint_size(body) + body
            if grown <= max_bytes:
                size = grown
                continue
            batches.append(build_batch_of_tails(copies[start:index]))
        start = index
        base_ts = ts
        size = alone_size((ts, tail))
        if size > max_bytes:
            raise ValueError(
                f"a dead-letter record of {size} bytes (in its batch) exceeds "
                f"max.message.bytes ({max_bytes})"
            )
    if start < len(copies):
        batches.append(build_batch_of_tails(copies[start:]))
    return batches


def _limit(settings: Mapping[str, Any]) -> int:
    """max.message.bytes of a topic's configs or a partition's settings."""
    try:
        return int(settings.get("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES))
    except ValueError:
        return DEFAULT_MAX_MESSAGE_BYTES


def _max_message_bytes(topic: TopicInfo) -> int:
    return _limit(topic.configs)


class _SharedAppend:
    """The copies several runs append to one local DLQ partition together."""

    __slots__ = ("copies", "done", "limit", "part")

    def __init__(self, part: DeadLetterLog, limit: int, done: asyncio.Future[None]) -> None:
        self.part = part
        self.limit = limit
        self.copies: list[Copy] = []
        self.done = done


class DeadLetterTopicSink:
    """`DeadLetterSink` writing to each group's dead-letter topic (module docstring).

    Everything it reads is read at each write, so config changes apply to the next one:
    `group_config(group_id)` (the group coordinator's GroupConfig), `topics()` (the
    cluster metadata), `prefix()` and `auto_create()` (the broker configs
    errors.deadletterqueue.topic.name.prefix / .auto.create.topics.enable),
    `create_topic(name, configs)` (auto-creation through the metadata store, returning
    the topic), `log_partition(topic_id, partition)` (this broker's partition logs),
    `max_message_bytes(topic)` (the topic's effective max.message.bytes, for a
    partition another broker leads), `cluster()` (who leads what), and `transport` with
    `listener` (the inter-broker listener) for the Produce to another leader."""

    def __init__(
        self,
        *,
        group_config: Callable[[str], GroupConfig],
        topics: Callable[[], Topics],
        log_partition: Callable[[uuid.UUID, int], Any],
        cluster: Callable[[], ClusterView],
        transport: Transport,
        listener: str,
        metrics: ShareMetrics,
        clock: Clock,
        prefix: Callable[[], str] = lambda: "dlq.",
        auto_create: Callable[[], bool] = lambda: False,
        create_topic: Callable[[str, dict[str, str]], Awaitable[Any]] | None = None,
        max_message_bytes: Callable[[Any], int] = _max_message_bytes,
        timeout_ms: int = WRITE_TIMEOUT_MS,
    ) -> None:
        self.group_config = group_config
        self.topics = topics
        self.log_partition = log_partition
        self.cluster = cluster
        self.transport = transport
        self.listener = listener
        self.metrics = metrics
        self.clock = clock
        self.prefix = prefix
        self.auto_create = auto_create
        self.create_topic = create_topic
        self.max_message_bytes = max_message_bytes
        self.timeout_ms = timeout_ms
        # Per source partition, the batch read last (read_source_copies).
        self._last_batches: dict[tuple[uuid.UUID, int], list[SourceBatch]] = {}
        # Per local DLQ partition, the append the runs of this turn join (_append_local).
        self._appends: dict[tuple[str, int], _SharedAppend] = {}
        self._append_tasks: set[asyncio.Future[None]] = set()

    async def write_all(self, letters: Sequence[DeadLetter]) -> list[DeadLetterOutcome]:
        """The copies of `letters` (one take of a share partition's runs): what is
        resolved, checked and appended once per write is done once for all of them
        (module docstring); one outcome per letter, in order. Each letter is counted as
        a produce (failed when refused or retriable; not at all when nothing was left to
        copy), as when each run was written on its own."""
        outcomes: list[DeadLetterOutcome] = [0] * len(letters)
        groups: dict[tuple[str, uuid.UUID, int], list[int]] = {}
        for i, letter in enumerate(letters):
            groups.setdefault((letter.group_id, letter.topic_id, letter.partition), []).append(i)
        for indexes in groups.values():
            written = await self._write_partition([letters[i] for i in indexes])
            for i, outcome in zip(indexes, written, strict=True):
                outcomes[i] = outcome
        for letter, outcome in zip(letters, outcomes, strict=True):
            if isinstance(outcome, DeadLetterRefused):
                log.warning(
                    "dead_letter_refused",
                    group=letter.group_id,
                    partition=letter.partition,
                    first_offset=letter.first_offset,
                    last_offset=letter.last_offset,
                    reason=str(outcome),
                )
                self.metrics.dead_letter_produce(letter.group_id, failed=True)
            elif isinstance(outcome, DeadLetterRetriable):
                self.metrics.dead_letter_produce(letter.group_id, failed=True)
            elif outcome:  # nothing to copy (no record left at those offsets): no produce
                self.metrics.dead_letter_produce(letter.group_id, failed=False)
        return outcomes

    async def write(self, letter: DeadLetter) -> int:
        """`write_all` of one letter: the number of copies, or its failure raised."""
        outcome = (await self.write_all([letter]))[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def close(self) -> None:
        """The broker stops: shared appends still waiting are dropped (their runs stay
        ARCHIVING, durably) and the connections to other brokers close."""
        for task in list(self._append_tasks):
            task.cancel()
        await self.transport.close()

    async def _write_partition(self, letters: list[DeadLetter]) -> list[DeadLetterOutcome]:
        """`write_all` for letters of one group and source partition: the group config,
        the DLQ topic and its checks resolved once; each letter's records read and its
        copies built (a letter that cannot be read, or has a copy too large, fails on
        its own); all copies in one append (or one Produce per batch remotely), whose
        failure is that of every letter with copies in it."""
        first = letters[0]
        outcomes: list[DeadLetterOutcome] = [0] * len(letters)
        try:
            config, source_name, part, topic = await self._source_and_topic(first)
        except (DeadLetterRefused, DeadLetterRetriable) as exc:
            return [exc] * len(letters)
        copy_record = config.dead_letter_copy_record
        now_ms = self.clock.now_ms()
        last_batch = self._decoded_batch(first)
        made: list[tuple[int, list[Copy]]] = []  # (letter, its copies)
        # The letters' headers differ only in delivery count and reason: encoded once each.
        encoded: dict[tuple[int, DeadLetterReason], CopyHeaders] = {}
        for i, letter in enumerate(letters):
            headers = encoded.get((letter.delivery_count, letter.reason))
            if headers is None:
                headers = CopyHeaders(letter, source_name)
                encoded[letter.delivery_count, letter.reason] = headers
            try:
                copies = read_source_copies(
                    part,
                    letter.first_offset,
                    letter.last_offset,
                    headers,
                    copy_record=copy_record,
                    now_ms=now_ms,
                    last_batch=last_batch,
                )
            except KafkaError as exc:  # CORRUPT_MESSAGE (a refusal) among them
                where = f"reading {source_name}-{letter.partition}"
                outcomes[i] = self._mapped(letter, exc, where)
                continue
            if copies:
                made.append((i, copies))
        if not made:
            return outcomes
        index = destination_partition(first.partition, topic.partitions)
        try:
            leader_id, dlq_part, limit = self._leader(topic, index)
        except DeadLetterRetriable as exc:
            for i, _ in made:
                outcomes[i] = exc
            return outcomes
        all_copies: list[Copy] = []
        with_copies: list[int] = []
        for i, copies in made:
            # Each copy alone in a batch must fit: else the letter is refused before
            # anything is written (split_batches' check, made per letter here).
            largest = alone_size(max(copies, key=lambda copy: len(copy[1])))
            if largest > limit:
                outcomes[i] = _refused(
                    letters[i],
                    f"a dead-letter record of {largest} bytes (in its batch) exceeds "
                    f"max.message.bytes ({limit}) of the dead-letter topic {topic.name!r}",
                )
                continue
            outcomes[i] = len(copies)
            all_copies += copies
            with_copies.append(i)
        if not all_copies:
            return outcomes
        try:
            if dlq_part is not None:
                await self._append_local(first, topic.name, index, dlq_part, all_copies, limit)
            else:
                batches = self._batches(first, topic.name, all_copies, limit)
                await self._produce_remote(first, leader_id, topic, index, batches)
        except (DeadLetterRefused, DeadLetterRetriable) as exc:
            for i in with_copies:
                outcomes[i] = exc
        return outcomes

    async def _source_and_topic(self, letter: DeadLetter) -> tuple[GroupConfig, str, Any, Any]:
        """The group's config, the source topic's name and local log, and the checked
        dead-letter topic of `letter`'s group and share partition."""
        config = self.group_config(letter.group_id)
        source = self.topics().topics_by_id.get(letter.topic_id)
        if source is None:
            raise _refused(letter, f"the source topic {letter.topic_id} no longer exists")
        topic = await self._dlq_topic(letter, config, source.name)
        part = self.log_partition(letter.topic_id, letter.partition)
        if part is None or getattr(part, "fenced", None) is not None:
            raise DeadLetterRetriable(
                f"{source.name}-{letter.partition} is not led by this broker any more: its "
                "new share-partition leader writes the dead letters"
            )
        return config, source.name, part, topic

    def _leader(self, topic: Any, index: int) -> tuple[int, DeadLetterLog | None, int]:
        """Who leads DLQ partition `index`: (its node id, its log when this broker leads
        it else None, its max.message.bytes)."""
        view = self.cluster()
        leader = view.leader(topic.topic_id, index)
        if leader is None:
            raise DeadLetterRetriable(f"{topic.name}-{index} has no leader at the moment")
        if not view.is_local(leader):
            return leader.node_id, None, self.max_message_bytes(topic)
        dlq_part = self.log_partition(topic.topic_id, index)
        if dlq_part is None:
            raise DeadLetterRetriable(f"{topic.name}-{index} is not open on this broker yet")
        return leader.node_id, dlq_part, _limit(dlq_part.settings)

    def _decoded_batch(self, letter: DeadLetter) -> list[SourceBatch]:
        key = (letter.topic_id, letter.partition)
        kept = self._last_batches.get(key)
        if kept is None:
            if len(self._last_batches) >= MAX_DECODED_BATCHES:
                self._last_batches.clear()
            kept = self._last_batches[key] = []
        return kept

    async def _dlq_topic(self, letter: DeadLetter, config: GroupConfig, source: str) -> Any:
        """The group's dead-letter topic, checked as when the group config was set
        (coordinator.group_config.dead_letter_topic_problem: it may have changed since),
        created if missing and auto-creation is on."""
        name = config.dead_letter_topic
        if not name:
            raise _refused(letter, f"the group has no dead-letter topic ({DLQ_TOPIC_NAME})")
        auto_create = self.auto_create() and self.create_topic is not None
        topic = self.topics().topics.get(name)
        problem = dead_letter_topic_problem(
            letter.group_id,
            name,
            prefix=self.prefix(),
            auto_create=auto_create,
            topic_configs=None if topic is None else topic.configs,
            consumed=(source,),
        )
        if problem is None and topic is None:
            topic = await self._create(letter, name)
            problem = dead_letter_topic_problem(
                letter.group_id,
                name,
                prefix=self.prefix(),
                auto_create=False,
                topic_configs=topic.configs,
                consumed=(source,),
            )
        if problem is not None:
            raise _refused(letter, f"{DLQ_TOPIC_NAME} {name!r}: {problem}")
        return topic

    async def _create(self, letter: DeadLetter, name: str) -> Any:
        assert self.create_topic is not None
        try:
            topic = await self.create_topic(
                name, {DLQ_GROUP_ENABLE: "true", "message.timestamp.type": "CreateTime"}
            )
        except KafkaError as exc:
            raise self._mapped(letter, exc, f"creating the dead-letter topic {name!r}") from exc
        except OSError as exc:
            raise DeadLetterRetriable(
                f"creating the dead-letter topic {name!r} failed: {exc}"
            ) from exc
        log.info("dead_letter_topic_created", topic=name, group=letter.group_id)
        return topic

    def _batches(
        self,
        letter: DeadLetter,
        topic: str,
        copies: Sequence[Copy],
        limit: int,
    ) -> list[bytes]:
        try:
            return split_batches(copies, limit)
        except ValueError as exc:
            raise _refused(letter, f"{exc} of the dead-letter topic {topic!r}") from exc

    async def _append_local(
        self,
        letter: DeadLetter,
        topic: str,
        index: int,
        part: DeadLetterLog,
        copies: Sequence[Copy],
        limit: int,
    ) -> None:
        """The Produce handler's append and acks=all wait (fsync / PostgreSQL commit),
        shared: the copies of every write to this DLQ partition in the same turn of the
        event loop (one take of a share partition each; the share partitions of several
        source partitions or groups may map to one DLQ partition) go in one append of as
        few batches as max.message.bytes allows, with one durable wait. If the shared
        append fails, every run in it is tried again."""
        where = f"appending to {topic}-{index}"
        key = (topic, index)
        pending = self._appends.get(key)
        if pending is None or pending.part is not part or pending.limit != limit:
            pending = _SharedAppend(part, limit, asyncio.get_running_loop().create_future())
            self._appends[key] = pending
            asyncio.get_running_loop().call_soon(self._start_append, key, pending)
        pending.copies.extend(copies)
        try:
            # Shielded: a run whose wait is cancelled (its copy timed out) leaves the
            # append to the others.
            await asyncio.shield(pending.done)
        except KafkaError as exc:
            raise self._mapped(letter, exc, where) from exc
        except OSError as exc:
            raise DeadLetterRetriable(f"{where} failed: {exc}") from exc

    def _start_append(self, key: tuple[str, int], pending: _SharedAppend) -> None:
        if self._appends.get(key) is pending:
            del self._appends[key]
        task = asyncio.ensure_future(self._append_shared(pending))
        self._append_tasks.add(task)
        task.add_done_callback(self._append_tasks.discard)

    async def _append_shared(self, pending: _SharedAppend) -> None:
        done = pending.done
        # Marked retrieved: when every waiter was cancelled, nobody reads an error.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            last = -1
            for batch in split_batches(pending.copies, pending.limit):
                data, headers = validate_produce_data(batch)
                last = pending.part.append(data, headers).last_offset
            await pending.part.wait_durable(last, self.timeout_ms / 1000)
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
        else:
            if not done.done():
                done.set_result(None)

    async def _produce_remote(
        self,
        letter: DeadLetter,
        node_id: int,
        topic: Any,
        index: int,
        batches: Sequence[bytes],
    ) -> None:
        """Produce acks=-1 of each batch, in order, to the DLQ partition's leader."""
        where = f"producing to {topic.name}-{index} on broker {node_id}"
        info = self.cluster().broker(node_id)
        endpoint = None if info is None else info.endpoint(self.listener)
        if endpoint is None:
            raise DeadLetterRetriable(
                f"{where}: broker {node_id} is not live or has no {self.listener} listener"
            )
        target = Target(node_id, endpoint.host, endpoint.port)
        for batch in batches:
            body = {
                "transactional_id": None,
                "acks": -1,
                "timeout": self.timeout_ms,
                "topic_data": [
                    {
                        "name": topic.name,
                        "topic_id": topic.topic_id,
                        "partition_data": [{"index": index, "records": batch}],
                    }
                ],
            }
            try:
                response = await self.transport.send(target, PRODUCE, PRODUCE_VERSION, body)
            except TransportError as exc:
                raise DeadLetterRetriable(f"{where}: {exc.message}") from exc
            code, message = _produce_error(response, index)
            if code != ErrorCode.none:
                raise self._mapped(letter, KafkaError(code, message or code.name), where)

    def _mapped(
        self, letter: DeadLetter, exc: KafkaError, where: str
    ) -> DeadLetterRetriable | DeadLetterRefused:
        why = f"{where}: {ErrorCode(exc.code).name.upper()}: {exc.message}"
        if exc.code == ErrorCode.topic_authorization_failed:
            why += (
                f" (the brokers write dead letters as their {self.listener} principal: "
                "grant it WRITE on the topic, or add it to super.users)"
            )
        if exc.code in RETRIABLE:
            return DeadLetterRetriable(why)
        return _refused(letter, why)


def _produce_error(response: Any, index: int) -> tuple[ErrorCode, str | None]:
    for topic in response.responses:
        for p in topic.partition_responses:
            if int(p.index) == index:
                return ErrorCode(p.error_code), p.error_message
    return (
        ErrorCode.unknown_server_error,
        f"the Produce response has no result for partition {index}",
    )
