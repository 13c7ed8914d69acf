"""The share path's latency tooling: fsync rounds of different logs do not queue behind
each other, and the opt-in trace (broker.trace) ties each fsync round to the request
that waited for it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker import trace
from persister.commit import GroupCommit
from tests.unit import test_commit
from tests.unit.test_commit import GatedTarget, until

commit = test_commit.commit  # a started GroupCommit


async def test_a_round_of_one_log_does_not_wait_for_a_running_round_of_another(
    commit: GroupCommit,
) -> None:
    share_state, partition = GatedTarget(), GatedTarget()
    held = asyncio.ensure_future(commit.sync(share_state))
    await until(lambda: share_state.started == 1)
    partition.gate(1).set()
    # The partition's fsync completes while the share state's is still on the disk.
    await asyncio.wait_for(commit.sync(partition), timeout=10)
    assert not held.done()
    share_state.gate(1).set()
    await held


async def test_trace_ties_each_fsync_round_to_the_request_that_waited(
    commit: GroupCommit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "_events", [])
    trace.attach(commit)
    target = GatedTarget()

    async def request(correlation_id: int) -> None:
        trace.request_started(7, correlation_id, 0, trace.now_ns())
        await commit.sync(target)
        trace.event("handled")

    first = asyncio.ensure_future(request(1))
    await until(lambda: target.started == 1)
    # Asked while round 1 runs: these two share round 2.
    later = [asyncio.ensure_future(request(n)) for n in (2, 3)]
    await asyncio.sleep(0)
    target.gate(1).set()
    target.gate(2).set()
    await asyncio.gather(first, *later)
    out = tmp_path / "trace.jsonl"
    assert trace.dump(str(out)) == 9
    events = [json.loads(line) for line in out.read_text().splitlines()]
    rounds = {}
    for correlation_id in (1, 2, 3):
        mine = [e for e in events if e["r"] == [7, correlation_id, 0]]
        assert [e["e"] for e in mine] == ["request_received", "fsync", "handled"]
        received, fsync, handled = mine
        # Started after the request arrived, begun and flushed on the thread, seen on
        # the loop, then this request resumed.
        assert received["t"] <= fsync["started"] <= fsync["entered"]
        assert fsync["entered"] <= fsync["flushed"] <= fsync["finished"]
        assert fsync["finished"] <= fsync["t"] <= handled["t"]
        rounds[correlation_id] = (fsync["started"], fsync["flushed"], fsync["finished"])
    assert rounds[2] == rounds[3]
    assert rounds[1][2] <= rounds[2][0]
    assert commit.rounds == 2


def test_tracing_is_off_unless_spool_trace_is_set() -> None:
    # The test run has no SPOOL_TRACE: every call site skips on this one flag.
    assert trace.ENABLED is False
    assert trace.dump() == 0
