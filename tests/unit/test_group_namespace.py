"""One group-id namespace (coordinator.group_host): a share-group RPC naming a group of
another type is refused as Kafka 4.2 refuses it, and the group's type is told."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from coordinator.assignor import TopicMetadata
from coordinator.group_config import GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.group_host import GroupType
from coordinator.share_persister import InMemoryPersister
from protocol.errors import ErrorCode, KafkaError

T1 = uuid.UUID(int=1)
TOPICS = {T1: TopicMetadata(T1, "t1", 2)}


@dataclass
class Classic:
    """A stand-in classic group: what the namespace reads of one."""

    group_id: str
    group_type: GroupType = GroupType.CLASSIC
    protocol_type: str = ""
    state_name: str = "Empty"
    is_empty: bool = True

    def validate_offset_commit(self, *args: Any, **kwargs: Any) -> None: ...
    def validate_offset_fetch(self, *args: Any) -> None: ...
    def validate_offset_delete(self) -> None: ...
    def validate_delete_group(self) -> None: ...
    def is_subscribed_to_topic(self, topic: str) -> bool:
        return False

    def offset_expiration_base(self, offset: Any) -> int | None:
        return None

    def tombstones(self) -> list[Any]:
        return []


@pytest.fixture
def groups() -> GroupCoordinator:
    coordinator = GroupCoordinator(InMemoryPersister(), lambda: TOPICS, GroupConfigStore())
    coordinator.classic_groups["app"] = Classic("app")
    coordinator.consumer_groups["cg"] = Classic("cg", GroupType.CONSUMER, "consumer")
    return coordinator


async def test_each_id_has_one_type(groups: GroupCoordinator) -> None:
    await groups.heartbeat("queue", "m", 0, ["t1"], None, "c", "/127.0.0.1")
    assert groups.group_type("queue") == GroupType.SHARE
    assert groups.group_type("app") == GroupType.CLASSIC
    assert groups.group_type("cg") == GroupType.CONSUMER
    assert groups.group_type("nobody") is None


@pytest.mark.parametrize("group_id", ["app", "cg"])
async def test_share_rpcs_on_another_types_group_are_group_id_not_found(
    groups: GroupCoordinator, group_id: str
) -> None:
    calls = [
        lambda: groups.heartbeat(group_id, "m", 0, ["t1"], None, "c", "/127.0.0.1"),
        lambda: groups.alter_offsets(group_id, [("t1", [(0, 0)])]),
        lambda: groups.delete_offsets(group_id, ["t1"]),
    ]
    for call in calls:
        with pytest.raises(KafkaError) as refused:
            await call()
        assert refused.value.code == ErrorCode.group_id_not_found
        assert refused.value.message == f"Group {group_id} is not a share group."
    with pytest.raises(KafkaError) as refused:
        groups.describe(group_id)
    assert refused.value.code == ErrorCode.group_id_not_found
    # Nothing was created under the id.
    assert group_id not in groups.groups
    # DeleteGroups deletes a classic or consumer group (Kafka serves every type).
    [(_, error)] = await groups.delete_groups([group_id])
    assert error is None
