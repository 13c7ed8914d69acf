"""bench.cluster's plumbing without brokers: when leaders count as settled, and the
side-by-side table from given readings (no timing asserted)."""

from __future__ import annotations

from types import SimpleNamespace

from bench import Result
from bench.cluster import (
    LIBRDKAFKA_CLIENT,
    PROTOCOL_CLIENT,
    CpuSample,
    Failover,
    Reading,
    assignment_settled,
    ceilings,
    cores_used,
    format_side_by_side,
    spread_evenly,
)


def test_settled_means_all_brokers_agree_and_the_spread_is_even() -> None:
    even = {0: 1, 1: 2, 2: 3, 3: 1, 4: 2, 5: 3}
    assert spread_evenly([even, dict(even)], {1, 2, 3}, 6)
    assert not spread_evenly([even, {**even, 0: 2}], {1, 2, 3}, 6)  # they disagree
    assert not spread_evenly([{**even, 0: 3}], {1, 2, 3}, 6)  # 1/2/3: not even
    assert not spread_evenly([{**even, 0: -1}], {1, 2, 3}, 6)  # a partition without leader
    assert not spread_evenly([even], {1, 2}, 6)  # a leader that is not live
    assert not spread_evenly([{0: 1}], {1}, 6)  # partitions missing
    assert spread_evenly([dict.fromkeys(range(6), 1)], {1}, 6)


def test_the_table_gives_means_ratios_loads_and_failovers() -> None:
    def reading(brokers: int, rate: float, load: float, client: str = PROTOCOL_CLIENT) -> Reading:
        return Reading(brokers, Result("share", int(rate * 2), 2.0, 0), load, client)

    readings = [
        reading(1, 10_000, 3.0),
        reading(1, 5_000, 3.0, LIBRDKAFKA_CLIENT),
        reading(2, 14_000, 4.0),
        reading(2, 1_000, 4.0, LIBRDKAFKA_CLIENT),
        reading(3, 15_000, 5.0),
        reading(2, 16_000, 4.5),
        reading(1, 12_000, 3.5),
    ]
    readings[0].broker_cores = {1: 0.9}
    readings[0].client_cores, readings[0].postgres_cores = 0.3, 0.1
    failovers = [
        Failover(9000, 10.5, 2, (1, 4), "900 records delivered"),
        Failover(3000, None, 1, (0, 3), "no record"),
    ]
    lines = format_side_by_side(readings, failovers).splitlines()
    assert "cluster.share_ratio_2_1" in lines[0]
    rows = {line.split()[0]: line for line in lines[3:7] if not line.strip().startswith("cores")}
    assert rows["1"].split()[1:3] == ["11,000", "1.00"]
    assert rows["2"].split()[1:3] == ["15,000", "1.36"]
    assert "14,000 (4.0), 16,000 (4.5)" in rows["2"]
    assert rows["3"].split()[1:3] == ["15,000", "1.36"]
    assert "cores used: b1 0.90, consumers 0.30, postgres 0.10, machine n/a" in lines[4]
    # The librdkafka readings come second, with their own ratio.
    second = lines.index("", 3)
    assert "informational" in lines[second + 1]
    assert lines[second + 4].split()[1:3] == ["5,000", "1.00"]
    assert lines[second + 5].split()[1:3] == ["1,000", "0.20"]
    assert lines[-2].split()[:4] == ["9000", "10.50", "broker", "2"]
    assert "(partitions 1,4)" in lines[-2]
    assert lines[-1].split()[:2] == ["3000", "n/a"]


def describe(epoch: int, *members: tuple[int, tuple[int, ...]]) -> SimpleNamespace:
    return SimpleNamespace(
        assignment_epoch=epoch,
        members=[SimpleNamespace(member_epoch=e, assignment={"t": ps}) for e, ps in members],
    )


def test_the_assignment_settles_when_every_member_holds_its_disjoint_target() -> None:
    settled = describe(3, (3, (0, 1)), (3, (2, 3)), (3, (4, 5)))
    assert assignment_settled(settled, "t", 3, 6)
    assert not assignment_settled(settled, "t", 4, 6)  # a member missing
    # The first member has not heartbeated since the others joined: it holds all.
    assert not assignment_settled(
        describe(3, (1, tuple(range(6))), (3, (2, 3)), (3, (4, 5))), "t", 3, 6
    )
    assert not assignment_settled(describe(3, (3, (0, 1)), (3, (1, 2)), (3, (4, 5))), "t", 3, 6)
    assert not assignment_settled(describe(3, (3, (0, 1)), (3, (2, 3)), (3, (4,))), "t", 3, 6)


def test_cores_are_cpu_seconds_over_wall_seconds() -> None:
    before = CpuSample(10.0, {1: 5.0, 2: 1.0}, 100.0, 400.0, 2.0, 3.0)
    after = CpuSample(12.0, {1: 6.5, 2: 2.0}, 300.0, 800.0, 3.0, 3.5)
    cores = cores_used(before, after)
    assert cores.brokers == {1: 0.75, 2: 0.5}
    assert (cores.clients, cores.postgres) == (0.5, 0.25)
    assert cores.machine is not None and cores.machine > 0


def test_ceilings_from_cpu_per_record() -> None:
    one = Reading(1, Result("share", 200_000, 2.0, 0), 1.0)  # 100,000 rec/s
    one.broker_cores, one.client_cores, one.postgres_cores = {1: 0.9}, 0.3, 0.1
    two = Reading(2, Result("share", 200_000, 1.0, 0), 1.0)  # 200,000 rec/s
    two.broker_cores, two.client_cores, two.postgres_cores = {1: 1.0, 2: 1.0}, 0.6, 0.2
    unmeasured = Reading(3, Result("share", 200_000, 1.0, 0), 1.0)
    lines = ceilings([one, two, unmeasured], cores=2)
    assert len(lines) == 2
    # 9 us of broker per record: one broker's core allows 111,111 rec/s.
    assert "9.00 us brokers, 3.00 us consumers, 1.00 us postgres" in lines[0]
    assert "at most 111,111 rec/s on 2 cores" in lines[0]
    # 10 + 3 + 1 us per record on 2 cores: 142,857 rec/s, whatever the brokers.
    assert "at most 142,857 rec/s on 2 cores" in lines[1]
