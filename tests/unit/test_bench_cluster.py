"""bench.cluster's plumbing without brokers: when leaders count as settled, and the
side-by-side table from given readings (no timing asserted)."""

from __future__ import annotations

from bench import Result
from bench.cluster import Failover, Reading, format_side_by_side, spread_evenly


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
    def reading(brokers: int, rate: float, load: float) -> Reading:
        return Reading(brokers, Result("share", int(rate * 2), 2.0, 0), load)

    readings = [
        reading(1, 10_000, 3.0),
        reading(2, 14_000, 4.0),
        reading(3, 15_000, 5.0),
        reading(2, 16_000, 4.5),
        reading(1, 12_000, 3.5),
    ]
    failovers = [
        Failover(9000, 10.5, 2, (1, 4), "900 records delivered"),
        Failover(3000, None, 1, (0, 3), "no record"),
    ]
    lines = format_side_by_side(readings, failovers).splitlines()
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert rows["1"].split()[1:3] == ["11,000", "1.00"]
    assert rows["2"].split()[1:3] == ["15,000", "1.36"]
    assert "14,000 (4.0), 16,000 (4.5)" in rows["2"]
    assert rows["3"].split()[1:3] == ["15,000", "1.36"]
    assert lines[-2].split()[:4] == ["9000", "10.50", "broker", "2"]
    assert "(partitions 1,4)" in lines[-2]
    assert lines[-1].split()[:2] == ["3000", "n/a"]
