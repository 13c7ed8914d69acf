"""`spool consumer-groups`: list, describe, reset the offsets of and delete consumer
groups, as Kafka 4.2's kafka-consumer-groups.sh does (its flags, validation rules,
columns and messages).

- `--list [--state [STATES]] [--type [TYPES]]`: classic groups (simple ones too) and
  KIP-848 consumer groups, as ListGroups lists them.
- `--describe --group G | --all-groups` with `--offsets` (the default: committed offset,
  log end offset and lag per partition, with the member it is assigned to),
  `--members [--verbose]` or `--state [--verbose]`. The group is described with
  ConsumerGroupDescribe, or DescribeGroups for a classic group, as Kafka's admin client
  does; a broker that serves neither gets an error naming them, and `--offsets` still
  prints the committed offsets and lag (without the members).
- `--reset-offsets` with one of `--to-earliest`, `--to-latest`, `--to-offset N`,
  `--to-current`, `--shift-by N`, `--to-datetime`, `--by-duration`, `--from-file`, on
  `--topic T[:P,...]` or `--all-topics`; `--dry-run` (the default) prints the plan,
  `--execute` commits it, `--export` prints it as CSV for `--from-file`. Only an
  inactive (Empty) group, or one that does not exist yet, can be reset.
- `--delete --group G | --all-groups` and `--delete-offsets --group G --topic T`.

Beyond Kafka's tool, `--output json` prints the same data for scripts, and a failure
exits 1 (Kafka's tool exits 0 after printing some errors).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.tools.common import (
    UsageError,
    add_connection_flags,
    print_json,
    run_admin,
    table,
    usage_checked,
)
from broker.tools.share_groups import (
    clamp,
    flag,
    flags,
    given,
    parse_datetime,
    parse_duration,
    parse_topic_arg,
)
from coordinator.topic_regex import why_invalid

if TYPE_CHECKING:
    from protocol.admin import (
        AdminClient,
        CommittedOffset,
        ConsumerGroupDescription,
        ConsumerMember,
        GroupListing,
    )

TopicPartition = tuple[str, int]

ACTIONS = ("list", "describe", "delete", "reset_offsets", "delete_offsets", "validate_regex")
SCENARIOS = (
    "to_offset",
    "shift_by",
    "to_datetime",
    "by_duration",
    "to_earliest",
    "to_latest",
    "to_current",
    "from_file",
)
# GroupState.groupStatesForType(CONSUMER), Kafka's names.
CONSUMER_GROUP_STATES = (
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
    "Empty",
    "Assigning",
    "Reconciling",
)
CONSUMER_GROUP_TYPES = ("Classic", "Consumer")  # GroupType names
REBALANCING = ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling")
MISSING = "-"
NO_EXECUTE_WARNING = (
    "WARN: No action will be performed as the --execute option is missing. In version 5.0, "
    "this command will require either --dry-run or --execute to be specified. You should add "
    "the --dry-run option explicitly if you are scripting this command and want to keep the "
    "current default behavior without prompting."
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "consumer-groups",
        help="list, describe, reset offsets of and delete consumer groups "
        "(kafka-consumer-groups.sh)",
        description="List, describe, reset the offsets of and delete consumer groups.",
    )
    add_connection_flags(p, timeout=True, required=False)
    actions = p.add_argument_group("actions (exactly one)")
    actions.add_argument("--list", action="store_true", help="list all consumer groups")
    actions.add_argument(
        "--describe",
        action="store_true",
        help="describe consumer groups: offsets and lag (default), --members or --state",
    )
    actions.add_argument(
        "--delete", action="store_true", help="delete consumer groups and their offsets"
    )
    actions.add_argument(
        "--reset-offsets",
        action="store_true",
        help="reset the committed offsets of inactive consumer groups (--dry-run, the "
        "default, or --execute; --export prints the plan as CSV)",
    )
    actions.add_argument(
        "--delete-offsets",
        action="store_true",
        help="delete the committed offsets of one consumer group for the --topic(s) given",
    )
    actions.add_argument(
        "--validate-regex",
        metavar="REGEX",
        help="validate that the syntax of the provided regular expression is valid according "
        "to the RE2 format (a consumer's subscription pattern); needs no --bootstrap-server",
    )
    p.add_argument(
        "--group", action="append", metavar="GROUP", help="a consumer group (repeatable)"
    )
    p.add_argument("--all-groups", action="store_true", help="apply to all consumer groups")
    p.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,P]",
        help="topic to reset or delete offsets of; 'topic:0,1' names partitions (repeatable)",
    )
    p.add_argument(
        "--all-topics", action="store_true", help="reset every topic the group has offsets for"
    )
    p.add_argument("--members", action="store_true", help="with --describe: the members")
    p.add_argument(
        "--offsets", action="store_true", help="with --describe: offsets and lag (the default)"
    )
    p.add_argument(
        "--state",
        nargs="?",
        const="",
        default=None,
        metavar="STATES",
        help="with --describe: the group's state; with --list: states, or only the "
        f"comma-separated STATES ({', '.join(CONSUMER_GROUP_STATES)})",
    )
    p.add_argument(
        "--type",
        nargs="?",
        const="",
        default=None,
        metavar="TYPES",
        help="with --list: types, or only the comma-separated TYPES (classic, consumer)",
    )
    p.add_argument("--verbose", action="store_true", help="with --describe: more columns")
    p.add_argument(
        "--dry-run", action="store_true", help="show the reset plan, change nothing (default)"
    )
    p.add_argument("--execute", action="store_true", help="apply the reset")
    p.add_argument(
        "--export", action="store_true", help="print the reset plan as CSV (for --from-file)"
    )
    p.add_argument("--to-offset", type=int, metavar="OFFSET", help="reset to this offset")
    p.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="reset to the committed offset plus N (N may be negative)",
    )
    p.add_argument(
        "--to-datetime",
        metavar="DATETIME",
        help="reset to the first offset at or after 'YYYY-MM-DDThh:mm:ss.sss[zone]'",
    )
    p.add_argument(
        "--by-duration",
        metavar="PnDTnHnMnS",
        help="reset to the first offset at or after now minus this ISO-8601 duration",
    )
    p.add_argument("--to-earliest", action="store_true", help="reset to the earliest offset")
    p.add_argument("--to-latest", action="store_true", help="reset to the latest offset")
    p.add_argument(
        "--to-current",
        action="store_true",
        help="reset to the committed offset (the log end where there is none)",
    )
    p.add_argument(
        "--from-file",
        type=Path,
        metavar="CSV",
        help="reset to the offsets of a CSV file: topic,partition,offset (one group) or "
        "group,topic,partition,offset, as --export writes it",
    )
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


# --- argument rules (ConsumerGroupCommandOptions.checkArgs) ------------------------------


def validate(args: argparse.Namespace) -> None:
    """Kafka 4.2's rules for kafka-consumer-groups.sh arguments; UsageError on a break."""
    chosen = [a for a in ACTIONS if given(args, a)]
    if len(chosen) != 1:
        raise UsageError(
            "Command must include exactly one action: --list, --describe, --delete, "
            "--reset-offsets, --delete-offsets, --validate-regex"
        )
    action = chosen[0]
    if action != "validate_regex" and not args.bootstrap_server:
        raise UsageError('Missing required argument "[bootstrap-server]"')
    for dest in ("members", "offsets", "verbose"):
        if given(args, dest) and action != "describe":
            raise UsageError(f"Option {flag(dest)} may be used with --describe only")
    if given(args, "state") and action not in ("describe", "list"):
        raise UsageError("Option --state may be used with --describe or --list only")
    if given(args, "type") and action != "list":
        raise UsageError("Option --type may be used with --list only")
    for dest in ("dry_run", "execute", "export", "all_topics", *SCENARIOS):
        if given(args, dest) and action != "reset_offsets":
            raise UsageError(f"Option {flag(dest)} may be used with --reset-offsets only")

    if action == "describe":
        if not args.group and not args.all_groups:
            raise UsageError("Option --describe takes one of these options: --all-groups, --group")
        exclusive = ["members", "offsets", "state"]
        if sum(given(args, d) for d in exclusive) > 1:
            raise UsageError(
                f"Option --describe takes at most one of these options: {flags(exclusive)}"
            )
        if args.state:
            raise UsageError("Option --describe does not take a value for --state")
    if action == "delete":
        if not args.group and not args.all_groups:
            raise UsageError("Option --delete takes one of these options: --all-groups, --group")
        if args.topic:
            raise UsageError(
                "The consumer does not support topic-specific offset deletion from a "
                "consumer group."
            )
    if action == "delete_offsets":
        if not args.group or not args.topic:
            raise UsageError(
                "Option --delete-offsets takes the following options: --group, --topic"
            )
        if len(args.group) > 1:
            raise UsageError("Option --delete-offsets supports one consumer group at a time")
    if action == "reset_offsets":
        validate_reset(args)
    if action == "list":
        if args.state:
            parse_states(args.state)
        if args.type:
            parse_types(args.type)

    if args.group and args.all_groups:
        raise UsageError("Option --group can't be used with option --all-groups")
    if args.group and action == "list":
        raise UsageError("Option --group can't be used with option --list")
    if args.topic and action in ("list", "describe"):
        raise UsageError(f"Option --topic can't be used with option {flag(action)}")


def validate_reset(args: argparse.Namespace) -> None:
    if args.dry_run and args.execute:
        raise UsageError("Option --reset-offsets only accepts one of --execute and --dry-run")
    if not args.group and not args.all_groups:
        raise UsageError("Option --reset-offsets takes one of these options: --all-groups, --group")
    scenarios = [s for s in SCENARIOS if given(args, s)]
    if not scenarios:
        raise UsageError(
            f"Option --reset-offsets requires one of the following scenarios: {flags(SCENARIOS)}"
        )
    if len(scenarios) > 1:
        raise UsageError(
            f"Option {flag(scenarios[0])} can't be used with option {flag(scenarios[1])}"
        )
    if args.topic and args.all_topics:
        raise UsageError("Option --topic can't be used with option --all-topics")
    if not args.topic and not args.all_topics and args.from_file is None:
        raise UsageError("One of the reset scopes should be defined: --all-topics, --topic.")
    if args.to_datetime is not None:
        parse_datetime(args.to_datetime)
    if args.by_duration is not None:
        parse_duration(args.by_duration)
    for topic in args.topic or ():
        parse_topic_arg(topic)
    if not args.dry_run and not args.execute:
        print(NO_EXECUTE_WARNING, file=sys.stderr)


def parse_states(text: str) -> list[str]:
    """`--state` values, case-insensitive, as Kafka's GroupState names."""
    by_upper = {s.upper(): s for s in CONSUMER_GROUP_STATES}
    states = [by_upper.get(s.strip().upper()) for s in text.split(",")]
    if None in states:
        raise UsageError(
            f"Invalid state list '{text}'. Valid states are: {', '.join(CONSUMER_GROUP_STATES)}"
        )
    return sorted({s for s in states if s is not None})


def parse_types(text: str) -> list[str]:
    """`--type` values, case-insensitive: classic and consumer, as ListGroups names them."""
    types = [s.strip().lower() for s in text.split(",")]
    valid = [t.lower() for t in CONSUMER_GROUP_TYPES]
    if any(t not in valid for t in types):
        raise UsageError(
            f"Invalid types list '{text}'. Valid types are: {', '.join(CONSUMER_GROUP_TYPES)}"
        )
    return sorted(set(types))


def parse_reset_plan(text: str, groups: list[str] | None) -> dict[str, dict[TopicPartition, int]]:
    """A `--from-file` CSV (OffsetsUtils.parseResetPlan): `topic,partition,offset` lines
    for the one --group given, else `group,topic,partition,offset`."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    single = groups is not None and len(groups) == 1
    plan: dict[str, dict[TopicPartition, int]] = {}
    for n, line in enumerate(lines, 1):
        cells = [c.strip() for c in line.split(",")]
        if single and len(cells) == 3:
            assert groups is not None
            group, (topic, partition, offset) = groups[0], cells
        elif len(cells) == 4:
            group, topic, partition, offset = cells
        else:
            expected = "topic,partition,offset" if single else "group,topic,partition,offset"
            raise UsageError(f"--from-file line {n}: '{line}': expected {expected}")
        try:
            plan.setdefault(group, {})[(topic, int(partition))] = int(offset)
        except ValueError:
            raise UsageError(
                f"--from-file line {n}: '{line}': partition and offset must be numbers"
            ) from None
    return plan


def export_csv(plans: dict[str, dict[TopicPartition, int]], single_group: bool) -> str:
    """CsvUtils' records: no group column when one --group was asked."""
    out = []
    for group, plan in plans.items():
        for (topic, partition), offset in sorted(plan.items()):
            cells = [topic, str(partition), str(offset)]
            out.append(",".join(cells if single_group else [group, *cells]))
    return "".join(line + "\n" for line in out)


# --- the reset plan (OffsetsUtils), without I/O -------------------------------------------


def compute_reset(
    args: argparse.Namespace,
    partitions: list[TopicPartition],
    committed: dict[TopicPartition, int],
    earliest: dict[TopicPartition, int],
    latest: dict[TopicPartition, int],
    by_time: dict[TopicPartition, int] | None = None,
    requested: dict[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """The new offset of each partition for the scenario in `args`. `by_time` holds
    ListOffsets' answers for --to-datetime / --by-duration (-1: no record at or after
    the time, which falls back to the log end); `requested` the --from-file offsets.
    --to-offset, --shift-by and --from-file are clamped to [earliest, latest]."""
    if args.to_earliest:
        return {tp: earliest[tp] for tp in partitions}
    if args.to_latest:
        return {tp: latest[tp] for tp in partitions}
    if args.to_current:
        return {tp: committed.get(tp, latest[tp]) for tp in partitions}
    if args.to_datetime is not None or args.by_duration is not None:
        assert by_time is not None
        plan = {}
        for tp in partitions:
            if by_time[tp] < 0:
                print(
                    f"\nWarn: Partition {tp[1]} from topic {tp[0]} is empty. "
                    "Falling back to latest known offset.",
                    file=sys.stderr,
                )
                plan[tp] = latest[tp]
            else:
                plan[tp] = by_time[tp]
        return plan
    if args.to_offset is not None:
        wanted = dict.fromkeys(partitions, args.to_offset)
    elif args.shift_by is not None:
        missing = [tp for tp in partitions if tp not in committed]
        if missing:
            t, p = missing[0]
            raise UsageError(
                f"Cannot shift offset for partition {t}-{p} since there is no current "
                "committed offset"
            )
        wanted = {tp: committed[tp] + args.shift_by for tp in partitions}
    else:
        wanted = dict(requested or {})
    return {tp: clamp(tp, o, earliest[tp], latest[tp]) for tp, o in wanted.items()}


# --- running --------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    handlers = {
        "list": list_groups,
        "describe": describe,
        "delete": delete,
        "reset_offsets": reset_offsets,
        "delete_offsets": delete_offsets,
    }
    action = next(a for a in ACTIONS if given(args, a))
    if action == "validate_regex":
        return validate_regex(args.validate_regex)

    async def body(admin: AdminClient) -> int:
        return await handlers[action](admin, args)

    return run_admin(args, body)


def validate_regex(regex: str) -> int:
    """Kafka's ConsumerGroupCommand.validateRegex: whether the broker would accept `regex`
    as a subscription pattern (RE2 syntax, as Kafka checks it with RE2J), told on stdout;
    exit code 0 either way, as Kafka's tool."""
    reason = why_invalid(regex)
    if reason is None:
        print(f"The regular expression `{regex}` is valid.")
    else:
        print(f"The regular expression `{regex}` is invalid: {reason}.")
    return 0


def error_line(message: str) -> None:
    """Kafka's printError: a blank line, then `Error: message`."""
    print(f"\nError: {message}", file=sys.stderr)


async def consumer_group_listings(
    admin: AdminClient, types: list[str] | None = None, states: list[str] | None = None
) -> list[GroupListing]:
    """ListGroupsOptions.forConsumerGroups(): classic and consumer groups (or `types`)
    whose protocol type is a consumer's or a simple group's (empty)."""
    listed = await admin.list_groups(types=types or ["classic", "consumer"], states=states or [])
    return [g for g in listed if g.protocol_type in ("", "consumer")]


async def group_ids(admin: AdminClient, args: argparse.Namespace) -> list[str]:
    if args.all_groups:
        return [g.group_id for g in await consumer_group_listings(admin)]
    return list(dict.fromkeys(args.group))


async def list_groups(admin: AdminClient, args: argparse.Namespace) -> int:
    include_type, include_state = args.type is not None, args.state is not None
    if include_type or include_state:
        types = parse_types(args.type) if args.type else []
        listed = await admin.list_groups(
            types=types, states=parse_states(args.state) if args.state else []
        )
        groups = [g for g in listed if g.protocol_type in ("", "consumer")]
    else:
        groups = await consumer_group_listings(admin)
    if args.output == "json":
        print_json(
            [{"group": g.group_id, "type": g.type.capitalize(), "state": g.state} for g in groups]
        )
        return 0
    if not include_type and not include_state:
        for g in groups:
            print(g.group_id)
        return 0
    headers, widths = ["GROUP"], [max([15, *(len(g.group_id) for g in groups)]) + 10]
    if include_type:
        headers.append("TYPE")
        widths.append(20)
    if include_state:
        headers.append("STATE")
        widths.append(20)
    rows = []
    for g in groups:
        row = [g.group_id]
        if include_type:
            row.append(g.type.capitalize() or "Unknown")
        if include_state:
            from protocol.admin import group_state_name

            row.append(group_state_name(g.state))
        rows.append(row)
    print(table(headers, rows, widths))
    return 0


async def describe(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    failed = 0
    out: list[dict[str, Any]] = []
    for group in sorted(await group_ids(admin, args)):
        description: ConsumerGroupDescription | None = None
        try:
            description = await admin.describe_consumer_group(group)
        except AdminError as exc:
            if exc.error != "UNSUPPORTED_VERSION" or args.members or args.state is not None:
                error_line(
                    f"Executing consumer group command failed due to {exc.error}: {exc.message}"
                )
                failed += 1
                continue
            # No describe API: the committed offsets and lag, which were asked for,
            # can still be shown (without members), so this alone does not fail.
            error_line(f"{exc.error}: {exc.message}")
        try:
            if args.members:
                assert description is not None
                out += describe_members(description, args)
            elif args.state is not None:
                assert description is not None
                out += describe_state(description, args)
            else:
                out += await describe_offsets(admin, group, description, args)
        except AdminError as exc:
            error_line(f"Executing consumer group command failed due to {exc.error}: {exc.message}")
            failed += 1
    if args.output == "json":
        print_json(out)
    return 1 if failed else 0


def should_print(group: str, state: str | None, rows: int) -> bool:
    """ConsumerGroupCommand.shouldPrintMemberState: what the state says, and whether
    there is anything to print. `state` None: not known (no describe API)."""
    if state == "Dead":
        error_line(f"Consumer group '{group}' does not exist.")
    elif state == "Empty":
        print(f"\nConsumer group '{group}' has no active members.", file=sys.stderr)
    elif state in REBALANCING:
        print(f"\nWarning: Consumer group '{group}' is rebalancing.", file=sys.stderr)
    return state != "Dead" and rows > 0


def assignment_text(assignment: dict[str, tuple[int, ...]] | None) -> str:
    """Kafka's assignment column: `topic:0,1;other:2`, topics sorted; '-' for none."""
    text = ";".join(
        f"{t}:{','.join(str(p) for p in ps)}" for t, ps in sorted((assignment or {}).items()) if ps
    )
    return text or MISSING


def offset_rows(
    group: str,
    description: ConsumerGroupDescription | None,
    committed: dict[TopicPartition, CommittedOffset],
    log_end: dict[TopicPartition, int | None],
) -> list[dict[str, Any]]:
    """ConsumerGroupCommand.collectGroupsOffsets: the partitions of each member with an
    assignment (most partitions first), then the committed partitions no member holds
    (consumer '-'). Lag is the log end offset minus the committed offset."""
    rows: list[dict[str, Any]] = []
    assigned: set[TopicPartition] = set()
    members: list[ConsumerMember] = list(description.members) if description else []
    members = [m for m in members if any(m.assignment.values())]
    members.sort(key=lambda m: -sum(len(ps) for ps in m.assignment.values()))

    def row(tp: TopicPartition, member: ConsumerMember | None) -> dict[str, Any]:
        c = committed.get(tp)
        end = log_end.get(tp)
        offset = None if c is None else c.offset
        return {
            "group": group,
            "topic": tp[0],
            "partition": tp[1],
            "leader_epoch": None if c is None else c.leader_epoch,
            "current_offset": offset,
            "log_end_offset": end,
            "lag": None if offset is None or end is None else end - offset,
            "consumer_id": member.member_id if member else MISSING,
            "host": member.host if member else MISSING,
            "client_id": member.client_id if member else MISSING,
        }

    for m in members:
        tps = sorted((t, p) for t, ps in m.assignment.items() for p in ps)
        assigned.update(tps)
        rows += [row(tp, m) for tp in tps]
    rows += [row(tp, None) for tp in sorted(committed) if tp not in assigned]
    return rows


async def log_end_offsets(
    admin: AdminClient, partitions: list[TopicPartition]
) -> dict[TopicPartition, int | None]:
    """ListOffsets latest; a partition that cannot answer (deleted topic, no leader)
    is None, shown as '-' as Kafka shows it."""
    from protocol.admin import LATEST_TIMESTAMP, AdminError

    if not partitions:
        return {}
    try:
        listed = await admin.list_offsets(dict.fromkeys(partitions, LATEST_TIMESTAMP))
        return {tp: listed[tp].offset if tp in listed else None for tp in partitions}
    except AdminError:
        pass
    out: dict[TopicPartition, int | None] = {}
    for tp in partitions:  # one at a time, to know which cannot answer
        try:
            out[tp] = (await admin.list_offsets({tp: LATEST_TIMESTAMP}))[tp].offset
        except (AdminError, KeyError):
            out[tp] = None
    return out


async def describe_offsets(
    admin: AdminClient,
    group: str,
    description: ConsumerGroupDescription | None,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    committed = await admin.list_consumer_group_offsets(group)
    partitions = set(committed)
    for m in description.members if description else ():
        partitions.update((t, p) for t, ps in m.assignment.items() for p in ps)
    log_end = await log_end_offsets(admin, sorted(partitions))
    rows = offset_rows(group, description, committed, log_end)
    if args.output == "json":
        return rows
    if not should_print(group, description.state if description else None, len(rows)):
        return rows
    headers = ["GROUP", "TOPIC", "PARTITION"]
    if args.verbose:
        headers.append("LEADER-EPOCH")
    headers += ["CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    lines = []
    for r in rows:
        line: list[object] = [r["group"], r["topic"], r["partition"]]
        if args.verbose:
            line.append(r["leader_epoch"])
        line += [r["current_offset"], r["log_end_offset"], r["lag"]]
        line += [r["consumer_id"], r["host"], r["client_id"]]
        lines.append(line)
    widths = [15, 15, 10, *([15] if args.verbose else []), 15, 15, 15, 15, 15]
    print()
    print(table(headers, lines, widths))
    print()
    return rows


def describe_members(d: ConsumerGroupDescription, args: argparse.Namespace) -> list[dict[str, Any]]:
    members = list(d.members)
    rows = [
        {
            "group": d.group_id,
            "consumer_id": m.member_id,
            "group_instance_id": m.group_instance_id,
            "host": m.host,
            "client_id": m.client_id,
            "partitions": sum(len(ps) for ps in m.assignment.values()),
            "current_epoch": m.member_epoch,
            "current_assignment": {t: list(ps) for t, ps in sorted(m.assignment.items())},
            "target_epoch": d.target_assignment_epoch,
            "target_assignment": None
            if m.target_assignment is None
            else {t: list(ps) for t, ps in sorted(m.target_assignment.items())},
            "upgraded": m.upgraded,
        }
        for m in members
    ]
    if args.output == "json":
        return rows
    if not should_print(d.group_id, d.state, len(rows)):
        return rows
    with_instance = any(m.group_instance_id for m in members)
    upgrade = any(m.upgraded is True for m in members) and any(m.upgraded is False for m in members)
    headers = ["GROUP", "CONSUMER-ID"]
    widths = [15, 15]
    if with_instance:
        headers.append("GROUP-INSTANCE-ID")
        widths.append(17)
    headers += ["HOST", "CLIENT-ID", "#PARTITIONS"]
    widths += [15, 15, 15]
    if args.verbose:
        headers += ["CURRENT-EPOCH", "CURRENT-ASSIGNMENT", "TARGET-EPOCH", "TARGET-ASSIGNMENT"]
        widths += [15, 20, 15, 20]
        if upgrade:
            headers.append("UPGRADED")
    lines = []
    for m, r in zip(members, rows, strict=True):
        line: list[object] = [d.group_id, m.member_id]
        if with_instance:
            line.append(m.group_instance_id or "")
        line += [m.host, m.client_id, r["partitions"]]
        if args.verbose:
            line += [
                m.member_epoch,
                assignment_text(m.assignment),
                d.target_assignment_epoch,
                assignment_text(m.target_assignment),
            ]
            if upgrade:
                line.append(MISSING if m.upgraded is None else str(m.upgraded).lower())
        lines.append(line)
    print()
    print(table(headers, lines, widths))
    print()
    return rows


def describe_state(d: ConsumerGroupDescription, args: argparse.Namespace) -> list[dict[str, Any]]:
    c = d.coordinator
    row = {
        "group": d.group_id,
        "coordinator": {"id": c.node_id, "host": c.host, "port": c.port},
        "assignment_strategy": d.assignor or None,
        "state": d.state,
        "group_epoch": d.group_epoch,
        "target_assignment_epoch": d.target_assignment_epoch,
        "members": len(d.members),
    }
    if args.output == "json":
        return [row]
    if not should_print(d.group_id, d.state, 1):
        return [row]
    coordinator = f"{c.host}:{c.port}  ({c.node_id})"
    headers = ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE"]
    values: list[object] = [d.group_id, coordinator, d.assignor or MISSING, d.state]
    widths = [15, 25, 20, 20]
    if args.verbose:
        headers += ["GROUP-EPOCH", "TARGET-ASSIGNMENT-EPOCH"]
        values += [d.group_epoch, d.target_assignment_epoch]
        widths += [15, 25]
    print()
    print(table([*headers, "#MEMBERS"], [[*values, len(d.members)]], widths))
    print()
    return [row]


async def delete(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import kafka_error_message

    groups = await group_ids(admin, args)
    results = await admin.delete_groups(groups) if groups else {}
    failed = {g: e for g, e in results.items() if e is not None}
    deleted = [g for g in groups if g in results and g not in failed]
    if args.output == "json":
        print_json(
            {
                "deleted": deleted,
                "failed": {
                    g: {"error": e.error, "message": kafka_error_message(e.error) or e.message}
                    for g, e in failed.items()
                },
            }
        )
    elif not failed:
        names = ", ".join(f"'{g}'" for g in deleted)
        print(f"Deletion of requested consumer groups ({names}) was successful.")
    else:
        error_line("Deletion of some consumer groups failed:")
        for g, e in failed.items():
            message = kafka_error_message(e.error) or e.message
            print(f"* Group '{g}' could not be deleted due to: {e.error}: {message}")
        if deleted:
            names = ", ".join(f"'{g}'" for g in deleted)
            print(f"\nThese consumer groups were deleted successfully: {names}")
    return 1 if failed else 0


async def delete_offsets(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError, kafka_error_message

    (group,) = args.group
    partitions: set[TopicPartition] = set()
    results: dict[TopicPartition, AdminError | None] = {}
    for arg in dict.fromkeys(args.topic):
        topic, ps = parse_topic_arg(arg)
        if ps is not None:
            partitions.update((topic, p) for p in ps)
            continue
        try:
            (info,) = await admin.describe_topics([topic])
            partitions.update((topic, p.partition) for p in info.partitions)
        except AdminError as exc:
            results[(topic, -1)] = AdminError(
                "UNKNOWN_TOPIC_OR_PARTITION",
                kafka_error_message("UNKNOWN_TOPIC_OR_PARTITION") or exc.message,
            )
    top: AdminError | None = None
    if partitions:
        top, by_partition = await admin.delete_consumer_group_offsets(group, partitions)
        for tp in partitions:
            results[tp] = by_partition.get(tp, top)
    partition_errors = any(e is not None for e in results.values())
    rows = sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    if args.output == "json":
        print_json(
            {
                "group": group,
                "error": None if top is None else top.error,
                "partitions": [
                    {
                        "topic": t,
                        "partition": p if p >= 0 else None,
                        "status": "Successful" if e is None else "Error",
                        "error": None if e is None else e.error,
                        "message": None if e is None else e.message,
                    }
                    for (t, p), e in rows
                ],
            }
        )
    else:
        if top is None and not partition_errors:
            print(f"Request succeeded for deleting offsets from group {group}.")
        elif top is not None and top.error in (
            "INVALID_GROUP_ID",
            "GROUP_ID_NOT_FOUND",
            "GROUP_AUTHORIZATION_FAILED",
            "NON_EMPTY_GROUP",
        ):
            error_line(kafka_error_message(top.error) or top.message)
        elif top is None or top.error in (
            "GROUP_SUBSCRIBED_TO_TOPIC",
            "TOPIC_AUTHORIZATION_FAILED",
            "UNKNOWN_TOPIC_OR_PARTITION",
        ):
            error_line("Encountered some partition-level error, see the follow-up details.")
        else:
            error_line(f"Encountered some unknown error: {top.error}")
        lines = [
            (
                t,
                p if p >= 0 else MISSING,
                "Successful" if e is None else f"Error: {e.message}",
            )
            for (t, p), e in rows
        ]
        print()
        print(table(["TOPIC", "PARTITION", "STATUS"], lines, [15, 10, 15]))
        print()
    return 1 if top is not None or partition_errors else 0


# --- reset ----------------------------------------------------------------------------------


async def reset_offsets(admin: AdminClient, args: argparse.Namespace) -> int:
    """ConsumerGroupCommand.resetOffsets: each group must be inactive (Empty, Dead or
    not found); the targets come from ListOffsets and the committed offsets;
    --execute commits them with OffsetCommit as an admin (generation -1)."""
    from protocol.admin import AdminError

    file_plan: dict[str, dict[TopicPartition, int]] | None = None
    if args.from_file is not None:
        try:
            text = Path(args.from_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read --from-file: {exc}") from None
        file_plan = parse_reset_plan(text, args.group)
    groups = await group_ids(admin, args)
    plans: dict[str, dict[TopicPartition, int]] = {}
    failed = 0
    for group in groups:
        try:
            description = await admin.describe_consumer_group(group)
            state = description.state
        except AdminError as exc:
            if exc.error not in ("GROUP_ID_NOT_FOUND", "UNSUPPORTED_VERSION"):
                raise
            # Not found: inactive. No describe API: the coordinator refuses an admin
            # commit to a group with members (UNKNOWN_MEMBER_ID), which checks it.
            state = "Empty"
        if state not in ("Empty", "Dead"):
            error_line(
                f"Assignments can only be reset if the group '{group}' is inactive, but the "
                f"current state is {state}."
            )
            plans[group] = {}
            failed += 1
            continue
        plan = await plan_group_reset(admin, group, args, file_plan)
        if args.execute and plan:
            results = await admin.alter_consumer_group_offsets(group, plan)
            errors = {tp: e for tp, e in results.items() if e is not None}
            if errors:
                (t, p), e = sorted(errors.items())[0]
                raise AdminError(
                    e.error, f"cannot commit the offset of {t}-{p} for group '{group}': {e.message}"
                )
        plans[group] = plan
    single = args.group is not None and len(args.group) == 1
    if args.export:
        print(export_csv(plans, single))
    elif args.output == "json":
        print_json(
            [
                {"group": g, "topic": t, "partition": p, "new_offset": o}
                for g, plan in plans.items()
                for (t, p), o in sorted(plan.items())
            ]
        )
    else:
        lines = [(g, t, p, o) for g, plan in plans.items() for (t, p), o in sorted(plan.items())]
        if lines:
            print()
            print(table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], lines, [15, 15, 10]))
        print()
    return 1 if failed else 0


async def plan_group_reset(
    admin: AdminClient,
    group: str,
    args: argparse.Namespace,
    file_plan: dict[str, dict[TopicPartition, int]] | None,
) -> dict[TopicPartition, int]:
    from persister.clock import SYSTEM_CLOCK
    from protocol.admin import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP

    committed = {tp: c.offset for tp, c in (await admin.list_consumer_group_offsets(group)).items()}
    requested: dict[TopicPartition, int] | None = None
    if file_plan is not None:
        requested = file_plan.get(group)
        if requested is None:
            error_line(f"No reset plan for group {group} found")
            return {}
        partitions = sorted(requested)
    elif args.all_topics:
        partitions = sorted(committed)
    else:
        partitions = await topic_partitions(admin, args.topic)
    await check_partitions(admin, partitions)
    if not partitions:
        return {}
    earliest = {
        tp: o.offset
        for tp, o in (
            await admin.list_offsets(dict.fromkeys(partitions, EARLIEST_TIMESTAMP))
        ).items()
    }
    latest = {
        tp: o.offset
        for tp, o in (await admin.list_offsets(dict.fromkeys(partitions, LATEST_TIMESTAMP))).items()
    }
    by_time = None
    if args.to_datetime is not None or args.by_duration is not None:
        if args.to_datetime is not None:
            timestamp = parse_datetime(args.to_datetime)
        else:
            timestamp = SYSTEM_CLOCK.now_ms() - parse_duration(args.by_duration)
        found = await admin.list_offsets(dict.fromkeys(partitions, timestamp))
        by_time = {tp: found[tp].offset for tp in partitions}
    return compute_reset(args, partitions, committed, earliest, latest, by_time, requested)


async def topic_partitions(admin: AdminClient, topics: list[str]) -> list[TopicPartition]:
    """OffsetsUtils.parseTopicPartitionsToReset: `topic` is all its partitions,
    `topic:0,1` those named."""
    named: list[TopicPartition] = []
    whole: list[str] = []
    for arg in topics:
        topic, ps = parse_topic_arg(arg)
        if ps is None:
            whole.append(topic)
        else:
            named += [(topic, p) for p in ps]
    if whole:
        for info in await admin.describe_topics(sorted(set(whole))):
            named += [(info.name, p.partition) for p in info.partitions]
    return sorted(set(named))


async def check_partitions(admin: AdminClient, partitions: list[TopicPartition]) -> None:
    """OffsetsUtils.checkAllTopicPartitionsValid: every partition exists and has a leader."""
    from protocol.admin import AdminError

    if not partitions:
        return
    topics = sorted({t for t, _ in partitions})
    known: dict[TopicPartition, int] = {}
    for topic in topics:
        try:
            (info,) = await admin.describe_topics([topic])
        except AdminError:
            continue
        known.update({(topic, p.partition): p.leader for p in info.partitions})
    missing = [tp for tp in partitions if tp not in known]
    if missing:
        listed = ",".join(f"{t}-{p}" for t, p in missing)
        raise AdminError("UNKNOWN_TOPIC_OR_PARTITION", f'The partitions "{listed}" do not exist')
    leaderless = [tp for tp in partitions if known[tp] < 0]
    if leaderless:
        listed = ",".join(f"{t}-{p}" for t, p in leaderless)
        raise AdminError("LEADER_NOT_AVAILABLE", f'The partitions "{listed}" have no leader')
