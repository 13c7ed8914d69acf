"""`python -m bench`: its flags, and the target table from given figures (no brokers)."""

from __future__ import annotations

import math

import pytest

from bench import (
    TARGETS,
    Comparison,
    Result,
    evaluate_targets,
    format_comparisons,
    format_targets,
)
from bench.__main__ import BENCHMARKS, LATENCY_FIGURES, parse_args
from bench.storage import format_side_by_side


def test_only_is_repeatable_and_limited_to_registered_benchmarks() -> None:
    args = parse_args(["--only", "reference", "--only", "memory"])
    assert args.only == ["reference", "memory"]
    assert {"reference", "memory", "restart", "backlog", "latency"} <= set(BENCHMARKS)
    with pytest.raises(SystemExit):
        parse_args(["--only", "no_such_benchmark"])


def test_defaults_run_everything_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOOL_BENCH_LONG", raising=False)
    monkeypatch.delenv("SPOOL_BENCH_RECORDS", raising=False)
    args = parse_args([])
    assert args.only is None
    assert args.long is False
    assert args.records == 500_000


def test_long_variants_by_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOOL_BENCH_LONG", raising=False)
    assert parse_args(["--long"]).long is True
    monkeypatch.setenv("SPOOL_BENCH_LONG", "1")
    assert parse_args([]).long is True
    monkeypatch.setenv("SPOOL_BENCH_LONG", "0")
    assert parse_args([]).long is False


def test_other_flags_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOOL_BENCH_RECORDS", "1234")
    args = parse_args(["--sizes", "10,20", "--partitions", "5", "--time-limit", "7.5"])
    assert (args.records, args.sizes, args.partitions, args.time_limit) == (1234, "10,20", 5, 7.5)
    args = parse_args(["--set", "a.b=1", "--set", "c=x=y"])
    assert args.set == ["a.b=1", "c=x=y"]


def _status(figures: dict[str, float], figure: str, not_run: dict[str, str] | None = None) -> str:
    rows = evaluate_targets(figures, not_run)
    return next(status for target, _, status in rows if target.figure == figure)


@pytest.mark.parametrize(
    ("figure", "met", "not_met"),
    [
        ("latency.broker_p50_ms", 0.5, 0.51),
        ("latency.broker_p99_ms", 2.0, 2.01),
        ("latency.consumer_p99_ms", 4.9, 5.1),
        ("latency.consumer_max_ms", 20.0, 20.5),
        ("restart.share_fetch_s", 1.99, 2.01),
        ("memory.fragmented_rss_mb", 300.0, 300.1),
        ("memory.idle_growth_mb", 12.0, 50.5),
        ("storage.pg_p99_ms", 10.0, 10.1),
    ],
)
def test_upper_bound_targets_are_met_at_or_below_the_limit(
    figure: str, met: float, not_met: float
) -> None:
    assert _status({figure: met}, figure) == "met"
    assert _status({figure: not_met}, figure) == "not met"


def test_a_broker_that_stopped_answering_fails_the_idle_connection_target() -> None:
    assert _status({"memory.idle_growth_mb": math.inf}, "memory.idle_growth_mb") == "not met"


def test_backlog_flatness_is_a_lower_bound() -> None:
    assert _status({"backlog.flatness": 0.95}, "backlog.flatness") == "met"
    assert _status({"backlog.flatness": 0.8}, "backlog.flatness") == "met"
    assert _status({"backlog.flatness": 0.5}, "backlog.flatness") == "not met"


def test_share_rate_on_postgresql_is_a_lower_bound_of_50000_records_per_second() -> None:
    assert _status({"storage.pg_share_rate": 50_000}, "storage.pg_share_rate") == "met"
    assert _status({"storage.pg_share_rate": 49_000}, "storage.pg_share_rate") == "not met"


def test_storage_side_by_side_puts_each_workload_on_both_engines() -> None:
    rates = {
        "file": {"produce": Result("produce 100 B acks=all", 200, 2.0, 0)},
        "postgresql": {"produce": Result("produce 100 B acks=all", 100, 2.0, 0)},
    }
    table = format_side_by_side(rates, {"file": (2.0, 6.0), "postgresql": (8.0, 24.0)})
    produce, p50, p99 = table.splitlines()[2:]
    assert produce.split()[-5:] == ["100", "rec/s", "50", "rec/s", "0.50"]
    assert p50.split()[-5:] == ["2.00", "ms", "8.00", "ms", "4.00"]
    assert p99.split()[-5:] == ["6.00", "ms", "24.00", "ms", "4.00"]


def test_missing_or_nan_figures_are_not_run_with_the_reason() -> None:
    why = {"restart.share_fetch_s": "the broker did not start"}
    assert _status({}, "restart.share_fetch_s", why) == "not run: the broker did not start"
    assert _status({"memory.fragmented_rss_mb": math.nan}, "memory.fragmented_rss_mb").startswith(
        "not run"
    )


def test_every_target_gets_one_row_and_the_table_names_each() -> None:
    figures = {t.figure: t.limit for t in TARGETS}
    rows = evaluate_targets(figures)
    assert [t for t, _, _ in rows] == list(TARGETS)
    assert all(status == "met" for _, _, status in rows)
    table = format_targets(rows)
    for target in TARGETS:
        assert target.name in table
    assert table.count(" met") == len(TARGETS)


def test_latency_targets_read_the_figures_the_latency_hook_names() -> None:
    assert set(LATENCY_FIGURES) <= {t.figure for t in TARGETS}


def test_comparison_prints_both_figures_and_the_ratio_or_n_a_with_the_reason() -> None:
    rows = [
        Comparison("share consume 1p x1", "records/s", 5000.0, 10000.0),
        Comparison("explicit ack", "records/s", 800.0, None, "mock: time limit hit"),
    ]
    assert rows[0].ratio == 0.5
    assert rows[1].ratio is None
    table = format_comparisons(rows).splitlines()
    assert "5,000" in table[2] and "10,000" in table[2] and "0.50" in table[2]
    assert "n/a" in table[3] and "mock: time limit hit" in table[3]


def test_security_bench_is_registered_and_its_ratio_is_a_lower_bound() -> None:
    assert "security" in BENCHMARKS
    assert _status({"security.share_ratio": 0.6}, "security.share_ratio") == "met"
    assert _status({"security.share_ratio": 0.59}, "security.share_ratio") == "not met"


def test_security_side_by_side_prints_both_listeners_and_the_ratio() -> None:
    from bench import Result
    from bench.security import format_side_by_side

    plain = Result("share 4p x1 implicit", 1000, 1.0, 100_000)
    secure = Result("share 4p x1 implicit", 1000, 2.0, 100_000)
    lines = format_side_by_side([("share 4p x1 implicit", plain, secure)]).splitlines()
    assert "PLAINTEXT" in lines[0] and "SASL_SSL" in lines[0] and "ratio" in lines[0]
    assert "1,000" in lines[2] and "500" in lines[2] and lines[2].endswith("0.50")
