"""The broker: owns the stores and managers, the API table and request dispatch."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import structlog
from kio.static.primitive import i16

from broker import trace
from broker.authorizer import Authorizer
from broker.cluster import BrokerEndpoint, ClusterView, SingleNode
from broker.config import BrokerConfig
from broker.handlers import build_table, responses
from broker.handlers.configs import apply_dynamic_broker_config
from broker.handlers.responses import NO_THROTTLE
from broker.handlers.topics import apply_topic_change, auto_create_topic
from broker.leadership import Leadership, LogManagerHost, TopicRef
from broker.listeners import (
    InterBrokerClient,
    ListenerConfig,
    inter_broker_client,
    listeners_from_config,
)
from broker.metrics import SERVING, STOPPED, STOPPING, BrokerMetrics, StorageHealth
from broker.partitions import LogManager, Partition
from broker.registry import BrokerRegistry
from broker.server import (
    CloseConnection,
    Endpoint,
    RequestContext,
    Server,
    ServerLimits,
    error_frame,
)
from broker.share.dead_letter_sink import DeadLetterTopicSink
from broker.share.fetch import ShareFetchService
from broker.share.manager import SharePartitionManager
from broker.share.reader import LogPartition
from broker.share.remote_persister import BrokerConnections, RoutedPersister
from broker.share.session import ShareSessionCache
from broker.tasks import bounded_step, cancel_all, spawn
from broker.txn_markers import MarkerChannel, ProduceVerifier
from coordinator.assignor import TopicMetadata
from coordinator.classic_group import ClassicGroupConfig
from coordinator.group_coordinator import GroupCoordinator
from coordinator.metadata import MetadataChange, MetadataStore, TopicChange
from coordinator.offsets import OffsetStore
from coordinator.runtime import CoordinatorRuntime
from coordinator.share_persister import DurablePersister
from coordinator.transactions import TransactionConfig, TransactionCoordinator
from persister.clock import SYSTEM_CLOCK, Clock, sleep
from persister.commit import GroupCommit
from persister.coordinator_log import RecordLog, internal_log_config
from persister.dirlock import DataDirLock
from persister.pg_leadership import ClaimedLog
from persister.pg_registry import PgRegistryStore
from persister.pg_storage import PgStorage
from persister.storage import FILE_STORAGE, CoordinatorLog, StorageEngine
from protocol import api, request_check
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.broker")

# How long a graceful stop waits for its partitions to be handed over.
RELEASE_TIMEOUT_S = 10.0
# How long each later step of a graceful stop may take before it is given up (logged
# with every task's stack, so the wait that did not end can be named); the last flush of
# the logs, which may have much to write, longer.
STOP_STEP_TIMEOUT_MS = 3_000
FLUSH_AT_STOP_TIMEOUT_MS = 10_000
# How long CreateTopics / CreatePartitions wait for the claims of the partitions they
# opened (a commit's own timeout, persister.pg_commit).
CLAIMS_SETTLED_TIMEOUT_S = 5.0


def _offset_for_timestamp(part: LogPartition, timestamp: int) -> int | None:
    # The share manager hands back a partition `Broker.log_partition` gave it.
    assert isinstance(part, Partition)
    found = part.offset_for_timestamp(timestamp)
    return found[0] if found else None


async def retention_loop(logs: LogManager, clock: Clock, interval_ms: int) -> None:
    """Kafka's log retention check (its LogManager's cleanupLogs): every
    `log.retention.check.interval.ms` on `clock`, delete the segments past a topic's
    retention.ms or retention.bytes. Timed by the broker's clock, so a ManualClock drives
    it in tests."""
    while True:
        await sleep(clock, interval_ms)
        try:
            deleted = logs.enforce_retention()
            if deleted:
                log.info("retention_deleted_segments", segments=deleted)
        except Exception:
            log.exception("retention_failed")


async def metadata_poll_loop(metadata: MetadataStore, clock: Clock, interval_ms: int) -> None:
    """Follow the cluster metadata other brokers of the database write (a shared log,
    coordinator.metadata): every `storage.metadata.poll.interval.ms` on `clock`, append
    and replay what they committed; `MetadataStore.on_replayed` acts on it. A failed read
    (the database away: logged where the outage begins) is tried again next time."""
    while True:
        await sleep(clock, interval_ms)
        try:
            await metadata.catch_up()
        except KafkaError as exc:
            log.debug("metadata_poll_failed", error=exc.message)
        except Exception:
            log.exception("metadata_poll_failed")


class Compactable(Protocol):
    async def compact(self) -> int: ...


async def compaction_loop(
    persister: Compactable, clock: Clock, interval_ms: int, metrics: BrokerMetrics
) -> None:
    """Compact the share-state log's closed segments every `log.cleaner.backoff.ms` on
    `clock` (Kafka's log cleaner backs off that long when it finds nothing to clean)."""
    while True:
        await sleep(clock, interval_ms)
        try:
            rewritten = await persister.compact()
        except Exception:
            metrics.compacted(None)
            log.exception("share_state_compaction_failed")
        else:
            metrics.compacted(rewritten)


class Broker:
    """One spool node: listener, cluster metadata, partition logs, handlers."""

    def __init__(
        self,
        config: BrokerConfig,
        data_dir: Path,
        listen: Endpoint | None = None,
        advertise: Endpoint | None = None,
        clock: Clock = SYSTEM_CLOCK,
        storage: StorageEngine = FILE_STORAGE,
    ) -> None:
        """`listen` (and `advertise`) is one PLAINTEXT listener; without it, the
        broker's listeners are the config's `listeners` (broker.listeners)."""
        self.config = config
        # The one source of time for every shell the broker runs (Kafka's `Time`).
        self.clock = clock
        # Where partition logs and coordinator logs live (persister.storage).
        self.storage = storage
        self.data_dir = data_dir
        self._dir_lock = DataDirLock(data_dir)
        if listen is None:
            self.listeners = listeners_from_config(config)
        else:
            plain = ListenerConfig.plaintext(listen.host, listen.port)
            if advertise is not None:
                plain = dataclasses.replace(
                    plain, advertised_host=advertise.host, advertised_port=advertise.port
                )
            self.listeners = [plain]
        self.node_id: int = config.get("node.id")
        # Who is in the cluster and who leads what (broker.cluster); alone until a
        # cluster view replaces it.
        self.cluster: ClusterView = SingleNode(
            self.node_id, self._endpoints, config.get("broker.rack")
        )
        # This broker's lease among the brokers of its storage database (PostgreSQL
        # only; broker.registry): made at start, then it is `cluster` as well.
        self.registry: BrokerRegistry | None = None
        # Partition leadership by lease among those brokers (broker.leadership).
        self.leadership: Leadership | None = None
        # Why the broker must stop on its own (fenced: another broker took its node id),
        # and who is told (`spool serve` stops the broker and exits with 1).
        self.fatal: str | None = None
        self.on_fatal: Callable[[], None] = lambda: None
        self.commit = GroupCommit()
        # Counters for the metrics endpoint (broker.metrics); one set per broker.
        self.metrics = BrokerMetrics()
        self.commit.on_flush = self.metrics.flushed
        if trace.ENABLED:
            trace.attach(self.commit)
        self.metadata: MetadataStore
        self.logs: LogManager
        self.server: Server | None = None
        self.cluster_id = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.groups: GroupCoordinator
        self.transactions: TransactionCoordinator
        # The coordinator's markers to every partition's leader, and produce
        # verification with the coordinator wherever it is (broker.txn_markers).
        self.txn_markers: MarkerChannel
        self.txn_verifier: ProduceVerifier
        self.share: SharePartitionManager
        self.sessions: ShareSessionCache
        self.share_service: ShareFetchService
        # The share coordinator as the share-partition leader and the group coordinator
        # reach it: this broker's (`share_persister`) while it leads the share-state
        # log, else the leader's, over the inter-broker listener
        # (broker.share.remote_persister).
        self.share_state: RoutedPersister
        self._background: set[asyncio.Future[Any]] = set()
        # Called with (topic name, topic id) when a topic is deleted (share groups use it).
        self.topic_deleted_hooks: list[Callable[[str, Any], None]] = []
        self.topic_changed_hooks: list[Callable[[str], None]] = []
        # ACL checks (broker.authorizer): allows everything unless authorizer.class.name
        # is set; the ACLs are the metadata log's, read at each check.
        self.authorizer = Authorizer.from_config(config, lambda: self.metadata.state.acls)
        self.table: api.ApiTable[RequestContext] = build_table(self)

    @property
    def advertised(self) -> Endpoint:
        """The first listener's advertised endpoint."""
        return self.advertised_for(self.listeners[0].name)

    def advertised_for(self, listener: str) -> Endpoint:
        """What clients of `listener` are told to connect to (advertised.listeners, as
        Kafka answers each request with the endpoints of the listener it came in on)."""
        found = next((lc for lc in self.listeners if lc.name == listener), self.listeners[0])
        port = found.advertised_port
        if port == 0 and self.server is not None:
            port = self.server.bound_ports.get(found.name, 0)
        return Endpoint(found.advertised_host, port)

    async def claims_settled(self) -> None:
        """Partitions this broker claims as they open (a topic created or grown on a
        cluster's database) are claimed: bounded by the claim's commit timeout."""
        if self.leadership is not None:
            await self.leadership.claims_settled(CLAIMS_SETTLED_TIMEOUT_S)

    def _endpoints(self) -> list[BrokerEndpoint]:
        """This broker's advertised endpoint on each of its listeners."""
        return [
            BrokerEndpoint(lc.name, ep.host, ep.port)
            for lc in self.listeners
            for ep in (self.advertised_for(lc.name),)
        ]

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock.acquire()  # before anything is opened: one broker per data dir
        if isinstance(self.storage, PgStorage):
            self.storage.node_id = self.node_id  # recorded as the holder of its claims
        try:
            # PostgreSQL: connect, migrate, bring the data dir up to date (restore).
            await self.storage.start(self.data_dir)
        except BaseException:
            self._dir_lock.release()
            raise
        if isinstance(self.storage, PgStorage):
            # Registered before any log is claimed: a duplicate node.id stops here.
            try:
                await self._register(self.storage)
            except BaseException:
                await self.storage.stop()
                self._dir_lock.release()
                raise
        if isinstance(self.storage, StorageHealth):
            self.metrics.storage = self.storage  # /health and /metrics say when it is down
        self.commit.start()
        self.metadata = MetadataStore(
            self.data_dir / "meta", self.commit, clock=self.clock, storage=self.storage
        )
        self.cluster_id = await self.metadata.ensure_cluster_id()
        self.logs = LogManager(
            self.data_dir / "topics", self.config, self.commit, self.clock, self.storage
        )
        if self.registry is not None and isinstance(self.storage, PgStorage):
            self._lead_by_lease(self.registry, self.storage)
        live = set(self.metadata.state.topics)
        self.logs.cleanup_stale(live)
        for topic in self.metadata.state.topics.values():
            self.logs.open_topic(topic.name, topic.topic_id, topic.partitions, topic.configs)
        apply_dynamic_broker_config(self)
        self._start_share_groups()
        if self.groups.legacy_configs.group_ids():
            # Group configs a groups log kept (spool before they moved to the cluster
            # metadata), copied to the metadata once, whichever broker loads them first.
            await self.metadata.adopt_group_configs(self.groups.legacy_configs)
        self._start_transactions()
        # What other brokers of the database change from now on is acted on as this
        # broker's own changes are (the state up to here was opened above).
        self.metadata.on_replayed = self._metadata_replayed
        if self.leadership is not None:
            # The partitions this broker leads are claimed and opened before it serves
            # (all of them for a broker alone); the rest follows its heartbeats.
            with contextlib.suppress(Exception):
                # The coordinator logs' claims first: the view then names their holder.
                if isinstance(self.storage, PgStorage):
                    await self.storage.settle()
                await self.leadership.reconcile()
        first = self.listeners[0]
        self.server = Server(
            first.host,
            first.port,
            self.dispatch,
            limits=ServerLimits.from_config(self.config),
            clock=self.clock,
            listeners=self.listeners,
        )
        self.server.on_disconnect = self._on_disconnect
        # SASL/SCRAM logins read the credentials in the metadata as they are then.
        self.server.scram_lookup = self.metadata.state.scram_credential
        try:
            await self.server.start()
        except BaseException:
            if self.registry is not None:
                await self.registry.stop()  # a restart need not wait for the lease
            raise
        if self.registry is not None:
            self.registry.start()
        self._tasks.append(
            asyncio.create_task(
                retention_loop(
                    self.logs, self.clock, self.config.get("log.retention.check.interval.ms")
                )
            )
        )
        self._tasks.append(
            asyncio.create_task(
                compaction_loop(
                    self.share_persister,
                    self.clock,
                    self.config.get("log.cleaner.backoff.ms"),
                    self.metrics,
                )
            )
        )
        if self.metadata.shared is not None:
            self._tasks.append(
                asyncio.create_task(
                    metadata_poll_loop(
                        self.metadata,
                        self.clock,
                        self.config.get("storage.metadata.poll.interval.ms"),
                    )
                )
            )
        self.metrics.state = SERVING
        for lc in self.listeners:
            if lc.advertises_loopback_for_every_interface:
                log.warning(
                    "advertising_loopback",
                    listener=lc.name,
                    hint="the listener takes connections on every interface but tells "
                    "clients to connect to 127.0.0.1, which only works on this host: set "
                    f"advertised.listeners={lc.name}://<address clients reach>:<port> "
                    "(or --advertise)",
                )
        log.info(
            "broker_started",
            node_id=self.node_id,
            cluster_id=self.cluster_id,
            data_dir=str(self.data_dir),
            advertised=[
                f"{lc.name}://{self.advertised_for(lc.name).host}:"
                f"{self.advertised_for(lc.name).port}"
                for lc in self.listeners
            ],
            topics=len(self.metadata.state.topics),
        )

    async def _register(self, storage: PgStorage) -> None:
        """Join the brokers of the storage database (broker.registry)."""
        interval = self.config.get("broker.heartbeat.interval.ms")
        registry = BrokerRegistry(
            # Each registry statement is bounded by the heartbeat interval.
            PgRegistryStore(storage.connect, timeout_s=interval / 1000),
            self.node_id,
            self._endpoints,
            self.config.get("broker.rack"),
            heartbeat_interval_ms=interval,
            session_timeout_ms=self.config.get("broker.session.timeout.ms"),
            clock=self.clock,
            on_fenced=self._fenced,
            # The data dir lock is held: a registration from it is a dead incarnation's.
            data_dir=f"{socket.gethostname()}:{self.data_dir.resolve()}",
        )
        try:
            await registry.register()
        except BaseException:
            await registry.store.close()
            raise
        self.registry = registry
        self.cluster = registry

    def _lead_by_lease(self, registry: BrokerRegistry, storage: PgStorage) -> None:
        """Lead partitions by lease among the brokers of the database (broker.leadership):
        LogManager opens only the partitions claimed; reconciled at each heartbeat and
        topic change."""
        leadership = Leadership(
            storage.leadership_store(),
            self.node_id,
            lambda: [b.node_id for b in registry.live_brokers()],
            lambda: [
                TopicRef(t.name, t.topic_id, t.partitions)
                for t in self.metadata.state.topics.values()
            ],
            LogManagerHost(
                self.logs, storage.restore_claimed, self._topic_configs, storage.claim_on_open
            ),
            coordinators=CoordinatorLogsHost(self, storage),
        )
        self.leadership = leadership
        self.logs.leads = leadership.leads
        registry.leadership = leadership
        registry.on_heartbeat = leadership.request
        self.topic_changed_hooks.append(lambda _name: leadership.request())
        self.topic_deleted_hooks.append(lambda _name, _id: leadership.request())

    def _topic_configs(self, name: str) -> dict[str, str] | None:
        topic = self.metadata.state.topics.get(name)
        return None if topic is None else dict(topic.configs)

    def _fenced(self, reason: str) -> None:
        self.fatal = reason
        self.on_fatal()

    async def warm_up(self) -> int:
        """Load the Kafka schema classes of every version this broker serves, one version
        per turn of the event loop, and return how many versions that was.

        A start does not load them (they are about 900 classes, 0.7 s of a restart): a
        request loads its version's classes itself. Run once the broker serves, this
        keeps a client's first request of a version from paying for that import on its
        way (tens of ms for a first Produce), while requests go on between the steps.
        """
        started = time.perf_counter()
        versions = 0
        for entry in self.table.entries():
            for version in range(entry.max_version, entry.min_version - 1, -1):
                api.request_class(entry.api_key, version)
                api.response_class(entry.api_key, version)
                versions += 1
                await asyncio.sleep(0)
        log.info(
            "schemas_loaded",
            versions=versions,
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return versions

    def _not_claimed_yet(self, name: str) -> bool:
        """Open the coordinator log `name` without claiming it, when leadership by lease
        places it (broker.leadership): its coordinator stays unloaded until a reconcile
        claims it for this broker (`CoordinatorLogsHost`)."""
        if self.leadership is None or not isinstance(self.storage, PgStorage):
            return False
        refused: asyncio.Future[ClaimedLog | None] = asyncio.get_running_loop().create_future()
        refused.set_result(None)
        self.storage.claim_on_open(name, refused)
        return True

    def inter_broker(self) -> InterBrokerClient:
        """How this broker reaches the others: the inter-broker listener, its client
        security and principal (broker.listeners.inter_broker_client)."""
        return inter_broker_client(self.config, self.listeners, isinstance(self.storage, PgStorage))

    def broker_connections(self, purpose: str) -> BrokerConnections:
        """Connections to the other brokers on the inter-broker listener, secured as
        that listener is (TLS, SASL with this broker's credentials); every inter-broker
        client is made here. `purpose` ends its client id."""
        security = self.inter_broker().security
        return BrokerConnections(f"spool-broker-{self.node_id}{purpose}", security=security)

    def _start_share_groups(self) -> None:
        follower = self._not_claimed_yet("share-state")
        persister = self.share_persister = DurablePersister(
            self.data_dir / "share-state",
            self.commit,
            snapshot_update_records_per_snapshot=self.config.get(
                "share.coordinator.snapshot.update.records.per.snapshot"
            ),
            segment_bytes=self.config.get("share.coordinator.state.topic.segment.bytes"),
            clock=self.clock,
            compaction_enabled=self.config.get("log.cleaner.enable"),
            storage=self.storage,
        )
        if follower:
            persister.unload("not claimed yet")
        else:
            persister.load()
        self.share_state = RoutedPersister(
            persister,
            lambda: self.cluster,
            self.broker_connections(""),
            listener=self.inter_broker().listener,
            principal=self.inter_broker().principal,
            clock=self.clock,
        )
        follower = self._not_claimed_yet("groups")
        group_config = self.config.group_coordinator()
        self.groups = GroupCoordinator(
            self.share_state,
            self._topics_metadata,
            # Group configs live in the cluster metadata (every broker's, applied as
            # replayed); the groups log's own from before are adopted at start.
            self.metadata.state.group_configs,
            self.storage.open_coordinator_log(
                self.data_dir / "groups", self.commit, clock=self.clock
            ),
            clock=self.clock,
            configs_in_metadata=True,
            offsets=OffsetStore(
                metadata_max_bytes=group_config.offset_metadata_max_bytes,
                retention_ms=group_config.offsets_retention_ms,
            ),
            offsets_retention_check_interval_ms=group_config.offsets_retention_check_interval_ms,
        )
        self.groups.consumer.config = group_config
        self.groups.classic.config = ClassicGroupConfig.of(group_config)
        if follower:
            self.groups.drop("not claimed yet")
        else:
            self.groups.load()
        # KIP-1191: writes the dead-letter copies of the records share groups give up on.
        self.dead_letter_sink = DeadLetterTopicSink(
            group_config=self.groups.config,
            topics=lambda: self.metadata.state,
            log_partition=self.log_partition,
            cluster=lambda: self.cluster,
            transport=self.broker_connections("-dead-letters"),
            listener=self.inter_broker().listener,
            metrics=self.metrics.share,
            clock=self.clock,
            prefix=lambda: self.config.get("errors.deadletterqueue.topic.name.prefix"),
            auto_create=lambda: self.config.get("errors.deadletterqueue.auto.create.topics.enable"),
            create_topic=lambda name, configs: auto_create_topic(self, name, configs),
            max_message_bytes=lambda topic: self.logs.topic_settings(topic.configs)[
                "max.message.bytes"
            ],
        )
        self.share = SharePartitionManager(
            self.share_state,
            self.groups,
            self.log_partition,
            _offset_for_timestamp,
            clock=self.clock,
            metrics=self.metrics.share,
            not_leader=self._not_leader,
            leader_epoch=self._leader_epoch,
            dead_letter_sink=self.dead_letter_sink,
        )
        self.share.start()  # its idle-unload sweep runs on the manager's clock
        self.sessions = ShareSessionCache(self.config.get("group.share.max.share.sessions"))
        self.share_service = ShareFetchService(
            self.share,
            self.sessions,
            lambda topic_id: topic_id in self.metadata.state.topics_by_id,
            self.log_partition,
            clock=self.clock,
        )
        self.groups.member_removed_hooks.append(self._on_member_removed)
        self.groups.state_deleted_hooks.append(
            lambda group, topic_id: self.share.drop(group, topic_id)
        )
        # Another broker claimed the share-state log: the share state is its now.
        self.share_persister.runtime.on_fenced = self.share.drop_all
        # A topic partition another broker leads now: its share partitions unload.
        self.logs.on_dropped = lambda part, reason: self.share.drop_partition(
            part.topic_id, part.index, reason
        )
        self.topic_deleted_hooks.append(self._on_topic_deleted)
        self.topic_changed_hooks.append(lambda _name: self._spawn(self.groups.on_topics_changed()))
        if not follower:
            self.groups.start()

    def _start_transactions(self) -> None:
        """The transaction coordinator on `data/transactions/`: replayed, in-doubt
        transactions completed, timeout and expiry sweeps on the broker's clock."""
        follower = self._not_claimed_yet("transactions")
        inter = self.inter_broker()
        listener = inter.listener
        self.txn_markers = MarkerChannel(
            self.logs,
            lambda: self.cluster,
            self._topic_ref,
            self.broker_connections("-txn-markers"),
            listener=listener,
            principal=inter.principal,
            complete_offsets=self._complete_offsets,
            clock=self.clock,
        )
        self.txn_verifier = ProduceVerifier(
            lambda: self.transactions,
            lambda: self.cluster,
            self.broker_connections("-txn-verify"),
            listener=listener,
            principal=inter.principal,
        )
        self.transactions = TransactionCoordinator(
            self.storage.open_coordinator_log(
                self.data_dir / "transactions", self.commit, clock=self.clock
            ),
            allocate_producer_id=self.metadata.allocate_producer_id,
            markers=self.txn_markers,
            config=TransactionConfig.from_mapping(self.config.get),
            clock=self.clock,
        )
        if follower:
            self.transactions.drop("not claimed yet")
        else:
            self.transactions.load()
            self.transactions.start()

    def _spawn(self, coro: Any, **context: object) -> None:
        """Run `coro` in the background; a failure is logged with what it was, not lost."""
        what = getattr(coro, "__qualname__", type(coro).__name__)
        spawn(coro, what=what, tasks=self._background, **context)

    def _on_member_removed(self, group_id: str, member_id: str) -> None:
        """A member left or was fenced: its share session and acquired records stay.

        As in Kafka 4.2, where the group coordinator never touches share sessions: a
        closing consumer sends its final acknowledgements (ShareSessionEpoch -1) and its
        leave heartbeat at once, and the acknowledgements must still find the session
        and the records. Records are released by the session's close, by its
        connection dropping (`_on_disconnect`) or by their acquisition locks expiring.
        """
        log.debug("member_removed_share_session_kept", group=group_id, member=member_id)

    def _on_disconnect(self, connection_id: int) -> None:
        """A closed connection ends its share sessions and releases their records,
        as Kafka's share session cache does on disconnect."""
        for group_id, member_id, keys in self.share_service.connection_closed(str(connection_id)):
            self._spawn(self.share.release_member(group_id, member_id, keys))

    def _metadata_replayed(self, changes: list[MetadataChange]) -> None:
        """Another broker's metadata changes, replayed here: topics' logs opened or
        removed (with the hooks run), configs applied, as for this broker's own."""
        for change in changes:
            try:
                if isinstance(change, TopicChange):
                    apply_topic_change(self, change)
                else:
                    apply_dynamic_broker_config(self)
            except Exception:
                log.exception("metadata_change_not_applied", change=repr(change))

    def _on_topic_deleted(self, name: str, topic_id: Any) -> None:
        self.share.drop(None, topic_id)
        self._spawn(self.groups.on_topics_changed())

    async def _complete_offsets(
        self, producer_id: int, commit: bool, offsets_partitions: frozenset[int]
    ) -> None:
        """A transaction's marker for __consumer_offsets partitions: its pending offsets
        of their groups are committed or dropped by the group coordinator."""
        await self.groups.complete_transaction(producer_id, commit, offsets_partitions)

    def _topics_metadata(self) -> dict[Any, TopicMetadata]:
        return {
            t.topic_id: TopicMetadata(t.topic_id, t.name, t.partitions)
            for t in self.metadata.state.topics.values()
        }

    def _topic_ref(self, name: str) -> tuple[uuid.UUID, int] | None:
        """A topic's id and partition count, None once it is gone (the markers skip it)."""
        topic = self.metadata.state.topics.get(name)
        return None if topic is None else (topic.topic_id, topic.partitions)

    def log_partition(self, topic_id: uuid.UUID, partition: int) -> Partition | None:
        topic = self.metadata.state.topics_by_id.get(topic_id)
        return None if topic is None else self.logs.get(topic.name, partition)

    def _leader_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        """The partition's leader epoch as this broker leads it (0 alone), which its
        share-partition leader reads and writes the share state with."""
        leader = self.cluster.leader(topic_id, partition)
        return 0 if leader is None else leader.epoch

    def _not_leader(self, topic_id: uuid.UUID, partition: int) -> KafkaError | None:
        topic = self.metadata.state.topics_by_id.get(topic_id)
        return None if topic is None else self.logs.not_leader(topic.name, partition)

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, flush everything, close files."""
        self.metrics.state = STOPPING
        self.logs.wake_fetches()
        self.groups.classic.answer_parked()  # parked JoinGroup/SyncGroup: NOT_COORDINATOR
        if self.server is not None:
            await self.server.stop()
        if self.leadership is not None:
            # Hand every partition over before deregistering: the others claim them at
            # their next heartbeat, not after this broker's lease expired.
            try:
                async with asyncio.timeout(RELEASE_TIMEOUT_S):
                    await self.leadership.stop()
            except Exception as exc:
                log.warning("leadership_release_failed", error=str(exc) or type(exc).__name__)
        if self.registry is not None:
            await self._stop_step("registry", self.registry.stop())  # others see it gone
        await self._stop_step("groups", self.groups.stop())
        await self._stop_step("transactions", self.transactions.stop())
        await self._stop_step("txn_markers", self.txn_markers.close())
        await self._stop_step("txn_verifier", self.txn_verifier.close())
        self.share.stop()
        await self._stop_step("share_state", self.share_state.close())
        await self._stop_step("dead_letter_sink", self.dead_letter_sink.close())
        await self._stop_step("tasks", cancel_all(self.clock, self._tasks))
        try:
            await self._stop_step(
                "flush", self.logs.flush_all(), FLUSH_AT_STOP_TIMEOUT_MS, raise_error=True
            )
        except Exception as exc:  # a failed or refused flush: what it held was never acked
            log.error("flush_at_stop_failed", error=str(exc))
        self.logs.close()
        self.metadata.close()
        self.share_persister.close()
        self.groups.close()
        self.transactions.close()
        await self._stop_step("commit", self.commit.stop(), FLUSH_AT_STOP_TIMEOUT_MS)
        await self._stop_step("storage", self.storage.stop())
        self._dir_lock.release()
        self.metrics.state = STOPPED
        log.info("broker_stopped")

    async def _stop_step(
        self,
        step: str,
        work: Awaitable[Any],
        timeout_ms: int = STOP_STEP_TIMEOUT_MS,
        *,
        raise_error: bool = False,
    ) -> None:
        """One step of `stop`, bounded (broker.tasks.bounded_step): an error is logged, or
        raised with `raise_error`."""
        try:
            await bounded_step(self.clock, step, work, timeout_ms)
        except Exception as exc:
            if raise_error:
                raise
            log.warning("stop_step_failed", step=step, error=str(exc) or type(exc).__name__)

    # -- dispatch ---------------------------------------------------------------

    async def dispatch(self, ctx: RequestContext, frame: bytes, body_offset: int) -> bytes | None:
        """Answer one request, counted and timed (failed or cut off too) for the metrics."""
        started = self.metrics.timer()
        try:
            return await self._dispatch(ctx, frame, body_offset)
        finally:
            self.metrics.request_done(ctx.header.api_key, ctx.header.api_version, started)

    async def _dispatch(self, ctx: RequestContext, frame: bytes, body_offset: int) -> bytes | None:
        h = ctx.header
        entry = self.table.lookup(h.api_key, h.api_version)
        if entry is None:
            return self._unsupported(ctx)
        # The structure check first: kio's reader aborts the process on lying lengths.
        # MalformedRequest (from either) propagates: the server closes the connection.
        try:
            frame = request_check.check_request(h.api_key, h.api_version, frame, body_offset)
        except request_check.InvalidRequest as exc:
            log.warning(
                "invalid_request",
                api=api.api_name(h.api_key),
                api_version=h.api_version,
                client_id=h.client_id,
                error=str(exc),
            )
            return error_frame(
                h.api_key, h.api_version, h.correlation_id, ErrorCode.invalid_request, str(exc)
            )
        request = api.decode_request(h.api_key, h.api_version, frame, body_offset)
        log.debug(
            "request",
            api=api.api_name(h.api_key),
            api_version=h.api_version,
            correlation_id=h.correlation_id,
            client_id=h.client_id,
            connection=ctx.connection_id,
        )
        try:
            result = await entry.handler(ctx, request)
        except CloseConnection as exc:
            # The answer never sent still counts (bytes rejected, for a Produce).
            self.metrics.payload(h.api_key, request, exc.response)  # type: ignore[arg-type]
            raise
        if trace.ENABLED:
            trace.event("handled")
        if result is None:
            self.metrics.payload(h.api_key, request, None)
            return None
        # WrongResponse (a handler's bug) propagates like any handler failure.
        body = api.at_version(h.api_key, h.api_version, result)
        self.metrics.payload(h.api_key, request, result)
        return api.encode_response(h.api_key, h.api_version, h.correlation_id, body)

    def _unsupported(self, ctx: RequestContext) -> bytes:
        h = ctx.header
        log.warning(
            "unsupported_request",
            api=api.api_name(h.api_key),
            api_key=h.api_key,
            api_version=h.api_version,
            client_id=h.client_id,
        )
        if h.api_key == api.API_VERSIONS_KEY:
            # KIP-511: answer an unknown ApiVersions version in v0 with our ranges so
            # the client can retry with a version both sides know.
            answer = responses.api_versions_v4.ApiVersionsResponse(
                error_code=ErrorCode.unsupported_version,
                api_keys=self.api_version_entries(),
                throttle_time=NO_THROTTLE,
            )
            body = api.at_version(h.api_key, 0, answer)
            return api.encode_response(h.api_key, 0, h.correlation_id, body)
        entry = self.table.entry(h.api_key)
        message = f"{api.api_name(h.api_key)} v{h.api_version} is not supported" + (
            f"; supported versions are {entry.min_version}-{entry.max_version}" if entry else ""
        )
        return error_frame(
            h.api_key, h.api_version, h.correlation_id, ErrorCode.unsupported_version, message
        )

    def api_version_entries(self) -> tuple[responses.api_versions_v4.ApiVersion, ...]:
        entry = responses.api_versions_v4.ApiVersion
        return tuple(
            entry(
                api_key=i16(e.api_key),
                min_version=i16(e.min_version),
                max_version=i16(e.max_version),
            )
            for e in self.table.entries()
        )


class CoordinatorLogsHost:
    """The broker's side of the coordinator logs' leadership (broker.leadership's
    `CoordinatorHost`): a claimed log is restored from the database and its coordinator
    reloaded (state cleared, log replayed, timers started); a released one stops taking
    writes, finishes those in flight and unloads; a lost one (claimed by another broker)
    unloads at once."""

    def __init__(self, broker: Broker, storage: PgStorage) -> None:
        self.broker = broker
        self.storage = storage

    def _log(self, name: str) -> CoordinatorLog:
        b = self.broker
        if name == "share-state":
            return RecordLog(
                b.data_dir / name,
                b.commit,
                internal_log_config(b.config.get("share.coordinator.state.topic.segment.bytes")),
                clock=b.clock,
                open_log=self.storage.open_log,
            )
        return self.storage.open_coordinator_log(b.data_dir / name, b.commit, clock=b.clock)

    async def open_coordinator(self, name: str, claimed: ClaimedLog) -> None:
        b = self.broker
        runtime = self._runtime(name)
        # Until reloaded, its requests are answered COORDINATOR_LOAD_IN_PROGRESS.
        runtime.begin_loading(f"claimed at epoch {claimed.epoch}")
        try:
            await runtime.quiesce()
            runtime.record_log.close()  # restore_claimed works on a closed log
            await self.storage.restore_claimed(name, claimed)
            record_log = self._log(name)
            if name == "groups":
                b.groups.reload(record_log)
            elif name == "transactions":
                b.transactions.reload(record_log)
            else:
                b.share_persister.reload(record_log)
        except BaseException:
            runtime.unload("its load failed")
            raise
        log.info("coordinator_loaded", log=name, epoch=claimed.epoch)

    async def release_coordinator(self, name: str, reason: str) -> None:
        b = self.broker
        if name == "groups":
            await b.groups.unload(reason)
        elif name == "transactions":
            await b.transactions.unload(reason)
        else:
            runtime = b.share_persister.runtime
            # The state as of the hand-over, for this broker's next term or restart.
            await runtime.checkpoint()
            runtime.unload(reason)
            await runtime.quiesce()
            b.share_persister.unload(reason)

    def drop_coordinator(self, name: str, reason: str) -> None:
        b = self.broker
        if name == "groups":
            b.groups.drop(reason)
        elif name == "transactions":
            b.transactions.drop(reason)
        else:
            b.share_persister.unload(reason)
            b.share.drop_all()  # as a fenced share-state write does

    def _runtime(self, name: str) -> CoordinatorRuntime[Any]:
        b = self.broker
        if name == "groups":
            return b.groups.runtime
        if name == "transactions":
            return b.transactions.runtime
        return b.share_persister.runtime
