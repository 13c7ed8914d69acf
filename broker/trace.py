"""Opt-in tracing of where a record's time goes on the share path.

Set `SPOOL_TRACE=<file>` in the broker's environment and each step of a record's path
is timestamped (`time.perf_counter_ns`, monotonic, the same clock in every thread):
produce request received, append, the fsync round that covered it (started, begun and
done on the fsync thread, seen on the event loop), high-watermark advance, the wake-up
of a parked ShareFetch, its acquisition in memory (with the share-state write of any
acknowledgements it carries, and that write's fsync round), the handler's return,
response encoding and the socket write. Events are JSON lines, buffered and
written when the broker exits; `bench/latency.py` joins them per record and prints the
gap between each step.

Off (the default) it costs one module-global test per step: call sites read `ENABLED`
before building anything. Every event carries the request it happened in (connection
and correlation id, kept in a context variable that the request's tasks inherit), so a
fsync round or share-state write is tied to the produce or ShareFetch that waited on it.
This is a measuring tool, not a log: it never changes what the broker does.
"""

from __future__ import annotations

import atexit
import contextvars
import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from persister.commit import Flushable, GroupCommit, RoundTimes

PATH = os.environ.get("SPOOL_TRACE") or None
ENABLED = PATH is not None

now_ns = time.perf_counter_ns

# (connection id, correlation id, api key) of the request being handled, if any.
_request: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar(
    "spool_trace_request", default=None
)
_events: list[tuple[str, int, tuple[int, int, int] | None, dict[str, Any]]] = []
_lock = threading.Lock()


def event(
    name: str,
    at_ns: int | None = None,
    *,
    request: tuple[int, int, int] | None = None,
    **fields: Any,
) -> None:
    """Record `name` now (or at `at_ns`) in the current request (or `request`).
    Callers check `ENABLED` first."""
    item = (name, now_ns() if at_ns is None else at_ns, request or _request.get(), fields)
    with _lock:
        _events.append(item)


def attach(commit: GroupCommit) -> None:
    """Trace every fsync round a request waits for: start, the fsync thread running it,
    flush return on that thread, the loop's callback, and the waiting task resumed."""
    commit.on_synced = _synced


def _synced(target: Flushable, times: RoundTimes) -> None:
    directory = getattr(target, "directory", None)
    event(
        "fsync",
        log=None if directory is None else Path(directory).name,
        started=times.started_ns,
        entered=times.entered_ns,
        flushed=times.flushed_ns,
        finished=times.finished_ns,
    )


def request_started(connection_id: int, correlation_id: int, api_key: int, at_ns: int) -> None:
    """Enter a request's context (call in the request's own task) and note its arrival."""
    _request.set((connection_id, correlation_id, api_key))
    event("request_received", at_ns)


def request_of() -> tuple[int, int, int] | None:
    return _request.get()


def dump(path: str | None = None) -> int:
    """Write the events so far as JSON lines (appending); returns how many."""
    target = path or PATH
    if target is None:
        return 0
    with _lock:
        events, _events[:] = list(_events), []
    with open(target, "a", encoding="utf-8") as out:
        for name, at_ns, request, fields in events:
            out.write(json.dumps({"e": name, "t": at_ns, "r": request, **fields}) + "\n")
    return len(events)


_gc_started: list[int] = []


def _on_gc(phase: str, info: dict[str, int]) -> None:
    """A garbage collection stops every thread of the process: trace each one's pause."""
    if phase == "start":
        _gc_started.append(now_ns())
    elif _gc_started:
        started = _gc_started.pop()
        event("gc", request=None, started=started, generation=info.get("generation", -1))


if ENABLED:
    atexit.register(dump)
    gc.callbacks.append(_on_gc)
