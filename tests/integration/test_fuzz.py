"""A short, seeded run of the fuzzer (`make fuzz` runs a long one): malformed and odd
requests of every advertised API over many connections must neither crash the broker
nor make it log a traceback."""

from __future__ import annotations

from tests.fuzz.driver import Options, run

SEED = 20261123
FRAMES = 20_000


def test_fuzzed_frames_neither_crash_the_broker_nor_log_tracebacks() -> None:
    lines: list[str] = []
    report = run(Options(seed=SEED, frames=FRAMES, workers=8), out=lines.append)
    summary = report.summary()
    assert report.frames == FRAMES, summary
    assert report.count("crash") == 0, summary
    assert report.count("traceback") == 0, summary
    assert report.count("health") == 0, summary
    # The run must have exercised both outcomes: answers and closed connections.
    assert report.outcomes["answered"] > FRAMES // 4, summary
    assert report.outcomes["closed"] > FRAMES // 10, summary
