"""`spool consumer-groups`: Kafka 4.2's kafka-consumer-groups.sh argument rules, the
offset-reset computation (OffsetsUtils), the --from-file / --export CSV, the rows of
--describe --offsets, and the admin client's parsing of a classic member's assignment.
No sockets."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
from typing import Any

import pytest
from kio.schema.consumer_protocol_assignment.v3.data import (
    ConsumerProtocolAssignment,
)
from kio.schema.consumer_protocol_assignment.v3.data import (
    TopicPartition as AssignedPartitions,
)
from kio.serial import entity_writer
from kio.static.primitive import i32

from broker.cli import build_parser
from broker.tools import consumer_groups as cg
from broker.tools.common import UsageError
from protocol.admin import (
    AdminError,
    CommittedOffset,
    ConsumerGroupDescription,
    ConsumerMember,
    ListedOffset,
    Node,
    PartitionInfo,
    TopicInfo,
    group_state_name,
    kafka_error_message,
    parse_consumer_assignment,
)

B = ["--bootstrap-server", "127.0.0.1:1"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["consumer-groups", *B, *argv])


def rule_broken(*argv: str) -> str:
    with pytest.raises(UsageError) as exc:
        cg.validate(parse(*argv))
    return str(exc.value)


# --- argument rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "Command must include exactly one action"),
        (("--list", "--delete", "--all-groups"), "exactly one action"),
        (("--describe",), "Option --describe takes one of these options: --all-groups, --group"),
        (
            ("--describe", "--group", "g", "--members", "--offsets"),
            "takes at most one of these options: --members, --offsets, --state",
        ),
        (("--describe", "--group", "g", "--state", "Stable"), "does not take a value for --state"),
        (("--list", "--members"), "Option --members may be used with --describe only"),
        (("--list", "--offsets"), "Option --offsets may be used with --describe only"),
        (("--describe", "--all-groups", "--type"), "Option --type may be used with --list only"),
        (("--delete", "--group", "g", "--state"), "--state may be used with --describe or --list"),
        (("--delete",), "Option --delete takes one of these options: --all-groups, --group"),
        (
            ("--delete", "--group", "g", "--topic", "t"),
            "The consumer does not support topic-specific offset deletion from a consumer group.",
        ),
        (("--delete-offsets", "--group", "g"), "takes the following options: --group, --topic"),
        (("--delete-offsets", "--topic", "t"), "takes the following options: --group, --topic"),
        (
            ("--delete-offsets", "--group", "a", "--group", "b", "--topic", "t"),
            "one consumer group at a time",
        ),
        (("--list", "--group", "g"), "Option --group can't be used with option --list"),
        (("--describe", "--group", "g", "--all-groups"), "--group can't be used with option"),
        (("--describe", "--group", "g", "--topic", "t"), "--topic can't be used with option"),
        (("--list", "--state", "Running"), "Invalid state list 'Running'. Valid states are:"),
        (("--list", "--type", "share"), "Invalid types list 'share'. Valid types are: Classic"),
        (("--list", "--dry-run"), "Option --dry-run may be used with --reset-offsets only"),
        (("--describe", "--all-groups", "--to-earliest"), "--to-earliest may be used with"),
        (("--list", "--export"), "--export may be used with --reset-offsets only"),
        (
            (
                "--reset-offsets",
                "--group",
                "g",
                "--topic",
                "t",
                "--to-earliest",
                "--dry-run",
                "--execute",
            ),
            "only accepts one of --execute and --dry-run",
        ),
        (
            ("--reset-offsets", "--topic", "t", "--to-earliest"),
            "Option --reset-offsets takes one of these options: --all-groups, --group",
        ),
        (
            ("--reset-offsets", "--group", "g", "--topic", "t"),
            "requires one of the following scenarios",
        ),
        (
            ("--reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--to-latest"),
            "Option --to-earliest can't be used with option --to-latest",
        ),
        (
            (
                "--reset-offsets",
                "--group",
                "g",
                "--topic",
                "t",
                "--shift-by",
                "1",
                "--to-offset",
                "3",
            ),
            "Option --to-offset can't be used with option --shift-by",
        ),
        (
            ("--reset-offsets", "--group", "g", "--to-earliest"),
            "One of the reset scopes should be defined: --all-topics, --topic.",
        ),
        (
            ("--reset-offsets", "--group", "g", "--topic", "t", "--all-topics", "--to-latest"),
            "--topic can't be used with option --all-topics",
        ),
        (
            ("--reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "2024-01-01"),
            "does not contain a 'T'",
        ),
        (
            ("--reset-offsets", "--group", "g", "--all-topics", "--by-duration", "1D"),
            "Error parsing duration '1D'",
        ),
        (
            ("--reset-offsets", "--group", "g", "--topic", "t:x", "--to-latest"),
            "Invalid partition 'x'",
        ),
    ],
)
def test_argument_rules(argv: tuple[str, ...], message: str) -> None:
    assert message in rule_broken(*argv)


@pytest.mark.parametrize(
    "argv",
    [
        ("--list",),
        ("--list", "--state"),
        ("--list", "--state", "stable,EMPTY", "--type", "classic,Consumer"),
        ("--describe", "--group", "g"),
        ("--describe", "--all-groups", "--members", "--verbose"),
        ("--describe", "--group", "a", "--group", "b", "--state"),
        ("--delete", "--all-groups"),
        ("--delete-offsets", "--group", "g", "--topic", "t", "--topic", "u:0,1"),
        ("--reset-offsets", "--group", "g", "--all-topics", "--to-current", "--execute"),
        ("--reset-offsets", "--all-groups", "--topic", "t:0", "--shift-by", "-5", "--dry-run"),
        ("--reset-offsets", "--group", "g", "--from-file", "plan.csv", "--execute"),
        ("--reset-offsets", "--group", "g", "--topic", "t", "--by-duration", "PT1H", "--export"),
    ],
)
def test_valid_arguments(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    cg.validate(parse(*argv))


def test_reset_without_execute_or_dry_run_warns_as_kafka(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cg.validate(parse("--reset-offsets", "--group", "g", "--all-topics", "--to-latest"))
    assert "No action will be performed as the --execute option is missing" in (
        capsys.readouterr().err
    )
    cg.validate(
        parse("--reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--dry-run")
    )
    assert capsys.readouterr().err == ""


def test_states_and_types_are_kafkas_names() -> None:
    assert cg.parse_states("stable, empty,preparingrebalance") == [
        "Empty",
        "PreparingRebalance",
        "Stable",
    ]
    assert cg.parse_types("CLASSIC,consumer") == ["classic", "consumer"]
    assert group_state_name("completingrebalance") == "CompletingRebalance"
    assert group_state_name("whatever") == "Unknown"


# --- the reset computation -----------------------------------------------------------------

T0, T1, T2 = ("t", 0), ("t", 1), ("t", 2)
EARLIEST = {T0: 5, T1: 0, T2: 0}
LATEST = {T0: 50, T1: 10, T2: 0}
COMMITTED = {T0: 20, T1: 7}


def reset(*argv: str, **kw: object) -> dict[tuple[str, int], int]:
    args = parse("--reset-offsets", "--group", "g", "--all-topics", "--dry-run", *argv)
    partitions = kw.pop("partitions", [T0, T1])
    return cg.compute_reset(args, partitions, COMMITTED, EARLIEST, LATEST, **kw)  # type: ignore[arg-type]


def test_reset_to_earliest_latest_and_current() -> None:
    assert reset("--to-earliest") == {T0: 5, T1: 0}
    assert reset("--to-latest") == {T0: 50, T1: 10}
    # --to-current: the committed offset, the log end where none is committed.
    assert reset("--to-current", partitions=[T0, T1, T2]) == {T0: 20, T1: 7, T2: 0}


def test_reset_to_offset_is_clamped_to_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    assert reset("--to-offset", "8") == {T0: 8, T1: 8}
    assert reset("--to-offset", "3") == {T0: 5, T1: 3}
    assert "is lower than earliest offset for topic partition t-0" in capsys.readouterr().err
    assert reset("--to-offset", "99") == {T0: 50, T1: 10}
    assert "is higher than latest offset" in capsys.readouterr().err


def test_reset_shift_by_moves_from_the_committed_offsets() -> None:
    assert reset("--shift-by", "-3") == {T0: 17, T1: 4}
    assert reset("--shift-by", "5") == {T0: 25, T1: 10}  # 12 is past the log end of t-1
    assert reset("--shift-by", "-100") == {T0: 5, T1: 0}
    with pytest.raises(UsageError, match="Cannot shift offset for partition t-2 since there"):
        reset("--shift-by", "1", partitions=[T0, T2])


def test_reset_by_time_falls_back_to_the_log_end(capsys: pytest.CaptureFixture[str]) -> None:
    by_time = {T0: 12, T1: -1}
    plan = reset("--to-datetime", "2024-01-01T00:00:00.000", by_time=by_time)
    assert plan == {T0: 12, T1: 10}
    assert "Partition 1 from topic t is empty. Falling back to latest known offset." in (
        capsys.readouterr().err
    )
    assert reset("--by-duration", "PT1H", by_time={T0: 6, T1: 3}) == {T0: 6, T1: 3}


def test_reset_from_file_round_trips_the_export(tmp_path: object) -> None:
    plans = {"g": {T1: 2, T0: 40}}
    single = cg.export_csv(plans, single_group=True)
    assert single == "t,0,40\nt,1,2\n"
    assert cg.parse_reset_plan(single, ["g"]) == {"g": {T0: 40, T1: 2}}
    multi = cg.export_csv({"g": {T0: 1}, "h": {T1: 99}}, single_group=False)
    assert multi == "g,t,0,1\nh,t,1,99\n"
    assert cg.parse_reset_plan(multi, None) == {"g": {T0: 1}, "h": {T1: 99}}
    requested = cg.parse_reset_plan(multi, None)["h"]
    # Offsets from the file are clamped like --to-offset.
    args = parse("--reset-offsets", "--group", "h", "--from-file", "x.csv", "--dry-run")
    assert cg.compute_reset(args, [T1], COMMITTED, EARLIEST, LATEST, requested=requested) == {
        T1: 10
    }
    with pytest.raises(UsageError, match="expected group,topic,partition,offset"):
        cg.parse_reset_plan("t,0,1\n", ["g", "h"])
    with pytest.raises(UsageError, match="must be numbers"):
        cg.parse_reset_plan("t,zero,1\n", ["g"])


# --- describe --offsets rows -------------------------------------------------------------------


def member(member_id: str, assignment: dict[str, tuple[int, ...]]) -> ConsumerMember:
    return ConsumerMember(member_id, None, f"client-{member_id}", "/10.0.0.1", assignment)


def test_offset_rows_assigned_first_then_committed_without_member() -> None:
    description = ConsumerGroupDescription(
        group_id="g",
        type="classic",
        protocol_type="consumer",
        state="Stable",
        assignor="range",
        coordinator=Node(1, "h", 9092),
        members=(member("a", {"t": (0,)}), member("b", {"t": (1, 2)}), member("c", {})),
    )
    committed = {
        ("t", 0): CommittedOffset(3, None, ""),
        ("t", 2): CommittedOffset(9, 4, ""),
        ("u", 0): CommittedOffset(1, None, ""),
    }
    log_end = {("t", 0): 10, ("t", 1): 5, ("t", 2): 9, ("u", 0): None}
    rows = cg.offset_rows("g", description, committed, log_end)
    got = [
        (
            r["topic"],
            r["partition"],
            r["current_offset"],
            r["log_end_offset"],
            r["lag"],
            r["consumer_id"],
        )
        for r in rows
    ]
    assert got == [
        ("t", 1, None, 5, None, "b"),  # the member with most partitions first
        ("t", 2, 9, 9, 0, "b"),
        ("t", 0, 3, 10, 7, "a"),
        ("u", 0, 1, None, None, "-"),  # committed, no member, no log end offset known
    ]
    assert rows[1]["leader_epoch"] == 4


def test_offset_rows_without_a_description() -> None:
    committed = {("t", 0): CommittedOffset(3, None, "")}
    rows = cg.offset_rows("g", None, committed, {("t", 0): 10})
    assert [(r["lag"], r["consumer_id"], r["host"]) for r in rows] == [(7, "-", "-")]


def test_assignment_text_is_kafkas() -> None:
    assert cg.assignment_text({"b": (2,), "a": (0, 1), "c": ()}) == "a:0,1;b:2"
    assert cg.assignment_text({}) == "-"
    assert cg.assignment_text(None) == "-"


# --- the admin client's pieces ---------------------------------------------------------------


def encoded_assignment(version: int) -> bytes:
    buf = io.BytesIO()
    entity_writer(ConsumerProtocolAssignment)(
        buf,
        ConsumerProtocolAssignment(
            assigned_partitions=(
                AssignedPartitions(topic="t", partitions=(i32(2), i32(0))),
                AssignedPartitions(topic="u", partitions=(i32(1),)),
            ),
            user_data=None,
        ),
    )
    return version.to_bytes(2, "big") + buf.getvalue()


@pytest.mark.parametrize("version", [0, 1, 3, 7])
def test_classic_member_assignment_is_parsed(version: int) -> None:
    assert parse_consumer_assignment(encoded_assignment(version)) == {"t": (0, 2), "u": (1,)}


def test_unreadable_assignment_is_none() -> None:
    assert parse_consumer_assignment(b"") == {}
    assert parse_consumer_assignment(b"\x00\x03\xff") == {}


def test_kafka_error_messages() -> None:
    assert kafka_error_message("NON_EMPTY_GROUP") == "The group is not empty."
    assert kafka_error_message("GROUP_ID_NOT_FOUND") == "The group id does not exist."
    assert kafka_error_message("SOMETHING_ELSE") is None


# --- the actions against a fake admin client (what the broker answers, without sockets) ---


class FakeAdmin:
    """The AdminClient calls the tool makes, answered from memory."""

    def __init__(self, description: ConsumerGroupDescription | AdminError) -> None:
        self.description = description
        self.committed = {("t", 0): CommittedOffset(3, None, "")}
        self.altered: list[dict[tuple[str, int], int]] = []
        self.delete_result: dict[str, AdminError | None] = {}

    async def describe_consumer_group(self, group: str) -> ConsumerGroupDescription:
        if isinstance(self.description, AdminError):
            raise self.description
        return self.description

    async def list_consumer_group_offsets(self, group: str) -> dict[Any, CommittedOffset]:
        return dict(self.committed)

    async def list_offsets(self, specs: dict[tuple[str, int], int]) -> dict[Any, ListedOffset]:
        return {tp: ListedOffset(10 if spec == -1 else 0, -1) for tp, spec in specs.items()}

    async def describe_topics(self, topics: list[str]) -> list[TopicInfo]:
        return [TopicInfo(t, None, False, (PartitionInfo(0, 1, 0, (1,), (1,)),)) for t in topics]

    async def alter_consumer_group_offsets(
        self, group: str, offsets: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], AdminError | None]:
        self.altered.append(dict(offsets))
        return dict.fromkeys(offsets)

    async def delete_groups(self, groups: list[str]) -> dict[str, AdminError | None]:
        return {g: self.delete_result.get(g) for g in groups}


def stable_group() -> ConsumerGroupDescription:
    return ConsumerGroupDescription(
        group_id="g",
        type="consumer",
        protocol_type="consumer",
        state="Stable",
        assignor="uniform",
        coordinator=Node(1, "broker1", 9092),
        members=(
            ConsumerMember(
                "m1",
                "static-1",
                "client-1",
                "/10.0.0.1",
                {"t": (0,)},
                target_assignment={"t": (0, 1)},
                member_epoch=5,
                upgraded=True,
            ),
        ),
        group_epoch=6,
        target_assignment_epoch=6,
    )


def run_action(admin: FakeAdmin, handler: Any, *argv: str) -> int:
    args = parse(*argv)
    cg.validate(args)
    return int(asyncio.run(handler(admin, args)))


def test_describe_members_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    admin = FakeAdmin(stable_group())
    assert (
        run_action(admin, cg.describe, "--describe", "--group", "g", "--members", "--verbose") == 0
    )
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines == [
        [
            "GROUP",
            "CONSUMER-ID",
            "GROUP-INSTANCE-ID",
            "HOST",
            "CLIENT-ID",
            "#PARTITIONS",
            "CURRENT-EPOCH",
            "CURRENT-ASSIGNMENT",
            "TARGET-EPOCH",
            "TARGET-ASSIGNMENT",
        ],
        ["g", "m1", "static-1", "/10.0.0.1", "client-1", "1", "5", "t:0", "6", "t:0,1"],
    ]


def test_describe_state_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    admin = FakeAdmin(stable_group())
    assert run_action(admin, cg.describe, "--describe", "--group", "g", "--state", "--verbose") == 0
    out = capsys.readouterr().out
    assert "GROUP-EPOCH" in out and "TARGET-ASSIGNMENT-EPOCH" in out
    row = next(line for line in out.splitlines() if line.startswith("g "))
    assert row.split() == ["g", "broker1:9092", "(1)", "uniform", "Stable", "6", "6", "1"]


def test_describe_offsets_names_the_member(capsys: pytest.CaptureFixture[str]) -> None:
    admin = FakeAdmin(stable_group())
    assert run_action(admin, cg.describe, "--describe", "--group", "g") == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("g ")]
    assert [r.split() for r in row] == [
        ["g", "t", "0", "3", "10", "7", "m1", "/10.0.0.1", "client-1"]
    ]


def test_describe_without_describe_apis_still_prints_offsets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    unsupported = AdminError("UNSUPPORTED_VERSION", "the broker serves neither ...")
    assert run_action(FakeAdmin(unsupported), cg.describe, "--describe", "--group", "g") == 0
    out = capsys.readouterr()
    assert "Error: UNSUPPORTED_VERSION" in out.err
    assert [line.split() for line in out.out.splitlines() if line.startswith("g ")] == [
        ["g", "t", "0", "3", "10", "7", "-", "-", "-"]
    ]
    # --members needs them: an error, exit 1.
    assert (
        run_action(FakeAdmin(unsupported), cg.describe, "--describe", "--group", "g", "--members")
        == 1
    )


def test_describe_dead_group_says_it_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    dead = dataclasses.replace(stable_group(), state="Dead", members=())
    admin = FakeAdmin(dead)
    admin.committed = {}
    assert run_action(admin, cg.describe, "--describe", "--group", "g", "--state") == 0
    assert "Error: Consumer group 'g' does not exist." in capsys.readouterr().err


def test_reset_of_an_active_group_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    admin = FakeAdmin(stable_group())
    argv = ("--reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--execute")
    assert run_action(admin, cg.reset_offsets, *argv) == 1
    assert admin.altered == []
    assert (
        "Assignments can only be reset if the group 'g' is inactive, but the current state "
        "is Stable." in capsys.readouterr().err
    )
    empty = FakeAdmin(dataclasses.replace(stable_group(), state="Empty", members=()))
    assert run_action(empty, cg.reset_offsets, *argv) == 0
    assert empty.altered == [{("t", 0): 0}]


def test_delete_of_a_non_empty_group(capsys: pytest.CaptureFixture[str]) -> None:
    admin = FakeAdmin(stable_group())
    admin.delete_result = {"g": AdminError("NON_EMPTY_GROUP", "group 'g'")}
    assert run_action(admin, cg.delete, "--delete", "--group", "g", "--group", "h") == 1
    out = capsys.readouterr()
    assert "Error: Deletion of some consumer groups failed:" in out.err
    assert (
        "* Group 'g' could not be deleted due to: NON_EMPTY_GROUP: The group is not empty."
        in out.out
    )
    assert "These consumer groups were deleted successfully: 'h'" in out.out


# --- --validate-regex ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("regex", "said"),
    [
        ("orders-.*", "The regular expression `orders-.*` is valid.\n"),
        (
            "orders-(.*",
            "The regular expression `orders-(.*` is invalid: missing closing ): `orders-(.*`.\n",
        ),
        (
            "(?<=a)b",
            "The regular expression `(?<=a)b` is invalid: invalid or unsupported Perl syntax: "
            "`(?<`.\n",
        ),
    ],
)
def test_validate_regex_needs_no_broker(
    regex: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """kafka-consumer-groups.sh --validate-regex: RE2 syntax, told on stdout, exit 0,
    no --bootstrap-server needed (nothing listens on the address in B either)."""
    for argv in (
        ["consumer-groups", "--validate-regex", regex],
        ["consumer-groups", *B, "--validate-regex", regex],
    ):
        args = build_parser().parse_args(argv)
        cg.validate(args)
        assert cg.run(args) == 0
        assert capsys.readouterr().out == said


def test_every_other_action_needs_a_bootstrap_server() -> None:
    args = build_parser().parse_args(["consumer-groups", "--list"])
    with pytest.raises(UsageError) as exc:
        cg.validate(args)
    assert str(exc.value) == 'Missing required argument "[bootstrap-server]"'
