"""Scratch Postgres databases for benchmarks: created empty, dropped (WITH FORCE) whatever happens.

Benchmarks do not import `tests`, so this is their own small copy of the idea
of `tests/helpers/databases.py`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

#: The Postgres server used when neither `--database-url` nor `AGENT_TEST_DATABASE_URL` names one.
DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def database_url(server_url: str, dbname: str) -> str:
    """`server_url` (a postgresql:// URL) pointing at database `dbname`, query parameters kept.

    Raises:
        ValueError: `server_url` is not a postgresql:// or postgres:// URL.
    """
    parts = urlsplit(server_url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"The database URL must be a postgresql:// URL, got the scheme {parts.scheme!r}")
    return urlunsplit(parts._replace(path="/" + dbname))


def dbname_of(url: str) -> str:
    """The database name in a postgresql:// URL."""
    return urlsplit(url).path.lstrip("/")


@contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new empty database `<prefix>_<hex>` on the server of `server_url`; yields its URL.

    Dropped WITH (FORCE) on exit, also after an exception or Ctrl-C, so
    connections a benchmark left open (a killed server's) do not keep it.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield database_url(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def server_version(server_url: str) -> str:
    """The Postgres server's version, e.g. `16.4 (Debian 16.4-1)`."""
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
        return conn.execute("SHOW server_version").fetchone()[0]
