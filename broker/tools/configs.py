"""`spool configs`: describe and alter the configs of topics, brokers and groups, as
Kafka 4.2's kafka-configs.sh does with --bootstrap-server (its flags, rules and output),
and users' SCRAM credentials (`--entity-type users`, run by broker.tools.users)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from broker.tools import users
from broker.tools.common import (
    UsageError,
    add_connection_flags,
    parse_add_config,
    parse_delete_config,
    print_json,
    run_admin,
    usage_checked,
)

if TYPE_CHECKING:
    from protocol.admin import AdminClient, ConfigEntry

ENTITY_TYPES = ("topics", "brokers", "groups", "users")
# The config source of a dynamic value per entity type (ConfigCommand.getResourceConfig).
DYNAMIC_SOURCE = {
    "topics": "DYNAMIC_TOPIC_CONFIG",
    "brokers": "DYNAMIC_BROKER_CONFIG",
    "groups": "GROUP_CONFIG",
}
BROKER_DEFAULT_SOURCE = "DYNAMIC_DEFAULT_BROKER_CONFIG"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "configs",
        help="describe and alter topic, broker and group configs (kafka-configs.sh)",
        description="Describe and alter the configs of topics, brokers and groups.",
    )
    add_connection_flags(p)
    p.add_argument("--describe", action="store_true", help="list the configs of the entity")
    p.add_argument("--alter", action="store_true", help="change the configs of the entity")
    p.add_argument(
        "--entity-type", metavar="TYPE", help=f"type of entity ({', '.join(ENTITY_TYPES)})"
    )
    p.add_argument("--entity-name", metavar="NAME", help="name of the entity (broker: its id)")
    p.add_argument(
        "--entity-default", action="store_true", help="the cluster-wide default (brokers)"
    )
    p.add_argument(
        "--all", action="store_true", help="with --describe: every config, not only dynamic ones"
    )
    p.add_argument(
        "--add-config",
        metavar="K=V,K2=[V1,V2]",
        help="configs to set, comma-separated; square brackets group a list value",
    )
    p.add_argument("--delete-config", metavar="K,K2", help="configs to remove, comma-separated")
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


def validate(args: argparse.Namespace) -> None:
    """ConfigCommandOptions.checkArgs, for the entity types spool has."""
    if int(args.describe) + int(args.alter) != 1:
        raise UsageError("Command must include exactly one action: --describe, --alter")
    if args.entity_type == "users":
        users.validate_users(args)
        return
    if args.describe:
        for name, value in (("add-config", args.add_config), ("delete-config", args.delete_config)):
            if value is not None:
                raise UsageError(f"Option --{name} can't be used with option --describe")
    elif args.all:
        raise UsageError("Option --all can't be used with option --alter")
    if args.entity_type is None:
        raise UsageError("At least one entity type must be specified")
    if args.entity_type not in ENTITY_TYPES:
        raise UsageError(
            f"Invalid entity type {args.entity_type}, the entity type must be one of "
            f"{', '.join(ENTITY_TYPES)} with a --bootstrap-server argument"
        )
    if args.entity_name is not None and args.entity_default:
        raise UsageError("Exactly one entity name must be specified for every entity type")
    if args.entity_type == "brokers" and args.entity_name is not None:
        try:
            int(args.entity_name)
        except ValueError:
            raise UsageError(
                "The entity name for brokers must be a valid integer broker id, but it is: "
                f"{args.entity_name}"
            ) from None
    if args.entity_default and args.entity_type != "brokers":
        action = "describe" if args.describe else "alter"
        raise UsageError(
            f"--entity-default must not be specified with --{action} of {args.entity_type}"
        )
    if args.alter:
        if args.entity_type == "brokers":
            if args.entity_name is None and not args.entity_default:
                raise UsageError(
                    "An entity-name or default entity must be specified with --alter of brokers"
                )
        elif args.entity_name is None:
            raise UsageError(f"An entity name must be specified with --alter of {args.entity_type}")
        if args.add_config is None and args.delete_config is None:
            raise UsageError(
                "At least one of --add-config or --delete-config must be specified with --alter"
            )
        parse_add_config(args.add_config or "")


def resource_type(entity_type: str) -> int:
    from protocol.admin import RESOURCE_BROKER, RESOURCE_GROUP, RESOURCE_TOPIC

    return {"topics": RESOURCE_TOPIC, "brokers": RESOURCE_BROKER, "groups": RESOURCE_GROUP}[
        entity_type
    ]


def dynamic_source(entity_type: str, name: str) -> str:
    return (
        BROKER_DEFAULT_SOURCE
        if entity_type == "brokers" and not name
        else DYNAMIC_SOURCE[entity_type]
    )


def run(args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    if args.entity_type == "users":
        return run_admin(args, lambda admin: users.run_users(admin, args))

    async def body(admin: AdminClient) -> int:
        try:
            return await (describe(admin, args) if args.describe else alter(admin, args))
        except AdminError as exc:
            print(f"Error: {exc.error}: {exc.message}", file=sys.stderr)
            return 1

    return run_admin(args, body)


async def entities(admin: AdminClient, args: argparse.Namespace) -> list[str] | None:
    """The entities to describe; None when the named one does not exist."""
    kind = args.entity_type
    if kind == "topics":
        names = await admin.list_topics(include_internal=True)
        if args.entity_name is None:
            return names
        return [args.entity_name] if args.entity_name in names else None
    if kind == "brokers":
        ids = [str(t.node_id) for t in await admin.brokers()]
        if args.entity_default:
            return [""]
        if args.entity_name is None:
            return [*ids, ""]
        return [args.entity_name] if args.entity_name in ids else None
    # A group's configs may be set before the group exists: describe the name given.
    if args.entity_name is not None:
        return [args.entity_name]
    return [g.group_id for g in await admin.list_groups()]


def dynamic_only(entries: list[ConfigEntry], source: str) -> list[ConfigEntry]:
    return [e for e in entries if e.source == source]


async def describe(admin: AdminClient, args: argparse.Namespace) -> int:
    names = await entities(admin, args)
    singular = args.entity_type[:-1]
    if names is None:
        print(f"The {singular} '{args.entity_name}' doesn't exist and doesn't have dynamic config.")
        return 0
    out = []
    for name in names:
        entries = await admin.describe_configs(resource_type(args.entity_type), name, True)
        if not args.all:
            entries = dynamic_only(entries, dynamic_source(args.entity_type, name))
        out.append((name, entries))
    if args.output == "json":
        print_json(
            [
                {
                    "entity_type": args.entity_type,
                    "entity_name": name or None,
                    "configs": [
                        {
                            "name": e.name,
                            "value": None if e.sensitive else e.value,
                            "source": e.source,
                            "sensitive": e.sensitive,
                            "read_only": e.read_only,
                            "synonyms": [
                                {"name": s.name, "value": s.value, "source": s.source}
                                for s in e.synonyms
                            ],
                        }
                        for e in entries
                    ],
                }
                for name, entries in out
            ]
        )
        return 0
    for name, entries in out:
        if not name:
            print(f"Default configs for {args.entity_type} in the cluster are:")
        else:
            print(f"{'All' if args.all else 'Dynamic'} configs for {singular} {name} are:")
        for e in entries:
            # A null value prints as `null`, as kafka-configs.sh prints it (broker.rack unset).
            synonyms = ", ".join(f"{s.source}:{s.name}={_text(s.value)}" for s in e.synonyms)
            value = None if e.sensitive else e.value
            print(
                f"  {e.name}={_text(value)} sensitive={str(e.sensitive).lower()} "
                f"synonyms={{{synonyms}}}"
            )
    return 0


async def alter(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    name = "" if args.entity_default else args.entity_name
    kind = resource_type(args.entity_type)
    to_set = parse_add_config(args.add_config or "")
    to_delete = parse_delete_config(args.delete_config)
    if to_delete:
        current = dynamic_only(
            await admin.describe_configs(kind, name, False), dynamic_source(args.entity_type, name)
        )
        unknown = [k for k in to_delete if k not in {e.name for e in current}]
        if unknown:
            raise AdminError("INVALID_CONFIG", f"Invalid config(s): {','.join(unknown)}")
    await admin.incremental_alter_configs(kind, name, to_set, to_delete)
    if args.output == "json":
        print_json({"entity_type": args.entity_type, "entity_name": name or None, "altered": True})
    elif name:
        print(f"Completed updating config for {args.entity_type[:-1]} {name}.")
    else:
        print(f"Completed updating default config for {args.entity_type} in the cluster.")
    return 0


def _text(value: str | None) -> str:
    return "null" if value is None else value
