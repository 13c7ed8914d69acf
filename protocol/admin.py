"""A small asyncio admin client: what `spool share-groups`, `spool topics` and `spool
configs` need, spoken with kio entities through `protocol.client.KafkaClient`.

It bootstraps from `host:port[,host:port]`, learns the brokers from Metadata, keeps one
connection per broker, and sends each request at the highest version both it and the
broker support (ApiVersions). Group requests go to the group's coordinator
(FindCoordinator, key type GROUP); NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS and
COORDINATOR_NOT_AVAILABLE look the coordinator up again and retry with backoff, as
Kafka's admin client does, until the call's timeout. Every other failure is an
`AdminError` carrying Kafka's error name and message.

Connections are secured as `ClientSecurity` says (security.protocol, sasl.mechanism,
ssl.*): TLS, then ApiVersions, SaslHandshake and SaslAuthenticate, the Kafka client's
order. A refused login is SASL_AUTHENTICATION_FAILED with the broker's message; a failed
TLS handshake SSL_HANDSHAKE_FAILED saying what to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.consumer_protocol_assignment import v0 as assignment_v0
from kio.schema.consumer_protocol_assignment import v1 as assignment_v1
from kio.schema.consumer_protocol_assignment import v2 as assignment_v2
from kio.schema.consumer_protocol_assignment import v3 as assignment_v3
from kio.serial import entity_reader

from protocol import api
from protocol.client import (
    AuthenticationError,
    ClientError,
    ClientSecurity,
    KafkaClient,
    SecurityConfigError,
    TlsError,
)
from protocol.errors import ErrorCode

T = TypeVar("T")

API_VERSIONS, METADATA, FIND_COORDINATOR, LIST_GROUPS = 18, 3, 10, 16
LIST_OFFSETS, CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 2, 19, 20, 37
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, DELETE_GROUPS = 32, 44, 42
SHARE_GROUP_DESCRIBE = 77
DESCRIBE_CLUSTER = 60
LIST_TRANSACTIONS = 66
DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS = 90, 91, 92

# The versions this client can build and read, per api key: the broker's ApiVersions
# range is intersected with these and the highest common version is used.
CLIENT_VERSIONS: dict[int, tuple[int, int]] = {
    METADATA: (1, 13),  # v1+: a null topic list means all topics
    FIND_COORDINATOR: (1, 6),
    LIST_GROUPS: (5, 5),  # v5: the type filter (KIP-848), needed to list share groups
    LIST_OFFSETS: (1, 11),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (1, 4),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DELETE_GROUPS: (0, 2),
    SHARE_GROUP_DESCRIBE: (1, 1),
    DESCRIBE_CLUSTER: (0, 2),
    DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),
    ALTER_SHARE_GROUP_OFFSETS: (0, 0),
    DELETE_SHARE_GROUP_OFFSETS: (0, 0),
    LIST_TRANSACTIONS: (0, 2),  # v1 the duration filter, v2 the id pattern
}
OFFSET_COMMIT, OFFSET_FETCH, OFFSET_DELETE = 8, 9, 47
DESCRIBE_GROUPS, CONSUMER_GROUP_DESCRIBE = 15, 69
CLIENT_VERSIONS.update(
    {
        OFFSET_COMMIT: (9, 9),  # generation -1 and member "": an admin commit (KIP-848)
        OFFSET_FETCH: (8, 9),  # v8+: groups in a list, v9 the member id and epoch
        OFFSET_DELETE: (0, 0),
        DESCRIBE_GROUPS: (5, 5),  # Kafka's admin client; v6 answers GROUP_ID_NOT_FOUND
        CONSUMER_GROUP_DESCRIBE: (0, 1),  # v1: MemberType
    }
)
API_VERSIONS_VERSION = 3

# ListOffsets timestamps with a special meaning (Kafka's ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1

# DescribeConfigs / IncrementalAlterConfigs resource types and operations (KIP-339).
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_GROUP = 2, 4, 32
OP_SET, OP_DELETE = 0, 1
# DescribeConfigs config sources (KIP-226), as Kafka's ConfigEntry.ConfigSource names them.
CONFIG_SOURCES = {
    0: "UNKNOWN",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    7: "CLIENT_METRICS_CONFIG",
    8: "GROUP_CONFIG",
}

COORDINATOR_ERRORS = frozenset(
    {
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
    }
)
BACKOFF_MS = 100
BACKOFF_MAX_MS = 1000


class AdminError(Exception):
    """A request failed: Kafka's error name (e.g. NON_EMPTY_GROUP) and a message."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message

    @classmethod
    def of(cls, code: ErrorCode, message: str | None, context: str) -> AdminError:
        return cls(code.name.upper(), message or context)


def check(code: ErrorCode, message: str | None, context: str) -> None:
    """Raise the AdminError for a non-zero error code; `context` says what failed."""
    if code != ErrorCode.none:
        raise AdminError.of(code, message, context)


class _Retry(Exception):
    """A coordinator error: look the coordinator up again and retry."""

    def __init__(self, code: ErrorCode, message: str | None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


# --- results --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """DescribeCluster's answer: the controller id is the one the asked broker reports
    (-1: none)."""

    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


@dataclass(frozen=True, slots=True)
class CoordinatorInfo:
    """FindCoordinator's answer for one key: the node, or the error naming why not."""

    key: str
    key_type: int
    node: Node | None
    error: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID | None
    is_internal: bool
    partitions: tuple[PartitionInfo, ...]


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str
    type: str
    protocol_type: str = ""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A committed offset as OffsetFetch answers it (Kafka's OffsetAndMetadata)."""

    offset: int
    leader_epoch: int | None
    metadata: str | None


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    """A member of a consumer or classic group. The epochs and the target assignment
    are ConsumerGroupDescribe's (None from DescribeGroups); `upgraded` says whether a
    member of a consumer group speaks the consumer protocol (None: not known)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: dict[str, tuple[int, ...]]
    target_assignment: dict[str, tuple[int, ...]] | None = None
    member_epoch: int | None = None
    upgraded: bool | None = None


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    """Kafka's ConsumerGroupDescription: `type` is "consumer" (ConsumerGroupDescribe)
    or "classic" (DescribeGroups); `state` is Kafka's GroupState name (Empty, Stable,
    PreparingRebalance, ..., Dead for a group that does not exist)."""

    group_id: str
    type: str
    protocol_type: str
    state: str
    assignor: str
    coordinator: Node
    members: tuple[ConsumerMember, ...]
    group_epoch: int | None = None
    target_assignment_epoch: int | None = None

    @property
    def is_simple(self) -> bool:
        return self.type == "classic" and self.protocol_type == ""


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """A transaction as ListTransactions lists it, with the broker that coordinates it."""

    transactional_id: str
    coordinator: int
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class ShareMember:
    member_id: str
    member_epoch: int
    client_id: str
    host: str
    rack: str | None
    subscribed: tuple[str, ...]
    assignment: dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class ShareGroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    coordinator: Node
    members: tuple[ShareMember, ...]


@dataclass(frozen=True, slots=True)
class SharePartitionOffset:
    """A share-partition's state as DescribeShareGroupOffsets reports it; None where
    the partition has no state yet (Kafka answers -1)."""

    topic: str
    partition: int
    start_offset: int | None
    leader_epoch: int | None
    lag: int | None


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: str


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: str
    read_only: bool
    sensitive: bool
    synonyms: tuple[ConfigSynonym, ...] = ()

    @property
    def is_default(self) -> bool:
        return self.source == "DEFAULT_CONFIG"  # as Kafka's ConfigEntry.isDefault()


@dataclass(frozen=True, slots=True)
class ListedOffset:
    offset: int
    timestamp: int


TopicPartition = tuple[str, int]


# --- bootstrap addresses ------------------------------------------------------------------


def parse_bootstrap(text: str) -> list[tuple[str, int]]:
    """`host:port[,host:port]` -> addresses; ValueError with the bad part named."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        part = part.strip()
        host, sep, port = part.rpartition(":")
        if not part or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"invalid bootstrap server {part!r}: expected HOST:PORT")
        out.append((host.strip("[]"), int(port)))
    return out


def _coordinator_info(key: str, key_type: int, answer: Any) -> CoordinatorInfo:
    code: ErrorCode = answer.error_code
    if code != ErrorCode.none:
        return CoordinatorInfo(key, key_type, None, code.name.upper(), answer.error_message)
    return CoordinatorInfo(key, key_type, Node(int(answer.node_id), answer.host, int(answer.port)))


# --- consumer groups: states, assignments, messages ---------------------------------------

CONSUMER_PROTOCOL_TYPE = "consumer"
# Kafka's GroupState names; the wire carries them in any case.
GROUP_STATES = (
    "Unknown",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
    "Empty",
    "Assigning",
    "Reconciling",
    "NotReady",
)
_STATES_BY_UPPER = {s.upper(): s for s in GROUP_STATES}


def group_state_name(text: str) -> str:
    """Kafka's GroupState.parse: a state by its name in any case, else Unknown."""
    return _STATES_BY_UPPER.get(text.upper(), "Unknown")


def parse_consumer_assignment(data: bytes) -> dict[str, tuple[int, ...]]:
    """A classic member's assignment (ConsumerProtocolAssignment: an int16 version,
    then the data): topic -> partitions. Empty or unreadable bytes are no assignment;
    a newer version is read as v3, whose fields every later one keeps first."""
    if len(data) < 2:
        return {}
    version = min(max(int.from_bytes(data[:2], "big", signed=True), 0), 3)
    try:
        assignment, _ = _ASSIGNMENT_READERS[version](memoryview(data), 2)
    except Exception:
        return {}
    out: dict[str, list[int]] = {}
    for tp in assignment.assigned_partitions:
        out.setdefault(tp.topic, []).extend(int(p) for p in tp.partitions)
    return {t: tuple(sorted(ps)) for t, ps in out.items()}


_ASSIGNMENT_READERS: dict[int, Callable[[Any, int], tuple[Any, int]]] = {
    0: entity_reader(assignment_v0.ConsumerProtocolAssignment),
    1: entity_reader(assignment_v1.ConsumerProtocolAssignment),
    2: entity_reader(assignment_v2.ConsumerProtocolAssignment),
    3: entity_reader(assignment_v3.ConsumerProtocolAssignment),
}

# Kafka's default messages (Errors.message()) for the errors the group tools print.
_ERROR_MESSAGES = {
    ErrorCode.non_empty_group: "The group is not empty.",
    ErrorCode.group_id_not_found: "The group id does not exist.",
    ErrorCode.group_subscribed_to_topic: (
        "Deleting offsets of a topic is forbidden while the consumer group is actively "
        "subscribed to it."
    ),
    ErrorCode.unknown_topic_or_partition: "This server does not host this topic-partition.",
    ErrorCode.unknown_member_id: "The coordinator is not aware of this member.",
    ErrorCode.invalid_group_id: "The configured groupId is invalid.",
    ErrorCode.group_authorization_failed: "Group authorization failed.",
    ErrorCode.topic_authorization_failed: "Topic authorization failed.",
    ErrorCode.rebalance_in_progress: "The group is rebalancing, so a rejoin is needed.",
    ErrorCode.illegal_generation: "Specified group generation id is not valid.",
}


def _error_text(code: ErrorCode) -> str:
    return _ERROR_MESSAGES.get(code, code.name.upper())


def kafka_error_message(error: str) -> str | None:
    """Kafka's default message for an error named as AdminError names it, if known."""
    for code, message in _ERROR_MESSAGES.items():
        if code.name.upper() == error:
            return message
    return None


# --- the client ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Connection:
    client: KafkaClient
    versions: dict[int, tuple[int, int]] = field(default_factory=dict)


class AdminClient:
    """Use as `async with await AdminClient.connect("host:port") as admin: ...`."""

    def __init__(
        self,
        bootstrap: list[tuple[str, int]],
        timeout_s: float,
        client_id: str,
        security: ClientSecurity | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.client_id = client_id
        self.security = security or ClientSecurity()
        self._nodes: dict[int, Node] = {}
        self._controller: int | None = None
        self._connections: dict[tuple[str, int], _Connection] = {}
        self._coordinators: dict[str, Node] = {}

    @classmethod
    async def connect(
        cls,
        bootstrap: str,
        timeout_s: float = 30.0,
        client_id: str = "spool-admin",
        security: ClientSecurity | None = None,
    ) -> AdminClient:
        """Bootstrap: the first reachable address answers ApiVersions and Metadata.
        Settings in `security` that cannot work are an INVALID_CONFIG AdminError."""
        if security is not None:
            try:
                security.validate()
            except SecurityConfigError as exc:
                raise AdminError("INVALID_CONFIG", str(exc)) from None
        admin = cls(parse_bootstrap(bootstrap), timeout_s, client_id, security)
        try:
            await admin._refresh_brokers()
        except BaseException:
            await admin.close()
            raise
        return admin

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for conn in self._connections.values():
            with contextlib.suppress(Exception):
                await conn.client.close()
        self._connections.clear()

    # --- plumbing -----------------------------------------------------------------------

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.timeout_s

    def _remaining(self, deadline: float) -> float:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise AdminError("REQUEST_TIMED_OUT", f"no answer within {self.timeout_s:g} s")
        return left

    async def _connection(self, address: tuple[str, int], deadline: float) -> _Connection:
        conn = self._connections.get(address)
        if conn is not None:
            return conn
        where = f"{address[0]}:{address[1]}"
        security = self.security
        try:
            async with asyncio.timeout(self._remaining(deadline)):
                client = await KafkaClient.connect(
                    *address, client_id=self.client_id, security=security
                )
        except AuthenticationError as exc:
            message = exc.message
            if exc.error == "SASL_AUTHENTICATION_FAILED":
                message += (
                    f" (user {security.username!r}, sasl.mechanism {security.mechanism}, "
                    f"at {where}: check the user and password in --command-config)"
                )
            raise AdminError(exc.error, message) from None
        except TlsError as exc:
            raise AdminError("SSL_HANDSHAKE_FAILED", str(exc)) from None
        except SecurityConfigError as exc:
            raise AdminError("INVALID_CONFIG", str(exc)) from None
        except TimeoutError:
            # Connected (or not) but no answer: str(TimeoutError()) says nothing.
            raise AdminError(
                "NETWORK_EXCEPTION",
                f"cannot connect to {where}: no answer within {self.timeout_s:g} s "
                f"(default.api.timeout.ms){self._hint()}",
            ) from None
        except (OSError, ClientError) as exc:
            hint = self._hint() if isinstance(exc, ClientError) else ""
            raise AdminError(
                "NETWORK_EXCEPTION", f"cannot connect to {where}: {exc}{hint}"
            ) from None
        conn = _Connection(client)
        try:
            if client.versions:  # a SASL connection asked before authenticating
                conn.versions = dict(client.versions)
            else:
                resp = await client.request(
                    API_VERSIONS,
                    API_VERSIONS_VERSION,
                    {"client_software_name": "spool-admin", "client_software_version": "0.1.0"},
                    self._remaining(deadline),
                )
                check(resp.error_code, None, f"ApiVersions refused by {where}")
                conn.versions = {
                    int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys
                }
        except (ClientError, OSError) as exc:
            await client.close()
            raise AdminError(
                "NETWORK_EXCEPTION", f"{where} closed the connection: {exc}{self._hint()}"
            ) from None
        except BaseException:
            await client.close()
            raise
        self._connections[address] = conn
        return conn

    def _hint(self) -> str:
        """What to check when a broker closes a connection we just opened: most often
        a listener whose security protocol is not the one configured, or one that
        requires a client certificate."""
        security = self.security
        if security.protocol == "PLAINTEXT":
            return (
                " (this client uses security.protocol=PLAINTEXT: if the listener is SSL, "
                "SASL_PLAINTEXT or SASL_SSL, set security.protocol and its settings in "
                "--command-config)"
            )
        hint = f" (security.protocol={security.protocol}: check that it is the listener's"
        if security.uses_tls and security.ssl_certificate_location is None:
            hint += (
                "; if the listener requires a client certificate (ssl.client.auth), set "
                "ssl.certificate.location and ssl.key.location"
            )
        return hint + ")"

    async def _drop(self, address: tuple[str, int]) -> None:
        conn = self._connections.pop(address, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.client.close()

    @staticmethod
    def _version(conn: _Connection, api_key: int) -> int:
        ours = CLIENT_VERSIONS[api_key]
        theirs = conn.versions.get(api_key)
        name = api.api_name(api_key)
        if theirs is None:
            raise AdminError("UNSUPPORTED_VERSION", f"the broker does not support {name}")
        low, high = max(ours[0], theirs[0]), min(ours[1], theirs[1])
        if low > high:
            raise AdminError(
                "UNSUPPORTED_VERSION",
                f"the broker supports {name} v{theirs[0]}-{theirs[1]}, "
                f"this client v{ours[0]}-{ours[1]}",
            )
        return high

    async def _send(
        self, address: tuple[str, int], api_key: int, body: Mapping[str, Any], deadline: float
    ) -> Any:
        conn = await self._connection(address, deadline)
        version = self._version(conn, api_key)
        try:
            return await conn.client.request(api_key, version, body, self._remaining(deadline))
        except (ClientError, OSError) as exc:
            await self._drop(address)
            raise AdminError(
                "NETWORK_EXCEPTION",
                f"{address[0]}:{address[1]} closed the connection: {exc}{self._hint()}",
            ) from None
        except TimeoutError:
            await self._drop(address)
            raise AdminError(
                "REQUEST_TIMED_OUT",
                f"{api.api_name(api_key)} got no answer within {self.timeout_s:g} s",
            ) from None

    def _any_address(self) -> tuple[str, int]:
        """A connected broker if there is one (the controller first), else bootstrap."""
        if self._controller is not None and self._controller in self._nodes:
            node = self._nodes[self._controller]
            return (node.host, node.port)
        for node in self._nodes.values():
            return (node.host, node.port)
        return self._bootstrap[0]

    async def _metadata(self, topics: Iterable[str] | None, deadline: float) -> Any:
        body: dict[str, Any] = {
            "topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False,
        }
        errors: list[str] = []
        addresses = [self._any_address(), *self._bootstrap]
        for address in dict.fromkeys(addresses):
            try:
                resp = await self._send(address, METADATA, body, deadline)
            except AdminError as exc:
                if exc.error not in ("NETWORK_EXCEPTION", "REQUEST_TIMED_OUT"):
                    raise
                errors.append(exc.message)
                continue
            self._nodes = {
                int(b.node_id): Node(int(b.node_id), b.host, int(b.port)) for b in resp.brokers
            }
            self._controller = int(getattr(resp, "controller_id", -1))
            return resp
        raise AdminError("NETWORK_EXCEPTION", "no broker reachable: " + "; ".join(errors))

    async def _refresh_brokers(self) -> None:
        await self._metadata([], self._deadline())

    async def _find_coordinator(self, group: str, deadline: float) -> Node:
        node = self._coordinators.get(group)
        if node is not None:
            return node
        address = self._any_address()
        conn = await self._connection(address, deadline)
        version = self._version(conn, FIND_COORDINATOR)
        body = {"key": group, "key_type": 0, "coordinator_keys": [group]}
        resp = await self._send(address, FIND_COORDINATOR, body, deadline)
        if version >= 4:
            (c,) = resp.coordinators
            code, message = c.error_code, c.error_message
            node = Node(int(c.node_id), c.host, int(c.port))
        else:
            code, message = resp.error_code, resp.error_message
            node = Node(int(resp.node_id), resp.host, int(resp.port))
        if code in COORDINATOR_ERRORS:
            raise _Retry(code, message)
        check(code, message, f"cannot find the coordinator of group {group!r}")
        self._coordinators[group] = node
        return node

    async def _with_coordinator(
        self, group: str, call: Callable[[tuple[str, int], float], Awaitable[T]]
    ) -> tuple[T, Node]:
        """Run `call(coordinator address, deadline)`; a `_Retry` from it (or from the
        lookup) drops the cached coordinator and tries again after a backoff."""

        async def attempt(deadline: float) -> tuple[T, Node]:
            node = await self._find_coordinator(group, deadline)
            return await call((node.host, node.port), deadline), node

        return await self._retry_until_deadline(
            attempt, lambda: self._coordinators.pop(group, None)
        )

    async def _retry_until_deadline(
        self, call: Callable[[float], Awaitable[T]], forget: Callable[[], object]
    ) -> T:
        """Run `call(deadline)`; on a `_Retry` from it, `forget()` the coordinator it
        used and try again after a backoff (doubling up to BACKOFF_MAX_MS) until the
        call's timeout, then raise the last error as an AdminError."""
        deadline = self._deadline()
        backoff = BACKOFF_MS
        while True:
            try:
                return await call(deadline)
            except _Retry as retry:
                forget()
                left = deadline - asyncio.get_running_loop().time()
                if left <= backoff / 1000:
                    raise AdminError.of(
                        retry.code,
                        f"{retry.message or retry.code.name} (gave up after {self.timeout_s:g} s)",
                        "",
                    ) from None
                await asyncio.sleep(backoff / 1000)
                backoff = min(backoff * 2, BACKOFF_MAX_MS)

    @staticmethod
    def _coordinator_check(code: ErrorCode, message: str | None, context: str) -> None:
        if code in COORDINATOR_ERRORS:
            raise _Retry(code, message)
        check(code, message, context)

    async def brokers(self) -> list[Node]:
        """The live brokers, from a fresh Metadata."""
        await self._metadata([], self._deadline())
        return sorted(self._nodes.values(), key=lambda n: n.node_id)

    async def describe_cluster(self) -> ClusterDescription:
        """DescribeCluster (KIP-700) of a connected broker: cluster id, the controller id
        it reports and the live brokers with their racks."""
        deadline = self._deadline()
        body = {"include_cluster_authorized_operations": False, "endpoint_type": 1}
        resp = await self._send(self._any_address(), DESCRIBE_CLUSTER, body, deadline)
        check(resp.error_code, resp.error_message, "DescribeCluster refused")
        return ClusterDescription(
            cluster_id=resp.cluster_id,
            controller_id=int(resp.controller_id),
            brokers=tuple(
                sorted(
                    (
                        BrokerInfo(int(b.broker_id), b.host, int(b.port), b.rack)
                        for b in resp.brokers
                    ),
                    key=lambda b: b.node_id,
                )
            ),
        )

    async def find_coordinators(self, keys: Iterable[str], key_type: int) -> list[CoordinatorInfo]:
        """FindCoordinator for each key of `key_type` (0 GROUP, 1 TRANSACTION, 2 SHARE),
        as the asked broker answers now: no retry, no cache; an error is part of the
        answer (COORDINATOR_NOT_AVAILABLE while a coordinator moves)."""
        deadline = self._deadline()
        address = self._any_address()
        conn = await self._connection(address, deadline)
        version = self._version(conn, FIND_COORDINATOR)
        wanted = list(keys)
        out: list[CoordinatorInfo] = []
        if version >= 4:
            body = {"key_type": key_type, "coordinator_keys": wanted}
            resp = await self._send(address, FIND_COORDINATOR, body, deadline)
            for c in resp.coordinators:
                out.append(_coordinator_info(c.key, key_type, c))
            return out
        for key in wanted:
            resp = await self._send(
                address, FIND_COORDINATOR, {"key": key, "key_type": key_type}, deadline
            )
            out.append(_coordinator_info(key, key_type, resp))
        return out

    # --- topics -------------------------------------------------------------------------

    async def describe_topics(self, topics: Iterable[str] | None = None) -> list[TopicInfo]:
        """Metadata of `topics` (all topics when None); an unknown topic is an error."""
        resp = await self._metadata(None if topics is None else list(topics), self._deadline())
        out: list[TopicInfo] = []
        for t in resp.topics:
            check(t.error_code, None, f"topic {t.name!r}: {t.error_code.name.upper()}")
            out.append(
                TopicInfo(
                    name=t.name or "",
                    topic_id=getattr(t, "topic_id", None),
                    is_internal=bool(t.is_internal),
                    partitions=tuple(
                        sorted(
                            (
                                PartitionInfo(
                                    int(p.partition_index),
                                    int(p.leader_id),
                                    int(getattr(p, "leader_epoch", -1)),
                                    tuple(int(r) for r in p.replica_nodes),
                                    tuple(int(r) for r in p.isr_nodes),
                                )
                                for p in t.partitions
                            ),
                            key=lambda p: p.partition,
                        )
                    ),
                )
            )
        return sorted(out, key=lambda t: t.name)

    async def list_topics(self, include_internal: bool = False) -> list[str]:
        return [
            t.name for t in await self.describe_topics() if include_internal or not t.is_internal
        ]

    async def create_topic(
        self,
        name: str,
        partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        """-1 partitions / replication factor: the broker's defaults (KIP-464)."""
        deadline = self._deadline()
        body = {
            "topics": [
                {
                    "name": name,
                    "num_partitions": partitions,
                    "replication_factor": replication_factor,
                    "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
                }
            ],
            "timeout": int(self.timeout_s * 1000),
        }
        resp = await self._send(self._any_address(), CREATE_TOPICS, body, deadline)
        for t in resp.topics:
            check(t.error_code, t.error_message, f"cannot create topic {name!r}")

    async def delete_topics(self, names: Iterable[str]) -> None:
        names = list(names)
        body = {
            "topic_names": names,
            "topics": [{"name": n} for n in names],
            "timeout": int(self.timeout_s * 1000),
        }
        resp = await self._send(self._any_address(), DELETE_TOPICS, body, self._deadline())
        for t in resp.responses:
            check(t.error_code, getattr(t, "error_message", None), f"cannot delete {t.name!r}")

    async def create_partitions(self, topic: str, count: int) -> None:
        body = {
            "topics": [{"name": topic, "count": count, "assignments": None}],
            "timeout": int(self.timeout_s * 1000),
            "validate_only": False,
        }
        resp = await self._send(self._any_address(), CREATE_PARTITIONS, body, self._deadline())
        for r in resp.results:
            check(r.error_code, r.error_message, f"cannot add partitions to {topic!r}")

    async def list_offsets(
        self, specs: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, ListedOffset]:
        """ListOffsets at each partition's leader. A spec is EARLIEST_TIMESTAMP,
        LATEST_TIMESTAMP, or a timestamp (ms): the first offset whose record timestamp is
        at or after it (offset -1 when there is none)."""
        deadline = self._deadline()
        meta = await self._metadata(sorted({t for t, _ in specs}), deadline)
        leaders: dict[TopicPartition, int] = {}
        for t in meta.topics:
            check(t.error_code, None, f"topic {t.name!r}: {t.error_code.name.upper()}")
            for p in t.partitions:
                leaders[(t.name, int(p.partition_index))] = int(p.leader_id)
        by_leader: dict[int, dict[str, list[dict[str, int]]]] = {}
        for (topic, partition), timestamp in specs.items():
            leader = leaders.get((topic, partition))
            if leader is None:
                raise AdminError(
                    "UNKNOWN_TOPIC_OR_PARTITION", f"partition {topic}-{partition} does not exist"
                )
            if leader < 0 or leader not in self._nodes:
                raise AdminError(
                    "LEADER_NOT_AVAILABLE", f"partition {topic}-{partition} has no leader"
                )
            by_leader.setdefault(leader, {}).setdefault(topic, []).append(
                {"partition_index": partition, "timestamp": timestamp}
            )
        out: dict[TopicPartition, ListedOffset] = {}
        for leader, topics in by_leader.items():
            node = self._nodes[leader]
            body = {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                "timeout": int(self.timeout_s * 1000),
            }
            resp = await self._send((node.host, node.port), LIST_OFFSETS, body, deadline)
            for t in resp.topics:
                for p in t.partitions:
                    check(p.error_code, None, f"ListOffsets of {t.name}-{p.partition_index}")
                    out[(t.name, int(p.partition_index))] = ListedOffset(
                        int(p.offset), int(p.timestamp)
                    )
        return out

    # --- configs ------------------------------------------------------------------------

    async def describe_configs(
        self,
        resource_type: int,
        name: str,
        include_synonyms: bool = True,
        keys: Iterable[str] | None = None,
    ) -> list[ConfigEntry]:
        """DescribeConfigs of one resource: every config, or only `keys`."""
        address = self._any_address()
        if resource_type == RESOURCE_BROKER and name:
            node = self._nodes.get(int(name))
            if node is not None:  # a broker's own configs come from that broker
                address = (node.host, node.port)
        body = {
            "resources": [
                {
                    "resource_type": resource_type,
                    "resource_name": name,
                    "configuration_keys": None if keys is None else list(keys),
                }
            ],
            "include_synonyms": include_synonyms,
        }
        resp = await self._send(address, DESCRIBE_CONFIGS, body, self._deadline())
        (r,) = resp.results
        check(r.error_code, r.error_message, f"cannot describe configs of {name!r}")
        return [
            ConfigEntry(
                name=c.name,
                value=c.value,
                source=CONFIG_SOURCES.get(int(getattr(c, "config_source", 0)), "UNKNOWN"),
                read_only=bool(c.read_only),
                sensitive=bool(c.is_sensitive),
                synonyms=tuple(
                    ConfigSynonym(s.name, s.value, CONFIG_SOURCES.get(int(s.source), "UNKNOWN"))
                    for s in getattr(c, "synonyms", ())
                ),
            )
            for c in r.configs
        ]

    async def incremental_alter_configs(
        self,
        resource_type: int,
        name: str,
        set_configs: Mapping[str, str],
        delete_configs: Iterable[str] = (),
    ) -> None:
        configs = [
            {"name": k, "config_operation": OP_DELETE, "value": None} for k in delete_configs
        ] + [{"name": k, "config_operation": OP_SET, "value": v} for k, v in set_configs.items()]
        body = {
            "resources": [
                {"resource_type": resource_type, "resource_name": name, "configs": configs}
            ],
            "validate_only": False,
        }
        resp = await self._send(
            self._any_address(), INCREMENTAL_ALTER_CONFIGS, body, self._deadline()
        )
        for r in resp.responses:
            check(r.error_code, r.error_message, f"cannot alter configs of {name!r}")

    # --- groups -------------------------------------------------------------------------

    async def list_groups(
        self, types: Iterable[str] = (), states: Iterable[str] = ()
    ) -> list[GroupListing]:
        """ListGroups on every broker (each lists the groups it coordinates)."""
        deadline = self._deadline()
        await self._metadata([], deadline)
        body = {"types_filter": list(types), "states_filter": list(states)}
        seen: dict[str, GroupListing] = {}
        nodes = list(self._nodes.values()) or []
        addresses = [(n.host, n.port) for n in nodes] or [self._bootstrap[0]]
        for address in addresses:
            resp = await self._send_while_loading(address, LIST_GROUPS, body, deadline)
            check(resp.error_code, None, "ListGroups failed")
            for g in resp.groups:
                seen[g.group_id] = GroupListing(
                    g.group_id, g.group_state, g.group_type, g.protocol_type
                )
        return sorted(seen.values(), key=lambda g: g.group_id)

    async def list_transactions(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        duration_ms: int = -1,
        pattern: str | None = None,
    ) -> list[TransactionListing]:
        """ListTransactions on every live broker, each listing the transactions it
        coordinates, merged (Kafka's Admin.listTransactions, AllBrokersStrategy). A
        broker still loading its transactions log (COORDINATOR_LOAD_IN_PROGRESS) or
        without one available is asked again after a backoff, within the timeout; a
        filter a broker's version cannot carry is an error, not dropped."""
        deadline = self._deadline()
        await self._metadata([], deadline)
        body: dict[str, Any] = {
            "state_filters": list(states),
            "producer_id_filters": list(producer_ids),
            "duration_filter": duration_ms,
            "transactional_id_pattern": pattern,
        }
        found: list[TransactionListing] = []
        nodes = sorted(self._nodes.values(), key=lambda n: n.node_id)
        for node in nodes:
            address = (node.host, node.port)
            conn = await self._connection(address, deadline)
            version = self._version(conn, LIST_TRANSACTIONS)
            if (duration_ms >= 0 and version < 1) or (pattern and version < 2):
                raise AdminError(
                    "UNSUPPORTED_VERSION",
                    f"broker {node.node_id} answers ListTransactions v{version}, which has no "
                    + ("duration filter" if version < 1 else "transactional id pattern"),
                )
            resp = await self._send_while_loading(address, LIST_TRANSACTIONS, body, deadline)
            check(resp.error_code, None, f"ListTransactions on broker {node.node_id} failed")
            found += [
                TransactionListing(
                    t.transactional_id, node.node_id, int(t.producer_id), t.transaction_state
                )
                for t in resp.transaction_states
            ]
        return found

    async def _send_while_loading(
        self, address: tuple[str, int], api_key: int, body: Mapping[str, Any], deadline: float
    ) -> Any:
        """`_send`, asked again after a backoff (within the deadline) while the answer's
        error is COORDINATOR_LOAD_IN_PROGRESS or COORDINATOR_NOT_AVAILABLE: a listing of
        what a broker coordinates, which Kafka's admin client retries on those."""
        backoff = BACKOFF_MS
        while True:
            resp = await self._send(address, api_key, body, deadline)
            if ErrorCode(resp.error_code) not in (
                ErrorCode.coordinator_load_in_progress,
                ErrorCode.coordinator_not_available,
            ):
                return resp
            if deadline - asyncio.get_running_loop().time() <= backoff / 1000:
                return resp
            await asyncio.sleep(backoff / 1000)
            backoff = min(backoff * 2, BACKOFF_MAX_MS)

    async def describe_share_group(self, group: str) -> ShareGroupDescription:
        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {"group_ids": [group], "include_authorized_operations": False}
            resp = await self._send(address, SHARE_GROUP_DESCRIBE, body, deadline)
            (g,) = resp.groups
            self._coordinator_check(g.error_code, g.error_message, f"group {group!r}")
            return g

        g, node = await self._with_coordinator(group, call)
        return ShareGroupDescription(
            group_id=g.group_id,
            state=g.group_state,
            group_epoch=int(g.group_epoch),
            assignment_epoch=int(g.assignment_epoch),
            assignor=g.assignor_name,
            coordinator=node,
            members=tuple(
                ShareMember(
                    member_id=m.member_id,
                    member_epoch=int(m.member_epoch),
                    client_id=m.client_id,
                    host=m.client_host,
                    rack=m.rack_id,
                    subscribed=tuple(m.subscribed_topic_names),
                    assignment={
                        tp.topic_name: tuple(sorted(int(p) for p in tp.partitions))
                        for tp in m.assignment.topic_partitions
                    },
                )
                for m in g.members
            ),
        )

    async def describe_share_group_offsets(
        self, group: str, topics: Mapping[str, Iterable[int]] | None = None
    ) -> list[SharePartitionOffset]:
        """DescribeShareGroupOffsets: every share-partition of the group (topics None)
        or those asked for."""
        wanted = (
            None
            if topics is None
            else [{"topic_name": t, "partitions": list(ps)} for t, ps in topics.items()]
        )

        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {"groups": [{"group_id": group, "topics": wanted}]}
            resp = await self._send(address, DESCRIBE_SHARE_GROUP_OFFSETS, body, deadline)
            (g,) = resp.groups
            self._coordinator_check(g.error_code, g.error_message, f"group {group!r}")
            return g

        g, _ = await self._with_coordinator(group, call)
        out: list[SharePartitionOffset] = []
        for t in g.topics:
            for p in t.partitions:
                check(p.error_code, p.error_message, f"{t.topic_name}-{p.partition_index}")
                start = int(p.start_offset)
                out.append(
                    SharePartitionOffset(
                        topic=t.topic_name,
                        partition=int(p.partition_index),
                        start_offset=start if start >= 0 else None,
                        leader_epoch=int(p.leader_epoch) if start >= 0 else None,
                        lag=int(getattr(p, "lag", -1)) if getattr(p, "lag", -1) >= 0 else None,
                    )
                )
        return sorted(out, key=lambda o: (o.topic, o.partition))

    async def alter_share_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, int]
    ) -> None:
        """AlterShareGroupOffsets: the group must be empty (NON_EMPTY_GROUP otherwise)."""
        topics: dict[str, list[dict[str, int]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append(
                {"partition_index": partition, "start_offset": offset}
            )

        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {
                "group_id": group,
                "topics": [{"topic_name": t, "partitions": ps} for t, ps in topics.items()],
            }
            resp = await self._send(address, ALTER_SHARE_GROUP_OFFSETS, body, deadline)
            self._coordinator_check(resp.error_code, resp.error_message, f"group {group!r}")
            return resp

        resp, _ = await self._with_coordinator(group, call)
        for t in resp.responses:
            for p in t.partitions:
                check(p.error_code, p.error_message, f"{t.topic_name}-{p.partition_index}")

    async def delete_share_group_offsets(
        self, group: str, topics: Iterable[str]
    ) -> dict[str, AdminError | None]:
        """DeleteShareGroupOffsets: each topic's outcome (None when deleted)."""
        names = list(topics)

        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {"group_id": group, "topics": [{"topic_name": t} for t in names]}
            resp = await self._send(address, DELETE_SHARE_GROUP_OFFSETS, body, deadline)
            self._coordinator_check(resp.error_code, resp.error_message, f"group {group!r}")
            return resp

        resp, _ = await self._with_coordinator(group, call)
        out: dict[str, AdminError | None] = {}
        for t in resp.responses:
            ok = t.error_code == ErrorCode.none
            out[t.topic_name] = (
                None if ok else AdminError.of(t.error_code, t.error_message, t.topic_name)
            )
        return out

    async def delete_groups(self, groups: Iterable[str]) -> dict[str, AdminError | None]:
        """DeleteGroups at each group's coordinator: each group's outcome."""
        out: dict[str, AdminError | None] = {}
        for group in groups:

            async def call(address: tuple[str, int], deadline: float, group: str = group) -> Any:
                body = {"groups_names": [group]}
                resp = await self._send(address, DELETE_GROUPS, body, deadline)
                (r,) = resp.results
                self._coordinator_check(r.error_code, None, f"group {group!r}")
                return r

            try:
                await self._with_coordinator(group, call)
                out[group] = None
            except AdminError as exc:
                out[group] = exc
        return out

    # --- consumer and classic groups (Kafka's Admin.describeConsumerGroups and the
    # consumer group offsets calls) --------------------------------------------------------

    async def describe_consumer_group(self, group: str) -> ConsumerGroupDescription:
        """ConsumerGroupDescribe, or DescribeGroups when the group is not a consumer
        group (GROUP_ID_NOT_FOUND) or the broker does not serve ConsumerGroupDescribe
        (UNSUPPORTED_VERSION), as Kafka's admin client falls back. A group that does
        not exist is described in state Dead. UNSUPPORTED_VERSION when the broker
        serves neither API."""
        try:
            return await self._consumer_group_describe(group)
        except AdminError as exc:
            if exc.error not in ("GROUP_ID_NOT_FOUND", "UNSUPPORTED_VERSION"):
                raise
            consumer_api = exc.error != "UNSUPPORTED_VERSION"
        try:
            return await self.describe_groups(group)
        except AdminError as exc:
            if exc.error != "UNSUPPORTED_VERSION":
                raise
            if consumer_api:
                message = (
                    f"group '{group}' is not a consumer group, and the broker does not serve "
                    "DescribeGroups (15): its state and members cannot be described"
                )
            else:
                message = (
                    "the broker serves neither ConsumerGroupDescribe (69) nor DescribeGroups "
                    f"(15): the state and members of group '{group}' cannot be described"
                )
            raise AdminError("UNSUPPORTED_VERSION", message) from None

    async def _consumer_group_describe(self, group: str) -> ConsumerGroupDescription:
        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {"group_ids": [group], "include_authorized_operations": False}
            resp = await self._send(address, CONSUMER_GROUP_DESCRIBE, body, deadline)
            (g,) = resp.groups
            self._coordinator_check(g.error_code, g.error_message, f"group '{group}'")
            return g

        g, node = await self._with_coordinator(group, call)

        def assignment(a: Any) -> dict[str, tuple[int, ...]]:
            return {
                tp.topic_name: tuple(sorted(int(p) for p in tp.partitions))
                for tp in a.topic_partitions
            }

        members = []
        for m in g.members:
            member_type = int(getattr(m, "member_type", -1))
            members.append(
                ConsumerMember(
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.client_id,
                    host=m.client_host,
                    assignment=assignment(m.assignment),
                    target_assignment=assignment(m.target_assignment),
                    member_epoch=int(m.member_epoch),
                    upgraded=None if member_type < 0 else member_type == 1,
                )
            )
        return ConsumerGroupDescription(
            group_id=g.group_id,
            type="consumer",
            protocol_type="consumer",
            state=group_state_name(g.group_state),
            assignor=g.assignor_name,
            coordinator=node,
            members=tuple(members),
            group_epoch=int(g.group_epoch),
            target_assignment_epoch=int(g.assignment_epoch),
        )

    async def describe_groups(self, group: str) -> ConsumerGroupDescription:
        """DescribeGroups of one classic group; a group of another protocol type than
        `consumer` (or a simple group's empty one) is INVALID_GROUP_ID, as Kafka's
        admin client refuses to describe it as a consumer group."""

        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {"groups": [group], "include_authorized_operations": False}
            resp = await self._send(address, DESCRIBE_GROUPS, body, deadline)
            (g,) = resp.groups
            self._coordinator_check(g.error_code, None, f"group '{group}'")
            return g

        g, node = await self._with_coordinator(group, call)
        state = group_state_name(g.group_state)
        if g.protocol_type not in ("", CONSUMER_PROTOCOL_TYPE) and state != "Dead":
            raise AdminError(
                "INVALID_GROUP_ID",
                f"GroupId {group} is not a consumer group ({g.protocol_type}).",
            )
        members = tuple(
            ConsumerMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                host=m.client_host,
                assignment=parse_consumer_assignment(bytes(m.member_assignment))
                if g.protocol_type == CONSUMER_PROTOCOL_TYPE
                else {},
            )
            for m in g.members
        )
        return ConsumerGroupDescription(
            group_id=g.group_id,
            type="classic",
            protocol_type=g.protocol_type,
            state=state,
            assignor=g.protocol_data,
            coordinator=node,
            members=members,
        )

    async def list_consumer_group_offsets(
        self, group: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """OffsetFetch: the group's committed offsets (every partition it has one for
        when `partitions` is None). A partition without a committed offset, or with a
        per-partition error, is left out, as Kafka's admin client leaves it out."""
        topics: dict[str, list[int]] = {}
        for topic, partition in partitions or ():
            topics.setdefault(topic, []).append(partition)
        wanted = (
            None
            if partitions is None
            else [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]
        )

        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {
                "groups": [
                    {"group_id": group, "member_id": None, "member_epoch": -1, "topics": wanted}
                ],
                "require_stable": False,
            }
            resp = await self._send(address, OFFSET_FETCH, body, deadline)
            (g,) = resp.groups
            self._coordinator_check(g.error_code, None, f"group '{group}'")
            return g

        g, _ = await self._with_coordinator(group, call)
        out: dict[TopicPartition, CommittedOffset] = {}
        for t in g.topics:
            for p in t.partitions:
                if p.error_code != ErrorCode.none or int(p.committed_offset) < 0:
                    continue
                epoch = int(p.committed_leader_epoch)
                out[(t.name, int(p.partition_index))] = CommittedOffset(
                    int(p.committed_offset), epoch if epoch >= 0 else None, p.metadata
                )
        return dict(sorted(out.items()))

    async def alter_consumer_group_offsets(
        self, group: str, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, AdminError | None]:
        """OffsetCommit as an admin (generation -1, no member): the group must have no
        members, else the coordinator refuses (UNKNOWN_MEMBER_ID). Each partition's
        outcome, None where committed."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "committed_offset": offset,
                    "committed_leader_epoch": -1,
                    "committed_metadata": "",
                }
            )

        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {
                "group_id": group,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
            }
            resp = await self._send(address, OFFSET_COMMIT, body, deadline)
            for t in resp.topics:
                for p in t.partitions:
                    if p.error_code in COORDINATOR_ERRORS:
                        raise _Retry(p.error_code, None)
            return resp

        resp, _ = await self._with_coordinator(group, call)
        out: dict[TopicPartition, AdminError | None] = {}
        for t in resp.topics:
            for p in t.partitions:
                tp = (t.name, int(p.partition_index))
                out[tp] = (
                    None
                    if p.error_code == ErrorCode.none
                    else AdminError.of(p.error_code, None, _error_text(p.error_code))
                )
        return out

    async def delete_consumer_group_offsets(
        self, group: str, partitions: Iterable[TopicPartition]
    ) -> tuple[AdminError | None, dict[TopicPartition, AdminError | None]]:
        """OffsetDelete: the group's error (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, ...)
        and each partition's outcome (GROUP_SUBSCRIBED_TO_TOPIC while a member is
        subscribed to the topic)."""
        topics: dict[str, list[dict[str, int]]] = {}
        for topic, partition in sorted(set(partitions)):
            topics.setdefault(topic, []).append({"partition_index": partition})

        async def call(address: tuple[str, int], deadline: float) -> Any:
            body = {
                "group_id": group,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
            }
            resp = await self._send(address, OFFSET_DELETE, body, deadline)
            if resp.error_code in COORDINATOR_ERRORS:
                raise _Retry(resp.error_code, None)
            return resp

        resp, _ = await self._with_coordinator(group, call)
        top = (
            None
            if resp.error_code == ErrorCode.none
            else AdminError.of(resp.error_code, None, _error_text(resp.error_code))
        )
        out: dict[TopicPartition, AdminError | None] = {}
        for t in resp.topics:
            for p in t.partitions:
                out[(t.name, int(p.partition_index))] = (
                    None
                    if p.error_code == ErrorCode.none
                    else AdminError.of(p.error_code, None, _error_text(p.error_code))
                )
        return top, out

    # --- ACLs (KIP-11) ----------------------------------------------------------------
    # Codes are Kafka's (coordinator.acls has the enums; this layer stays below it).

    async def create_acls(self, acls: Iterable[AclEntry]) -> list[AdminError | None]:
        """CreateAcls: each binding's outcome, None where it was created (or existed)."""
        acls = list(acls)
        body = {"creations": [a.body() for a in acls]}
        resp = await self._send(self._any_address(), CREATE_ACLS, body, self._deadline())
        return [
            None
            if r.error_code == ErrorCode.none
            else AdminError.of(r.error_code, r.error_message, f"cannot create ACL {a}")
            for a, r in zip(acls, resp.results, strict=True)
        ]

    async def describe_acls(self, filt: AclFilter) -> list[AclEntry]:
        """DescribeAcls: the stored bindings `filt` matches."""
        body = filt.body()
        resp = await self._send(self._any_address(), DESCRIBE_ACLS, body, self._deadline())
        check(resp.error_code, resp.error_message, "cannot describe ACLs")
        return [
            AclEntry(
                int(r.resource_type),
                r.resource_name,
                int(r.pattern_type),
                a.principal,
                a.host,
                int(a.operation),
                int(a.permission_type),
            )
            for r in resp.resources
            for a in r.acls
        ]

    async def delete_acls(self, filters: Iterable[AclFilter]) -> list[list[AclEntry] | AdminError]:
        """DeleteAcls: per filter, the bindings it removed or its error."""
        filters = list(filters)
        body = {"filters": [f.body() for f in filters]}
        resp = await self._send(self._any_address(), DELETE_ACLS, body, self._deadline())
        out: list[list[AclEntry] | AdminError] = []
        for f, r in zip(filters, resp.filter_results, strict=True):
            if r.error_code != ErrorCode.none:
                out.append(AdminError.of(r.error_code, r.error_message, f"cannot delete {f}"))
                continue
            out.append(
                [
                    AclEntry(
                        int(m.resource_type),
                        m.resource_name,
                        int(m.pattern_type),
                        m.principal,
                        m.host,
                        int(m.operation),
                        int(m.permission_type),
                    )
                    for m in r.matching_acls
                ]
            )
        return out

    # --- SCRAM credentials (KIP-554) -----------------------------------------------------
    # Mechanisms by Kafka's type ids (1 SCRAM-SHA-256, 2 SCRAM-SHA-512); the caller salts
    # the password (as Kafka's admin client does), so no password goes on the wire.

    async def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, list[tuple[int, int]] | AdminError]:
        """DescribeUserScramCredentials: per user, its (mechanism, iterations) or its
        error; every user with a credential when `users` is None or empty."""
        names = list(users or ())
        body = {"users": [{"name": u} for u in names] if names else None}
        resp = await self._send(
            self._any_address(), DESCRIBE_USER_SCRAM_CREDENTIALS, body, self._deadline()
        )
        check(resp.error_code, resp.error_message, "cannot describe SCRAM credentials")
        out: dict[str, list[tuple[int, int]] | AdminError] = {}
        for r in resp.results:
            if r.error_code != ErrorCode.none:
                context = f"cannot describe the SCRAM credentials of {r.user!r}"
                out[r.user] = AdminError.of(r.error_code, r.error_message, context)
            else:
                out[r.user] = [(int(c.mechanism), int(c.iterations)) for c in r.credential_infos]
        return out

    async def alter_user_scram_credentials(
        self,
        upsertions: Iterable[ScramUpsertion] = (),
        deletions: Iterable[tuple[str, int]] = (),
    ) -> dict[str, AdminError | None]:
        """AlterUserScramCredentials: per user, None if altered, else its error."""
        body = {
            "deletions": [{"name": user, "mechanism": mech} for user, mech in deletions],
            "upsertions": [u.body() for u in upsertions],
        }
        resp = await self._send(
            self._any_address(), ALTER_USER_SCRAM_CREDENTIALS, body, self._deadline()
        )
        return {
            r.user: None
            if r.error_code == ErrorCode.none
            else AdminError.of(
                r.error_code, r.error_message, f"cannot alter the SCRAM credentials of {r.user!r}"
            )
            for r in resp.results
        }


CREATE_ACLS, DESCRIBE_ACLS, DELETE_ACLS = 30, 29, 31
# Kafka 4.x serves the ACL APIs from v1 (v0 was removed in 4.0).
CLIENT_VERSIONS.update({DESCRIBE_ACLS: (1, 3), CREATE_ACLS: (1, 3), DELETE_ACLS: (1, 3)})


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One ACL binding with Kafka's wire codes; field names are CreateAcls' own."""

    resource_type: int
    resource_name: str
    resource_pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    def body(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls / DeleteAcls filter (Kafka's AclBindingFilter): None names match
    any value, codes ANY (1) any type; field names are the requests' own."""

    resource_type_filter: int
    resource_name_filter: str | None
    pattern_type_filter: int
    principal_filter: str | None
    host_filter: str | None
    operation: int
    permission_type: int

    def body(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
CLIENT_VERSIONS.update(
    {DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0), ALTER_USER_SCRAM_CREDENTIALS: (0, 0)}
)


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    """One AlterUserScramCredentials upsertion: the client-made salt and salted password
    (never the password); repr hides both."""

    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes

    def __repr__(self) -> str:
        return f"ScramUpsertion({self.name!r}, {self.mechanism}, {self.iterations}, <hidden>)"

    def body(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}
