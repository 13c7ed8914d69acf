"""Suite-wide settings.

Property tests explore new random examples on a developer's machine; on CI
(`CI=true`) they run a fixed, derandomized set, so a submission is judged on the same
examples every time and a failure there reproduces locally with `CI=true make test`.
Neither profile has a per-example deadline: how long an example takes is the machine's
load, not the behaviour under test (hypothesis's default of 200 ms failed a codec's
property test on a busy 2-core machine).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import settings


def _cache_bytecode_of_subprocesses() -> None:
    """Let the Python processes the tests start (brokers, CLI tools: well over a thousand
    in a run) reuse compiled bytecode. With PYTHONDONTWRITEBYTECODE set (to keep
    __pycache__ out of the tree), each would compile spool's modules again: a broker
    took 1.0 s of CPU to start accepting connections, 0.6 s with the bytecode cached
    (on a 2-core machine the suite's CPU, not its waits, bounds it). They write it under
    PYTHONPYCACHEPREFIX instead, outside the tree (Python checks each file against its
    source, as in __pycache__); this process is left as it started."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    prefix = Path(tempfile.gettempdir()) / f"spool-test-pycache-{os.getuid()}"
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(prefix))


_cache_bytecode_of_subprocesses()

settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "local")
