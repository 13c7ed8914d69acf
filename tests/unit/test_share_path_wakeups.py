"""The share path's hand-offs: a long poll wakes on its source, not on a timer; its
timeout is the injected clock's; accepted sockets send without Nagle's delay; an fsync
round comes back to the loop with one thread-safe call however many writers it serves."""

from __future__ import annotations

import asyncio
import socket

import pytest

from broker.partitions import Listener, Wakeup, wait_for_any
from broker.server import Server
from persister.clock import ManualClock
from persister.commit import GroupCommit


class Source:
    def __init__(self) -> None:
        self.listeners: set[Listener] = set()

    def add_listener(self, listener: Listener) -> None:
        self.listeners.add(listener)

    def remove_listener(self, listener: Listener) -> None:
        self.listeners.discard(listener)

    def notify(self) -> None:
        for listener in list(self.listeners):
            listener()


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_parked_long_poll_resumes_on_the_next_loop_turn_after_a_notify() -> None:
    clock, source = ManualClock(), Source()
    waiting = asyncio.create_task(wait_for_any([source], 0.5, clock=clock))
    await turns()
    assert not waiting.done() and source.listeners
    source.notify()  # the clock never moves: no timer is involved
    await turns(2)
    assert waiting.done()
    assert not source.listeners
    assert clock.pending_timers == 0  # the timeout timer was cancelled


async def test_a_long_poll_times_out_when_the_injected_clock_reaches_max_wait() -> None:
    clock, source = ManualClock(), Source()
    waiting = asyncio.create_task(wait_for_any([source], 0.5, clock=clock))
    await turns()
    clock.advance(499)
    await turns()
    assert not waiting.done()
    clock.advance(1)
    await turns()
    assert waiting.done()
    assert not source.listeners


async def test_a_notify_between_a_look_and_the_wait_is_not_lost() -> None:
    # A ShareFetch looks for records (its round may wait for a share-state write), then
    # parks: a produce that lands during the round must wake the wait that follows it.
    clock, source = ManualClock(), Source()
    with Wakeup([source]) as wakeup:
        source.notify()  # during the "round"
        await asyncio.wait_for(wakeup.wait(0.5, clock=clock), timeout=5)
        assert clock.pending_timers == 0  # returned at once, no timer armed
        # Consumed: the next wait parks until the next notify, or the clock's timeout.
        waiting = asyncio.create_task(wakeup.wait(0.5, clock=clock))
        await turns()
        assert not waiting.done()
        clock.advance(500)
        await turns()
        assert waiting.done()
    assert not source.listeners


async def test_accepted_connections_have_tcp_nodelay() -> None:
    async def no_dispatch(*_: object) -> bytes | None:
        return None

    server = Server("127.0.0.1", 0, no_dispatch)
    await server.start()
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for _ in range(200):
            if server._live:
                break
            await asyncio.sleep(0.005)
        (conn,) = server._live.values()
        sock = conn.writer.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        writer.close()
        await writer.wait_closed()
    finally:
        await server.stop(grace_s=1)


class Disk:
    def flush(self) -> None:
        pass


async def test_an_fsync_round_comes_back_to_the_loop_with_one_threadsafe_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    calls = 0
    real = loop.call_soon_threadsafe

    def counting(*args: object, **kwargs: object) -> asyncio.Handle:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    commit = GroupCommit()
    commit.start()
    try:
        disk = Disk()
        await asyncio.gather(*(commit.sync(disk) for _ in range(16)))
    finally:
        await commit.stop()
    # The first writer's round and one round for the 15 that asked while it ran.
    assert commit.rounds == 2
    assert calls == commit.rounds
