"""Database and model faults (issue 5, item 3).

Faults injected, for real: the agent's Postgres connections are killed with
`pg_terminate_backend` between turns and in the middle of a turn; the Postgres
server is restarted (`test_postgres_restart_*`, its own test, as it disturbs
everyone on the server); the chat model raises, also half-way through a tool
turn; two processes run `setup` on one empty database at the same time.

In each case the request in flight either succeeds or fails with a clear
`AgentError` and writes nothing, and the next request on the same agent works.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from agent.errors import AgentError, ModelError, StorageUnavailable
from agent.storage.postgres import MIGRATIONS
from tests.helpers.reliability import (
    HANG_TIMEOUT,
    Child,
    FailingChatModel,
    all_rows,
    dbname_of,
    fresh_database,
    gated_model,
    head_messages,
    release_together,
    terminate_backends,
    user_texts,
)
from tests.helpers.scenario import outputs, request, say, text_of


#: The environment variable that allows `test_postgres_restart_*` to restart the server.
RESTART_OPT_OUT = "AGENT_TEST_RESTART_POSTGRES"


@pytest.fixture
def fault_db(pg_server_url):
    """A database of its own, so killing its connections touches no other test."""
    with fresh_database(pg_server_url) as url:
        yield url


def history_ids(agent, thread_id: str) -> list[str]:
    return [h["checkpoint_id"] for h in agent.get_checkpoint_history(thread_id, limit=100)]


def eventually(call, attempts: int = 2):
    """`call()`, retried once after a StorageUnavailable (the "clear error, then success" outcome)."""
    for attempt in range(attempts):
        try:
            return call()
        except StorageUnavailable:
            if attempt == attempts - 1:
                raise


# --- connections killed -----------------------------------------------------------------------


def test_killed_connections_between_turns_the_next_request_succeeds(pg_server_url, fault_db, make_agent):
    agent = make_agent(fault_db, pool_min_size=4)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    say(agent, "And then to LA.", thread_id=thread_id)

    assert terminate_backends(pg_server_url, dbname_of(fault_db)) >= 1
    # A turn is retried on a fresh connection: nothing was sent yet, so it is safe.
    answer = say(agent, "Where am I going?", thread_id=thread_id)
    assert "SF" in text_of(answer) and "LA" in text_of(answer)

    assert terminate_backends(pg_server_url, dbname_of(fault_db)) >= 1
    # Reads are retried the same way.
    assert len(agent.get_checkpoint_history(thread_id)) == 4  # the root and three turns
    assert agent.storage.get_thread(thread_id).user_id is None


def test_killed_connections_during_a_turn_fail_it_and_write_nothing(pg_server_url, fault_db, make_agent):
    model = gated_model()
    agent = make_agent(fault_db, model=model)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)
    rows = all_rows(fault_db)

    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(say, agent, "block: I'm headed to Tokyo!", thread_id=thread_id)
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            # The turn holds its connection (and the thread lock) while the model runs.
            assert terminate_backends(pg_server_url, dbname_of(fault_db)) >= 1
        finally:
            model.gate.set()
        with pytest.raises(StorageUnavailable) as lost:
            in_flight.result(timeout=HANG_TIMEOUT)
    assert lost.value.ids["thread_id"] == thread_id
    assert "Traceback" not in lost.value.message

    # Nothing of the failed turn is stored: no checkpoint, no new head, no message.
    assert all_rows(fault_db) == rows
    assert history_ids(agent, thread_id) == before
    assert "Tokyo" not in " ".join(user_texts(head_messages(agent, thread_id)))

    # The same agent goes on, and a retry of the lost message lands once.
    retried = say(agent, "block: I'm headed to Tokyo!", thread_id=thread_id)
    assert outputs(retried)["parent_checkpoint_id"] == before[0]
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "block: I'm headed to Tokyo!"]


def test_killed_connections_during_a_streamed_turn_fail_it_and_write_nothing(pg_server_url, fault_db, make_agent):
    model = gated_model()
    agent = make_agent(fault_db, model=model)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)

    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(lambda: list(agent.predict_stream(request("block: Tokyo?", thread_id=thread_id))))
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            terminate_backends(pg_server_url, dbname_of(fault_db))
        finally:
            model.gate.set()
        with pytest.raises(StorageUnavailable):
            in_flight.result(timeout=HANG_TIMEOUT)
    assert history_ids(agent, thread_id) == before
    assert outputs(say(agent, "still there?", thread_id=thread_id))["parent_checkpoint_id"] == before[0]


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get(RESTART_OPT_OUT) == "0",
    reason=f"{RESTART_OPT_OUT}=0: this run may not restart the Postgres server",
)
def test_postgres_restart_the_next_request_succeeds(pg_server_url, fault_db, make_agent):
    """Restarts the local test server (it runs in the suite; AGENT_TEST_RESTART_POSTGRES=0 opts out,
    e.g. when others share the server). Needs the local cluster's pg_ctlcluster, as scripts/test.sh does."""
    ctl, clusters = shutil.which("pg_ctlcluster"), shutil.which("pg_lsclusters")
    assert ctl and clusters, (
        "pg_ctlcluster/pg_lsclusters are needed to restart the local Postgres; "
        f"set {RESTART_OPT_OUT}=0 to run against a server this suite may not restart"
    )
    port = psycopg.conninfo.conninfo_to_dict(pg_server_url).get("port", "5432")
    listing = subprocess.run([clusters, "-h"], capture_output=True, text=True, check=True).stdout
    (version, name) = next(
        (fields[0], fields[1]) for fields in (line.split() for line in listing.splitlines()) if fields[2] == str(port)
    )
    agent = make_agent(fault_db)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]

    subprocess.run([ctl, "--skip-systemctl-redirect", version, name, "restart"], check=True, timeout=120)

    answer = say(agent, "Where am I going?", thread_id=thread_id)
    assert "SF" in text_of(answer)
    assert len(agent.get_checkpoint_history(thread_id)) == 2


# --- the chat model fails -----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["predict", "predict_stream"])
def test_a_failing_model_writes_nothing_and_a_retry_adds_the_message_once(backend_url, make_agent, stream):
    failures = [0]
    agent = make_agent(backend_url, model=FailingChatModel(failures=failures))
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before, rows = history_ids(agent, thread_id), all_rows(backend_url)

    def send():
        body = request("I'm headed to Tokyo!", thread_id=thread_id)
        return list(agent.predict_stream(body))[-1].custom_outputs if stream else outputs(agent.predict(body))

    failures[0] = 1
    with pytest.raises(ModelError) as failed:
        send()
    assert "injected" in failed.value.message
    assert history_ids(agent, thread_id) == before
    assert agent.storage.get_thread(thread_id).head_checkpoint_id == before[0]
    assert all_rows(backend_url) == rows

    assert send()["parent_checkpoint_id"] == before[0]
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "I'm headed to Tokyo!"]


def test_a_model_failing_after_the_tool_ran_writes_nothing_of_the_turn(backend_url, make_agent):
    failures = [0]
    agent = make_agent(backend_url, model=FailingChatModel(failures=failures, fail_after_tool_call=True))
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    before, rows = history_ids(agent, thread_id), all_rows(backend_url)

    failures[0] = 1
    with pytest.raises(ModelError):
        say(agent, "calculate 6*7", thread_id=thread_id)
    # The tool call and its result were made in memory, and dropped with the turn.
    assert history_ids(agent, thread_id) == before
    assert all_rows(backend_url) == rows
    assert [type(m).__name__ for m in head_messages(agent, thread_id)] == ["HumanMessage", "AIMessage"]

    answer = say(agent, "calculate 6*7", thread_id=thread_id)
    assert "42" in text_of(answer)
    assert user_texts(head_messages(agent, thread_id)) == ["hello", "calculate 6*7"]


# --- setup from two processes ---------------------------------------------------------------------

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
def test_setup_from_two_processes_at_once_on_an_empty_database(fault_db):
    (results,) = release_together([Child(CHILD_SETUP, fault_db) for _ in range(2)])
    assert all(len(r) == 1 for r in results)

    with psycopg.connect(fault_db) as conn:
        tables = [row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        langgraph_versions = [row[0] for row in conn.execute("SELECT v FROM checkpoint_migrations ORDER BY v")]
        agent_versions = [row[0] for row in conn.execute("SELECT v FROM agent_migrations ORDER BY v")]
        threads = conn.execute("SELECT count(*) FROM agent_threads").fetchone()[0]
    assert sorted(tables) == sorted(
        {"checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations", "agent_threads",
         "agent_migrations", "agent_claims", "agent_idempotency", "store", "store_migrations"}
    )
    assert langgraph_versions == list(range(len(langgraph_versions))) and langgraph_versions
    assert agent_versions == list(range(len(MIGRATIONS)))
    assert threads == 2


def test_setup_with_a_pool_of_one_connection(fault_db, make_agent):
    agent = make_agent(fault_db, pool_min_size=1, pool_max_size=1, pool_timeout=5)
    thread_id = outputs(say(agent, "hi"))["thread_id"]
    assert len(agent.get_checkpoint_history(thread_id)) == 2


def test_an_unreachable_database_is_a_clear_storage_error(make_agent, pg_server_url):
    bad = re.sub(r"@[^/]+/", "@127.0.0.1:1/", pg_server_url)
    with pytest.raises(StorageUnavailable) as caught:
        make_agent(bad, pool_timeout=2)
    assert isinstance(caught.value, AgentError)
    assert "127.0.0.1:1" in caught.value.message
