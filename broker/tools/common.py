"""What the admin tools share: connection flags, usage errors, tables, JSON, and running
an admin call with Kafka's error name and message on stderr when it fails."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from protocol.admin import AdminClient

DEFAULT_TIMEOUT_MS = 30_000
# --command-config keys the admin client uses; other keys are reported and ignored.
COMMAND_CONFIG_KEYS = ("bootstrap.servers", "client.id", "default.api.timeout.ms")


class UsageError(Exception):
    """Bad arguments: printed with the usage and exit code 2, as argparse does."""


def add_connection_flags(parser: argparse.ArgumentParser, timeout: bool = False) -> None:
    parser.add_argument(
        "--bootstrap-server",
        required=True,
        metavar="HOST:PORT[,HOST:PORT]",
        help="REQUIRED: the server(s) to connect to",
    )
    parser.add_argument(
        "--command-config",
        type=Path,
        metavar="FILE",
        help=f"properties file of admin client configs ({', '.join(COMMAND_CONFIG_KEYS)})",
    )
    if timeout:
        parser.add_argument(
            "--timeout",
            type=int,
            default=DEFAULT_TIMEOUT_MS,
            metavar="MS",
            help=f"how long to wait for the brokers, in ms (default {DEFAULT_TIMEOUT_MS})",
        )
    parser.add_argument(
        "--output",
        choices=("table", "json"),
        default="table",
        help="table for people (default) or json for scripts",
    )


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file: `key=value` or `key: value` lines, # and ! comments."""
    props: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep < 0:
            raise UsageError(f"{path}: line {raw!r} is not key=value")
        props[line[:sep].strip()] = line[sep + 1 :].strip()
    return props


def connection_settings(args: argparse.Namespace) -> tuple[str, float, str]:
    """bootstrap, timeout (s) and client id from the flags and --command-config."""
    props: dict[str, str] = {}
    if args.command_config is not None:
        try:
            props = read_properties(args.command_config)
        except OSError as exc:
            raise UsageError(f"cannot read --command-config: {exc}") from None
        for key in sorted(set(props) - set(COMMAND_CONFIG_KEYS)):
            print(f"Warn: admin config {key} is not used by spool and was ignored", file=sys.stderr)
    timeout_ms = getattr(args, "timeout", None)
    if timeout_ms is None:
        try:
            timeout_ms = int(props.get("default.api.timeout.ms", DEFAULT_TIMEOUT_MS))
        except ValueError:
            raise UsageError("default.api.timeout.ms must be a number of ms") from None
    if timeout_ms <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout_ms}")
    return args.bootstrap_server, timeout_ms / 1000, props.get("client.id", "spool-admin")


def run_admin(args: argparse.Namespace, body: Callable[[AdminClient], Awaitable[int]]) -> int:
    """Connect, run `body(admin)`, close. A usage error exits 2 (with the usage); an
    AdminError prints `Error: NAME: message` on stderr and exits 1."""
    from protocol.admin import AdminClient, AdminError

    parser: argparse.ArgumentParser = args.tool_parser

    async def main() -> int:
        bootstrap, timeout_s, client_id = connection_settings(args)
        async with await AdminClient.connect(bootstrap, timeout_s, client_id) as admin:
            return await body(admin)

    try:
        return asyncio.run(main())
    except UsageError as exc:
        parser.error(str(exc))
    except ValueError as exc:  # a malformed --bootstrap-server
        parser.error(str(exc))
    except AdminError as exc:
        fail(exc.error, exc.message)
        return 1


def fail(error: str, message: str) -> None:
    print(f"Error: {error}: {message}", file=sys.stderr)


def usage_checked(
    validate: Callable[[argparse.Namespace], None], run: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """`run` after `validate`: a UsageError from it is argparse's usage error (exit 2)."""

    def checked(args: argparse.Namespace) -> int:
        try:
            validate(args)
        except UsageError as exc:
            args.tool_parser.error(str(exc))
        return run(args)

    return checked


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], min_widths: Sequence[int] = ()
) -> str:
    """Left-aligned columns separated by a space, each as wide as its widest cell (and at
    least `min_widths`, Kafka's widths); the last column is not padded. `None` is '-'."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [
        max([len(h), min_widths[i] if i < len(min_widths) else 0, *(len(r[i]) for r in cells)])
        for i, h in enumerate(headers)
    ]
    lines = []
    for row in [list(headers), *cells]:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        lines.append(" ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))
