"""Fixtures only the storage tests use: a fault-injection proxy in front of the test Postgres server, and a
database of a test's own."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.helpers.databases import fresh_database
from tests.helpers.tcp_proxy import Proxy, tcp_proxy


@pytest.fixture
def pg_proxy(pg_server_url: str) -> Iterator[Proxy]:
    """A TCP proxy process in front of the test Postgres server, forwarding; `pg_proxy.url_for(url)`
    routes any database URL of that server through it, and `stop()`, `start()`, `blackhole()`,
    `cut()` inject faults (see tests/helpers/tcp_proxy.py). Stopped afterwards."""
    info = psycopg.conninfo.conninfo_to_dict(pg_server_url)
    with tcp_proxy(info.get("host") or "127.0.0.1", int(info.get("port") or 5432)) as proxy:
        yield proxy


@pytest.fixture
def own_db(pg_server_url: str) -> Iterator[str]:
    """A fresh database of the test's own (dropped afterwards), so that killing or silencing its connections
    touches no other test."""
    with fresh_database(pg_server_url) as url:
        yield url
