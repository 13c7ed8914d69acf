"""bench.consumer_groups' pure helpers and the figure table without targets (no brokers)."""

from __future__ import annotations

from bench import FIGURES, format_figures
from bench.__main__ import BENCHMARKS
from bench.consumer_groups import FIGURES as GROUP_FIGURES
from bench.consumer_groups import bench_consumer_groups, split_settled, stable_assignment


def test_registered_and_every_figure_listed_in_the_table() -> None:
    assert BENCHMARKS["consumer_groups"] is bench_consumer_groups
    assert set(GROUP_FIGURES) <= {f.figure for f in FIGURES}


def test_stable_assignment_needs_every_member_disjoint_and_covering() -> None:
    ten = {i: frozenset({2 * i, 2 * i + 1}) for i in range(10)}
    assert stable_assignment(ten, 10, 20)
    # One member still empty (the newcomer before the revocations).
    waiting = {**{i: frozenset({2 * i, 2 * i + 1}) for i in range(9)}, 9: frozenset()}
    waiting[8] = frozenset({16, 17, 18, 19})
    assert not stable_assignment(waiting, 10, 20)
    # Only nine reported so far.
    assert not stable_assignment({i: ten[i] for i in range(9)}, 10, 20)
    # Overlap: a partition held twice while another is held by nobody.
    overlap = dict(ten)
    overlap[9] = frozenset({17, 18})
    assert not stable_assignment(overlap, 10, 20)
    # Overlap with the union still complete (a revocation not yet applied).
    doubled = dict(ten)
    doubled[9] = frozenset({17, 18, 19})
    assert not stable_assignment(doubled, 10, 20)
    # A partition of the topic held by no one.
    missing = dict(ten)
    missing[9] = frozenset({18})
    assert not stable_assignment(missing, 10, 20)


def test_split_settled() -> None:
    assert split_settled([3.0, 3.0], 6)
    assert split_settled([1.0, 5.0], 6)
    assert not split_settled([6.0, 0.0], 6)  # the first member still holds everything
    assert not split_settled([6.0, 3.0], 6)  # the other part not revoked yet
    assert not split_settled([2.0, 3.0], 6)


def test_figure_table_shows_values_and_why_missing() -> None:
    table = format_figures(
        {"groups.consume_rate_consumer": 215_961.3, "groups.rebalance_s_classic": 3.014},
        {"groups.share_rate": "read 10 of 20 records"},
    )
    rows = {line.split("  ")[0].strip(): line for line in table.splitlines()[2:]}
    assert "215,961 rec/s" in rows["consumer group (KIP-848), async commits"]
    assert "3.01 s" in rows["rebalance, 10th of 10 members (classic)"]
    assert "not run: read 10 of 20 records" in rows["share group, per-record acks"]
    assert "not run: no figure" in rows["rebalance, 10th of 10 members (KIP-848)"]
