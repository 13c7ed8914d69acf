"""`spool format`: prepare a data directory before the broker first starts, as Kafka 4.2's
`kafka-storage.sh format` does, chiefly to create SCRAM credentials before any client
connects (KIP-554's bootstrap credentials):

    spool format --data-dir data --add-scram 'SCRAM-SHA-512=[name=admin,password=admin-secret]'

`--add-scram` is repeatable and takes Kafka's ScramParser forms: `name` and `password`,
or `salt` and `saltedpassword` (base64); `iterations` defaults to 4096 and must lie in
[4096, 16384]. `--cluster-id` (`-t`) sets the cluster id (Kafka requires it; spool makes
one when it is left out, as a broker does at its first start). A directory a broker has
already used, or that was formatted, is refused unless `--ignore-formatted`, which
leaves it as it is (Kafka's rule). The directory is locked as a broker locks it, so
formatting the data directory of a running broker fails. Passwords are never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import structlog

from coordinator.scram import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    MIN_SALT_BYTES,
    ScramCredential,
    credential_from_salted,
    salted_password,
)

SALT_BYTES = 32


class FormatError(Exception):
    """Kafka's FormatterException: printed, exit 1."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "format",
        help="prepare a data directory, with SCRAM credentials (kafka-storage.sh format)",
        description="Format a data directory before the broker's first start.",
    )
    p.add_argument(
        "--data-dir", type=Path, default=Path("data"), help="the broker's --data-dir (./data)"
    )
    p.add_argument("--cluster-id", "-t", help="the cluster id (default: a new random one)")
    p.add_argument(
        "--add-scram",
        "-S",
        action="append",
        default=[],
        metavar="'SCRAM-SHA-256=[name=alice,password=alice-secret]'",
        help="a SCRAM credential to create (repeatable)",
    )
    p.add_argument(
        "--ignore-formatted",
        "-g",
        action="store_true",
        help="leave an already formatted directory as it is instead of failing",
    )
    p.set_defaults(run=run, tool_parser=p)


def parse_add_scram(text: str) -> tuple[str, str, ScramCredential]:
    """(user, mechanism, credential) of one --add-scram value (Kafka's ScramParser)."""
    text = text.strip()
    mechanism, sep, config = text.partition("=")
    if not sep:
        raise FormatError("Failed to find equals sign in SCRAM argument")
    if mechanism not in MECHANISMS:
        raise FormatError(f"The add-scram mechanism {mechanism} is not supported.")
    if not config.startswith("["):
        raise FormatError("Expected configuration string to start with [")
    if not config.endswith("]"):
        raise FormatError("Expected configuration string to end with ]")
    components: dict[str, str] = {}
    for component in config[1:-1].split(","):
        key, eq, value = component.partition("=")
        if not eq:
            raise FormatError(f"No equals sign found in SCRAM component: {key.split(' ')[0]}")
        if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
            value = value[1:-1]
        components[key.strip()] = value
    user = components.pop("name", None)
    if user is None:
        raise FormatError("You must supply 'name' to add-scram")
    salt = _b64(components.pop("salt", None), "salt")
    iterations_text = components.pop("iterations", None)
    try:
        iterations = DEFAULT_ITERATIONS if iterations_text is None else int(iterations_text)
    except ValueError:
        raise FormatError(f"Failed to parse iterations count: {iterations_text}") from None
    password = components.pop("password", None)
    salted = _b64(components.pop("saltedpassword", None), "saltedPassword")
    if password is None and salted is None:
        raise FormatError("You must supply one of 'password' or 'saltedpassword' to add-scram")
    if password is None and salt is None:
        raise FormatError("You must supply 'salt' with 'saltedpassword' to add-scram")
    if components:
        raise FormatError(f"Unknown SCRAM configurations: {', '.join(sorted(components))}")
    if iterations < MIN_ITERATIONS:
        raise FormatError(
            f"The 'iterations' value must be >= {MIN_ITERATIONS} for add-scram using {mechanism}"
        )
    if iterations > MAX_ITERATIONS:
        raise FormatError(
            f"The 'iterations' value must be <= {MAX_ITERATIONS} for add-scram using {mechanism}"
        )
    if salt is not None and len(salt) < MIN_SALT_BYTES:
        raise FormatError(
            f"The 'salt' must be at least {MIN_SALT_BYTES} bytes for add-scram (a SCRAM "
            "login cannot use a shorter one)"
        )
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    if salted is None:
        assert password is not None
        salted = salted_password(mechanism, password, salt, iterations)
    return user, mechanism, credential_from_salted(mechanism, salt, salted, iterations)


def _b64(value: str | None, what: str) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise FormatError(f"Failed to decode given {what}") from None


def check_cluster_id(text: str) -> str:
    """Kafka's cluster ids are a UUID's 16 bytes in url-safe base64 without padding."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 16 or len(text) != 22:
        raise FormatError(
            f"Cluster ID string {text} does not appear to be a valid UUID: expected 22 "
            "characters of url-safe base64 (kafka-storage.sh random-uuid makes one)"
        )
    return text


def run(args: argparse.Namespace) -> int:
    from persister.dirlock import DataDirInUse

    # The tool's own lines, not the metadata log's info lines: warnings and up only,
    # the rest of the logging setup left as it is (and restored after).
    previous = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        credentials = [parse_add_scram(text) for text in args.add_scram]
        cluster_id = check_cluster_id(args.cluster_id) if args.cluster_id else None
        return asyncio.run(format_dir(args.data_dir, cluster_id, credentials, args))
    except (FormatError, DataDirInUse) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        structlog.configure(wrapper_class=previous)


async def format_dir(
    data_dir: Path,
    cluster_id: str | None,
    credentials: list[tuple[str, str, ScramCredential]],
    args: argparse.Namespace,
) -> int:
    from coordinator.metadata import MetadataStore
    from persister.commit import GroupCommit
    from persister.dirlock import DataDirLock

    data_dir.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(data_dir)
    lock.acquire()
    commit = GroupCommit()
    commit.start()
    try:
        store = MetadataStore(data_dir / "meta", commit)
        try:
            if store.state.cluster_id is not None:
                if args.ignore_formatted:
                    print("All of the log directories are already formatted.")
                    return 0
                raise FormatError(
                    f"Log directory {data_dir} is already formatted. Use --ignore-formatted "
                    "to ignore this directory and format the others."
                )
            chosen = cluster_id or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")

            def op() -> tuple[list[dict[str, Any]], None]:
                return [{"type": "cluster", "cluster_id": chosen}], None

            await store.run(op)
            if credentials:
                await store.put_scram_credentials(credentials)
        finally:
            store.close()
    finally:
        await commit.stop()
        lock.release()
    users = sorted({f"{user} ({mechanism})" for user, mechanism, _ in credentials})
    print(f"Formatting data directory {data_dir} with cluster id {chosen}.")
    if users:
        print(f"Added SCRAM credentials: {', '.join(users)}.")
    return 0
