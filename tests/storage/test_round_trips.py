"""A database that stops answering without closing its connections fails requests within the round-trip
deadline (`agent.storage.postgres.round_trips`), writes nothing, and the agent recovers when it answers again.

The silence is real: the fault-injection TCP proxy keeps the connections open and acknowledges what it
receives, but forwards nothing (`blackhole`: every connection, new ones hang too; `stall`: only the
connections open now, as a frozen peer on the pool's connections while a new one gets through). TCP
keepalives cannot see either; only the deadline on the wait can.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from agent.errors import StorageUnavailable
from agent.storage.postgres.batch import running_batch
from tests.helpers.reliability import (
    HANG_TIMEOUT,
    gated_model,
    head_messages,
    history_ids,
    timed,
    turn_with_fault,
    user_texts,
)
from tests.helpers.scenario import outputs, request, say, text_of
from tests.helpers.servers import free_port, server_process

#: Small limits, so that a round trip's deadline is statement 1 s + reply 1 s.
LIMITS = {"statement_timeout_ms": 1000, "reply_timeout": 1.0, "connect_timeout": 2.0}
ROUND_TRIP = LIMITS["statement_timeout_ms"] / 1000 + LIMITS["reply_timeout"]
#: Slack over a bound on a busy shared machine; a hang would run to HANG_TIMEOUT.
SLACK = 5.0


def test_a_silent_database_fails_the_turn_and_reads_within_the_deadline_and_the_agent_recovers(
    pg_proxy, own_db, make_agent
):
    model = gated_model()
    # enqueue: the claim that went unanswered may be delivered when the proxy forwards again, and then holds
    # the thread until its lease (2 s) passes; the turn after waits for it instead of being refused.
    agent = make_agent(pg_proxy.url_for(own_db), model=model, multitask_strategy="enqueue", lease_seconds=2, **LIMITS)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)
    calls = model.calls[0]

    pg_proxy.blackhole()
    error, elapsed = timed(lambda: say(agent, "Where am I going?", thread_id=thread_id))
    assert isinstance(error, StorageUnavailable), error
    assert "did not answer within" in error.message and "nothing was written" in error.message
    assert elapsed < ROUND_TRIP + SLACK
    assert model.calls[0] == calls  # failed at the claim, before the model

    # The next request does not wait on another silent pooled connection: it finds the server unreachable.
    error, elapsed = timed(lambda: history_ids(agent, thread_id))
    assert isinstance(error, StorageUnavailable), error
    assert elapsed < LIMITS["connect_timeout"] + ROUND_TRIP + SLACK

    pg_proxy.start()
    answer = say(agent, "Where am I going?", thread_id=thread_id)
    assert "SF" in text_of(answer)
    assert history_ids(agent, thread_id)[1:] == before  # one turn added: the failed one wrote nothing


def test_an_unanswered_commit_is_taken_back_so_that_it_never_lands_and_the_retry_commits_once(
    pg_proxy, own_db, make_agent
):
    # The trial's duplicate: a commit held by a frozen network landed once it healed, after the client had
    # given up. Now the claim is taken back on a new connection, so the held commit fails its fencing check.
    model = gated_model()
    agent = make_agent(pg_proxy.url_for(own_db), model=model, **LIMITS)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = history_ids(agent, thread_id)

    # The pool's connections go silent while the model runs; a new one gets through.
    with pytest.raises(StorageUnavailable) as lost:
        turn_with_fault(agent, model, pg_proxy.stall, "block: then Tokyo", thread_id=thread_id)
    assert "did not answer within" in lost.value.message
    assert "nothing was written; the request can be retried" in lost.value.message
    assert "could not be asked" not in lost.value.message

    pg_proxy.start()  # the held commit is delivered now, and refused
    retried = outputs(say(agent, "block: then Tokyo", thread_id=thread_id))
    assert retried["parent_checkpoint_id"] == before[0]
    assert history_ids(agent, thread_id) == [retried["checkpoint_id"], *before]
    assert user_texts(head_messages(agent, thread_id)) == ["I'm headed to SF!", "block: then Tokyo"]


def test_an_unanswered_commit_whose_fate_cannot_be_asked_says_so(pg_proxy, own_db, make_agent):
    model = gated_model()
    agent = make_agent(pg_proxy.url_for(own_db), model=model, **LIMITS)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]

    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(say, agent, "block: then Tokyo", thread_id=thread_id)
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            pg_proxy.blackhole()  # silent, and new connections hang: the database cannot be asked
        finally:
            model.gate.set()
        error, elapsed = timed(lambda: in_flight.result(timeout=HANG_TIMEOUT))
    assert isinstance(error, StorageUnavailable), error
    assert "could not be asked whether the turn was saved" in error.message
    assert elapsed < ROUND_TRIP + LIMITS["connect_timeout"] + SLACK

    pg_proxy.start()
    assert len(history_ids(agent, thread_id)) in (2, 3)  # whichever it was, the history answers now


@pytest.mark.slow
def test_served_ready_and_turns_answer_503_within_the_bound_while_the_database_is_silent(pg_proxy, own_db, tmp_path):
    port = free_port()
    env = {
        "AGENT_DATABASE_URL": pg_proxy.url_for(own_db),
        "AGENT_MODEL": "offline",
        "AGENT_TRACING": "false",
        "AGENT_STATEMENT_TIMEOUT_MS": str(LIMITS["statement_timeout_ms"]),
        "AGENT_REPLY_TIMEOUT": str(LIMITS["reply_timeout"]),
        "AGENT_CONNECT_TIMEOUT": str(LIMITS["connect_timeout"]),
        "AGENT_MULTITASK_STRATEGY": "enqueue",  # as in the first test: a late-delivered claim holds its lease
        "AGENT_LEASE_SECONDS": "2",
    }
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
        with httpx.Client(base_url=base_url, timeout=HANG_TIMEOUT) as http:
            assert http.get("/ready").status_code == 200
            thread_id = http.post("/invocations", json=request("I'm headed to SF!")).json()["custom_outputs"]["thread_id"]

            pg_proxy.blackhole()
            started = time.monotonic()
            not_ready = http.get("/ready")
            assert not_ready.status_code == 503 and not_ready.json() == {"status": "database unreachable"}
            assert time.monotonic() - started < LIMITS["connect_timeout"] + LIMITS["reply_timeout"] + SLACK
            assert http.get("/health").status_code == 200

            started = time.monotonic()
            refused = http.post("/invocations", json=request("Where am I going?", thread_id=thread_id))
            assert refused.status_code == 503 and refused.json()["error_code"] == "TEMPORARILY_UNAVAILABLE"
            assert "nothing was written" in refused.json()["message"] and "Traceback" not in refused.text
            assert time.monotonic() - started < LIMITS["connect_timeout"] + ROUND_TRIP + SLACK

            pg_proxy.start()
            deadline = time.monotonic() + HANG_TIMEOUT
            while http.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, "/ready never recovered"
                time.sleep(0.1)
            answer = http.post("/invocations", json=request("Where am I going?", thread_id=thread_id))
            assert answer.status_code == 200 and "SF" in text_of(answer.json())


def test_connections_carry_tcp_liveness_and_a_url_keeps_its_own(pg_proxy, own_db, make_agent):
    agent = make_agent(psycopg.conninfo.make_conninfo(pg_proxy.url_for(own_db), keepalives_idle=77), **LIMITS)
    with agent.storage.connection() as conn:
        parameters = conn.info.get_parameters()
    assert parameters["tcp_user_timeout"] == "1000" and parameters["keepalives"] == "1"
    assert parameters["keepalives_idle"] == "77"


def title_of(url: str, thread_id: str) -> str | None:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT title FROM agent_threads WHERE thread_id = %s", (thread_id,)).fetchone()[0]


def test_a_batch_of_statements_each_within_its_limit_is_not_cut_by_the_deadline(own_db, make_agent):
    # The server limits each statement of a batch (one query) to statement_timeout_ms: four of 0.7 s take
    # 2.8 s, over one statement's deadline (2 s) and within the batch's, so the write goes through.
    agent = make_agent(own_db, **LIMITS)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]

    def slow_rename(tx) -> None:
        batch = running_batch()
        for _ in range(4):
            batch.execute("SELECT pg_sleep(0.7)")
        batch.execute("UPDATE agent_threads SET title = 'renamed' WHERE thread_id = %s", (thread_id,))

    agent.storage.transaction(slow_rename)
    assert title_of(own_db, thread_id) == "renamed"


def test_an_unanswered_commit_of_a_write_without_a_claim_is_told_unknown_and_cannot_land_later(
    pg_proxy, own_db, make_agent
):
    # A write outside a turn (a title, a prune, a deletion) has no claim to take back: its session is ended
    # on a new connection, so the COMMIT the silent network holds cannot land after the caller was told.
    agent = make_agent(pg_proxy.url_for(own_db), **LIMITS)
    thread_id = outputs(say(agent, "I'm headed to SF!"))["thread_id"]
    before = title_of(own_db, thread_id)

    def rename_in_silence(tx) -> None:
        running_batch().execute("UPDATE agent_threads SET title = 'renamed' WHERE thread_id = %s", (thread_id,))
        pg_proxy.stall()  # the connection carrying this transaction goes silent; a new one gets through

    error, elapsed = timed(lambda: agent.storage.transaction(rename_in_silence))
    assert isinstance(error, StorageUnavailable), error
    assert "whether the change was saved is not known (it cannot be saved later)" in error.message
    assert "nothing was written" not in error.message
    assert elapsed < 3 * ROUND_TRIP + LIMITS["connect_timeout"] + SLACK
    pg_proxy.start()  # the held COMMIT is delivered now, to a session that is gone
    time.sleep(0.5)
    assert title_of(own_db, thread_id) == before != "renamed"
