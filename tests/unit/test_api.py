"""The API codec: building entities of any version, headers, error responses."""

from __future__ import annotations

import datetime
import struct
import typing
import uuid

import pytest

from broker.handlers.responses import NO_THROTTLE
from protocol import api, request_check
from protocol.errors import ErrorCode
from tests.unit.fresh import run_fresh


def test_build_response_ignores_fields_a_version_lacks() -> None:
    data = {
        "topics": [{"name": "t", "topic_id": uuid.uuid4(), "error_code": 0, "partitions": []}],
        "brokers": [],
        "cluster_id": "c",
    }
    v0 = api.build_response(3, 0, data)
    v12 = api.build_response(3, 12, data)
    assert not hasattr(v0.topics[0], "topic_id")
    assert v12.topics[0].topic_id == data["topics"][0]["topic_id"]


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_response_round_trips_every_version(version: int) -> None:
    body = api.build_response(
        3,
        version,
        {
            "brokers": [{"node_id": 1, "host": "h", "port": 9092}],
            "topics": [
                {
                    "name": "t",
                    "topic_id": uuid.uuid4(),
                    "error_code": 0,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "leader_id": 1,
                            "replica_nodes": [1],
                            "isr_nodes": [1],
                        }
                    ],
                }
            ],
        },
    )
    frame = api.encode_response(3, version, 42, body)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    correlation_id, decoded = api.decode_response(3, version, frame[4:])
    assert correlation_id == 42
    assert decoded == body


def test_api_versions_response_always_uses_header_v0() -> None:
    assert api.response_header_version(18, 3) == 0
    assert api.response_header_version(3, 12) == 1
    assert api.response_header_version(3, 8) == 0


def test_request_header_round_trips_flexible_and_legacy() -> None:
    for key, version in ((3, 12), (3, 4)):
        body = api.build(api.request_class(key, version), {"topics": None})
        frame = api.encode_request(key, version, 7, "client-x", body)[4:]
        header, offset = request_check.decode_request_header(frame)
        assert (header.api_key, header.api_version, header.correlation_id) == (key, version, 7)
        assert header.client_id == "client-x"
        assert api.decode_request(key, version, frame, offset) == body


def test_trailing_bytes_after_a_body_are_ignored_as_kafka_does() -> None:
    body = api.build(api.request_class(3, 12), {"topics": None})
    frame = api.encode_request(3, 12, 1, "c", body)[4:] + b"\x01\x00\x00"
    _, offset = request_check.decode_request_header(frame)
    assert api.decode_request(3, 12, frame, offset) == body


def test_error_response_sets_top_level_error_and_message() -> None:
    body = api.error_response(60, 0, ErrorCode.unsupported_version, "nope")
    assert body.error_code == ErrorCode.unsupported_version
    assert body.error_message == "nope"


def test_unknown_api_key_has_no_schema() -> None:
    assert api.schema_versions(9999) is None
    with pytest.raises(api.UnknownApi):
        api.request_class(9999, 0)


def test_api_table_refuses_versions_kio_cannot_encode() -> None:
    table = api.ApiTable()

    async def handler(ctx: object, req: object) -> None:
        return None

    with pytest.raises(ValueError):
        table.register(3, 0, 99, handler)
    table.register(3, 0, 12, handler)
    assert table.lookup(3, 12) is not None
    assert table.lookup(3, 13) is None


def test_required_nested_entities_get_their_defaults() -> None:
    # A ShareFetch partition without `current_leader` must still encode.
    body = api.build_response(
        78,
        1,
        {
            "responses": [
                {"topic_id": uuid.uuid4(), "partitions": [{"partition_index": 0, "records": b""}]}
            ]
        },
    )
    frame = api.encode_response(78, 1, 5, body)
    _, decoded = api.decode_response(78, 1, frame[4:])
    assert decoded.responses[0].partitions[0].current_leader.leader_id == 0


def test_null_and_empty_arrays_stay_distinct() -> None:
    # Metadata: a null topic list means every topic, an empty one means none.
    every = api.build(api.request_class(3, 12), {"topics": None})
    none = api.build(api.request_class(3, 12), {"topics": []})
    named = api.build(api.request_class(3, 12), {"topics": [{"name": "t"}]})
    assert every.topics is None
    assert none.topics == ()
    assert named.topics[0].name == "t"


def test_build_refuses_a_key_no_version_of_the_entity_has() -> None:
    with pytest.raises(ValueError, match=r"MetadataResponse has no field cluster_idd"):
        api.build_response(3, 12, {"cluster_idd": "c"})


def test_build_refuses_a_misspelt_key_in_a_nested_entity() -> None:
    data = {"topics": [{"name": "t", "partitions": [{"partition_indx": 0}]}]}
    with pytest.raises(ValueError, match=r"MetadataResponsePartition has no field partition_indx"):
        api.build_response(3, 12, data)


def test_build_ignores_a_key_only_other_versions_have() -> None:
    # `topic_id` (v10+) and `cluster_authorized_operations` (v8-10) are real
    # Metadata fields, so v0 ignores them rather than refusing them.
    body = api.build_response(
        3,
        0,
        {
            "cluster_authorized_operations": 0,
            "topics": [{"name": "t", "topic_id": uuid.uuid4()}],
        },
    )
    assert body.topics[0].name == "t"
    assert not hasattr(body, "cluster_authorized_operations")


def test_every_version_accepts_the_fields_of_every_other_version() -> None:
    # The union over Metadata's versions: v0 has none of these three, v13 lacks
    # cluster_authorized_operations (v8-10); both accept all of them.
    data = {"cluster_authorized_operations": 0, "cluster_id": "c", "error_code": 0}
    for version in (0, 13):
        api.build_response(3, version, data)
    assert api.build_response(3, 13, data).cluster_id == "c"


def test_error_response_gives_only_the_error_fields_the_response_has() -> None:
    # DeleteRecords has neither a top-level error code nor message in any version.
    body = api.error_response(21, 0, ErrorCode.unsupported_version, "nope")
    assert body.topics == ()


def test_a_key_only_newer_versions_have_loads_no_more_versions_than_it_takes() -> None:
    # A fresh interpreter (this one has loaded every version by now). Produce v9's
    # response lacks `node_endpoints` (v10+), which the handler writes for every
    # version: checking that key loads the newest version, not all thirteen.
    script = (
        "import sys\n"
        "from protocol import api\n"
        "body = api.build_response(0, 9, {'throttle_time': 5, 'node_endpoints': []})\n"
        "assert body.throttle_time.total_seconds() == 0.005\n"
        "print(sorted(m for m in sys.modules if m.startswith('kio.schema.produce.v')"
        " and m.endswith('.response')))\n"
    )
    loaded = run_fresh(script)
    newest = max(api.schema_versions(0) or (0, 0))
    assert loaded == str(
        sorted({"kio.schema.produce.v9.response", f"kio.schema.produce.v{newest}.response"})
    )


def test_a_key_found_in_another_version_is_remembered_and_a_wrong_one_still_refused() -> None:
    data = {"cluster_authorized_operations": 0}  # Metadata v8-10 only
    api.build_response(3, 0, data)
    api.build_response(3, 0, data)  # known now: accepted without another search
    with pytest.raises(ValueError, match=r"MetadataResponse has no field brokerz in any version$"):
        api.build_response(3, 0, {**data, "brokerz": []})


def _metadata_v13(topic_id: uuid.UUID) -> typing.Any:
    from kio.schema.metadata.v13 import response as m
    from kio.schema.types import BrokerId, TopicName
    from kio.static.primitive import i32

    return m.MetadataResponse(
        throttle_time=NO_THROTTLE,
        brokers=(m.MetadataResponseBroker(node_id=BrokerId(1), host="h", port=i32(9092)),),
        cluster_id="c",
        topics=(
            m.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name=TopicName("t"),
                topic_id=topic_id,
                partitions=(
                    m.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=i32(0),
                        leader_id=BrokerId(1),
                        replica_nodes=(BrokerId(1),),
                    ),
                ),
            ),
        ),
        error_code=ErrorCode.none,
    )


@pytest.mark.parametrize("version", range(0, 14))
def test_a_newest_version_entity_is_encoded_as_every_older_version(version: int) -> None:
    topic_id = uuid.uuid4()
    newest = _metadata_v13(topic_id)
    body = api.at_version(3, version, newest)
    assert type(body) is api.response_class(3, version)
    _, decoded = api.decode_response(3, version, api.encode_response(3, version, 7, body)[4:])
    assert decoded == body
    topic = decoded.topics[0]
    assert (topic.name, topic.partitions[0].replica_nodes) == ("t", (1,))
    assert decoded.brokers[0].port == 9092
    # Fields a version lacks are dropped, those only it has take the schema default.
    assert getattr(topic, "topic_id", topic_id) == topic_id
    if 8 <= version <= 10:
        assert decoded.cluster_authorized_operations == -(2**31)  # not requested


def test_an_entity_of_the_request_version_is_encoded_as_it_is() -> None:
    newest = _metadata_v13(uuid.uuid4())
    assert api.at_version(3, 13, newest) is newest


def test_convert_fills_what_the_older_version_lacks_with_zeros_and_defaults() -> None:
    v0 = api.build_response(3, 0, {"topics": [{"name": "t", "partitions": [{}]}]})
    v13 = api.convert(v0, api.response_class(3, 13))
    assert v13.throttle_time == datetime.timedelta(0)
    assert v13.topics[0].topic_id == uuid.UUID(int=0)
    assert v13.topics[0].partitions[0].leader_epoch == -1  # the schema's default
    assert v13.cluster_id is None


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda: api.build_response(1, 18, {}), id="another API's response"),
        pytest.param(lambda: api.build(api.request_class(3, 13), {}), id="a request"),
        pytest.param(lambda: {"topics": []}, id="a mapping"),
        pytest.param(lambda: [("topics", [])], id="no entity"),
    ],
)
def test_an_answer_that_is_not_a_response_of_the_api_is_rejected(answer: typing.Any) -> None:
    with pytest.raises(
        api.WrongResponse, match=r"the metadata handler answered .*, not a metadata"
    ):
        api.at_version(3, 12, answer())


def test_a_lazy_module_is_imported_when_an_attribute_is_first_read() -> None:
    script = (
        "import sys\n"
        "from protocol import api\n"
        "name = 'kio.schema.describe_cluster.v2.response'\n"
        "lazy = api.lazy_module(name)\n"
        "before = name in sys.modules\n"
        "cls = lazy.DescribeClusterResponse\n"
        "assert cls is sys.modules[name].DescribeClusterResponse\n"
        "assert lazy.DescribeClusterResponse is cls\n"
        "print(before, name in sys.modules)\n"
    )
    assert run_fresh(script) == "False True"


def test_convert_builds_nested_entities_of_the_target_version() -> None:
    v18, v16 = api.response_class(1, 18), api.response_class(1, 16)
    leader = {"leader_id": 3, "leader_epoch": 7}
    body = api.build_response(
        1,
        18,
        {
            "responses": [
                {
                    "topic_id": uuid.uuid4(),
                    "partitions": [
                        {"partition_index": 0, "records": b"r", "aborted_transactions": None},
                        {"partition_index": 1, "current_leader": leader},
                    ],
                }
            ]
        },
    )
    assert type(body) is v18
    converted = api.convert(body, v16)
    default, moved = converted.responses[0].partitions
    for partition in (default, moved):
        assert type(partition).__module__ == v16.__module__
        assert type(partition.current_leader).__module__ == v16.__module__
    # A nested entity at its schema default becomes the target's default; one with
    # values is converted.
    assert default.current_leader is type(default).__dataclass_fields__["current_leader"].default
    assert (moved.current_leader.leader_id, moved.current_leader.leader_epoch) == (3, 7)
    assert (default.records, default.aborted_transactions) == (b"r", None)
    _, decoded = api.decode_response(1, 16, api.encode_response(1, 16, 1, converted)[4:])
    assert decoded == converted
