"""A throwaway PostgreSQL server for the tests that need one.

`PostgresServer` runs Debian's PostgreSQL (15, from the `postgresql` package that
`make test` installs when it is missing) in a temporary directory on a free loopback
port, with a Unix socket in the same directory and `fsync` on, as a user's server would
have it. initdb refuses to run as root, so when the tests run as root the cluster is
made and run by the `postgres` user. The tests never touch a server they did not
start: `stop()` (or leaving the `with` block) shuts this one down and removes its data.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.ports import free_port

# Debian installs each major version under /usr/lib/postgresql/<major>/bin.
_DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
START_TIMEOUT_S = 60
USER = "spool"
DATABASE = "spool"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here (`make test` installs Debian's package)."""


def find_bindir() -> Path:
    """The newest PostgreSQL server bindir (initdb, pg_ctl, postgres)."""
    override = os.environ.get("SPOOL_PG_BINDIR")
    candidates = [override] if override else []
    candidates += sorted(
        glob.glob(_DEBIAN_BINDIRS), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise PostgresUnavailable(
        "no PostgreSQL server found (looked in /usr/lib/postgresql/*/bin and PATH): "
        "`make test` installs Debian's postgresql package, or set SPOOL_PG_BINDIR"
    )


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory; `dsn` reaches its database."""

    def __init__(self, root: Path | None = None) -> None:
        self.bindir = find_bindir()
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="spool-pg-")) if root is None else root
        self.data = self.root / "data"
        self.socket_dir = self.root
        self.log_path = self.root / "postgres.log"
        self.port = free_port()
        self.host = "127.0.0.1"
        self._as_postgres = os.geteuid() == 0
        self.running = False

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@{self.host}:{self.port}/{DATABASE}"

    def _run(self, args: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        if self._as_postgres:
            args = ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(args, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload,no-any-return]

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        if not self.data.exists():
            self._run(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    USER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            )
        options = (
            f"-c port={self.port} -c listen_addresses={self.host} "
            f"-c unix_socket_directories={self.socket_dir} -c fsync=on "
            "-c synchronous_commit=on -c max_connections=200"
        )
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log_path),
                "-o",
                options,
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "start",
            ]
        )
        self.running = True
        self._ensure_database()

    def _ensure_database(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self._run(
                    [
                        str(self.bindir / "createdb"),
                        "-h",
                        self.host,
                        "-p",
                        str(self.port),
                        "-U",
                        USER,
                        DATABASE,
                    ]
                )
                return
            except subprocess.CalledProcessError as exc:
                if b"already exists" in exc.stderr:
                    return
                if time.monotonic() > deadline:
                    raise

    def stop(self, mode: str = "fast") -> None:
        """Shut the server down (`fast`: roll back open transactions; `immediate`: as
        after a crash). The data stays until `cleanup`."""
        if not self.running:
            return
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])
        self.running = False

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 50) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
