"""`spool users` and `spool configs --entity-type users`: kafka-configs.sh's rules for
SCRAM credentials, checked before any connection; the password never appears in a
message, and the tool sends a salted password (RFC 5802's Hi), never the password."""

from __future__ import annotations

import argparse

import pytest

from broker.cli import build_parser
from broker.tools import configs, users
from broker.tools.common import UsageError
from coordinator.scram import credential_from_password, credential_from_salted

B = ["--bootstrap-server", "127.0.0.1:1"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--describe", "--alter"), "exactly one action"),
        (("--alter", "--add-config", "SCRAM-SHA-256=[password=pw-secret]"), "entity name"),
        (("--alter", "--entity-name", "a"), "At least one of --add-config or --delete-config"),
        (
            ("--describe", "--add-config", "SCRAM-SHA-256=[password=pw-secret]"),
            "--add-config can't be used with option --describe",
        ),
        (
            ("--alter", "--entity-name", "a", "--add-config", "SCRAM-SHA-256=[pw-secret]"),
            "Invalid credential property SCRAM-SHA-256",
        ),
        (
            (
                "--alter",
                "--entity-name",
                "a",
                "--add-config",
                "SCRAM-SHA-512=[iterations=4095,password=pw-secret]",
            ),
            "Iterations 4095 is less than the minimum 4096 required for SCRAM-SHA-512",
        ),
        (
            ("--alter", "--entity-name", "a", "--add-config", "consumer_byte_rate=10"),
            "Unexpected config names: consumer_byte_rate",
        ),
        (
            ("--alter", "--entity-name", "a", "--delete-config", "SCRAM-SHA-1"),
            "Unexpected config names: SCRAM-SHA-1",
        ),
    ],
)
@pytest.mark.parametrize("tool", [("users",), ("configs", "--entity-type", "users")])
def test_rules(tool: tuple[str, ...], argv: tuple[str, ...], message: str) -> None:
    args = parse(*tool, *B, *argv)
    module = users if tool[0] == "users" else configs
    with pytest.raises(UsageError) as exc:
        module.validate(args)
    assert message in str(exc.value)
    assert "pw-secret" not in str(exc.value)


def test_configs_users_refuses_entity_default() -> None:
    args = parse(
        "configs", *B, "--entity-type", "users", "--entity-default", "--alter",
        "--add-config", "SCRAM-SHA-256=[password=x]",
    )  # fmt: skip
    with pytest.raises(UsageError, match="--entity-default or --user-defaults is not allowed"):
        configs.validate(args)


def test_credentials_parse_with_kafkas_defaults() -> None:
    creds, deletions = users.scram_changes(
        "SCRAM-SHA-256=[iterations=8192,password=a,b=c],SCRAM-SHA-512=[password=x]",
        "SCRAM-SHA-256",
    )
    assert creds == {"SCRAM-SHA-256": (8192, "a,b=c"), "SCRAM-SHA-512": (4096, "x")}
    assert deletions == ["SCRAM-SHA-256"]
    assert users.scram_changes("SCRAM-SHA-256=[iterations=-1,password=p]", None)[0] == {
        "SCRAM-SHA-256": (4096, "p")
    }


def test_upsertions_carry_a_random_salt_and_the_salted_password() -> None:
    first, second = (
        users.upsertions("alice", {"SCRAM-SHA-512": (8192, "alice-secret")})[0] for _ in range(2)
    )
    assert first.salt != second.salt and len(first.salt) == users.SALT_BYTES
    assert (first.name, first.mechanism, first.iterations) == ("alice", 2, 8192)
    assert b"alice-secret" not in first.salted_password
    assert "alice-secret" not in repr(first) and repr(first.salt) not in repr(first)
    stored = credential_from_salted("SCRAM-SHA-512", first.salt, first.salted_password, 8192)
    assert stored == credential_from_password("SCRAM-SHA-512", "alice-secret", first.salt, 8192)
