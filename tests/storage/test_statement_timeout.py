"""`statement_timeout_ms`: no database statement runs (or waits for a lock) past it; it ends in a clear, retryable
`StorageUnavailable` with nothing written, never a hang.

Postgres: the connection option `-c statement_timeout=…` on every connection of the storage (pooled
and not), kept beside the URL's own `options`; `pg_sleep` through the storage's connections, and a
commit waiting for a row lock. SQLite: a query running too long is interrupted, and a write waiting
for another connection's lock gives up.
"""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from agent import StorageUnavailable
from agent.config import AgentSettings
from agent.error_answers import http_status
from agent.storage import open_storage
from tests.helpers.reliability import HANG_TIMEOUT, gated_model, head_messages, thread_rows, user_texts
from tests.helpers.scenario import outputs, request, say

LIMIT_MS = 300


@pytest.fixture
def storages():
    """A factory for set-up storages (offline settings plus the given ones), closed afterwards."""
    opened = []

    def make(url: str, **settings):
        storage = open_storage(url, AgentSettings(model="offline", **settings))
        opened.append(storage)
        storage.setup()
        return storage

    yield make
    for storage in opened:
        storage.close()


def show_timeout(conn: psycopg.Connection) -> str:
    return conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"]


def test_every_postgres_connection_of_the_storage_carries_the_timeout(pg_url, storages):
    storage = storages(pg_url, statement_timeout_ms=1234)
    with storage.connection() as pooled:
        assert show_timeout(pooled) == "1234ms"
    with storage.connections.connect() as direct:  # the commit's "did it land?" question uses these
        assert show_timeout(direct) == "1234ms"
    with storage.connections.connect(unlimited=True) as builder:  # setup's index builds
        assert show_timeout(builder) == "0"
    assert show_timeout(storages(pg_url, statement_timeout_ms=0).connections.connect()) == "0"


def test_the_urls_own_connection_options_are_kept_beside_the_timeout(pg_url, storages):
    separator = "&" if "?" in pg_url else "?"
    storage = storages(f"{pg_url}{separator}options=-c%20work_mem%3D5MB", statement_timeout_ms=1234)
    with storage.connection() as conn:
        assert show_timeout(conn) == "1234ms"
        assert conn.execute("SHOW work_mem").fetchone()["work_mem"] == "5MB"


def test_a_postgres_statement_over_the_timeout_is_a_retryable_storage_error(pg_url, storages):
    storage = storages(pg_url, statement_timeout_ms=LIMIT_MS)
    with pytest.raises(StorageUnavailable) as stopped:
        storage.run("sleep", lambda conn: conn.execute("SELECT pg_sleep(%s)", (HANG_TIMEOUT,)))
    message = stopped.value.message
    assert "statement timeout" in message and f"statement_timeout_ms is {LIMIT_MS}" in message
    assert "nothing was written" in message and "retried" in message
    assert http_status(stopped.value) == 503
    assert storage.ready()  # the connection went back to the pool usable


def test_a_commit_waiting_past_the_timeout_for_a_lock_writes_nothing_and_the_thread_goes_on(pg_url, make_agent):
    model = gated_model()
    agent = make_agent(pg_url, model=model, statement_timeout_ms=LIMIT_MS)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = thread_rows(pg_url, thread_id)
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(agent.predict, request("block: then Tokyo", thread_id=thread_id))
        assert model.entered.wait(HANG_TIMEOUT)
        with psycopg.connect(pg_url) as locker:  # another session holds the thread's record
            locker.execute("SELECT 1 FROM agent_threads WHERE thread_id = %s FOR UPDATE", (thread_id,))
            model.gate.set()
            with pytest.raises(StorageUnavailable) as stopped:
                in_flight.result(HANG_TIMEOUT)
    assert "statement timeout" in stopped.value.message and "nothing was written" in stopped.value.message
    assert "Lost the connection" not in stopped.value.message  # the server answered: no outcome to guess
    assert thread_rows(pg_url, thread_id) == before
    say(agent, "Where am I going?", thread_id=thread_id)
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "Where am I going?"]


def test_a_sqlite_query_running_past_the_timeout_is_interrupted(tmp_path, storages):
    storage = storages(f"sqlite:///{tmp_path / 'slow.sqlite'}", statement_timeout_ms=LIMIT_MS)
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    with pytest.raises(StorageUnavailable) as stopped:
        with storage.cursor(write=False) as cur:
            cur.execute(endless).fetchone()
    assert "interrupted" in stopped.value.message and f"statement_timeout_ms is {LIMIT_MS}" in stopped.value.message
    assert http_status(stopped.value) == 503
    assert storage.ready()  # the next operation has its own time


def test_a_sqlite_write_waiting_past_the_timeout_for_another_connections_lock_gives_up(tmp_path, make_agent):
    url = f"sqlite:///{tmp_path / 'locked.sqlite'}"
    agent = make_agent(url, statement_timeout_ms=LIMIT_MS)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = thread_rows(url, thread_id)
    other = sqlite3.connect(tmp_path / "locked.sqlite", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction, left open
        with pytest.raises(StorageUnavailable) as stopped:
            say(agent, "Where am I going?", thread_id=thread_id)
    finally:
        other.close()
    assert "database is locked" in stopped.value.message and "retried" in stopped.value.message
    assert thread_rows(url, thread_id) == before
    say(agent, "Where am I going?", thread_id=thread_id)
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "Where am I going?"]
