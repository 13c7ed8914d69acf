"""Leadership by lease: which broker leads each topic partition, claimed in the database.

Brokers on one PostgreSQL database (broker.registry) split the partitions between them
without a controller. Every broker computes the same target layout (`layout`) from the
same inputs, the live brokers (the registry's view, by node id) and the topics (the
shared metadata):

- the partitions of a topic are spread evenly: each goes to the live broker ranking
  highest for it by a stable hash of (topic id, partition, node id) (rendezvous
  hashing) that still has room, a broker taking at most ceil(partitions / brokers) of
  the topic (6 partitions on 3 brokers: 2/2/2). When a broker joins, the partitions
  ranking it first move to it and few others move (about 1/n of them); when one
  leaves, its partitions go to their next choice.

Brokers that briefly disagree (one saw a broker join, the other not yet) only delay a
hand-over: the target is a wish, the claim in PostgreSQL (persister.pg_leadership) is
what decides, fenced by the log's leader epoch.

`Leadership.reconcile` runs at start, after every registry heartbeat and whenever the
topics change: it reads the live holders of every log, then

- releases what this broker leads and the target gives to another (a broker joined):
  the partition stops taking writes, its in-flight writes are committed, it is dropped
  (broker.partitions.LogManager) and its holder set to NULL, epoch unchanged;
- claims what the target gives it and it does not lead: the claim succeeds when the log
  has no live holder (released, never led, or its broker's lease expired: failover),
  then the log is restored from the database into the data dir and opened; a claim
  refused (a live broker still holds the log, it will release it at its own next
  reconcile) is tried again at the next one;
- drops what it thought it led and another broker claimed since (it was paused or cut
  off past its lease: its writes are fenced anyway).

A graceful stop releases everything before the broker deregisters, so the others take
its partitions at their next heartbeat instead of after `broker.session.timeout.ms`.

The cluster view's `leader(topic_id, partition)` answers from the holders as last read
(plus this broker's own claims and releases since): None while a partition has no live
holder.

The coordinator logs (`groups`, `share-state`, `transactions`) follow the layout as
partitions do, given a `CoordinatorHost` (the broker on PostgreSQL): each goes to the
live broker ranking highest for it by the same stable hash (`coordinator_layout`; a
broker alone gets all three, three brokers one each), claimed conditionally with epoch
+ 1; the claimer restores the log from the database and loads its coordinator (state
cleared, log replayed, timers started); a release (the layout moved it) stops taking
writes, lets the ones in flight finish and unloads; a claim by another broker (this one
was fenced) unloads at once. `coordinator(log)` names the live holder, which
FindCoordinator answers, the claimer from its claim on; a broker that does not lead a
coordinator log refuses its requests with NOT_COORDINATOR (coordinator.runtime's
`unload`), and the claimer, while it loads the log, with COORDINATOR_LOAD_IN_PROGRESS
(`begin_loading`), which clients retry on the same broker. When the holder dies,
its lease expires after `broker.session.timeout.ms` and the next broker in the layout
claims the log at its next heartbeat.

Sans-IO apart from the store and the host (what the broker does to open and drop a
log), both protocols, so the logic runs in unit tests without a database.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from broker.cluster import Leader
from persister.pg_leadership import ClaimedLog, Holder

if TYPE_CHECKING:
    from broker.partitions import LogManager

log = structlog.get_logger("spool.leadership")

# The epoch in `Leadership.mine` of a partition whose claim is running.
PENDING = -1
# The coordinator record logs, by log name (`meta` is shared by every broker, not led).
COORDINATOR_LOGS = ("groups", "share-state", "transactions")


def partition_log(topic: str, index: int) -> str:
    """The log name of a topic partition (its directory under the data dir)."""
    return f"topics/{topic}-{index}"


def stable_hash(*parts: str) -> int:
    """A 64-bit hash of `parts`, the same in every process (unlike Python's `hash`)."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def spread(keys: Sequence[str], live: Sequence[int]) -> dict[str, int]:
    """Place `keys` on the `live` node ids: each key on the node ranking highest for it
    (rendezvous hashing) among those with room, a node taking at most
    ceil(len(keys) / len(live)) keys. {} when no node is live."""
    if not live:
        return {}
    room = -(-len(keys) // len(live))
    load = dict.fromkeys(live, 0)
    placed: dict[str, int] = {}
    for key in keys:
        ranked = sorted(live, key=lambda node: (stable_hash(key, str(node)), node), reverse=True)
        node = next(n for n in ranked if load[n] < room)
        load[node] += 1
        placed[key] = node
    return placed


@dataclass(frozen=True, slots=True)
class TopicRef:
    """A topic as the layout needs it."""

    name: str
    topic_id: uuid.UUID
    partitions: int


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """A topic partition's log."""

    topic: str
    topic_id: uuid.UUID
    index: int

    @property
    def name(self) -> str:
        return partition_log(self.topic, self.index)


def coordinator_layout(live: Sequence[int]) -> dict[str, int]:
    """The target leader of every coordinator log (`COORDINATOR_LOGS`), by the same
    stable hash as partitions: all three on a broker alone, one each on three."""
    return spread(list(COORDINATOR_LOGS), sorted(set(live)))


def layout(topics: Iterable[TopicRef], live: Sequence[int]) -> dict[str, int]:
    """The target leader of every topic partition's log, by log name (see the module
    docstring); the same on every broker given the same topics and live node ids."""
    nodes = sorted(set(live))
    target: dict[str, int] = {}
    for topic in topics:
        keys = [f"{topic.topic_id}:{index}" for index in range(topic.partitions)]
        placed = spread(keys, nodes)
        for index, key in enumerate(keys):
            if key in placed:
                target[partition_log(topic.name, index)] = placed[key]
    return target


class LeadershipStore(Protocol):
    """The claims in the database (persister.pg_leadership.PgLeadershipStore)."""

    async def holders(self) -> Mapping[str, Holder]: ...

    async def claim(self, name: str, node_id: int, topic_id: str | None) -> ClaimedLog | None: ...

    async def release(self, name: str, node_id: int, epoch: int) -> bool: ...


class LeadershipHost(Protocol):
    """What the broker does with the partitions it gains and loses."""

    async def open_partition(self, ref: PartitionRef, claimed: ClaimedLog) -> None:
        """Restore the claimed log from the database and open it."""
        ...

    async def release_partition(self, ref: PartitionRef, reason: str) -> None:
        """Stop writes, commit what is in flight, then drop the partition."""
        ...

    def drop_partition(self, ref: PartitionRef, reason: str) -> None:
        """Drop a partition another broker claimed (no flush: it would be fenced)."""
        ...

    def claim_on_open(self, ref: PartitionRef, claim: asyncio.Future[ClaimedLog | None]) -> None:
        """The partition is about to open while `claim` runs: its first commit waits."""
        ...


class CoordinatorHost(Protocol):
    """What the broker does with the coordinator logs it gains and loses."""

    async def open_coordinator(self, name: str, claimed: ClaimedLog) -> None:
        """Restore the claimed log from the database and load its coordinator."""
        ...

    async def release_coordinator(self, name: str, reason: str) -> None:
        """Stop taking writes, let those in flight finish, unload the coordinator."""
        ...

    def drop_coordinator(self, name: str, reason: str) -> None:
        """Unload a coordinator whose log another broker claimed (its writes are fenced)."""
        ...


class Leadership:
    """This broker's leadership of partitions, and the answers of the cluster view
    about leaders (see the module docstring)."""

    def __init__(
        self,
        store: LeadershipStore,
        node_id: int,
        live: Callable[[], Iterable[int]],
        topics: Callable[[], Iterable[TopicRef]],
        host: LeadershipHost,
        coordinators: CoordinatorHost | None = None,
    ) -> None:
        self.store = store
        # Places and claims the coordinator logs too when given (see the docstring).
        self.coordinators = coordinators
        self._node_id = node_id
        self._live = live
        self._topics = topics
        self.host = host
        # Live holders of every log as last read, with this broker's own changes since.
        self._holders: dict[str, Holder] = {}
        # The partitions this broker leads (claimed and opened), by log name: epoch;
        # PENDING while a claim made as the partition opened runs (`leads`).
        self.mine: dict[str, int] = {}
        # Set once the first reconcile ran: from then on a new partition the layout
        # gives this broker is claimed as it opens.
        self._ready = False
        self._pending: set[asyncio.Task[ClaimedLog | None]] = set()
        # (topic id, partition) -> log name, for `leader`.
        self._names: dict[tuple[uuid.UUID, int], str] = {}
        self.claims = 0
        self.claims_refused = 0
        self.releases = 0
        self._lock = asyncio.Lock()
        self._wanted = False
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    # -- the view --------------------------------------------------------------------

    @property
    def node_id(self) -> int:
        return self._node_id

    def leads(self, topic: str, index: int) -> bool:
        """Whether this broker leads the partition (LogManager opens only those).

        A partition the layout gives this broker, with no other live holder known, that
        opens after the first reconcile (a topic created or grown, here or by another
        broker) is claimed as it opens: the topic's creator answers CreateTopics with
        its partitions open, as a broker alone did. Its first commit waits for the
        claim; a claim refused, or one finding data the new partition lacks, drops it
        again, and the next reconcile claims and restores it."""
        name = partition_log(topic, index)
        if name in self.mine:
            return True
        if not self._ready or self._stopped:
            return False
        found = next((t for t in self._topics() if t.name == topic), None)
        if found is None or index >= found.partitions:
            return False
        live = sorted({self._node_id, *self._live()})
        if layout([found], live).get(name) != self._node_id:
            return False
        holder = self._holders.get(name)
        if holder is not None and holder.node_id != self._node_id:
            return False
        ref = PartitionRef(topic, found.topic_id, index)
        self._names[(ref.topic_id, index)] = name
        self.mine[name] = PENDING
        task = asyncio.get_running_loop().create_task(self._claim_on_open(ref))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        self.host.claim_on_open(ref, task)
        return True

    async def claims_settled(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the claims on open in flight: CreateTopics and
        CreatePartitions answer once the new partitions' leaders are known, so a client's
        next Metadata names them (not LEADER_NOT_AVAILABLE, which librdkafka retries only
        after its backoff, about 1 s for a topic's first produce)."""
        pending = list(self._pending)
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    async def _claim_on_open(self, ref: PartitionRef) -> ClaimedLog | None:
        name = ref.name
        try:
            claimed = await self.store.claim(name, self._node_id, str(ref.topic_id))
        except Exception as exc:
            log.warning("partition_claim_failed", log=name, error=str(exc))
            claimed = None
        if self.mine.get(name) != PENDING:
            return claimed  # dropped or released meanwhile
        if claimed is None or (claimed.log_start_offset, claimed.next_offset) != (0, 0):
            del self.mine[name]
            if claimed is None:
                self.claims_refused += 1
            reason = "claim refused" if claimed is None else "the database holds data: restoring"
            self.host.drop_partition(ref, reason)
            if claimed is not None:
                self.claims += 1
                self.request()  # claimed already: the reconcile restores and opens it
            return claimed
        self.claims += 1
        self.mine[name] = claimed.epoch
        self._holders[name] = Holder(self._node_id, claimed.epoch)
        log.info("partition_led", log=name, epoch=claimed.epoch, on_open=True)
        return claimed

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None:
        name = self._names.get((topic_id, partition))
        holder = None if name is None else self._holders.get(name)
        if holder is None:
            return None
        if holder.node_id == self._node_id and name not in self.mine:
            return None  # a former incarnation's claim, not taken over yet
        return Leader(holder.node_id, holder.epoch)

    def is_local(self, leader: Leader | None) -> bool:
        return leader is not None and leader.node_id == self._node_id

    def coordinator(self, log: str) -> Leader | None:
        holder = self._holders.get(log)
        if holder is None:
            return None
        if (
            self.coordinators is not None
            and holder.node_id == self._node_id
            and log not in self.mine
        ):
            return None  # a former incarnation's claim, or released: not served here
        return Leader(holder.node_id, holder.epoch)

    def _coordinator_logs(self) -> tuple[str, ...]:
        return COORDINATOR_LOGS if self.coordinators is not None else ()

    # -- reconciling -----------------------------------------------------------------

    def request(self) -> None:
        """Reconcile soon (after a heartbeat, a topic change); one run at a time, a
        request during a run runs once more after it."""
        if self._stopped:
            return
        self._wanted = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._wanted and not self._stopped:
            self._wanted = False
            try:
                await self.reconcile()
            except Exception as exc:
                log.warning("leadership_reconcile_failed", error=str(exc) or type(exc).__name__)

    async def reconcile(self) -> None:
        """Claim what the layout gives this broker, release what it gives others."""
        async with self._lock:
            if self._stopped:
                return
            claimed_before = dict(self.mine)
            holders = dict(await self.store.holders())
            # A claim on open that landed while the holders were read is newer than
            # what was read: this broker holds it at that epoch (else it would be taken
            # for lost, dropped and claimed again, leaderless until then).
            for name, epoch in self.mine.items():
                if epoch != PENDING and claimed_before.get(name) != epoch:
                    holders[name] = Holder(self._node_id, epoch)
            topics = list(self._topics())
            refs = {
                ref.name: ref
                for topic in topics
                for ref in (
                    PartitionRef(topic.name, topic.topic_id, i) for i in range(topic.partitions)
                )
            }
            self._names = {(ref.topic_id, ref.index): name for name, ref in refs.items()}
            live = sorted({self._node_id, *self._live()})
            target = layout(topics, live)
            coordinator_logs = self._coordinator_logs()
            if coordinator_logs:
                target.update(coordinator_layout(live))
            # Lost: another broker claimed a log this broker led (it was fenced), or no
            # live broker holds it.
            for name, epoch in list(self.mine.items()):
                if epoch == PENDING:
                    continue
                ref = refs.get(name)
                if ref is None and name not in coordinator_logs:
                    del self.mine[name]  # its topic was deleted (LogManager removed it)
                    continue
                holder = holders.get(name)
                if holder is not None and (holder.node_id, holder.epoch) == (self._node_id, epoch):
                    continue
                # Claimed by another broker, or held by no live broker (this one's lease
                # expired meanwhile, and a taker may have released it since): dropped,
                # and claimed again below (epoch + 1) if the layout gives it here.
                reason = (
                    "no live holder: this broker's lease expired"
                    if holder is None
                    else f"claimed by broker {holder.node_id} at epoch {holder.epoch}"
                )
                if name in coordinator_logs:
                    del self.mine[name]
                    assert self.coordinators is not None
                    self.coordinators.drop_coordinator(name, reason)
                    continue
                assert ref is not None
                del self.mine[name]
                self.host.drop_partition(ref, reason)
            self._holders = holders
            for name, epoch in list(self.mine.items()):
                goes_to = target.get(name)
                if epoch == PENDING:
                    continue  # released once its claim is in
                if goes_to is not None and goes_to != self._node_id:
                    reason = f"handed over to broker {goes_to}"
                    if name in coordinator_logs:
                        await self._release_coordinator(name, epoch, reason)
                    else:
                        await self._release(refs[name], epoch, reason)
            # The coordinator logs first: FindCoordinator then names their holder.
            for name in coordinator_logs:
                if target.get(name) == self._node_id and name not in self.mine:
                    await self._claim_coordinator(name)
            for name, ref in refs.items():
                if target.get(name) == self._node_id and name not in self.mine:
                    await self._claim(ref)
            self._ready = True

    async def _claim(self, ref: PartitionRef) -> None:
        claimed = await self.store.claim(ref.name, self._node_id, str(ref.topic_id))
        if claimed is None:
            self.claims_refused += 1
            return
        self.claims += 1
        self.mine[ref.name] = claimed.epoch
        try:
            await self.host.open_partition(ref, claimed)
        except BaseException:
            del self.mine[ref.name]
            raise
        self._holders[ref.name] = Holder(self._node_id, claimed.epoch)
        log.info("partition_led", log=ref.name, epoch=claimed.epoch)

    async def _claim_coordinator(self, name: str) -> None:
        assert self.coordinators is not None
        claimed = await self.store.claim(name, self._node_id, None)
        if claimed is None:
            self.claims_refused += 1
            return
        self.claims += 1
        self.mine[name] = claimed.epoch
        # Named as the coordinator from the claim on, while it loads too (its requests
        # are answered COORDINATOR_LOAD_IN_PROGRESS meanwhile), as Kafka's
        # FindCoordinator names a coordinator partition's leader whether it loaded or not.
        self._holders[name] = Holder(self._node_id, claimed.epoch)
        try:
            await self.coordinators.open_coordinator(name, claimed)
        except BaseException:
            # Claimed but not loaded: the next reconcile claims it again (epoch + 1).
            del self.mine[name]
            self._holders.pop(name, None)
            raise
        log.info("coordinator_led", log=name, epoch=claimed.epoch)

    async def _release_coordinator(self, name: str, epoch: int, reason: str) -> None:
        assert self.coordinators is not None
        # Not led from here on: FindCoordinator names no one until the next holder.
        self._holders.pop(name, None)
        del self.mine[name]
        try:
            await self.coordinators.release_coordinator(name, reason)
        finally:
            self.releases += 1
            await self.store.release(name, self._node_id, epoch)
        log.info("coordinator_released", log=name, epoch=epoch, reason=reason)

    async def _release(self, ref: PartitionRef, epoch: int, reason: str) -> None:
        # Not led from here on: a request meanwhile is told NOT_LEADER_OR_FOLLOWER.
        self._holders.pop(ref.name, None)
        del self.mine[ref.name]
        try:
            await self.host.release_partition(ref, reason)
        finally:
            self.releases += 1
            await self.store.release(ref.name, self._node_id, epoch)
        log.info("partition_released", log=ref.name, epoch=epoch, reason=reason)

    async def stop(self) -> None:
        """A graceful stop: no more reconciles, and every partition led is released (a
        bounded wait per release is the caller's)."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self._lock:
            names = {(ref.topic_id, ref.index): ref for ref in self._refs()}
            by_name = {ref.name: ref for ref in names.values()}
            coordinator_logs = self._coordinator_logs()
            for name, epoch in list(self.mine.items()):
                if name in coordinator_logs:
                    continue  # after the partitions, whose release may write share state
                ref = by_name.get(name)
                if ref is None or epoch == PENDING:
                    del self.mine[name]
                    continue
                try:
                    await self._release(ref, epoch, "broker stopping")
                except Exception as exc:
                    log.warning("partition_release_failed", log=name, error=str(exc))
            for name, epoch in list(self.mine.items()):
                if name in coordinator_logs:
                    try:
                        await self._release_coordinator(name, epoch, "broker stopping")
                    except Exception as exc:
                        log.warning("coordinator_release_failed", log=name, error=str(exc))

    def _refs(self) -> list[PartitionRef]:
        return [
            PartitionRef(topic.name, topic.topic_id, i)
            for topic in self._topics()
            for i in range(topic.partitions)
        ]


class LogManagerHost:
    """The broker's side (`LeadershipHost`): a claimed partition is restored from the
    database (`restore`, PgStorage.restore_claimed) and opened by the LogManager; a
    released one handed over by it."""

    def __init__(
        self,
        logs: LogManager,
        restore: Callable[[str, ClaimedLog], Awaitable[None]],
        configs: Callable[[str], Mapping[str, str] | None],
        claim_on_open: Callable[[str, asyncio.Future[ClaimedLog | None]], None],
    ) -> None:
        self.logs = logs
        self.restore = restore
        self.configs = configs
        self._claim_on_open = claim_on_open

    def claim_on_open(self, ref: PartitionRef, claim: asyncio.Future[ClaimedLog | None]) -> None:
        self._claim_on_open(ref.name, claim)

    async def open_partition(self, ref: PartitionRef, claimed: ClaimedLog) -> None:
        overrides = self.configs(ref.topic)
        if overrides is None:
            raise LookupError(f"topic {ref.topic} is gone")
        await self.restore(ref.name, claimed)
        self.logs.open_partition(ref.topic, ref.topic_id, ref.index, dict(overrides))

    async def release_partition(self, ref: PartitionRef, reason: str) -> None:
        await self.logs.release_partition(ref.topic, ref.index, reason)

    def drop_partition(self, ref: PartitionRef, reason: str) -> None:
        self.logs.drop_partition(ref.topic, ref.index, reason)
