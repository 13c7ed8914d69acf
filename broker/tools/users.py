"""`spool users`: describe, create, change and delete SCRAM credentials (KIP-554), as
Kafka 4.2's `kafka-configs.sh --bootstrap-server B --entity-type users` does (its flags,
rules and output); `spool configs --entity-type users` runs the same code.

    spool users --bootstrap-server B --alter --entity-name alice \\
        --add-config 'SCRAM-SHA-512=[iterations=8192,password=alice-secret]'
    spool users --bootstrap-server B --alter --entity-name alice --delete-config SCRAM-SHA-512
    spool users --bootstrap-server B --describe [--entity-name alice]

As Kafka's admin client, the tool salts the password itself (a random salt, PBKDF2 with
the mechanism's hash, `iterations` defaulting to 4096) and sends the salt and salted
password: the password never leaves this process. User quotas, the other configs
kafka-configs.sh takes for users, are not in spool.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from broker.tools.common import (
    UsageError,
    add_connection_flags,
    parse_add_config,
    parse_delete_config,
    print_json,
    run_admin,
    usage_checked,
)
from coordinator.scram import (
    DEFAULT_ITERATIONS,
    MECHANISM_BY_TYPE,
    MECHANISMS,
    MIN_ITERATIONS,
    salted_password,
)

if TYPE_CHECKING:
    from protocol.admin import AdminClient, ScramUpsertion

SALT_BYTES = 32
# ConfigCommand's credential value: `[iterations=N,]password=P` (the password may hold
# commas and '=': it is the rest of the value).
_CREDENTIAL = re.compile(r"^(?:iterations=(-?[0-9]*),)?password=(.*)$", re.DOTALL)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "users",
        help="describe and alter SCRAM credentials (kafka-configs.sh --entity-type users)",
        description="Describe, create, change and delete the SCRAM credentials of users.",
    )
    add_connection_flags(p)
    p.add_argument("--describe", action="store_true", help="list the users' SCRAM credentials")
    p.add_argument("--alter", action="store_true", help="add or delete a user's credentials")
    p.add_argument(
        "--entity-name",
        "--user",
        dest="entity_name",
        metavar="USER",
        help="the user (with --describe: every user with a credential if not given)",
    )
    p.add_argument(
        "--entity-type",
        metavar="users",
        help="accepted for kafka-configs.sh's command lines; must be users",
    )
    p.add_argument(
        "--add-config",
        metavar="'SCRAM-SHA-256=[iterations=N,password=P]'",
        help="credentials to create or change, comma-separated",
    )
    p.add_argument(
        "--delete-config", metavar="SCRAM-SHA-256,SCRAM-SHA-512", help="credentials to delete"
    )
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


def validate(args: argparse.Namespace) -> None:
    if args.entity_type not in (None, "users"):
        raise UsageError(f"spool users takes --entity-type users only, not {args.entity_type}")
    if int(args.describe) + int(args.alter) != 1:
        raise UsageError("Command must include exactly one action: --describe, --alter")
    validate_users(args)


def validate_users(args: argparse.Namespace) -> None:
    """The rules of kafka-configs.sh for `--entity-type users` with SCRAM configs
    (ConfigCommand.alterConfig and checkArgs)."""
    if args.describe:
        for name, value in (("add-config", args.add_config), ("delete-config", args.delete_config)):
            if value is not None:
                raise UsageError(f"Option --{name} can't be used with option --describe")
        return
    if getattr(args, "entity_default", False):
        raise UsageError(
            "The use of --entity-default or --user-defaults is not allowed with User SCRAM "
            "Credentials using --bootstrap-server."
        )
    if args.entity_name is None:
        raise UsageError("An entity name must be specified with --alter of users")
    if args.add_config is None and args.delete_config is None:
        raise UsageError(
            "At least one of --add-config or --delete-config must be specified with --alter"
        )
    scram_changes(args.add_config, args.delete_config)


def scram_changes(
    add_config: str | None, delete_config: str | None
) -> tuple[dict[str, tuple[int, str]], list[str]]:
    """(mechanism -> (iterations, password), mechanisms to delete) of the flags; a
    UsageError with ConfigCommand's words for anything else."""
    to_add = parse_add_config(add_config or "")
    to_delete = parse_delete_config(delete_config)
    for verb, names in (("added", list(to_add)), ("deleted", to_delete)):
        unknown = [n for n in names if n not in MECHANISMS]
        if unknown:
            raise UsageError(
                f"Only SCRAM credential configs can be {verb} for 'users' using "
                f"--bootstrap-server (spool has no user quotas). Unexpected config names: "
                f"{', '.join(unknown)}"
            )
    credentials: dict[str, tuple[int, str]] = {}
    for mechanism, value in to_add.items():
        match = _CREDENTIAL.match(value)
        if match is None:
            # Never the value: it holds the password.
            raise UsageError(
                f"Invalid credential property {mechanism}: expected "
                f"{mechanism}=[iterations=N,password=P] or {mechanism}=[password=P]"
            )
        text, password = match.group(1), match.group(2)
        try:
            iterations = int(text) if text not in (None, "", "-1") else DEFAULT_ITERATIONS
        except ValueError:
            raise UsageError(f"Invalid iterations for {mechanism}") from None
        if iterations < MIN_ITERATIONS:
            raise UsageError(
                f"Iterations {iterations} is less than the minimum {MIN_ITERATIONS} "
                f"required for {mechanism}"
            )
        credentials[mechanism] = (iterations, password)
    return credentials, to_delete


def upsertions(user: str, credentials: dict[str, tuple[int, str]]) -> list[ScramUpsertion]:
    """Salted here, as Kafka's admin client does: a random salt per credential."""
    from protocol.admin import ScramUpsertion

    out = []
    for mechanism, (iterations, password) in credentials.items():
        salt = os.urandom(SALT_BYTES)
        out.append(
            ScramUpsertion(
                user,
                MECHANISMS[mechanism][0],
                iterations,
                salt,
                salted_password(mechanism, password, salt, iterations),
            )
        )
    return out


def run(args: argparse.Namespace) -> int:
    return run_admin(args, lambda admin: run_users(admin, args))


async def run_users(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    try:
        return await (describe(admin, args) if args.describe else alter(admin, args))
    except AdminError as exc:
        print(f"Error: {exc.error}: {exc.message}", file=sys.stderr)
        return 1


async def describe(admin: AdminClient, args: argparse.Namespace) -> int:
    from protocol.admin import AdminError

    names = [args.entity_name] if args.entity_name is not None else None
    described = await admin.describe_user_scram_credentials(names)
    if args.output == "json":
        print_json(
            [
                {"user": user, "error": {"error": found.error, "message": found.message}}
                if isinstance(found, AdminError)
                else {
                    "user": user,
                    "credentials": [
                        {"mechanism": MECHANISM_BY_TYPE.get(m, str(m)), "iterations": i}
                        for m, i in found
                    ],
                }
                for user, found in described.items()
            ]
        )
        return 0
    for user, found in described.items():
        if isinstance(found, AdminError):
            print(
                f"Error retrieving SCRAM credential configs for user-principal '{user}': "
                f"{found.error}: {found.message}"
            )
            continue
        text = ", ".join(f"{MECHANISM_BY_TYPE.get(m, str(m))}=iterations={i}" for m, i in found)
        print(f"SCRAM credential configs for user-principal '{user}' are {text}")
    return 0


async def alter(admin: AdminClient, args: argparse.Namespace) -> int:
    """One request per credential: Kafka's controller answers DUPLICATE_RESOURCE to a
    request changing one user twice (ScramControlManager), which is what
    kafka-configs.sh sends for `SCRAM-SHA-256=[...],SCRAM-SHA-512=[...]`, so that form
    fails against Kafka 4.2; here each change is its own request, deletions first."""
    user = args.entity_name
    credentials, to_delete = scram_changes(args.add_config, args.delete_config)
    changes: list[tuple[list[ScramUpsertion], list[tuple[str, int]]]] = [
        ([], [(user, MECHANISMS[m][0])]) for m in to_delete
    ]
    changes += [(upsertions(user, {m: c}), []) for m, c in credentials.items()]
    for ups, dels in changes:
        results = await admin.alter_user_scram_credentials(ups, dels)
        failed = [exc for exc in results.values() if exc is not None]
        if failed:
            print(f"Error: {failed[0].error}: {failed[0].message}", file=sys.stderr)
            return 1
    if args.output == "json":
        print_json({"entity_type": "users", "entity_name": user, "altered": True})
    else:
        print(f"Completed updating config for user {user}.")
    return 0
