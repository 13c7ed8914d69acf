"""Suite-wide settings.

Property tests explore new random examples on a developer's machine; on CI
(`CI=true`) they run a fixed, derandomized set, so a submission is judged on the same
examples every time and a failure there reproduces locally with `CI=true make test`.
Neither profile has a per-example deadline: how long an example takes is the machine's
load, not the behaviour under test (hypothesis's default of 200 ms failed a codec's
property test on a busy 2-core machine).
"""

from __future__ import annotations

import collections
import faulthandler
import os
import random
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
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


# --- a hung test says where it hung ------------------------------------------------
#
# pytest-timeout's thread method ends the worker of a test that outlives its timeout,
# and its own stack dump is lost with an xdist worker's output. faulthandler writes
# every thread's stack to the stderr this process started with (not the captured one)
# a few seconds before, so the run's log says where the test hung.

_STACKS_BEFORE_TIMEOUT_S = 5.0
_stderr_at_start: Any = None


def pytest_configure(config: pytest.Config) -> None:
    global _stderr_at_start
    _stderr_at_start = os.fdopen(os.dup(2), "w")


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.cancel_dump_traceback_later()
    if _stderr_at_start is not None:
        _stderr_at_start.close()


def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    if settings.timeout and settings.timeout > _STACKS_BEFORE_TIMEOUT_S and _stderr_at_start:
        faulthandler.dump_traceback_later(
            settings.timeout - _STACKS_BEFORE_TIMEOUT_S, file=_stderr_at_start
        )


def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    faulthandler.cancel_dump_traceback_later()


# --- librdkafka consumers whose close() never returns ------------------------------
#
# A consumer's close() waits inside librdkafka for its group to let it go: the final
# commit, LeaveGroup, ShareAcknowledge, each bounded by socket.timeout.ms (10 s in these
# tests). Past that, nothing the broker owes is awaited, yet librdkafka's close has been
# seen to hang for good (confluent-kafka-python#1667), holding the test's main thread
# where no timeout reaches it. The tests' consumers close in a thread, waited on for
# CLOSE_WAIT_S: what close raises is raised; a close still running then is left to itself
# with a warning, and the test goes on to check what it checks.

CLOSE_WAIT_S = 60.0


class ClientCloseHung(UserWarning):
    """A librdkafka client's close() did not return within CLOSE_WAIT_S."""


def close_bounded(close: Callable[[], None], what: str) -> None:
    """Run `close` in a daemon thread; wait at most CLOSE_WAIT_S for it."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            close()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, name=f"{what}.close", daemon=True)
    thread.start()
    thread.join(CLOSE_WAIT_S)
    if thread.is_alive():
        warnings.warn(
            f"{what}.close() still running after {CLOSE_WAIT_S:.0f} s (socket.timeout.ms is "
            "10 s): left to finish on its own",
            ClientCloseHung,
            stacklevel=3,
        )
        return
    if raised:
        raise raised[0]


class _Consumer(confluent_kafka.Consumer):  # type: ignore[misc]
    def close(self) -> None:
        close_bounded(super().close, "Consumer")


class _ShareConsumer(confluent_kafka.ShareConsumer):  # type: ignore[misc]
    def close(self) -> None:
        close_bounded(super().close, "ShareConsumer")


# Before any test module imports them (this conftest is loaded first).
confluent_kafka.Consumer = _Consumer  # type: ignore[misc]
confluent_kafka.ShareConsumer = _ShareConsumer  # type: ignore[misc]


# --- pytest-xdist: how `make test` spreads the suite over worker processes ---------
#
# A work unit is a test file (its module-scoped brokers start once, on one worker), and
# the Spark tests are one unit (each worker running one would start a JVM of its own).
# Units are handed out biggest first (an estimate of their time, below), so the run
# does not end waiting on one long file that started last; the many short unit-test
# files fill the gaps at the end.

SPARK_DIR = "tests/spark/"
# Rough seconds per test, by directory (a 3-worker run on 2 cores: the 30 Spark tests
# took 885 s, their JVM's work and the brokers some of them drive; the integration
# tests 3.6 s each on average, starting broker processes and waiting on clients; a
# unit test starts nothing).
SECONDS_PER_TEST = {"tests/integration/": 4.0, SPARK_DIR: 30.0}
SECONDS_PER_UNIT_TEST = 0.1


def work_unit(nodeid: str) -> str:
    """The unit of work (one worker runs all of it) that test `nodeid` belongs to."""
    if nodeid.startswith(SPARK_DIR):
        return SPARK_DIR
    return nodeid.split("::", 1)[0]


def _seconds_per_test(nodeid: str) -> float:
    for prefix, seconds in SECONDS_PER_TEST.items():
        if nodeid.startswith(prefix):
            return seconds
    return SECONDS_PER_UNIT_TEST


def _same_hash_seed_in_every_worker() -> None:
    """Every xdist worker must collect the same test ids, and some ids show sets, whose
    order follows the string hash seed Python picks at random per process. This process
    picks one for the processes it starts (workers, and brokers, which do not mind):
    random per run, as before, but one for all of a run."""
    os.environ.setdefault("PYTHONHASHSEED", str(random.randint(1, 2**32 - 1)))


_same_hash_seed_in_every_worker()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, order the tests by work unit, biggest estimate first (every
    worker sorts the same collection the same way, as xdist requires); a test's place
    within its unit is unchanged."""
    if not hasattr(config, "workerinput"):
        return
    estimate: dict[str, float] = collections.defaultdict(float)
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        unit = work_unit(item.nodeid)
        estimate[unit] += _seconds_per_test(item.nodeid)
        first_seen.setdefault(unit, i)

    def place(item: pytest.Item) -> tuple[float, int]:
        unit = work_unit(item.nodeid)
        return -estimate[unit], first_seen[unit]

    items.sort(key=place)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Units as `work_unit` says, handed out in the order the workers collected them."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def remove_node(self, node: Any) -> str | None:
            """A worker that crashed (or was ended by pytest-timeout) gives its units back
            without the test it was running: xdist's own version hands that test to the
            next worker too, which hangs the same way, worker after worker."""
            workload = self.assigned_work.pop(node)
            pending = [
                nodeid for unit in workload.values() for nodeid, done in unit.items() if not done
            ]
            if not pending:
                return None
            crashed: str = pending[0]
            workload[self._split_scope(crashed)][crashed] = True
            self.workqueue.update(
                (scope, unit) for scope, unit in workload.items() if not all(unit.values())
            )
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    config.option.loadscopereorder = False
    return WorkUnitScheduling(config, log)
