"""Kafka's record-batch compression codecs (the low 3 bits of a batch's attributes).

All codecs come from `cramjam`. Two Kafka specifics live here:

- snappy: the Java client writes xerial-snappy's "blocking" stream (a 16-byte header
  starting with ``\\x82SNAPPY\\x00``, then big-endian length-prefixed raw snappy
  blocks), librdkafka writes one raw snappy block. We read both and write raw snappy,
  which librdkafka and the Java client (xerial's reader falls back to raw) both read.
- lz4: the standard LZ4 frame format (Kafka fixed its broken frame checksum in 0.10).

Decompression can be bounded with `max_size` so a tiny hostile batch cannot expand
into gigabytes in broker memory.
"""

from __future__ import annotations

import struct
from types import ModuleType
from typing import Final

import cramjam

from protocol.errors import CorruptRecordError, ErrorCode, KafkaError

NONE: Final = 0
GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4

CODEC_NAMES: Final[dict[int, str]] = {
    NONE: "none",
    GZIP: "gzip",
    SNAPPY: "snappy",
    LZ4: "lz4",
    ZSTD: "zstd",
}

XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
# magic (8) + version int32 + min compatible version int32
XERIAL_HEADER_SIZE: Final = 16
_BLOCK_LENGTH = struct.Struct(">i")

# First guess for a bounded decompression buffer, as a multiple of the input size;
# typical Kafka payloads compress 2-10x.
_GUESS_RATIO = 8
_MIN_GUESS = 64 * 1024

_STREAM_CODECS: Final[dict[int, ModuleType]] = {
    GZIP: cramjam.gzip,
    LZ4: cramjam.lz4,
    ZSTD: cramjam.zstd,
}

Buffer = bytes | bytearray | memoryview


def codec_name(codec: int) -> str:
    """Kafka's name for a codec id (`compression.type` values), for messages and configs."""
    return CODEC_NAMES.get(codec, f"unknown({codec})")


def _unsupported(codec: int) -> KafkaError:
    return KafkaError(
        ErrorCode.unsupported_compression_type,
        f"compression codec {codec} is not one of 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd",
    )


def compress(codec: int, data: Buffer) -> bytes:
    """Compress `data` with a Kafka codec."""
    if codec == NONE:
        return bytes(data)
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    module = _STREAM_CODECS.get(codec)
    if module is None:
        raise _unsupported(codec)
    return bytes(module.compress(data))


def decompress(codec: int, data: Buffer, *, max_size: int | None = None) -> bytes:
    """Decompress a batch's records section.

    Raises KafkaError(UNSUPPORTED_COMPRESSION_TYPE) for an unknown codec and
    CorruptRecordError for corrupt input or output larger than `max_size` bytes.
    """
    if codec == NONE:
        if max_size is not None and len(data) > max_size:
            raise _too_large(codec, max_size)
        return bytes(data)
    if codec == SNAPPY:
        return _snappy_decompress(data, max_size)
    module = _STREAM_CODECS.get(codec)
    if module is None:
        raise _unsupported(codec)
    if max_size is None:
        try:
            return bytes(module.decompress(data))
        except cramjam.DecompressionError as e:
            raise CorruptRecordError(f"{codec_name(codec)} data is corrupt: {e}") from None
    return _bounded_decompress(codec, module, data, max_size)


def _too_large(codec: int, max_size: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"{codec_name(codec)} data decompresses to more than the limit of {max_size} bytes"
    )


def _bounded_decompress(codec: int, module: ModuleType, data: Buffer, max_size: int) -> bytes:
    # cramjam's decompress_into stops with an error when the output buffer is full, so
    # memory never exceeds the buffer; grow it geometrically up to max_size + 1 (one
    # byte more than allowed, so "exactly full" means "too large").
    limit = max_size + 1
    size = min(limit, max(_MIN_GUESS, len(data) * _GUESS_RATIO))
    while True:
        out = bytearray(size)
        try:
            written = int(module.decompress_into(data, out))
        except cramjam.DecompressionError as e:
            if size < limit:
                size = min(limit, size * 4)
                continue
            if "whole buffer" in str(e):  # cramjam's word for "output buffer full"
                raise _too_large(codec, max_size) from None
            raise CorruptRecordError(
                f"{codec_name(codec)} data is corrupt or decompresses to more than "
                f"{max_size} bytes: {e}"
            ) from None
        if written > max_size:
            raise _too_large(codec, max_size)
        return bytes(memoryview(out)[:written])


def _snappy_decompress(data: Buffer, max_size: int | None) -> bytes:
    view = memoryview(data)
    if bytes(view[:8]) != XERIAL_MAGIC:
        return _snappy_raw_block(view, max_size)
    # xerial blocking stream: header, then [int32 length][raw snappy block]...
    if len(view) < XERIAL_HEADER_SIZE:
        raise CorruptRecordError("xerial snappy header truncated")
    blocks: list[bytes] = []
    total = 0
    pos = XERIAL_HEADER_SIZE
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError(f"xerial snappy block length truncated at byte {pos}")
        (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise CorruptRecordError(
                f"xerial snappy block at byte {pos - 4} claims {length} bytes, {end - pos} remain"
            )
        remaining = None if max_size is None else max_size - total
        block = _snappy_raw_block(view[pos : pos + length], remaining, max_size)
        total += len(block)
        blocks.append(block)
        pos += length
    return b"".join(blocks)


def _snappy_raw_block(
    view: memoryview, max_size: int | None, reported_limit: int | None = None
) -> bytes:
    try:
        # A raw snappy block starts with its uncompressed length, so the bound is
        # checked before any allocation.
        if max_size is not None and cramjam.snappy.decompress_raw_len(view) > max_size:
            raise _too_large(SNAPPY, max_size if reported_limit is None else reported_limit)
        return bytes(cramjam.snappy.decompress_raw(view))
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(f"snappy data is corrupt: {e}") from None
