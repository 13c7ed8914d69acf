"""Free TCP ports for the servers the tests start, reserved among test processes.

A port found by binding port 0 and closing the socket is free at that moment only: the
broker or PostgreSQL server meant to listen on it starts a moment later, and a broker
that restarts listens on it again after a gap. Meanwhile another test process (a
pytest-xdist worker of the same run, or another run on the same machine) finding a port
the same way could be handed the same one, and two servers would fight over it.

So `free_port()` also reserves the port: an exclusive `flock` on a file named for it in
a directory every test process uses (under the system's temp dir), held by this
process. A port whose lock another process holds (or another reservation of this
process: flock locks belong to one open file) is passed over. The lock is held until
this process has reserved `RESERVED_MAX` newer ports (or exits, when the system drops
its locks), enough for the brokers of a module's tests without keeping a file open for
every port of the run.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import socket
import tempfile
from pathlib import Path

RESERVED_MAX = 128
ATTEMPTS = 1000
LOCK_DIR = Path(tempfile.gettempdir()) / "spool-test-ports"

# Open lock files of this process's newest reservations, oldest first.
_held: collections.deque[int] = collections.deque()


def _reserve(port: int) -> bool:
    """Lock port's file; False when another reservation holds it. Where no lock file
    can be made (a directory of another user's), the port goes unreserved."""
    try:
        if not LOCK_DIR.is_dir():
            LOCK_DIR.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                LOCK_DIR.chmod(0o1777)  # shared by every user's test runs, like /tmp
        fd = os.open(LOCK_DIR / str(port), os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held.append(fd)
    while len(_held) > RESERVED_MAX:
        with contextlib.suppress(OSError):
            os.close(_held.popleft())
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on right now, reserved for this process."""
    for _ in range(ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if _reserve(port):
            return port
    raise RuntimeError(f"no free port on {host} after {ATTEMPTS} tries")
