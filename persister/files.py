"""Writing whole files durably: every byte written, then fsynced, before anyone relies
on them (a rewritten segment before it is swapped in, a checkpoint before it is renamed
over the old one)."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until all of `data` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_synced(path: Path, data: bytes | bytearray | memoryview) -> None:
    """Create or truncate `path`, write `data` and fsync it. The caller renames it into
    place and fsyncs the directory where that matters."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
