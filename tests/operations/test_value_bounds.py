"""One bound per value, on Postgres and SQLite: a thread's `ttl_seconds`, the catalogue's cursors, and a
retention sweep that one thread cannot stop.

* `ttl_seconds` outside (0, 100 years] (huge floats and ints, an int with no float, NaN, infinity,
  booleans, text) is `InvalidRequest` naming it, nothing written; 100 years itself works in a sweep.
* A `ttl_seconds` stored before the bound existed (1e15, NaN, Infinity, written with SQL) does not
  make the sweep's candidate query fail for everybody: the other expired threads are still removed.
* A thread whose rows cannot be read is skipped by the sweep, logged and listed in
  `failed_thread_ids`, unchanged; every other expired thread is swept.
* A `before` that is a cursor no store wrote (a date form Python reads and Postgres does not, NaN,
  a NUL in its thread id) or neither a cursor nor one of the caller's threads is `InvalidRequest`
  naming `before`, never a 500 and never ThreadNotFound.

Each test gets a database of its own (a sweep covers every thread of its database).
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import datetime, timedelta

import psycopg
import pytest

from agent.errors import InvalidRequest
from agent.operations.catalogue import encode_cursor
from agent.operations.thread_values import MAX_TTL_SECONDS
from agent.storage.postgres import sql as pg_sql
from tests.helpers.databases import fresh_database
from tests.helpers.reliability import is_postgres, sqlite_path, thread_rows
from tests.helpers.scenario import outputs, say


@pytest.fixture(params=["postgres", "sqlite"])
def url(request, tmp_path):
    """A database of this test's own (Postgres, dropped afterwards; or a SQLite file)."""
    if request.param == "postgres":
        with fresh_database(request.getfixturevalue("pg_server_url"), prefix="tt_bounds") as fresh:
            yield fresh
    else:
        yield f"sqlite:///{tmp_path / 'bounds.sqlite'}"


def new_thread(agent, turns: int = 1, user_id: str | None = None) -> str:
    thread_id = outputs(say(agent, "I'm headed to SF!", user_id=user_id))["thread_id"]
    for number in range(1, turns):
        say(agent, f"turn {number + 1}", thread_id=thread_id, user_id=user_id)
    return thread_id


def execute(url: str, statement_pg: str, statement_sqlite: str, params: tuple) -> None:
    if is_postgres(url):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement_pg, params)
    else:
        with sqlite3.connect(sqlite_path(url)) as conn:
            conn.execute(statement_sqlite, params)


def later(agent, years: float):
    """A time `years` after every thread's last write."""
    latest = max(agent.get_thread(t["thread_id"])["updated_at"] for t in agent.list_threads(limit=100))
    return datetime.fromisoformat(latest) + timedelta(days=365.25 * years)


# -- ttl_seconds --------------------------------------------------------------------------------------
OUT_OF_BOUNDS_TTLS = [1e308, 10**30, 10**400, MAX_TTL_SECONDS + 1, float("nan"), float("inf"), -float("inf"), 0, -1,
                      True, False, "60", [60]]  # fmt: skip


@pytest.mark.parametrize("ttl", OUT_OF_BOUNDS_TTLS, ids=[repr(t)[:12] for t in OUT_OF_BOUNDS_TTLS])
def test_a_ttl_out_of_bounds_is_refused_naming_it(url, make_agent, ttl):
    agent = make_agent(url)
    thread_id = new_thread(agent)
    with pytest.raises(InvalidRequest, match="ttl_seconds"):
        agent.update_thread(thread_id, ttl_seconds=ttl)
    assert agent.get_thread(thread_id)["ttl_seconds"] is None


def test_the_longest_ttl_works_in_every_later_sweep(url, make_agent):
    agent = make_agent(url)
    kept, swept = new_thread(agent), new_thread(agent)
    agent.update_thread(kept, ttl_seconds=MAX_TTL_SECONDS)
    agent.update_thread(swept, ttl_seconds=60)
    assert agent.sweep_expired_threads(now=later(agent, 50))["deleted_thread_ids"] == [swept]
    assert agent.sweep_expired_threads(now=later(agent, 101))["deleted_thread_ids"] == [kept]


@pytest.mark.parametrize(("stored", "expires"), [(1e15, False), (1e300, False), (float("nan"), False),
                                                 (float("inf"), False), (-1e300, True)])  # fmt: skip
def test_a_ttl_stored_before_the_bound_does_not_stop_the_sweep(url, make_agent, stored, expires):
    agent = make_agent(url)
    legacy, idle = new_thread(agent), new_thread(agent)
    agent.update_thread(idle, ttl_seconds=60)
    # As an earlier version could have stored it (update_thread refuses it now).
    execute(url, "UPDATE agent_threads SET ttl_seconds = %s WHERE thread_id = %s",
            "UPDATE agent_threads SET ttl_seconds = ? WHERE thread_id = ?", (stored, legacy))  # fmt: skip

    result = agent.sweep_expired_threads(now=later(agent, 1))

    assert idle in result["deleted_thread_ids"] and result["failed_thread_ids"] == []
    # Read as 0 to 100 years (SQLite stores NaN as NULL: the default, here none).
    assert (legacy in result["deleted_thread_ids"]) is expires


def test_the_sql_bound_is_the_entry_bound():
    assert pg_sql.MAX_TTL_SECONDS == MAX_TTL_SECONDS


# -- a sweep never fails as a whole because of one thread ------------------------------------------
def corrupt_head(url: str, agent, thread_id: str) -> None:
    """Make the head's stored messages unreadable (bytes msgpack never writes)."""
    head = agent.get_thread(thread_id)["checkpoint_id"]
    execute(
        url,
        "UPDATE checkpoints SET agent_messages = '\\xc1c1c1'::bytea WHERE thread_id = %s AND agent_messages IS NOT NULL",
        "UPDATE checkpoints SET checkpoint = x'c1c1c1' WHERE thread_id = ? AND checkpoint_id = ?",
        (thread_id,) if is_postgres(url) else (thread_id, head),
    )


def test_a_thread_the_sweep_cannot_handle_is_skipped_and_reported(url, make_agent, caplog):
    writer = make_agent(url)
    broken, fine = new_thread(writer, turns=3), new_thread(writer, turns=3)
    corrupt_head(url, writer, broken)
    rows = thread_rows(url, broken)
    sweeper = make_agent(url, thread_ttl_seconds=60, thread_ttl_strategy="keep_latest")  # nothing cached

    with caplog.at_level(logging.WARNING, logger="agent.operations.retention"):
        result = sweeper.sweep_expired_threads(now=later(writer, 1))

    assert result["failed_thread_ids"] == [broken]
    assert [t["thread_id"] for t in result["trimmed"]] == [fine]
    assert thread_rows(url, broken) == rows
    assert any(broken in record.getMessage() and "skipped" in record.getMessage() for record in caplog.records)
    # Its claim was given back: the next sweep tries it again at once, and still changes nothing of it.
    assert sweeper.sweep_expired_threads(now=later(writer, 1))["failed_thread_ids"] == [broken]
    assert thread_rows(url, broken) == rows


# -- cursors ------------------------------------------------------------------------------------------
CRAFTED = {
    "week date": ("2024-W01-1", "t"),
    "date only": ("2024-01-01", "t"),
    "basic format": ("20240101T000000", "t"),
    "offset seconds": ("2024-01-01T00:00:00+00:00:30", "t"),
    "nan": ("nan", "t"),
    "infinity": ("1e999", "t"),
    "underscores": ("1_000.5", "t"),
    "nul in the id": ("2024-01-01T00:00:00.000000+00:00", "a\x00b"),
    "lone surrogate in the id": ("2024-01-01T00:00:00.000000+00:00", "\ud800"),
}


@pytest.mark.parametrize("position", list(CRAFTED.values()), ids=list(CRAFTED))
def test_a_crafted_cursor_is_refused_naming_before(url, make_agent, position):
    agent = make_agent(url)
    new_thread(agent, user_id="ada")
    with pytest.raises(InvalidRequest, match="before"):
        agent.list_threads(user_id="ada", before=encode_cursor(position))


@pytest.mark.parametrize("before", ["garbage", "t2.abc", "t1.", "t1.!!"])
def test_neither_a_cursor_nor_a_thread_of_yours_is_invalid_not_not_found(url, make_agent, before):
    agent = make_agent(url)
    new_thread(agent, user_id="ada")
    with pytest.raises(InvalidRequest, match="before"):
        agent.list_threads(user_id="ada", before=before)


def test_another_users_thread_as_before_is_worded_like_an_unknown_one(url, make_agent):
    agent = make_agent(url)
    bobs = new_thread(agent, user_id="bob")
    with pytest.raises(InvalidRequest) as theirs:
        agent.list_threads(user_id="ada", before=bobs)
    with pytest.raises(InvalidRequest) as unknown:
        agent.list_threads(user_id="ada", before="no-such-thread")
    assert theirs.value.message.replace(bobs, "X") == unknown.value.message.replace("no-such-thread", "X")


def test_real_cursors_and_thread_ids_still_page(url, make_agent):
    agent = make_agent(url)
    threads = [new_thread(agent, user_id="ada") for _ in range(3)]
    page = agent.list_threads(user_id="ada", limit=2)
    rest = agent.list_threads(user_id="ada", limit=2, before=page[-1]["cursor"])
    assert [t["thread_id"] for t in page + rest] == threads[::-1]
    assert [t["thread_id"] for t in agent.list_threads(user_id="ada", before=threads[2])] == threads[1::-1]
