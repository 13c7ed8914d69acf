"""bench.dead_letters' registration, target and side-by-side table (no brokers)."""

from __future__ import annotations

from bench import TARGETS, Result, evaluate_targets
from bench.__main__ import BENCHMARKS
from bench.dead_letters import FIGURE, bench_dead_letters, complete, format_side_by_side, rejected


def _status(value: float) -> str:
    rows = evaluate_targets({FIGURE: value})
    return next(status for target, _, status in rows if target.figure == FIGURE)


def test_registered_and_its_ratio_is_a_lower_bound_of_0_8() -> None:
    assert BENCHMARKS["dead_letters"] is bench_dead_letters
    assert FIGURE in {t.figure for t in TARGETS}
    assert _status(0.8) == "met"
    assert _status(1.1) == "met"
    assert _status(0.79) == "not met"


def test_one_record_in_ten_is_rejected() -> None:
    assert sum(rejected(o) for o in range(1000)) == 100


def test_a_run_counts_only_with_every_record_read_and_every_copy_written() -> None:
    assert complete(Result("x", 100, 1.0, 0, "10 rejected; 10 copies"), 100)
    assert not complete(Result("x", 99, 1.0, 0, "time limit hit: 99 of 100"), 100)
    assert not complete(Result("x", 100, 1.0, 0, "copies missing: 9 of 10"), 100)
    assert not complete(Result("x", 0, 1.0, 0), 0)


def test_side_by_side_prints_both_rates_and_the_ratio_to_archived() -> None:
    table = format_side_by_side(
        {
            "dead-letter topic": Result("dlq", 900, 1.0, 0),
            "archived": Result("archive", 1000, 1.0, 0),
        }
    ).splitlines()
    assert table[2].split()[-2:] == ["900", "0.90"]
    assert table[3].split()[-2:] == ["1,000", "1.00"]
