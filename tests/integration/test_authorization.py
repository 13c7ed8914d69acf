"""ACLs checked on every request, with confluent-kafka clients configured as Kafka users
do: a broker with Kafka's StandardAuthorizer on, `super.users=User:admin`, and PLAIN
users admin and alice in the SASL_PLAINTEXT listener's JAAS entry.

alice without ACLs cannot produce, consume, share-consume, acknowledge, describe,
delete or alter, each answered with the *_AUTHORIZATION_FAILED code Kafka gives; each
ACL granted (by admin, with `spool acls --command-config` over SASL, as with
kafka-acls.sh) makes exactly that work;
share-state RPCs from alice get CLUSTER_AUTHORIZATION_FAILED; a prefixed ACL covers
the topics it names and no others; topics alice may not describe are not in her
Metadata.

The test harness's own helpers (create_topic, earliest, produce_values) use the
PLAINTEXT listener, whose principal User:ANONYMOUS is made a super user here for that.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclOperation,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourcePatternType,
    ResourceType,
)

from protocol.client import ClientSecurity, KafkaClient
from protocol.errors import ErrorCode
from tests.integration.cli_helpers import CLI_TIMEOUT_S
from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    REPO_ROOT,
    Broker,
    create_topic,
    free_port,
    started,
)
from tests.integration.share_helpers import (
    PollLog,
    close_quietly,
    consume,
    earliest,
    heartbeat,
    log_lines,
    produce_values,
    share_ack_body,
    share_consumer,
    share_fetch_body,
    topic_id,
)

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ALICE = "User:alice"


class AclBroker(Broker):
    """PLAINTEXT on `port` (the harness's helpers, as a super user) and SASL_PLAINTEXT on
    `sasl_port`, with ACLs on."""

    def __init__(self, root: Path) -> None:
        settings = {
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "super.users": "User:admin;User:ANONYMOUS",
        }
        super().__init__(root / "data", root / "broker.log", settings)
        self.sasl_port = free_port()
        self.settings["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
        )


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    with started(AclBroker(tmp_path_factory.mktemp("acls"))) as broker:
        yield broker


def client_config(
    broker: AclBroker, user: str = "alice", password: str = "alice-secret", **more: Any
) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{broker.sasl_port}",
        "broker.address.family": "v4",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
        **more,
    }


def alice_admin(broker: AclBroker) -> AdminClient:
    return AdminClient(client_config(broker))


# kafka-acls.sh's spelling of the operations granted here.
OPERATION_FLAGS = {
    AclOperation.READ: "Read",
    AclOperation.WRITE: "Write",
    AclOperation.DESCRIBE: "Describe",
    AclOperation.DELETE: "Delete",
    AclOperation.ALTER: "Alter",
    AclOperation.DESCRIBE_CONFIGS: "DescribeConfigs",
    AclOperation.ALTER_CONFIGS: "AlterConfigs",
    AclOperation.CLUSTER_ACTION: "ClusterAction",
}


def grant(
    broker: AclBroker,
    resource: ResourceType,
    name: str,
    *operations: AclOperation,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
) -> None:
    """admin allows alice `operations` on the resource: `spool acls --add` over SASL,
    authenticated with a --command-config file as kafka-acls.sh is."""
    config = broker.data_dir.parent / "admin.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.username=admin\nsasl.password=admin-secret\n"
    )
    target = {
        ResourceType.TOPIC: ["--topic", name],
        ResourceType.GROUP: ["--group", name],
        ResourceType.BROKER: ["--cluster"],
    }[resource]
    argv = ["acls", "--command-config", str(config), "--add", "--allow-principal", ALICE]
    for op in operations:
        argv += ["--operation", OPERATION_FLAGS[op]]
    if pattern == ResourcePatternType.PREFIXED:
        argv += ["--resource-pattern-type", "prefixed"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            *argv,
            *target,
            "--bootstrap-server",
            sasl_bootstrap(broker),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def sasl_bootstrap(broker: AclBroker) -> str:
    return f"127.0.0.1:{broker.sasl_port}"


def error_code(future: Any) -> int:
    """The Kafka error code an admin future failed with (0: it succeeded)."""
    try:
        future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return 0


def produce_as_alice(broker: AclBroker, topic: str) -> int | None:
    """One record from alice (a plain, non-idempotent producer): the delivery's error
    code, None when delivered."""
    outcome: list[Any] = []
    producer = Producer(
        client_config(broker, **{"enable.idempotence": False, "message.timeout.ms": 15_000})
    )
    producer.produce(topic, b"from alice", on_delivery=lambda err, _msg: outcome.append(err))
    assert producer.flush(30) == 0
    (err,) = outcome
    return None if err is None else int(err.code())


def consume_as_alice(broker: AclBroker, topic: str, group: str) -> tuple[list[bytes], list[int]]:
    """Fetch from offset 0 with assign(): the values read and the error codes seen, until
    a value or an error arrives (bounded)."""
    consumer = Consumer(
        client_config(
            broker,
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            },
        )
    )
    values: list[bytes] = []
    errors: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not values and not errors:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                errors.append(int(msg.error().code()))
            else:
                values.append(msg.value())
    finally:
        consumer.close()
    return values, errors


def alice_wire(broker: AclBroker, scenario: Callable[[KafkaClient], Awaitable[None]]) -> None:
    """Run `scenario` on one raw connection authenticated as alice."""

    async def main() -> None:
        security = ClientSecurity(
            protocol="SASL_PLAINTEXT", mechanism="PLAIN", username="alice", password="alice-secret"
        )
        client = await KafkaClient.connect(
            broker.host, broker.sasl_port, "spool-it-acls", security=security
        )
        try:
            await scenario(client)
        finally:
            await client.close()

    asyncio.run(main())


def denied_lines(broker: AclBroker, *needles: str) -> list[str]:
    return log_lines(broker, "authorization_denied", "principal=User:alice", *needles)


# -- data ----------------------------------------------------------------------------------


def test_produce_needs_write_on_the_topic(acl_broker: AclBroker) -> None:
    topic = "az-produce"
    create_topic(acl_broker, topic)
    assert produce_as_alice(acl_broker, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.WRITE)
    assert produce_as_alice(acl_broker, topic) is None
    # WRITE is not READ. (The consumer looks up its group's coordinator: DESCRIBE on it.)
    grant(acl_broker, ResourceType.GROUP, "az-produce-reader", AclOperation.DESCRIBE)
    _, errors = consume_as_alice(acl_broker, topic, "az-produce-reader")
    assert errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_consume_needs_read_on_the_topic(acl_broker: AclBroker) -> None:
    topic = "az-consume"
    create_topic(acl_broker, topic)
    produce_values(acl_broker, topic, [b"r0", b"r1"])
    # The consumer looks up its group's coordinator (FindCoordinator: DESCRIBE on it).
    _, errors = consume_as_alice(acl_broker, topic, "az-consume-g")
    assert errors == [KafkaError.GROUP_AUTHORIZATION_FAILED]
    grant(acl_broker, ResourceType.GROUP, "az-consume-g", AclOperation.DESCRIBE)
    # DESCRIBE shows the topic; Fetch itself is then refused.
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    _, errors = consume_as_alice(acl_broker, topic, "az-consume-g")
    assert errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert denied_lines(acl_broker, "operation=READ", f"resource={topic}")
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.READ)
    values, errors = consume_as_alice(acl_broker, topic, "az-consume-g")
    assert (values, errors) == ([b"r0"], [])
    # READ is not WRITE.
    assert produce_as_alice(acl_broker, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED


# -- share groups --------------------------------------------------------------------------


def share_consume_as_alice(
    broker: AclBroker, topic: str, group: str, count: int
) -> tuple[list[bytes | None], list[int]]:
    """Share-consume as alice until `count` records or the first error the client raises
    (bounded): the values and the error codes."""
    consumer = share_consumer(broker, group, [topic], mode="implicit", **client_config(broker))
    errors: list[int] = []
    log = PollLog()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(log.deliveries) < count and not errors:
            try:
                consume(
                    consumer, until=lambda log: len(log.deliveries) >= count, timeout=1, log=log
                )
            except KafkaException as exc:
                errors.append(int(exc.args[0].code()))
    finally:
        close_quietly(consumer)
    return log.values(), errors


def test_share_consume_needs_read_on_the_group_and_the_topic(acl_broker: AclBroker) -> None:
    topic, group = "az-share", "az-share-g"
    create_topic(acl_broker, topic)
    earliest(acl_broker, group)
    values = [f"s{i}".encode() for i in range(5)]
    produce_values(acl_broker, topic, values)
    # FindCoordinator needs DESCRIBE on the group.
    got, errors = share_consume_as_alice(acl_broker, topic, group, len(values))
    assert (got, errors) == ([], [KafkaError.GROUP_AUTHORIZATION_FAILED])
    # READ on the group alone: the heartbeat needs DESCRIBE on the subscribed topic.
    grant(acl_broker, ResourceType.GROUP, group, AclOperation.READ)
    got, errors = share_consume_as_alice(acl_broker, topic, group, len(values))
    assert (got, errors) == ([], [KafkaError.TOPIC_AUTHORIZATION_FAILED])
    assert denied_lines(acl_broker, "operation=DESCRIBE", f"resource={topic}")
    # READ on the topic (DESCRIBE implied) as well: it works.
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.READ)
    got, errors = share_consume_as_alice(acl_broker, topic, group, len(values))
    assert (sorted(v or b"" for v in got), errors) == (values, [])


def test_share_fetch_and_acknowledge_check_the_group_and_each_topic(
    acl_broker: AclBroker,
) -> None:
    topic, group = "az-ack", "az-ack-g"
    create_topic(acl_broker, topic)
    earliest(acl_broker, group)
    produce_values(acl_broker, topic, [b"a0", b"a1"])

    async def no_group(client: KafkaClient) -> None:
        tid = await topic_id_as_admin(acl_broker, topic)
        member = str(uuid.uuid4())
        ack = await client.request(
            79, 1, share_ack_body(group, member, 1, {(tid, 0): [ack_batch()]})
        )
        assert ack.error_code == ErrorCode.group_authorization_failed
        fetched = await client.request(78, 1, share_fetch_body(group, member, 0, {(tid, 0): []}))
        assert fetched.error_code == ErrorCode.group_authorization_failed
        hb = await heartbeat(client, group, member, 0, [topic])
        assert hb.error_code == ErrorCode.group_authorization_failed

    alice_wire(acl_broker, no_group)
    grant(acl_broker, ResourceType.GROUP, group, AclOperation.READ)

    async def no_topic(client: KafkaClient) -> None:
        tid = await topic_id_as_admin(acl_broker, topic)
        member = str(uuid.uuid4())
        hb = await heartbeat(client, group, member, 0, [topic])
        assert hb.error_code == ErrorCode.topic_authorization_failed
        fetched = await client.request(78, 1, share_fetch_body(group, member, 0, {(tid, 0): []}))
        assert fetched.error_code == ErrorCode.none
        ((part,),) = [t.partitions for t in fetched.responses if t.topic_id == tid]
        assert (part.error_code, part.acquired_records) == (
            ErrorCode.topic_authorization_failed,
            (),
        )
        ack = await client.request(
            79, 1, share_ack_body(group, member, 1, {(tid, 0): [ack_batch()]})
        )
        assert ack.error_code == ErrorCode.none
        ((acked,),) = [t.partitions for t in ack.responses if t.topic_id == tid]
        assert acked.error_code == ErrorCode.topic_authorization_failed

    alice_wire(acl_broker, no_topic)


def ack_batch() -> dict[str, Any]:
    return {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}


async def topic_id_as_admin(broker: AclBroker, topic: str) -> uuid.UUID:
    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-acls-admin")
    try:
        return await topic_id(client, topic)
    finally:
        await client.close()


def test_share_state_rpcs_are_for_brokers_and_super_users(acl_broker: AclBroker) -> None:
    topic_uuid = uuid.uuid4()
    partitions = [{"partition": 0}]
    rpcs = [(83, 0), (84, 0), (85, 1), (86, 0), (87, 1)]

    async def scenario(client: KafkaClient) -> None:
        for key, version in rpcs:
            body = {
                "group_id": "az-state-g",
                "topics": [{"topic_id": topic_uuid, "partitions": partitions}],
            }
            answer = await client.request(key, version, body)
            (result,) = answer.results
            assert [p.error_code for p in result.partitions] == [
                ErrorCode.cluster_authorization_failed
            ], key

    alice_wire(acl_broker, scenario)
    assert denied_lines(acl_broker, "operation=CLUSTER_ACTION", "resource_type=CLUSTER")
    # CLUSTER_ACTION on the cluster lets alice through.
    grant(acl_broker, ResourceType.BROKER, "kafka-cluster", AclOperation.CLUSTER_ACTION)

    async def allowed(client: KafkaClient) -> None:
        body = {
            "group_id": "az-state-g",
            "topics": [{"topic_id": topic_uuid, "partitions": partitions}],
        }
        answer = await client.request(84, 0, body)
        (result,) = answer.results
        assert result.partitions[0].error_code != ErrorCode.cluster_authorization_failed

    alice_wire(acl_broker, allowed)


# -- describe, delete, alter ---------------------------------------------------------------


def test_describe_delete_and_alter_each_need_their_acl(acl_broker: AclBroker) -> None:
    topic = "az-admin"
    create_topic(acl_broker, topic)
    produce_values(acl_broker, topic, [b"d0", b"d1", b"d2"])
    admin = alice_admin(acl_broker)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

    def describe() -> int:
        return error_code(
            admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT_S)[resource]
        )

    def alter() -> int:
        change = ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        futures = admin.incremental_alter_configs([change], request_timeout=ADMIN_TIMEOUT_S)
        return error_code(next(iter(futures.values())))

    def grow() -> int:
        futures = admin.create_partitions(
            [NewPartitions(topic, 2)], request_timeout=ADMIN_TIMEOUT_S
        )
        return error_code(futures[topic])

    def delete_records() -> int:
        futures = admin.delete_records(
            [TopicPartition(topic, 0, 1)], request_timeout=ADMIN_TIMEOUT_S
        )
        return error_code(next(iter(futures.values())))

    def delete_topic() -> int:
        return error_code(admin.delete_topics([topic], request_timeout=ADMIN_TIMEOUT_S)[topic])

    taf = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert (describe(), alter(), grow(), delete_topic()) == (taf, taf, taf, taf)
    assert topic not in admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
    broker_resource = ConfigResource(ConfigResource.Type.BROKER, "1")
    broker_answer = admin.describe_configs([broker_resource], request_timeout=ADMIN_TIMEOUT_S)
    assert error_code(broker_answer[broker_resource]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED

    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.DESCRIBE_CONFIGS)
    assert (describe(), alter()) == (0, taf)
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.ALTER_CONFIGS)
    assert alter() == 0
    assert grow() == taf
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.ALTER)
    assert grow() == 0
    assert delete_records() == taf
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.DELETE)
    assert delete_records() == 0
    assert delete_topic() == 0


# -- prefixed ACLs and Metadata --------------------------------------------------------------


def test_a_prefixed_acl_covers_its_topics_and_no_others(acl_broker: AclBroker) -> None:
    names = ["team-a", "team-b", "teamx", "az-other"]
    for name in names:
        create_topic(acl_broker, name)
    admin = alice_admin(acl_broker)
    visible = set(admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics)
    assert not visible & set(names)
    grant(
        acl_broker,
        ResourceType.TOPIC,
        "team-",
        AclOperation.WRITE,
        pattern=ResourcePatternType.PREFIXED,
    )
    visible = set(admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics)
    assert visible & set(names) == {"team-a", "team-b"}
    assert produce_as_alice(acl_broker, "team-b") is None
    assert produce_as_alice(acl_broker, "teamx") == KafkaError.TOPIC_AUTHORIZATION_FAILED

    async def named(client: KafkaClient) -> None:
        md = await client.request(
            3,
            12,
            {
                "topics": [{"name": "teamx"}, {"name": "team-a"}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
        got = {t.name: t.error_code for t in md.topics}
        assert got == {"teamx": ErrorCode.topic_authorization_failed, "team-a": ErrorCode.none}

    alice_wire(acl_broker, named)


def test_acls_survive_kill_9(acl_broker: AclBroker) -> None:
    # Last in the module: it restarts the module's broker.
    topic = "az-durable"
    create_topic(acl_broker, topic)
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.WRITE)
    assert produce_as_alice(acl_broker, topic) is None
    acl_broker.kill9()
    acl_broker.start()
    assert produce_as_alice(acl_broker, topic) is None
    other = "az-durable-other"
    create_topic(acl_broker, other)
    assert produce_as_alice(acl_broker, other) == KafkaError.TOPIC_AUTHORIZATION_FAILED
