"""A durable log of key/value records: what every coordinator's state is written to.

A coordinator turns a request into records; `append` writes them as one v2 record
batch on a segmented `PartitionLog` and returns once they are fsynced (group commit);
`replay` yields every record from the start, which is how state is rebuilt on
startup. Keys and values are opaque bytes: each coordinator has its own codec.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from persister.commit import GroupCommit
from persister.log import LogConfig, PartitionLog
from protocol.records import NewRecord, build_batch, decode_records, iter_batches

KeyValue = tuple[bytes | None, bytes | None]

# Internal logs roll at 64 MiB so closed segments can be compacted in reasonable pieces.
INTERNAL_SEGMENT_BYTES = 64 * 1024 * 1024


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class RecordLog:
    def __init__(
        self, directory: Path, commit: GroupCommit, config: LogConfig | None = None
    ) -> None:
        self.log = PartitionLog.open(
            directory,
            config
            or LogConfig(segment_bytes=INTERNAL_SEGMENT_BYTES, retention_ms=-1, segment_ms=2**62),
            _now_ms(),
        )
        self._commit = commit

    def write(self, records: Sequence[KeyValue]) -> None:
        """Append records as one batch (to the OS, not yet fsynced)."""
        if not records:
            return
        now = _now_ms()
        batch = build_batch([NewRecord(key=k, value=v) for k, v in records], default_timestamp=now)
        self.log.append(bytearray(batch), now)

    async def sync(self) -> None:
        """Return once everything written so far is on disk."""
        await self._commit.sync(self.log)

    async def append(self, records: Sequence[KeyValue]) -> None:
        """Write records and wait until they are durable."""
        if records:
            self.write(records)
            await self.sync()

    def replay(self) -> Iterator[KeyValue]:
        """Every record from the log start, in order."""
        offset = self.log.log_start_offset
        while offset < self.log.log_end_offset:
            data = self.log.read(offset, 1 << 20)
            if not data:
                break
            for pos, header in iter_batches(data, validate=True):
                for record in decode_records(data, pos, header):
                    yield record.key, record.value
                offset = header.next_offset

    def close(self) -> None:
        self.log.close()
