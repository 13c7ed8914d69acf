"""/health and /metrics while the storage database is unavailable (broker.metrics reads
the engine's `unavailable` reason and failed-commit count)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from broker.metrics import SERVING, BrokerMetrics, MetricsServer, StorageHealth, collect
from persister.pg_storage import PgStorage
from persister.storage import FILE_STORAGE
from tests.unit.test_metrics import bare_broker, samples


@dataclass
class Engine:
    unavailable: str | None = None
    failed_commits: int = 0


def _server(engine: Engine) -> MetricsServer:
    m = BrokerMetrics()
    m.state = SERVING
    m.storage = engine
    server = MetricsServer("127.0.0.1", 0, bare_broker(m))
    server.loop = asyncio.get_running_loop()
    return server


async def test_health_is_503_with_the_reason_while_commits_fail_and_200_after() -> None:
    engine = Engine("storage unavailable: commit to postgresql failed: connection refused", 3)
    server = _server(engine)
    status, _, body = await asyncio.to_thread(server.health_response)
    assert status == 503
    doc = json.loads(body)
    assert doc["status"] == "storage_unavailable"
    assert doc["reason"] == engine.unavailable
    engine.unavailable = None
    status, _, body = await asyncio.to_thread(server.health_response)
    assert status == 200 and json.loads(body)["status"] == "serving"


def test_metrics_show_the_storage_state_and_failed_commits() -> None:
    engine = Engine("storage unavailable: x", 7)
    m = BrokerMetrics()
    m.storage = engine
    found = samples(collect(bare_broker(m)))
    assert found[("spool_storage_available", ())] == 0
    assert found[("spool_storage_commit_failures_total", ())] == 7
    engine.unavailable = None
    assert samples(collect(bare_broker(m)))[("spool_storage_available", ())] == 1


def test_only_an_engine_that_can_be_unavailable_is_watched() -> None:
    assert isinstance(PgStorage("postgresql://u@h/db"), StorageHealth)
    assert not isinstance(FILE_STORAGE, StorageHealth)
    assert PgStorage("postgresql://u@h/db").unavailable is None
