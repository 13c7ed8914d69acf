"""Share-partition fetch locks: one change of a share partition at a time, no request
ever waiting on another without a bound.

A request holds a share partition's lock from the moment it changes the partition in
memory until that change is durable (committed) or undone (rolled back), so no change is
built on one that may yet be undone. Two rules keep requests from waiting on each other:

- A fetch only try-acquires (`try_acquire`), as Kafka's SharePartition
  .maybeAcquireFetchLock does: a partition another request holds is skipped for this
  round, and the lock's release wakes the skipped fetch (`on_free`) as Kafka's
  DelayedShareFetch is completed again once the fetch lock is let go.
- Whoever must wait (acknowledgements, a member's release, lock expiry) waits with a bound
  on the injected clock (`acquire(..., timeout_ms)`), and takes several locks in one
  global order (`ordered`), while holding only locks taken that way. A holder that is not
  waiting does only its own I/O (load, share-state write), so waits form no cycle.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from persister.clock import Clock

K = TypeVar("K")


class FetchLocks(Generic[K]):
    """One lock per key, held by one request at a time (ownership passes to the next
    waiter on release, in arrival order)."""

    def __init__(self, clock: Clock, on_free: Callable[[K], None] | None = None) -> None:
        self.clock = clock
        self.on_free = on_free
        self._held: set[K] = set()
        self._waiters: dict[K, deque[asyncio.Future[bool]]] = {}
        # Keys a try-acquire found busy: their release calls `on_free`.
        self._contended: set[K] = set()

    def __contains__(self, key: object) -> bool:
        """Whether anyone holds or waits for `key`'s lock."""
        return key in self._held or key in self._waiters

    def __len__(self) -> int:
        return len(self._held)

    def held(self, key: K) -> bool:
        return key in self._held

    def try_acquire(self, key: K) -> bool:
        """Take `key`'s lock if nobody holds or waits for it; never waits. A refusal is
        remembered, so that its release calls `on_free(key)`."""
        if key in self._held or key in self._waiters:
            self._contended.add(key)
            return False
        self._held.add(key)
        return True

    async def acquire(self, key: K, timeout_ms: int) -> bool:
        """Take `key`'s lock, waiting at most `timeout_ms` on the clock; False if it
        could not be had in time."""
        if key not in self._held and key not in self._waiters:
            self._held.add(key)
            return True
        if timeout_ms <= 0:
            return False
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, deque()).append(granted)

        def timed_out() -> None:
            if not granted.done():
                granted.set_result(False)

        timer = self.clock.call_at(self.clock.now_ms() + timeout_ms, timed_out)
        try:
            return await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled() and granted.result():
                self.release(key)  # handed over just as the waiter was cancelled
            raise
        finally:
            timer.cancel()
            waiters = self._waiters.get(key)
            if waiters is not None:
                if granted in waiters:
                    waiters.remove(granted)
                if not waiters:
                    del self._waiters[key]

    async def ordered(self, keys: Iterable[K], timeout_ms: int) -> tuple[list[K], list[K]]:
        """Take several locks in one global order (`lock_order`), all waits together
        bounded by `timeout_ms`: (the keys taken, the keys that timed out)."""
        deadline = self.clock.now_ms() + timeout_ms
        taken: list[K] = []
        missed: list[K] = []
        try:
            for key in sorted(set(keys), key=lock_order):
                if await self.acquire(key, deadline - self.clock.now_ms()):
                    taken.append(key)
                else:
                    missed.append(key)
        except BaseException:
            self.release_all(taken)
            raise
        return taken, missed

    def release(self, key: K) -> None:
        """Let `key`'s lock go: to its next waiter, else free (waking skipped fetches)."""
        waiters = self._waiters.get(key)
        if waiters is not None:
            while waiters:
                granted = waiters.popleft()
                if not granted.done():
                    granted.set_result(True)  # ownership passes; the key stays held
                    return
            del self._waiters[key]  # only waiters that timed out were left
        self._held.discard(key)
        if key in self._contended:
            self._contended.discard(key)
            if self.on_free is not None:
                self.on_free(key)

    def release_all(self, keys: Iterable[K]) -> None:
        for key in keys:
            self.release(key)


def lock_order(key: object) -> tuple[str, str]:
    """A total order over lock keys (share-state keys: group, topic id, partition)."""
    return type(key).__qualname__, repr(key)
