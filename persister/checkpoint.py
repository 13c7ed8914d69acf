"""Checkpoints of a coordinator's state: restart without replaying the whole log.

A coordinator's state after replaying its log up to offset X can be written down once
and loaded instead of that replay; only the records from X on are then replayed
(`coordinator.runtime.CoordinatorRuntime.load`). Kafka has no such file (its coordinators
replay their compacted `__consumer_offsets` / `__share_group_state` partitions); spool
keeps one per coordinator log so that a restart after kill -9 does not decode a million
share-state records.

The file, `<log dir>/coordinator-state-checkpoint`, all big-endian:

    magic b"SPCK" | version int16 | crc32c uint32 of everything after it
    | offset int64 (the log offset the state covers: records [log start, offset))
    | kind (int16 length + UTF-8: whose state it is, e.g. "share-state")
    | payload (the rest: the state machine's own encoding)

It is replaced atomically (temp file, fsync, rename, directory fsync), so a crash leaves
the old checkpoint or the new one. Reading it checks the magic, the version (a newer one
than this code knows is ignored), the CRC and the kind; anything wrong means "no
checkpoint" and a full replay, logged. The `.tmp` name of an unfinished write is one the
log's opening removes as a stray (`persister.file_log`).

Which offsets a checkpoint may cover is the runtime's business: only records that are
fsynced and replayed, so no failed write's truncation can ever cut below it; and before
a compaction rewrites segments reaching past it, the checkpoint is removed (`remove`),
because a compaction may drop a tombstone at or after its offset along with everything
that key had, and a replay from the checkpoint would not see the deletion. A
`generation` makes a write that was started before such a removal give up instead of
bringing the stale state back.

Producer-state snapshots of topic partitions (`<offset>.snapshot`, as Kafka names them;
the encoding is `persister.producer_state`) are files of the same kind: written at a
segment roll and at a clean close, replaced atomically, the newest few kept; the log
loads the newest usable one (`persister.file_log.PartitionLog.load_producer_state`).
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import crc32c
import structlog

from persister.files import write_synced

log = structlog.get_logger("spool.checkpoint")

CHECKPOINT_FILE = "coordinator-state-checkpoint"
MAGIC = b"SPCK"
VERSION = 0
_HEAD = struct.Struct(">4shI")  # magic, version, crc
_OFFSET = struct.Struct(">q")
_INT16 = struct.Struct(">h")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A coordinator's state as of log offset `offset` (records below it replayed)."""

    offset: int
    payload: bytes


def encode_checkpoint(kind: str, offset: int, payload: bytes) -> bytes:
    name = kind.encode()
    body = _OFFSET.pack(offset) + _INT16.pack(len(name)) + name + payload
    return _HEAD.pack(MAGIC, VERSION, crc32c.crc32c(body)) + body


def decode_checkpoint(kind: str, data: bytes) -> Checkpoint | str:
    """The checkpoint in `data`, or why it cannot be used."""
    if len(data) < _HEAD.size + _OFFSET.size + _INT16.size:
        return f"too short ({len(data)} bytes)"
    magic, version, crc = _HEAD.unpack_from(data)
    if magic != MAGIC:
        return f"not a checkpoint (magic {magic!r})"
    if version > VERSION:
        return f"version {version} is newer than this broker reads ({VERSION})"
    body = memoryview(data)[_HEAD.size :]
    if crc32c.crc32c(body) != crc:
        return "CRC mismatch (torn or damaged)"
    (offset,) = _OFFSET.unpack_from(body)
    (name_len,) = _INT16.unpack_from(body, _OFFSET.size)
    start = _OFFSET.size + _INT16.size
    found = bytes(body[start : start + name_len]).decode(errors="replace")
    if found != kind:
        return f"holds {found!r} state, not {kind!r}"
    if offset < 0:
        return f"negative offset {offset}"
    return Checkpoint(offset, bytes(body[start + name_len :]))


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointFile:
    """The checkpoint file of one coordinator log directory; see the module docstring.

    `write` is blocking (run it in a worker); `remove` runs on the event loop. They meet
    under a lock around the rename, so a write begun before a `remove` never lands.
    """

    def __init__(self, directory: Path, kind: str) -> None:
        self.path = Path(directory) / CHECKPOINT_FILE
        self.kind = kind
        self.generation = 0
        # The offset the file on disk covers, as far as this process knows.
        self.offset: int | None = None
        self._lock = threading.Lock()

    def read(self) -> Checkpoint | None:
        """The checkpoint, or None (missing, or unusable: logged) for a full replay."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            log.info("checkpoint_missing", kind=self.kind, path=str(self.path))
            return None
        except OSError as exc:
            log.warning(
                "checkpoint_unreadable", kind=self.kind, path=str(self.path), error=str(exc)
            )
            return None
        result = decode_checkpoint(self.kind, data)
        if isinstance(result, str):
            log.warning("checkpoint_ignored", kind=self.kind, path=str(self.path), reason=result)
            return None
        self.offset = result.offset
        return result

    def write(self, offset: int, payload: bytes, generation: int) -> bool:
        """Replace the checkpoint atomically, unless `remove` ran since `generation` was
        read (then nothing changes and False is returned). OSError passes through."""
        tmp = self.path.with_name(f"{self.path.name}.{generation}.{threading.get_ident()}.tmp")
        data = encode_checkpoint(self.kind, offset, payload)
        try:
            write_synced(tmp, data)
            with self._lock:
                if generation != self.generation:
                    return False
                os.replace(tmp, self.path)
                self.offset = offset
                _fsync_directory(self.path.parent)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def remove(self, *, void_writes: bool = True) -> None:
        """Delete the checkpoint durably and (unless told not to) void writes already
        under way."""
        with self._lock:
            if void_writes:
                self.generation += 1
            self.offset = None
            try:
                self.path.unlink()
            except FileNotFoundError:
                return
            _fsync_directory(self.path.parent)


# ------------------------------------------------------- producer-state snapshots

PRODUCER_SNAPSHOT_SUFFIX = ".snapshot"
# The newest ones kept: an older one is a fallback when the newest is torn.
PRODUCER_SNAPSHOTS_KEPT = 2


def producer_snapshot_offsets(directory: Path) -> list[int]:
    """Offsets of the `<offset>.snapshot` files, ascending."""
    found = []
    for name in os.listdir(directory):
        stem, _, suffix = name.partition(".")
        if f".{suffix}" == PRODUCER_SNAPSHOT_SUFFIX and len(stem) == 20 and stem.isdigit():
            found.append(int(stem))
    return sorted(found)


def producer_snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{PRODUCER_SNAPSHOT_SUFFIX}"


def write_producer_snapshot(directory: Path, offset: int, data: bytes) -> None:
    """Write `<offset>.snapshot` atomically (temp file, fsync, rename; the directory
    entry is made durable by the log's next flush or its clean close) and delete all
    but the newest PRODUCER_SNAPSHOTS_KEPT. OSError passes through."""
    path = producer_snapshot_path(directory, offset)
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, data)
    os.replace(tmp, path)
    for old in producer_snapshot_offsets(directory)[:-PRODUCER_SNAPSHOTS_KEPT]:
        producer_snapshot_path(directory, old).unlink(missing_ok=True)


def delete_producer_snapshots_after(directory: Path, offset: int) -> None:
    """Delete the snapshots above `offset` (the log was truncated to it)."""
    for found in producer_snapshot_offsets(directory):
        if found > offset:
            producer_snapshot_path(directory, found).unlink(missing_ok=True)
