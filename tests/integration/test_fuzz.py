"""A short, seeded run of the fuzzer (`make fuzz` runs a long one): malformed and odd
requests of every advertised API over many connections must neither crash the broker
nor make it log a traceback; and the SASL handshake fuzzer's scenarios (garbage, SASL
frames out of order, malformed PLAIN and SCRAM tokens, requests before authentication,
TLS ClientHellos) must neither end the broker nor get a request served before
authentication, and leave a good client served."""

from __future__ import annotations

from tests.fuzz.driver import Options, run
from tests.fuzz.handshake import run_handshake

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


HANDSHAKE_SCENARIOS = 2_000


def test_handshake_fuzz_never_serves_a_request_before_authentication() -> None:
    lines: list[str] = []
    report = run_handshake(SEED, HANDSHAKE_SCENARIOS, out=lines.append)
    summary = report.summary()
    assert report.scenarios == HANDSHAKE_SCENARIOS, summary
    assert report.ok, summary
    # Every kind ran, and most scenarios smuggled a request in before authentication.
    assert len(report.kinds) == 9, summary
    assert report.smuggled > HANDSHAKE_SCENARIOS // 2, summary
    assert report.outcomes["closed"] > HANDSHAKE_SCENARIOS * 9 // 10, summary
