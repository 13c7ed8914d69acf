"""Named crash points, for tests that kill the broker at an exact step of a protocol.

`crash_point("dead-letter.after-copy")` does nothing unless the broker was started with
that name in the `SPOOL_CRASH_AT` environment variable (a comma-separated list); then it
kills its own process with SIGKILL on the spot, as `kill -9` would, so a test can show
what a crash between two writes leaves behind without racing a signal against the event
loop. The variable is read once, at the first call.
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_AT_ENV", "crash_point"]

CRASH_AT_ENV = "SPOOL_CRASH_AT"

_armed: frozenset[str] | None = None


def _points() -> frozenset[str]:
    global _armed
    if _armed is None:
        raw = os.environ.get(CRASH_AT_ENV, "")
        _armed = frozenset(p.strip() for p in raw.split(",") if p.strip())
    return _armed


def crash_point(name: str) -> None:
    """Kill this process with SIGKILL when `name` is armed in SPOOL_CRASH_AT."""
    if name in _points():
        os.kill(os.getpid(), signal.SIGKILL)
