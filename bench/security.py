"""PLAINTEXT next to SASL_SSL: the same workload on two listeners of one broker.

`bench_security(ctx)` is registered in `bench.__main__` as "security"; run it alone with
`python -m bench --only security [--records N]`.

It starts its own broker with a PLAINTEXT and a SASL_SSL listener (TLS with a CA and
certificate made for the run, SASL/PLAIN), then on each listener in turn: creates a
4-partition topic, produces the records (acks=all, linger 5 ms, value size the run's
first --sizes), and reads them with one ShareConsumer (implicit acknowledgement, a new
group from the earliest offset; the rate from the first record, as in bench.share);
the listeners alternate, SPOOL_BENCH_SECURITY_RUNS times (3), and the median counts. Four
consumers are left out: their rate measures how long the assignment takes to spread
(a heartbeat interval), the same on both listeners. The clients are confluent-kafka
configured as Kafka users configure them (security.protocol, sasl.mechanism,
sasl.username/password, ssl.ca.location). The results table has a row per listener; a
side-by-side table gives each workload's figures and SASL_SSL / PLAINTEXT, and
`security.share_ratio` (the share rates' ratio) is checked against its target (>= 0.6).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from bench import (
    BenchContext,
    BrokerProcess,
    Result,
    free_port,
    median_reading,
    produce_reading,
    progress,
    share_group_from_earliest,
)
from bench.share import share_consume

DEFAULT_SECURITY_RECORDS = int(os.environ.get("SPOOL_BENCH_SECURITY_RECORDS", "500000"))
PARTITIONS = 4
CASE_TIME_LIMIT_S = 60.0
# Each workload runs this many times per listener, alternating; the median counts.
RUNS = int(os.environ.get("SPOOL_BENCH_SECURITY_RUNS", "3"))
USER, PASSWORD = "bench", "bench-secret"
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    f'username="{USER}" password="{PASSWORD}" user_{USER}="{PASSWORD}";'
)


def _broker(root: Path) -> tuple[BrokerProcess, int, dict[str, object]]:
    """A broker with PLAINTEXT on its port and SASL_SSL on another; the SASL_SSL
    listener's port and client properties."""
    from tests.integration.tls_helpers import make_certs

    certs = make_certs(root / "certs")
    broker = BrokerProcess(root / "data")
    sasl_ssl_port = free_port()
    broker.settings.update(
        {
            "listeners": (
                f"PLAINTEXT://{broker.host}:{broker.port},SASL_SSL://{broker.host}:{sasl_ssl_port}"
            ),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.server),
        }
    )
    client: dict[str, object] = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": USER,
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(certs.ca),
    }
    return broker, sasl_ssl_port, client


def _share(ctx: BenchContext, topic: str, consumers: int, expected: int, run: str) -> Result:
    group = f"spool-bench-security-{run}-x{consumers}"
    share_group_from_earliest(ctx, group)
    result = share_consume(ctx, topic, group, consumers, expected, time_limit_s=CASE_TIME_LIMIT_S)
    result.case = f"share {PARTITIONS}p x{consumers} implicit"
    return result


def format_side_by_side(rows: list[tuple[str, Result, Result]]) -> str:
    header = f"{'workload (records/s)':<34} {'PLAINTEXT':>12} {'SASL_SSL':>12} {'ratio':>7}"
    lines = [header, "-" * len(header)]
    for case, plain, secure in rows:
        ratio = secure.records_per_s / plain.records_per_s if plain.records_per_s else 0.0
        lines.append(
            f"{case:<34} {plain.records_per_s:>12,.0f} {secure.records_per_s:>12,.0f} {ratio:>7.2f}"
        )
    return "\n".join(lines)


def bench_security(ctx: BenchContext, records: int | None = None) -> list[Result]:
    """Produce and share-consume over PLAINTEXT and over SASL_SSL (TLS + SASL/PLAIN) on
    one broker; records `security.share_ratio` (SASL_SSL / PLAINTEXT, one consumer)."""
    records = records or min(ctx.records, DEFAULT_SECURITY_RECORDS)
    size = ctx.sizes[0] if ctx.sizes else 100
    with tempfile.TemporaryDirectory(prefix="spool-bench-security-") as tmp:
        broker, sasl_ssl_port, secure_client = _broker(Path(tmp))
        try:
            broker.start()
            broker.wait_warm()
        except RuntimeError as exc:
            why = f"the broker with a SASL_SSL listener did not start: {exc}"
            print(f"security: not run: {why}\n{broker.log_tail()}", flush=True)
            ctx.not_run["security.share_ratio"] = why
            return []
        listeners = {
            "PLAINTEXT": dataclasses.replace(ctx, broker=broker, endpoint=None, client={}),
            "SASL_SSL": dataclasses.replace(
                ctx,
                broker=broker,
                endpoint=f"{broker.host}:{sasl_ssl_port}",
                client=secure_client,
            ),
        }
        readings: dict[str, dict[str, list[Result]]] = {
            name: {"produce": [], "share x1": []} for name in listeners
        }
        try:
            # Listeners alternate, run after run, so a burst of other load on the machine
            # falls on both; each run has its own topic and share group.
            for run in range(RUNS):
                for name, sub in listeners.items():
                    progress(f"security: producing {records} records over {name} ({run + 1})")
                    topic = f"bench-security-{name}-{run}"
                    readings[name]["produce"].append(
                        produce_reading(
                            sub,
                            topic,
                            records,
                            size,
                            partitions=PARTITIONS,
                            time_limit_s=CASE_TIME_LIMIT_S,
                        )
                    )
            for run in range(RUNS):
                for name, sub in listeners.items():
                    stored = readings[name]["produce"][run].records
                    progress(f"security: a ShareConsumer over {name} ({run + 1})")
                    topic, group = f"bench-security-{name}-{run}", f"{name}-{run}"
                    readings[name]["share x1"].append(_share(sub, topic, 1, stored, group))
        finally:
            code = broker.stop()
            if code != 0:
                print(f"security: broker exited with {code}\n{broker.log_tail()}", flush=True)
    table = {
        name: {case: median_reading(results) for case, results in cases.items()}
        for name, cases in readings.items()
    }
    rows = [
        (table["PLAINTEXT"][key].case, table["PLAINTEXT"][key], table["SASL_SSL"][key])
        for key in table["PLAINTEXT"]
        if key in table["SASL_SSL"]
    ]
    results = [
        dataclasses.replace(result, case=f"{result.case} {name}")
        for name, cases in table.items()
        for result in cases.values()
    ]
    ctx.sections.append(format_side_by_side(rows))
    plain, secure = table["PLAINTEXT"].get("share x1"), table["SASL_SSL"].get("share x1")
    complete = all(
        share.records >= produced.records > 0
        for cases in readings.values()
        for share, produced in zip(cases["share x1"], cases["produce"], strict=False)
    )
    if plain and secure and plain.records_per_s and complete:
        ctx.figures["security.share_ratio"] = secure.records_per_s / plain.records_per_s
    else:
        ctx.not_run["security.share_ratio"] = "a share case did not read all its records"
    return results
