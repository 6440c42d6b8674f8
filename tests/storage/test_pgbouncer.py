"""Transaction-mode poolers: the agent through a real PgBouncer in `pool_mode = transaction`.

Behind such a pooler every transaction may run on another server connection,
so nothing may live in a session: no prepared statements (psycopg prepares
only when `prepare_threshold` is set), no session advisory locks (setup uses
`pg_advisory_xact_lock` in its one transaction), no `SET` outside a
transaction. Shown here: the trip scenario with a branch, 16 conversations at
once, and setup from 4 processes on an empty database, all through PgBouncer
(tests/helpers/pgbouncer.py starts it; the tests skip, saying why, where it is
not installed); and, against the server directly, that the agent prepares no
statement unless `prepare_threshold` is configured, and works when it is.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from agent.storage.postgres import MIGRATIONS, TABLES
from tests.helpers.databases import dbname_of, fresh_database, with_dbname
from tests.helpers.reliability import (
    HANG_TIMEOUT,
    Child,
    assert_each_user_message_followed_by_its_reply,
    assert_linear_chain,
    fresh_database,
    head_messages,
    release_together,
    user_texts,
)
from tests.helpers.scenario import TRIP, outputs, run_trip, say, text_of

CONVERSATIONS = 16
TURNS_EACH = 3


def test_the_trip_and_a_branch_work_through_pgbouncer(pgbouncer_url, make_agent):
    agent = make_agent(pgbouncer_url)
    trip = run_trip(agent)
    assert "SF" in trip["answer"]

    branched = say(agent, "I'm headed to Tokyo!", thread_id=trip["thread_id"], checkpoint_id=trip["after_turn1"])
    assert outputs(branched)["parent_checkpoint_id"] == trip["after_turn1"]
    answer = say(agent, TRIP[2], thread_id=trip["thread_id"])
    assert "Tokyo" in text_of(answer) and "SF" not in text_of(answer)
    history = agent.get_checkpoint_history(trip["thread_id"], limit=10)
    assert history[0]["checkpoint_id"] == outputs(answer)["checkpoint_id"]
    assert {trip["after_turn3"], trip["root"]} <= {entry["checkpoint_id"] for entry in history}


def test_sixteen_conversations_at_once_work_through_pgbouncer(pgbouncer_url, make_agent):
    agent = make_agent(pgbouncer_url, pool_max_size=4)
    barrier = threading.Barrier(CONVERSATIONS)

    def converse(n: int) -> tuple[str, list[dict]]:
        barrier.wait(HANG_TIMEOUT)
        first = outputs(say(agent, f"conversation {n} turn 0"))
        turns = [first]
        for turn in range(1, TURNS_EACH):
            turns.append(outputs(say(agent, f"conversation {n} turn {turn}", thread_id=first["thread_id"])))
        return first["thread_id"], turns

    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        results = list(pool.map(converse, range(CONVERSATIONS), timeout=HANG_TIMEOUT * 2))

    assert len({thread_id for thread_id, _ in results}) == CONVERSATIONS
    for n, (thread_id, turns) in enumerate(results):
        messages = head_messages(agent, thread_id)
        assert user_texts(messages) == [f"conversation {n} turn {t}" for t in range(TURNS_EACH)]
        assert_each_user_message_followed_by_its_reply(messages)
        assert_linear_chain(turns[0]["parent_checkpoint_id"], [(t["parent_checkpoint_id"], t["checkpoint_id"]) for t in turns])
        assert agent.get_checkpoint_history(thread_id, limit=1)[0]["checkpoint_id"] == turns[-1]["checkpoint_id"]


CHILD_SETUP = """
import json, sys
from agent import create_agent
print(json.dumps("ready"), flush=True)
sys.stdin.readline()
agent = create_agent(sys.argv[1], model="offline", tracing=False)
out = agent.predict({"input": [{"role": "user", "content": "hi"}]}).custom_outputs
print(json.dumps(out["thread_id"]), flush=True)
print(json.dumps("done"), flush=True)
agent.close()
"""


@pytest.mark.slow
def test_setup_from_four_processes_at_once_on_an_empty_database_works_through_pgbouncer(pgbouncer_url, pg_server_url):
    (results,) = release_together([Child(CHILD_SETUP, pgbouncer_url) for _ in range(4)])
    assert all(len(r) == 1 for r in results)

    direct = with_dbname(pg_server_url, dbname_of(pgbouncer_url))
    with psycopg.connect(direct) as conn:
        tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        agent_versions = [row[0] for row in conn.execute("SELECT v FROM agent_migrations ORDER BY v")]
        threads = conn.execute("SELECT count(*) FROM agent_threads").fetchone()[0]
    assert tables == set(TABLES)
    assert agent_versions == list(range(len(MIGRATIONS)))
    assert threads == 4


# --- prepared statements, against the server directly -------------------------------------------


def prepared_statements(agent) -> int:
    """Statements prepared on the agent's only pooled connection (the one that ran every query)."""
    conn = agent.storage.pool.getconn(timeout=HANG_TIMEOUT)
    try:
        # Asked without preparing this query itself, whatever the connection's threshold.
        return conn.execute("SELECT count(*) AS n FROM pg_prepared_statements", prepare=False).fetchone()["n"]
    finally:
        agent.storage.pool.putconn(conn)


def test_the_agent_prepares_no_statement_by_default(pg_server_url, make_agent):
    with fresh_database(pg_server_url) as url:
        agent = make_agent(url, pool_min_size=1, pool_max_size=1)
        assert agent.settings.prepare_threshold is None
        for _ in range(3):  # every statement runs more than psycopg's default threshold (5) times
            run_trip(agent)
        assert prepared_statements(agent) == 0


def test_the_agent_works_with_prepared_statements_when_configured(pg_server_url, make_agent):
    with fresh_database(pg_server_url) as url:
        agent = make_agent(url, pool_min_size=1, pool_max_size=1, prepare_threshold=0)
        trips = [run_trip(agent) for _ in range(2)]
        assert all("SF" in trip["answer"] for trip in trips)
        assert prepared_statements(agent) > 0
        # Branching and history read through prepared statements too.
        branched = say(agent, "I'm headed to Tokyo!", thread_id=trips[1]["thread_id"], checkpoint_id=trips[1]["after_turn1"])
        assert outputs(branched)["parent_checkpoint_id"] == trips[1]["after_turn1"]
        assert len(agent.get_checkpoint_history(trips[1]["thread_id"], limit=10)) == 5


def test_a_pgbouncer_that_refuses_the_timeout_option_is_connected_to_without_it(pg_server_url, make_agent, caplog):
    # PgBouncer's default ignore_startup_parameters does not list `options`, which carries statement_timeout_ms:
    # an agent that worked through it before the setting existed still does, and says what it does without.
    from tests.helpers.pgbouncer import pgbouncer

    with fresh_database(pg_server_url) as url, pgbouncer(url, ignore_startup_parameters="extra_float_digits") as bounced:
        with caplog.at_level(logging.WARNING, logger="agent.storage.postgres.connections"):
            agent = make_agent(bounced)
        first = say(agent, "I'm headed to SF!")
        second = say(agent, "Where am I going?", thread_id=first.custom_outputs["thread_id"])
        assert second.custom_outputs["parent_checkpoint_id"] == first.custom_outputs["checkpoint_id"]
        assert "statement_timeout_ms=30000 is not applied" in caplog.text and "ALTER ROLE" in caplog.text
