"""A PostgreSQL storage URL (`postgresql://user:password@host:port/db`), as the broker
(persister.pg_storage), `spool migrate` (persister.pg_migrate) and the Spark jobs
(persister.spark.pg) take it: which strings are one, and the form logs and messages
may show (the password as ***).
"""

from __future__ import annotations

import urllib.parse


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def mask_password(url: str) -> str:
    """`url` with its password, if any, replaced by ***: what logs may show."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = urllib.parse.quote(parts.username or "", safe="")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
