"""`spool cluster`: the brokers of a cluster, the leader of each partition and where the
coordinators are, asked with Kafka's own APIs only (DescribeCluster, Metadata,
FindCoordinator), so it shows what a client is told.

    spool cluster --bootstrap-server HOST:PORT [--topic T] [--group G]
                  [--transactional-id ID] [--command-config FILE] [--output json]

The output reads like Kafka's tools (kafka-topics.sh --describe for the partitions):

    ClusterId: 4L6g3nShT-eMCtK--X86sw	Controller: 2	Brokers: 3
    Broker: 1	Endpoint: 127.0.0.1:9092	Rack: null
    Topic: orders	TopicId: ...	PartitionCount: 6	Leaders: 1=2,2=2,3=2
        Topic: orders	Partition: 0	Leader: 2	LeaderEpoch: 1	Replicas: 2	Isr: 2
    Coordinator: GROUP	Key: spool-cluster	Broker: 2	Endpoint: 127.0.0.1:9093

The controller is the id the asked broker reports in DescribeCluster (a KRaft broker
names a live broker at random: it forwards what a client sends there). Coordinators
are found for a key: `--group G` (the group coordinator of G, and the share
coordinator of each `G:topicId:partition` key of the topics shown, the key Kafka's
share coordinator uses), `--transactional-id ID`; without them a probe key,
`spool-cluster`. A coordinator that has no live leader at the moment shows its error
(COORDINATOR_NOT_AVAILABLE) rather than a broker.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from broker.tools.common import add_connection_flags, print_json, run_admin, usage_checked
from broker.tools.topics import topic_pattern

if TYPE_CHECKING:
    from protocol.admin import AdminClient, ClusterDescription, CoordinatorInfo, TopicInfo

PROBE_KEY = "spool-cluster"
# FindCoordinator key types (Kafka's CoordinatorType ids), in the order shown.
KEY_TYPES = (("GROUP", 0), ("SHARE", 2), ("TRANSACTION", 1))


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cluster",
        help="brokers, partition leaders and coordinators of a cluster",
        description="Show the live brokers, the leader of each partition and where the "
        "group, share and transaction coordinators are, as the brokers answer clients.",
    )
    add_connection_flags(p)
    p.add_argument("--topic", metavar="TOPIC", help="only topics matching this regular expression")
    p.add_argument(
        "--group",
        metavar="GROUP",
        help="find the group coordinator of this group and the share coordinator of its "
        f"partitions' keys (default: the key {PROBE_KEY!r})",
    )
    p.add_argument(
        "--transactional-id",
        metavar="ID",
        help=f"find the transaction coordinator of this id (default: the key {PROBE_KEY!r})",
    )
    p.add_argument("--exclude-internal", action="store_true", help="no internal topics")
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


def validate(args: argparse.Namespace) -> None:
    if args.topic is not None:
        topic_pattern(args.topic)


def run(args: argparse.Namespace) -> int:
    async def body(admin: AdminClient) -> int:
        described = await admin.describe_cluster()
        names = await admin.list_topics(include_internal=not args.exclude_internal)
        if args.topic is not None:
            pattern = topic_pattern(args.topic)
            names = [n for n in names if pattern.fullmatch(n)]
            if not names:
                print(f"Error: no topic matches --topic {args.topic!r}", file=sys.stderr)
                return 1
        topics = await admin.describe_topics(names) if names else []
        coordinators = await find_coordinators(admin, args, topics)
        view = cluster_view(described, topics, coordinators)
        if args.output == "json":
            print_json(view)
        else:
            print(format_view(view))
        return 0

    return run_admin(args, body)


async def find_coordinators(
    admin: AdminClient, args: argparse.Namespace, topics: list[TopicInfo]
) -> list[CoordinatorInfo]:
    group = args.group or PROBE_KEY
    share_keys = [
        f"{group}:{t.topic_id}:{p.partition}"
        for t in topics
        if args.group is not None and t.topic_id is not None
        for p in t.partitions
    ] or [group]
    keys = {0: [group], 2: share_keys, 1: [args.transactional_id or PROBE_KEY]}
    found: list[CoordinatorInfo] = []
    for _name, key_type in KEY_TYPES:
        found += await admin.find_coordinators(keys[key_type], key_type)
    return found


def cluster_view(
    described: ClusterDescription, topics: list[TopicInfo], coordinators: list[CoordinatorInfo]
) -> dict[str, Any]:
    """What is shown, as plain data (the JSON output)."""
    names = {key_type: name for name, key_type in KEY_TYPES}
    return {
        "cluster_id": described.cluster_id,
        "controller_id": described.controller_id,
        "brokers": [
            {"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in described.brokers
        ],
        "topics": [
            {
                "topic": t.name,
                "topic_id": None if t.topic_id is None else str(t.topic_id),
                "partitions": [
                    {
                        "partition": p.partition,
                        "leader": p.leader if p.leader >= 0 else None,
                        "leader_epoch": p.leader_epoch,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                    }
                    for p in t.partitions
                ],
            }
            for t in topics
        ],
        "coordinators": [
            {
                "type": names[c.key_type],
                "key": c.key,
                "id": None if c.node is None else c.node.node_id,
                "endpoint": None if c.node is None else c.node.address,
                "error": c.error,
                "message": c.message,
            }
            for c in coordinators
        ],
    }


def format_view(view: dict[str, Any]) -> str:
    lines = [
        f"ClusterId: {view['cluster_id']}\tController: {view['controller_id']}"
        f"\tBrokers: {len(view['brokers'])}"
    ]
    for b in view["brokers"]:
        rack = "null" if b["rack"] is None else b["rack"]
        lines.append(f"Broker: {b['id']}\tEndpoint: {b['host']}:{b['port']}\tRack: {rack}")
    for t in view["topics"]:
        counts = Counter(p["leader"] for p in t["partitions"])
        spread = ",".join(
            f"{'none' if leader is None else leader}={n}"
            for leader, n in sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
        )
        head = f"Topic: {t['topic']}"
        if t["topic_id"] is not None:
            head += f"\tTopicId: {t['topic_id']}"
        lines.append(f"{head}\tPartitionCount: {len(t['partitions'])}\tLeaders: {spread}")
        for p in t["partitions"]:
            leader = "none" if p["leader"] is None else p["leader"]
            lines.append(
                f"\tTopic: {t['topic']}\tPartition: {p['partition']}\tLeader: {leader}"
                f"\tLeaderEpoch: {p['leader_epoch']}"
                f"\tReplicas: {','.join(map(str, p['replicas']))}"
                f"\tIsr: {','.join(map(str, p['isr']))}"
            )
    for c in view["coordinators"]:
        where = (
            f"Broker: {c['id']}\tEndpoint: {c['endpoint']}"
            if c["id"] is not None
            else f"Broker: none\tError: {c['error']}: {c['message'] or ''}".rstrip(": ")
        )
        lines.append(f"Coordinator: {c['type']}\tKey: {c['key']}\t{where}")
    return "\n".join(lines)
