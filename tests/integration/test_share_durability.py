"""Share-group state across broker crashes: kill -9 under traffic, a torn share-state log,
and recovery by replay giving exactly the state the live broker had.

ShareConsumers run in explicit mode, one at a time, each in its own thread. A record
counts as "acceptance confirmed" only when `commit_sync()` reported success (None) for
its partition in the commit that carried its ACCEPT; the broker fsyncs share state
before answering, so a confirmed acceptance must survive any crash, and such a record
must never be handed out again. Every wait is bounded; nothing here measures speed.
"""

from __future__ import annotations

import itertools
import random
import re
import shutil
import struct
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, Message

from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import ShareStateKey
from persister.file_log import LogConfig, PartitionLog
from persister.share_compaction import read_share_records
from protocol.records import iter_batches
from tests.integration.conftest import BOTH_STORAGES, CLIENT_LOGGER, Broker, create_topic
from tests.integration.share_helpers import (
    close_quietly,
    earliest,
    log_lines,
    produce_values,
    share_consumer,
)
from tests.integration.test_share_state_rpcs import (
    assert_ok,
    batches_of,
    read,
    summary,
    topic_ids,
)

SHORT_LOCK = {
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.record.lock.duration.ms": "2000",
}
# High enough that crashes plus one RELEASE never archive a record by the count limit.
COUNT_LIMIT = 10

Key = tuple[int, int]  # (partition, offset)


# --- what the consumers saw -----------------------------------------------------------


@dataclass
class Seen:
    seq: int
    cycle: int
    count: int
    life: int = 0  # broker incarnation (kills so far) when it was seen
    # Seen while the broker restarted: from the old broker (what librdkafka had fetched
    # before the kill) or already from the new one, which serves before the test's
    # start() sees it accept connections.
    restarting: bool = False


@dataclass
class Ledger:
    """Deliveries and confirmed acknowledgements of all consumers, in one global order.

    `confirmed` holds the records whose ACCEPT (or REJECT) commit_sync confirmed: both
    are final, so none of them may ever be delivered again.

    One consumer runs at a time, and it acknowledges a poll's records before it polls
    again, so the order of `seq` is the order in which the broker handed records out
    and confirmed their acknowledgements.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    seq: int = 0
    life: int = 0
    restarting: bool = False
    deliveries: dict[Key, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    confirmed: dict[Key, Seen] = field(default_factory=dict)
    redelivered_after_confirm: list[str] = field(default_factory=list)
    unconfirmed_accepts: int = 0
    releases: int = 0
    commit_errors: list[str] = field(default_factory=list)
    poll_errors: list[str] = field(default_factory=list)

    def delivered(self, cycle: int, msgs: list[Message]) -> None:
        with self.lock:
            for m in msgs:
                self.seq += 1
                key = (m.partition(), m.offset())
                seen = Seen(self.seq, cycle, m.delivery_count(), self.life, self.restarting)
                if key in self.confirmed:
                    c = self.confirmed[key]
                    self.redelivered_after_confirm.append(
                        f"{key} delivered in cycle {cycle} with count {seen.count} after its "
                        f"acceptance was confirmed in cycle {c.cycle} (count {c.count})"
                    )
                self.deliveries[key].append(seen)

    def committed(
        self,
        cycle: int,
        acks: list[tuple[Message, AcknowledgeType]],
        ok_partitions: set[int],
    ) -> None:
        with self.lock:
            for m, kind in acks:
                if kind == AcknowledgeType.RELEASE:
                    self.releases += 1
                    continue
                key = (m.partition(), m.offset())
                if m.partition() in ok_partitions:
                    self.seq += 1
                    self.confirmed.setdefault(key, Seen(self.seq, cycle, m.delivery_count()))
                else:
                    self.unconfirmed_accepts += 1

    def counts(self, key: Key) -> list[int]:
        return [s.count for s in self.deliveries.get(key, [])]


def release_first_delivery_of_every_tenth(m: Message) -> AcknowledgeType:
    if m.offset() % 10 == 3 and m.delivery_count() == 1:
        return AcknowledgeType.RELEASE
    return AcknowledgeType.ACCEPT


def run_consumer(
    broker: Broker,
    group: str,
    topic: str,
    ledger: Ledger,
    cycle: int,
    stop: threading.Event,
    *,
    decide: Callable[[Message], AcknowledgeType] = release_first_delivery_of_every_tenth,
    processing_s: float = 0.05,
    max_s: float = 90.0,
) -> None:
    """Poll, 'process' for `processing_s`, acknowledge each record, commit_sync; until
    `stop` (bounded by `max_s` and a poll count). Closes the consumer at the end."""
    consumer = share_consumer(
        broker, group, [topic], **{"max.poll.records": 10, "logger": CLIENT_LOGGER}
    )
    deadline = time.monotonic() + max_s
    try:
        for _ in range(5_000):
            if stop.is_set() or time.monotonic() > deadline:
                break
            try:
                msgs = list(consumer.poll(0.3))
            except KafkaException as exc:
                ledger.poll_errors.append(f"cycle {cycle}: {exc}")
                time.sleep(0.1)
                continue
            data = [m for m in msgs if m.error() is None]
            ledger.poll_errors += [f"cycle {cycle}: {m.error()}" for m in msgs if m.error()]
            if not data:
                continue
            ledger.delivered(cycle, data)
            time.sleep(processing_s)  # records are held (acquired) meanwhile
            acks = [(m, decide(m)) for m in data]
            for m, kind in acks:
                consumer.acknowledge(m, kind)
            ok: set[int] = set()
            try:
                result = consumer.commit_sync(5.0)
            except KafkaException as exc:
                ledger.commit_errors.append(f"cycle {cycle}: {exc}")
            else:
                for tp, err in result.items():
                    if tp.topic == topic and err is None:
                        ok.add(tp.partition)
                    elif err is not None:
                        ledger.commit_errors.append(f"cycle {cycle}: {tp.partition}: {err}")
            ledger.committed(cycle, acks, ok)
    finally:
        close_quietly(consumer)


def start_consumer(*args: object, **kwargs: object) -> tuple[threading.Thread, list[BaseException]]:
    failures: list[BaseException] = []

    def body() -> None:
        try:
            run_consumer(*args, **kwargs)  # type: ignore[arg-type]
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, failures


def join_consumer(thread: threading.Thread, failures: list[BaseException]) -> None:
    thread.join(60)
    assert not thread.is_alive(), "consumer thread did not finish within 60 s"
    if failures:
        raise failures[0]


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def share_state_loaded(broker: Broker) -> list[int]:
    """`records=` of every share_state_loaded line, one per broker start."""
    return [
        int(m.group(1))
        for line in log_lines(broker, "share_state_loaded")
        if (m := re.search(r"records=(\d+)", line))
    ]


def recent_log(broker: Broker, lines: int = 60) -> str:
    return "\nbroker log tail:\n" + broker.log_tail(lines)


def start_offsets(broker: Broker, group: str, tid: uuid.UUID, partitions: int) -> list[int]:
    out = []
    for p in range(partitions):
        s = summary(broker, group, tid, p)
        assert_ok(s, f"summary {group} partition {p}")
        out.append(int(s.start_offset))
    return out


def drain(
    broker: Broker,
    group: str,
    topic: str,
    ledger: Ledger,
    cycle: int,
    tid: uuid.UUID,
    ends: list[int],
    timeout: float = 60.0,
) -> list[int]:
    """Consume until the share-partition start offsets reach `ends` (or `timeout`)."""
    stop = threading.Event()
    thread, failures = start_consumer(broker, group, topic, ledger, cycle, stop, processing_s=0)
    last: list[int] = []

    def done() -> bool:
        nonlocal last
        last = start_offsets(broker, group, tid, len(ends))
        return last == ends

    try:
        wait_until(done, timeout, step=0.5)
    finally:
        stop.set()
        join_consumer(thread, failures)
    return start_offsets(broker, group, tid, len(ends))


# --- kill -9 under traffic ------------------------------------------------------------


@BOTH_STORAGES
@pytest.mark.timeout(200)
def test_confirmed_acceptances_and_delivery_counts_survive_kill9_under_traffic(
    broker_factory: Callable[..., Broker], storage: str
) -> None:
    # A consumer whose join the kill cut off rejoins under a new member id; the old id
    # keeps its share of the assignment until its session times out, as in Kafka. A short
    # session timeout lets such a zombie go within a cycle, so one live consumer gets
    # every partition again.
    # On PostgreSQL every other kill also loses the data dir (the machine is gone): the
    # new broker starts on an empty one and restores everything from the database.
    machine_loss = storage == "postgresql"
    broker = broker_factory(
        {
            **SHORT_LOCK,
            "group.share.delivery.count.limit": str(COUNT_LIMIT),
            "group.share.min.session.timeout.ms": "3000",
            "group.share.session.timeout.ms": "4000",
            "group.share.min.heartbeat.interval.ms": "500",
            "group.share.heartbeat.interval.ms": "1000",
        }
    )
    topic, group, partitions, per_partition = "crash-cycles", "g-crash-cycles", 2, 1000
    cycles = 10
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    create_topic(broker, topic, partitions=partitions)
    earliest(broker, group)
    for p in range(partitions):
        values = [f"c{p}-{i}".encode() for i in range(per_partition)]
        produce_values(broker, topic, values, partition=p, batch=10)
    tid = topic_ids(broker)[topic]
    everything = {(p, o) for p in range(partitions) for o in range(per_partition)}

    ledger = Ledger()
    kills: list[str] = []
    run_deadline = time.monotonic() + 110
    for cycle in range(cycles):
        if time.monotonic() > run_deadline or len(ledger.confirmed) >= len(everything) * 0.9:
            break
        stop = threading.Event()
        thread, failures = start_consumer(broker, group, topic, ledger, cycle, stop)
        try:
            got_traffic = wait_until(
                lambda c=cycle: any(s[-1].cycle == c for s in ledger.deliveries.values()), 20
            )
            if (
                not got_traffic
                and start_offsets(broker, group, tid, partitions) == [per_partition] * partitions
            ):
                # Everything is accepted already: acceptances whose commit_sync a kill cut
                # off stay unconfirmed in the ledger, so the 90% rule above can miss this.
                break
            assert got_traffic, f"cycle {cycle}: no delivery within 20 s{recent_log(broker)}"
            delay = rng.uniform(0.2, 1.5)
            time.sleep(delay)
            with ledger.lock:
                ledger.restarting = True
            broker.kill9()
            kills.append(f"cycle {cycle}: kill -9 {delay:.2f}s into traffic")
            if machine_loss and cycle % 2:
                shutil.rmtree(broker.data_dir)
                kills[-1] += ", data dir deleted"
            # Until the new broker is seen serving, a delivery may come from either one
            # (librdkafka hands out what it had fetched before the kill).
            broker.start()
            with ledger.lock:
                ledger.life += 1
                ledger.restarting = False
        finally:
            stop.set()
            join_consumer(thread, failures)

    ends = [per_partition] * partitions
    final = drain(broker, group, topic, ledger, cycles, tid, ends)
    context = (
        f"\nseed {seed}; {len(kills)} kills: {kills}\nconfirmed {len(ledger.confirmed)}, "
        f"unconfirmed accepts {ledger.unconfirmed_accepts}, releases {ledger.releases}, "
        f"commit errors {ledger.commit_errors[:5]}, poll errors {ledger.poll_errors[:5]}"
    )

    assert len(kills) >= 4, f"too few crash cycles ran{context}"
    # 1. A confirmed acceptance is never undone by a crash.
    assert not ledger.redelivered_after_confirm, (
        "records delivered again after commit_sync confirmed their acceptance:\n"
        + "\n".join(ledger.redelivered_after_confirm[:20])
        + context
        + recent_log(broker)
    )
    # 2. Nothing is lost: every record was delivered, and the start offsets reached the end
    #    (with no REJECT and no record at the count limit, every one ended Acknowledged).
    never = sorted(everything - set(ledger.deliveries))
    assert not never, f"{len(never)} records never delivered, e.g. {never[:10]}{context}"
    assert final == ends, f"share-partition start offsets {final}, expected {ends}{context}"
    at_limit = {k: ledger.counts(k) for k in everything if max(ledger.counts(k)) >= COUNT_LIMIT}
    assert not at_limit, f"records reached the delivery count limit: {at_limit}{context}"

    # 3. Delivery counts carry over. Within one broker life every redelivery has a
    #    higher count than the delivery before it. Across a crash the count never goes
    #    back: the acquisition in flight is not recorded (KIP-932: Acquired is transient,
    #    persisted as Available with the count before it), so the record comes back with
    #    that delivery's count again, or higher if its release was written first. A
    #    delivery seen during a restart may be from either life: only "never back" holds.
    def same_life(a: Seen, b: Seen) -> bool:
        return a.life == b.life and not (a.restarting or b.restarting)

    wrong = {
        k: [(s.cycle, s.life, s.count) for s in seen]
        for k, seen in ledger.deliveries.items()
        if any(
            b.count <= a.count if same_life(a, b) else b.count < a.count
            for a, b in itertools.pairwise(seen)
        )
    }
    assert not wrong, (
        f"{len(wrong)} records redelivered with a delivery count that went back, or did not "
        f"go up within a broker life ((cycle, broker life, count) per delivery): "
        f"{dict(list(wrong.items())[:15])}{context}"
    )
    across_crash = [
        k
        for k, seen in ledger.deliveries.items()
        if any(b.life > a.life for a, b in itertools.pairwise(seen))
    ]
    assert across_crash, f"no record was in flight at a crash and redelivered after it{context}"
    released = [k for k in everything if k[1] % 10 == 3]
    assert all(max(ledger.counts(k)) >= 2 for k in released), (
        f"released records not redelivered with count >= 2{context}"
    )
    # 4. Each restart recovered the share state by replaying its log.
    loaded = share_state_loaded(broker)
    assert len(loaded) == broker.starts, f"share_state_loaded lines {loaded}{context}"
    assert all(n > 0 for n in loaded[1:]), f"a restart replayed no share state: {loaded}"
    recovered = log_lines(broker, "log_loaded", "clean_shutdown=False", "share-state")
    assert len(recovered) >= len(kills), f"share-state log recovery lines: {recovered}"
    failed = log_lines(broker, "request_failed")
    assert not failed, f"requests failed with a server error: {failed[:5]}{recent_log(broker)}"


# --- a torn write at the end of the share-state log -----------------------------------


def last_segment(data_dir: Path) -> Path:
    segments = sorted((data_dir / "share-state").glob("*.log"))
    assert segments, "no share-state segment"
    return segments[-1]


def good_batches(path: Path) -> tuple[int, int, int, bytes]:
    """(valid bytes, next offset, records, last batch bytes) of a segment file."""
    data = path.read_bytes()
    size = next_offset = records = 0
    last = b""
    for pos, header in iter_batches(data, validate=True):
        size = pos + header.size
        next_offset = header.next_offset
        records += header.records_count
        last = data[pos:size]
    return size, next_offset, records, last


def garbage(kind: str, last_batch: bytes, next_offset: int) -> bytes:
    batch = bytearray(last_batch)
    struct.pack_into(">q", batch, 0, next_offset)  # as if it were the next batch
    if kind == "torn-header":
        return bytes(batch[:30])
    if kind == "torn-batch":
        return bytes(batch[:-5])
    if kind == "bad-crc":
        batch[-3] ^= 0xFF  # inside the records: the CRC no longer matches
        return bytes(batch)
    raise ValueError(kind)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["torn-header", "torn-batch", "bad-crc"])
def test_torn_share_state_tail_is_cut_at_the_last_good_batch_and_the_broker_keeps_working(
    broker_factory: Callable[..., Broker], kind: str
) -> None:
    broker = broker_factory({**SHORT_LOCK, "log.cleaner.backoff.ms": "600000"})
    topic, group, total = "torn-tail", "g-torn-tail", 300
    create_topic(broker, topic)
    earliest(broker, group)
    produce_values(broker, topic, [f"t{i}".encode() for i in range(total)], batch=10)
    tid = topic_ids(broker)[topic]

    # Phase 1: accept about half, confirmed by commit_sync, then kill -9.
    ledger = Ledger()
    stop = threading.Event()
    accept = lambda _m: AcknowledgeType.ACCEPT  # noqa: E731
    thread, failures = start_consumer(
        broker, group, topic, ledger, 0, stop, decide=accept, processing_s=0.02
    )
    try:
        wait_until(lambda: len(ledger.confirmed) >= total // 2, 40)
    finally:
        stop.set()
        join_consumer(thread, failures)
    assert ledger.confirmed, f"nothing confirmed in phase 1{recent_log(broker)}"
    confirmed_before = set(ledger.confirmed)
    spso_before = start_offsets(broker, group, tid, 1)
    broker.kill9()

    segment = last_segment(broker.data_dir)
    good_size, good_end, good_records, last_batch = good_batches(segment)
    assert good_size == segment.stat().st_size, "the kill left a torn tail already"
    junk = garbage(kind, last_batch, good_end)
    with segment.open("ab") as f:
        f.write(junk)

    broker.start()
    cut = log_lines(broker, "log_truncated_torn_tail", "share-state")
    assert cut, f"no torn-tail truncation logged for share-state{recent_log(broker)}"
    assert f"truncated_bytes={len(junk)}" in cut[-1] and f"log_end_offset={good_end}" in cut[-1], (
        f"expected {len(junk)} bytes cut and the log to end at {good_end}: {cut[-1]}"
    )
    loaded = share_state_loaded(broker)
    assert loaded[-1] == good_records, (
        f"replayed {loaded[-1]} records after the cut, expected the {good_records} good ones"
    )
    assert start_offsets(broker, group, tid, 1) == spso_before, "state before the cut changed"

    # Phase 2: the rest is delivered, nothing confirmed before is redelivered.
    final = drain(broker, group, topic, ledger, 1, tid, [total])
    assert not ledger.redelivered_after_confirm, "\n".join(ledger.redelivered_after_confirm[:20])
    phase2 = {k for k, seen in ledger.deliveries.items() if any(s.cycle == 1 for s in seen)}
    assert phase2, "nothing was consumed after the repair"
    assert not phase2 & confirmed_before
    assert final == [total], f"start offset {final}, expected {total}{recent_log(broker)}"

    # The repaired log stays sound: a clean restart loads it, state intact. A clean stop
    # checkpoints the whole log, so the restart loads that and replays nothing after it.
    loads_before = len(log_lines(broker, "checkpoint_loaded", "share-state"))
    broker.restart()
    assert start_offsets(broker, group, tid, 1) == [total]
    loads = log_lines(broker, "checkpoint_loaded", "share-state")
    assert len(loads) == loads_before + 1, f"no checkpoint loaded{recent_log(broker)}"
    offset = re.search(r" offset=(\d+)", loads[-1])
    end = re.search(r"log_end_offset=(\d+)", loads[-1])
    assert offset and end and offset.group(1) == end.group(1), loads[-1]
    assert int(end.group(1)) > good_end


# --- replay equals live ---------------------------------------------------------------


def decide_mixed(m: Message) -> AcknowledgeType:
    o, count = m.offset(), m.delivery_count()
    if o % 7 == 1:
        return AcknowledgeType.REJECT
    if o % 7 == 2 and count == 1:
        return AcknowledgeType.RELEASE
    if o % 7 == 4 and count <= 2:
        return AcknowledgeType.RELEASE
    return AcknowledgeType.ACCEPT


def run_mixed_workload(
    broker: Broker, group: str, topic: str, until_confirmed: int, expire_once: bool
) -> Ledger:
    """Accepts, rejects and releases; with `expire_once`, one poll's records are held past
    their lock before being acknowledged (those acknowledgements fail)."""
    ledger = Ledger()
    consumer = share_consumer(
        broker, group, [topic], **{"max.poll.records": 10, "logger": CLIENT_LOGGER}
    )
    expired = not expire_once
    deadline = time.monotonic() + 60
    try:
        for _ in range(2_000):
            if len(ledger.confirmed) >= until_confirmed or time.monotonic() > deadline:
                break
            data = [m for m in consumer.poll(0.3) if m.error() is None]
            if not data:
                continue
            ledger.delivered(0, data)
            if not expired and len(ledger.confirmed) > 20:
                time.sleep(3.0)  # past the 2 s lock: the broker makes them available again
                expired = True
            acks = [(m, decide_mixed(m)) for m in data]
            for m, kind in acks:
                consumer.acknowledge(m, kind)
            result = consumer.commit_sync(10.0)
            ok = {tp.partition for tp, err in result.items() if err is None}
            ledger.committed(0, acks, ok)
    finally:
        close_quietly(consumer)
    return ledger


@pytest.mark.timeout(150)
def test_replaying_the_share_state_log_gives_the_state_the_live_broker_reported(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(
        {
            **SHORT_LOCK,
            # Snapshots every few updates, small segments, and compaction of closed
            # segments while the workload runs: replay goes through all of them.
            "share.coordinator.snapshot.update.records.per.snapshot": "7",
            "share.coordinator.state.topic.segment.bytes": "4096",
            "log.cleaner.backoff.ms": "500",
        }
    )
    topic, partitions, per_partition = "replay", 2, 150
    groups = ["g-replay-mixed", "g-replay-partial"]
    create_topic(broker, topic, partitions=partitions)
    for g in groups:
        earliest(broker, g)
    for p in range(partitions):
        produce_values(
            broker, topic, [f"r{p}-{i}".encode() for i in range(per_partition)], p, batch=10
        )
    tid = topic_ids(broker)[topic]

    mixed = run_mixed_workload(broker, groups[0], topic, 2 * per_partition, expire_once=True)
    assert not mixed.redelivered_after_confirm, mixed.redelivered_after_confirm[:10]
    assert log_lines(broker, "acquisition_locks_expired"), (
        f"the held poll's locks never expired{recent_log(broker)}"
    )
    # The second group stops part way, leaving released and acknowledged records in flight.
    run_mixed_workload(broker, groups[1], topic, per_partition // 2, expire_once=False)

    keys = [ShareStateKey(g, tid, p) for g in groups for p in range(partitions)]

    def live_state() -> dict[ShareStateKey, tuple[int, int, int, list[tuple[int, ...]]]]:
        out = {}
        for key in keys:
            s = summary(broker, key.group_id, tid, key.partition)
            assert_ok(s, f"summary {key}")
            r = read(broker, key.group_id, tid, key.partition, leader_epoch=int(s.leader_epoch))
            assert_ok(r, f"read {key}")
            out[key] = (int(r.state_epoch), int(s.leader_epoch), int(r.start_offset), batches_of(r))
        return out

    # Consumers are closed: wait until the state stops changing (releases on leave).
    states = [live_state()]
    for _ in range(20):
        time.sleep(0.5)
        states.append(live_state())
        if states[-1] == states[-2]:
            break
    live = states[-1]
    assert live == states[-2], "share state kept changing with no consumer"
    assert any(batches for (_, _, _, batches) in live.values()), "workload left no batches"
    assert any(b[2] == 4 for (_, _, _, batches) in live.values() for b in batches) or any(
        spso > 0 for (_, _, spso, _) in live.values()
    )
    broker.stop()

    plog = PartitionLog.open(broker.data_dir / "share-state", LogConfig(), int(time.time() * 1e3))
    try:
        segments = len(plog.segment_base_offsets)
        shard = ShareCoordinatorShard()
        replayed = 0
        for _, record in read_share_records(plog):
            shard.replay(record)
            replayed += 1
    finally:
        plog.close()
    assert segments > 1, "expected the small segment size to roll the share-state log"

    assert set(shard.keys()) == set(keys), f"replayed keys {sorted(shard.keys())}"
    mismatches = {}
    for key in keys:
        state = shard.state(key)
        assert state is not None
        got = (state.state_epoch, state.leader_epoch, state.start_offset, list(state.batches))
        want = live[key]
        if (got[0], got[1], got[2], [tuple(b) for b in got[3]]) != want:
            mismatches[key] = {"replayed": got, "live": want}
    assert not mismatches, f"replay of {replayed} records differs from live: {mismatches}"

    # The broker's own startup replay agrees too.
    broker.start()
    assert live_state() == live
