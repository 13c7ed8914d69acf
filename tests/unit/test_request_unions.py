"""The request unions and response modules of consumer groups, offsets and
WriteTxnMarkers: each union holds exactly the versions
Kafka 4.2 serves, and each response module answers the versions its handler will
build it for. Once an API is in the handler table, test_handler_table checks its
union against the registered versions too."""

from __future__ import annotations

import typing
import uuid
from typing import Any

import pytest
from kio.schema.index import api_key_map
from kio.static.constants import EntityType

from broker.handlers import requests, responses
from protocol import api

# union -> (api key, Kafka 4.2's min and max version: the *Request.json validVersions)
PENDING = {
    "JoinGroupRequest": (11, 0, 9),
    "SyncGroupRequest": (14, 0, 5),
    "HeartbeatRequest": (12, 0, 4),
    "LeaveGroupRequest": (13, 0, 5),
    "DescribeGroupsRequest": (15, 0, 6),
    "OffsetCommitRequest": (8, 2, 10),
    "OffsetFetchRequest": (9, 1, 10),
    "OffsetDeleteRequest": (47, 0, 0),
    "ConsumerGroupHeartbeatRequest": (68, 0, 1),
    "ConsumerGroupDescribeRequest": (69, 0, 1),
    "WriteTxnMarkersRequest": (27, 1, 2),
}


@pytest.mark.parametrize("union", PENDING)
def test_union_is_exactly_the_versions_kafka_serves(union: str) -> None:
    key, low, high = PENDING[union]
    hint = getattr(requests, union)
    members = set(typing.get_args(hint)) or {hint}
    assert members == {api.request_class(key, v) for v in range(low, high + 1)}


_KEYS = {name: key for key, name in api_key_map.items()}


@pytest.mark.parametrize("name", [n for n in responses.__all__ if n != "NO_THROTTLE"])
def test_each_response_module_is_that_api_version(name: str) -> None:
    # The lazily loaded module is the one the TYPE_CHECKING import names.
    api_name, _, version = name.rpartition("_v")
    cls = api.response_class(_KEYS[api_name], int(version))
    assert getattr(getattr(responses, name), cls.__name__) is cls
    assert cls.__type__ == EntityType.response


TOPIC_ID = uuid.UUID(int=7)


def _partition(**extra: Any) -> dict[str, Any]:
    return {"partition_index": 3, "committed_offset": 42, "metadata": "m", **extra}


# (api key, response module built, the request versions it answers, data, read back)
BUILDS: list[tuple[int, Any, range, dict[str, Any], Any]] = [
    (
        8,
        responses.offset_commit_v9,
        range(2, 10),
        {"topics": [{"name": "t", "partitions": [{"partition_index": 3}]}]},
        lambda r: (r.topics[0].name, r.topics[0].partitions[0].partition_index),
    ),
    (
        8,
        responses.offset_commit_v10,
        range(10, 11),
        {"topics": [{"topic_id": TOPIC_ID, "partitions": [{"partition_index": 3}]}]},
        lambda r: (r.topics[0].topic_id, r.topics[0].partitions[0].partition_index),
    ),
    (
        9,
        responses.offset_fetch_v7,
        range(1, 8),
        {"topics": [{"name": "t", "partitions": [_partition()]}]},
        lambda r: (r.topics[0].name, r.topics[0].partitions[0].committed_offset),
    ),
    (
        9,
        responses.offset_fetch_v9,
        range(8, 10),
        {"groups": [{"group_id": "g", "topics": [{"name": "t", "partitions": [_partition()]}]}]},
        lambda r: (
            r.groups[0].topics[0].name,
            r.groups[0].topics[0].partitions[0].committed_offset,
        ),
    ),
    (
        9,
        responses.offset_fetch_v10,
        range(10, 11),
        {
            "groups": [
                {"group_id": "g", "topics": [{"topic_id": TOPIC_ID, "partitions": [_partition()]}]}
            ]
        },
        lambda r: (
            r.groups[0].topics[0].topic_id,
            r.groups[0].topics[0].partitions[0].committed_offset,
        ),
    ),
    (
        11,
        responses.join_group_v9,
        range(0, 10),
        {"member_id": "m-1", "protocol_name": "range", "generation_id": 4},
        lambda r: (r.member_id, r.protocol_name, r.generation_id),
    ),
]


@pytest.mark.parametrize(
    ("key", "module", "versions", "data", "read"),
    BUILDS,
    ids=[f"{api.api_name(b[0])}-v{b[2].start}-{b[2].stop - 1}" for b in BUILDS],
)
def test_a_built_answer_reaches_every_version_it_answers(
    key: int, module: Any, versions: range, data: dict[str, Any], read: Any
) -> None:
    # OffsetCommit and OffsetFetch changed a field's kind (topic names to ids; one group
    # to a list), so one module cannot answer every version: each answers exactly the
    # versions that carry what it holds, through `at_version` onto the wire and back.
    built = api.build(
        getattr(module, f"{api.api_name(key).title().replace('_', '')}Response"), data
    )
    expected = read(built)
    for version in versions:
        frame = api.encode_response(key, version, 5, api.at_version(key, version, built))
        _, decoded = api.decode_response(key, version, frame[4:])
        assert read(decoded) == expected, version
