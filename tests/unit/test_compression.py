import struct

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import compression
from protocol.compression import GZIP, LZ4, NONE, SNAPPY, XERIAL_MAGIC, ZSTD, compress, decompress
from protocol.errors import CorruptRecordError, ErrorCode, KafkaError

ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
COMPRESSING = [GZIP, SNAPPY, LZ4, ZSTD]


def xerial(*chunks: bytes) -> bytes:
    """What the Java client's xerial SnappyOutputStream writes: header, then blocks."""
    out = bytearray(XERIAL_MAGIC + struct.pack(">ii", 1, 1))
    for chunk in chunks:
        block = bytes(cramjam.snappy.compress_raw(chunk))
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


@pytest.mark.parametrize("codec", ALL_CODECS)
@given(data=st.binary(max_size=4096) | st.just(b"spool " * 20_000))
def test_round_trip_every_codec(codec: int, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data
    assert decompress(codec, memoryview(compress(codec, data))) == data


def test_snappy_writes_raw_block_that_librdkafka_and_java_read() -> None:
    packed = compress(SNAPPY, b"hello hello hello")
    assert not packed.startswith(XERIAL_MAGIC)
    assert bytes(cramjam.snappy.decompress_raw(packed)) == b"hello hello hello"


def test_lz4_is_the_standard_frame_format() -> None:
    assert compress(LZ4, b"x" * 100)[:4] == b"\x04\x22\x4d\x18"


def test_gzip_is_a_gzip_stream() -> None:
    assert compress(GZIP, b"x")[:2] == b"\x1f\x8b"


def test_xerial_snappy_from_java_client_decodes() -> None:
    assert decompress(SNAPPY, xerial(b"first block ", b"second block")) == (
        b"first block second block"
    )


def test_xerial_snappy_with_no_blocks_is_empty() -> None:
    assert decompress(SNAPPY, xerial()) == b""


def test_xerial_snappy_block_overrunning_the_stream_is_corrupt() -> None:
    data = xerial(b"payload" * 10)
    with pytest.raises(CorruptRecordError, match="claims"):
        decompress(SNAPPY, data[:-3])


def test_xerial_snappy_truncated_header_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError, match="header"):
        decompress(SNAPPY, XERIAL_MAGIC + b"\x00\x00")


@pytest.mark.parametrize("codec", COMPRESSING)
def test_garbage_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptRecordError) as info:
        decompress(codec, b"definitely not compressed data")
    assert info.value.code == ErrorCode.corrupt_message
    assert compression.codec_name(codec) in str(info.value)


@pytest.mark.parametrize("codec", COMPRESSING)
def test_truncated_stream_is_corrupt(codec: int) -> None:
    packed = compress(codec, bytes(range(256)) * 64)
    with pytest.raises(CorruptRecordError):
        decompress(codec, packed[: len(packed) // 2])


@pytest.mark.parametrize("codec", [99, 5, -1])
def test_unknown_codec_is_unsupported(codec: int) -> None:
    for call in (compress, decompress):
        with pytest.raises(KafkaError) as info:
            call(codec, b"x")
        assert info.value.code == ErrorCode.unsupported_compression_type
        assert not isinstance(info.value, CorruptRecordError)


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_decompression_bomb_is_refused(codec: int) -> None:
    packed = compress(codec, b"\x00" * 2_000_000)
    with pytest.raises(CorruptRecordError, match="more than"):
        decompress(codec, packed, max_size=1_000_000)


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_output_of_exactly_max_size_is_allowed(codec: int) -> None:
    data = bytes(range(256)) * 1000
    assert decompress(codec, compress(codec, data), max_size=len(data)) == data
    with pytest.raises(CorruptRecordError):
        decompress(codec, compress(codec, data), max_size=len(data) - 1)


@pytest.mark.parametrize("codec", COMPRESSING)
def test_bounded_decompression_of_garbage_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(codec, b"not compressed at all" * 3, max_size=10_000_000)


def test_xerial_limit_counts_all_blocks() -> None:
    data = xerial(b"a" * 600, b"b" * 600)
    assert len(decompress(SNAPPY, data, max_size=1200)) == 1200
    with pytest.raises(CorruptRecordError, match="1199"):
        decompress(SNAPPY, data, max_size=1199)
