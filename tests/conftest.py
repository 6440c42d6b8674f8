"""Fixtures that start real services: a fresh Postgres database per test session, SQLite files, agents.

Postgres comes from AGENT_TEST_DATABASE_URL (default: the local server at
127.0.0.1:5432, user postgres). If it cannot be reached the session fails
with what to set; it is never skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import psycopg
import pytest

from agent import create_agent
from tests.helpers.databases import fresh_database
from tests.helpers.pgbouncer import pgbouncer

# How the tests are spread over pytest-xdist workers (modules that start a server stay together).
pytest_plugins = ["tests.helpers.scheduling"]

DEFAULT_SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

# pytest-xdist gives each worker the controller's terminal size as COLUMNS/LINES (80x24 without a
# terminal); the CLI then wraps at 80 where a pipe gets its wide PIPE_WIDTH, which the CLI tests check.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """The Postgres server the tests use (a maintenance database URL)."""
    url = os.environ.get("AGENT_TEST_DATABASE_URL", DEFAULT_SERVER_URL)
    try:
        with psycopg.connect(url, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"Postgres is not reachable at AGENT_TEST_DATABASE_URL={url!r}: {exc}. "
            "Start it (scripts/test.sh does when a local cluster exists) or set AGENT_TEST_DATABASE_URL.",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A fresh database for this test session, dropped afterwards."""
    with fresh_database(pg_server_url) as url:
        yield url


@pytest.fixture
def pgbouncer_url(pg_server_url: str) -> Iterator[str]:
    """A fresh empty database reached through a PgBouncer of its own in `pool_mode = transaction`
    (postgresql:// URL, same user); PgBouncer is stopped and the database dropped afterwards.
    Skips the test when PgBouncer is not installed (see tests/helpers/pgbouncer.py).
    The same database directly: `with_dbname(pg_server_url, dbname_of(pgbouncer_url))`."""
    with fresh_database(pg_server_url, prefix="tt_bouncer") as url, pgbouncer(url) as bounced:
        yield bounced


@pytest.fixture(params=["postgres", "sqlite"])
def backend_url(request, tmp_path) -> str:
    """Each test that uses it runs on real Postgres and on a SQLite file."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'checkpoints.sqlite'}"


@pytest.fixture
def make_agent() -> Iterator[Callable[..., object]]:
    """A factory for agents (offline model, tracing off unless asked) that closes them afterwards."""
    agents = []

    def make(url: str, **settings):
        settings.setdefault("model", "offline")
        settings.setdefault("tracing", False)
        agent = create_agent(url, **settings)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.close()


@pytest.fixture
def agent(backend_url, make_agent):
    """An offline agent on each backend."""
    return make_agent(backend_url)
