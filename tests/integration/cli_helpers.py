"""Helpers for the tests of the `spool` admin CLIs: the CLI run as an operator runs it
(a subprocess), bounded."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import REPO_ROOT, Broker, free_port

CLI_TIMEOUT_S = 60


def spool(broker: Broker | None, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m broker <argv> --bootstrap-server <broker>` (None: a port nobody serves)."""
    bootstrap = broker.bootstrap if broker is not None else f"127.0.0.1:{free_port()}"
    return subprocess.run(
        [sys.executable, "-m", "broker", *argv, "--bootstrap-server", bootstrap],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def ok(broker: Broker, *argv: str) -> str:
    """stdout of a run that must exit 0."""
    proc = spool(broker, *argv)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout
