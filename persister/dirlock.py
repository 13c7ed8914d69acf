"""The data directory's `.lock`, as Kafka locks each log directory.

Two brokers on one data directory would both append to the same logs and corrupt them,
so a broker takes an exclusive `flock` on `<data dir>/.lock` before it opens anything and
holds it until it stops (the kernel drops it when the process dies, kill -9 included).
Tools that read the directory (the Spark audit) ask `in_use` whether a broker is running,
without taking the lock for longer than the question.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"


class DataDirInUse(OSError):
    """Another process holds the data directory's lock."""


class DataDirLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DataDirInUse(
                    exc.errno,
                    f"Failed to acquire lock on file {LOCK_FILE} in {self.path.parent}. "
                    "A spool broker in another process is using this directory; stop it "
                    "or give this one its own --data-dir.",
                ) from None
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def in_use(directory: Path) -> bool:
    """Whether a broker holds `directory`'s lock right now."""
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    else:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
