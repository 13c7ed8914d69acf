"""`spool share-groups`: list, describe, reset and delete share groups, as Kafka 4.2's
kafka-share-groups.sh does (its flags, validation rules, columns and messages).

`--describe` (offsets, the default, and `--state`) also names the group's dead-letter
topic (KIP-1191's `errors.deadletterqueue.topic.name`) in a line under the table when it
has one, and as `dead_letter_topic` in `--output json`.

Beyond Kafka 4.2's share-group tool, `--reset-offsets` also takes `--to-offset` and
`--by-duration` (as kafka-consumer-groups.sh does), and `--output json` prints the same
data for scripts.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from typing import TYPE_CHECKING, Any

from broker.tools import replay
from broker.tools.common import (
    UsageError,
    add_connection_flags,
    print_json,
    run_admin,
    table,
    usage_checked,
)

if TYPE_CHECKING:
    from protocol.admin import AdminClient, ShareGroupDescription

ACTIONS = (
    "list",
    "describe",
    "delete",
    "reset_offsets",
    "delete_offsets",
    "replay_dead_letters",
)
SCENARIOS = ("to_datetime", "to_earliest", "to_latest", "to_offset", "by_duration")
SHARE_GROUP_STATES = ("Dead", "Empty", "Stable")  # GroupState.groupStatesForType(SHARE)
# KIP-1191's group config naming a share group's dead-letter topic, shown by --describe.
DEAD_LETTER_TOPIC_KEY = "errors.deadletterqueue.topic.name"


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def flags(dests: tuple[str, ...] | list[str]) -> str:
    return ", ".join(sorted(flag(d) for d in dests))


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "share-groups",
        help="list, describe, reset and delete share groups (kafka-share-groups.sh)",
        description="List, describe, reset offsets of and delete share groups.",
    )
    add_connection_flags(p, timeout=True)
    actions = p.add_argument_group("actions (exactly one)")
    actions.add_argument("--list", action="store_true", help="list all share groups")
    actions.add_argument(
        "--describe", action="store_true", help="describe share groups, members and offsets"
    )
    actions.add_argument("--delete", action="store_true", help="delete share groups")
    actions.add_argument(
        "--reset-offsets",
        action="store_true",
        help="reset the start offsets of one inactive share group (--dry-run or --execute)",
    )
    actions.add_argument(
        "--delete-offsets",
        action="store_true",
        help="delete the offsets of one share group for the --topic(s) given",
    )
    actions.add_argument(
        "--replay-dead-letters",
        action="store_true",
        help="move the records --group dead-lettered into --topic DLQ back to their source "
        "topic (or --to-topic), once each, in transactions; partition: the source one if "
        "the topic has it, else the key's murmur2 hash, else 0 (--dry-run: list only)",
    )
    p.add_argument("--group", action="append", metavar="GROUP", help="a share group (repeatable)")
    p.add_argument("--all-groups", action="store_true", help="apply to all share groups")
    p.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,P]",
        help="topic to reset or delete offsets of; 'topic:0,1' names partitions (repeatable)",
    )
    p.add_argument(
        "--all-topics", action="store_true", help="reset every topic the share group has"
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
        f"comma-separated STATES ({', '.join(SHARE_GROUP_STATES)})",
    )
    p.add_argument("--verbose", action="store_true", help="with --describe: more columns")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show the reset plan, or the records a replay would move; change nothing",
    )
    p.add_argument("--execute", action="store_true", help="apply the reset")
    p.add_argument(
        "--to-datetime",
        metavar="DATETIME",
        help="reset to the first offset at or after 'YYYY-MM-DDThh:mm:ss.sss[zone]'",
    )
    p.add_argument("--to-earliest", action="store_true", help="reset to the earliest offset")
    p.add_argument("--to-latest", action="store_true", help="reset to the latest offset")
    p.add_argument("--to-offset", type=int, metavar="OFFSET", help="reset to this offset")
    p.add_argument(
        "--by-duration",
        metavar="PnDTnHnMnS",
        help="reset to the first offset at or after now minus this ISO-8601 duration",
    )
    p.add_argument(
        "--to-topic",
        metavar="TOPIC",
        help="with --replay-dead-letters: replay into TOPIC instead of the source topic",
    )
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


# --- argument rules (ShareGroupCommandOptions.checkArgs) ---------------------------------


def given(args: argparse.Namespace, dest: str) -> bool:
    value = getattr(args, dest)
    return value is not None and value is not False


def validate(args: argparse.Namespace) -> None:
    """Kafka 4.2's rules for kafka-share-groups.sh arguments; UsageError on a break."""
    chosen = [a for a in ACTIONS if given(args, a)]
    if len(chosen) != 1:
        raise UsageError(
            "Command must include exactly one action: --list, --describe, --delete, "
            "--reset-offsets, --delete-offsets, --replay-dead-letters."
        )
    action = chosen[0]
    if action == "replay_dead_letters":
        replay.validate(args)
        return
    if args.to_topic is not None:
        raise UsageError("Option --to-topic may be used with --replay-dead-letters only")
    for dest in ("members", "offsets", "verbose"):
        if given(args, dest) and action != "describe":
            raise UsageError(f"Option {flag(dest)} may be used with --describe only")
    if given(args, "state") and action not in ("describe", "list"):
        raise UsageError("Option --state may be used with --describe or --list only")
    for dest in ("dry_run", "execute", "all_topics", *SCENARIOS):
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
            raise UsageError("Option --delete takes the options --group or --all-groups")
        if args.group and args.all_groups:
            raise UsageError("Option --delete takes either --group or --all-groups, not both.")
        if args.topic:
            raise UsageError("Option --delete does not take the option: --topic")
    if action == "delete_offsets" and (not args.group or not args.topic):
        raise UsageError("Option --delete-offsets takes the following options: --group, --topic")
    if action == "reset_offsets":
        validate_reset(args)
    if action == "list" and args.state:
        parse_states(args.state)

    if args.group and args.all_groups:
        raise UsageError("Option --group can't be used with option --all-groups")
    if args.group and action == "list":
        raise UsageError("Option --group can't be used with option --list")
    if args.topic and action in ("list", "describe"):
        raise UsageError(f"Option --topic can't be used with option {flag(action)}")
    if action in ("reset_offsets", "delete_offsets") and args.group and len(args.group) > 1:
        raise UsageError(f"Option {flag(action)} supports one share group at a time")


def validate_reset(args: argparse.Namespace) -> None:
    if args.dry_run and args.execute:
        raise UsageError("Option --reset-offsets only accepts one of --execute and --dry-run")
    if not args.dry_run and not args.execute:
        raise UsageError("Option --reset-offsets takes the option: --execute or --dry-run")
    if not args.group:
        raise UsageError("Option --reset-offsets takes the option: --group")
    if not args.topic and not args.all_topics:
        raise UsageError("Option --reset-offsets takes one of these options: --all-topics, --topic")
    scenarios = [s for s in SCENARIOS if given(args, s)]
    if not scenarios:
        raise UsageError(f"Option --reset-offsets takes one of these options: {flags(SCENARIOS)}")
    if len(scenarios) > 1:
        raise UsageError(
            f"Option {flag(scenarios[0])} can't be used with option {flag(scenarios[1])}"
        )
    if args.to_offset is not None and not args.topic:
        raise UsageError("Option --to-offset takes the option: --topic")
    if args.to_offset is not None and args.to_offset < 0:
        raise UsageError(f"Option --to-offset must not be negative, got {args.to_offset}")
    if args.to_datetime is not None:
        parse_datetime(args.to_datetime)
    if args.by_duration is not None:
        parse_duration(args.by_duration)
    for topic in args.topic or ():
        parse_topic_arg(topic)


def parse_states(text: str) -> list[str]:
    """`--state` values, case-insensitive, as Kafka's names (Empty, Stable, Dead)."""
    by_lower = {s.lower(): s for s in SHARE_GROUP_STATES}
    states = [by_lower.get(s.strip().lower()) for s in text.split(",")]
    if None in states:
        raise UsageError(
            f"Invalid state list '{text}'. Valid states are: {', '.join(SHARE_GROUP_STATES)}"
        )
    return [s for s in states if s is not None]


_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{1,3})"
    r"(Z|[+-]\d{2}(?::?\d{2})?)"
)


def parse_datetime(text: str) -> int:
    """Kafka's reset datetime (Utils.getDateTime) as epoch ms: `YYYY-MM-DDThh:mm:ss.sss`
    with an optional zone `Z`, `+hh`, `+hhmm` or `+hh:mm`; no zone means UTC."""
    _, sep, time_part = text.partition("T")
    if not sep:
        raise UsageError(
            f"Error parsing timestamp '{text}'. It does not contain a 'T' according to "
            "ISO8601 format"
        )
    if not any(c in time_part for c in "+-Z"):
        text += "Z"
    m = _DATETIME.fullmatch(text)
    if m is None:
        raise UsageError(
            f"Unparseable date: '{text}': expected YYYY-MM-DDThh:mm:ss.sss with an optional "
            "zone (Z, +hh, +hhmm, +hh:mm)"
        )
    year, month, day, hour, minute, second, millis = (int(g) for g in m.groups()[:7])
    zone = m.group(8)
    offset = datetime.timedelta(0)
    if zone != "Z":
        digits = zone[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:] or 0)
        if hours > 18 or minutes > 59:
            raise UsageError(f"Unparseable date: '{text}': zone {zone} out of range")
        offset = datetime.timedelta(hours=hours, minutes=minutes)
        if zone[0] == "-":
            offset = -offset
    try:
        moment = datetime.datetime(
            year,
            month,
            day,
            hour,
            minute,
            second,
            millis * 1000,  # SimpleDateFormat's SSS: "5" is 5 ms
            tzinfo=datetime.timezone(offset),
        )
    except ValueError as exc:
        raise UsageError(f"Unparseable date: '{text}': {exc}") from None
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (moment - epoch) // datetime.timedelta(milliseconds=1)


_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?"
    r"(T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> int:
    """An ISO-8601 duration `PnDTnHnMnS` (java.time.Duration.parse) in ms."""
    m = _DURATION.fullmatch(text)
    if m is None or (m.group(3) is None and m.group(2) is None) or m.group(3) in ("T", "t"):
        raise UsageError(f"Error parsing duration '{text}': expected ISO-8601 PnDTnHnMnS")
    sign, days, _, hours, minutes, seconds, fraction = m.groups()
    ms = (
        int(days or 0) * 86_400_000
        + int(hours or 0) * 3_600_000
        + int(minutes or 0) * 60_000
        + int(seconds or 0) * 1000
    )
    if fraction:
        part = int(fraction.ljust(9, "0")[:3])
        ms += -part if (seconds or "").startswith("-") else part
    return -ms if sign == "-" else ms


def parse_topic_arg(text: str) -> tuple[str, list[int] | None]:
    """`topic` (all partitions: None) or `topic:0,1` (OffsetsUtils.parseTopicsWithPartitions)."""
    if ":" not in text:
        return text, None
    parts = text.split(":")
    if len(parts) != 2 or not parts[0]:
        raise UsageError(f"Invalid topic arg '{text}', expected topic name and partitions")
    partitions = []
    for p in parts[1].split(","):
        if not p.strip().lstrip("-").isdigit():
            raise UsageError(f"Invalid partition '{p}' specified in topic arg '{text}'")
        partitions.append(int(p))
    return parts[0], partitions


# --- running --------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    if args.replay_dead_letters:
        return replay.run(args)
    handlers = {
        "list": list_groups,
        "describe": describe,
        "delete": delete,
        "reset_offsets": reset_offsets,
        "delete_offsets": delete_offsets,
    }
    action = next(a for a in ACTIONS if given(args, a))

    async def body(admin: AdminClient) -> int:
        return await handlers[action](admin, args)

    return run_admin(args, body)


async def share_group_ids(admin: AdminClient) -> list[str]:
    return [g.group_id for g in await admin.list_groups(types=["share"])]


async def list_groups(admin: AdminClient, args: argparse.Namespace) -> int:
    states = parse_states(args.state) if args.state else []
    groups = await admin.list_groups(types=["share"], states=states)
    if args.output == "json":
        print_json([{"group": g.group_id, "state": g.state} for g in groups])
    elif args.state is not None:
        print(table(["GROUP", "STATE"], [(g.group_id, g.state) for g in groups], [15]))
    else:
        for g in groups:
            print(g.group_id)
    return 0


async def describe(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    groups = await share_group_ids(admin) if args.all_groups else list(dict.fromkeys(args.group))
    out: list[dict[str, Any]] = []
    failed = 0
    for group in sorted(groups):
        try:
            description = await admin.describe_share_group(group)
            if args.members:
                out += describe_members(description, args)
            elif args.state is not None:
                dead_letters = await dead_letter_topic(admin, group)
                out += describe_state(description, args, dead_letters)
            else:
                dead_letters = await dead_letter_topic(admin, group)
                out += await describe_offsets(admin, description, args, dead_letters)
        except AdminError as exc:
            print(f"Error: {exc.error}: {exc.message}", file=sys.stderr)
            failed += 1
    if args.output == "json":
        print_json(out)
    return 1 if failed else 0


def note_empty(description: ShareGroupDescription) -> None:
    if description.state == "Dead":
        print(f"Error: Share group '{description.group_id}' does not exist.", file=sys.stderr)
    elif description.state == "Empty":
        print(f"Share group '{description.group_id}' has no active members.", file=sys.stderr)


async def dead_letter_topic(admin: AdminClient, group: str) -> str | None:
    """The group's dead-letter topic (KIP-1191's group config
    errors.deadletterqueue.topic.name), None if it has none or its configs cannot be
    described (no DESCRIBE_CONFIGS on the group, a broker without the key)."""
    from protocol.admin import RESOURCE_GROUP, AdminError

    try:
        entries = await admin.describe_configs(
            RESOURCE_GROUP, group, include_synonyms=False, keys=[DEAD_LETTER_TOPIC_KEY]
        )
    except AdminError:
        return None
    return next((e.value for e in entries if e.name == DEAD_LETTER_TOPIC_KEY and e.value), None)


def print_dead_letter_topic(d: ShareGroupDescription, topic: str | None) -> None:
    """The line under --describe's table naming the group's dead-letter topic, if any."""
    if topic and d.state != "Dead":
        print(f"Share group '{d.group_id}' dead-letter topic: {topic}")
        print()


def assignment_text(assignment: dict[str, tuple[int, ...]]) -> str:
    """Kafka's ASSIGNMENT column: `topic:0,1;other:2`, topics sorted."""
    return ";".join(
        f"{t}:{','.join(str(p) for p in ps)}" for t, ps in sorted(assignment.items()) if ps
    )


def describe_members(d: ShareGroupDescription, args: argparse.Namespace) -> list[dict[str, Any]]:
    members = sorted(d.members, key=lambda m: m.member_id)
    rows = [
        {
            "group": d.group_id,
            "consumer_id": m.member_id,
            "host": m.host,
            "client_id": m.client_id,
            "partitions": sum(len(ps) for ps in m.assignment.values()),
            "member_epoch": m.member_epoch,
            "assignment": {t: list(ps) for t, ps in sorted(m.assignment.items())},
        }
        for m in members
    ]
    if args.output == "json":
        return rows
    note_empty(d)
    if d.state == "Dead" or not rows:
        return rows
    headers = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    if args.verbose:
        headers.append("MEMBER-EPOCH")
    headers.append("ASSIGNMENT")
    lines = []
    for m, r in zip(members, rows, strict=True):
        line: list[object] = [d.group_id, m.member_id, m.host, m.client_id, r["partitions"]]
        if args.verbose:
            line.append(m.member_epoch)
        line.append(assignment_text(m.assignment))
        lines.append(line)
    print(table(headers, lines, [15, 15, 15, 15, 12, 13]))
    print()
    return rows


def describe_state(
    d: ShareGroupDescription, args: argparse.Namespace, dead_letters: str | None = None
) -> list[dict[str, Any]]:
    c = d.coordinator
    row = {
        "group": d.group_id,
        "coordinator": {"id": c.node_id, "host": c.host, "port": c.port},
        "state": d.state,
        "group_epoch": d.group_epoch,
        "assignment_epoch": d.assignment_epoch,
        "members": len(d.members),
        "dead_letter_topic": dead_letters,
    }
    if args.output == "json":
        return [row]
    note_empty(d)
    coordinator = f"{c.host}:{c.port}  ({c.node_id})"
    if args.verbose:
        headers = ["GROUP", "COORDINATOR (ID)", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH"]
        values: list[object] = [d.group_id, coordinator, d.state, d.group_epoch]
        values.append(d.assignment_epoch)
        widths = [15, 25, 15, 12, 17]
    else:
        headers, values, widths = (
            ["GROUP", "COORDINATOR (ID)", "STATE"],
            [d.group_id, coordinator, d.state],
            [15, 25, 15],
        )
    print(table([*headers, "#MEMBERS"], [[*values, len(d.members)]], widths))
    print()
    print_dead_letter_topic(d, dead_letters)
    return [row]


async def describe_offsets(
    admin: AdminClient,
    d: ShareGroupDescription,
    args: argparse.Namespace,
    dead_letters: str | None = None,
) -> list[dict[str, Any]]:
    offsets = await admin.describe_share_group_offsets(d.group_id)
    rows = [
        {
            "group": d.group_id,
            "topic": o.topic,
            "partition": o.partition,
            "leader_epoch": o.leader_epoch,
            "start_offset": o.start_offset,
            "lag": o.lag,
            "dead_letter_topic": dead_letters,
        }
        for o in offsets
    ]
    if args.output == "json":
        return rows
    if not rows:
        print(f"Share group '{d.group_id}' has no offset information.")
        print_dead_letter_topic(d, dead_letters)
        return rows
    headers = ["GROUP", "TOPIC", "PARTITION"]
    if args.verbose:
        headers.append("LEADER-EPOCH")
    headers += ["START-OFFSET", "LAG"]
    lines = []
    for o in offsets:
        line: list[object] = [d.group_id, o.topic, o.partition]
        if args.verbose:
            line.append(o.leader_epoch)
        lines.append([*line, o.start_offset, o.lag])
    widths = [15, 15, 10, 13, 13] if args.verbose else [15, 15, 10, 13]
    print(table(headers, lines, widths))
    print()
    print_dead_letter_topic(d, dead_letters)
    return rows


async def delete(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    listed = {g.group_id: g for g in await admin.list_groups(types=["share"])}
    wanted = list(listed) if args.all_groups else list(dict.fromkeys(args.group))
    failed: dict[str, AdminError] = {}
    for group in wanted:
        listing = listed.get(group)
        if listing is None:
            failed[group] = AdminError(
                "GROUP_ID_NOT_FOUND", f"Group '{group}' is not a share group."
            )
        elif listing.state.lower() == "dead":
            failed[group] = AdminError(
                "GROUP_ID_NOT_FOUND", f"Share group '{group}' group state is DEAD."
            )
        elif listing.state.lower() != "empty":
            failed[group] = AdminError("NON_EMPTY_GROUP", f"Share group '{group}' is not EMPTY.")
    to_delete = [g for g in wanted if g not in failed]
    results = await admin.delete_groups(to_delete) if to_delete else {}
    failed.update({g: e for g, e in results.items() if e is not None})
    deleted = [g for g in to_delete if g not in failed]
    if args.output == "json":
        print_json(
            {
                "deleted": deleted,
                "failed": {g: {"error": e.error, "message": e.message} for g, e in failed.items()},
            }
        )
    elif not failed:
        names = ", ".join(f"'{g}'" for g in deleted)
        print(f"Deletion of requested share groups ({names}) was successful.")
    else:
        print("Error: Deletion of some share groups failed:", file=sys.stderr)
        for g, e in failed.items():
            print(
                f"* Group '{g}' could not be deleted due to: {e.error}: {e.message}",
                file=sys.stderr,
            )
        if deleted:
            names = ", ".join(f"'{g}'" for g in deleted)
            print(f"\nThese share groups were deleted successfully: {names}")
    return 1 if failed else 0


async def delete_offsets(admin: AdminClient, args: argparse.Namespace) -> int:
    (group,) = args.group
    topics = list(dict.fromkeys(args.topic))
    results = await admin.delete_share_group_offsets(group, topics)
    if args.output == "json":
        print_json(
            [
                {
                    "topic": t,
                    "status": "Successful" if e is None else "Error",
                    "error": None if e is None else e.error,
                    "message": None if e is None else e.message,
                }
                for t, e in sorted(results.items())
            ]
        )
    else:
        rows = [
            (t, "Successful" if e is None else f"Error: {e.error}: {e.message}")
            for t, e in sorted(results.items())
        ]
        print(table(["TOPIC", "STATUS"], rows, [15]))
    return 1 if any(e is not None for e in results.values()) else 0


# --- reset ------------------------------------------------------------------------------------


async def reset_offsets(admin: AdminClient, args: argparse.Namespace) -> int:
    """Kafka's flow: the group must be inactive (Empty, or not there yet); the target
    offsets come from ListOffsets; --execute writes them with AlterShareGroupOffsets."""
    from protocol.admin import AdminError

    (group,) = args.group
    try:
        description = await admin.describe_share_group(group)
        if description.state not in ("Empty", "Dead"):
            raise AdminError("NON_EMPTY_GROUP", f"Share group '{group}' is not empty.")
    except AdminError as exc:
        if exc.error != "GROUP_ID_NOT_FOUND":
            raise
    partitions = await partitions_to_reset(admin, group, args)
    plan = await target_offsets(admin, partitions, args)
    if args.execute and plan:
        await admin.alter_share_group_offsets(group, plan)
    rows = [
        {"group": group, "topic": t, "partition": p, "new_offset": o}
        for (t, p), o in sorted(plan.items())
    ]
    if args.output == "json":
        print_json(rows)
    elif rows:
        lines = [(r["group"], r["topic"], r["partition"], r["new_offset"]) for r in rows]
        print(table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], lines, [15, 15, 10]))
    return 0


async def partitions_to_reset(
    admin: AdminClient, group: str, args: argparse.Namespace
) -> list[tuple[str, int]]:
    from protocol.admin import AdminError

    if not args.topic:
        offsets = await admin.describe_share_group_offsets(group)
        return sorted({(o.topic, o.partition) for o in offsets})
    named: list[tuple[str, int]] = []
    whole: list[str] = []
    for arg in args.topic:
        topic, ps = parse_topic_arg(arg)
        if ps is None:
            whole.append(topic)
        else:
            named += [(topic, p) for p in ps]
    topics = {
        t.name: t for t in await admin.describe_topics(sorted({t for t, _ in named} | set(whole)))
    }
    existing = {(name, p.partition) for name, t in topics.items() for p in t.partitions}
    missing = [tp for tp in named if tp not in existing]
    if missing:
        listed = ",".join(f"{t}-{p}" for t, p in missing)
        raise AdminError("UNKNOWN_TOPIC_OR_PARTITION", f'The partitions "{listed}" do not exist')
    named += [(t, p.partition) for t in whole for p in topics[t].partitions]
    return sorted(set(named))


async def target_offsets(
    admin: AdminClient, partitions: list[tuple[str, int]], args: argparse.Namespace
) -> dict[tuple[str, int], int]:
    from persister.clock import SYSTEM_CLOCK
    from protocol.admin import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP

    if not partitions:
        return {}
    if args.to_earliest or args.to_latest:
        spec = EARLIEST_TIMESTAMP if args.to_earliest else LATEST_TIMESTAMP
        listed = await admin.list_offsets({tp: spec for tp in partitions})
        return {tp: listed[tp].offset for tp in partitions}
    if args.to_offset is not None:
        earliest = await admin.list_offsets({tp: EARLIEST_TIMESTAMP for tp in partitions})
        latest = await admin.list_offsets({tp: LATEST_TIMESTAMP for tp in partitions})
        return {
            tp: clamp(tp, args.to_offset, earliest[tp].offset, latest[tp].offset)
            for tp in partitions
        }
    if args.to_datetime is not None:
        timestamp = parse_datetime(args.to_datetime)
    else:
        timestamp = SYSTEM_CLOCK.now_ms() - parse_duration(args.by_duration)
    found = await admin.list_offsets({tp: timestamp for tp in partitions})
    plan = {tp: found[tp].offset for tp in partitions if found[tp].offset >= 0}
    # No record at or after the time: Kafka falls back to the log end offset.
    empty = [tp for tp in partitions if tp not in plan]
    if empty:
        for t, p in empty:
            print(
                f"Warn: Partition {p} from topic {t} is empty. "
                "Falling back to latest known offset.",
                file=sys.stderr,
            )
        latest = await admin.list_offsets({tp: LATEST_TIMESTAMP for tp in empty})
        plan.update({tp: latest[tp].offset for tp in empty})
    return plan


def clamp(tp: tuple[str, int], offset: int, earliest: int, latest: int) -> int:
    """OffsetsUtils.checkOffsetsRange: an offset outside the log moves to its nearest end."""
    if offset < earliest:
        print(
            f"New offset ({offset}) is lower than earliest offset for topic partition "
            f"{tp[0]}-{tp[1]}. Value will be set to {earliest}",
            file=sys.stderr,
        )
        return earliest
    if offset > latest:
        print(
            f"New offset ({offset}) is higher than latest offset for topic partition "
            f"{tp[0]}-{tp[1]}. Value will be set to {latest}",
            file=sys.stderr,
        )
        return latest
    return offset
