"""A started broker loads the Kafka schema classes of every version it advertises
between requests, after it has begun to serve: a start does not wait for them, and a
client's first request of a version does not pay for them later."""

from __future__ import annotations

import asyncio
import re
import time

from protocol.client import KafkaClient
from tests.integration.conftest import Broker, assert_round_trip

API_VERSIONS = 18


async def _advertised_versions(broker: Broker) -> int:
    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-warm-up")
    try:
        response = await client.request(API_VERSIONS, 3, {})
    finally:
        await client.close()
    return sum(k.max_version - k.min_version + 1 for k in response.api_keys)


def _schemas_loaded(broker: Broker, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"schemas_loaded .*versions=(\d+)", broker.log_path.read_text())
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no schemas_loaded in the broker log:\n{broker.log_tail()}")


def test_the_broker_loads_every_advertised_version_and_serves_throughout(
    broker: Broker,
) -> None:
    advertised = asyncio.run(_advertised_versions(broker))
    assert_round_trip(broker, "warm-up", count=20)
    assert _schemas_loaded(broker) == advertised
    assert broker.running
    assert_round_trip(broker, "after-warm-up", count=20)
