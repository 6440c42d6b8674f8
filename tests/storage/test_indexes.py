"""Postgres indexes created `CONCURRENTLY` (`agent.storage.postgres.indexes`): built after setup's transaction on an
existing table, so writers go on meanwhile; an INVALID one that an interrupted build left is built again.

A concurrent build waits, before it ends, for every transaction of the database with an older snapshot:
a connection that holds one keeps the build in progress (or makes it time out, which interrupts it the
way a killed process would), with no timing in the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from agent.config import AgentSettings
from agent.storage import open_storage
from agent.storage.postgres import MIGRATIONS, checkpoint_ids
from agent.storage.postgres.schema import CONCURRENT_INDEXES
from tests.helpers.databases import fresh_database
from tests.helpers.reliability import HANG_TIMEOUT
from tests.helpers.scenario import outputs, say

INDEX = checkpoint_ids.OWNER_INDEX
BUILD_SQL = checkpoint_ids.OWNER_INDEX_SQL


@pytest.fixture
def url(pg_server_url) -> Iterator[str]:
    with fresh_database(pg_server_url) as found:
        yield found


def index_state(url: str, name: str = INDEX) -> tuple[int, bool] | None:
    """(oid, valid) of the index, or None when there is none."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT indexrelid::int, indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
        ).fetchone()


def set_up(url: str, **settings) -> None:
    storage = open_storage(url, AgentSettings(model="offline", **settings))
    try:
        storage.setup()
    finally:
        storage.close()


def old_snapshot(url: str) -> psycopg.Connection:
    """A connection holding a snapshot older than any build started after it (commit or close it to let go)."""
    holder = psycopg.connect(url)
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    return holder


def wait_for_concurrent_build(url: str) -> None:
    """Until a session is building an index CONCURRENTLY in the database (a plain CREATE INDEX never counts)."""
    deadline = time.monotonic() + HANG_TIMEOUT
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute(
                "SELECT 1 FROM pg_stat_progress_create_index WHERE command = 'CREATE INDEX CONCURRENTLY' "
                "AND datname = current_database()"
            ).fetchone():
                return
            time.sleep(0.05)
    pytest.fail("no CREATE INDEX CONCURRENTLY started")


def test_setup_leaves_every_index_created_concurrently_valid(url):
    set_up(url)
    assert INDEX in CONCURRENT_INDEXES and "store_prefix_idx" in CONCURRENT_INDEXES  # ours and LangGraph's
    # LangGraph's thread_id indexes duplicate their primary keys' first column: dropped, never built again.
    assert "checkpoints_thread_id_idx" not in CONCURRENT_INDEXES
    assert index_state(url, "checkpoints_thread_id_idx") is None
    # So is the index the checkpoint-id rule no longer needs (`checkpoint_ids`).
    assert "agent_checkpoints_checkpoint_id_idx" not in CONCURRENT_INDEXES
    assert index_state(url, "agent_checkpoints_checkpoint_id_idx") is None
    assert {name: (index_state(url, name) or (0, False))[1] for name in CONCURRENT_INDEXES} == dict.fromkeys(
        CONCURRENT_INDEXES, True
    )


def test_an_invalid_index_left_by_an_interrupted_build_is_built_again_by_setup(url, make_agent):
    agent = make_agent(url)
    say(agent, "a checkpoint to index")
    agent.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP INDEX {INDEX}")
    holder = old_snapshot(url)
    try:
        with psycopg.connect(url, autocommit=True) as builder:
            builder.execute("SET statement_timeout = '300ms'")  # the build is cancelled while it waits
            with pytest.raises(psycopg.errors.QueryCanceled):
                builder.execute(BUILD_SQL)
    finally:
        holder.close()
    left = index_state(url)
    assert left is not None and left[1] is False  # INVALID: kept up to date, never used, skipped by IF NOT EXISTS

    set_up(url)  # the schema is current: only the index is wrong
    rebuilt = index_state(url)
    assert rebuilt is not None and rebuilt[1] is True and rebuilt[0] != left[0]


def test_setup_on_an_existing_table_builds_the_index_concurrently_while_turns_commit(url, make_agent):
    agent = make_agent(url)
    thread_id = outputs(say(agent, "before the upgrade"))["thread_id"]
    agent.close()
    # As an agent from before the index left the database: the table full, the index and its migration absent.
    version = next(i for i, m in enumerate(MIGRATIONS) if INDEX in m)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP INDEX {INDEX}")
        conn.execute("DELETE FROM agent_migrations WHERE v >= %s", (version,))

    holder = old_snapshot(url)  # keeps the build from ending until the turn below has committed
    failures: list[BaseException] = []

    def upgrade() -> None:
        try:
            set_up(url)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    upgrading = threading.Thread(target=upgrade)
    upgrading.start()
    try:
        wait_for_concurrent_build(url)
        # A writer meanwhile: a plain CREATE INDEX would hold a SHARE lock on checkpoints until the
        # migrations commit, and this turn's commit would wait (until its statement timeout).
        writer = make_agent(url, statement_timeout_ms=HANG_TIMEOUT * 1000 // 2)
        answer = outputs(say(writer, "during the upgrade", thread_id=thread_id))
        assert writer.storage.thread_of_checkpoint(answer["checkpoint_id"]) == thread_id
    finally:
        holder.close()
        upgrading.join(HANG_TIMEOUT)
    assert not failures and not upgrading.is_alive()
    built = index_state(url)
    assert built is not None and built[1] is True
