"""`spool acls`: add, list and remove ACLs as Kafka 4.2's kafka-acls.sh does (its flags,
its checks and messages, its output).

- `--add` needs `--allow-principal` or `--deny-principal` and a resource (`--topic`,
  `--group`, `--cluster`, `--transactional-id`, `--delegation-token`, `--user-principal`,
  each repeatable); `--operation` (repeatable, default All) and `--allow-host` /
  `--deny-host` (default `*`) make one ACL per principal, operation and host. An ACL
  that exists is reported and left alone. `--resource-pattern-type` is literal
  (default) or prefixed.
- `--producer` grants WRITE, DESCRIBE and CREATE on the topics (WRITE and DESCRIBE on
  the transactional ids; IDEMPOTENT_WRITE on the cluster with `--idempotent`);
  `--consumer` grants READ and DESCRIBE on the topics and READ on the groups.
- `--list` shows the ACLs of the resources given (all with none), `--principal` keeps
  only that principal's; `--resource-pattern-type any` matches a name under every
  pattern type, `match` every ACL that applies to the resource.
- `--remove` deletes the ACLs the flags name; with no principal, every ACL of the
  resource filter. It asks first, as kafka-acls.sh does, unless `--force` is given;
  with no terminal to ask on (a script, CI) it removes nothing and fails, as
  kafka-acls.sh does, rather than remove unasked.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from broker.tools.common import (
    UsageError,
    add_connection_flags,
    print_json,
    run_admin,
    usage_checked,
)
from coordinator.acls import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

if TYPE_CHECKING:
    from protocol.admin import AclEntry, AclFilter, AdminClient

ACTIONS = ("add", "remove", "list")

# (resource type, name or None for any, pattern type): a resource pattern or filter.
Pattern = tuple[ResourceType, str | None, PatternType]
# (principal, host, operation, permission): an access-control entry.
Entry = tuple[str, str, AclOperation, AclPermissionType]

# The operations kafka-acls.sh lists in its help, in its spelling.
OPERATION_NAMES = (
    "Describe",
    "DescribeConfigs",
    "Alter",
    "IdempotentWrite",
    "Read",
    "Delete",
    "Create",
    "ClusterAction",
    "All",
    "CreateTokens",
    "DescribeTokens",
    "Write",
    "AlterConfigs",
    "TwoPhaseCommit",
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "acls",
        help="add, list and remove ACLs (kafka-acls.sh)",
        description="This tool helps to manage acls on kafka.",
    )
    add_connection_flags(p)
    actions = p.add_argument_group("actions (exactly one)")
    actions.add_argument("--add", action="store_true", help="add ACLs")
    actions.add_argument("--remove", action="store_true", help="remove ACLs")
    actions.add_argument(
        "--list",
        action="store_true",
        help="list ACLs of the resources given (--topic, --group, --cluster, ...), or all",
    )
    res = p.add_argument_group("resources (repeatable; '*' means all of a type)")
    res.add_argument("--topic", action="append", default=[], metavar="TOPIC")
    res.add_argument("--group", action="append", default=[], metavar="GROUP")
    res.add_argument("--cluster", action="store_true", help="the cluster resource")
    res.add_argument("--transactional-id", action="append", default=[], metavar="TRANSACTIONAL_ID")
    res.add_argument("--delegation-token", action="append", default=[], metavar="TOKEN")
    res.add_argument(
        "--user-principal",
        action="append",
        default=[],
        metavar="PRINCIPAL",
        help="a user principal as the resource (CreateTokens, DescribeTokens)",
    )
    p.add_argument(
        "--resource-pattern-type",
        type=_pattern_type,
        default=PatternType.LITERAL,
        metavar="literal|prefixed|any|match",
        help="literal (default) or prefixed for --add; also any (the name under every "
        "pattern type) or match (every ACL that applies to the resource) for --list and "
        "--remove. WARNING: match with --remove removes every ACL affecting the resource",
    )
    p.add_argument(
        "--operation",
        action="append",
        default=[],
        metavar="OPERATION",
        help="operation allowed or denied (repeatable, default All): " + ", ".join(OPERATION_NAMES),
    )
    p.add_argument(
        "--allow-principal",
        action="append",
        default=[],
        metavar="TYPE:NAME",
        help="principal allowed, e.g. User:alice; User:* is every user",
    )
    p.add_argument(
        "--deny-principal",
        action="append",
        default=[],
        metavar="TYPE:NAME",
        help="principal denied (DENY rules take precedence over ALLOW rules)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="host the allowed principals may connect from (default * with --allow-principal)",
    )
    p.add_argument(
        "--deny-host",
        action="append",
        default=[],
        metavar="HOST",
        help="host the denied principals are refused from (default * with --deny-principal)",
    )
    p.add_argument(
        "--principal",
        action="append",
        default=[],
        metavar="TYPE:NAME",
        help="--list: only this principal's ACLs (repeatable)",
    )
    p.add_argument(
        "--producer",
        action="store_true",
        help="ACLs for a producer: WRITE, DESCRIBE and CREATE on the topics",
    )
    p.add_argument(
        "--idempotent",
        action="store_true",
        help="with --producer: IDEMPOTENT_WRITE on the cluster too",
    )
    p.add_argument(
        "--consumer",
        action="store_true",
        help="ACLs for a consumer: READ and DESCRIBE on the topics, READ on the groups",
    )
    p.add_argument("--force", action="store_true", help="assume yes to all queries")
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


def _pattern_type(text: str) -> PatternType:
    try:
        pattern = PatternType[text.strip().upper()]
    except KeyError:
        pattern = PatternType.UNKNOWN
    if pattern is PatternType.UNKNOWN:
        raise argparse.ArgumentTypeError(f"Unknown resource-pattern-type: {text}")
    return pattern


def parse_operation(text: str) -> AclOperation:
    """Kafka's SecurityUtils.operation: `Read`, `IdempotentWrite`, or any case without
    underscores (`IDEMPOTENTWRITE`); UNKNOWN otherwise."""
    key = text.strip().replace("_", "").upper()
    for op in AclOperation:
        if op.name.replace("_", "") == key:
            return op
    return AclOperation.UNKNOWN


def operation_name(op: AclOperation) -> str:
    return "".join(part.capitalize() for part in op.name.split("_"))


def parse_principal(text: str) -> str:
    """Kafka's SecurityUtils.parseKafkaPrincipal: `Type:name`."""
    text = text.strip()
    kind, sep, name = text.partition(":")
    if not sep or not text:
        raise UsageError(f"expected a string in format principalType:principalName but got {text}")
    return f"{kind}:{name}"


def _option_error(used: str, other: str) -> UsageError:
    return UsageError(f'Option "[{used}]" can\'t be used with option "[{other}]"')


def validate(args: argparse.Namespace) -> None:
    """AclCommandOptions.checkArgs, then what the command checks before connecting."""
    chosen = [a for a in ACTIONS if getattr(args, a)]
    if len(chosen) != 1:
        raise UsageError("Command must include exactly one action: --list, --add, --remove. ")
    if args.list:
        for name in (
            "producer",
            "consumer",
            "allow_host",
            "allow_principal",
            "deny_host",
            "deny_principal",
        ):
            if getattr(args, name):
                raise _option_error("list", name.replace("_", "-"))
    for role in ("producer", "consumer"):
        if getattr(args, role):
            for name in ("operation", "deny_principal", "deny_host"):
                if getattr(args, name):
                    raise _option_error(role, name.replace("_", "-"))
    if args.principal and not args.list:
        raise UsageError("The --principal option is only available if --list is set")
    if args.producer and not args.topic:
        raise UsageError("With --producer you must specify a --topic")
    if args.idempotent and not args.producer:
        raise UsageError("The --idempotent option is only available if --producer is set")
    if args.consumer and (
        not args.topic
        or not args.group
        or (not args.producer and (args.cluster or args.transactional_id))
    ):
        raise UsageError(
            "With --consumer you must specify a --topic and a --group and no --cluster or "
            "--transactional-id option should be specified."
        )
    for text in args.principal:
        parse_principal(text)
    if args.add or args.remove:
        plan(args)


def resource_filters(args: argparse.Namespace, required: bool) -> list[Pattern]:
    """AclCommand.getResourceFilter: one pattern per resource flag, in the flags' order."""
    pattern: PatternType = args.resource_pattern_type
    out: list[Pattern] = [(ResourceType.TOPIC, t.strip(), pattern) for t in args.topic]
    if pattern is PatternType.LITERAL and (args.cluster or args.idempotent):
        out.append((ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL))
    out += [(ResourceType.GROUP, g.strip(), pattern) for g in args.group]
    out += [(ResourceType.TRANSACTIONAL_ID, t, pattern) for t in args.transactional_id]
    out += [(ResourceType.DELEGATION_TOKEN, t.strip(), pattern) for t in args.delegation_token]
    out += [(ResourceType.USER, u.strip(), pattern) for u in args.user_principal]
    if not out and required:
        raise UsageError(
            "You must provide at least one resource: --topic <topic> or --cluster or --group "
            "<group> or --delegation-token <Delegation Token ID>"
        )
    return list(dict.fromkeys(out))


def _entries(args: argparse.Namespace, operations: Iterable[AclOperation]) -> set[Entry]:
    """AclCommand.getAcl: every (principal, host, operation) of the allow and deny flags."""
    ops = set(operations)
    out: set[Entry] = set()
    for principals, hosts, permission in (
        (args.allow_principal, args.allow_host, AclPermissionType.ALLOW),
        (args.deny_principal, args.deny_host, AclPermissionType.DENY),
    ):
        names = {parse_principal(p) for p in principals}
        if not names:
            continue
        for host in {h.strip() for h in hosts} or {"*"}:
            out |= {(p, host, op, permission) for p in names for op in ops}
    return out


def plan(args: argparse.Namespace) -> dict[Pattern, set[Entry]]:
    """AclCommand.getResourceFilterToAcls (and for --add getResourceToAcls): the ACL
    entries the flags name, per resource pattern or filter."""
    if args.add and args.resource_pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise UsageError(
            f"A '--resource-pattern-type' value of '{args.resource_pattern_type.name}' is not "
            "valid when adding acls."
        )
    out: dict[Pattern, set[Entry]] = {}
    if not args.producer and not args.consumer:
        ops = [parse_operation(o) for o in args.operation] or [AclOperation.ALL]
        entries = _entries(args, ops)
        for f in resource_filters(args, True):
            out[f] = set(entries)
    filters = resource_filters(args, True) if args.producer or args.consumer else []
    if args.producer:
        for f in filters:
            if f[0] is ResourceType.TOPIC:
                out[f] = _entries(
                    args, (AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE)
                )
            elif f[0] is ResourceType.TRANSACTIONAL_ID:
                out[f] = _entries(args, (AclOperation.WRITE, AclOperation.DESCRIBE))
        if args.idempotent:
            cluster = (ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL)
            out[cluster] = _entries(args, (AclOperation.IDEMPOTENT_WRITE,))
    if args.consumer:
        for f in filters:
            if f[0] is ResourceType.TOPIC:
                out.setdefault(f, set()).update(
                    _entries(args, (AclOperation.READ, AclOperation.DESCRIBE))
                )
            elif f[0] is ResourceType.GROUP:
                out.setdefault(f, set()).update(_entries(args, (AclOperation.READ,)))
    for (rtype, _name, _pt), entries in out.items():
        valid = SUPPORTED_OPERATIONS.get(rtype, frozenset()) | {AclOperation.ALL}
        if any(e[2] not in valid for e in entries):
            names = ", ".join(sorted(operation_name(o).upper() for o in valid))
            raise UsageError(f"ResourceType {rtype.name} only supports operations [{names}]")
    if args.add and any(not entries for entries in out.values()):
        raise UsageError(
            "You must specify one of: --allow-principal, --deny-principal when trying to add ACLs."
        )
    return out


# -- output ------------------------------------------------------------------------------


def pattern_text(p: Pattern) -> str:
    """Kafka's ResourcePattern / ResourcePatternFilter toString."""
    name = "<any>" if p[1] is None else p[1]
    return f"ResourcePattern(resourceType={p[0].name}, name={name}, patternType={p[2].name})"


def entry_text(e: Entry) -> str:
    """Kafka's AccessControlEntry toString."""
    return f"(principal={e[0]}, host={e[1]}, operation={e[2].name}, permissionType={e[3].name})"


def binding_text(p: Pattern, e: Entry) -> str:
    return f"(pattern={pattern_text(p)}, entry={entry_text(e)})"


def _entry_json(e: Entry) -> dict[str, str]:
    return {
        "principal": e[0],
        "host": e[1],
        "operation": e[2].name,
        "permission_type": e[3].name,
    }


def _pattern_json(p: Pattern) -> dict[str, Any]:
    return {"resource_type": p[0].name, "resource_name": p[1], "pattern_type": p[2].name}


# -- admin calls ---------------------------------------------------------------------------


def _binding(entry: AclEntry) -> AclBinding:
    return AclBinding(
        ResourceType.from_code(entry.resource_type),
        entry.resource_name,
        PatternType.from_code(entry.resource_pattern_type),
        entry.principal,
        entry.host,
        AclOperation.from_code(entry.operation),
        AclPermissionType.from_code(entry.permission_type),
    )


def _filter(p: Pattern, e: Entry | None = None) -> AclFilter:
    from protocol.admin import AclFilter

    return AclFilter(
        resource_type_filter=int(p[0]),
        resource_name_filter=p[1],
        pattern_type_filter=int(p[2]),
        principal_filter=None if e is None else e[0],
        host_filter=None if e is None else e[1],
        operation=int(AclOperation.ANY if e is None else e[2]),
        permission_type=int(AclPermissionType.ANY if e is None else e[3]),
    )


ANY_FILTER: Pattern = (ResourceType.ANY, None, PatternType.ANY)


def _grouped(bindings: Iterable[AclBinding]) -> dict[Pattern, list[Entry]]:
    out: dict[Pattern, list[Entry]] = {}
    for b in sorted(set(bindings)):
        out.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            (b.principal, b.host, b.operation, b.permission)
        )
    return out


def run(args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    async def body(admin: AdminClient) -> int:
        try:
            if args.add:
                return await add(admin, args)
            if args.remove:
                return await remove(admin, args)
            return await list_acls(admin, args)
        except AdminError as exc:
            print(f"Error while executing ACL command: {exc.error}: {exc.message}", file=sys.stderr)
            return 1

    return run_admin(args, body)


async def add(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AclEntry, AdminError

    added: list[dict[str, Any]] = []
    for pattern, entries in plan(args).items():
        existing = {
            (b.principal, b.host, b.operation, b.permission)
            for b in map(_binding, await admin.describe_acls(_filter(pattern)))
        }
        new = sorted(entries - existing)
        for e in sorted(entries & existing):
            if args.output == "table":
                print(f"Acl {binding_text(pattern, e)} already exists.")
        if not new:
            continue
        if args.output == "table":
            lines = "\n".join(f"\t{entry_text(e)}" for e in new)
            print(f"Adding ACLs for resource `{pattern_text(pattern)}`: \n {lines}\n")
        rtype, name, ptype = pattern
        assert name is not None
        outcomes = await admin.create_acls(
            AclEntry(int(rtype), name, int(ptype), e[0], e[1], int(e[2]), int(e[3])) for e in new
        )
        errors = [err for err in outcomes if err is not None]
        if errors:
            raise AdminError(errors[0].error, errors[0].message)
        added += [{**_pattern_json(pattern), **_entry_json(e)} for e in new]
    if args.output == "json":
        print_json({"added": added})
    return 0


def _confirm(args: argparse.Namespace, message: str) -> bool:
    """kafka-acls.sh's question, unless --force (`remove` has checked for a terminal)."""
    if args.force:
        return True
    print(message)
    try:
        return input().strip().lower() == "y"
    except EOFError:
        return False


async def remove(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    if not args.force and not sys.stdin.isatty():
        # kafka-acls.sh reads the answer from the console and fails without one.
        print(
            "Error while executing ACL command: --remove asks before removing and there "
            "is no terminal to ask on: nothing removed; give --force to remove unasked",
            file=sys.stderr,
        )
        return 1
    removed: list[AclBinding] = []
    for pattern, entries in plan(args).items():
        if not entries:
            question = (
                f"Are you sure you want to delete all ACLs for resource filter "
                f"`{pattern_text(pattern)}`? (y/n)"
            )
            filters = [_filter(pattern)]
        else:
            lines = "\n".join(f"\t{entry_text(e)}" for e in sorted(entries))
            question = (
                f"Are you sure you want to remove ACLs: \n {lines}\n from resource filter "
                f"`{pattern_text(pattern)}`? (y/n)"
            )
            filters = [_filter(pattern, e) for e in sorted(entries)]
        if not _confirm(args, question):
            continue
        for result in await admin.delete_acls(filters):
            if isinstance(result, AdminError):
                raise result
            removed += map(_binding, result)
    if args.output == "json":
        print_json(
            {
                "removed": [
                    {**_pattern_json(p), **_entry_json(e)}
                    for p, entries in _grouped(removed).items()
                    for e in entries
                ]
            }
        )
    return 0


async def list_acls(admin: AdminClient, args: argparse.Namespace) -> int:
    filters = resource_filters(args, False) or [ANY_FILTER]
    bindings: list[AclBinding] = []
    for f in filters:
        bindings += map(_binding, await admin.describe_acls(_filter(f)))
    grouped = _grouped(bindings)
    principals = [parse_principal(p) for p in args.principal]
    views: list[tuple[str | None, dict[Pattern, list[Entry]]]] = []
    if not principals:
        views.append((None, grouped))
    for who in principals:
        mine = {p: [e for e in es if e[0] == who] for p, es in grouped.items()}
        views.append((who, {p: es for p, es in mine.items() if es}))
    if args.output == "json":
        print_json(
            [
                {**_pattern_json(p), "acls": [_entry_json(e) for e in es]}
                for _who, view in views
                for p, es in view.items()
            ]
        )
        return 0
    for heading, view in views:
        if heading is not None:
            print(f"ACLs for principal `{heading}`")
        for p, es in view.items():
            lines = "\n".join(f"\t{entry_text(e)}" for e in es)
            print(f"Current ACLs for resource `{pattern_text(p)}`:\n{lines}\n")
    return 0
