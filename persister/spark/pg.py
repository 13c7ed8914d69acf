"""The broker's logs in PostgreSQL (`--storage postgresql://...`), for the Spark jobs.

`spool serve --storage` keeps every log as rows of `spool_batches` (persister.pg_schema):
one row per append, the record batches as the broker wrote them (v2 bytes) under the
log's `log_id` and their base offset; `spool_logs` names the logs (`share-state`, `meta`,
`groups`, `topics/<topic>-<partition>`) with their log start and end offsets. The jobs
read the share-state log's rows on the executors through Spark's JDBC source
(`batch_frame`), with the PostgreSQL JDBC driver (`jdbc_jar`: Debian's
`libpostgresql-jdbc-java`, which `make test` installs, or the jar `SPOOL_JDBC_JAR`
names), and the small things on the driver with asyncpg (`fetch`).

`PgTarget` is the database: the URL as given plus the password, which comes from the
URL, the `--storage-password-file` file (its first line) or PGPASSWORD, as for
`spool serve`. Only `masked` (the URL with the password as ***) is ever printed; the
JDBC properties carry the password to the driver, and Spark redacts a `password`
option wherever it shows one (spark.redaction.regex).
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from persister.pg_url import is_postgres_url, mask_password

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JAR_ENV = "SPOOL_JDBC_JAR"
DEBIAN_JAR = "/usr/share/java/postgresql.jar"
DRIVER = "org.postgresql.Driver"
SHARE_STATE_LOG = "share-state"
TABLE = "spool_batches"
CONNECT_TIMEOUT_S = 10.0
# Rows per JDBC partition aimed at (share-state rows are small: one write each).
ROWS_PER_PARTITION = 20_000

T = TypeVar("T")


class StorageUnavailable(ValueError):
    """The database cannot be used: unreachable, not a spool database, or no JDBC jar."""


def jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver's jar: `SPOOL_JDBC_JAR`, else Debian's, else None."""
    named = os.environ.get(JAR_ENV)
    if named:
        return named if Path(named).is_file() else None
    return DEBIAN_JAR if Path(DEBIAN_JAR).is_file() else None


@dataclass(frozen=True, slots=True)
class PgTarget:
    """A spool database: its URL and password (see the module docstring)."""

    url: str = field(repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def masked(self) -> str:
        return mask_password(self.url)

    def __repr__(self) -> str:
        return f"PgTarget({self.masked})"

    def _parts(self) -> urllib.parse.SplitResult:
        return urllib.parse.urlsplit(self.url)

    def secret(self) -> str | None:
        """The password: the URL's, else the file's, else PGPASSWORD, else none."""
        parts = self._parts()
        if parts.password is not None:
            return urllib.parse.unquote(parts.password)
        if self.password is not None:
            return self.password
        return os.environ.get("PGPASSWORD")

    def jdbc_url(self) -> str:
        """jdbc:postgresql://host:port/db, with the URL's query parameters (sslmode, ...)
        but never its user or password (those go in the properties)."""
        parts = self._parts()
        host = parts.hostname or "localhost"
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        query = [
            (k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k not in ("user", "password")
        ]
        tail = f"?{urllib.parse.urlencode(query)}" if query else ""
        return f"jdbc:postgresql://{host}{port}{parts.path or '/'}{tail}"

    def jdbc_properties(self) -> dict[str, str]:
        parts = self._parts()
        user = urllib.parse.unquote(parts.username or "") or os.environ.get("PGUSER", "")
        props = {"driver": DRIVER, "user": user}
        secret = self.secret()
        if secret is not None:
            props["password"] = secret
        return props

    async def connect(self) -> Any:
        import asyncpg

        parts = self._parts()
        # The URL without its password: asyncpg takes it from `password` (never both).
        url = self.url
        if parts.password is not None:
            user = parts.username or ""
            host = parts.netloc.rpartition("@")[2]
            url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{host}"))
        try:
            return await asyncpg.connect(url, password=self.secret(), timeout=CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            raise StorageUnavailable(f"cannot reach {self.masked}: {exc}") from exc

    def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """`work(connection)` on a connection of its own, from synchronous code."""

        async def go() -> T:
            conn = await self.connect()
            try:
                return await work(conn)
            finally:
                await conn.close()

        return asyncio.run(go())


def target(url: str, password_file: Path | None = None) -> PgTarget:
    """The database of `--storage URL [--storage-password-file FILE]`; ValueError when
    the file cannot be read (what it says never includes the password)."""
    if not is_postgres_url(url):
        raise ValueError("--storage must be a postgresql:// URL")
    password = None
    if password_file is not None:
        try:
            lines = Path(password_file).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"--storage-password-file {password_file}: {exc.strerror}") from exc
        password = lines[0] if lines else ""
    return PgTarget(url, password)


@dataclass(frozen=True, slots=True)
class LogRow:
    """A log of `spool_logs`."""

    log_id: int
    name: str
    log_start_offset: int
    next_offset: int
    leader_epoch: int


async def _logs(conn: Any) -> dict[str, LogRow]:
    import asyncpg

    try:
        rows = await conn.fetch(
            "SELECT log_id, name, log_start_offset, next_offset, leader_epoch FROM spool_logs"
        )
    except asyncpg.UndefinedTableError as exc:
        raise StorageUnavailable("it has no spool_logs table: not a spool database") from exc
    return {
        r["name"]: LogRow(
            int(r["log_id"]),
            r["name"],
            int(r["log_start_offset"]),
            int(r["next_offset"]),
            int(r["leader_epoch"]),
        )
        for r in rows
    }


def logs(db: PgTarget) -> dict[str, LogRow]:
    """Every log of the database, by name."""
    return db.run(_logs)


def log_batches(db: PgTarget, name: str) -> list[bytes]:
    """The rows (batch bytes) of a small log (`meta`, `groups`), in offset order."""

    async def work(conn: Any) -> list[bytes]:
        rows = await conn.fetch(
            f"SELECT b.data FROM {TABLE} b JOIN spool_logs l USING (log_id) "
            "WHERE l.name = $1 ORDER BY b.base_offset",
            name,
        )
        return [bytes(r["data"]) for r in rows]

    return db.run(work)


def batch_frame(
    spark: SparkSession, db: PgTarget, log_id: int, first: int, bound: int, rows: int
) -> DataFrame:
    """The rows of log `log_id` with base offsets in [first, bound) through Spark's JDBC
    source: columns base_offset, last_offset, data (binary), plus md5 (hex of data),
    split by base offset over enough partitions for `rows` rows, each sorted."""
    query = (
        f"(SELECT base_offset, last_offset, data, md5(data) AS md5 FROM {TABLE} "
        f"WHERE log_id = {int(log_id)} AND base_offset >= {int(first)} "
        f"AND base_offset < {int(bound)}) AS share_state_rows"
    )
    cores = spark.sparkContext.defaultParallelism
    parts = max(1, min(4 * cores, -(-rows // ROWS_PER_PARTITION)))
    frame = spark.read.jdbc(
        db.jdbc_url(),
        query,
        column="base_offset",
        lowerBound=first,
        upperBound=max(bound, first + 1),
        numPartitions=parts,
        properties=db.jdbc_properties(),
    )
    return frame.sortWithinPartitions("base_offset")


def count_rows(db: PgTarget, log_id: int, bound: int) -> tuple[int, int | None]:
    """(rows, first base offset) of log `log_id` below `bound`."""

    async def work(conn: Any) -> tuple[int, int | None]:
        row = await conn.fetchrow(
            f"SELECT count(*) AS n, min(base_offset) AS first FROM {TABLE} "
            "WHERE log_id = $1 AND base_offset < $2",
            log_id,
            bound,
        )
        return int(row["n"]), None if row["first"] is None else int(row["first"])

    return db.run(work)


# ------------------------------------------------------------------ command line


def add_source_arguments(parser: Any) -> None:
    """`--data-dir DIR` or `--storage URL [--storage-password-file FILE]`, one required."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", type=Path, help="the broker's data dir")
    source.add_argument(
        "--storage",
        metavar="URL",
        help="the broker's database instead (spool serve --storage postgresql://...); "
        "the password from the URL, --storage-password-file or PGPASSWORD",
    )
    parser.add_argument(
        "--storage-password-file",
        type=Path,
        help="a file holding the database's password (its first line)",
    )


def source_target(args: Any) -> PgTarget:
    """The database `args` name; StorageUnavailable (a usage error) when it cannot be
    used: not a postgresql:// URL, an unreadable password file, no JDBC driver."""
    try:
        db = target(args.storage, args.storage_password_file)
    except ValueError as exc:
        raise StorageUnavailable(str(exc)) from exc
    if jdbc_jar() is None:
        raise StorageUnavailable(
            f"no PostgreSQL JDBC driver: install Debian's libpostgresql-jdbc-java "
            f"({DEBIAN_JAR}; `make test` installs it) or set {JAR_ENV} to its jar"
        )
    return db
