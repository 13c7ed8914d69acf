"""`spool share-groups`, `spool topics`, `spool configs`: argument rules (Kafka 4.2's
kafka-share-groups.sh, kafka-topics.sh, kafka-configs.sh), datetime and duration parsing,
tables. No sockets: every case fails or finishes before a connection is made."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from broker.cli import build_parser, main
from broker.tools import configs, share_groups, topics
from broker.tools.common import UsageError, read_properties, security_settings, table
from protocol import admin as admin_module
from protocol.admin import AdminClient, AdminError, Node, parse_bootstrap
from protocol.errors import ErrorCode

B = ["--bootstrap-server", "127.0.0.1:1"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def rule_broken(tool: str, *argv: str) -> str:
    """The UsageError message the tool's validation gives for `argv`."""
    args = parse(tool, *B, *argv)
    validate = {"share-groups": share_groups, "topics": topics, "configs": configs}[tool].validate
    with pytest.raises(UsageError) as exc:
        validate(args)
    return str(exc.value)


def valid(tool: str, *argv: str) -> None:
    args = parse(tool, *B, *argv)
    {"share-groups": share_groups, "topics": topics, "configs": configs}[tool].validate(args)


# --- share-groups rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "exactly one action"),
        (("--list", "--describe", "--all-groups"), "exactly one action"),
        (("--describe",), "Option --describe takes one of these options: --all-groups, --group"),
        (
            ("--describe", "--group", "g", "--members", "--state"),
            "takes at most one of these options: --members, --offsets, --state",
        ),
        (("--describe", "--group", "g", "--state", "Empty"), "does not take a value for --state"),
        (("--list", "--members"), "Option --members may be used with --describe only"),
        (("--list", "--verbose"), "Option --verbose may be used with --describe only"),
        (("--delete",), "Option --delete takes the options --group or --all-groups"),
        (("--delete", "--group", "g", "--all-groups"), "not both"),
        (("--delete", "--group", "g", "--topic", "t"), "does not take the option: --topic"),
        (("--delete-offsets", "--group", "g"), "takes the following options: --group, --topic"),
        (("--list", "--group", "g"), "Option --group can't be used with option --list"),
        (("--describe", "--group", "g", "--topic", "t"), "--topic can't be used with option"),
        (("--list", "--state", "Running"), "Invalid state list 'Running'"),
        (("--list", "--dry-run"), "Option --dry-run may be used with --reset-offsets only"),
        (("--describe", "--all-groups", "--to-earliest"), "--to-earliest may be used with"),
    ],
)
def test_share_groups_argument_rules(argv: tuple[str, ...], message: str) -> None:
    assert message in rule_broken("share-groups", *argv)


RESET = ("--reset-offsets", "--group", "g")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # Kafka 4.2 refuses a reset that names neither (no silent dry run).
        (
            (*RESET, "--topic", "t", "--to-earliest"),
            "Option --reset-offsets takes the option: --execute or --dry-run",
        ),
        (
            (*RESET, "--topic", "t", "--to-earliest", "--dry-run", "--execute"),
            "only accepts one of --execute and --dry-run",
        ),
        (
            ("--reset-offsets", "--topic", "t", "--to-earliest", "--execute"),
            "Option --reset-offsets takes the option: --group",
        ),
        (
            (*RESET, "--to-earliest", "--execute"),
            "takes one of these options: --all-topics, --topic",
        ),
        ((*RESET, "--topic", "t", "--execute"), "--to-datetime, --to-earliest, --to-latest"),
        (
            (*RESET, "--topic", "t", "--to-earliest", "--to-latest", "--execute"),
            "Option --to-earliest can't be used with option --to-latest",
        ),
        ((*RESET, "--all-topics", "--to-offset", "5", "--execute"), "--to-offset takes the option"),
        ((*RESET, "--topic", "t", "--to-offset", "-1", "--execute"), "must not be negative"),
        ((*RESET, "--topic", "t", "--to-datetime", "2026-01-01", "--execute"), "does not contain"),
        ((*RESET, "--topic", "t", "--by-duration", "1h", "--execute"), "Error parsing duration"),
        ((*RESET, "--topic", "t:x", "--to-earliest", "--execute"), "Invalid partition 'x'"),
        ((*RESET, "--topic", "t:0:1", "--to-earliest", "--execute"), "Invalid topic arg"),
        ((*RESET, "--group", "h", "--topic", "t", "--to-earliest", "--execute"), "one share group"),
    ],
)
def test_share_groups_reset_rules(argv: tuple[str, ...], message: str) -> None:
    assert message in rule_broken("share-groups", *argv)


@pytest.mark.parametrize(
    "argv",
    [
        ("--list",),
        ("--list", "--state"),
        ("--list", "--state", "empty,Stable"),
        ("--describe", "--group", "a", "--group", "b", "--members", "--verbose"),
        ("--describe", "--all-groups", "--state"),
        ("--delete", "--all-groups"),
        ("--delete-offsets", "--group", "g", "--topic", "t"),
        (*RESET, "--all-topics", "--to-latest", "--dry-run"),
        (*RESET, "--topic", "t:0,1", "--to-offset", "3", "--execute"),
        (*RESET, "--topic", "t", "--to-datetime", "2026-01-01T00:00:00.000", "--execute"),
        (*RESET, "--topic", "t", "--by-duration", "PT1H", "--dry-run"),
    ],
)
def test_share_groups_accepts_kafkas_forms(argv: tuple[str, ...]) -> None:
    valid("share-groups", *argv)


def test_usage_error_exits_2_with_the_rule_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["share-groups", *B, "--reset-offsets", "--group", "g", "--all-topics"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: spool share-groups" in err
    assert "--execute or --dry-run" in err


def test_missing_bootstrap_server_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["topics", "--list"])
    assert exc.value.code == 2
    assert "--bootstrap-server" in capsys.readouterr().err


def test_malformed_bootstrap_server_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["topics", "--bootstrap-server", "localhost", "--list"])
    assert exc.value.code == 2
    assert "invalid bootstrap server 'localhost'" in capsys.readouterr().err


def test_bootstrap_list_parses_every_address() -> None:
    assert parse_bootstrap("a:1, b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]
    for bad in ("a", "a:", ":1", "a:70000", "a:1,,b:2"):
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


# --- datetime and duration --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "epoch_ms"),
    [
        ("2026-01-01T00:00:00.000", 1_767_225_600_000),  # no zone: UTC, as Kafka
        ("2026-01-01T00:00:00.000Z", 1_767_225_600_000),
        ("2026-01-01T08:00:00.000+08:00", 1_767_225_600_000),
        ("2026-01-01T08:00:00.000+0800", 1_767_225_600_000),
        ("2026-01-01T08:00:00.000+08", 1_767_225_600_000),
        ("2025-12-31T23:00:00.000-01:00", 1_767_225_600_000),
        ("2026-01-01T00:00:00.198", 1_767_225_600_198),
        ("2020-11-10T16:51:38.5", 1_605_027_098_005),  # SimpleDateFormat: "5" is 5 ms
    ],
)
def test_datetime_in_kafkas_formats(text: str, epoch_ms: int) -> None:
    assert share_groups.parse_datetime(text) == epoch_ms


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-01",
        "2026-01-01T00:00:00",  # Kafka's format needs the milliseconds
        "2026-13-01T00:00:00.000",
        "2026-02-30T00:00:00.000",
        "2026-01-01T00:00:00.000+25:00",
        "yesterday T noon",
    ],
)
def test_datetime_refuses_other_forms(text: str) -> None:
    with pytest.raises(UsageError):
        share_groups.parse_datetime(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("PT1H", 3_600_000),
        ("PT30M", 1_800_000),
        ("PT0.5S", 500),
        ("P1D", 86_400_000),
        ("P1DT2H3M4.25S", 86_400_000 + 7_200_000 + 180_000 + 4_250),
        ("pt10s", 10_000),
        ("-PT1S", -1_000),
    ],
)
def test_duration_iso8601(text: str, ms: int) -> None:
    assert share_groups.parse_duration(text) == ms


@pytest.mark.parametrize("text", ["P", "PT", "1H", "PT1X", "P1H", "PT1.5M", ""])
def test_duration_refuses_non_iso8601(text: str) -> None:
    with pytest.raises(UsageError):
        share_groups.parse_duration(text)


def test_topic_arg_names_partitions_or_the_whole_topic() -> None:
    assert share_groups.parse_topic_arg("orders") == ("orders", None)
    assert share_groups.parse_topic_arg("orders:0,2") == ("orders", [0, 2])


# --- tables -------------------------------------------------------------------------------


def test_table_aligns_columns_and_shows_missing_values_as_dash() -> None:
    out = table(
        ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"],
        [("g", "orders", 0, 5, 3), ("g", "a-much-longer-topic", 1, None, None)],
        [15, 15, 10, 13],
    )
    assert out.splitlines() == [
        "GROUP           TOPIC               PARTITION  START-OFFSET  LAG",
        "g               orders              0          5             3",
        "g               a-much-longer-topic 1          -             -",
    ]


def test_table_grows_a_column_to_its_widest_cell() -> None:
    lines = table(["GROUP", "STATE"], [("a-group-name-over-15", "Empty")], [15]).splitlines()
    assert lines == ["GROUP                STATE", "a-group-name-over-15 Empty"]


# --- topics and configs rules --------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "exactly one action"),
        (("--create",), "Missing required argument --topic"),
        (("--alter", "--topic", "t"), "Missing required argument --partitions"),
        (("--alter", "--topic", "t", "--partitions", "2", "--config", "a=b"), "spool configs"),
        (("--list", "--partitions", "2"), "--partitions can't be used with option --list"),
        (("--create", "--topic", "t", "--partitions", "0"), "must be greater than 0"),
        (("--create", "--topic", "t", "--replication-factor", "0"), "between 1 and 32767"),
        (("--create", "--topic", "t", "--config", "novalue"), "KEY=VALUE"),
        (("--describe", "--topic", "(unclosed"), "not a valid regular expression"),
        (("--create", "--topic", "t", "--if-exists"), "--if-exists can't be used"),
    ],
)
def test_topics_argument_rules(argv: tuple[str, ...], message: str) -> None:
    assert message in rule_broken("topics", *argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--entity-type", "topics"), "exactly one action: --describe, --alter"),
        (("--describe",), "At least one entity type must be specified"),
        (("--describe", "--entity-type", "clients"), "Invalid entity type clients"),
        (("--describe", "--entity-type", "brokers", "--entity-name", "x"), "valid integer"),
        (("--describe", "--entity-type", "topics", "--entity-default"), "--entity-default must"),
        (("--alter", "--entity-type", "topics", "--add-config", "a=b"), "An entity name must"),
        (("--alter", "--entity-type", "brokers", "--add-config", "a=b"), "or default entity"),
        (("--alter", "--entity-type", "groups", "--entity-name", "g"), "At least one of"),
        (
            ("--describe", "--entity-type", "topics", "--add-config", "a=b"),
            "--add-config can't be used with option --describe",
        ),
        (
            ("--alter", "--entity-type", "topics", "--entity-name", "t", "--add-config", "a"),
            'format "key=val"',
        ),
    ],
)
def test_configs_argument_rules(argv: tuple[str, ...], message: str) -> None:
    assert message in rule_broken("configs", *argv)


def test_add_config_keeps_commas_inside_brackets() -> None:
    assert configs.parse_add_config("a=1,b=[x,y],c=") == {"a": "1", "b": "x,y", "c": ""}
    with pytest.raises(UsageError):
        configs.parse_add_config("a=[1,2")


def test_command_config_reads_java_properties(tmp_path: Path) -> None:
    path = tmp_path / "admin.properties"
    path.write_text("# comment\n! also a comment\nclient.id = ops\ndefault.api.timeout.ms:5000\n")
    assert read_properties(path) == {"client.id": "ops", "default.api.timeout.ms": "5000"}


def test_command_config_reads_properties_as_java_does(tmp_path: Path) -> None:
    # Kafka's documentation writes sasl.jaas.config over several lines; Java also
    # takes a blank as the separator, and escapes.
    path = tmp_path / "client.properties"
    path.write_text(
        "security.protocol SASL_SSL\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="alice" \\\n'
        '    password="alice-secret";\n'
        "# a comment ending in a backslash does not go on \\\n"
        "sasl.mechanism:PLAIN   \n"
        "ssl.ca.location=C\\:\\\\certs\\\\ca.pem\n"
        "client.id=caf\\u00e9\\ \n"
        "key\\=with\\:seps = v\n"
        "empty\n"
    )
    assert read_properties(path) == {
        "security.protocol": "SASL_SSL",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="alice" password="alice-secret";',
        "sasl.mechanism": "PLAIN",
        "ssl.ca.location": "C:\\certs\\ca.pem",
        "client.id": "caf\u00e9 ",
        "key=with:seps": "v",
        "empty": "",
    }
    security = security_settings(read_properties(path))
    assert (security.username, security.password) == ("alice", "alice-secret")


# --- the admin client's coordinator retry (no sockets: the lookup and call are stubbed) --


def _admin_with_coordinator_errors(
    monkeypatch: pytest.MonkeyPatch, errors: list[ErrorCode], timeout_s: float
) -> tuple[AdminClient, list[str]]:
    """An AdminClient whose coordinator lookup fails with `errors` in turn, then finds
    node 1; `seen` records each lookup."""
    monkeypatch.setattr(admin_module, "BACKOFF_MS", 0)
    admin = AdminClient([("127.0.0.1", 1)], timeout_s, "test")
    seen: list[str] = []
    pending = list(errors)

    async def find(group: str, deadline: float) -> Node:
        seen.append(group)
        if pending:
            raise admin_module._Retry(pending.pop(0), "try again")
        return Node(1, "h", 1)

    monkeypatch.setattr(admin, "_find_coordinator", find)
    return admin, seen


async def test_coordinator_errors_look_the_coordinator_up_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    errors = [ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator]
    admin, seen = _admin_with_coordinator_errors(monkeypatch, errors, 30)

    async def call(address: tuple[str, int], deadline: float) -> str:
        return f"{address[0]}:{address[1]}"

    result, node = await admin._with_coordinator("g", call)
    assert (result, node.node_id) == ("h:1", 1)
    assert seen == ["g", "g", "g"]


async def test_a_coordinator_that_never_answers_is_an_admin_error_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin, seen = _admin_with_coordinator_errors(
        monkeypatch, [ErrorCode.coordinator_not_available] * 1_000_000, 0.05
    )

    async def call(address: tuple[str, int], deadline: float) -> None:
        raise AssertionError("no coordinator was ever found")

    with pytest.raises(AdminError) as exc:
        await admin._with_coordinator("g", call)
    assert exc.value.error == "COORDINATOR_NOT_AVAILABLE"
    assert len(seen) > 1


async def test_an_error_from_the_coordinator_itself_is_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin, seen = _admin_with_coordinator_errors(monkeypatch, [], 30)

    async def call(address: tuple[str, int], deadline: float) -> None:
        admin._coordinator_check(ErrorCode.non_empty_group, "Group g is not empty", "g")

    with pytest.raises(AdminError) as exc:
        await admin._with_coordinator("g", call)
    assert (exc.value.error, exc.value.message) == ("NON_EMPTY_GROUP", "Group g is not empty")
    assert seen == ["g"]
