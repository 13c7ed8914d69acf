"""`spool migrate`: copy a stopped broker's data directory into an empty PostgreSQL
database, for `spool serve --storage postgresql://...` (persister.pg_migrate):

    spool migrate --from data --to postgresql://spool@db.example:5432/spool

The password comes from the URL, `--password-file` (its first line) or PGPASSWORD, and
is never printed. An interrupted migrate is resumed by running it again; `--restart`
drops an unfinished copy whose data dir changed since and copies again.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import structlog


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "migrate",
        help="copy a stopped broker's data directory into an empty PostgreSQL database",
        description="Copy a stopped broker's data directory (topics with their ids and "
        "offsets, share state, groups, configs, credentials, ACLs, transactions) into an "
        "empty PostgreSQL database, for spool serve --storage.",
    )
    p.add_argument(
        "--from",
        dest="source",
        type=Path,
        required=True,
        metavar="DATA_DIR",
        help="the stopped broker's --data-dir",
    )
    p.add_argument(
        "--to",
        dest="url",
        required=True,
        metavar="URL",
        help="the database: postgresql://user@host:port/db",
    )
    p.add_argument(
        "--password-file",
        "--storage-password-file",
        dest="password_file",
        type=Path,
        default=None,
        metavar="FILE",
        help="a file whose first line is the database password (else the URL's, or PGPASSWORD)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="drop an unfinished migrate's copy in the database (one no broker has used) "
        "and copy again",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="print only the summary and errors")
    p.set_defaults(run=run, tool_parser=p)


def run(args: argparse.Namespace) -> int:
    from persister.dirlock import DataDirInUse
    from persister.pg_migrate import MigrateError, Migration
    from persister.pg_url import is_postgres_url

    if not is_postgres_url(args.url):
        print("spool migrate: --to must be a postgresql:// URL", file=sys.stderr)
        return 2
    password = None
    if args.password_file is not None:
        try:
            lines = args.password_file.read_text().splitlines()
        except OSError as exc:
            print(f"spool migrate: --password-file: {exc.strerror}", file=sys.stderr)
            return 2
        password = lines[0] if lines else ""
    # The tool's own lines, not the logs' info lines (as `spool format`).
    previous = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    migration = Migration(
        args.source, args.url, password=password, restart=args.restart, out=sys.stdout
    )
    migration.progress = not args.quiet
    try:
        totals = asyncio.run(migration.run())
    except DataDirInUse as exc:
        print(f"spool migrate: {exc}", file=sys.stderr)
        return 1
    except (MigrateError, OSError) as exc:
        print(f"spool migrate: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "spool migrate: interrupted; what was committed stays, and running the same "
            "migrate again resumes",
            file=sys.stderr,
        )
        return 130
    finally:
        structlog.configure(wrapper_class=previous)
    del totals  # Migration printed the summary
    return 0
