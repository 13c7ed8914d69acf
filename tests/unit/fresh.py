"""Run a script in a fresh interpreter: for what a module or a start loads, which the
test process itself has loaded long before (other tests build every kio class)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_fresh(script: str, timeout: float = 120) -> str:
    """The script's last line of output; fails the test if the script fails."""
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1]
