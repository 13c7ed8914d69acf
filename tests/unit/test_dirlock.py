"""The data directory's `.lock`: one broker per data dir, and tools can tell one runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from persister.dirlock import LOCK_FILE, DataDirInUse, DataDirLock, in_use


def test_a_second_lock_on_a_held_directory_is_refused_with_kafkas_words(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path)
    first.acquire()
    assert in_use(tmp_path)
    with pytest.raises(DataDirInUse) as err:
        DataDirLock(tmp_path).acquire()
    assert f"Failed to acquire lock on file {LOCK_FILE} in {tmp_path}" in str(err.value)
    assert "--data-dir" in str(err.value)
    first.release()
    assert not in_use(tmp_path)
    again = DataDirLock(tmp_path)
    again.acquire()  # released means free again
    again.release()


def test_a_directory_no_broker_ever_used_is_not_in_use(tmp_path: Path) -> None:
    assert not in_use(tmp_path)
    assert not (tmp_path / LOCK_FILE).exists()  # asking creates nothing
