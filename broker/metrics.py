"""What operators watch: counters for a Prometheus `/metrics` and a `/health` endpoint.

Counting and exposition are kept apart so that counting costs the broker nothing:

- The event-loop thread bumps plain ints and bucket lists on objects cached per API and
  per share partition (`BrokerMetrics`, `ShareMetrics`): no locks, at most one dict
  lookup per request, never a label lookup per record.
- A scrape arrives on the endpoint's own thread (`MetricsServer`), which asks the event
  loop for a snapshot (`collect`: reads counters and in-memory state only, nothing from
  disk, O(series)) and formats it with prometheus-client on its own thread. `/health`
  reads the broker's lifecycle state and checks that the loop answers at all, so it
  works while a synchronous start step (replaying the share-state log) holds the loop.

Names are Kafka's JMX metrics, translated the way the Prometheus JMX exporter's Kafka
rules do (`kafka.network:type=RequestMetrics,name=RequestsPerSec,request=ShareFetch` ->
`kafka_network_requestmetrics_requests_total{request="ShareFetch"}`); histograms of
Kafka's `...TimeMs` keep milliseconds. What Kafka has no metric for (records acquired,
released and archived, lag per share partition, delivery counts, the share-state log's
compaction) is `spool_*`.
"""

from __future__ import annotations

import concurrent.futures
import http.server
import json
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import structlog

from coordinator.share_state import ShareState, ShareStateKey
from protocol import api
from protocol.errors import CorruptRecordError, ErrorCode
from protocol.records import iter_batches

if TYPE_CHECKING:
    import asyncio
    import uuid

    from kio.schema.fetch.v12 import response as fetch_v12
    from kio.schema.fetch.v18 import response as fetch_v18
    from kio.schema.produce.v12 import response as produce_v12
    from kio.schema.produce.v13 import response as produce_v13
    from kio.schema.share_acknowledge.v2 import response as share_acknowledge_v2
    from kio.schema.share_fetch.v2 import response as share_fetch_v2
    from prometheus_client.metrics_core import Metric
    from typing_extensions import TypeIs

    from broker.authorizer import Authorizer
    from broker.partitions import LogManager, Partition
    from broker.server import Server
    from coordinator.group_coordinator import GroupCoordinator
    from coordinator.metadata import MetadataStore
    from coordinator.share_persister import DurablePersister

    # The responses the handlers of the APIs counted here build (the versions
    # `broker.handlers.responses` gives them, before `protocol.api.at_version` converts
    # them to the request's version).
    ProduceResponse = produce_v12.ProduceResponse | produce_v13.ProduceResponse
    FetchResponse = fetch_v12.FetchResponse | fetch_v18.FetchResponse
    ShareFetchResponse = share_fetch_v2.ShareFetchResponse
    ShareAcknowledgeResponse = share_acknowledge_v2.ShareAcknowledgeResponse

log = structlog.get_logger("spool.metrics")

# Milliseconds, as Kafka's RequestMetrics TotalTimeMs; a long-poll ShareFetch waits up
# to its MaxWaitMs, hence the tail.
REQUEST_TIME_BUCKETS_MS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
# Milliseconds, as Kafka's LogFlushStats LogFlushRateAndTimeMs.
FLUSH_TIME_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)
# share.delivery.count.limit is 2-10 in Kafka (default 5).
DELIVERY_COUNT_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)

# AcknowledgeType ids -> Kafka's ackType tag of RecordAcknowledgementsPerSec (KIP-932);
# GAP (0) marks offsets with no record and Kafka does not count it.
ACK_TYPE_NAMES = ("Gap", "Accept", "Release", "Reject", "Renew")
_RELEASE, _REJECT = 2, 3

# Persisted delivery states ACKNOWLEDGED (2) and ARCHIVED (4): done, not lag.
_DONE_STATES = (2, 4)

PRODUCE, FETCH, SHARE_FETCH, SHARE_ACKNOWLEDGE = 0, 1, 78, 79

# The share coordinator's log, named as Kafka names its topic.
SHARE_STATE_TOPIC = "__share_group_state"

# Kafka's APIs have fewer versions than this; more are made up and counted as -1.
MAX_VERSIONS_PER_API = 32
OTHER_VERSION = -1

# How long an endpoint thread waits for the event loop before answering 503.
LOOP_TIMEOUT_S = 2.0

STARTING, SERVING, STOPPING, STOPPED = "starting", "serving", "stopping", "stopped"


def request_name(api_key: int) -> str:
    """Kafka's request tag: the api key's name in CamelCase ("ShareFetch")."""
    return "".join(part.capitalize() for part in api.api_name(api_key).split("_"))


# -- the counting side (event-loop thread only) ---------------------------------------


class Histogram:
    """Cumulative-on-export buckets; `observe` is a bisect and three adds."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        # bisect_left: the first bound >= value, Prometheus' `le`.
        self.counts[bisect_left(self.bounds, value)] += n
        self.count += n
        self.sum += value * n

    def add(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.count += other.count
        self.sum += other.sum

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += c
            # `le` spelt as prometheus-client spells it: "2.5", "10.0", "+Inf".
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class RequestStats:
    """One API's requests by version and their total time (Kafka's RequestMetrics)."""

    __slots__ = ("by_version", "name", "total_time_ms")

    def __init__(self, api_key: int) -> None:
        self.name = request_name(api_key)
        self.by_version: dict[int, int] = {}
        self.total_time_ms = Histogram(REQUEST_TIME_BUCKETS_MS)


class SharePartitionStats:
    """What the share-partition leader did to one share partition's records."""

    __slots__ = (
        "acknowledged",
        "acquired",
        "archived_delivery_limit",
        "dead_lettered",
        "delivery_counts",
        "lock_timeouts",
        "released_acknowledged",
        "released_lock_timeout",
        "released_member",
    )

    def __init__(self) -> None:
        self.acquired = 0
        self.acknowledged = [0] * len(ACK_TYPE_NAMES)  # records, by AcknowledgeType id
        self.released_acknowledged = 0  # Release acknowledgements (made available again)
        self.released_lock_timeout = 0
        self.released_member = 0  # the member's share session closed or dropped
        self.archived_delivery_limit = 0  # released at share.delivery.count.limit
        self.lock_timeouts = 0  # records whose acquisition lock expired
        # The delivery count of each record as it is acquired.
        self.delivery_counts = Histogram(DELIVERY_COUNT_BUCKETS)
        # KIP-1191: records archived after going through ARCHIVING, by reason
        # ("rejected", "delivery_limit") and whether the copy reached the dead-letter topic
        # ("copied") or could never be made ("not_copied").
        self.dead_lettered: dict[tuple[str, str], int] = {}


class ShareMetrics:
    """The share-partition manager's counters, one `SharePartitionStats` per share
    partition; each call is one dict lookup plus work per range, not per record."""

    def __init__(self) -> None:
        self.partitions: dict[ShareStateKey, SharePartitionStats] = {}
        # Per group: [writes to its dead-letter topic, of which failed] (KIP-1191).
        self.dead_letter_writes: dict[str, list[int]] = {}

    def partition(self, key: ShareStateKey) -> SharePartitionStats:
        stats = self.partitions.get(key)
        if stats is None:
            stats = self.partitions[key] = SharePartitionStats()
        return stats

    def acquired(self, key: ShareStateKey, ranges: Iterable[tuple[int, int, int]]) -> None:
        """Acquired (first, last, delivery count) ranges, counted as they are handed out."""
        stats = self.partition(key)
        observe = stats.delivery_counts.observe
        for first, last, delivery_count in ranges:
            n = last - first + 1
            stats.acquired += n
            observe(delivery_count, n)

    def acknowledged(
        self,
        key: ShareStateKey,
        batches: Iterable[tuple[int, int, Sequence[int]]],
        released: int,
    ) -> None:
        """Durably applied acknowledgement batches; `released` records became available."""
        stats = self.partition(key)
        counts = stats.acknowledged
        before = counts[_RELEASE]
        for first, last, types in batches:
            if len(types) == 1:
                counts[types[0]] += last - first + 1
            else:  # one type per offset: count them in C, not per record in Python
                for ack_type in range(len(counts)):
                    counts[ack_type] += types.count(ack_type)
        stats.released_acknowledged += released
        # A Release of a record at share.delivery.count.limit archives it (Kafka's rule).
        stats.archived_delivery_limit += max(counts[_RELEASE] - before - released, 0)

    def locks_expired(self, key: ShareStateKey, released: int, archived: int) -> None:
        stats = self.partition(key)
        stats.lock_timeouts += released + archived
        stats.released_lock_timeout += released
        stats.archived_delivery_limit += archived

    def member_released(self, key: ShareStateKey, released: int, archived: int) -> None:
        stats = self.partition(key)
        stats.released_member += released
        stats.archived_delivery_limit += archived

    def dead_lettered(self, key: ShareStateKey, reason: str, records: int, copied: bool) -> None:
        """`records` went ARCHIVING -> ARCHIVED (KIP-1191), durably; `reason` is
        "rejected" or "delivery_limit"; `copied` says whether the dead-letter topic got them."""
        counts = self.partition(key).dead_lettered
        slot = (reason, "copied" if copied else "not_copied")
        counts[slot] = counts.get(slot, 0) + records

    def dead_letter_produce(self, group_id: str, failed: bool) -> None:
        """One write of copies to a dead-letter topic (Kafka's
        DeadLetterQueueTotalProduceRequestsPerSec; failed ones also
        DeadLetterQueueFailedProduceRequestsPerSec)."""
        counts = self.dead_letter_writes.setdefault(group_id, [0, 0])
        counts[0] += 1
        counts[1] += 1 if failed else 0

    def forget(self, key: ShareStateKey) -> None:
        """The share partition is gone (topic or group state deleted)."""
        self.partitions.pop(key, None)


@runtime_checkable
class StorageHealth(Protocol):
    """A storage engine that can be unavailable (PostgreSQL): why, and how many commits
    failed so far. Read from the endpoint's thread (two attribute reads)."""

    @property
    def unavailable(self) -> str | None: ...
    @property
    def failed_commits(self) -> int: ...


class BrokerMetrics:
    """The counters of one broker (one per `Broker`, so brokers in one process, as in
    tests, never share them). Bumped on the event-loop thread only."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        # Seconds on a monotonic clock, for durations only (never the time of day).
        self.timer = timer
        self.state = STARTING
        self.requests: dict[int, RequestStats] = {}
        # Kafka's BrokerTopicMetrics, broker-wide.
        self.bytes_in = 0  # record bytes appended by Produce
        self.bytes_rejected = 0  # record bytes of Produce partitions that failed
        self.messages_in = 0
        self.bytes_out = 0  # record bytes sent by Fetch and ShareFetch
        self.share_fetch_requests = 0
        self.share_fetch_failed = 0
        self.share_ack_requests = 0
        self.share_ack_failed = 0
        self.share = ShareMetrics()
        self.flush_time_ms = Histogram(FLUSH_TIME_BUCKETS_MS)
        self.flush_failures = 0
        self.compaction_runs = 0
        self.compaction_failures = 0
        self.compaction_segments_rewritten = 0
        # The storage engine, when it can be unavailable (`Broker.start` sets it).
        self.storage: StorageHealth | None = None

    # -- requests ----------------------------------------------------------------

    def request_done(self, api_key: int, api_version: int, started: float) -> None:
        """A request finished (answered, failed or cut off); `started` from `timer()`."""
        stats = self.requests.get(api_key)
        if stats is None:
            stats = self.requests[api_key] = RequestStats(api_key)
        by_version = stats.by_version
        if api_version not in by_version and len(by_version) >= MAX_VERSIONS_PER_API:
            api_version = OTHER_VERSION  # a client sending made-up versions adds no series
        by_version[api_version] = by_version.get(api_version, 0) + 1
        stats.total_time_ms.observe((self.timer() - started) * 1000.0)

    def payload(self, api_key: int, request: Any, result: api.Response | None) -> None:
        """Bytes and share request outcomes of an answered request (a walk over its
        partitions, never its records). `result` is what the handler answered: a
        response entity of `api_key` (`protocol.api.at_version` has checked it), or
        None for a Produce with acks=0."""
        if api_key == PRODUCE:
            self._produced(request, result if _is_produce(result) else None)
        elif _is_fetch(result):
            self.bytes_out += sum(
                len(p.records or b"") for topic in result.responses for p in topic.partitions
            )
        elif _is_share_fetch(result):
            self.share_fetch_requests += 1
            failed = result.error_code != ErrorCode.none
            for topic in result.responses:
                for p in topic.partitions:
                    self.bytes_out += len(p.records or b"")
                    failed = failed or p.error_code != ErrorCode.none
                    failed = failed or p.acknowledge_error_code != 0  # an i16 here
            self.share_fetch_failed += failed
        elif _is_share_acknowledge(result):
            self.share_ack_requests += 1
            self.share_ack_failed += result.error_code != ErrorCode.none or any(
                p.error_code != ErrorCode.none
                for topic in result.responses
                for p in topic.partitions
            )

    def _produced(self, request: Any, result: ProduceResponse | None) -> None:
        # `request` is a ProduceRequest of any version (mypy joins their topic entries
        # to `object`: every version has the fields read here).
        responses = result.responses if result is not None else None
        for i, topic in enumerate(request.topic_data):
            parts = responses[i].partition_responses if responses is not None else None
            for j, p in enumerate(topic.partition_data):
                data = p.records or b""
                # acks=0 has no response: what was sent counts as in, as far as we know.
                if parts is None or parts[j].error_code == ErrorCode.none:
                    self.bytes_in += len(data)
                    self.messages_in += _records_count(data)
                else:
                    self.bytes_rejected += len(data)

    # -- storage -------------------------------------------------------------------

    def flushed(self, seconds: float, failed: bool) -> None:
        """A group-commit flush (fsync) round finished."""
        self.flush_time_ms.observe(seconds * 1000.0)
        if failed:
            self.flush_failures += 1

    def compacted(self, rewritten: int | None) -> None:
        """A share-state compaction run finished; None when it failed."""
        self.compaction_runs += 1
        if rewritten is None:
            self.compaction_failures += 1
        else:
            self.compaction_segments_rewritten += rewritten


# What the handler of each API counted here answers: `protocol.api.at_version` has
# checked that the entity is a response of the request's API.


def _is_produce(result: object) -> TypeIs[ProduceResponse]:
    return getattr(result, "__api_key__", None) == PRODUCE


def _is_fetch(result: object) -> TypeIs[FetchResponse]:
    return getattr(result, "__api_key__", None) == FETCH


def _is_share_fetch(result: object) -> TypeIs[ShareFetchResponse]:
    return getattr(result, "__api_key__", None) == SHARE_FETCH


def _is_share_acknowledge(result: object) -> TypeIs[ShareAcknowledgeResponse]:
    return getattr(result, "__api_key__", None) == SHARE_ACKNOWLEDGE


# -- the exposition side ----------------------------------------------------------------


class LoadedSharePartition(Protocol):
    """What the exposition reads of a share partition in memory
    (`broker.share.partition.SharePartition`)."""

    @property
    def initialized(self) -> bool: ...
    @property
    def spso(self) -> int: ...
    @property
    def in_flight_count(self) -> int: ...
    @property
    def acquired_count(self) -> int: ...
    @property
    def delivery_complete_count(self) -> int: ...
    @property
    def range_count(self) -> int: ...


class LoadedSharePartitions(Protocol):
    """The share partitions in memory (`broker.share.manager.SharePartitionManager`)."""

    @property
    def partitions(self) -> Mapping[ShareStateKey, LoadedSharePartition]: ...


class Observed(Protocol):
    """What the exposition reads of the broker (`broker.broker.Broker`, which mypy checks
    against it where `spool serve` starts the endpoint). The counters above are what
    the broker and the share manager import; this side is handed the broker instead, so
    the module imports nothing above it. `logs`, `share` and `share_persister` exist
    once the broker has started (`collect` asks first)."""

    @property
    def metrics(self) -> BrokerMetrics: ...
    @property
    def node_id(self) -> int: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def server(self) -> Server | None: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def share(self) -> LoadedSharePartitions: ...
    @property
    def share_persister(self) -> DurablePersister: ...
    def log_partition(self, topic_id: uuid.UUID, partition: int) -> Partition | None: ...
    @property
    def authorizer(self) -> Authorizer: ...  # the broker's; denials and the ACL count


def collect(broker: Observed) -> list[Metric]:
    """A snapshot of every metric; run on the event loop (reads memory only)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    m = broker.metrics
    out: list[Metric] = []

    def counter(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> Any:
        family = CounterMetricFamily(
            name, doc, value=value, labels=None if value is not None else labels
        )
        out.append(family)
        return family

    def gauge(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> Any:
        family = GaugeMetricFamily(
            name, doc, value=value, labels=None if value is not None else labels
        )
        out.append(family)
        return family

    def histogram(name: str, doc: str, labels: Sequence[str] = ()) -> Any:
        family = HistogramMetricFamily(name, doc, labels=labels)
        out.append(family)
        return family

    # Requests (kafka.network:type=RequestMetrics).
    requests = counter(
        "kafka_network_requestmetrics_requests",
        "Requests handled, by API and version (RequestsPerSec).",
        labels=("request", "version"),
    )
    times = histogram(
        "kafka_network_requestmetrics_totaltimems",
        "Time from a request's arrival to its answer, milliseconds (TotalTimeMs).",
        labels=("request",),
    )
    for stats in list(m.requests.values()):
        for version, n in list(stats.by_version.items()):
            requests.add_metric((stats.name, str(version)), n)
        h = stats.total_time_ms
        times.add_metric((stats.name,), h.cumulative(), h.sum)

    # kafka.server:type=BrokerTopicMetrics, broker-wide.
    prefix = "kafka_server_brokertopicmetrics_"
    counter(prefix + "bytesin", "Record bytes appended by Produce (BytesInPerSec).", m.bytes_in)
    counter(prefix + "bytesout", "Record bytes sent by Fetch and ShareFetch.", m.bytes_out)
    counter(
        prefix + "bytesrejected", "Record bytes of failed Produce partitions.", m.bytes_rejected
    )
    counter(prefix + "messagesin", "Records appended by Produce.", m.messages_in)
    counter(prefix + "totalsharefetchrequests", "ShareFetch requests.", m.share_fetch_requests)
    counter(
        prefix + "failedsharefetchrequests",
        "ShareFetch requests answered with an error.",
        m.share_fetch_failed,
    )
    counter(
        prefix + "totalshareacknowledgementrequests",
        "ShareAcknowledge requests.",
        m.share_ack_requests,
    )
    counter(
        prefix + "failedshareacknowledgementrequests",
        "ShareAcknowledge requests answered with an error.",
        m.share_ack_failed,
    )

    # Connections (kafka.server:type=socket-server-metrics).
    server = broker.server
    if server is not None:
        conns = server.stats
        prefix = "kafka_server_socket_server_metrics_"
        gauge(prefix + "connection_count", "Open client connections.", conns.connections_open)
        counter(
            prefix + "connection_creation",
            "Client connections accepted.",
            conns.connections_accepted,
        )
        refused = counter(
            "spool_connections_refused",
            "Connections closed at accept, by the limit they exceeded.",
            labels=("reason",),
        )
        for reason, n in list(conns.connections_refused.items()):
            refused.add_metric((reason,), n)
        closed = counter(
            "spool_connections_closed",
            "Connections the broker closed, by reason.",
            labels=("reason",),
        )
        closed.add_metric(("idle",), conns.idle_closed)
        closed.add_metric(("malformed",), conns.malformed_closed)
        closed.add_metric(("oversized",), conns.oversized_closed)
        closed.add_metric(("security_mismatch",), conns.security_mismatch_closed)
        closed.add_metric(("tls_handshake_failed",), conns.tls_handshake_failed)
        closed.add_metric(("sasl_authentication_failed",), conns.sasl_authentication_failed)
        closed.add_metric(("sasl_unexpected_request",), conns.sasl_unexpected_request_closed)
        # KIP-368: sessions that expired before the client re-authenticated.
        closed.add_metric(("sasl_session_expired",), conns.expired_connections_killed)
        counter(
            prefix + "successful_reauthentication",
            "SASL re-authentications completed (KIP-368).",
            conns.sasl_reauthentications,
        )
        gauge(
            "spool_queued_request_bytes",
            "Request bytes read or waiting to be handled (queued.max.request.bytes).",
            conns.queued_bytes,
        )

    # Storage.
    flush = histogram(
        "kafka_log_logflushstats_logflushrateandtimems",
        "Group-commit flush (fsync) rounds and their time, milliseconds.",
    )
    flush.add_metric((), m.flush_time_ms.cumulative(), m.flush_time_ms.sum)
    counter("spool_log_flush_failures", "Flush (fsync) rounds that failed.", m.flush_failures)
    if m.storage is not None:
        gauge(
            "spool_storage_available",
            "1 while commits to the storage database go through, 0 during an outage.",
            0 if m.storage.unavailable else 1,
        )
        counter(
            "spool_storage_commit_failures",
            "Commits to the storage database that failed (or were failed fast in an outage).",
            m.storage.failed_commits,
        )
    # The cluster: the live brokers this broker sees (the controller's ActiveBrokerCount,
    # kafka.controller:type=KafkaController) and its lease renewals (broker.registry).
    cluster = getattr(broker, "cluster", None)
    if cluster is not None:
        gauge(
            "kafka_controller_kafkacontroller_activebrokercount",
            "Live brokers of the cluster as this broker last read them (itself included).",
            len(cluster.live_brokers()),
        )
    registry = getattr(broker, "registry", None)
    if registry is not None:
        counter(
            "spool_broker_lease_renewals",
            "Renewals of this broker's lease in the storage database (heartbeats).",
            registry.renewals,
        )
        counter(
            "spool_broker_lease_renewal_failures",
            "Lease renewals that failed (the storage database did not answer).",
            registry.renewal_failures,
        )
    metadata = getattr(broker, "metadata", None)
    if metadata is not None and getattr(metadata, "shared", None) is not None:
        # Kafka's broker-metadata-metrics (last-applied-record-offset), and the changes
        # refused because another broker of the database wrote first (coordinator.metadata).
        gauge(
            "kafka_server_broker_metadata_metrics_last_applied_record_offset",
            "Offset of the last cluster metadata record this broker applied.",
            metadata.runtime.record_log.end_offset - 1,
        )
        counter(
            "spool_metadata_conflicts",
            "Metadata changes refused because another broker wrote first (then retried).",
            metadata.conflicts,
        )
        counter(
            "spool_metadata_records_followed",
            "Cluster metadata records other brokers wrote, applied by this one.",
            metadata.followed,
        )
    # Partition leadership (kafka.server:type=ReplicaManager,name=LeaderCount) and its
    # claims and releases by lease (broker.leadership).
    logs = getattr(broker, "logs", None)
    if logs is not None:
        gauge(
            "kafka_server_replicamanager_leadercount",
            "Partitions this broker leads (LeaderCount).",
            len(logs.partitions),
        )
    leadership = getattr(broker, "leadership", None)
    if leadership is not None:
        counter(
            "spool_leadership_claims",
            "Logs this broker claimed the leadership of (epoch + 1 in the storage database).",
            leadership.claims,
        )
        counter(
            "spool_leadership_claims_refused",
            "Claims refused because a live broker still held the log (tried again later).",
            leadership.claims_refused,
        )
        counter(
            "spool_leadership_releases",
            "Logs this broker handed over (a broker joined, or this one stopped).",
            leadership.releases,
        )
    counter(
        "spool_share_state_compaction_runs",
        "Share-state log compaction runs.",
        m.compaction_runs,
    )
    counter(
        "spool_share_state_compaction_failures",
        "Share-state log compaction runs that failed.",
        m.compaction_failures,
    )
    counter(
        "spool_share_state_compaction_segments_rewritten",
        "Share-state log segments rewritten by compaction.",
        m.compaction_segments_rewritten,
    )
    if hasattr(broker, "logs"):
        _log_gauges(broker, gauge)

    # Authorization (Kafka's StandardAuthorizer metrics, authorization-denied-rate-per-
    # minute and acls-total-count, as a counter by operation and resource type).
    if hasattr(broker, "authorizer"):
        denied = counter(
            "spool_authorizer_denied",
            "Authorization checks the ACLs refused, by operation and resource type.",
            labels=("operation", "resource_type"),
        )
        for (operation, resource_type), n in list(broker.authorizer.denials.items()):
            denied.add_metric((operation, resource_type), n)
        gauge(
            "spool_authorizer_acls",
            "ACLs stored (acls-total-count).",
            broker.authorizer.acl_count(),
        )

    if hasattr(broker, "share"):
        _share_metrics(broker, counter, gauge, histogram)
    return out


def _log_gauges(broker: Observed, gauge: Callable[..., Any]) -> None:
    labels = ("topic", "partition")
    size = gauge("kafka_log_log_size", "Bytes of a partition's log on disk.", labels=labels)
    end = gauge("kafka_log_log_logendoffset", "A partition's log end offset.", labels=labels)
    start = gauge("kafka_log_log_logstartoffset", "A partition's log start offset.", labels=labels)
    for part in list(broker.logs):
        tp = (part.topic, str(part.index))
        size.add_metric(tp, part.log.size_bytes)
        end.add_metric(tp, part.log_end_offset)
        start.add_metric(tp, part.log_start_offset)
    persister = getattr(broker, "share_persister", None)
    records = getattr(persister, "records", None)
    if records is not None:
        plog = records.partition_log
        tp = (SHARE_STATE_TOPIC, "0")
        size.add_metric(tp, plog.size_bytes)
        end.add_metric(tp, plog.log_end_offset)
        start.add_metric(tp, plog.log_start_offset)


def _share_metrics(
    broker: Observed,
    counter: Callable[..., Any],
    gauge: Callable[..., Any],
    histogram: Callable[..., Any],
) -> None:
    topics = broker.metadata.state.topics_by_id

    def labels(key: ShareStateKey) -> tuple[str, str, str] | None:
        topic = topics.get(key.topic_id)
        return None if topic is None else (key.group_id, topic.name, str(key.partition))

    names = ("group", "topic", "partition")
    # Group coordinator (kafka.server:type=group-coordinator-metrics).
    groups = list(broker.groups.groups.values())
    by_state: dict[str, int] = {}
    members = gauge("spool_share_group_members", "Members of a share group.", labels=("group",))
    for group in groups:
        state = group.state.value
        by_state[state] = by_state.get(state, 0) + 1
        members.add_metric((group.group_id,), len(group.members))
    count = gauge(
        "kafka_server_group_coordinator_metrics_share_group_count",
        "Share groups, by state.",
        labels=("state",),
    )
    for state, n in sorted(by_state.items()):
        count.add_metric((state,), n)

    # Loaded share partitions (kafka.server:type=SharePartitionMetrics).
    in_flight = gauge(
        "kafka_server_sharepartitionmetrics_inflightmessagecount",
        "Records between the share-partition start and end offsets.",
        labels=names,
    )
    batches = gauge(
        "kafka_server_sharepartitionmetrics_inflightbatchcount",
        "In-flight ranges (batches) a share partition holds in memory.",
        labels=names,
    )
    acquired_now = gauge(
        "spool_share_partition_acquired_records",
        "Records currently acquired by consumers (under an acquisition lock).",
        labels=names,
    )
    lag = gauge(
        "spool_share_group_lag",
        "Records of a share partition not yet acknowledged or archived: high watermark "
        "minus start offset minus records done above it (KIP-1226's share-group lag).",
        labels=names,
    )
    loaded = dict(broker.share.partitions)
    for key, sp in loaded.items():
        tags = labels(key)
        if tags is None or not sp.initialized:
            continue
        in_flight.add_metric(tags, sp.in_flight_count)
        batches.add_metric(tags, sp.range_count)
        acquired_now.add_metric(tags, sp.acquired_count)
        _lag(broker, lag, tags, key, sp.spso, sp.delivery_complete_count)
    # Share partitions not loaded (idle) still have a lag: from their durable state.
    shard = broker.share_persister.shard
    durable_keys = shard.keys()
    for key in durable_keys:
        if key in loaded:
            continue
        durable = shard.state(key)
        tags = labels(key)
        if durable is None or tags is None or durable.start_offset < 0:
            continue
        _lag(broker, lag, tags, key, durable.start_offset, _delivery_complete(durable))

    # Per share partition counters (kafka.server:type=ShareGroupMetrics and spool's).
    acks = counter(
        "kafka_server_sharegroupmetrics_recordacknowledgements",
        "Records acknowledged, by acknowledge type (RecordAcknowledgementsPerSec).",
        labels=(*names, "ackType"),
    )
    timeouts = counter(
        "kafka_server_sharepartitionmetrics_acquisitionlocktimeout",
        "Records whose acquisition lock expired (AcquisitionLockTimeoutPerSec).",
        labels=names,
    )
    acquired = counter("spool_share_records_acquired", "Records acquired.", labels=names)
    released = counter(
        "spool_share_records_released",
        "Acquired records made available again, by reason.",
        labels=(*names, "reason"),
    )
    archived = counter(
        "spool_share_records_archived",
        "Records archived (never delivered again), by reason.",
        labels=(*names, "reason"),
    )
    per_group: dict[str, Histogram] = {}
    for key, s in list(broker.metrics.share.partitions.items()):
        tags = labels(key)
        if tags is None:
            continue
        for ack_type in range(1, len(ACK_TYPE_NAMES)):
            acks.add_metric((*tags, ACK_TYPE_NAMES[ack_type]), s.acknowledged[ack_type])
        timeouts.add_metric(tags, s.lock_timeouts)
        acquired.add_metric(tags, s.acquired)
        released.add_metric((*tags, "acknowledged"), s.released_acknowledged)
        released.add_metric((*tags, "lock_timeout"), s.released_lock_timeout)
        released.add_metric((*tags, "member"), s.released_member)
        archived.add_metric((*tags, "rejected"), s.acknowledged[_REJECT])
        archived.add_metric((*tags, "delivery_limit"), s.archived_delivery_limit)
        counts = per_group.get(key.group_id)
        if counts is None:
            counts = per_group[key.group_id] = Histogram(DELIVERY_COUNT_BUCKETS)
        counts.add(s.delivery_counts)
    deliveries = histogram(
        "spool_share_group_delivery_count",
        "Delivery count of each record as it was acquired (1 = first delivery).",
        labels=("group",),
    )
    for group_id, h in sorted(per_group.items()):
        deliveries.add_metric((group_id,), h.cumulative(), h.sum)
    _dead_letter_metrics(broker, counter, labels)


def _dead_letter_metrics(
    broker: Observed,
    counter: Callable[..., Any],
    labels: Callable[[ShareStateKey], tuple[str, str, str] | None],
) -> None:
    """KIP-1191's dead-letter counters (kafka.server:type=ShareGroupMetrics
    DeadLetterQueueRecordCount, DeadLetterQueueTotalProduceRequestsPerSec and
    DeadLetterQueueFailedProduceRequestsPerSec, per group), and spool's per share
    partition, reason and outcome."""
    by_partition = counter(
        "spool_share_records_dead_lettered",
        "Records archived through ARCHIVING (KIP-1191), by reason and whether their copy "
        "reached the dead-letter topic (copied) or could never be made (not_copied).",
        labels=("group", "topic", "partition", "reason", "outcome"),
    )
    copied: dict[str, int] = {}
    for key, s in list(broker.metrics.share.partitions.items()):
        if not s.dead_lettered:
            continue
        tags = labels(key)
        for (reason, outcome), n in sorted(s.dead_lettered.items()):
            if outcome == "copied":
                copied[key.group_id] = copied.get(key.group_id, 0) + n
            if tags is not None:
                by_partition.add_metric((*tags, reason, outcome), n)
    records = counter(
        "kafka_server_sharegroupmetrics_deadletterqueuerecordcount",
        "Records copied to the group's dead-letter topic (DeadLetterQueueRecordCount).",
        labels=("group",),
    )
    for group_id, n in sorted(copied.items()):
        records.add_metric((group_id,), n)
    total = counter(
        "kafka_server_sharegroupmetrics_deadletterqueuetotalproducerequests",
        "Writes to the group's dead-letter topic (DeadLetterQueueTotalProduceRequestsPerSec).",
        labels=("group",),
    )
    failed = counter(
        "kafka_server_sharegroupmetrics_deadletterqueuefailedproducerequests",
        "Writes to the group's dead-letter topic that failed or were refused "
        "(DeadLetterQueueFailedProduceRequestsPerSec).",
        labels=("group",),
    )
    for group_id, (writes, failures) in sorted(broker.metrics.share.dead_letter_writes.items()):
        total.add_metric((group_id,), writes)
        failed.add_metric((group_id,), failures)


def _delivery_complete(state: ShareState) -> int:
    """Records at or above the start offset that are ACKNOWLEDGED or ARCHIVED."""
    if state.delivery_complete_count >= 0:
        return state.delivery_complete_count
    start = state.start_offset
    return sum(
        b.last_offset - max(b.first_offset, start) + 1
        for b in state.batches
        if b.delivery_state in _DONE_STATES and b.last_offset >= start
    )


def _lag(
    broker: Observed,
    family: Any,
    tags: tuple[str, str, str],
    key: ShareStateKey,
    start_offset: int,
    done: int,
) -> None:
    part = broker.log_partition(key.topic_id, key.partition)
    if part is not None:
        family.add_metric(tags, max(part.high_watermark - start_offset - done, 0))


class _Frozen:
    """A collector handing prometheus-client the families taken on the loop."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class _QuietHTTPServer(http.server.ThreadingHTTPServer):
    """A scraper that hangs up mid-answer is logged in one line, not a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning(
            "metrics_request_failed", client=str(client_address), error=repr(sys.exc_info()[1])
        )


class MetricsServer:
    """`/metrics` and `/health` on their own thread (`spool serve --metrics HOST:PORT`).

    `/health` is 200 with {"status": "serving"} once the broker has started and its event
    loop answers; 503 while starting, stopping, when the loop does not answer within
    LOOP_TIMEOUT_S (a blocked broker is not healthy), or while the storage database is
    unavailable (status "storage_unavailable"), the reason in the JSON body.
    """

    def __init__(self, host: str, port: int, broker: Observed) -> None:
        self.host = host
        self.port = port
        self.broker = broker
        # The broker's event loop: snapshots are taken on it.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_timeout_s = LOOP_TIMEOUT_S
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind and serve; OSError if the address cannot be bound."""
        self.loop = loop
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            server_version = "spool"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    status, ctype, body = owner.metrics_response()
                elif path == "/health":
                    status, ctype, body = owner.health_response()
                else:
                    status, ctype = 404, "text/plain; charset=utf-8"
                    body = b"spool serves /metrics and /health\n"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes are routine; failures are logged by the owner

        httpd = _QuietHTTPServer((self.host, self.port), Handler)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="spool-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics_listening", host=self.host, port=self.port)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the broker's event loop and return what it returned.

        Raises TimeoutError when the loop does not get to it in time, RuntimeError
        when the loop is closed.
        """
        loop = self.loop
        if loop is None:
            raise RuntimeError("metrics server not started")
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn())
                except BaseException as exc:
                    done.set_exception(exc)

        timeout = self.loop_timeout_s
        loop.call_soon_threadsafe(run)
        try:
            return done.result(timeout)
        except concurrent.futures.TimeoutError:
            done.cancel()
            raise TimeoutError(f"event loop did not answer within {timeout}s") from None

    def metrics_response(self) -> tuple[int, str, bytes]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        from prometheus_client.process_collector import ProcessCollector

        try:
            families = self.on_loop(lambda: collect(self.broker))
        except (TimeoutError, RuntimeError) as exc:
            log.warning("metrics_scrape_failed", error=str(exc))
            return 503, "text/plain; charset=utf-8", f"{exc}\n".encode()
        except Exception:
            # A bug in a collector: the scraper sees it, the broker is not touched.
            log.exception("metrics_collect_failed")
            return 500, "text/plain; charset=utf-8", b"collecting metrics failed; see the log\n"
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Frozen(families))
        ProcessCollector(registry=registry)  # CPU, memory, open fds: read here, off the loop
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

    def health_response(self) -> tuple[int, str, bytes]:
        broker = self.broker
        state = broker.metrics.state
        body: dict[str, Any] = {"status": state, "node_id": broker.node_id}
        status = 200 if state == SERVING else 503
        if state == STARTING:
            body["reason"] = "the broker is starting: loading logs and share state"
        elif state in (STOPPING, STOPPED):
            body["reason"] = f"the broker is {state}"
        else:
            try:
                self.on_loop(lambda: None)
            except (TimeoutError, RuntimeError) as exc:
                status = 503
                body["status"] = "unresponsive"
                body["reason"] = f"the broker's event loop is not answering: {exc}"
            else:
                body["cluster_id"] = broker.cluster_id
                storage = broker.metrics.storage
                unavailable = None if storage is None else storage.unavailable
                if unavailable is not None:
                    # Commits fail: nothing can be acknowledged until the database is back.
                    status = 503
                    body["status"] = "storage_unavailable"
                    body["reason"] = unavailable
        return status, "application/json", json.dumps(body).encode() + b"\n"


def _records_count(data: bytes) -> int:
    """Records in the batches of `data`. With acks=0 there is no answer to tell whether
    the broker took them, and the bytes may be anything a client sent: what does not
    parse counts no records (the produce handler refused it)."""
    count = 0
    try:
        for _, header in iter_batches(data, validate=False):
            count += header.records_count
    except CorruptRecordError:
        pass
    return count
