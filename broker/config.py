"""Broker and topic configuration, with Kafka's keys, types and defaults.

Precedence, lowest first: embedded defaults, the TOML file (`--config`), environment
variables `SPOOL_<KEY>` (dots as underscores, e.g. SPOOL_NUM_PARTITIONS), then
`--set key=value`. Topic configs fall back to the broker key Kafka derives them from
(`retention.ms` <- `log.retention.ms`, ...).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coordinator.group_config import (
    BROKER_CONFIG_DEFS,
    DLQ_BROKER_CONFIG_DEFS,
    DLQ_GROUP_ENABLE,
    GROUP_COORDINATOR_CONFIG_DEFS,
    GroupCoordinatorConfig,
    ShareGroupBrokerConfig,
)
from protocol.configs import ConfigDef, ConfigType, one_of
from protocol.errors import ErrorCode, KafkaError

# DescribeConfigs ConfigType values (KIP-569).
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, PASSWORD = (
    ConfigType.BOOLEAN,
    ConfigType.STRING,
    ConfigType.INT,
    ConfigType.SHORT,
    ConfigType.LONG,
    ConfigType.DOUBLE,
    ConfigType.LIST,
    ConfigType.PASSWORD,
)


def _at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be at least {n}"


INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

BROKER_KEYS: dict[str, ConfigDef] = {
    k.name: k
    for k in [
        ConfigDef("node.id", INT, 1, "This broker's node id.", _at_least(0), read_only=True),
        ConfigDef("broker.rack", STRING, None, "Rack of this broker.", read_only=True),
        ConfigDef(
            "num.partitions",
            INT,
            1,
            "Default partition count of auto-created topics.",
            _at_least(1),
        ),
        ConfigDef(
            "default.replication.factor",
            SHORT,
            1,
            "Replication factor of auto-created topics (spool is one node).",
            _at_least(1),
        ),
        ConfigDef(
            "auto.create.topics.enable",
            BOOLEAN,
            True,
            "Create a topic when a client asks for metadata of or produces to it.",
        ),
        ConfigDef("delete.topic.enable", BOOLEAN, True, "Allow DeleteTopics."),
        ConfigDef(
            "socket.request.max.bytes",
            INT,
            104857600,
            "Largest request the broker reads; larger ones close the connection.",
            _at_least(1),
        ),
        # The socket server's resource bounds (Kafka's SocketServerConfigs), read at start.
        ConfigDef(
            "queued.max.request.bytes",
            LONG,
            -1,
            "Bytes of requests being read or waiting to be handled, across all "
            "connections, before the broker stops reading sockets until some are handled "
            "(-1: no limit). When set, at least socket.request.max.bytes.",
            read_only=True,
        ),
        ConfigDef(
            "connections.max.idle.ms",
            LONG,
            600000,
            "Close connections that have neither sent a complete request nor had one in "
            "flight for this long (negative: never).",
            read_only=True,
        ),
        ConfigDef(
            "max.connections",
            INT,
            INT_MAX,
            "Connections the broker keeps open at once; a new one over it is closed.",
            _at_least(0),
            read_only=True,
        ),
        ConfigDef(
            "max.connections.per.ip",
            INT,
            INT_MAX,
            "Connections kept open from one IP address; a new one over it is closed. "
            "0 only with max.connections.per.ip.overrides.",
            _at_least(0),
            read_only=True,
        ),
        ConfigDef(
            "max.connections.per.ip.overrides",
            STRING,
            "",
            "Per-address (or host name) limits over max.connections.per.ip, e.g. "
            '"hostName:100,127.0.0.1:200".',
            read_only=True,
        ),
        ConfigDef(
            "message.max.bytes", INT, 1048588, "Largest record batch accepted.", _at_least(0)
        ),
        ConfigDef(
            "log.segment.bytes", INT, 1073741824, "Segment file size before a roll.", _at_least(14)
        ),
        ConfigDef("log.roll.ms", LONG, 604800000, "Segment age before a roll.", _at_least(1)),
        ConfigDef(
            "log.retention.ms",
            LONG,
            604800000,
            "Age after which segments are deleted (-1: forever).",
            _at_least(-1),
        ),
        ConfigDef(
            "log.retention.bytes",
            LONG,
            -1,
            "Partition size above which old segments are deleted (-1: no limit).",
            _at_least(-1),
        ),
        ConfigDef(
            "log.retention.check.interval.ms",
            LONG,
            300000,
            "How often retention is enforced.",
            _at_least(1),
        ),
        ConfigDef(
            "log.index.interval.bytes",
            INT,
            4096,
            "Bytes between offset-index entries.",
            _at_least(0),
        ),
        ConfigDef(
            "log.flush.interval.messages",
            LONG,
            1,
            "Records appended before an fsync. spool's default 1 fsyncs (group commit) "
            "before acknowledging acks=all and before data is visible to consumers; "
            f"{LONG_MAX} leaves flushing to the OS, as Kafka does.",
            _at_least(1),
        ),
        ConfigDef(
            "log.message.timestamp.type",
            STRING,
            "CreateTime",
            "CreateTime or LogAppendTime.",
            one_of("CreateTime", "LogAppendTime"),
        ),
        ConfigDef(
            "compression.type",
            STRING,
            "producer",
            "Topic compression default.",
            one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
        ),
        ConfigDef(
            "log.cleanup.policy",
            LIST,
            "delete",
            "delete or compact.",
            one_of("delete", "compact", "compact,delete", "delete,compact"),
        ),
        ConfigDef(
            "min.insync.replicas", INT, 1, "Kept for clients; spool is one node.", _at_least(1)
        ),
        ConfigDef(
            "transactional.id.expiration.ms",
            INT,
            604800000,
            "Expiry of idle transactional ids.",
            _at_least(1),
        ),
        # The transaction coordinator (Kafka's TransactionStateManagerConfig), read at start.
        ConfigDef(
            "transaction.max.timeout.ms",
            INT,
            900000,
            "Largest transaction.timeout.ms a producer may ask for "
            "(INVALID_TRANSACTION_TIMEOUT above it).",
            _at_least(1),
            read_only=True,
        ),
        ConfigDef(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            INT,
            10000,
            "How often ongoing transactions older than their timeout are aborted.",
            _at_least(1),
            read_only=True,
        ),
        ConfigDef(
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            INT,
            3600000,
            "How often transactional ids idle for transactional.id.expiration.ms are removed.",
            _at_least(1),
            read_only=True,
        ),
        ConfigDef(
            "producer.id.expiration.ms",
            INT,
            86400000,
            "Expiry of idle idempotent producer state.",
            _at_least(1),
        ),
        ConfigDef(
            "share.coordinator.snapshot.update.records.per.snapshot",
            INT,
            500,
            "Updates of a share partition's state between two snapshots in the share-state log.",
            _at_least(0),
        ),
        ConfigDef(
            "share.coordinator.state.topic.segment.bytes",
            INT,
            104857600,
            "Segment size of the share-state log; closed segments are compacted.",
            _at_least(1024),
        ),
        ConfigDef(
            "log.cleaner.enable",
            BOOLEAN,
            True,
            "Whether the broker compacts closed share-state segments itself; with false, "
            "only `spool compact` output is adopted.",
        ),
        ConfigDef(
            "log.cleaner.backoff.ms",
            LONG,
            15000,
            "How often the broker looks for closed share-state segments to compact.",
            _at_least(1),
        ),
    ]
}


# Listeners and TLS (Kafka's SocketServerConfigs and SslConfigs), read at start; spool
# reads PEM key and trust stores only. broker.listeners turns them into listeners.
LISTENER_KEYS: list[ConfigDef] = [
    ConfigDef(
        "listeners",
        STRING,
        "PLAINTEXT://127.0.0.1:9092",
        "Comma-separated NAME://host:port the broker listens on; an empty host binds every "
        "interface. (Kafka's default binds every interface; spool's binds loopback.)",
        read_only=True,
    ),
    ConfigDef(
        "advertised.listeners",
        STRING,
        None,
        "NAME://host:port given to clients of each listener in Metadata, FindCoordinator "
        "and DescribeCluster (default: the listeners; a wildcard host is advertised as "
        "127.0.0.1, port 0 as the bound port).",
        read_only=True,
    ),
    ConfigDef(
        "listener.security.protocol.map",
        STRING,
        "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "Listener name to security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL).",
        read_only=True,
    ),
]
# The ssl.* keys; each can also be set for one listener as listener.name.<name>.<key>.
SSL_KEYS: list[ConfigDef] = [
    ConfigDef(
        "ssl.keystore.type",
        STRING,
        "JKS",
        "Format of the key store: spool reads PEM only.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.keystore.location",
        STRING,
        None,
        "PEM file holding the broker's certificate chain and private key.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.keystore.password",
        PASSWORD,
        None,
        "Not used with PEM key stores (set ssl.key.password for an encrypted key).",
        read_only=True,
    ),
    ConfigDef(
        "ssl.keystore.certificate.chain",
        PASSWORD,
        None,
        "The certificate chain as PEM text (with ssl.keystore.key, instead of a location).",
        read_only=True,
    ),
    ConfigDef(
        "ssl.keystore.key",
        PASSWORD,
        None,
        "The private key as PEM text (with ssl.keystore.certificate.chain).",
        read_only=True,
    ),
    ConfigDef(
        "ssl.key.password",
        PASSWORD,
        None,
        "Password of an encrypted private key.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.truststore.type",
        STRING,
        "JKS",
        "Format of the trust store: spool reads PEM only.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.truststore.location",
        STRING,
        None,
        "PEM file of the CA certificates client certificates are verified against.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.truststore.password",
        PASSWORD,
        None,
        "Not used with PEM trust stores.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.truststore.certificates",
        PASSWORD,
        None,
        "The trusted CA certificates as PEM text (instead of a location).",
        read_only=True,
    ),
    ConfigDef(
        "ssl.client.auth",
        STRING,
        "none",
        "Whether clients must present a certificate: none, requested or required.",
        one_of("none", "requested", "required"),
        read_only=True,
    ),
    ConfigDef(
        "ssl.enabled.protocols",
        LIST,
        "TLSv1.2,TLSv1.3",
        "TLS versions accepted from clients.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.endpoint.identification.algorithm",
        STRING,
        "https",
        "How a broker checks the host name of another broker's certificate when it "
        "connects to it on the inter-broker listener: https (the default) checks it "
        "against the address it connects to; empty (or none) does not check it.",
        read_only=True,
    ),
    ConfigDef(
        "ssl.principal.mapping.rules",
        STRING,
        "DEFAULT",
        "How a client certificate's subject DN becomes the principal name: spool has "
        "DEFAULT only (the DN as it is).",
        read_only=True,
    ),
]
# SASL (Kafka's BrokerSecurityConfigs / SaslConfigs), read at start. The broker takes a
# JAAS entry per listener and mechanism only, as Kafka's JaasContext.loadServerContext:
# listener.name.<listener>.<lower-cased mechanism>.sasl.jaas.config.
SASL_KEYS: list[ConfigDef] = [
    ConfigDef(
        "sasl.enabled.mechanisms",
        LIST,
        "GSSAPI",
        "SASL mechanisms enabled on SASL listeners: spool has PLAIN, SCRAM-SHA-256 and "
        "SCRAM-SHA-512 (Kafka's default, GSSAPI, is refused at startup).",
        read_only=True,
    ),
    ConfigDef(
        "sasl.jaas.config",
        PASSWORD,
        None,
        "A JAAS login module entry; the broker reads it per listener and mechanism, as "
        "listener.name.<listener>.<mechanism>.sasl.jaas.config (PLAIN users as "
        'user_<name>="<password>"; '
        "the SCRAM ScramLoginModule entry is optional, its users are in the cluster "
        "metadata).",
        read_only=True,
    ),
    ConfigDef(
        "java.security.auth.login.config",
        STRING,
        None,
        "A JAAS file (Kafka: the JVM property -Djava.security.auth.login.config): PLAIN "
        "users of a listener with no listener.name.<listener>.plain.sasl.jaas.config come "
        "from its <listener>.KafkaServer section, else its KafkaServer section.",
        read_only=True,
    ),
    ConfigDef(
        "connections.max.reauth.ms",
        LONG,
        0,
        "KIP-368: the longest a SASL session lasts before the client must re-authenticate "
        "on the connection (0: sessions do not expire); a connection that sends a request "
        "after its session expired is closed. Per listener and mechanism as "
        "listener.name.<listener>.<mechanism>.connections.max.reauth.ms.",
        _at_least(0),
        read_only=True,
    ),
    ConfigDef(
        "sasl.server.max.receive.size",
        INT,
        524288,
        "The largest frame a SASL listener reads from a client before it has "
        "authenticated (and while it re-authenticates); a larger one closes the "
        "connection, so no one who has not logged in makes the broker buffer up to "
        "socket.request.max.bytes.",
        _at_least(1),
        read_only=True,
    ),
]
# Authorization (KIP-11; Kafka's StandardAuthorizer), read at start.
AUTHORIZER_KEYS: list[ConfigDef] = [
    ConfigDef(
        "authorizer.class.name",
        STRING,
        "",
        "The authorizer: org.apache.kafka.metadata.authorizer.StandardAuthorizer turns ACLs "
        "on; empty (the default) allows every request.",
        read_only=True,
    ),
    ConfigDef(
        "super.users",
        STRING,
        "",
        "Principals allowed everything whatever the ACLs say, separated by ';' "
        "(User:admin;User:CN=ops,O=Acme).",
        read_only=True,
    ),
    ConfigDef(
        "allow.everyone.if.no.acl.found",
        BOOLEAN,
        False,
        "With an authorizer, allow a request on a resource that no ACL names.",
        read_only=True,
    ),
]
BROKER_KEYS.update({k.name: k for k in LISTENER_KEYS + SSL_KEYS + SASL_KEYS + AUTHORIZER_KEYS})
SSL_KEY_NAMES = frozenset(k.name for k in SSL_KEYS)
# Keys a listener may override besides ssl.* (`<mechanism>.sasl.jaas.config` too).
LISTENER_KEY_NAMES = SSL_KEY_NAMES | {"sasl.enabled.mechanisms", "connections.max.reauth.ms"}
JAAS_SUFFIX = ".sasl.jaas.config"
# listener.name.<listener>.<mechanism>.connections.max.reauth.ms (KIP-368, per mechanism)
REAUTH_SUFFIX = ".connections.max.reauth.ms"
# listener.name.<lower-cased listener name>.<key> (Kafka's ListenerName.configPrefix)
LISTENER_PREFIX = "listener.name."


def listener_key_def(key: str) -> ConfigDef | None:
    """The definition of a key as a listener override: ssl.*, sasl.enabled.mechanisms,
    connections.max.reauth.ms or <mechanism>.sasl.jaas.config."""
    if key in LISTENER_KEY_NAMES:
        return BROKER_KEYS[key]
    mechanism = key[: -len(JAAS_SUFFIX)] if key.endswith(JAAS_SUFFIX) else ""
    if mechanism and "." not in mechanism:
        return BROKER_KEYS["sasl.jaas.config"]
    mechanism = key[: -len(REAUTH_SUFFIX)] if key.endswith(REAUTH_SUFFIX) else ""
    if mechanism and "." not in mechanism:
        return BROKER_KEYS["connections.max.reauth.ms"]
    return None


def listener_override(name: str) -> tuple[str, str] | None:
    """(listener name, key) of a per-listener key, or None if `name` is not one."""
    if not name.startswith(LISTENER_PREFIX):
        return None
    rest = name[len(LISTENER_PREFIX) :]
    listener, sep, key = rest.partition(".")
    if not sep or not listener:
        return None
    for suffix in (JAAS_SUFFIX, REAUTH_SUFFIX):
        if key.endswith(suffix) and key != suffix[1:]:
            key = key[: -len(suffix)].lower() + suffix
    if listener_key_def(key) is None:
        return None
    return listener.lower(), key


# KIP-932's broker-level share-group keys (defaults and bounds of the group configs).
BROKER_KEYS.update(BROKER_CONFIG_DEFS)
# The group coordinator's keys for consumer and classic groups and committed offsets
# (Kafka's GroupCoordinatorConfig), read at start.
BROKER_KEYS.update(GROUP_COORDINATOR_CONFIG_DEFS)
# KIP-1191: the prefix dead-letter topics need and whether a missing one is created
# (dynamic, as Kafka reconfigures them).
BROKER_KEYS.update(DLQ_BROKER_CONFIG_DEFS)

# Where the broker's logs are durable (persister.storage), read at start. A password in
# the URL makes the key sensitive: it is typed PASSWORD, so DescribeConfigs hides it.
STORAGE_KEYS = [
    ConfigDef(
        "storage",
        PASSWORD,
        None,
        "Where the logs are made durable: unset for the data dir's files (fsynced), or a "
        "PostgreSQL URL (postgresql://user@host:port/db) to commit every write there, "
        "the data dir then being a cache restored from the database at start.",
        lambda v: (
            None
            if v is None or str(v).startswith(("postgresql://", "postgres://"))
            else "must be a postgresql:// URL"
        ),
        read_only=True,
    ),
    ConfigDef(
        "storage.password.file",
        STRING,
        None,
        "A file holding the storage database's password (its first line), instead of "
        "the URL or PGPASSWORD.",
        read_only=True,
    ),
    ConfigDef(
        "storage.metadata.poll.interval.ms",
        LONG,
        500,
        "spool only: how often a broker on PostgreSQL reads the cluster metadata the "
        "other brokers of its database wrote (topics, configs, ACLs, credentials), so "
        "a change made on one broker is served by every broker within about this long.",
        _at_least(1),
        read_only=True,
    ),
]
BROKER_KEYS.update({k.name: k for k in STORAGE_KEYS})

# The broker's lease in the cluster (Kafka's KRaftConfigs), read at start: brokers on one
# storage database register there and renew a lease (broker.registry).
CLUSTER_KEYS = [
    ConfigDef(
        "broker.heartbeat.interval.ms",
        INT,
        2000,
        "The length of time in milliseconds between broker heartbeats (renewals of the "
        "broker's lease in the storage database). At most half of "
        "broker.session.timeout.ms.",
        _at_least(1),
        read_only=True,
    ),
    ConfigDef(
        "broker.session.timeout.ms",
        INT,
        9000,
        "The length of time in milliseconds that a broker lease lasts if no heartbeats "
        "are made: then the broker is out of the cluster and its node.id free to take.",
        _at_least(1),
        read_only=True,
    ),
    ConfigDef(
        "inter.broker.listener.name",
        STRING,
        None,
        "Name of the listener brokers use to reach each other (share-state RPCs, "
        "transaction markers, produce verification). If unset, the listener named "
        "after security.inter.broker.protocol. It is an error to set both. It may be a "
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL listener: a broker connects to the "
        "others with that listener's own settings (its ssl.* trust store, its key store "
        "when ssl.client.auth asks for a certificate, ssl.endpoint.identification."
        "algorithm; on SASL sasl.mechanism.inter.broker.protocol with the username and "
        "password of listener.name.<listener>.<mechanism>.sasl.jaas.config).",
        read_only=True,
    ),
    ConfigDef(
        "security.inter.broker.protocol",
        STRING,
        "PLAINTEXT",
        "Security protocol used to communicate between brokers: the inter-broker "
        "listener is the one of this name when inter.broker.listener.name is unset. It "
        "is an error to set this and inter.broker.listener.name at the same time.",
        one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
        read_only=True,
    ),
    ConfigDef(
        "sasl.mechanism.inter.broker.protocol",
        STRING,
        "GSSAPI",
        "SASL mechanism used for communication between brokers on a SASL inter-broker "
        "listener; it must be one of the listener's sasl.enabled.mechanisms. spool has "
        "PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512: Kafka's default, GSSAPI, is refused at "
        "startup when the inter-broker listener is SASL.",
        read_only=True,
    ),
]
BROKER_KEYS.update({k.name: k for k in CLUSTER_KEYS})

TOPIC_KEYS: dict[str, ConfigDef] = {
    k.name: k
    for k in [
        ConfigDef(
            "cleanup.policy",
            LIST,
            "delete",
            "delete or compact.",
            one_of("delete", "compact", "compact,delete", "delete,compact"),
            "log.cleanup.policy",
        ),
        ConfigDef(
            "retention.ms",
            LONG,
            604800000,
            "Age after which segments are deleted.",
            _at_least(-1),
            "log.retention.ms",
        ),
        ConfigDef(
            "retention.bytes",
            LONG,
            -1,
            "Size above which old segments are deleted.",
            _at_least(-1),
            "log.retention.bytes",
        ),
        ConfigDef(
            "segment.bytes",
            INT,
            1073741824,
            "Segment size before a roll.",
            _at_least(14),
            "log.segment.bytes",
        ),
        ConfigDef(
            "segment.ms", LONG, 604800000, "Segment age before a roll.", _at_least(1), "log.roll.ms"
        ),
        ConfigDef(
            "max.message.bytes",
            INT,
            1048588,
            "Largest record batch accepted.",
            _at_least(0),
            "message.max.bytes",
        ),
        ConfigDef(
            "index.interval.bytes",
            INT,
            4096,
            "Bytes between offset-index entries.",
            _at_least(0),
            "log.index.interval.bytes",
        ),
        ConfigDef(
            "flush.messages",
            LONG,
            1,
            "Records appended before an fsync.",
            _at_least(1),
            "log.flush.interval.messages",
        ),
        ConfigDef(
            "message.timestamp.type",
            STRING,
            "CreateTime",
            "CreateTime or LogAppendTime.",
            one_of("CreateTime", "LogAppendTime"),
            "log.message.timestamp.type",
        ),
        ConfigDef(
            "compression.type",
            STRING,
            "producer",
            "Compression of stored batches.",
            one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
            "compression.type",
        ),
        ConfigDef(
            "min.insync.replicas",
            INT,
            1,
            "Kept for clients; spool is one node.",
            _at_least(1),
            "min.insync.replicas",
        ),
        # KIP-1191 (Kafka's TopicConfig after 4.2): no broker synonym.
        ConfigDef(
            DLQ_GROUP_ENABLE,
            BOOLEAN,
            False,
            "Whether share groups may use this topic as their dead-letter topic "
            "(errors.deadletterqueue.topic.name); false refuses them.",
        ),
    ]
}


def parse_value(key: ConfigDef, raw: Any, *, resource: str) -> Any:
    """Parse and validate a config value; KafkaError(INVALID_CONFIG) says which and why."""
    try:
        if key.type == BOOLEAN:
            if isinstance(raw, bool):
                value: Any = raw
            elif str(raw).strip().lower() in ("true", "false"):
                value = str(raw).strip().lower() == "true"
            else:
                raise ValueError("expected true or false")
        elif key.type in (INT, SHORT, LONG):
            if isinstance(raw, bool):
                raise ValueError("expected a whole number")
            value = int(str(raw).strip())
            limit = {INT: INT_MAX, SHORT: 2**15 - 1, LONG: LONG_MAX}[key.type]
            if not -limit - 1 <= value <= limit:
                raise ValueError("out of range")
        elif key.type == DOUBLE:
            value = float(raw)
        else:
            value = None if raw is None else str(raw).strip()
    except ValueError as exc:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"Invalid value {raw!r} for {resource} config {key.name}: {exc}",
        ) from None
    if value is not None:
        problem = key.problem(value)
        if problem:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"Invalid value {raw!r} for {resource} config {key.name}: {problem}",
            )
    return value


def format_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Where a broker config value came from (DescribeConfigs ConfigSource).
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


_MISSING = object()


class BrokerConfig:
    """The broker's effective configuration: static values plus dynamic overrides."""

    def __init__(self, static: Mapping[str, Any]) -> None:
        self.static: dict[str, Any] = {}
        # (lower-cased listener name, ssl key) -> value: listener.name.<name>.ssl.* keys
        self.listener_overrides: dict[tuple[str, str], Any] = {}
        for name, raw in static.items():
            key = BROKER_KEYS.get(name)
            override = listener_override(name) if key is None else None
            if override is not None:
                key_def = listener_key_def(override[1])
                assert key_def is not None
                self.listener_overrides[override] = parse_value(key_def, raw, resource="broker")
                continue
            if key is None:
                raise KafkaError(ErrorCode.invalid_config, f"Unknown broker config {name!r}")
            self.static[name] = parse_value(key, raw, resource="broker")
        # Dynamic configs (the cluster metadata's): this broker's own, then the cluster's.
        self.dynamic: dict[str, Any] = {}
        self.dynamic_default: dict[str, Any] = {}
        self.share_groups()  # the group.share.* keys must also agree with each other
        self.group_coordinator()  # and the group.consumer.* keys
        self._check_broker_lease()

    def _check_broker_lease(self) -> None:
        """broker.heartbeat.interval.ms at most half of broker.session.timeout.ms, as
        Kafka's KafkaConfig requires (it logs an error; spool refuses to start, since
        both are this broker's: a lease renewed less often than that is lost whenever one
        renewal is late)."""
        interval = self.get("broker.heartbeat.interval.ms")
        session = self.get("broker.session.timeout.ms")
        if interval * 2 > session:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"broker.heartbeat.interval.ms ({interval} ms) must be less than or equal "
                f"to half of broker.session.timeout.ms ({session} ms): if a broker does not "
                "renew its lease within broker.session.timeout.ms, it loses it; increase "
                "broker.session.timeout.ms or decrease broker.heartbeat.interval.ms",
            )

    def share_groups(self) -> ShareGroupBrokerConfig:
        """The effective `group.share.*` values, checked against each other."""
        return ShareGroupBrokerConfig.from_mapping(
            {name: self.get(name) for name in BROKER_CONFIG_DEFS}
        )

    def group_coordinator(self) -> GroupCoordinatorConfig:
        """The group coordinator's keys (consumer, classic and share groups, offsets),
        checked against each other, as one frozen object."""
        return GroupCoordinatorConfig.from_mapping(
            {name: self.get(name) for name in (*GROUP_COORDINATOR_CONFIG_DEFS, *BROKER_CONFIG_DEFS)}
        )

    def get(self, name: str) -> Any:
        if name in self.dynamic:
            return self.dynamic[name]
        if name in self.dynamic_default:
            return self.dynamic_default[name]
        if name in self.static:
            return self.static[name]
        return BROKER_KEYS[name].default

    def for_listener(self, listener: str, name: str) -> Any:
        """An ssl.* key's value for one listener: its listener.name.<name>. override
        (Kafka's per-listener configs) or else the broker-wide value."""
        override = self.listener_overrides.get((listener.lower(), name), _MISSING)
        if override is _MISSING:
            return self.get(name) if name in BROKER_KEYS else None
        return override

    def source(self, name: str) -> int:
        if name in self.dynamic:
            return SOURCE_DYNAMIC_BROKER
        if name in self.dynamic_default:
            return SOURCE_DYNAMIC_DEFAULT_BROKER
        if name in self.static:
            return SOURCE_STATIC_BROKER
        return SOURCE_DEFAULT

    def topic_default(self, name: str) -> Any:
        key = TOPIC_KEYS[name]
        return self.get(key.broker_synonym) if key.broker_synonym else key.default

    def topic_config(self, overrides: Mapping[str, Any], name: str) -> Any:
        return overrides[name] if name in overrides else self.topic_default(name)


def load_static(
    config_file: Path | None, sets: list[str], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Merge the file, the environment and `--set` pairs, in that order of precedence."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        with open(config_file, "rb") as fh:
            merged.update(_flatten(tomllib.load(fh)))
    env = os.environ if environ is None else environ
    for name in BROKER_KEYS:
        var = "SPOOL_" + name.upper().replace(".", "_")
        if var in env:
            merged[name] = env[var]
    # SPOOL_LISTENER_NAME_<NAME>_SSL_<KEY>: listener.name.<name>.ssl.<key>;
    # SPOOL_LISTENER_NAME_<NAME>_<MECHANISM>_SASL_JAAS_CONFIG and
    # SPOOL_LISTENER_NAME_<NAME>_SASL_ENABLED_MECHANISMS likewise.
    env_prefix = "SPOOL_" + LISTENER_PREFIX.upper().replace(".", "_")
    for var in sorted(env):
        sasl_name = _sasl_env_name(var[len(env_prefix) :]) if var.startswith(env_prefix) else None
        if sasl_name is not None:
            merged[sasl_name] = env[var]
        elif var.startswith(env_prefix) and "_SSL_" in var[len(env_prefix) :]:
            listener, _, key = var[len(env_prefix) :].rpartition("_SSL_")
            name = f"{LISTENER_PREFIX}{listener.lower()}.ssl.{key.lower().replace('_', '.')}"
            if listener_override(name) is not None:
                merged[name] = env[var]
    for pair in sets:
        if "=" not in pair:
            raise KafkaError(ErrorCode.invalid_config, f"--set expects key=value, got {pair!r}")
        name, _, value = pair.partition("=")
        merged[name.strip()] = value
    return merged


_ENV_MECHANISMS = ("PLAIN", "SCRAM_SHA_256", "SCRAM_SHA_512", "GSSAPI", "OAUTHBEARER")


def _sasl_env_name(rest: str) -> str | None:
    """The listener.name.* key of a SPOOL_LISTENER_NAME_ variable's tail, if SASL's."""
    for mechanism in _ENV_MECHANISMS:
        suffix = f"_{mechanism}_CONNECTIONS_MAX_REAUTH_MS"
        if rest.endswith(suffix) and len(rest) > len(suffix):
            name = mechanism.lower().replace("_", "-")
            return f"{LISTENER_PREFIX}{rest[: -len(suffix)].lower()}.{name}{REAUTH_SUFFIX}"
    for suffix, key in (
        ("_SASL_ENABLED_MECHANISMS", "sasl.enabled.mechanisms"),
        ("_CONNECTIONS_MAX_REAUTH_MS", "connections.max.reauth.ms"),
    ):
        if rest.endswith(suffix) and len(rest) > len(suffix):
            return f"{LISTENER_PREFIX}{rest[: -len(suffix)].lower()}.{key}"
    if rest.endswith("_SASL_JAAS_CONFIG"):
        head = rest[: -len("_SASL_JAAS_CONFIG")]
        for mechanism in _ENV_MECHANISMS:
            if head.endswith("_" + mechanism) and len(head) > len(mechanism) + 1:
                listener = head[: -len(mechanism) - 1].lower()
                name = mechanism.lower().replace("_", "-")
                return f"{LISTENER_PREFIX}{listener}.{name}{JAAS_SUFFIX}"
    return None


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML tables become dotted keys: [log] segment.bytes = 1 -> log.segment.bytes."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out
