"""A share consumer speaking the protocol itself, shaped like Kafka's Java
KafkaShareConsumer 4.2, for benchmarks that must measure brokers rather than a
client's fetch loop (bench.cluster).

Kafka 4.2's Java share consumer (ShareConsumeRequestManager, ShareSessionHandler,
Acknowledgements) and this one do the same things on the wire:

- The group: FindCoordinator for the group id (key type GROUP: a share group lives in
  the group coordinator; the SHARE key type names the share-state coordinator, which
  only brokers look up), ShareGroupHeartbeat to it every heartbeat interval the
  coordinator gives, joining with member epoch 0 and a member id the client made
  (Kafka's Uuid string), rejoining after UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH,
  finding the coordinator again after NOT_COORDINATOR; leaving with epoch -1.
- Leaders from Metadata. One ShareFetch per leader node holding assigned partitions,
  all in flight at once; a node's next ShareFetch goes out as soon as its previous
  answer is handled, so a node with nothing to give delays nobody. The defaults are
  the Java client's: fetch.max.wait.ms 500, fetch.min.bytes 1, fetch.max.bytes 50 MiB,
  max.poll.records 500 (MaxRecords and BatchSize), share.acquire.mode batch_optimized.
- A share session per node: epoch 0 opens it naming every partition, then each
  request names only partitions added (and forgets those that left the node's share:
  reassigned, or led elsewhere now) and the epoch advances by one per answer. A
  session error (SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH, ...) starts a
  new one; acknowledgements cannot ride on an opening request and are failed then, as
  Kafka's client fails them.
- NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH on a partition: the CurrentLeader and
  NodeEndpoints of the answer (KIP-951) move it at once when they name a newer
  leader, and Metadata is asked again either way; its acknowledgements are failed.
- Explicit acknowledgement of every delivered record, ACCEPT, piggybacked on the next
  ShareFetch to the node it came from. The acknowledgement batches cover each
  acquired range: ACCEPT where a record was delivered and GAP (type 0) on offsets
  with no record (a control batch, a compacted offset), one type per run of equal
  types as Acknowledgements.getAcknowledgementBatches sends them. What was delivered
  is read from the batch headers (`iter_batches`, CRCs checked as the Java client's
  check.crcs does): a batch whose record count matches its offset span holds a record
  at every offset; only a batch that does not is decoded, to find its offsets.
  Records are otherwise not decoded: the benchmark's application only counts them.
- close(): waits for the fetches in flight, sends what is left to acknowledge with
  ShareAcknowledge closing each session (epoch -1), and leaves the group.

It is not a general client: one topic, PLAINTEXT, no rebalance listener, no
record_limit acquire mode, no retries beyond the ones above. `build_acknowledgements`
and `delivered_runs` are sans-IO (tests/unit/test_bench_share_client.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from protocol import api
from protocol.client import ClientError, KafkaClient
from protocol.errors import CorruptRecordError, ErrorCode
from protocol.records import decode_records, iter_batches, validate_batch

METADATA, FIND_COORDINATOR, SHARE_GROUP_HEARTBEAT = 3, 10, 76
SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79
METADATA_VERSION, FIND_COORDINATOR_VERSION, HEARTBEAT_VERSION = 12, 6, 1
SHARE_FETCH_VERSION = SHARE_ACKNOWLEDGE_VERSION = 1

GAP, ACCEPT, RELEASE, REJECT = 0, 1, 2, 3
GROUP_KEY_TYPE = 0
JOIN_EPOCH, LEAVE_EPOCH = 0, -1
OPEN_SESSION, CLOSE_SESSION = 0, -1
INT32_MAX = 2**31 - 1

# The Java share consumer's defaults (ConsumerConfig / ShareFetchConfig).
FETCH_MAX_WAIT_MS = 500
FETCH_MIN_BYTES = 1
FETCH_MAX_BYTES = 52_428_800
MAX_POLL_RECORDS = 500
RETRY_BACKOFF_S = 0.1

LEADER_MOVED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)
METADATA_STALE = (
    ErrorCode.unknown_topic_or_partition,
    ErrorCode.unknown_topic_id,
    ErrorCode.leader_not_available,
    ErrorCode.unknown_leader_epoch,
)
COORDINATOR_MOVED = (
    ErrorCode.not_coordinator,
    ErrorCode.coordinator_not_available,
    ErrorCode.coordinator_load_in_progress,
)

AckBatch = tuple[int, int, int]  # first offset, last offset, acknowledge type
Range = tuple[int, int]  # first, last offset (inclusive)


# --- sans-IO: what a ShareFetch answer delivered, and its acknowledgements -----------


def delivered_runs(records: bytes | memoryview) -> list[Range]:
    """The offsets holding a delivered record in a partition's Records, as sorted runs.

    Read from the batch headers: a data batch whose record count equals its offset
    span holds every offset of it; a control batch delivers nothing; any other batch
    (offsets compacted away) is decoded to find the offsets it has. CRCs are checked
    (CorruptRecordError); a trailing partial batch is ignored, as the Java client does."""
    runs: list[Range] = []

    def add(first: int, last: int) -> None:
        if runs and runs[-1][1] + 1 >= first:
            runs[-1] = (runs[-1][0], max(runs[-1][1], last))
        else:
            runs.append((first, last))

    for pos, header in iter_batches(records, validate=False):
        validate_batch(records, pos, header)
        if header.is_control or header.records_count == 0:
            continue
        if header.records_count == header.last_offset_delta + 1:
            add(header.base_offset, header.last_offset)
            continue
        for record in decode_records(records, pos, header):
            add(record.offset, record.offset)
    runs.sort()
    return runs


@dataclasses.dataclass(slots=True)
class Delivery:
    """What one partition's answer delivered: records by first or later delivery, and
    the acknowledgement batches settling every acquired offset."""

    first: int = 0
    redelivered: int = 0
    acks: list[AckBatch] = dataclasses.field(default_factory=list)

    @property
    def records(self) -> int:
        return self.first + self.redelivered


def build_acknowledgements(
    acquired: Iterable[tuple[int, int, int]],
    runs: Sequence[Range],
    ack_type: int = ACCEPT,
) -> Delivery:
    """The acknowledgements for acquired ranges (first, last, delivery count) given the
    runs of offsets that hold a delivered record (`delivered_runs`): `ack_type` where
    a record was delivered, GAP where none was, merged into one batch per run of equal
    types; delivered records counted by first delivery or not."""
    out = Delivery()
    acks = out.acks

    def emit(first: int, last: int, kind: int) -> None:
        if acks and acks[-1][2] == kind and acks[-1][1] + 1 == first:
            acks[-1] = (acks[-1][0], last, kind)
        else:
            acks.append((first, last, kind))

    i = 0
    for first, last, delivery_count in sorted(acquired):
        # Runs ending before this range cannot cover it or any later one.
        while i < len(runs) and runs[i][1] < first:
            i += 1
        at = first
        j = i
        while j < len(runs) and runs[j][0] <= last:
            lo, hi = max(runs[j][0], at), min(runs[j][1], last)
            if lo > at:
                emit(at, lo - 1, GAP)
            if hi >= lo:
                emit(lo, hi, ack_type)
                if delivery_count <= 1:
                    out.first += hi - lo + 1
                else:
                    out.redelivered += hi - lo + 1
                at = hi + 1
            if runs[j][1] > last:
                break
            j += 1
        if at <= last:
            emit(at, last, GAP)
    return out


def ack_batch_bodies(acks: Iterable[AckBatch]) -> list[dict[str, Any]]:
    """AcknowledgementBatches as ShareFetch/ShareAcknowledge request mappings."""
    return [
        {"first_offset": first, "last_offset": last, "acknowledge_types": [kind]}
        for first, last, kind in acks
    ]


def next_epoch(epoch: int) -> int:
    """A share session's next epoch (2^31 - 1 wraps to 1, as Kafka's nextEpoch)."""
    return 1 if epoch == INT32_MAX else epoch + 1


def kafka_uuid_string() -> str:
    """A member id as Kafka's Uuid.toString makes them: url-safe base64, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def warm_up() -> None:
    """Load the ShareFetch and ShareAcknowledge codecs (kio builds its schema classes
    on first use, about 0.1 s of CPU), so the first fetch does not pay for it."""
    sample = {
        "group_id": "g",
        "member_id": "m",
        "share_session_epoch": 1,
        "topics": [
            {
                "topic_id": uuid.uuid4(),
                "partitions": [
                    {
                        "partition_index": 0,
                        "acknowledgement_batches": ack_batch_bodies([(0, 0, ACCEPT)]),
                    }
                ],
            }
        ],
    }
    for key, version, more in (
        (SHARE_FETCH, SHARE_FETCH_VERSION, {"forgotten_topics_data": []}),
        (SHARE_ACKNOWLEDGE, SHARE_ACKNOWLEDGE_VERSION, {}),
    ):
        request = api.build(api.request_class(key, version), {**sample, **more})
        api.encode_request(key, version, 0, "warm-up", request)
        response = api.build_response(key, version, {})
        api.decode_response(key, version, api.encode_response(key, version, 0, response)[4:])


# --- the consumer -------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _NodeSession:
    """Kafka's ShareSessionHandler for one node: its session's partitions and epoch,
    the acknowledgements waiting for the next request, and its fetch loop."""

    epoch: int = OPEN_SESSION
    partitions: set[int] = dataclasses.field(default_factory=set)
    acks: dict[int, list[AckBatch]] = dataclasses.field(default_factory=dict)
    task: asyncio.Task[None] | None = None


@dataclasses.dataclass(slots=True)
class Stats:
    """What the consumer saw; `ack_failed` counts records whose acknowledgement was
    refused or could not be sent."""

    first: int = 0
    redelivered: int = 0
    fetches: int = 0
    empty_fetches: int = 0
    acked: int = 0
    ack_failed: int = 0
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    # Per node: ShareFetch answers, their seconds in flight, records delivered.
    node_fetches: dict[int, list[float]] = dataclasses.field(default_factory=dict)

    def fetched(self, node: int, seconds: float, records: int) -> None:
        counts = self.node_fetches.setdefault(node, [0, 0.0, 0])
        counts[0] += 1
        counts[1] += seconds
        counts[2] += records

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


class ShareConsumer:
    """A share group member reading one topic; see the module docstring.

    `on_records(first, redelivered)` is called for every answer that delivered records,
    after its acknowledgements were queued for the next request."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic: str,
        *,
        client_id: str = "spool-bench-share",
        max_wait_ms: int = FETCH_MAX_WAIT_MS,
        min_bytes: int = FETCH_MIN_BYTES,
        max_bytes: int = FETCH_MAX_BYTES,
        max_records: int = MAX_POLL_RECORDS,
        on_records: Callable[[int, int], None] | None = None,
    ) -> None:
        self.bootstrap = [
            (host, int(port)) for host, port in (a.rsplit(":", 1) for a in bootstrap.split(","))
        ]
        self.group, self.topic, self.client_id = group, topic, client_id
        self.max_wait_ms, self.min_bytes = max_wait_ms, min_bytes
        self.max_bytes, self.max_records = max_bytes, max_records
        self.on_records = on_records
        self.member_id = kafka_uuid_string()
        self.member_epoch = JOIN_EPOCH
        self.heartbeat_interval_s = 5.0
        self.assigned: frozenset[int] = frozenset()
        self.topic_id: uuid.UUID | None = None
        self.leaders: dict[int, tuple[int, int]] = {}  # partition -> (node, leader epoch)
        self.nodes: dict[int, tuple[str, int]] = {}
        self.stats = Stats()
        self._conns: dict[int | tuple[str, int], KafkaClient] = {}
        self._sessions: dict[int, _NodeSession] = {}
        self._coordinator: tuple[str, int] | None = None
        self._changed = asyncio.Event()
        self._metadata_stale = False
        self._fetching = False
        self._closing = False
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._metadata_task: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None

    # -- connections ---------------------------------------------------------------------

    async def _conn(self, key: int | tuple[str, int]) -> KafkaClient:
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            return conn
        host, port = self.nodes[key] if isinstance(key, int) else key
        conn = await KafkaClient.connect(host, port, self.client_id)
        self._conns[key] = conn
        return conn

    async def _any_request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """A request to any reachable broker (known nodes first, then the bootstrap)."""
        last: Exception | None = None
        for key in [*self.nodes, *self.bootstrap]:
            try:
                return await (await self._conn(key)).request(api_key, version, body)
            except (ClientError, OSError, TimeoutError) as exc:
                last = exc
        raise ClientError(f"no broker reachable: {last}")

    # -- metadata ------------------------------------------------------------------------

    async def refresh_metadata(self) -> None:
        md = await self._any_request(
            METADATA,
            METADATA_VERSION,
            {
                "topics": [{"name": self.topic}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
        self.nodes = {int(b.node_id): (b.host, int(b.port)) for b in md.brokers}
        for t in md.topics:
            if t.name != self.topic or t.error_code != ErrorCode.none:
                continue
            self.topic_id = uuid.UUID(str(t.topic_id))
            self.leaders = {
                int(p.partition_index): (int(p.leader_id), int(p.leader_epoch))
                for p in t.partitions
            }
        self._metadata_stale = False
        self._changed.set()

    def _want_metadata(self) -> None:
        self._metadata_stale = True
        if self._metadata_task is None or self._metadata_task.done():
            self._metadata_task = asyncio.create_task(self._metadata_refresher())

    async def _metadata_refresher(self) -> None:
        while self._metadata_stale and not self._closing:
            with contextlib.suppress(ClientError, OSError, TimeoutError):
                await self.refresh_metadata()
                return
            await asyncio.sleep(RETRY_BACKOFF_S)

    # -- the group -----------------------------------------------------------------------

    async def _find_coordinator(self) -> tuple[str, int]:
        while True:
            resp = await self._any_request(
                FIND_COORDINATOR,
                FIND_COORDINATOR_VERSION,
                {"key_type": GROUP_KEY_TYPE, "coordinator_keys": [self.group]},
            )
            (c,) = resp.coordinators
            if c.error_code == ErrorCode.none:
                return c.host, int(c.port)
            self.stats.error(f"FindCoordinator {ErrorCode(c.error_code).name}")
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def _heartbeat(self, epoch: int) -> Any:
        if self._coordinator is None:
            self._coordinator = await self._find_coordinator()
        conn = await self._conn(self._coordinator)
        return await conn.request(
            SHARE_GROUP_HEARTBEAT,
            HEARTBEAT_VERSION,
            {
                "group_id": self.group,
                "member_id": self.member_id,
                "member_epoch": epoch,
                "rack_id": None,
                "subscribed_topic_names": [self.topic] if epoch == JOIN_EPOCH else None,
            },
        )

    async def heartbeat_once(self) -> None:
        """One ShareGroupHeartbeat; takes the assignment and interval it returns."""
        try:
            hb = await self._heartbeat(self.member_epoch)
        except (ClientError, OSError, TimeoutError):
            self.stats.error("heartbeat connection")
            self._coordinator = None
            return
        code = ErrorCode(hb.error_code)
        if code in COORDINATOR_MOVED:
            self._coordinator = None
            return
        if code in (ErrorCode.unknown_member_id, ErrorCode.fenced_member_epoch):
            self.stats.error(f"heartbeat {code.name}")
            self.member_epoch = JOIN_EPOCH  # rejoin with the same member id
            return
        if code != ErrorCode.none:
            self.stats.error(f"heartbeat {code.name}")
            return
        self.member_epoch = int(hb.member_epoch)
        interval_ms = hb.heartbeat_interval.total_seconds() * 1000
        if interval_ms > 0:
            self.heartbeat_interval_s = interval_ms / 1000
        if hb.assignment is not None:
            parts: set[int] = set()
            for tp in hb.assignment.topic_partitions:
                if self.topic_id is None or uuid.UUID(str(tp.topic_id)) != self.topic_id:
                    self._want_metadata()
                parts.update(int(p) for p in tp.partitions)
            self.assigned = frozenset(parts)
            self._changed.set()

    async def _heartbeats(self) -> None:
        while not self._closing:
            # A member joining (epoch 0) is answered at once; then the interval.
            await asyncio.sleep(0 if self.member_epoch == JOIN_EPOCH else self.heartbeat_interval_s)
            if self._closing:
                return
            await self.heartbeat_once()

    async def start(self) -> None:
        """Metadata, the coordinator, the join; heartbeats from then on. Fetching
        starts with `fetch()`."""
        await self.refresh_metadata()
        await self.heartbeat_once()
        self._heartbeat_task = asyncio.create_task(self._heartbeats())
        warm_up()

    # -- fetching ------------------------------------------------------------------------

    def _wanted(self, node: int) -> set[int]:
        """The assigned partitions `node` leads."""
        return {p for p in self.assigned if self.leaders.get(p, (-1, -1))[0] == node}

    def fetch(self) -> None:
        """Start fetching: one loop per leader node of the assigned partitions."""
        self._fetching = True
        self._changed.set()
        # Held here: the event loop keeps only weak references to tasks.
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def _supervise(self) -> None:
        """A fetch loop for every node with partitions to fetch, a session to trim or
        acknowledgements to send, started when the assignment or the leaders change."""
        while not self._closing:
            await self._changed.wait()
            self._changed.clear()
            if self._closing:
                return
            if self._metadata_stale:
                self._want_metadata()
            nodes = {self.leaders.get(p, (-1, -1))[0] for p in self.assigned}
            nodes |= {n for n, s in self._sessions.items() if s.partitions or s.acks}
            for node in nodes:
                if node < 0:
                    self._want_metadata()
                    continue
                session = self._sessions.setdefault(node, _NodeSession())
                if session.task is None or session.task.done():
                    session.task = asyncio.create_task(self._fetch_loop(node, session))

    def _request_body(
        self, node: int, session: _NodeSession
    ) -> tuple[dict[str, Any], dict[int, list[AckBatch]]] | None:
        """The next ShareFetch to `node` (Kafka's newShareFetchBuilder) and the
        acknowledgements it carries, or None when there is nothing to fetch, forget or
        acknowledge there."""
        wanted = self._wanted(node)
        if session.epoch == OPEN_SESSION:
            if session.acks:
                # An opening request cannot carry acknowledgements (INVALID_REQUEST).
                self._fail_acks(session.acks)
                session.acks = {}
            session.partitions = set(wanted)
            added, removed = wanted, set()
        else:
            added, removed = wanted - session.partitions, session.partitions - wanted
            session.partitions = set(wanted)
        if not wanted and not removed and not session.acks:
            return None
        acks = session.acks
        session.acks = {}
        named = sorted(added | set(acks))
        body = {
            "group_id": self.group,
            "member_id": self.member_id,
            "share_session_epoch": session.epoch,
            "max_wait": self.max_wait_ms if wanted else 0,
            "min_bytes": self.min_bytes if wanted else 0,
            "max_bytes": self.max_bytes if wanted else 0,
            "max_records": self.max_records if wanted else 0,
            "batch_size": self.max_records if wanted else 0,
            "topics": [
                {
                    "topic_id": self.topic_id,
                    "partitions": [
                        {
                            "partition_index": p,
                            "acknowledgement_batches": ack_batch_bodies(acks.get(p, ())),
                        }
                        for p in named
                    ],
                }
            ]
            if named
            else [],
            "forgotten_topics_data": [{"topic_id": self.topic_id, "partitions": sorted(removed)}]
            if removed
            else [],
        }
        return body, acks

    def _fail_acks(self, acks: dict[int, list[AckBatch]]) -> None:
        self.stats.ack_failed += sum(
            last - first + 1 for batches in acks.values() for first, last, kind in batches if kind
        )

    async def _fetch_loop(self, node: int, session: _NodeSession) -> None:
        while not self._closing and self._fetching:
            request = self._request_body(node, session)
            if request is None:
                return
            body, acks = request
            try:
                conn = await self._conn(node)
                sent = time.perf_counter()
                resp = await conn.request(
                    SHARE_FETCH, SHARE_FETCH_VERSION, body, 30 + self.max_wait_ms / 1000
                )
            except (ClientError, OSError, TimeoutError, KeyError) as exc:
                self.stats.error(f"ShareFetch {type(exc).__name__}")
                self._fail_acks(acks)
                session.epoch = OPEN_SESSION
                self._want_metadata()
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            took = time.perf_counter() - sent
            self.stats.fetched(node, took, self._handle_fetch(node, session, acks, resp))

    def _handle_fetch(
        self,
        node: int,
        session: _NodeSession,
        sent_acks: dict[int, list[AckBatch]],
        resp: Any,
    ) -> int:
        """Kafka's handleShareFetchSuccess: the session epoch, each partition's records
        (acknowledged for the next request) and errors (leaders moved); returns how many
        records it delivered."""
        self.stats.fetches += 1
        code = ErrorCode(resp.error_code)
        if code != ErrorCode.none:
            self.stats.error(f"ShareFetch {code.name}")
            self._fail_acks(sent_acks)
            session.epoch = OPEN_SESSION  # a new session, named in full
            if code not in (
                ErrorCode.share_session_not_found,
                ErrorCode.invalid_share_session_epoch,
            ):
                self._want_metadata()
            return 0
        session.epoch = next_epoch(session.epoch)
        endpoints = {int(e.node_id): (e.host, int(e.port)) for e in resp.node_endpoints}
        first = redelivered = 0
        for t in resp.responses:
            for p in t.partitions:
                partition = int(p.partition_index)
                acked = sent_acks.get(partition)
                if acked:
                    counted = sum(last - f + 1 for f, last, kind in acked if kind)
                    if p.acknowledge_error_code == ErrorCode.none:
                        self.stats.acked += counted
                    else:
                        self.stats.ack_failed += counted
                        self.stats.error(f"acknowledge {ErrorCode(p.acknowledge_error_code).name}")
                perr = ErrorCode(p.error_code)
                if perr != ErrorCode.none:
                    self._partition_error(partition, perr, p.current_leader, endpoints)
                    continue
                if not p.acquired_records:
                    continue
                try:
                    runs = delivered_runs(p.records or b"")
                except CorruptRecordError:
                    # The Java client raises it to the application; its records stay
                    # acquired until their lock times out and come again.
                    self.stats.error("CORRUPT_MESSAGE")
                    continue
                delivery = build_acknowledgements(
                    (
                        (int(r.first_offset), int(r.last_offset), int(r.delivery_count))
                        for r in p.acquired_records
                    ),
                    runs,
                )
                if delivery.acks:
                    session.acks.setdefault(partition, []).extend(delivery.acks)
                first += delivery.first
                redelivered += delivery.redelivered
        if first or redelivered:
            self.stats.first += first
            self.stats.redelivered += redelivered
            if self.on_records is not None:
                self.on_records(first, redelivered)
        else:
            self.stats.empty_fetches += 1
        return first + redelivered

    def _partition_error(
        self, partition: int, code: ErrorCode, leader: Any, endpoints: dict[int, tuple[str, int]]
    ) -> None:
        self.stats.error(f"partition {code.name}")
        if code in LEADER_MOVED:
            new_id, new_epoch = int(leader.leader_id), int(leader.leader_epoch)
            _, known_epoch = self.leaders.get(partition, (-1, -1))
            if (
                new_id >= 0
                and new_epoch > known_epoch
                and (new_id in self.nodes or new_id in endpoints)
            ):
                self.nodes.setdefault(new_id, endpoints.get(new_id, ("", 0)))
                if new_id in endpoints:
                    self.nodes[new_id] = endpoints[new_id]
                self.leaders[partition] = (new_id, new_epoch)
                self._changed.set()
        self._want_metadata()

    # -- closing -------------------------------------------------------------------------

    async def close(self, timeout_s: float = 10.0) -> None:
        """Kafka's close: let the fetches in flight answer (acknowledging what they
        bring), send the remaining acknowledgements in a ShareAcknowledge closing each
        session, and leave the group."""
        self._fetching = False
        loops = [s.task for s in self._sessions.values() if s.task is not None]
        if loops:
            await asyncio.wait(loops, timeout=self.max_wait_ms / 1000 + timeout_s)
        self._closing = True
        self._changed.set()
        closing = [
            self._close_session(node, s)
            for node, s in self._sessions.items()
            if s.epoch != OPEN_SESSION
        ]
        if closing:
            await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), timeout_s)
        for task in (self._heartbeat_task, self._metadata_task, self._supervisor):
            if task is not None:
                task.cancel()
        with contextlib.suppress(ClientError, OSError, TimeoutError):
            await asyncio.wait_for(self._heartbeat(LEAVE_EPOCH), timeout_s)
        for conn in self._conns.values():
            with contextlib.suppress(Exception):
                await conn.close()

    async def _close_session(self, node: int, session: _NodeSession) -> None:
        acks, session.acks = session.acks, {}
        body = {
            "group_id": self.group,
            "member_id": self.member_id,
            "share_session_epoch": CLOSE_SESSION,
            "topics": [
                {
                    "topic_id": self.topic_id,
                    "partitions": [
                        {"partition_index": p, "acknowledgement_batches": ack_batch_bodies(b)}
                        for p, b in sorted(acks.items())
                    ],
                }
            ]
            if acks
            else [],
        }
        try:
            resp = await (await self._conn(node)).request(
                SHARE_ACKNOWLEDGE, SHARE_ACKNOWLEDGE_VERSION, body
            )
        except (ClientError, OSError, TimeoutError, KeyError):
            self._fail_acks(acks)
            return
        if resp.error_code != ErrorCode.none:
            self.stats.error(f"ShareAcknowledge {ErrorCode(resp.error_code).name}")
            self._fail_acks(acks)
            return
        for t in resp.responses:
            for p in t.partitions:
                counted = sum(
                    last - f + 1 for f, last, kind in acks.get(int(p.partition_index), ()) if kind
                )
                if p.error_code == ErrorCode.none:
                    self.stats.acked += counted
                else:
                    self.stats.ack_failed += counted
                    self.stats.error(f"acknowledge {ErrorCode(p.error_code).name}")


# --- a consumer process for bench.cluster ------------------------------------------------


def consumer_process(
    bootstrap: str,
    topic: str,
    group: str,
    expected: int,
    time_limit_s: float,
    shared: Any,
    lock: Any,
    go: Any,
    stop: Any,
) -> None:
    """One ShareConsumer in its own process, as bench.cluster's librdkafka consumer
    processes: joins, counts itself ready (shared[5]), fetches once `go` is set, adds
    its deliveries to `shared` = [records (first deliveries), first_at, done_at,
    redeliveries, errors, ready, acknowledgements failed, acknowledged, fetches,
    empty fetches] and sets
    `stop` when the group has read `expected` records."""
    asyncio.run(_consume(bootstrap, topic, group, expected, time_limit_s, shared, lock, go, stop))


async def _consume(
    bootstrap: str,
    topic: str,
    group: str,
    expected: int,
    time_limit_s: float,
    shared: Any,
    lock: Any,
    go: Any,
    stop: Any,
) -> None:
    def on_records(first: int, redelivered: int) -> None:
        now = time.monotonic()
        with lock:
            if shared[1] == 0.0:
                shared[1] = now
            shared[0] += first
            shared[3] += redelivered
            if shared[0] >= expected and shared[2] == 0.0:
                shared[2] = now
                stop.set()

    consumer = ShareConsumer(bootstrap, group, topic, on_records=on_records)
    await consumer.start()
    with lock:
        shared[5] += 1
    deadline = time.monotonic() + time_limit_s
    while not go.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    deadline = time.monotonic() + time_limit_s
    consumer.fetch()
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await consumer.close()
        with lock:
            shared[4] += sum(consumer.stats.errors.values())
            shared[6] += consumer.stats.ack_failed
            shared[7] += consumer.stats.acked
            shared[8] += consumer.stats.fetches
            shared[9] += consumer.stats.empty_fetches
        if os.environ.get("SPOOL_BENCH_CLUSTER_DEBUG"):
            per_node = ", ".join(
                f"node {n}: {int(c)} fetches, {s / max(c, 1) * 1000:.1f} ms each, {int(r)} records"
                for n, (c, s, r) in sorted(consumer.stats.node_fetches.items())
            )
            print(
                f"share_client {consumer.member_id}: partitions {sorted(consumer.assigned)}; "
                f"{per_node}; errors {consumer.stats.errors}",
                file=sys.stderr,
                flush=True,
            )
