"""A second broker on a data dir in use exits at once and the first keeps serving."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import REPO_ROOT, Broker, assert_round_trip, free_port


def test_a_second_broker_on_the_same_data_dir_refuses_to_start(broker: Broker) -> None:
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(broker.data_dir),
        ],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert "Failed to acquire lock on file .lock" in second.stdout + second.stderr
    assert broker.running
    assert_round_trip(broker, "before", count=10)
    # kill -9 drops the lock with the process: the restart gets it.
    broker.kill9()
    broker.start()
    assert_round_trip(broker, "after", count=10)
