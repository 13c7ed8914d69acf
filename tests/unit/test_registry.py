"""The broker registry's lease logic (broker.registry) on an in-memory store and a
ManualClock: registration and a duplicate node.id, takeover of an expired lease,
heartbeats refreshing the live brokers, fencing of a broker paused past its lease, a
database outage, and the deregistration of a graceful stop.

`MemoryStore` keeps the rows as persister.pg_registry's table does, with the lease
expiry on its own clock (the database's); here that clock is the test's ManualClock,
far from the wall clock, so a registry that read the real time would fail.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from broker import cli
from broker.cluster import BrokerEndpoint
from broker.config import BrokerConfig
from broker.registry import BrokerRegistry, DuplicateBrokerRegistration
from persister.clock import ManualClock
from persister.pg_registry import BrokerRow, Endpoint, Registered, Renewal
from protocol.errors import KafkaError

FAR_FROM_NOW_MS = 1_000_000_000_000
INTERVAL_MS = 2000
SESSION_MS = 9000


async def turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@dataclass
class _Row:
    incarnation_id: uuid.UUID
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    expires_ms: int
    data_dir: str | None = None


class MemoryStore:
    """The registry table in memory, leases on `clock` (the database's clock)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.rows: dict[int, _Row] = {}
        self.down = False
        self.closed = 0

    def _check(self) -> None:
        if self.down:
            raise OSError("connection refused")

    def _out(self, node_id: int) -> BrokerRow:
        r = self.rows[node_id]
        return BrokerRow(
            node_id, r.incarnation_id, r.endpoints, r.rack, r.expires_ms - self.clock.now_ms()
        )

    async def register(
        self,
        node_id: int,
        incarnation_id: uuid.UUID,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        lease_ms: int,
        data_dir: str | None = None,
    ) -> Registered:
        self._check()
        before = self._out(node_id) if node_id in self.rows else None
        if (
            before is not None
            and before.lease_left_ms > 0
            and before.incarnation_id != incarnation_id
            and (data_dir is None or self.rows[node_id].data_dir != data_dir)
        ):
            return Registered(before)
        self.rows[node_id] = _Row(
            incarnation_id, tuple(endpoints), rack, self.clock.now_ms() + lease_ms, data_dir
        )
        replaced = before if before and before.incarnation_id != incarnation_id else None
        return Registered(None, replaced)

    async def renew(
        self,
        node_id: int,
        incarnation_id: uuid.UUID,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        lease_ms: int,
    ) -> Renewal:
        self._check()
        row = self.rows.get(node_id)
        if row is None or row.incarnation_id != incarnation_id:
            return Renewal(False, holder=None if row is None else self._out(node_id))
        self.rows[node_id] = _Row(
            incarnation_id, tuple(endpoints), rack, self.clock.now_ms() + lease_ms
        )
        return Renewal(True, tuple(await self.live()))

    async def live(self) -> Sequence[BrokerRow]:
        self._check()
        out = [self._out(n) for n in sorted(self.rows)]
        return [r for r in out if r.lease_left_ms > 0]

    async def deregister(self, node_id: int, incarnation_id: uuid.UUID) -> bool:
        self._check()
        row = self.rows.get(node_id)
        if row is None or row.incarnation_id != incarnation_id:
            return False
        del self.rows[node_id]
        return True

    async def close(self) -> None:
        self.closed += 1


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(now_ms=FAR_FROM_NOW_MS)


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock)


def registry(
    store: MemoryStore,
    clock: ManualClock,
    node_id: int,
    port: int,
    fenced: list[str] | None = None,
    data_dir: str | None = None,
) -> BrokerRegistry:
    return BrokerRegistry(
        store,
        node_id,
        lambda: [BrokerEndpoint("PLAINTEXT", "127.0.0.1", port)],
        "rack-a",
        heartbeat_interval_ms=INTERVAL_MS,
        session_timeout_ms=SESSION_MS,
        clock=clock,
        on_fenced=(fenced if fenced is not None else []).append,
        data_dir=data_dir,
    )


def ids(reg: BrokerRegistry) -> list[int]:
    return [b.node_id for b in reg.live_brokers()]


async def test_brokers_see_each_other_after_a_heartbeat(
    store: MemoryStore, clock: ManualClock
) -> None:
    one = registry(store, clock, 1, 9001)
    await one.register()
    assert ids(one) == [1]
    two = registry(store, clock, 2, 9002)
    await two.register()
    assert ids(two) == [1, 2]  # the registration reads the live brokers
    assert ids(one) == [1]  # until its next heartbeat
    assert await one.heartbeat()
    assert ids(one) == [1, 2]
    other = one.broker(2)
    assert other is not None
    assert other.endpoint("PLAINTEXT") == BrokerEndpoint("PLAINTEXT", "127.0.0.1", 9002)
    assert other.rack == "rack-a"
    assert one.broker(3) is None
    # Leadership is not by lease yet: this broker leads everything.
    leader = one.leader(uuid.uuid4(), 0)
    assert leader is not None and leader.node_id == 1 and one.is_local(leader)


async def test_heartbeats_keep_the_lease_and_a_dead_broker_drops_out(
    store: MemoryStore, clock: ManualClock
) -> None:
    one = registry(store, clock, 1, 9001)
    two = registry(store, clock, 2, 9002)
    await one.register()
    await two.register()
    one.start()
    two.start()
    await turns()
    # Well past one session: the heartbeats renewed both leases.
    for _ in range(3 * SESSION_MS // INTERVAL_MS):
        clock.advance(INTERVAL_MS)
        await turns()
    assert ids(one) == [1, 2] and ids(two) == [1, 2]
    assert one.renewals >= 3 * SESSION_MS // INTERVAL_MS
    # Broker 2 dies without a word (kill -9): its heartbeat stops, its row stays.
    assert two._task is not None
    two._task.cancel()
    await turns()
    clock.advance(SESSION_MS - INTERVAL_MS)
    await turns()
    assert ids(one) == [1, 2]  # its lease has not run out yet
    clock.advance(2 * INTERVAL_MS)
    await turns()
    assert ids(one) == [1]
    await one.stop()


async def test_a_duplicate_node_id_is_refused_while_the_other_renews(
    store: MemoryStore, clock: ManualClock
) -> None:
    one = registry(store, clock, 1, 9001)
    await one.register()
    one.start()
    await turns()
    twin = registry(store, clock, 1, 9999)
    attempt = asyncio.create_task(twin.register())
    await turns()
    assert not attempt.done()  # waiting for the other lease to expire
    for _ in range(SESSION_MS // INTERVAL_MS + 1):
        clock.advance(INTERVAL_MS)
        await turns()
    with pytest.raises(DuplicateBrokerRegistration) as refused:
        await attempt
    message = str(refused.value)
    assert "node.id 1 " in message and "PLAINTEXT://127.0.0.1:9001" in message
    assert not twin.registered
    assert store.rows[1].incarnation_id == one.incarnation_id
    assert await one.heartbeat()  # the first broker was not disturbed
    await one.stop()


async def test_an_expired_lease_is_taken_over_after_the_wait(
    store: MemoryStore, clock: ManualClock
) -> None:
    dead = registry(store, clock, 1, 9001)
    await dead.register()  # then killed: no heartbeat
    clock.advance(INTERVAL_MS)
    restarted = registry(store, clock, 1, 9001)
    attempt = asyncio.create_task(restarted.register())
    await turns()
    # The wait is the other lease's remainder, not a whole session.
    clock.advance(SESSION_MS - INTERVAL_MS - 1)
    await turns()
    assert not attempt.done()
    clock.advance(200)
    await turns()
    assert attempt.done()
    await attempt
    assert restarted.registered
    assert store.rows[1].incarnation_id == restarted.incarnation_id


async def test_a_restart_on_the_same_data_dir_takes_the_live_lease_at_once(
    store: MemoryStore, clock: ManualClock
) -> None:
    dead = registry(store, clock, 1, 9001, data_dir="host-a:/data")
    await dead.register()  # then killed; its data dir lock went with it
    restarted = registry(store, clock, 1, 9001, data_dir="host-a:/data")
    await restarted.register()  # no wait: the clock has not moved
    assert store.rows[1].incarnation_id == restarted.incarnation_id
    # Another data dir still waits for the lease.
    elsewhere = registry(store, clock, 1, 9002, data_dir="host-b:/data")
    attempt = asyncio.create_task(elsewhere.register())
    await turns()
    assert not attempt.done()
    attempt.cancel()


async def test_a_broker_paused_past_its_lease_is_fenced_when_another_took_its_node_id(
    store: MemoryStore, clock: ManualClock
) -> None:
    fenced: list[str] = []
    paused = registry(store, clock, 1, 9001, fenced)
    await paused.register()
    clock.advance(SESSION_MS + 1)  # SIGSTOP: no heartbeat for longer than the lease
    other = registry(store, clock, 1, 9005)
    await other.register()  # no wait: the lease has expired
    assert await paused.heartbeat() is False  # SIGCONT: the renewal finds the row taken
    assert paused.fenced is not None and fenced == [paused.fenced]
    assert "PLAINTEXT://127.0.0.1:9005" in paused.fenced
    assert await paused.heartbeat() is False
    await paused.stop()  # a fenced broker leaves the new owner's row alone
    assert store.rows[1].incarnation_id == other.incarnation_id


async def test_a_paused_broker_nobody_replaced_renews_its_lease_again(
    store: MemoryStore, clock: ManualClock
) -> None:
    fenced: list[str] = []
    paused = registry(store, clock, 1, 9001, fenced)
    await paused.register()
    clock.advance(SESSION_MS * 2)
    assert await paused.heartbeat()
    assert fenced == [] and paused.fenced is None


async def test_renewals_fail_during_an_outage_and_resume_after(
    store: MemoryStore, clock: ManualClock
) -> None:
    fenced: list[str] = []
    one = registry(store, clock, 1, 9001, fenced)
    await one.register()
    one.start()
    await turns()
    renewed = one.renewals
    store.down = True
    for _ in range(5):
        clock.advance(INTERVAL_MS)
        await turns()
    assert one.renewal_failures == 5
    assert one.renewals == renewed
    assert ids(one) == [1]  # itself, always
    store.down = False
    clock.advance(INTERVAL_MS)
    await turns()
    assert one.renewals == renewed + 1
    assert fenced == [] and one._task is not None and not one._task.done()
    await one.stop()


async def test_a_graceful_stop_deregisters(store: MemoryStore, clock: ManualClock) -> None:
    one = registry(store, clock, 1, 9001)
    two = registry(store, clock, 2, 9002)
    await one.register()
    await two.register()
    two.start()
    await turns()
    await two.stop()
    assert 2 not in store.rows
    assert store.closed == 1
    assert await one.heartbeat()
    assert ids(one) == [1]  # gone at the next heartbeat, not after the session timeout


async def test_a_stop_with_the_database_away_does_not_hang(
    store: MemoryStore, clock: ManualClock
) -> None:
    one = registry(store, clock, 1, 9001)
    await one.register()
    store.down = True
    await one.stop()
    assert 1 in store.rows and store.closed == 1


def test_the_node_id_flag_is_short_for_node_id() -> None:
    args = cli.build_parser().parse_args(["serve", "--node-id", "3"])
    static: dict[str, object] = {}
    cli.apply_node_id(static, args.node_id)
    assert BrokerConfig(static).get("node.id") == 3
    with pytest.raises(KafkaError, match="use one or the other"):
        cli.apply_node_id({"node.id": "2"}, 3)
    with pytest.raises(KafkaError, match="must be at least 0"):
        BrokerConfig({"node.id": -1})


def test_lease_config_keys_are_kafkas() -> None:
    config = BrokerConfig({})
    assert config.get("broker.heartbeat.interval.ms") == 2000
    assert config.get("broker.session.timeout.ms") == 9000
    BrokerConfig({"broker.heartbeat.interval.ms": "500", "broker.session.timeout.ms": "1000"})
    with pytest.raises(KafkaError, match=r"half of broker\.session\.timeout\.ms"):
        BrokerConfig({"broker.heartbeat.interval.ms": "5000"})
    with pytest.raises(KafkaError, match="must be at least 1"):
        BrokerConfig({"broker.session.timeout.ms": "0"})
