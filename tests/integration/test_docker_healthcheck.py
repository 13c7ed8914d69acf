"""The image's HEALTHCHECK script (the Dockerfile's COPY heredoc) against real brokers.

No Docker engine here: the script is taken out of the Dockerfile and run as the image
runs it, `spool-healthcheck HOST:PORT`. Healthy means the broker answered ApiVersions,
not merely that its port is open.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import REPO_ROOT, Broker, free_port
from tests.unit.test_compose import healthcheck_script

# The script's own ApiVersions wait is 5 s (8 s overall); this only bounds a hang.
RUN_TIMEOUT_S = 30


@pytest.fixture
def healthcheck(tmp_path: Path) -> Path:
    path = tmp_path / "spool-healthcheck"
    path.write_text(healthcheck_script())
    return path


def run_healthcheck(script: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), endpoint],
        cwd=script.parent,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def test_healthcheck_passes_when_the_broker_answers_api_versions(
    healthcheck: Path, broker: Broker
) -> None:
    result = run_healthcheck(healthcheck, broker.bootstrap)
    assert result.returncode == 0, result.stderr
    assert broker.running


def test_healthcheck_fails_when_nothing_listens(healthcheck: Path) -> None:
    result = run_healthcheck(healthcheck, f"127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert "ApiVersions failed" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and never answers (a wedged process)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


def test_healthcheck_fails_when_the_port_is_open_but_nothing_answers(
    healthcheck: Path, silent_listener: int
) -> None:
    result = run_healthcheck(healthcheck, f"127.0.0.1:{silent_listener}")
    assert result.returncode == 1
    assert "ApiVersions failed" in result.stderr
