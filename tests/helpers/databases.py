"""Scratch Postgres databases for tests: URLs that point at another database, and a fresh one dropped afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql


def with_dbname(url: str, dbname: str) -> str:
    """`url` pointing at database `dbname`, as a postgresql:// URL."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    user = info.get("user", "postgres")
    auth = user + (":" + info["password"] if info.get("password") else "")
    return f"postgresql://{auth}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{dbname}"


def dbname_of(url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(url)["dbname"]


@contextmanager
def fresh_database(server_url: str, prefix: str = "tt_test") -> Iterator[str]:
    """An empty database `<prefix>_<pid>_<hex>` on the server of `server_url` (a maintenance URL), as a
    postgresql:// URL; dropped (WITH FORCE) afterwards."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_dbname(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def owned_by_plain_role(url: str) -> Iterator[str]:
    """`url`'s database handed to a new login role that is not a superuser (it may create tables there, not
    untrusted extensions such as pgvector); yields the URL as that role. On exit the database goes back to
    `url`'s user and the role is dropped (close the role's connections first)."""
    role = f"tt_plain_{uuid.uuid4().hex[:8]}"
    dbname = dbname_of(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(dbname), sql.Identifier(role)))
    info = psycopg.conninfo.conninfo_to_dict(url)
    try:
        yield f"postgresql://{role}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{dbname}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            owner = conn.execute("SELECT current_user").fetchone()[0]
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO {}").format(sql.Identifier(role), sql.Identifier(owner)))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
