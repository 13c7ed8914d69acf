"""GroupCommit's rounds for a target that flushes with a coroutine (`flush_async`, the
PostgreSQL engine's logs): the same rounds as on threads, run as tasks on the loop."""

from __future__ import annotations

import asyncio

import pytest

from persister.commit import GroupCommit


class AsyncTarget:
    """Each round waits on its own gate; `flush` (the thread path) must never run."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Future[None]] = []
        self.finished = 0

    def flush(self) -> None:
        raise AssertionError("an async target's rounds run on the loop")

    async def flush_async(self) -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        self.finished += 1


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_writers_asking_during_a_round_share_the_next_one_and_errors_reach_them() -> None:
    commit = GroupCommit()
    commit.start()
    target = AsyncTarget()
    started: list[str] = []
    first = asyncio.ensure_future(commit.sync(target))
    await settle()
    assert len(target.gates) == 1
    # Two writers while round 1 runs: both wait for round 2, which starts after it.
    second = asyncio.ensure_future(commit.sync(target))
    commit.request(target, lambda _e: None, started=lambda: started.append("round 2"))
    third = asyncio.ensure_future(commit.sync(target))
    await settle()
    assert len(target.gates) == 1 and not second.done()
    target.gates[0].set_result(None)
    await first
    await settle()
    assert len(target.gates) == 2 and started == ["round 2"]
    target.gates[1].set_exception(OSError(5, "commit to postgresql failed: gone"))
    for waiter in (second, third):
        with pytest.raises(OSError, match="postgresql"):
            await waiter
    assert commit.rounds == 2
    await commit.stop()


async def test_started_callbacks_run_once_the_flush_has_begun() -> None:
    # What they wake (a parked fetch) must not run before the commit is on its way.
    commit = GroupCommit()
    commit.start()
    events: list[str] = []

    class Target(AsyncTarget):
        async def flush_async(self) -> None:
            events.append("flush begun")
            await super().flush_async()

    target = Target()
    commit.request(target, lambda _e: None, started=lambda: events.append("started"))
    await settle()
    assert events == ["flush begun", "started"]
    target.gates[0].set_result(None)
    await commit.stop()
