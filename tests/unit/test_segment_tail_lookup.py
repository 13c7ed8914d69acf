"""A segment finds the batches appended since its last offset-index entry without
walking their headers (a read at the tail: a consumer caught up, a share fetch woken by
a produce). Whatever the appends, truncations and reopenings, every offset translates to
the same batch as the walk from the index would find."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from persister.segment import LogSegment, scan_batches
from protocol.records import NewRecord, build_batch, iter_batches

INTERVAL = 512  # index.interval.bytes, small so that entries come often


def _walked(segment: LogSegment, offset: int) -> tuple[int, int] | None:
    start = segment.offset_index.lookup(offset - segment.base_offset)
    for pos, header in scan_batches(segment.fd, start, segment.size, validate=False):
        if header.last_offset >= offset:
            return pos, header.base_offset
    return None


def _append(segment: LogSegment, counts: list[int]) -> None:
    data = bytearray()
    for count in counts:
        records = [NewRecord(None, b"x" * 40) for _ in range(count)]
        data += build_batch(records, base_offset=segment.next_offset + _records(data))
    batches = list(iter_batches(bytes(data), validate=False))
    segment.append(data, batches, now_ms=0, index_interval_bytes=INTERVAL)


def _records(data: bytearray) -> int:
    return sum(
        h.last_offset - h.base_offset + 1 for _, h in iter_batches(bytes(data), validate=False)
    )


def _check(segment: LogSegment) -> None:
    for offset in range(segment.base_offset, segment.next_offset + 2):
        found = segment.translate_offset(offset)
        got = None if found is None else (found[0], found[1].base_offset)
        assert got == _walked(segment, offset), offset


steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.integers(1, 5), min_size=1, max_size=4)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("reopen"), st.none()),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_tail_lookups_agree_with_walking_the_headers(plan: list[tuple[str, object]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        segment = LogSegment.create(directory, 100, now_ms=0)
        try:
            for action, arg in plan:
                if action == "append":
                    assert isinstance(arg, list)
                    _append(segment, arg)
                elif action == "truncate":
                    assert isinstance(arg, float)
                    span = segment.next_offset - segment.base_offset
                    batch = _walked(segment, segment.base_offset + int(span * arg))
                    if batch is not None:  # cut at the start of the batch holding it
                        segment.truncate_to(batch[1])
                else:
                    segment.close()
                    segment, _, _ = LogSegment.load(
                        directory, 100, 0, trusted=False, index_interval_bytes=INTERVAL
                    )
                _check(segment)
        finally:
            segment.close()
