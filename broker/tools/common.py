"""What the admin tools share: connection flags, usage errors, tables, JSON, and running
an admin call with Kafka's error name and message on stderr when it fails.

`--command-config FILE` is a properties file of Kafka client configs, as kafka-topics.sh
and the other Kafka tools take it. Besides bootstrap.servers, client.id and
default.api.timeout.ms, it secures the connection with the names librdkafka and the
Java client use: security.protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL);
sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with sasl.username and
sasl.password (librdkafka) or sasl.jaas.config naming PlainLoginModule or
ScramLoginModule with username and password (Java); ssl.ca.location or
ssl.truststore.location (PEM CA certificates), ssl.certificate.location,
ssl.key.location and ssl.key.password (or ssl.keystore.location: certificate and key in
one PEM file, ssl.keystore.password or ssl.key.password for the key) for a client
certificate, and ssl.endpoint.identification.algorithm (https, the default, or none).
Keys spool does not use are named in a warning, never their values.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.sasl import JaasError, parse_jaas
from protocol.client import SASL_MECHANISMS, SECURITY_PROTOCOLS, ClientSecurity

if TYPE_CHECKING:
    from protocol.admin import AdminClient

DEFAULT_TIMEOUT_MS = 30_000
# --command-config keys the admin client uses; other keys are reported and ignored.
COMMAND_CONFIG_KEYS = (
    "bootstrap.servers",
    "client.id",
    "default.api.timeout.ms",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",  # librdkafka's older name
    "sasl.username",
    "sasl.password",
    "sasl.jaas.config",
    "ssl.ca.location",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.truststore.password",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
)
# The login modules whose username and password options a client's JAAS entry gives.
LOGIN_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)


class UsageError(Exception):
    """Bad arguments: printed with the usage and exit code 2, as argparse does."""


def add_connection_flags(
    parser: argparse.ArgumentParser, timeout: bool = False, required: bool = True
) -> None:
    """The connection flags; with `required=False` the tool checks --bootstrap-server
    itself (an action that needs no broker, such as --validate-regex)."""
    parser.add_argument(
        "--bootstrap-server",
        required=required,
        metavar="HOST:PORT[,HOST:PORT]",
        help="REQUIRED: the server(s) to connect to"
        + ("" if required else " (for every action but --validate-regex)"),
    )
    parser.add_argument(
        "--command-config",
        type=Path,
        metavar="FILE",
        help="properties file of Kafka client configs: client.id, default.api.timeout.ms, "
        "security.protocol, sasl.mechanism, sasl.username, sasl.password or sasl.jaas.config, "
        "ssl.ca.location, ssl.certificate.location, ssl.key.location, ssl.key.password, "
        "ssl.endpoint.identification.algorithm",
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
    """A Java properties file, read as java.util.Properties.load reads it: `#` and `!`
    comment lines; a line ending in an odd number of backslashes goes on on the next
    (the multi-line sasl.jaas.config of Kafka's documentation), whose leading blanks are
    dropped; the key ends at the first unescaped `=`, `:` or blank (`key value` is a
    pair too) and the value is the rest, blanks around the separator dropped; escapes
    `\\t`, `\\n`, `\\r`, `\\f`, `\\uXXXX`, and `\\` before any other character for that
    character. A line with no value gives the key an empty one, as in Java; unlike
    Java, blanks at the end of a value are dropped (unless escaped)."""
    props: dict[str, str] = {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _continues(line):  # a backslash at the end of the file
            line = line[:-1]
        key, value = _split_property(line)
        props[_unescape(key)] = _unescape(value)
    return props


def _continues(line: str) -> bool:
    """An odd number of trailing backslashes: the logical line goes on."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_property(line: str) -> tuple[str, str]:
    """(key, value) of a logical line, both still escaped."""
    end, escaped = len(line), False
    for pos, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in "=: \t\f":
            end = pos
            break
    rest = line[end:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    # Java keeps trailing blanks; a stray one after a password would only fail the login.
    stripped = rest.rstrip(" \t\f")
    if stripped.endswith("\\") and _continues(stripped):
        stripped += rest[len(stripped)]  # an escaped blank is part of the value
    return line[:end], stripped


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    pos = 0
    while pos < len(text):
        ch = text[pos]
        pos += 1
        if ch != "\\" or pos == len(text):
            out.append(ch)
            continue
        nxt = text[pos]
        pos += 1
        if nxt == "u" and len(text) - pos >= 4:
            try:
                out.append(chr(int(text[pos : pos + 4], 16)))
                pos += 4
                continue
            except ValueError:
                pass
        out.append(_ESCAPES.get(nxt, nxt))
    return "".join(out)


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    bootstrap: str
    timeout_s: float
    client_id: str
    security: ClientSecurity


def security_settings(props: dict[str, str]) -> ClientSecurity:
    """The connection's security from Kafka client properties; UsageError naming the
    key (never a password) for a value that cannot work."""
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise UsageError(
            f"security.protocol {protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms"))
    mechanism = mechanism.strip().upper() if mechanism else None
    username, password = props.get("sasl.username"), props.get("sasl.password")
    jaas_text = props.get("sasl.jaas.config")
    if jaas_text:
        try:
            entry = parse_jaas(jaas_text)
        except JaasError as exc:
            raise UsageError(f"sasl.jaas.config cannot be parsed: {exc}") from None
        if entry.login_module not in LOGIN_MODULES:
            raise UsageError(
                f"sasl.jaas.config: login module {entry.login_module} is not supported: "
                f"use {' or '.join(LOGIN_MODULES)}"
            )
        if "username" not in entry.options or "password" not in entry.options:
            raise UsageError('sasl.jaas.config needs username="..." and password="..."')
        if username is not None and username != entry.options["username"]:
            raise UsageError("sasl.username and the username in sasl.jaas.config differ")
        username, password = entry.options["username"], entry.options["password"]
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        if mechanism is None:
            raise UsageError(
                f"security.protocol={protocol} needs sasl.mechanism (Kafka's default, GSSAPI, "
                f"is not supported): one of {', '.join(SASL_MECHANISMS)}"
            )
        if mechanism not in SASL_MECHANISMS:
            raise UsageError(
                f"sasl.mechanism {mechanism} is not supported: use one of "
                f"{', '.join(SASL_MECHANISMS)}"
            )
        if not username or password is None:
            raise UsageError(
                f"sasl.mechanism={mechanism} needs sasl.username and sasl.password "
                "(or sasl.jaas.config with username and password)"
            )
    for key in ("ssl.truststore.type", "ssl.keystore.type"):
        if props.get(key, "PEM").strip().upper() != "PEM":
            raise UsageError(
                f"{key}={props[key]}: spool's tools read PEM files only (convert the store "
                "with keytool and openssl, or give ssl.ca.location)"
            )
    ca = props.get("ssl.ca.location") or props.get("ssl.truststore.location")
    cert = props.get("ssl.certificate.location") or props.get("ssl.keystore.location")
    key_file = props.get("ssl.key.location")
    keystore = props.get("ssl.keystore.location")
    if key_file is None and keystore is not None and cert == keystore:
        key_file = keystore  # the Java client's PEM key store: chain and key in one file
    key_password = props.get("ssl.key.password", props.get("ssl.keystore.password"))
    algorithm = props.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm == "":
        algorithm = "none"  # the Java client's way to turn the check off
    if algorithm not in ("https", "none"):
        raise UsageError(
            f"ssl.endpoint.identification.algorithm {algorithm!r}: expected https or none"
        )
    return ClientSecurity(
        protocol=protocol,
        mechanism=mechanism,
        username=username,
        password=password,
        ssl_ca_location=ca,
        ssl_certificate_location=cert,
        ssl_key_location=key_file,
        ssl_key_password=key_password,
        ssl_endpoint_identification=algorithm,
    )


def connection_settings(args: argparse.Namespace) -> ConnectionSettings:
    """bootstrap, timeout (s), client id and security from the flags and
    --command-config."""
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
    return ConnectionSettings(
        args.bootstrap_server,
        timeout_ms / 1000,
        props.get("client.id", "spool-admin"),
        security_settings(props),
    )


def run_admin(args: argparse.Namespace, body: Callable[[AdminClient], Awaitable[int]]) -> int:
    """Connect, run `body(admin)`, close. A usage error exits 2 (with the usage); an
    AdminError prints `Error: NAME: message` on stderr and exits 1."""
    from protocol.admin import AdminClient, AdminError

    parser: argparse.ArgumentParser = args.tool_parser

    async def main() -> int:
        settings = connection_settings(args)
        async with await AdminClient.connect(
            settings.bootstrap, settings.timeout_s, settings.client_id, settings.security
        ) as admin:
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


def parse_add_config(text: str) -> dict[str, str]:
    """`k=v,k2=[a,b]` (ConfigCommand.parseConfigsToBeAdded): commas inside brackets belong
    to the value, and the brackets are dropped."""
    items: list[str] = []
    depth, start = 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    out: dict[str, str] = {}
    for item in items:
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or depth != 0:
            raise UsageError(
                'Invalid entity config: all configs to be added must be in the format "key=val" '
                'or "key=[val1,val2]".'
            )
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        out[key.strip()] = value
    return out


def parse_delete_config(text: str | None) -> list[str]:
    return [k.strip() for k in (text or "").split(",") if k.strip()]
