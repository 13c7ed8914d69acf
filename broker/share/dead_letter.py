"""The dead-letter writer: phase two of KIP-1191's flow, ARCHIVING -> copy -> ARCHIVED.

A share partition of a group with a dead-letter topic puts a record it gives up on in
ARCHIVING, durably, before the client is answered (phase one, `broker.share.partition`).
`DeadLetterWriter` does the rest, in the background, one task per share partition (so the
runs of one partition, however many acknowledgements produce them at once, are handed out
once and archived one take after the other): it takes the partition's ARCHIVING runs not
handed out yet (`SharePartition.take_dead_letters`), hands them to the `DeadLetterSink`
together (`write_all`, up to `letters_per_write` runs a call: one record rejected in ten
is one run each, so a call, a timer and the sink's resolving are paid per take, not per
run), which writes the copies to the dead-letter topic and returns once they are durable
with an outcome per run, then archives the runs (`archive_dead_letters`: the runs of one
take together, with one share-state write under the partition's lock), and counts them
(`ShareMetrics.dead_lettered`).

- A crash (or `kill -9`) between the two writes leaves the run ARCHIVING in the share state:
  whoever loads the partition next hands it out again and writes the copy again. Crash
  points `dead-letter.before-copy` (ARCHIVING durable, no copy yet) and
  `dead-letter.after-copy` (copy durable, not yet ARCHIVED) let tests kill the broker there.
- `DeadLetterRetriable` (storage error, leader moved, database down), a write that takes
  longer than `copy_timeout_ms`, or a sink that fails unexpectedly: the runs concerned stay
  ARCHIVING (the others are archived meanwhile) and their copies are tried again after a
  backoff on the injected clock, doubling up to `max_backoff_ms`, for as long as the
  partition stays loaded here.
- `DeadLetterRefused` (no dead-letter topic any more, the topic unfit, a copy too large):
  the run is archived without a copy, with a warning naming the reason, as Kafka proceeds
  to ARCHIVED when its dead-letter write fails.
- A failed ARCHIVED write leaves the run ARCHIVING in memory (the change is rolled back:
  memory is never ahead of what is durable) and is tried again after the backoff.
- The partition unloaded, fenced or dropped (another broker leads it now): the task stops
  at its next step; the next owner resumes from the persisted ARCHIVING.

Nothing here holds a partition's lock while the sink writes, and every wait is bounded
(the lock by `lock_wait_ms`, each sink write by `copy_timeout_ms`), so fetches of this and every
other partition go on meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from broker.faults import crash_point
from broker.metrics import ShareMetrics
from broker.share.dead_letters import (
    DeadLetter,
    DeadLetterOutcome,
    DeadLetterRefused,
    DeadLetterRetriable,
    DeadLetterSink,
)
from broker.share.locks import FetchLocks
from broker.share.partition import SharePartition
from broker.share.state_writer import StateWriter
from coordinator.share_state import ShareStateKey
from persister.clock import Clock, sleep, wait_all
from protocol.errors import KafkaError

__all__ = [
    "COPY_TIMEOUT_MS",
    "LETTERS_PER_WRITE",
    "RETRY_BACKOFF_MS",
    "RETRY_MAX_BACKOFF_MS",
    "DeadLetterWriter",
    "RefusingSink",
]

log = structlog.get_logger("spool.share")

# The first wait before a copy (or the ARCHIVED write) is tried again; doubled each time.
RETRY_BACKOFF_MS = 100
RETRY_MAX_BACKOFF_MS = 30_000
# The longest one sink write may take before its runs count as failed (retriable): as a
# Produce with acks=all waits at most request.timeout.ms (30000 by default).
COPY_TIMEOUT_MS = 30_000
# The most runs of one share partition handed to the sink in one write (their copies go in
# one append with one durable wait); a larger take is written in several, one by one.
LETTERS_PER_WRITE = 2048


class RefusingSink:
    """A sink for a broker with no dead-letter writer: every run is archived uncopied."""

    def __init__(self, reason: str = "no dead-letter writer in this broker") -> None:
        self.reason = reason

    async def write_all(self, letters: Sequence[DeadLetter]) -> list[DeadLetterOutcome]:
        return [DeadLetterRefused(self.reason)] * len(letters)


class DeadLetterWriter:
    def __init__(
        self,
        *,
        clock: Clock,
        sink: DeadLetterSink,
        partitions: dict[ShareStateKey, SharePartition],
        locks: FetchLocks[ShareStateKey],
        writer: StateWriter,
        metrics: ShareMetrics,
        notify: Callable[[ShareStateKey], None],
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        topic_name: Callable[[ShareStateKey], str | None],
        lock_wait_ms: int,
        retry_backoff_ms: int = RETRY_BACKOFF_MS,
        max_backoff_ms: int = RETRY_MAX_BACKOFF_MS,
        copy_timeout_ms: int = COPY_TIMEOUT_MS,
        letters_per_write: int = LETTERS_PER_WRITE,
    ) -> None:
        self.clock = clock
        self.sink = sink
        self.partitions = partitions
        self.locks = locks
        self.writer = writer
        self.metrics = metrics
        self.notify = notify
        self.spawn = spawn
        self.topic_name = topic_name
        self.lock_wait_ms = lock_wait_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.max_backoff_ms = max_backoff_ms
        self.copy_timeout_ms = copy_timeout_ms
        self.letters_per_write = max(letters_per_write, 1)
        # The share partition each running task works for (one task per key).
        self._running: dict[ShareStateKey, SharePartition] = {}
        self._stopped = False

    def start(self) -> None:
        self._stopped = False

    def stop(self) -> None:
        """Stop starting tasks (the manager cancels the running ones with its others)."""
        self._stopped = True

    def busy(self, key: ShareStateKey) -> bool:
        """Whether a task works on `key`'s dead letters."""
        return key in self._running

    def poke(self, key: ShareStateKey, sp: SharePartition) -> None:
        """A change of `sp` is durable, or `sp` was loaded: dead-letter what it has
        ARCHIVING, unless a task for it runs already (it takes new runs before it ends)."""
        if self._stopped or not sp.has_dead_letters or self._running.get(key) is sp:
            return
        # A task for an earlier load of the key stops at its next step on its own.
        self._running[key] = sp
        self.spawn(self._run(key, sp), "share_dead_letters")

    def _loaded(self, key: ShareStateKey, sp: SharePartition) -> bool:
        return not self._stopped and self.partitions.get(key) is sp

    async def _run(self, key: ShareStateKey, sp: SharePartition) -> None:
        # The archive of the last take, written while the next take is copied (so SPSO,
        # which ARCHIVING holds back, moves one copy sooner); awaited before the next.
        archiving: list[asyncio.Future[bool]] = []
        try:
            backoff = self.retry_backoff_ms
            while self._loaded(key, sp):
                letters = await self._take(key, sp)
                if letters is None:  # the partition stayed busy: look again shortly
                    await sleep(self.clock, backoff)
                    backoff = min(backoff * 2, self.max_backoff_ms)
                    continue
                if not letters:
                    if archiving:
                        if not await archiving.pop():
                            return
                        continue  # runs may have come meanwhile: take again
                    return  # no await since the take: a later poke starts a new task
                backoff = self.retry_backoff_ms
                if not await self._dead_letter(key, sp, letters, archiving):
                    return
            if archiving:
                await archiving.pop()
        except BaseException:
            for task in archiving:
                task.cancel()
            # A bug (or the manager cancelling its tasks) ended the task with runs handed
            # out: give them back, so a later poke or load takes them again; otherwise they
            # would stay ARCHIVING, holding SPSO back, for as long as the partition is here.
            if self.partitions.get(key) is sp:
                sp.return_dead_letters()
            raise
        finally:
            if self._running.get(key) is sp:
                del self._running[key]

    async def _take(self, key: ShareStateKey, sp: SharePartition) -> list[DeadLetter] | None:
        """The runs not handed out yet, taken under the lock (no change pending); None if
        the lock could not be had in time."""
        if not await self.locks.acquire(key, self.lock_wait_ms):
            return None
        try:
            if not self._loaded(key, sp):
                return []
            return sp.take_dead_letters()
        finally:
            self.locks.release(key)

    async def _dead_letter(
        self,
        key: ShareStateKey,
        sp: SharePartition,
        letters: list[DeadLetter],
        archiving: list[asyncio.Future[bool]],
    ) -> bool:
        """Copy the runs, `letters_per_write` at a time with one sink write each, then
        archive them with one share-state write, started in the background (`archiving`
        holds it: the previous take's is awaited first); what is copied is archived
        before a backoff too, so it does not wait on a failing copy. False once the
        partition is no longer loaded here."""
        done: list[tuple[DeadLetter, bool]] = []  # (run, copied)
        todo = letters
        backoff = self.retry_backoff_ms
        while todo:
            if not self._loaded(key, sp):
                return False
            part, rest = todo[: self.letters_per_write], todo[self.letters_per_write :]
            outcomes = await self._copy(key, part, backoff)
            retry = [x for x, copied in zip(part, outcomes, strict=True) if copied is None]
            done += [(x, c) for x, c in zip(part, outcomes, strict=True) if c is not None]
            todo = retry + rest
            if retry:
                if archiving and not await archiving.pop():
                    return False
                if done and not await self._archive(key, sp, done):
                    return False
                done = []
                await sleep(self.clock, backoff)
                backoff = min(backoff * 2, self.max_backoff_ms)
            else:
                backoff = self.retry_backoff_ms
        if archiving and not await archiving.pop():
            return False
        if done:
            archiving.append(asyncio.ensure_future(self._archive(key, sp, done)))
        return True

    async def _copy(
        self, key: ShareStateKey, letters: list[DeadLetter], backoff_ms: int
    ) -> list[bool | None]:
        """Have the sink write the runs' copies, in one write: per run True once durable,
        False when refused for good (archived uncopied), None to try again after
        `backoff_ms`."""
        crash_point("dead-letter.before-copy")
        try:
            outcomes = await self._write_bounded(letters)
        except DeadLetterRetriable as exc:
            self._retrying(key, letters, "copy", str(exc) or type(exc).__name__, backoff_ms)
            return [None] * len(letters)
        except Exception as exc:
            # A bug in the sink: logged with its trace, and tried again as retriable.
            log.exception(
                "dead_letter_copy_failed",
                group=key.group_id,
                topic=self.topic_name(key),
                partition=key.partition,
                first_offset=letters[0].first_offset,
                last_offset=letters[-1].last_offset,
                runs=len(letters),
            )
            self._retrying(key, letters, "copy", repr(exc), backoff_ms)
            return [None] * len(letters)
        result: list[bool | None] = []
        retriable: list[DeadLetter] = []
        reason = ""
        for letter, outcome in zip(letters, outcomes, strict=True):
            if isinstance(outcome, DeadLetterRefused):
                log.warning(
                    "dead_letter_archived_uncopied",
                    group=key.group_id,
                    topic=self.topic_name(key),
                    partition=key.partition,
                    first_offset=letter.first_offset,
                    last_offset=letter.last_offset,
                    reason=str(outcome) or "refused",
                )
                result.append(False)
            elif isinstance(outcome, DeadLetterRetriable):
                reason = reason or str(outcome) or type(outcome).__name__
                retriable.append(letter)
                result.append(None)
            else:
                result.append(outcome > 0)  # 0: no record left at those offsets to copy
        if retriable:
            self._retrying(key, retriable, "copy", reason, backoff_ms)
        if any(result):
            crash_point("dead-letter.after-copy")
        return result

    async def _write_bounded(self, letters: list[DeadLetter]) -> list[DeadLetterOutcome]:
        """The sink's write, bounded by `copy_timeout_ms` on the clock."""
        task = asyncio.ensure_future(self.sink.write_all(letters))
        if await wait_all(self.clock, [task], self.copy_timeout_ms):
            task.cancel()
            raise DeadLetterRetriable(f"the copy took longer than {self.copy_timeout_ms} ms")
        outcomes = task.result()
        if len(outcomes) != len(letters):
            raise RuntimeError(f"the sink answered {len(outcomes)} outcomes for {len(letters)}")
        return outcomes

    async def _archive(
        self, key: ShareStateKey, sp: SharePartition, done: list[tuple[DeadLetter, bool]]
    ) -> bool:
        """ARCHIVING -> ARCHIVED for the runs `done`, with one share-state write under the
        partition's lock, tried again after a backoff until it is durable; then counted.
        False if the partition is no longer loaded here (they stay ARCHIVING, durably)."""
        backoff = self.retry_backoff_ms
        while True:
            if not self._loaded(key, sp):
                return False
            written = await self._archive_once(key, sp, done)
            if written is None:
                return False
            if written:
                break
            await sleep(self.clock, backoff)
            backoff = min(backoff * 2, self.max_backoff_ms)
        counted: dict[tuple[str, bool], int] = {}
        for letter, copied in done:
            slot = (letter.reason.label, copied)
            counted[slot] = counted.get(slot, 0) + letter.record_count
        for (label, copied), records in counted.items():
            self.metrics.dead_lettered(key, label, records, copied)
        return True

    async def _archive_once(
        self, key: ShareStateKey, sp: SharePartition, done: list[tuple[DeadLetter, bool]]
    ) -> bool | None:
        """One attempt: True if durable, False to try again, None if the partition is no
        longer loaded here."""
        first = done[0][0]
        if not await self.locks.acquire(key, self.lock_wait_ms):
            self._retrying(key, [x for x, _ in done], "archive", "share partition busy", 0)
            return False
        try:
            if not self._loaded(key, sp):
                return None
            change = sp.archive_dead_letters(
                [(letter.first_offset, letter.last_offset) for letter, _ in done]
            )
            try:
                await self.writer.write(
                    key,
                    sp,
                    change,
                    "dead_letter_archive",
                    runs=len(done),
                    first_offset=first.first_offset,
                    last_offset=done[-1][0].last_offset,
                )
            except KafkaError:
                return False  # logged by the writer; rolled back: still ARCHIVING
        finally:
            self.locks.release(key)
        # SPSO may have moved: room under share.partition.max.record.locks for a fetch.
        self.notify(key)
        return True

    def _retrying(
        self,
        key: ShareStateKey,
        letters: Sequence[DeadLetter],
        step: str,
        reason: str,
        backoff_ms: int,
    ) -> None:
        """One warning for the runs of one write (or archive) to be tried again."""
        log.warning(
            "dead_letter_retrying",
            group=key.group_id,
            topic=self.topic_name(key),
            partition=key.partition,
            first_offset=letters[0].first_offset,
            last_offset=letters[-1].last_offset,
            runs=len(letters),
            step=step,
            reason=reason,
            retry_in_ms=backoff_ms,
        )
