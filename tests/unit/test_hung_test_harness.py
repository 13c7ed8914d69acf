"""The suite's own harness: a test that hangs where no signal reaches Python is ended,
reported once, says where it hung, and the rest of its file still runs; a librdkafka
consumer's close() that never returns does not hold its test.

A copy of tests/conftest.py (the xdist scheduling and the stack dump) runs a small
suite in a subprocess with a short pytest-timeout, on two xdist workers, as `make test`
runs the real one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import confluent_kafka
import confluent_kafka.cimpl
import pytest

from tests import conftest as suite

TESTS_DIR = Path(__file__).resolve().parents[1]

HANGING = textwrap.dedent(
    """
    import signal
    import time


    def test_before():
        pass


    def test_hangs_with_sigalrm_blocked():
        # SIGALRM blocked: pytest-timeout's signal method could never end this test.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(600)


    def test_after():
        pass
    """
)


def test_a_hung_test_fails_once_with_its_stack_and_the_rest_of_its_file_runs(
    tmp_path: Path,
) -> None:
    shutil.copy(TESTS_DIR / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_hang.py").write_text(HANGING)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntimeout = 8\ntimeout_method = thread\n"
        "asyncio_default_fixture_loop_scope = function\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-rA"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "PASSED test_hang.py::test_before" in out, out
    assert "PASSED test_hang.py::test_after" in out, out
    # Reported once: xdist's own rescheduling ran the hung test again on each new worker.
    assert out.count("FAILED test_hang.py::test_hangs_with_sigalrm_blocked") == 1, out
    assert "1 failed, 2 passed" in out, out
    # The stacks, dumped before the worker was ended, name the line it hung on.
    assert "in test_hangs_with_sigalrm_blocked" in out, out


def test_a_consumer_close_that_never_returns_is_left_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(suite, "CLOSE_WAIT_S", 0.2)
    release = threading.Event()
    try:
        with pytest.warns(suite.ClientCloseHung, match="still running"):
            suite.close_bounded(lambda: release.wait(30) and None, "Consumer")
    finally:
        release.set()


def test_what_a_consumer_close_raises_is_raised() -> None:
    def close() -> None:
        raise RuntimeError("Consumer closed")

    with pytest.raises(RuntimeError, match="Consumer closed"):
        suite.close_bounded(close, "Consumer")


def test_the_tests_consumers_close_bounded() -> None:
    from confluent_kafka import Consumer, ShareConsumer

    assert issubclass(Consumer, confluent_kafka.cimpl.Consumer)
    assert Consumer.close is not confluent_kafka.cimpl.Consumer.close
    assert ShareConsumer.close is not confluent_kafka.cimpl.ShareConsumer.close
