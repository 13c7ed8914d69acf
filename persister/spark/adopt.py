"""Adopting a `spool compact` output: swapping its segments in for the ones it read.

An output (`share-state/compacted-<id>/`, see `persister.spark.compact`) replaces a run
of closed segments only while those are exactly what the job read: the same base
offsets, no other segment inside the run, a segment starting at the run's limit, and
per file the same size, mtime, inode and CRC32. Anything else (the broker compacted or
truncated one since, a newer output was adopted first, a file is missing) makes it
stale: it is removed and logged, and the log is left as it is. A staging directory
without a manifest is a job still writing (or one that died): it is left alone.

The swap is `PartitionLog.replace_closed_segments_with` for a running broker (under the
share-state runtime's exclusion, see `coordinator.share_persister`) and
`commit_segment_swaps` before the log is opened for a stopped one; both commit with one
rename, so a crash leaves the old run or the new one, and opening the log finishes or
drops the swap. Only the newest valid output is adopted; older ones are superseded.

No pyspark here: the broker imports this module.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from persister.file_log import PartitionLog, commit_segment_swaps
from persister.spark.compact import (
    MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    STAGING_PREFIX,
    file_crc32,
)
from persister.spark.segments import segment_base_offsets

log = structlog.get_logger("spool.share_compaction")


@dataclass(frozen=True, slots=True)
class Manifest:
    """A finished compaction output, as its manifest describes it."""

    staging: Path
    first: int
    limit: int
    inputs: tuple[dict[str, Any], ...]
    outputs: tuple[tuple[int, Path], ...]
    output_sizes: tuple[int, ...]
    output_crcs: tuple[int, ...]

    @property
    def input_bases(self) -> list[int]:
        return [int(i["base_offset"]) for i in self.inputs]


def staging_dirs(log_dir: Path) -> list[Path]:
    """Compaction outputs with a manifest, newest first (their ids begin with the time)."""
    found = [
        log_dir / name
        for name in os.listdir(log_dir)
        if name.startswith(STAGING_PREFIX) and (log_dir / name / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda p: p.name, reverse=True)


def load_manifest(staging: Path) -> Manifest:
    """ValueError saying what is wrong if the manifest is not one this broker can adopt."""
    try:
        raw = json.loads((staging / MANIFEST).read_text())
        if raw.get("format") != MANIFEST_FORMAT or raw.get("version") != MANIFEST_VERSION:
            raise ValueError(
                f"format {raw.get('format')!r} version {raw.get('version')!r}; expected "
                f"{MANIFEST_FORMAT!r} version {MANIFEST_VERSION}"
            )
        outputs = raw["outputs"]
        return Manifest(
            staging=staging,
            first=int(raw["first_offset"]),
            limit=int(raw["limit_offset"]),
            inputs=tuple(raw["inputs"]),
            outputs=tuple((int(o["base_offset"]), staging / str(o["file"])) for o in outputs),
            output_sizes=tuple(int(o["size"]) for o in outputs),
            output_crcs=tuple(int(o["crc32"]) for o in outputs),
        )
    except (OSError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable manifest: {exc!r}") from exc


def _input_path(log_dir: Path, item: dict[str, Any]) -> Path:
    return log_dir / str(item["file"])


def stale_reason(manifest: Manifest, log_dir: Path, bases: Sequence[int]) -> str | None:
    """Why the output no longer fits the log whose segments start at `bases` (None: it
    fits). Cheap: file metadata only; the caller runs it right before swapping."""
    inside = [b for b in bases if manifest.first <= b < manifest.limit]
    if inside != manifest.input_bases or not inside:
        return f"the log's segments in {manifest.first}..{manifest.limit - 1} are {inside}"
    if manifest.limit not in bases:
        return f"no segment starts at {manifest.limit} (the run is not closed)"
    for item in manifest.inputs:
        try:
            st = _input_path(log_dir, item).stat()
        except FileNotFoundError:
            return f"{item['file']} is gone"
        seen = (st.st_size, st.st_mtime_ns, st.st_ino)
        if seen != (item["size"], item["mtime_ns"], item["inode"]):
            return f"{item['file']} changed since it was read (size, mtime or inode)"
    for (_, path), size in zip(manifest.outputs, manifest.output_sizes, strict=True):
        if not path.is_file() or path.stat().st_size != size:
            return f"output {path.name} is missing or not {size} bytes"
    return None


def checksum_reason(manifest: Manifest, log_dir: Path) -> str | None:
    """Whether every input and output file still has its manifest CRC32 (blocking reads:
    run it in a worker; `stale_reason` afterwards catches a change made meanwhile)."""
    for item in manifest.inputs:
        try:
            if file_crc32(_input_path(log_dir, item)) != item["crc32"]:
                return f"{item['file']} does not have the CRC32 the job read"
        except FileNotFoundError:
            return f"{item['file']} is gone"
    for (_, path), crc in zip(manifest.outputs, manifest.output_crcs, strict=True):
        try:
            if file_crc32(path) != crc:
                return f"output {path.name} does not have its manifest CRC32"
        except FileNotFoundError:
            return f"output {path.name} is missing"
    return None


def discard(staging: Path, reason: str) -> None:
    log.warning("share_state_compaction_discarded", staging=staging.name, reason=reason)
    shutil.rmtree(staging, ignore_errors=True)


def _adopted(manifest: Manifest, how: str) -> None:
    log.info(
        "share_state_compaction_adopted",
        staging=manifest.staging.name,
        how=how,
        first=manifest.first,
        limit=manifest.limit,
        segments_replaced=len(manifest.inputs),
        segments_new=len(manifest.outputs),
        bytes_before=sum(int(i["size"]) for i in manifest.inputs),
        bytes_after=sum(manifest.output_sizes),
    )
    shutil.rmtree(manifest.staging, ignore_errors=True)


def check(staging: Path, log_dir: Path) -> Manifest | str:
    """The manifest if the output is whole and fits the files on disk, else why not
    (blocking: reads every file for its CRC)."""
    try:
        manifest = load_manifest(staging)
    except ValueError as exc:
        return str(exc)
    reason = stale_reason(manifest, log_dir, segment_base_offsets(log_dir))
    return reason or checksum_reason(manifest, log_dir) or manifest


def adopt_at_start(log_dir: Path) -> bool:
    """Before the log is opened: commit the newest output that fits, discard the rest.
    Opening the log then finishes the swap. Returns whether one was adopted."""
    if not log_dir.is_dir():
        return False
    adopted = False
    for staging in staging_dirs(log_dir):
        if adopted:
            discard(staging, "superseded by a newer output adopted first")
            continue
        result = check(staging, log_dir)
        if isinstance(result, str):
            discard(staging, result)
            continue
        commit_segment_swaps(log_dir, result.limit, result.outputs)
        _adopted(result, "at_start")
        adopted = True
    return adopted


def adopt_live(plog: PartitionLog, manifest: Manifest, committed_offset: int, now_ms: int) -> bool:
    """Swap a checked output into an open log if it still fits (else discard it): call
    on the thread that appends, with the log's compaction excluded, so nothing changes
    between the check and the swap. Only a run wholly below `committed_offset` is
    replaced; a run with writes still in flight is left for a later call."""
    if manifest.limit > committed_offset:
        # Records of the run may still be undone by a failed write: try again later.
        log.debug("share_state_compaction_waiting", staging=manifest.staging.name)
        return False
    reason = stale_reason(manifest, plog.directory, plog.segment_base_offsets)
    if reason is not None:
        discard(manifest.staging, reason)
        return False
    plog.replace_closed_segments_with(manifest.input_bases, manifest.outputs, now_ms)
    _adopted(manifest, "live")
    return True
