"""`spool transactions`: the transactions of a cluster, as kafka-transactions.sh lists them.

    spool transactions --bootstrap-server HOST:PORT list [--duration-filter MS]
                       [--transactional-id-pattern REGEX] [--command-config FILE]
                       [--output json]

(`--list` is the same as `list`.) Every broker answers ListTransactions with the
transactions it coordinates, those of the transactions log it leads, and nothing when it
leads none; so, as Kafka's Admin.listTransactions, the tool asks every live broker
(from Metadata) and shows each transaction with the broker that coordinates it, as
kafka-transactions.sh's `list` does:

    TransactionalId Coordinator ProducerId TransactionState
    orders-tx-1     2           4000       Ongoing

`--duration-filter MS` keeps transactions running longer than MS (ListTransactions v1,
KIP-994), `--transactional-id-pattern` those whose whole id matches the regular
expression (v2, KIP-1152). A broker still loading its transactions log is asked again
until the timeout.
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from broker.tools.common import (
    UsageError,
    add_connection_flags,
    print_json,
    run_admin,
    table,
    usage_checked,
)

if TYPE_CHECKING:
    from protocol.admin import AdminClient

HEADERS = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "transactions",
        help="list the transactions of every broker (kafka-transactions.sh)",
        description="List the transactions the brokers coordinate, every broker asked.",
    )
    add_connection_flags(p, timeout=True)
    p.add_argument(
        "command",
        nargs="?",
        choices=("list",),
        help="list: the transactions of every broker, with their coordinator",
    )
    p.add_argument("--list", action="store_true", help="the same as the list command")
    p.add_argument(
        "--duration-filter",
        type=int,
        metavar="MS",
        help="only transactions running longer than MS milliseconds",
    )
    p.add_argument(
        "--transactional-id-pattern",
        metavar="REGEX",
        help="only transactions whose whole transactional id matches REGEX",
    )
    p.set_defaults(run=usage_checked(validate, run), tool_parser=p)


def validate(args: argparse.Namespace) -> None:
    if args.command is None and not args.list:
        raise UsageError("say what to do: list (or --list)")
    if args.transactional_id_pattern is not None:
        try:
            re.compile(args.transactional_id_pattern)
        except re.error as exc:
            raise UsageError(
                f"--transactional-id-pattern {args.transactional_id_pattern!r} is not a "
                f"valid regular expression: {exc}"
            ) from None


def run(args: argparse.Namespace) -> int:
    async def body(admin: AdminClient) -> int:
        listed = await admin.list_transactions(
            duration_ms=-1 if args.duration_filter is None else args.duration_filter,
            pattern=args.transactional_id_pattern,
        )
        rows = [
            {
                "transactional_id": t.transactional_id,
                "coordinator": t.coordinator,
                "producer_id": t.producer_id,
                "state": t.state,
            }
            for t in sorted(listed, key=lambda t: (t.coordinator, t.transactional_id))
        ]
        if args.output == "json":
            print_json(rows)
        else:
            print(
                table(
                    HEADERS,
                    [
                        (r["transactional_id"], r["coordinator"], r["producer_id"], r["state"])
                        for r in rows
                    ],
                )
            )
        return 0

    return run_admin(args, body)
