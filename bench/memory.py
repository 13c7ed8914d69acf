"""Broker memory at scale: records in flight, fragmented acknowledgements, idle connections.

Registered in `bench.__main__` as "memory" (`python -m bench --only memory`). It starts
its own broker (a fresh process: its RSS is this workload's alone) with record locks of
10 minutes, so nothing is released by lock expiry while it is measured.

1. 100 share groups x 10 partitions x 2,000 records in flight: a 10-partition topic of
   2,000 records per partition; one raw member per group (spool's own client, one
   connection for all) joins with ShareGroupHeartbeat and ShareFetches until each
   partition has handed out its 2,000 records (group.share.partition.max.record.locks,
   Kafka's default 2,000). Broker RSS before and after.
2. Fragmenting acknowledgements at that scale: every member acknowledges each
   partition's 2,000 records one type per offset, ACCEPT, RELEASE, ACCEPT, ... (KIP-932
   per-offset AcknowledgeTypes), then ShareFetches once more, re-acquiring the released
   half: every partition's state is 2,000 single-offset ranges. RSS after; target
   <= 300 MB (`memory.fragmented_rss_mb`). Groups are fragmented one after another;
   without --long only for FRAGMENT_BUDGET_S (env SPOOL_BENCH_MEMORY_BUDGET_S, 180 s).
   With fewer than all groups done, RSS is a lower bound: above the target it counts
   as not met; below it the target is "not run" and says how far it got.
3. 1,000 idle connections: each sends one ApiVersions and then stays silent; RSS with
   them open, minus RSS before, is `memory.idle_growth_mb` (target <= 50 MB); a new
   connection must still be answered, else the figure is not recorded.

RSS is the broker process's VmRSS from /proc (Linux), in MB of 10^6 bytes.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import (
    TARGETS,
    BenchContext,
    BrokerProcess,
    Result,
    fill_topic,
    progress,
    share_group_from_earliest,
    topic_id,
)

GROUPS = 100
PARTITIONS = 10
RECORDS_PER_PARTITION = 2_000
RECORD_SIZE = 100
IDLE_CONNECTIONS = 1_000
LOCK_MS = 600_000
# Fragmenting every group takes minutes: without --long, stop after this many seconds.
FRAGMENT_BUDGET_S = float(os.environ.get("SPOOL_BENCH_MEMORY_BUDGET_S", "180"))
FRAGMENTED_TARGET_MB = next(t.limit for t in TARGETS if t.figure == "memory.fragmented_rss_mb")
ACCEPT, RELEASE = 1, 2
HEARTBEAT, SHARE_FETCH, SHARE_ACK, API_VERSIONS = 76, 78, 79, 18
BROKER_SETTINGS = {
    "group.share.max.record.lock.duration.ms": str(LOCK_MS),
    "group.share.record.lock.duration.ms": str(LOCK_MS),
}


def rss_mb(pid: int) -> float:
    """Resident set size of `pid` in MB (VmRSS from /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for pid {pid}")


# --- a raw share-group member through spool's own client ------------------------------


class RawShareMember:
    """One member of one share group speaking ShareGroupHeartbeat v1, ShareFetch v1 and
    ShareAcknowledge v1 over a shared `protocol.client.KafkaClient`."""

    def __init__(self, client: Any, group: str) -> None:
        self.client = client
        self.group = group
        self.member = str(uuid.uuid4())  # KIP-932 v1: the client picks its member id
        self.member_epoch = 0
        self.session_epoch = 0

    async def join(self, topics: list[str], timeout_s: float = 30.0) -> int:
        """Heartbeat until the assignment names partitions; returns how many."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            response = await self.client.request(
                HEARTBEAT,
                1,
                {
                    "group_id": self.group,
                    "member_id": self.member,
                    "member_epoch": self.member_epoch,
                    "rack_id": None,
                    "subscribed_topic_names": topics,
                },
            )
            if response.error_code:
                raise RuntimeError(f"ShareGroupHeartbeat error {response.error_code}")
            self.member_epoch = response.member_epoch
            assignment = response.assignment
            if assignment is not None:
                count = sum(len(t.partitions) for t in assignment.topic_partitions)
                if count:
                    return count
            await asyncio.sleep(0.05)
        raise RuntimeError(f"group {self.group}: no assignment within {timeout_s}s")

    def _topics(self, acks: dict[tuple[uuid.UUID, int], list[dict[str, Any]]]) -> list[Any]:
        by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
        for (tid, p), batches in acks.items():
            by_topic.setdefault(tid, []).append(
                {"partition_index": p, "acknowledgement_batches": batches}
            )
        return [{"topic_id": t, "partitions": ps} for t, ps in by_topic.items()]

    async def fetch(
        self,
        acks: dict[tuple[uuid.UUID, int], list[dict[str, Any]]],
        max_records: int,
        max_wait_ms: int = 0,
    ) -> dict[tuple[uuid.UUID, int], list[tuple[int, int]]]:
        """ShareFetch (with `acks` riding on it); (topic id, partition) -> the acquired
        (first, last) offset ranges."""
        response = await self.client.request(
            SHARE_FETCH,
            1,
            {
                "group_id": self.group,
                "member_id": self.member,
                "share_session_epoch": self.session_epoch,
                "max_wait": max_wait_ms,
                "min_bytes": 1,
                "max_bytes": 64 << 20,
                "max_records": max_records,
                "batch_size": max_records,
                "forgotten_topics_data": [],
                "topics": self._topics(acks),
            },
        )
        self.session_epoch += 1
        if response.error_code:
            raise RuntimeError(f"ShareFetch error {response.error_code}")
        acquired: dict[tuple[uuid.UUID, int], list[tuple[int, int]]] = {}
        for topic in response.responses:
            for part in topic.partitions:
                if part.error_code:
                    raise RuntimeError(f"ShareFetch partition error {part.error_code}")
                acquired[(topic.topic_id, part.partition_index)] = [
                    (r.first_offset, r.last_offset) for r in part.acquired_records
                ]
        return acquired

    async def acknowledge(
        self, acks: dict[tuple[uuid.UUID, int], list[dict[str, Any]]], timeout_s: float = 30.0
    ) -> None:
        response = await self.client.request(
            SHARE_ACK,
            1,
            {
                "group_id": self.group,
                "member_id": self.member,
                "share_session_epoch": self.session_epoch,
                "topics": self._topics(acks),
            },
            timeout_s,
        )
        self.session_epoch += 1
        errors = [
            p.error_code for t in response.responses for p in t.partitions if p.error_code
        ] + ([response.error_code] if response.error_code else [])
        if errors:
            raise RuntimeError(f"ShareAcknowledge errors {errors}")


async def api_versions(client: Any) -> None:
    response = await client.request(
        API_VERSIONS, 3, {"client_software_name": "spool-bench", "client_software_version": "1"}
    )
    if response.error_code:
        raise RuntimeError(f"ApiVersions error {response.error_code}")


def _count(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(last - first + 1 for first, last in ranges)


# --- the workload ------------------------------------------------------------------------


async def _acquire_all(members: list[RawShareMember], tid: uuid.UUID) -> int:
    """Every member ShareFetches until its partitions stop handing out records; returns
    the records in flight over all groups."""
    partitions = {(tid, p): [] for p in range(PARTITIONS)}

    async def one(member: RawShareMember) -> int:
        held = 0
        for _ in range(50):  # bounded: 2,000 per partition arrive in a few fetches
            got = await member.fetch(partitions, PARTITIONS * RECORDS_PER_PARTITION)
            new = sum(_count(r) for r in got.values())
            held += new
            if held >= PARTITIONS * RECORDS_PER_PARTITION or (new == 0 and held):
                break
        return held

    return sum(await asyncio.gather(*(one(m) for m in members)))


def _fragmenting_acks(tid: uuid.UUID) -> dict[tuple[uuid.UUID, int], list[dict[str, Any]]]:
    types = [ACCEPT if i % 2 == 0 else RELEASE for i in range(RECORDS_PER_PARTITION)]
    batch = {
        "first_offset": 0,
        "last_offset": RECORDS_PER_PARTITION - 1,
        "acknowledge_types": types,
    }
    return {(tid, p): [batch] for p in range(PARTITIONS)}


async def _in_flight_and_fragmented(
    broker: BrokerProcess, topic: str, groups: list[str], budget_s: float | None
) -> tuple[list[float], int, int, int, float]:
    """RSS at (start, all acquired, fragmented); records in flight; groups fragmented
    within `budget_s` (None: all); released records re-acquired; mean seconds per group
    (its acknowledgement of 10 x 2,000 per-offset types plus the re-acquiring fetches)."""
    from protocol.client import KafkaClient

    client = await KafkaClient.connect(broker.host, broker.port, "spool-bench-memory")
    try:
        tid = await topic_id(client, topic)
        rss = [rss_mb(_pid(broker))]
        members = [RawShareMember(client, g) for g in groups]
        progress(f"memory: {len(members)} members joining")
        await asyncio.gather(*(m.join([topic]) for m in members))
        progress("memory: acquiring every partition's records in every group")
        in_flight = await _acquire_all(members, tid)
        rss.append(rss_mb(_pid(broker)))
        progress(f"memory: {in_flight} records in flight, RSS {rss[-1]:.0f} MB; fragmenting")
        acks = _fragmenting_acks(tid)
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        fragmented = reacquired = 0
        per_group_s: list[float] = []
        for member in members:
            if deadline is not None and time.perf_counter() > deadline:
                break
            started = time.perf_counter()
            await member.acknowledge(acks, timeout_s=300.0)
            reacquired += await _acquire_all([member], tid)
            per_group_s.append(time.perf_counter() - started)
            fragmented += 1
            if fragmented % 10 == 0:
                now = rss_mb(_pid(broker))
                recent = sum(per_group_s[-10:]) / 10
                progress(
                    f"memory: {fragmented} groups fragmented, RSS {now:.0f} MB, "
                    f"{recent:.2f} s per group (ack + re-acquire, last 10)"
                )
        rss.append(rss_mb(_pid(broker)))
        mean_s = sum(per_group_s) / max(len(per_group_s), 1)
        return rss, in_flight, fragmented, reacquired, mean_s
    finally:
        await client.close()


async def _idle_connections(broker: BrokerProcess, count: int) -> tuple[float, float, bool]:
    """(RSS before, RSS with `count` idle connections open, a new one still answered)."""
    from protocol.client import KafkaClient

    before = rss_mb(_pid(broker))
    clients: list[Any] = []
    try:
        for i in range(count):
            client = await KafkaClient.connect(broker.host, broker.port, f"idle-{i}")
            clients.append(client)
            await api_versions(client)
        await asyncio.sleep(1.0)  # let the broker settle its per-connection buffers
        during = rss_mb(_pid(broker))
        probe = await KafkaClient.connect(broker.host, broker.port, "idle-probe")
        try:
            await api_versions(probe)
            served = True
        except Exception:
            served = False
        finally:
            await probe.close()
        return before, during, served
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def _pid(broker: BrokerProcess) -> int:
    assert broker.process is not None
    return broker.process.pid


def bench_memory(ctx: BenchContext) -> list[Result]:
    import dataclasses

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="spool-bench-memory-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", {**ctx.broker.settings, **BROKER_SETTINGS})
        broker.start()
        broker.wait_warm()
        own = dataclasses.replace(ctx, broker=broker, endpoint=None, produced={})
        try:
            progress(f"memory: opening {IDLE_CONNECTIONS} idle connections")
            before, during, served = asyncio.run(_idle_connections(broker, IDLE_CONNECTIONS))
            growth = during - before
            results.append(
                Result(
                    f"RSS growth, {IDLE_CONNECTIONS} idle connections",
                    IDLE_CONNECTIONS,
                    0.0,
                    0,
                    f"RSS {before:.0f} -> {during:.0f} MB ({growth * 1e3 / IDLE_CONNECTIONS:.1f} "
                    f"kB each); a new connection {'answered' if served else 'NOT answered'}",
                )
            )
            # A broker that stops answering has not kept its connections bounded.
            ctx.figures["memory.idle_growth_mb"] = growth if served else float("inf")
            topic = "bench-memory"
            progress(f"memory: {PARTITIONS} partitions x {RECORDS_PER_PARTITION} records")
            stored = fill_topic(
                own, topic, PARTITIONS * RECORDS_PER_PARTITION, RECORD_SIZE, partitions=PARTITIONS
            )
            groups = [f"bench-memory-{i}" for i in range(GROUPS)]
            share_group_from_earliest(own, *groups)
            budget = None if ctx.long else FRAGMENT_BUDGET_S
            rss, in_flight, fragmented, reacquired, mean_s = asyncio.run(
                _in_flight_and_fragmented(broker, topic, groups, budget)
            )
            expected = GROUPS * PARTITIONS * RECORDS_PER_PARTITION
            short = f"; only {in_flight} of {expected} acquired" if in_flight < expected else ""
            results.append(
                Result(
                    f"RSS {GROUPS} groups x {PARTITIONS}p x {RECORDS_PER_PARTITION} in flight",
                    in_flight,
                    0.0,  # a memory figure, not a rate
                    0,
                    f"RSS {rss[0]:.0f} MB -> {rss[1]:.0f} MB ({stored} records stored){short}",
                )
            )
            results.append(
                Result(
                    "RSS after accept/release/accept... acks",
                    reacquired,
                    0.0,
                    0,
                    f"RSS {rss[2]:.0f} MB with {fragmented} of {GROUPS} groups fragmented "
                    f"(budget {'none' if budget is None else f'{budget:.0f}s'}); "
                    f"released records re-acquired: {reacquired}; "
                    f"{(rss[2] - rss[1]) / max(fragmented, 1):.1f} MB more per fragmented group; "
                    f"{mean_s:.2f} s per group (ack + re-acquire)",
                )
            )
            target = FRAGMENTED_TARGET_MB
            if in_flight < expected:
                ctx.not_run["memory.fragmented_rss_mb"] = f"only {in_flight} of {expected} acquired"
            elif fragmented == GROUPS or rss[2] > target:
                # With fewer groups fragmented, RSS is a lower bound of the full figure:
                # already above the target, the target is not met.
                ctx.figures["memory.in_flight_rss_mb"] = rss[1]
                ctx.figures["memory.fragmented_rss_mb"] = rss[2]
            else:
                ctx.not_run["memory.fragmented_rss_mb"] = (
                    f"{fragmented} of {GROUPS} groups fragmented within {budget}s "
                    f"(RSS {rss[2]:.0f} MB so far); --long runs them all"
                )

        finally:
            code = broker.stop()
            if code != 0:
                progress(f"memory: broker exited with {code}\n{broker.log_tail()}")
    return results
