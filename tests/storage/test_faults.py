"""Database and model faults, told truthfully.

Faults injected, for real: the agent's Postgres connections are killed with
`pg_terminate_backend` between turns and while the model runs; the Postgres
server is restarted (`test_postgres_restart_*`, its own test, as it disturbs
everyone on the server); the chat model raises, also half-way through a tool
turn; two processes run `setup` on one empty database at the same time. Through
the fault-injection TCP proxy (`pg_proxy`; the shared server is never stopped):
the database becomes unreachable (stopped, or blackholed so that connects hang),
`GET /ready` of a real `tt-agent serve` follows it, connections are cut while
the model runs and in the middle of a commit. And: a role without a privilege,
a read-only database, dropped tables.

In each case the request in flight either succeeds or fails with
`StorageUnavailable` saying what happened and whether anything was written
("the outcome is unknown" only when the database cannot be asked), errors the
agent can know before calling the model come before it, and the next request
on the same agent works.
"""

from __future__ import annotations

import os
import re
import shutil
import socketserver
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg import sql

from agent.errors import AgentError, ModelError, StorageUnavailable
from agent.storage.postgres import MIGRATIONS, TABLES
from tests.helpers.reliability import (
    HANG_TIMEOUT,
    Child,
    FailingChatModel,
    all_rows,
    dbname_of,
    fresh_database,
    gated_model,
    head_messages,
    history_ids,
    is_postgres,
    release_together,
    sqlite_path,
    terminate_backends,
    timed,
    turn_with_fault,
    user_texts,
)
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.scenario import outputs, request, say, text_of
from tests.helpers.servers import free_port, server_process


#: The environment variable that allows `test_postgres_restart_*` to restart the server.
RESTART_OPT_OUT = "AGENT_TEST_RESTART_POSTGRES"


def eventually(call, attempts: int = 2):
    """`call()`, retried once after a StorageUnavailable (the "clear error, then success" outcome)."""
    for attempt in range(attempts):
        try:
            return call()
        except StorageUnavailable:
            if attempt == attempts - 1:
                raise


# --- connections killed -----------------------------------------------------------------------


def test_killed_connections_between_turns_the_next_request_succeeds(pg_server_url, own_db, make_agent):
    agent = make_agent(own_db, pool_min_size=4)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    say(agent, "And then to LA.", thread_id=thread_id)

    assert terminate_backends(pg_server_url, dbname_of(own_db)) >= 1
    # A turn is retried on a fresh connection: nothing was sent yet, so it is safe.
    answer = say(agent, "Where am I going?", thread_id=thread_id)
    assert "SF" in text_of(answer) and "LA" in text_of(answer)

    assert terminate_backends(pg_server_url, dbname_of(own_db)) >= 1
    # Reads are retried the same way.
    assert len(agent.get_checkpoint_history(thread_id)) == 4  # the root and three turns
    assert agent.storage.get_thread(thread_id).user_id is None


@pytest.mark.parametrize("start", ["branch", "regenerate"])
def test_connections_killed_when_a_turn_away_from_the_head_reads_the_head_a_clear_error_and_nothing_written(
    pg_server_url, own_db, make_agent, monkeypatch, start
):
    """A turn that starts away from the head (a branch, an edit, a regeneration) reads the head while it
    runs: LangGraph asks for the latest checkpoint to tell a branch from a continuation
    (`checkpoint_superseded`). That read failing is `StorageUnavailable`, never the driver's error (a 500
    over HTTP). Found by the chaos soak."""
    agent = make_agent(own_db)
    first = outputs(say(agent, "I'm headed to SF!"))
    thread_id = first["thread_id"]
    say(agent, "And then to LA.", thread_id=thread_id)
    before, rows = history_ids(agent, thread_id), all_rows(own_db)
    read_head = PostgresSaver.get_tuple
    killed = []

    def kill_then_read(saver, config):
        if not killed and saver.active_turn(thread_id) is not None:  # the read inside the turn's run
            killed.append(terminate_backends(pg_server_url, dbname_of(own_db)))
        return read_head(saver, config)

    def send():
        if start == "branch":
            return outputs(say(agent, "To Tokyo instead.", thread_id=thread_id, checkpoint_id=first["checkpoint_id"]))
        return outputs(agent.predict(request(thread_id=thread_id, regenerate=True)))

    monkeypatch.setattr(PostgresSaver, "get_tuple", kill_then_read)
    with pytest.raises(StorageUnavailable) as failed:
        send()
    assert killed and killed[0] >= 1
    assert "nothing was written" in failed.value.message
    monkeypatch.undo()
    assert history_ids(agent, thread_id) == before and all_rows(own_db) == rows
    assert send()["parent_checkpoint_id"] == first["checkpoint_id"]  # a sibling of the second turn, either way


@pytest.mark.parametrize("stream", [False, True], ids=["predict", "predict_stream"])
def test_connections_killed_while_the_model_runs_the_turn_commits_on_a_fresh_connection(
    pg_server_url, own_db, make_agent, stream
):
    model = gated_model()
    agent = make_agent(own_db, model=model, pool_min_size=2)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)

    def send():
        body = request("block: I'm headed to Tokyo!", thread_id=thread_id)
        return list(agent.predict_stream(body))[-1].custom_outputs if stream else outputs(agent.predict(body))

    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(send)
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            # No connection is held while the model runs, but the pool's idle ones all die.
            assert terminate_backends(pg_server_url, dbname_of(own_db)) >= 1
        finally:
            model.gate.set()
        landed = in_flight.result(timeout=HANG_TIMEOUT)

    # The commit found its connection dead before sending COMMIT, and committed on a fresh one, once.
    assert landed["parent_checkpoint_id"] == before[0]
    assert history_ids(agent, thread_id) == [landed["checkpoint_id"], *before]
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "block: I'm headed to Tokyo!"]


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.skipif(
    os.environ.get(RESTART_OPT_OUT) == "0",
    reason=f"{RESTART_OPT_OUT}=0: this run may not restart the Postgres server",
)
def test_postgres_restart_the_next_request_succeeds(pg_server_url, own_db, make_agent):
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
    agent = make_agent(own_db)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]

    subprocess.run([ctl, "--skip-systemctl-redirect", version, name, "restart"], check=True, timeout=120)

    answer = say(agent, "Where am I going?", thread_id=thread_id)
    assert "SF" in text_of(answer)
    assert len(agent.get_checkpoint_history(thread_id)) == 3  # the root and two turns


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


@pytest.mark.parametrize("stream", [False, True], ids=["predict", "predict_stream"])
def test_a_first_turn_that_fails_leaves_nothing_not_even_the_threads_root(backend_url, make_agent, stream):
    agent = make_agent(backend_url, model=FailingChatModel(failures=[1]))
    rows = all_rows(backend_url)
    thread_id = f"first-{uuid.uuid4()}"
    body = request("I'm headed to SF!", thread_id=thread_id)
    with pytest.raises(ModelError):
        list(agent.predict_stream(body)) if stream else agent.predict(body)
    # The root is written with the first turn's commit, or not at all.
    assert all_rows(backend_url) == rows
    assert agent.storage.get_thread(thread_id) is None
    ids = outputs(say(agent, "I'm headed to SF!", thread_id=thread_id))
    assert [e["source"] for e in agent.get_checkpoint_history(thread_id)] == ["loop", "root"]
    assert ids["parent_checkpoint_id"] == agent.get_checkpoint_history(thread_id)[-1]["checkpoint_id"]


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
def test_setup_from_two_processes_at_once_on_an_empty_database(own_db):
    (results,) = release_together([Child(CHILD_SETUP, own_db) for _ in range(2)])
    assert all(len(r) == 1 for r in results)

    with psycopg.connect(own_db) as conn:
        tables = [row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        langgraph_versions = [row[0] for row in conn.execute("SELECT v FROM checkpoint_migrations ORDER BY v")]
        agent_versions = [row[0] for row in conn.execute("SELECT v FROM agent_migrations ORDER BY v")]
        threads = conn.execute("SELECT count(*) FROM agent_threads").fetchone()[0]
    assert sorted(tables) == sorted(
        {"checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations", "agent_threads",
         "agent_migrations", "agent_claims", "agent_idempotency", "agent_claim_waiters", "agent_user_claims",
         "agent_steers", "agent_branches", "store", "store_migrations",
         "agent_runs", "agent_run_events"}
    )
    assert langgraph_versions == list(range(len(langgraph_versions))) and langgraph_versions
    assert agent_versions == list(range(len(MIGRATIONS)))
    assert threads == 2


def test_setup_with_a_pool_of_one_connection(own_db, make_agent):
    agent = make_agent(own_db, pool_min_size=1, pool_max_size=1, pool_timeout=5)
    thread_id = outputs(say(agent, "hi"))["thread_id"]
    assert len(agent.get_checkpoint_history(thread_id)) == 2


def test_an_unreachable_database_is_a_clear_storage_error(make_agent, pg_server_url):
    bad = re.sub(r"@[^/]+/", "@127.0.0.1:1/", pg_server_url)
    with pytest.raises(StorageUnavailable) as caught:
        make_agent(bad, pool_timeout=2)
    assert isinstance(caught.value, AgentError)
    assert "127.0.0.1:1" in caught.value.message


def test_a_missing_database_or_role_is_named_not_called_a_timeout(make_agent, pg_server_url):
    info = psycopg.conninfo.conninfo_to_dict(pg_server_url)
    missing_db = psycopg.conninfo.make_conninfo(pg_server_url, dbname=f"tt_no_such_db_{uuid.uuid4().hex[:8]}")
    missing_role = psycopg.conninfo.make_conninfo(pg_server_url, user="tt_no_such_role", dbname=info["dbname"])
    for url, says in ((missing_db, "does not exist"), (missing_role, 'role "tt_no_such_role" does not exist')):
        with pytest.raises(StorageUnavailable) as caught:
            make_agent(url)
        assert says in caught.value.message and "timeout" not in caught.value.message


@pytest.fixture
def http_port():
    """A local TCP port whose server is no Postgres server: it answers whatever it is sent with an HTTP 400."""

    class Answer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(64)
            self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Answer) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield server.server_address[1]
        server.shutdown()


def test_a_libpq_reason_holding_a_colon_is_told_whole(make_agent, pg_server_url, http_port):
    # Found by a new user: sslmode=require against a server that is not Postgres said only "H" (libpq's
    # "received invalid response to SSL negotiation: H", cut at its last colon).
    url = psycopg.conninfo.make_conninfo(pg_server_url, host="127.0.0.1", port=http_port, sslmode="require")
    with pytest.raises(StorageUnavailable) as caught:
        make_agent(url)
    assert "received invalid response to SSL negotiation: H;" in caught.value.message


# --- the database unreachable (through the fault-injection proxy) ----------------------------------

#: The connect timeout the fault tests configure (libpq's smallest), and the pool timeout they leave at 30 s.
CONNECT_TIMEOUT = 2
POOL_TIMEOUT = 30.0
#: A password in the URL, which no message may show.
SECRET = "s3cret-pw"


def proxied(pg_proxy, url: str) -> str:
    """`url` through the proxy, with a password (trust auth ignores it) that messages must mask."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    return pg_proxy.url_for(psycopg.conninfo.make_conninfo(url, password=SECRET, dbname=info["dbname"]))


def assert_masked(message: str) -> None:
    assert SECRET not in message and "***" in message


@pytest.mark.parametrize("fault", ["stopped", "blackholed"])
def test_an_unreachable_database_fails_create_agent_within_the_connect_timeout(pg_proxy, own_db, make_agent, fault):
    url = proxied(pg_proxy, own_db)
    pg_proxy.stop() if fault == "stopped" else pg_proxy.blackhole()

    error, elapsed = timed(lambda: make_agent(url, connect_timeout=CONNECT_TIMEOUT, pool_timeout=POOL_TIMEOUT))

    assert isinstance(error, StorageUnavailable), error
    # A behaviour bound, not a benchmark: the connect timeout, not the pool timeout, ends the wait.
    assert elapsed < POOL_TIMEOUT / 2
    # What libpq said: refused by a stopped server, a timeout when connects hang.
    assert ("Connection refused" if fault == "stopped" else f"timeout expired (connect_timeout {CONNECT_TIMEOUT} s)") in error.message
    assert_masked(error.message)


def test_a_turn_fails_within_the_connect_timeout_while_the_database_is_down_and_works_after(
    pg_proxy, own_db, make_agent
):
    model = gated_model()
    url = proxied(pg_proxy, own_db)
    agent = make_agent(url, model=model, connect_timeout=CONNECT_TIMEOUT, pool_timeout=POOL_TIMEOUT)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    calls = model.calls[0]

    pg_proxy.stop()
    error, elapsed = timed(lambda: say(agent, "Where am I going?", thread_id=thread_id))
    assert isinstance(error, StorageUnavailable), error
    assert elapsed < POOL_TIMEOUT / 2
    assert "nothing was written" in error.message and "retried" in error.message
    assert_masked(error.message)
    assert model.calls[0] == calls  # refused at the claim, before the model

    pg_proxy.start()
    answer = say(agent, "Where am I going?", thread_id=thread_id)
    assert "SF" in text_of(answer)


@pytest.mark.slow
def test_ready_answers_503_while_the_database_is_unreachable_and_health_stays_200(pg_proxy, own_db, tmp_path):
    port = free_port()
    env = {
        "AGENT_DATABASE_URL": proxied(pg_proxy, own_db),
        "AGENT_MODEL": "offline",
        "AGENT_TRACING": "false",
        "AGENT_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
    }
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
        with httpx.Client(base_url=base_url, timeout=HANG_TIMEOUT) as http:
            assert http.get("/ready").status_code == 200
            thread_id = http.post("/invocations", json=request("I'm headed to SF!")).json()["custom_outputs"]["thread_id"]

            pg_proxy.stop()
            not_ready = http.get("/ready")
            assert not_ready.status_code == 503 and not_ready.json() == {"status": "database unreachable"}
            assert http.get("/health").status_code == 200
            refused = http.post("/invocations", json=request("Where am I going?", thread_id=thread_id))
            assert refused.status_code == 503 and refused.json()["error_code"] == "TEMPORARILY_UNAVAILABLE"
            assert_masked(refused.json()["message"])

            pg_proxy.start()
            deadline = time.monotonic() + HANG_TIMEOUT
            while http.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, "/ready never recovered"
                time.sleep(0.1)
            answer = http.post("/invocations", json=request("Where am I going?", thread_id=thread_id))
            assert answer.status_code == 200 and "SF" in text_of(answer.json())


def test_a_background_run_failed_by_the_database_going_down_reads_storage_unavailable_not_lease_expired(
    pg_proxy, own_db, tmp_path
):
    # Found by a new user: the run's end could not be written while the database was down, and once it was back
    # the run read "the server running this turn stopped (its lease expired)", which was untrue.
    lease = 2.0
    with openai_stub_server(latency_s=3.0) as model_url:
        port = free_port()
        env = {
            "AGENT_DATABASE_URL": proxied(pg_proxy, own_db),
            "AGENT_MODEL": "fake",
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "unused",
            "AGENT_TRACING": "false",
            "AGENT_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
            "AGENT_LEASE_SECONDS": str(lease),
        }
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
            with httpx.Client(base_url=base_url, timeout=HANG_TIMEOUT) as http:
                run_id = http.post("/responses", json={"input": "Plan a trip", "background": True}).json()["id"]
                deadline = time.monotonic() + HANG_TIMEOUT
                while http.get(f"/responses/{run_id}").json()["status"] != "in_progress":
                    assert time.monotonic() < deadline, "the run never started"
                    time.sleep(0.1)
                pg_proxy.stop()
                time.sleep(3.0 + CONNECT_TIMEOUT + lease + 1.0)  # the model answers, the commit fails, the lease passes
                pg_proxy.start()

                deadline = time.monotonic() + HANG_TIMEOUT
                while True:
                    seen = http.get(f"/responses/{run_id}")
                    run = seen.json() if seen.status_code == 200 else {}
                    if run.get("custom_outputs", {}).get("code") == "unavailable" or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
    assert run["status"] == "failed", run
    assert run["custom_outputs"]["code"] == "unavailable", run["custom_outputs"]
    assert "nothing was written" in run["error"]["message"] and "lease" not in run["error"]["message"]
    assert_masked(run["error"]["message"])


# --- connections cut while a turn runs --------------------------------------------------------------


def test_connections_cut_while_the_model_runs_the_turn_commits_on_a_fresh_connection(pg_proxy, own_db, make_agent):
    model = gated_model()
    agent = make_agent(proxied(pg_proxy, own_db), model=model, connect_timeout=CONNECT_TIMEOUT)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)

    # Every open connection dies while the model runs; new ones work.
    landed = outputs(turn_with_fault(agent, model, pg_proxy.cut, "block: then Tokyo", thread_id=thread_id))

    assert landed["parent_checkpoint_id"] == before[0]
    assert history_ids(agent, thread_id) == [landed["checkpoint_id"], *before]


def test_the_database_down_at_commit_time_writes_nothing_says_so_and_frees_the_thread_when_back(
    pg_proxy, own_db, make_agent
):
    model = gated_model()
    url = proxied(pg_proxy, own_db)
    # enqueue_timeout < lease_seconds: the retry below gets the thread only if the failed turn's
    # claim is released once the database is back, not when its lease runs out.
    agent = make_agent(url, model=model, connect_timeout=CONNECT_TIMEOUT, multitask_strategy="enqueue", enqueue_timeout=5)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)

    with pytest.raises(StorageUnavailable) as lost:
        turn_with_fault(agent, model, pg_proxy.stop, "block: then Tokyo", thread_id=thread_id)
    assert "nothing was written" in lost.value.message and "retried" in lost.value.message
    assert "could not be asked" not in lost.value.message
    assert_masked(lost.value.message)

    pg_proxy.start()
    retried = outputs(say(agent, "block: then Tokyo", thread_id=thread_id))
    assert retried["parent_checkpoint_id"] == before[0]
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "block: then Tokyo"]


class CutDuringCommit:
    """Wraps the saver's `write_turn` (run inside the commit, after its fencing round trip) to inject
    a proxy fault there, once."""

    def __init__(self, saver, fault) -> None:
        self.original, self.fault, self.done = saver.write_turn, fault, False
        saver.write_turn = self

    def __call__(self, turn) -> None:
        if not self.done:
            self.done = True
            self.fault()
        self.original(turn)


def test_a_connection_cut_in_the_middle_of_the_commit_is_settled_by_asking_the_database(pg_proxy, own_db, make_agent):
    agent = make_agent(proxied(pg_proxy, own_db), connect_timeout=CONNECT_TIMEOUT)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)
    injected = CutDuringCommit(agent.storage.saver, pg_proxy.cut)

    landed = outputs(say(agent, "then Tokyo", thread_id=thread_id))

    # The claim was still this turn's, so the commit had not happened: it ran again, once.
    assert injected.done
    assert history_ids(agent, thread_id) == [landed["checkpoint_id"], *before]
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "then Tokyo"]


def test_an_outcome_is_called_unknown_only_when_the_database_cannot_be_asked(pg_proxy, own_db, make_agent):
    agent = make_agent(proxied(pg_proxy, own_db), connect_timeout=CONNECT_TIMEOUT)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    CutDuringCommit(agent.storage.saver, pg_proxy.stop)

    with pytest.raises(StorageUnavailable) as unknown:
        say(agent, "then Tokyo", thread_id=thread_id)

    assert "could not be asked whether the turn was saved" in unknown.value.message
    assert "list the thread's history before retrying" in unknown.value.message
    assert_masked(unknown.value.message)
    pg_proxy.start()
    assert len(history_ids(agent, thread_id)) in (2, 3)  # whichever it was, the history answers now


def test_commit_landed_tells_a_committed_turn_from_one_that_was_not(pg_url, make_agent):
    agent = make_agent(pg_url)
    storage = agent.storage
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    claim = storage.claim(thread_id, user_id=None, checkpoint_id=None, strategy="reject", timeout=0)
    try:
        assert storage._commit_landed(claim) is False  # claimed, not committed
    finally:
        storage.commit(claim, lambda tx: None)
    assert storage._commit_landed(claim) is True  # released by this claim's commit


# --- refusals the claim finds before the model is called ------------------------------------------------


@pytest.fixture
def limited_role(request, pg_server_url, own_db, make_agent):
    """A login role on `own_db` (set up first) that may do everything a turn does except INSERT into
    `checkpoints` (or into the table the test's indirect parameter names); yields its URL. The role is
    dropped afterwards (roles are server-wide)."""
    table = getattr(request, "param", "checkpoints")
    make_agent(own_db).close()
    role = f"tt_limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(own_db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("REVOKE INSERT ON {} FROM {}").format(sql.Identifier(table), sql.Identifier(role)))
    info = psycopg.conninfo.conninfo_to_dict(own_db)
    try:
        yield psycopg.conninfo.make_conninfo(own_db, user=role, dbname=info["dbname"])
    finally:
        with psycopg.connect(own_db, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND datname = %s",
                (role, info["dbname"]),
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_a_role_without_insert_on_checkpoints_is_refused_before_the_model_is_called(limited_role, own_db, make_agent):
    model = gated_model()
    agent = make_agent(limited_role, model=model)  # setup only reads when the schema is current
    rows = all_rows(own_db)
    with pytest.raises(StorageUnavailable) as refused:
        say(agent, "hello")
    assert "INSERT on checkpoints" in refused.value.message and "model was not called" in refused.value.message
    assert model.calls[0] == 0
    assert all_rows(own_db) == rows


@pytest.mark.parametrize("limited_role", ["agent_run_events"], indirect=True)
def test_a_role_without_insert_on_the_run_events_is_refused_before_the_model_is_called(limited_role, own_db, make_agent):
    # A streamed turn records its events as it runs: without the privilege it would fail mid-stream.
    model = gated_model()
    agent = make_agent(limited_role, model=model)
    rows = all_rows(own_db)
    with pytest.raises(StorageUnavailable) as refused:
        list(agent.predict_stream(request("hello")))
    assert "INSERT on agent_run_events" in refused.value.message and "model was not called" in refused.value.message
    assert model.calls[0] == 0
    assert all_rows(own_db) == rows


def test_the_privilege_check_covers_every_table_the_agent_writes(own_db, make_agent):
    make_agent(own_db).close()
    role = f"tt_none_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(own_db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        try:
            with conn.transaction(force_rollback=True):
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
                missing = conn.execute("SELECT agent_missing_privileges()").fetchone()[0]
        finally:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    written = [table for table in TABLES if not table.endswith("_migrations")]
    assert {"agent_runs", "agent_run_events", "agent_steers", "agent_claims", "store"} <= set(written)
    assert missing == [f"{privilege} on {table}" for table in written for privilege in ("INSERT", "UPDATE")]


def test_a_read_only_database_is_refused_before_the_model_is_called_and_still_reads(own_db, make_agent):
    writer = make_agent(own_db)
    thread_id = outputs(say(writer, "I'm headed to SF!"))["thread_id"]
    rows = all_rows(own_db)
    with psycopg.connect(own_db, autocommit=True) as conn:  # as after a failover to a replica
        conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(sql.Identifier(dbname_of(own_db))))

    model = gated_model()
    agent = make_agent(own_db, model=model)  # new connections: read-only
    for attempt in (lambda: say(agent, "hello"), lambda: say(agent, "Where am I going?", thread_id=thread_id)):
        with pytest.raises(StorageUnavailable) as refused:
            attempt()
        assert "read-only" in refused.value.message and "nothing was written" in refused.value.message
    assert model.calls[0] == 0
    assert all_rows(own_db) == rows
    assert len(agent.get_checkpoint_history(thread_id)) == 2


# --- dropped tables ----------------------------------------------------------------------------------------


def drop_tables(url: str, tables: list[str]) -> None:
    if is_postgres(url):
        with psycopg.connect(url, autocommit=True) as conn:
            for table in tables:
                conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
        return
    with sqlite3.connect(sqlite_path(url)) as conn:
        for table in tables:
            conn.execute(f"DROP TABLE {table}")


@pytest.fixture
def own_backend_url(request, tmp_path, pg_server_url):
    """Like `backend_url`, with a Postgres database of the test's own (it drops tables)."""
    if request.param == "postgres":
        with fresh_database(pg_server_url) as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'checkpoints.sqlite'}"


@pytest.mark.parametrize("own_backend_url", ["postgres", "sqlite"], indirect=True)
@pytest.mark.parametrize("who", ["a new agent's setup", "the running agent's next request"])
def test_dropped_thread_and_claim_tables_are_re_created(own_backend_url, make_agent, who):
    agent = make_agent(own_backend_url)
    say(agent, "before the accident")
    drop_tables(own_backend_url, ["agent_threads", "agent_claims"])

    if who == "a new agent's setup":
        agent = make_agent(own_backend_url)
    answer = outputs(say(agent, "after the accident", user_id="alice"))  # the very next request works

    assert agent.storage.threads_of_user("alice") == [answer["thread_id"]]
    assert user_texts(head_messages(agent, answer["thread_id"])) == ["after the accident"]
    follow_up = outputs(say(agent, "and again", thread_id=answer["thread_id"], user_id="alice"))
    assert follow_up["parent_checkpoint_id"] == answer["checkpoint_id"]
