"""`spool topics`: create, list, describe, alter (partitions) and delete topics, as Kafka
4.2's kafka-topics.sh does (its flags, rules and output)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from broker.tools.common import (
    UsageError,
    add_connection_flags,
    print_json,
    run_admin,
    usage_checked,
)

if TYPE_CHECKING:
    from protocol.admin import AdminClient

ACTIONS = ("list", "describe", "create", "alter", "delete")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "topics",
        help="create, list, describe, alter and delete topics (kafka-topics.sh)",
        description="Create, delete, describe, or change a topic.",
    )
    add_connection_flags(p)
    actions = p.add_argument_group("actions (exactly one)")
    actions.add_argument("--create", action="store_true", help="create a new topic")
    actions.add_argument("--list", action="store_true", help="list all topics")
    actions.add_argument("--describe", action="store_true", help="describe topics")
    actions.add_argument("--alter", action="store_true", help="add partitions to a topic")
    actions.add_argument("--delete", action="store_true", help="delete topics")
    p.add_argument(
        "--topic",
        metavar="TOPIC",
        help="the topic; with --list, --describe, --alter and --delete a regular expression",
    )
    p.add_argument("--partitions", type=int, help="partitions of the topic (--create, --alter)")
    p.add_argument(
        "--replication-factor", type=int, help="replication factor of a new topic (--create)"
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic config of a new topic (repeatable)",
    )
    p.add_argument(
        "--if-exists", action="store_true", help="--alter, --describe, --delete: only if it exists"
    )
    p.add_argument(
        "--if-not-exists", action="store_true", help="--create: only if it does not exist"
    )
    p.add_argument(
        "--exclude-internal", action="store_true", help="--list, --describe: no internal topics"
    )
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


def validate(args: argparse.Namespace) -> None:
    """TopicCommandOptions.checkArgs."""
    chosen = [a for a in ACTIONS if getattr(args, a)]
    if len(chosen) != 1:
        raise UsageError(
            "Command must include exactly one action: --list, --describe, --create, --alter "
            "or --delete"
        )
    action = chosen[0]
    if action in ("create", "alter", "delete") and args.topic is None:
        raise UsageError(f"Missing required argument --topic for --{action}")
    if action == "alter" and args.partitions is None:
        raise UsageError("Missing required argument --partitions for --alter")
    if args.config and action != "create":
        hint = (
            " (use `spool configs --alter --entity-type topics` to change a topic's configs)"
            if action == "alter"
            else ""
        )
        raise UsageError(f"Option --config can't be used with option --{action}{hint}")
    if args.partitions is not None and action not in ("create", "alter"):
        raise UsageError(f"Option --partitions can't be used with option --{action}")
    if args.replication_factor is not None and action != "create":
        raise UsageError(f"Option --replication-factor can't be used with option --{action}")
    if args.if_exists and action not in ("alter", "describe", "delete"):
        raise UsageError(f"Option --if-exists can't be used with option --{action}")
    if args.if_not_exists and action != "create":
        raise UsageError(f"Option --if-not-exists can't be used with option --{action}")
    if args.exclude_internal and action not in ("list", "describe"):
        raise UsageError(f"Option --exclude-internal can't be used with option --{action}")
    if args.partitions is not None and args.partitions < 1:
        raise UsageError("The partitions must be greater than 0")
    if args.replication_factor is not None and not 1 <= args.replication_factor <= 32767:
        raise UsageError("The replication factor must be between 1 and 32767 inclusive")
    parse_configs(args.config)
    if args.topic is not None and action != "create":
        topic_pattern(args.topic)


def parse_configs(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"Invalid topic config: all configs must be KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def topic_pattern(text: str) -> re.Pattern[str]:
    """Kafka's IncludeList: a regular expression, commas meaning alternatives."""
    try:
        return re.compile(text.strip().replace(",", "|"))
    except re.error as exc:
        raise UsageError(f"--topic {text!r} is not a valid regular expression: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    async def body(admin: AdminClient) -> int:
        try:
            if args.create:
                return await create(admin, args)
            topics = await matching_topics(admin, args)
            if args.list:
                return list_topics(topics, args)
            if args.describe:
                return await describe(admin, topics, args)
            if args.alter:
                for name in topics:
                    await admin.create_partitions(name, args.partitions)
                return 0
            if topics:
                await admin.delete_topics(topics)
            return 0
        except AdminError as exc:
            print(
                f"Error while executing topic command : {exc.error}: {exc.message}",
                file=sys.stderr,
            )
            return 1

    return run_admin(args, body)


async def matching_topics(admin: AdminClient, args: argparse.Namespace) -> list[str]:
    from protocol.admin import AdminError

    names = await admin.list_topics(include_internal=not args.exclude_internal)
    if args.topic is None:
        return names
    pattern = topic_pattern(args.topic)
    found = [n for n in names if pattern.fullmatch(n)]
    if not found and not args.list and not args.if_exists:
        raise AdminError(
            "UNKNOWN_TOPIC_OR_PARTITION", f"Topic '{args.topic}' does not exist as expected"
        )
    return found


async def create(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    if "." in args.topic and "_" in args.topic:
        print(
            "WARNING: Due to limitations in metric names, topics with a period ('.') or "
            "underscore ('_') could collide. To avoid issues it is best to use either, but "
            "not both.",
            file=sys.stderr,
        )
    try:
        await admin.create_topic(
            args.topic,
            -1 if args.partitions is None else args.partitions,
            -1 if args.replication_factor is None else args.replication_factor,
            parse_configs(args.config),
        )
    except AdminError as exc:
        if exc.error == "TOPIC_ALREADY_EXISTS" and args.if_not_exists:
            return 0
        raise
    if args.output == "json":
        print_json({"created": args.topic})
    else:
        print(f"Created topic {args.topic}.")
    return 0


def list_topics(topics: list[str], args: argparse.Namespace) -> int:
    if args.output == "json":
        print_json(topics)
    elif topics:
        print("\n".join(topics))
    return 0


async def describe(admin: AdminClient, names: list[str], args: argparse.Namespace) -> int:
    from protocol.admin import RESOURCE_TOPIC

    out: list[dict[str, Any]] = []
    for t in await admin.describe_topics(names) if names else []:
        configs = [
            c
            for c in await admin.describe_configs(RESOURCE_TOPIC, t.name, False)
            if not c.is_default
        ]
        replication = len(t.partitions[0].replicas) if t.partitions else 0
        out.append(
            {
                "topic": t.name,
                "topic_id": None if t.topic_id is None else str(t.topic_id),
                "partition_count": len(t.partitions),
                "replication_factor": replication,
                "configs": {c.name: c.value for c in configs},
                "partitions": [
                    {
                        "partition": p.partition,
                        "leader": p.leader if p.leader >= 0 else None,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                    }
                    for p in t.partitions
                ],
            }
        )
    if args.output == "json":
        print_json(out)
        return 0
    for d in out:
        head = f"Topic: {d['topic']}"
        if d["topic_id"] is not None:
            head += f"\tTopicId: {d['topic_id']}"
        overrides = ",".join(f"{k}={v}" for k, v in d["configs"].items())
        print(
            f"{head}\tPartitionCount: {d['partition_count']}"
            f"\tReplicationFactor: {d['replication_factor']}\tConfigs: {overrides}"
        )
        for p in d["partitions"]:
            leader = "none" if p["leader"] is None else p["leader"]
            print(
                f"\tTopic: {d['topic']}\tPartition: {p['partition']}\tLeader: {leader}"
                f"\tReplicas: {','.join(map(str, p['replicas']))}"
                f"\tIsr: {','.join(map(str, p['isr']))}\tElr: N/A\tLastKnownElr: N/A"
            )
    return 0
