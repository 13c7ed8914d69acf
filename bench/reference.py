"""spool next to a reference: the same share workloads on librdkafka's mock cluster.

Registered in `bench.__main__` as "reference" (`python -m bench --only reference`).

The reference is the mock Kafka cluster built into librdkafka (the library under
confluent-kafka). Its share-group support (ShareGroupHeartbeat, ShareFetch,
ShareAcknowledge, KIP-932) ships in the installed wheel, but two of its settings are
reachable only through librdkafka's C mock API, not through client configs: the share
groups' auto offset reset (the mock starts them at "latest", and answers no
IncrementalAlterConfigs for `share.auto.offset.reset`), and topic creation (the mock
answers no CreateTopics). So the cluster is made with `rd_kafka_mock_cluster_new` through
ctypes on the librdkafka that confluent-kafka loaded, set to "earliest", and its
bootstrap address (`rd_kafka_mock_cluster_bootstraps`) is given to ordinary clients.

Workloads, run on spool and then on the mock with the same record counts and sizes:
share consume 1 partition x 1 ShareConsumer and 4 partitions x 2 ShareConsumers
(implicit acknowledgement), and explicit per-record ACCEPT with commit_sync per poll.
The mock keeps at most 5 MB per partition (older records are trimmed, as retention
would), so each partition holds RECORDS_PER_PARTITION records of 100 B, below that.

The mock runs inside the bench process (no sockets between processes it does not also
have, no disk, no fsync); spool is a separate Python process writing its logs. The
ratio is spool / mock records/s: above 1 means spool is faster. Where the mock cannot
run a workload the row says "n/a" and why.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import os
from pathlib import Path

from bench import BenchContext, Comparison, Result, fill_topic, progress, share_group_from_earliest
from bench.share import share_consume

RECORDS_PER_PARTITION = int(os.environ.get("SPOOL_BENCH_REFERENCE_RECORDS", "30000"))
RECORD_SIZE = 100
CASE_TIME_LIMIT_S = 60.0
# (label, partitions, consumers, acknowledgement mode)
WORKLOADS: tuple[tuple[str, int, int, str], ...] = (
    ("share consume 1p x1 (implicit)", 1, 1, "implicit"),
    ("share consume 4p x2 (implicit)", 4, 2, "implicit"),
    ("explicit ack per record 1p x1", 1, 1, "explicit"),
)
_EARLIEST = 1  # rd_kafka_mock_sharegroup_set_auto_offset_reset: 0 latest, 1 earliest


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka confluent-kafka loaded (the wheel bundles it next to the package;
    a build against a system librdkafka finds it by name)."""
    import confluent_kafka

    package = Path(confluent_kafka.__file__).resolve().parent
    candidates = sorted(glob.glob(str(package.parent / "confluent_kafka.libs" / "librdkafka*")))
    candidates += sorted(glob.glob(str(package.parent / "confluent_kafka" / ".dylibs" / "*")))
    candidates.append("librdkafka.so.1")
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(str(exc))
    raise RuntimeError(f"librdkafka not found for ctypes: {'; '.join(errors)}")


class MockCluster:
    """librdkafka's mock cluster with share groups starting at the earliest offset."""

    def __init__(self, brokers: int = 1) -> None:
        lib = _librdkafka()
        required = (
            "rd_kafka_mock_cluster_new",
            "rd_kafka_mock_cluster_bootstraps",
            "rd_kafka_mock_sharegroup_set_auto_offset_reset",
            "rd_kafka_mock_topic_create",
        )
        missing = [name for name in required if not hasattr(lib, name)]
        if missing:
            raise RuntimeError(f"this librdkafka has no {', '.join(missing)}")
        vp = ctypes.c_void_p
        lib.rd_kafka_conf_new.restype = vp
        lib.rd_kafka_new.restype = vp
        lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, ctypes.c_char_p, ctypes.c_size_t]
        lib.rd_kafka_destroy.argtypes = [vp]
        lib.rd_kafka_mock_cluster_new.restype = vp
        lib.rd_kafka_mock_cluster_new.argtypes = [vp, ctypes.c_int]
        lib.rd_kafka_mock_cluster_destroy.argtypes = [vp]
        lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
        lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
        lib.rd_kafka_mock_sharegroup_set_auto_offset_reset.argtypes = [vp, ctypes.c_int]
        lib.rd_kafka_mock_topic_create.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        self._lib = lib
        errstr = ctypes.create_string_buffer(512)
        # A producer handle with no bootstrap servers only hosts the cluster (RD_KAFKA_PRODUCER).
        conf = lib.rd_kafka_conf_new()
        self._rk = lib.rd_kafka_new(0, conf, errstr, len(errstr))
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new failed: {errstr.value.decode(errors='replace')}")
        self._mc = lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._mc:
            lib.rd_kafka_destroy(self._rk)
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap = lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode()
        lib.rd_kafka_mock_sharegroup_set_auto_offset_reset(self._mc, _EARLIEST)

    def create_topic(self, topic: str, partitions: int) -> None:
        err = self._lib.rd_kafka_mock_topic_create(self._mc, topic.encode(), partitions, 1)
        if err:
            raise RuntimeError(f"mock topic {topic!r}: error code {err}")

    def close(self) -> None:
        self._lib.rd_kafka_mock_cluster_destroy(self._mc)
        self._lib.rd_kafka_destroy(self._rk)


def _run(
    ctx: BenchContext,
    side: str,
    label: str,
    partitions: int,
    consumers: int,
    mode: str,
    mock: MockCluster | None,
) -> Result:
    slug = f"{partitions}p-{consumers}c-{mode}"
    topic, group = f"bench-ref-{slug}", f"bench-ref-{slug}"
    records = RECORDS_PER_PARTITION * partitions
    if mock is not None:
        mock.create_topic(topic, partitions)
    stored = fill_topic(
        ctx, topic, records, RECORD_SIZE, partitions=partitions, create=mock is None
    )
    if mock is None:
        share_group_from_earliest(ctx, group)
    result = share_consume(
        ctx, topic, group, consumers, stored, mode=mode, time_limit_s=CASE_TIME_LIMIT_S
    )
    result.case = f"{side}: {label}"
    if stored < records:
        result.notes = "; ".join(filter(None, [f"only {stored} of {records} stored", result.notes]))
    return result


def _figure(result: Result) -> tuple[float | None, str]:
    """records/s, or None with the reason when the run did not read every record."""
    if "time limit hit" in result.notes or "consumer failed" in result.notes:
        return None, result.notes
    return result.records_per_s, ""


def bench_reference(ctx: BenchContext) -> list[Result]:
    results: list[Result] = []
    spool_runs: list[Result] = []
    for label, partitions, consumers, mode in WORKLOADS:
        progress(f"reference: spool, {label}")
        spool_runs.append(_run(ctx, "spool", label, partitions, consumers, mode, None))
    results += spool_runs

    mock_runs: list[Result | None] = [None] * len(WORKLOADS)
    why_not = ""
    try:
        mock = MockCluster()
    except (RuntimeError, OSError, AttributeError) as exc:
        why_not = f"mock cluster unavailable: {exc}"
        mock = None
    if mock is not None:
        mock_ctx = dataclasses.replace(ctx, endpoint=mock.bootstrap, produced={})
        try:
            for i, (label, partitions, consumers, mode) in enumerate(WORKLOADS):
                progress(f"reference: librdkafka mock, {label}")
                try:
                    mock_runs[i] = _run(mock_ctx, "mock", label, partitions, consumers, mode, mock)
                except Exception as exc:  # the mock's limits: say so, no figure
                    progress(f"reference: mock could not run {label}: {exc!r}")
        finally:
            mock.close()
    results += [r for r in mock_runs if r is not None]

    for (label, *_), spool_run, mock_run in zip(WORKLOADS, spool_runs, mock_runs, strict=True):
        spool_rate, spool_why = _figure(spool_run)
        if mock_run is None:
            ref_rate, ref_why = None, why_not or "the mock failed this workload (see stderr)"
        else:
            ref_rate, ref_why = _figure(mock_run)
        reason = "; ".join(
            filter(None, [spool_why and f"spool: {spool_why}", ref_why and f"mock: {ref_why}"])
        )
        ctx.comparisons.append(
            Comparison(label, "records/s", spool_rate, ref_rate, reason or _sizes_note())
        )
    return results


def _sizes_note() -> str:
    return f"{RECORDS_PER_PARTITION} records of {RECORD_SIZE} B per partition"
