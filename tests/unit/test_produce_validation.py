"""Produce data is checked before it is stored: a compressed batch must decompress,
within a bound, so neither a corrupt batch nor a decompression bomb gets in."""

from __future__ import annotations

import pytest

from broker.partitions import MAX_DECOMPRESSED_BATCH_BYTES, validate_produce_data
from protocol.compression import GZIP, ZSTD
from protocol.errors import CorruptRecordError
from protocol.records import NewRecord, build_batch


@pytest.mark.parametrize("codec", [GZIP, ZSTD])
def test_compressed_batch_that_expands_past_the_bound_is_refused(codec: int) -> None:
    # A few hundred KiB on the wire that would expand past the bound in memory.
    bomb = build_batch(
        [NewRecord(key=None, value=b"\0" * (MAX_DECOMPRESSED_BATCH_BYTES + 1))],
        compression=codec,
    )
    assert len(bomb) < MAX_DECOMPRESSED_BATCH_BYTES // 64
    with pytest.raises(CorruptRecordError, match="limit"):
        validate_produce_data(bomb)


@pytest.mark.parametrize("codec", [GZIP, ZSTD])
def test_compressed_batch_within_the_bound_is_accepted(codec: int) -> None:
    batch = build_batch(
        [NewRecord(key=b"k", value=b"v" * 1000) for _ in range(100)], compression=codec
    )
    buf, batches = validate_produce_data(batch)
    assert bytes(buf) == batch
    assert len(batches) == 1
