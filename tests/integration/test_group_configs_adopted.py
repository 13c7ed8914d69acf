"""A data dir written before group configs moved to the cluster metadata log: its group
configs, in the `groups` log, are honoured after an upgrade (copied to the metadata log
at the first start), and copied only once, so a config deleted since stays deleted
across restarts."""

from __future__ import annotations

from pathlib import Path

from coordinator import group_records
from coordinator.group_config import GroupConfigRecord
from persister.commit import GroupCommit
from persister.coordinator_log import RecordLog
from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import Broker
from tests.integration.test_pg_shared_metadata import described, on

GROUP_RESOURCE = 32
GROUP_CONFIG_SOURCE, DEFAULT_CONFIG_SOURCE = 8, 5
INCREMENTAL_ALTER_CONFIGS = 44
RESET, LOCK = "share.auto.offset.reset", "share.record.lock.duration.ms"


def delete_config(broker: Broker, group: str, key: str) -> None:
    async def alter(client: KafkaClient) -> None:
        answer = await client.request(
            INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": GROUP_RESOURCE,
                        "resource_name": group,
                        "configs": [{"name": key, "config_operation": 1, "value": None}],
                    }
                ],
                "validate_only": False,
            },
        )
        [result] = answer.responses
        assert result.error_code == ErrorCode.none, result

    on(broker, alter)


def test_group_configs_of_an_old_groups_log_are_adopted_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = RecordLog(data / "groups", GroupCommit())
    old.write(
        [
            kv
            for r in (
                GroupConfigRecord("g", RESET, "earliest"),
                GroupConfigRecord("g", LOCK, "20000"),
            )
            for kv in group_records.encode(r)
        ]
    )
    old.close()
    broker = Broker(data, tmp_path / "broker.log")
    broker.start()
    try:
        configs = described(broker, GROUP_RESOURCE, "g")
        assert configs[RESET] == ("earliest", GROUP_CONFIG_SOURCE)
        assert configs[LOCK] == ("20000", GROUP_CONFIG_SOURCE)
        delete_config(broker, "g", RESET)
        broker.restart()
        configs = described(broker, GROUP_RESOURCE, "g")
        # The groups log still holds the old record; the copy was made once.
        assert configs[RESET] == ("latest", DEFAULT_CONFIG_SOURCE)
        assert configs[LOCK] == ("20000", GROUP_CONFIG_SOURCE)
    finally:
        broker.stop()
