"""The broker registry: this broker's lease in the shared database, and the cluster
view built from the registered brokers.

Brokers on one PostgreSQL database form a cluster (issue 25). Each registers at start,
before it opens a log or serves a request, under its `node.id` with an incarnation id
(a uuid per process start, as Kafka's BrokerRegistration carries), its advertised
endpoints per listener and its rack; the row's lease ends `broker.session.timeout.ms`
after each renewal, by the database's clock (persister.pg_registry).

- Registration: a node id held by a live lease of another incarnation is refused, as
  Kafka's controller refuses a duplicate broker registration until the old session
  expires. The new broker waits for that lease to run out (at most
  `broker.session.timeout.ms`) and takes the node id over: a broker restarted at once
  after a kill -9 starts a few seconds later instead of failing. If the lease is renewed
  meanwhile, another broker really runs with that node id: the start fails with
  `DuplicateBrokerRegistration`, naming the node id and the other broker's address.
  No wait when the live lease was registered from this broker's own data dir (same
  host and path): the data dir lock this broker holds proves that incarnation is gone.
- Heartbeat: every `broker.heartbeat.interval.ms` the lease is renewed and the live
  brokers (leases not expired) read again; they are what `live_brokers()` answers
  until the next heartbeat. A renewal that fails (the database is away) is counted and
  tried again at the next interval; the broker keeps serving what it can (the storage
  engine fails its writes meanwhile). A renewal that finds the node id held by another
  incarnation means this broker was paused or cut off past its lease and another took
  its place: it is fenced, and `on_fenced` stops it.
- Stop: after the server has stopped serving, the row is deleted, so the other brokers
  drop this one at their next heartbeat rather than after the session timeout.

`BrokerRegistry` is also the broker's `ClusterView` (broker.cluster): the live brokers
come from the registry, this broker always among them with its current endpoints.
Partition leadership: `leader`/`is_local`/`coordinator` ask `leadership`, leadership by
lease (broker.leadership) once the broker set it, `SingleNode` (this broker leads
everything) until then.

The store is a protocol (`RegistryStore`, PostgreSQL's is persister.pg_registry's
`PgRegistryStore`) and every wait is on the broker's `Clock`, so the lease logic runs in
unit tests on an in-memory store and a `ManualClock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from broker.cluster import BrokerEndpoint, BrokerInfo, Leader, SingleNode
from persister.clock import SYSTEM_CLOCK, Clock, sleep, wait_all
from persister.pg_registry import BrokerRow, Endpoint, Registered, Renewal

log = structlog.get_logger("spool.registry")

# Added to the other incarnation's remaining lease before registering again: the two
# clocks (this broker's timer, the database's now()) need not tick together.
EXPIRY_MARGIN_MS = 100
# The longest a graceful stop waits for the deregistration (the lease expires anyway).
DEREGISTER_TIMEOUT_MS = 5000


class DuplicateBrokerRegistration(OSError):
    """Another live broker holds this node id (Kafka's DUPLICATE_BROKER_REGISTRATION).
    An OSError, so `spool serve` reports it as a failed start (exit code 1)."""


class RegistryStore(Protocol):
    """Where the registrations live (persister.pg_registry.PgRegistryStore)."""

    async def register(
        self,
        node_id: int,
        incarnation_id: uuid.UUID,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        lease_ms: int,
        data_dir: str | None = None,
    ) -> Registered: ...

    async def renew(
        self,
        node_id: int,
        incarnation_id: uuid.UUID,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        lease_ms: int,
    ) -> Renewal: ...

    async def live(self) -> Sequence[BrokerRow]: ...

    async def deregister(self, node_id: int, incarnation_id: uuid.UUID) -> bool: ...

    async def close(self) -> None: ...


class Leaders(Protocol):
    """Who leads what (broker.leadership.Leadership; `SingleNode` for a broker alone)."""

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None: ...

    def is_local(self, leader: Leader | None) -> bool: ...

    def coordinator(self, log: str) -> Leader | None: ...


def _info(row: BrokerRow) -> BrokerInfo:
    return BrokerInfo(
        row.node_id, tuple(BrokerEndpoint(n, h, p) for n, h, p in row.endpoints), row.rack
    )


class BrokerRegistry:
    """This broker's registration and lease, and the `ClusterView` from the registry
    (see the module docstring)."""

    def __init__(
        self,
        store: RegistryStore,
        node_id: int,
        endpoints: Callable[[], Sequence[BrokerEndpoint]],
        rack: str | None,
        *,
        heartbeat_interval_ms: int,
        session_timeout_ms: int,
        clock: Clock = SYSTEM_CLOCK,
        incarnation_id: uuid.UUID | None = None,
        on_fenced: Callable[[str], None] = lambda reason: None,
        data_dir: str | None = None,
    ) -> None:
        """`data_dir` is `host:path` of the data dir whose lock this broker holds (a
        live registration from it is taken over at once), or None."""
        self.store = store
        self._node_id = node_id
        self._endpoints = endpoints
        self.rack = rack
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.clock = clock
        self.incarnation_id = incarnation_id or uuid.uuid4()
        self.on_fenced = on_fenced
        self.data_dir = data_dir
        # Partition leadership: this broker leads everything until leadership by lease
        # (broker.leadership, set by the broker) replaces this object; `leader`,
        # `is_local` and `coordinator` only ask it.
        self.leadership: Leaders = SingleNode(node_id, endpoints, rack)
        # Called after each renewal, once the live brokers were read (leadership
        # reconciles).
        self.on_heartbeat: Callable[[], None] = lambda: None
        # The other live brokers as of the last heartbeat, by node id.
        self._others: dict[int, BrokerInfo] = {}
        self.registered = False
        # Why this broker was fenced (another incarnation holds its node id), or None.
        self.fenced: str | None = None
        self.renewals = 0
        self.renewal_failures = 0
        self._failing_since_ms: int | None = None
        self._task: asyncio.Task[None] | None = None

    # -- registration --------------------------------------------------------------

    def _my_endpoints(self) -> tuple[Endpoint, ...]:
        return tuple((e.listener, e.host, e.port) for e in self._endpoints())

    async def register(self) -> None:
        """Register this incarnation, waiting (at most `broker.session.timeout.ms`) for a
        live lease of another incarnation on the node id to expire; raise
        `DuplicateBrokerRegistration` if it is renewed meanwhile. Store errors (the
        database is away) propagate: the broker does not start."""
        outcome = await self._register_once()
        if outcome.holder is not None:
            first = outcome.holder
            wait_ms = min(max(first.lease_left_ms, 0) + EXPIRY_MARGIN_MS, self.session_timeout_ms)
            log.warning(
                "node_id_registered_by_another_broker",
                node_id=self._node_id,
                other=first.address(),
                other_incarnation=str(first.incarnation_id),
                lease_left_ms=first.lease_left_ms,
                waiting_ms=wait_ms,
                hint="waiting for its lease to expire (a broker restarted after a crash), "
                "then this broker takes the node id over",
            )
            await sleep(self.clock, wait_ms)
            outcome = await self._register_once()
            if outcome.holder is not None:
                holder = outcome.holder
                raise DuplicateBrokerRegistration(
                    f"node.id {self._node_id} is registered by another live broker "
                    f"({holder.address()}, incarnation {holder.incarnation_id}), which "
                    f"renewed its lease while this broker waited {wait_ms} ms for it to "
                    "expire: two brokers cannot share a node.id; give this one another "
                    "node.id, or stop the other"
                )
        if outcome.replaced is not None:
            log.warning(
                "node_id_taken_over",
                node_id=self._node_id,
                previous=outcome.replaced.address(),
                previous_incarnation=str(outcome.replaced.incarnation_id),
                lease_left_ms=outcome.replaced.lease_left_ms,
                reason="its lease expired"
                if outcome.replaced.lease_left_ms <= 0
                else "registered from this data dir, whose lock this broker holds",
            )
        self.registered = True
        self._set_live(await self.store.live())
        log.info(
            "broker_registered",
            node_id=self._node_id,
            incarnation_id=str(self.incarnation_id),
            live_brokers=sorted(b.node_id for b in self.live_brokers()),
        )

    async def _register_once(self) -> Registered:
        return await self.store.register(
            self._node_id,
            self.incarnation_id,
            self._my_endpoints(),
            self.rack,
            self.session_timeout_ms,
            self.data_dir,
        )

    # -- heartbeat -----------------------------------------------------------------

    def start(self) -> None:
        """Start the heartbeat: a first renewal at once (it publishes the endpoints of
        listeners bound to port 0, known only now), then one every interval."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while await self.heartbeat():
            await sleep(self.clock, self.heartbeat_interval_ms)

    async def heartbeat(self) -> bool:
        """Renew the lease and read the live brokers; False once fenced."""
        if self.fenced is not None:
            return False
        try:
            renewal = await self.store.renew(
                self._node_id,
                self.incarnation_id,
                self._my_endpoints(),
                self.rack,
                self.session_timeout_ms,
            )
        except Exception as exc:
            self._renewal_failed(exc)
            return True
        if not renewal.renewed:
            self._fence(renewal.holder)
            return False
        self.renewals += 1
        if self._failing_since_ms is not None:
            log.info(
                "broker_lease_renewed_again",
                node_id=self._node_id,
                failing_for_ms=self.clock.now_ms() - self._failing_since_ms,
            )
            self._failing_since_ms = None
        self._set_live(renewal.live)
        self.on_heartbeat()
        return True

    def _renewal_failed(self, exc: Exception) -> None:
        self.renewal_failures += 1
        if self._failing_since_ms is None:
            self._failing_since_ms = self.clock.now_ms()
            log.warning(
                "broker_lease_renewal_failed",
                node_id=self._node_id,
                error=str(exc) or type(exc).__name__,
                hint=f"retrying every {self.heartbeat_interval_ms} ms; the lease ends "
                f"{self.session_timeout_ms} ms after the last renewal",
            )
        else:
            log.debug("broker_lease_renewal_failed", node_id=self._node_id, error=str(exc))

    def _fence(self, holder: BrokerRow | None) -> None:
        if holder is None:
            reason = (
                f"the registration of node.id {self._node_id} was removed from the "
                "storage database while this broker held it"
            )
        else:
            reason = (
                f"node.id {self._node_id} was taken over by another broker "
                f"({holder.address()}, incarnation {holder.incarnation_id}) after this "
                f"one's lease expired (broker.session.timeout.ms {self.session_timeout_ms} "
                "without a renewal: paused or cut off from the database)"
            )
        self.fenced = reason
        self.registered = False
        self._others = {}
        log.error("broker_fenced", node_id=self._node_id, reason=reason, action="stopping")
        self.on_fenced(reason)

    def _set_live(self, rows: Sequence[BrokerRow]) -> None:
        others = {row.node_id: _info(row) for row in rows if row.node_id != self._node_id}
        if others.keys() != self._others.keys():
            log.info(
                "live_brokers_changed",
                node_id=self._node_id,
                live_brokers=sorted([self._node_id, *others]),
            )
        self._others = others

    # -- stop ----------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop the heartbeat and remove this broker's registration (bounded wait: if
        the database is away, the others see the lease expire instead)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.registered:
            self.registered = False
            removal = asyncio.ensure_future(
                self.store.deregister(self._node_id, self.incarnation_id)
            )
            if await wait_all(self.clock, [removal], DEREGISTER_TIMEOUT_MS):
                removal.cancel()
                log.warning("broker_deregistration_timed_out", node_id=self._node_id)
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    removed = await removal
                except Exception as exc:
                    log.warning("broker_deregistration_failed", error=str(exc))
                else:
                    log.info("broker_deregistered", node_id=self._node_id, removed=removed)
        await self.store.close()

    # -- ClusterView -----------------------------------------------------------------

    @property
    def node_id(self) -> int:
        return self._node_id

    def _me(self) -> BrokerInfo:
        return BrokerInfo(self._node_id, tuple(self._endpoints()), self.rack)

    def live_brokers(self) -> Sequence[BrokerInfo]:
        """This broker and the others live as of the last heartbeat, by node id."""
        return sorted([self._me(), *self._others.values()], key=lambda b: b.node_id)

    def broker(self, node_id: int) -> BrokerInfo | None:
        if node_id == self._node_id:
            return self._me()
        return self._others.get(node_id)

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None:
        return self.leadership.leader(topic_id, partition)

    def is_local(self, leader: Leader | None) -> bool:
        return self.leadership.is_local(leader)

    def coordinator(self, log: str) -> Leader | None:
        return self.leadership.coordinator(log)
