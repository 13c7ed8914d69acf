"""`spool share-groups --replay-dead-letters`: move a share group's dead-lettered records
back to their source topic, once each, for a user who fixed what rejected them.

    spool share-groups --bootstrap-server HOST:PORT --replay-dead-letters --group G
                       --topic DLQ [--to-topic T] [--dry-run]

A dead-letter record (KIP-1191) names where it came from in its `__dlq.errors.*`
headers (broker.share.dead_letters): source topic, partition, offset, group. The tool
reads the dead-letter topic as a read_committed consumer of the consumer group
`spool-replay-<G>` (from its committed offsets, or the earliest offset when it has none)
and keeps only the records whose `__dlq.errors.group` is G; the others are passed over
(and counted). Each record kept is produced to its source topic (`--to-topic` names
another), with its original key, value and headers:

- a record that carries a copy (group config `errors.deadletterqueue.copy.record.enable
  =true`: a key or a value, or headers other than `__dlq.errors.*`) is replayed from
  the copy, without the `__dlq.errors.*` headers;
- a headers-only record (the copy flag's default, false) is replayed by reading the
  original at `__dlq.errors.offset` of the source partition (read_committed); when the
  log no longer has it (retention, compaction), it is skipped with a message.

Partition: the source partition (`__dlq.errors.partition`) when the target topic has
it; else the murmur2 hash of the key modulo the partitions, as Kafka's default
partitioner places a keyed record; else (no key) partition 0. The replayed record gets
the time of the replay as its timestamp, so the target topic's retention counts from
the replay.

Once each, even when the tool is killed and run again: records go out in
transactions (transactional.id `spool-replay-<G>-<DLQ>`, InitProducerId fencing and
aborting a killed run's open transaction), and each transaction also commits the
dead-letter offsets it consumed for `spool-replay-<G>` (AddOffsetsToTxn,
TxnOffsetCommit), as Kafka's consume-transform-produce does (KIP-98, KIP-447): the
replayed records and the offsets after them become visible together or not at all.
Consumers of the source topic should read with isolation.level=read_committed (share
groups read committed records by default). Two runs for one group and dead-letter topic
at once cannot both replay: the second's InitProducerId fences the first, which stops
with Kafka's error (PRODUCER_FENCED or INVALID_PRODUCER_EPOCH).

`--dry-run` lists what would be replayed and changes nothing (no producer id, no
offsets). The pure parts (reading the headers, choosing records and partitions) are
unit-tested without a broker.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from broker.share.dead_letters import (
    HEADER_GROUP,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
)
from broker.tools.common import UsageError, connection_settings, fail, print_json, table
from protocol.records import Header, NewRecord, Record

if TYPE_CHECKING:
    from protocol.txn_client import ProducerIdentity, TxnClient

DLQ_HEADER_PREFIX = "__dlq.errors."
# Records per transaction (a killed run redoes at most this many), and bytes: the batch
# each partition gets stays within Kafka's default max.message.bytes (1 MiB).
BATCH_RECORDS = 500
TRANSACTION_MAX_BYTES = 512 * 1024
FETCH_MAX_BYTES = 1 << 20
TRANSACTION_TIMEOUT_MS = 60_000


def offsets_group(group: str) -> str:
    """The consumer group whose committed offsets say how far the replay got."""
    return f"spool-replay-{group}"


def transactional_id(group: str, dlq_topic: str) -> str:
    return f"spool-replay-{group}-{dlq_topic}"


# --- the pure parts ---------------------------------------------------------------------


def header_text(headers: Sequence[Header], name: str) -> str | None:
    """The UTF-8 text of the last header called `name` (None: absent, null or not text)."""
    for key, value in reversed(headers):
        if key == name:
            if value is None:
                return None
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None
    return None


def header_int(headers: Sequence[Header], name: str) -> int | None:
    text = header_text(headers, name)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def strip_dead_letter_headers(headers: Sequence[Header]) -> tuple[Header, ...]:
    """The record's own headers: all but the `__dlq.errors.*` context headers."""
    return tuple((k, v) for k, v in headers if not k.startswith(DLQ_HEADER_PREFIX))


def carries_copy(record: Record) -> bool:
    """Does the dead-letter record hold a copy of the original? A copy has the original
    key, value and headers; a headers-only record (copy.record.enable=false) has a null
    key and value and only the `__dlq.errors.*` headers. (An original with a null key,
    null value and no headers looks headers-only: it is read from the source, which
    gives the same record while the log still has it.)"""
    return (
        record.key is not None
        or record.value is not None
        or bool(strip_dead_letter_headers(record.headers))
    )


REPLAY_COPY, REPLAY_ORIGINAL, OTHER_GROUP, SKIP = "copy", "original", "other-group", "skip"


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one dead-letter record: REPLAY_COPY (from the copy), REPLAY_ORIGINAL
    (read the source at `source_offset` first), OTHER_GROUP (passed over) or SKIP
    (`reason` says why)."""

    action: str
    dlq_partition: int
    dlq_offset: int
    target_topic: str | None = None
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None
    reason: str = ""


def decide(record: Record, dlq_partition: int, group: str, to_topic: str | None) -> Decision:
    """Choose what the replay of `group` does with a record of the dead-letter topic."""
    headers = record.headers
    base = Decision(SKIP, dlq_partition, record.offset)
    owner = header_text(headers, HEADER_GROUP)
    if owner is None:
        return replace(base, reason=f"not a dead-letter record (no {HEADER_GROUP} header)")
    if owner != group:
        return replace(base, action=OTHER_GROUP, reason=f"dead-lettered by group {owner!r}")
    topic = header_text(headers, HEADER_TOPIC)
    partition = header_int(headers, HEADER_PARTITION)
    offset = header_int(headers, HEADER_OFFSET)
    target = to_topic or topic
    base = replace(base, source_topic=topic, source_partition=partition, source_offset=offset)
    if carries_copy(record):
        if target is None:
            return replace(base, reason=f"no {HEADER_TOPIC} header: name one with --to-topic")
        return replace(base, action=REPLAY_COPY, target_topic=target)
    if topic is None or partition is None or offset is None:
        return replace(
            base,
            reason=f"holds no copy and lacks {HEADER_TOPIC}, {HEADER_PARTITION} or "
            f"{HEADER_OFFSET}, so its original cannot be found",
        )
    return replace(base, action=REPLAY_ORIGINAL, target_topic=target)


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 (seed 0x9747b28c), as its default partitioner hashes keys;
    the result is a signed 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    if tail >= 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


def choose_partition(source_partition: int | None, key: bytes | None, partitions: int) -> int:
    """The source partition when the target topic has it, else the key's murmur2 hash
    modulo `partitions` (Kafka's default partitioner), else (no key) partition 0."""
    if source_partition is not None and 0 <= source_partition < partitions:
        return source_partition
    if key is not None:
        return (murmur2(key) & 0x7FFFFFFF) % partitions
    return 0


def replayed_record(record: Record) -> NewRecord:
    """What goes back to the source topic: key, value and the record's own headers; the
    timestamp is the replay's (the batch's)."""
    return NewRecord(record.key, record.value, strip_dead_letter_headers(record.headers))


def record_size(record: NewRecord) -> int:
    """About the bytes `record` takes in a batch (its fields, not the varints)."""
    headers = sum(len(k.encode()) + len(v or b"") for k, v in record.headers)
    return 16 + len(record.key or b"") + len(record.value or b"") + headers


# --- arguments ---------------------------------------------------------------------------

# Options of kafka-share-groups.sh that the replay does not take.
NOT_WITH_REPLAY = (
    "all_groups",
    "all_topics",
    "members",
    "offsets",
    "state",
    "verbose",
    "execute",
    "to_datetime",
    "to_earliest",
    "to_latest",
    "to_offset",
    "by_duration",
)


def validate(args: argparse.Namespace) -> None:
    for dest in NOT_WITH_REPLAY:
        value = getattr(args, dest, None)
        if value is not None and value is not False:
            raise UsageError(
                f"Option --{dest.replace('_', '-')} can't be used with option --replay-dead-letters"
            )
    if not args.group or len(args.group) != 1:
        raise UsageError("Option --replay-dead-letters takes one --group: the share group")
    if not args.topic or len(args.topic) != 1:
        raise UsageError(
            "Option --replay-dead-letters takes one --topic: the group's dead-letter topic"
        )
    if ":" in args.topic[0]:
        raise UsageError(
            f"Option --replay-dead-letters takes a topic without partitions, not "
            f"{args.topic[0]!r}: every partition is replayed"
        )
    if args.to_topic is not None and not args.to_topic:
        raise UsageError("Option --to-topic takes a topic name")
    if args.to_topic == args.topic[0]:
        raise UsageError(
            "Option --to-topic names the dead-letter topic itself: name the topic to replay into"
        )


# --- running -------------------------------------------------------------------------------


class _OriginalNotCommitted(Exception):
    """The original of a headers-only dead-letter record is in a transaction still open
    (a read_uncommitted share group dead-lettered it): it cannot be read committed yet."""


@dataclass(slots=True)
class _Lookups:
    """Originals read from source partitions: per partition the offsets one fetch
    covered and the records it held."""

    covered: dict[tuple[str, int], tuple[int, int, dict[int, Record]]]


class Replay:
    def __init__(self, client: TxnClient, args: argparse.Namespace) -> None:
        self.client = client
        (self.group,) = args.group
        (self.dlq,) = args.topic
        self.to_topic: str | None = args.to_topic
        self.dry_run: bool = args.dry_run
        self.json = args.output == "json"
        self.txn_id = transactional_id(self.group, self.dlq)
        self.offsets_group = offsets_group(self.group)
        self.counts: Counter[str] = Counter()
        self.partition_counts: dict[str, int] = {}
        self.originals = _Lookups({})
        self.listed: list[dict[str, Any]] = []
        self.producer: ProducerIdentity | None = None
        # DLQ partition -> the offset its replay stopped at: the original there is in a
        # transaction still open (left for a later run, not skipped).
        self.waiting: dict[int, int] = {}

    async def run(self) -> int:
        from protocol.admin import EARLIEST_TIMESTAMP

        (dlq,) = await self.client.describe_topics([self.dlq])
        partitions = [p.partition for p in dlq.partitions]
        committed = await self.client.committed_offsets(self.offsets_group, self.dlq, partitions)
        earliest = await self.client.list_offsets(
            {(self.dlq, p): EARLIEST_TIMESTAMP for p in partitions}
        )
        if not self.dry_run:
            self.producer = await self.client.init_producer_id(self.txn_id, TRANSACTION_TIMEOUT_MS)
        for p in partitions:
            start = max(committed.get(p, 0), earliest[(self.dlq, p)].offset)
            await self.replay_partition(p, start)
        self.report()
        return 0

    async def replay_partition(self, partition: int, position: int) -> None:
        end: int | None = None
        while end is None or position < end:
            fetched = await self.client.fetch(
                self.dlq, partition, position, max_bytes=FETCH_MAX_BYTES
            )
            if end is None:
                end = fetched.last_stable_offset
                if end < 0:
                    end = fetched.high_watermark
                if position >= end:
                    return
            records = [r for r in fetched.records if r.offset < end]
            taken = records[:BATCH_RECORDS]
            if len(taken) < len(records):
                next_position = taken[-1].offset + 1
            else:
                next_position = min(fetched.next_offset, end)
            if next_position <= position:
                return  # nothing more can be read below the end
            position = await self.replay_batch(partition, taken, next_position)
            if partition in self.waiting:
                return

    async def replay_batch(
        self, dlq_partition: int, records: Sequence[Record], next_position: int
    ) -> int:
        """Replay `records` in one transaction that commits `next_position`, or fewer when
        their replayed bytes pass TRANSACTION_MAX_BYTES; the position committed."""
        out: dict[tuple[str, int], list[NewRecord]] = {}
        size = 0
        for record in records:
            decision = decide(record, dlq_partition, self.group, self.to_topic)
            if decision.action == OTHER_GROUP:
                self.counts["other_groups"] += 1
                continue
            if decision.action == SKIP:
                self.skip(decision)
                continue
            if decision.action == REPLAY_COPY:
                original: Record | None = record
            else:
                try:
                    original = await self.original(decision)
                except _OriginalNotCommitted:
                    # Stop here: the rest of this partition waits for a later run.
                    self.waiting[dlq_partition] = record.offset
                    next_position = record.offset
                    break
                if original is None:
                    self.skip(
                        decision,
                        f"its original {decision.source_topic}-{decision.source_partition} "
                        f"offset {decision.source_offset} is no longer in the log "
                        "(retention or compaction)",
                    )
                    continue
            assert original is not None and decision.target_topic is not None
            new = replayed_record(original)
            if out and size + record_size(new) > TRANSACTION_MAX_BYTES:
                next_position = record.offset  # the rest in the next transaction
                break
            size += record_size(new)
            count = await self.partitions_of(decision.target_topic)
            target = (
                decision.target_topic,
                choose_partition(decision.source_partition, original.key, count),
            )
            out.setdefault(target, []).append(new)
            self.counts["replayed"] += 1
            self.counts[decision.action] += 1
            if self.dry_run:
                self.list_row(decision, target)
        progress = bool(out) or not records or next_position != records[0].offset
        if not self.dry_run and progress:
            await self.commit(out, {(self.dlq, dlq_partition): next_position})
        return next_position

    async def commit(
        self, records: dict[tuple[str, int], list[NewRecord]], offsets: dict[tuple[str, int], int]
    ) -> None:
        from persister.clock import SYSTEM_CLOCK
        from protocol.admin import AdminError

        client, txn_id, producer = self.client, self.txn_id, self.producer
        assert producer is not None
        try:
            await client.add_partitions(txn_id, producer, records)
            if records:
                await client.produce(txn_id, producer, records, SYSTEM_CLOCK.now_ms())
            await client.add_offsets(txn_id, producer, self.offsets_group)
            await client.commit_offsets(txn_id, producer, self.offsets_group, offsets)
        except AdminError:
            try:
                await client.end_txn(txn_id, producer, commit=False)
            except AdminError as exc:
                print(f"Warn: could not abort the transaction: {exc}", file=sys.stderr)
            raise
        await client.end_txn(txn_id, producer, commit=True)

    async def original(self, d: Decision) -> Record | None:
        """The source record a headers-only dead-letter record names (read_committed),
        None when the log no longer has it."""
        from protocol.admin import AdminError

        assert d.source_topic is not None and d.source_partition is not None
        assert d.source_offset is not None
        tp, offset = (d.source_topic, d.source_partition), d.source_offset
        covered = self.originals.covered.get(tp)
        if covered is not None and covered[0] <= offset < covered[1]:
            return covered[2].get(offset)
        try:
            fetched = await self.client.fetch(*tp, offset, max_bytes=FETCH_MAX_BYTES)
        except AdminError as exc:
            if exc.error in ("OFFSET_OUT_OF_RANGE", "UNKNOWN_TOPIC_OR_PARTITION"):
                return None
            raise
        if 0 <= fetched.last_stable_offset <= offset:
            raise _OriginalNotCommitted
        by_offset = {r.offset: r for r in fetched.records}
        self.originals.covered[tp] = (offset, max(fetched.next_offset, offset + 1), by_offset)
        return by_offset.get(offset)

    async def partitions_of(self, topic: str) -> int:
        count = self.partition_counts.get(topic)
        if count is None:
            (info,) = await self.client.describe_topics([topic])
            count = self.partition_counts[topic] = len(info.partitions)
        return count

    def skip(self, d: Decision, reason: str | None = None) -> None:
        self.counts["skipped"] += 1
        print(
            f"Skipped {self.dlq}-{d.dlq_partition} offset {d.dlq_offset}: {reason or d.reason}",
            file=sys.stderr,
        )
        if self.dry_run:
            self.list_row(d, None, reason or d.reason)

    def list_row(self, d: Decision, target: tuple[str, int] | None, note: str = "") -> None:
        self.listed.append(
            {
                "dlq_partition": d.dlq_partition,
                "dlq_offset": d.dlq_offset,
                "action": "skip" if target is None else f"replay ({d.action})",
                "source_topic": d.source_topic,
                "source_partition": d.source_partition,
                "source_offset": d.source_offset,
                "target_topic": None if target is None else target[0],
                "target_partition": None if target is None else target[1],
                "note": note,
            }
        )

    def report(self) -> None:
        c = self.counts
        summary = {
            "group": self.group,
            "dead_letter_topic": self.dlq,
            "dry_run": self.dry_run,
            "replayed": c["replayed"],
            "from_copies": c[REPLAY_COPY],
            "from_source": c[REPLAY_ORIGINAL],
            "skipped": c["skipped"],
            "other_groups": c["other_groups"],
        }
        for partition, offset in sorted(self.waiting.items()):
            print(
                f"Warn: {self.dlq}-{partition} stopped at offset {offset}: the record it "
                "names is in a transaction still open; run the replay again once it ends",
                file=sys.stderr,
            )
        if self.json:
            print_json({**summary, "records": self.listed} if self.dry_run else summary)
            return
        if self.dry_run and self.listed:
            rows = [
                (
                    f"{self.dlq}-{r['dlq_partition']}",
                    r["dlq_offset"],
                    r["action"],
                    "-" if r["source_topic"] is None else r["source_topic"],
                    "-" if r["source_partition"] is None else r["source_partition"],
                    "-" if r["source_offset"] is None else r["source_offset"],
                    "-"
                    if r["target_topic"] is None
                    else f"{r['target_topic']}-{r['target_partition']}",
                )
                for r in self.listed
            ]
            headers = [
                "DLQ-PARTITION",
                "DLQ-OFFSET",
                "ACTION",
                "SOURCE-TOPIC",
                "SOURCE-PARTITION",
                "SOURCE-OFFSET",
                "TO",
            ]
            print(table(headers, rows, [15, 10, 10]))
        verb = "Would replay" if self.dry_run else "Replayed"
        print(
            f"{verb} {c['replayed']} record(s) of share group '{self.group}' from "
            f"'{self.dlq}' ({c[REPLAY_COPY]} from their copy, {c[REPLAY_ORIGINAL]} read "
            f"from the source topic); skipped {c['skipped']}; passed over "
            f"{c['other_groups']} record(s) of other groups."
        )


def run(args: argparse.Namespace) -> int:
    """The `--replay-dead-letters` action: connect a transactional client, replay, close.
    A failure prints `Error: NAME: message` on stderr and exits 1."""
    from protocol.admin import AdminError
    from protocol.txn_client import TxnClient

    async def main() -> int:
        settings = connection_settings(args)
        client = cast(
            "TxnClient",
            await TxnClient.connect(
                settings.bootstrap, settings.timeout_s, settings.client_id, settings.security
            ),
        )
        async with client:
            return await Replay(client, args).run()

    try:
        return asyncio.run(main())
    except (UsageError, ValueError) as exc:  # a malformed --bootstrap-server
        args.tool_parser.error(str(exc))
        return 2  # error() exits
    except AdminError as exc:
        fail(exc.error, exc.message)
        return 1
