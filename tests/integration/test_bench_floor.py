"""The latency bench's floor: the bare relay passes every message through
whichever way it syncs, and leaves nothing behind in the directory it wrote to."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.latency import RELAY_SYNCS, relay_floor_ms


@pytest.mark.parametrize("sync", RELAY_SYNCS)
def test_the_relay_hands_every_message_over_and_cleans_up(tmp_path: Path, sync: str) -> None:
    latencies = relay_floor_ms(tmp_path, sync, records=50, interval_ms=1.0)
    assert len(latencies) == 50
    assert all(ms > 0 for ms in latencies)
    assert list(tmp_path.iterdir()) == []
