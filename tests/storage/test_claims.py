"""Claims: a turn holds its thread with a renewed lease, not with a database connection.

What is shown here, on Postgres and SQLite:

* a process killed with SIGKILL inside the model leaves nothing written, and its
  thread is usable again once its lease runs out (`lease_seconds`, 15 s by default);
* a turn that runs longer than its lease still commits, because the lease is renewed;
* a turn whose claim expired and was taken over by a newer turn writes nothing and
  gets `LeaseExpired`, and the newer turn's head stands: at the commit's fencing
  check, and early when its renewal finds the claim gone;
* (Postgres) 40 turns waiting inside the model at once with `pool_max_size=2` all
  succeed, and the agent never has more than 2 connections, none idle in a transaction.

The other guarantees of the claim (one linear chain per thread under `reject` and
`enqueue`, also across processes) are in test_concurrency.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from agent.config import load_settings
from agent.errors import LeaseExpired, ThreadBusy, ThreadNotFound
from tests.helpers.claims import is_claimed, other_replica_holds
from tests.helpers.reliability import (
    HANG_TIMEOUT,
    Child,
    all_rows,
    dbname_of,
    fresh_database,
    gated_model,
    head_messages,
    history_ids,
    user_texts,
)
from tests.helpers.scenario import outputs, request, say

#: A short lease, so that the tests see it run out.
LEASE = 2.0


def wait_until(condition, what: str) -> None:
    """Poll `condition()` until it holds; fail after HANG_TIMEOUT seconds (only a hang gets there)."""
    deadline = time.monotonic() + HANG_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_the_default_lease_is_15_seconds():
    assert load_settings().lease_seconds == 15.0


# A child process whose turn hangs inside the model; it says "ready" once it is there.
CHILD_HANGS_IN_THE_MODEL = """
import json, sys, time
from agent import create_agent
from agent.models import OfflineChatModel

class Hangs(OfflineChatModel):
    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        print(json.dumps("ready"), flush=True)
        time.sleep(3600)

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        return self._generate(messages, stop, run_manager, **kwargs)

url, thread_id, lease = sys.argv[1:]
agent = create_agent(url, model=Hangs(), tracing=False, lease_seconds=float(lease))
agent.predict({"input": [{"role": "user", "content": "killed before it was stored"}], "custom_inputs": {"thread_id": thread_id}})
"""


@pytest.mark.slow
def test_a_process_killed_inside_the_model_writes_nothing_and_frees_its_thread_when_the_lease_ends(
    backend_url, make_agent
):
    agent = make_agent(backend_url)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    before, rows = history_ids(agent, thread_id), all_rows(backend_url)

    child = Child(CHILD_HANGS_IN_THE_MODEL, backend_url, thread_id, str(LEASE))
    try:
        child.wait_ready()
        assert is_claimed(backend_url, thread_id)
        child.process.kill()  # SIGKILL: no cleanup, no release
        child.process.wait(timeout=HANG_TIMEOUT)
    finally:
        child.kill()

    # Its claim outlives it: the thread is busy until the lease runs out...
    with pytest.raises(ThreadBusy):
        say(agent, "too early", thread_id=thread_id, multitask_strategy="reject")
    # ...and no longer: a turn that waits at most a little longer than the lease gets the thread.
    quick = make_agent(backend_url, multitask_strategy="enqueue", enqueue_timeout=LEASE + 3)
    after = outputs(say(quick, "after the crash", thread_id=thread_id))

    # Nothing of the killed turn was written; the next turn continues from the old head.
    assert after["parent_checkpoint_id"] == before[0]
    assert history_ids(agent, thread_id) == [after["checkpoint_id"], *before]
    assert user_texts(head_messages(agent, thread_id)) == ["start", "after the crash"]
    grown = all_rows(backend_url)
    assert grown["agent_threads"] == rows["agent_threads"] and grown["agent_claims"] == rows["agent_claims"]


def test_a_turn_longer_than_its_lease_still_commits_because_the_lease_is_renewed(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model, lease_seconds=LEASE)
    other = make_agent(backend_url)  # another replica on the same database
    thread_id = outputs(say(agent, "start"))["thread_id"]
    start = history_ids(agent, thread_id)[0]

    with ThreadPoolExecutor(1) as pool:
        long_turn = pool.submit(say, agent, "block: a long answer", thread_id=thread_id)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            time.sleep(LEASE * 2.5)  # the first lease would have run out twice by now
            assert is_claimed(backend_url, thread_id)
            with pytest.raises(ThreadBusy):
                say(other, "may I?", thread_id=thread_id)
        finally:
            model.gate.set()
        done = outputs(long_turn.result(timeout=HANG_TIMEOUT))

    assert done["parent_checkpoint_id"] == start
    assert history_ids(agent, thread_id)[0] == done["checkpoint_id"]
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block: a long answer"]


def test_a_turn_whose_expired_claim_was_taken_over_gets_lease_expired_at_commit_and_writes_nothing(
    backend_url, make_agent, monkeypatch
):
    model = gated_model()
    agent = make_agent(backend_url, model=model, lease_seconds=LEASE)
    newer = make_agent(backend_url)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    start = history_ids(agent, thread_id)[0]
    # This replica stalls (think of a long GC pause): its keeper believes it renewed, but did not.
    monkeypatch.setattr(agent.storage, "renew", lambda claims: {claim.thread_id: None for claim in claims})

    with ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(say, agent, "block: the stalled turn", thread_id=thread_id)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            wait_until(lambda: not is_claimed(backend_url, thread_id), "the stalled turn's lease ran out")
            taken_over = outputs(say(newer, "the newer turn", thread_id=thread_id, multitask_strategy="reject"))
        finally:
            model.gate.set()
        with pytest.raises(LeaseExpired) as expired:
            stalled.result(timeout=HANG_TIMEOUT)

    assert expired.value.ids["thread_id"] == thread_id and "nothing was written" in expired.value.message
    # The fencing check refused the stale commit: the newer turn's head stands, alone.
    assert taken_over["parent_checkpoint_id"] == start
    history = history_ids(agent, thread_id)
    assert history[:2] == [taken_over["checkpoint_id"], start] and len(history) == 3  # and the root
    assert user_texts(head_messages(agent, thread_id)) == ["start", "the newer turn"]
    assert not is_claimed(backend_url, thread_id)


def test_a_turn_whose_renewal_finds_its_claim_taken_stops_without_waiting_for_the_model(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model, lease_seconds=LEASE)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    before = history_ids(agent, thread_id)

    async def scenario():
        turn = asyncio.ensure_future(agent.apredict(request("block: overtaken", thread_id=thread_id)))
        assert await asyncio.to_thread(model.entered.wait, HANG_TIMEOUT)
        # Another replica takes the thread, as it would after this turn's lease had expired.
        with other_replica_holds(backend_url, thread_id):
            with pytest.raises(LeaseExpired):
                await asyncio.wait_for(turn, HANG_TIMEOUT)  # the gate stays shut: only the lost claim ends it

    try:
        asyncio.run(scenario())
    finally:
        model.gate.set()
    assert history_ids(agent, thread_id) == before
    assert user_texts(head_messages(agent, thread_id)) == ["start"]


# --- no connection held while the model runs ------------------------------------------------


CONCURRENT_TURNS = 40


def agent_sessions(server_url: str, dbname: str) -> tuple[int, int]:
    """(sessions on `dbname`, of which idle in a transaction), seen from the maintenance database."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%%') FROM pg_stat_activity "
            "WHERE datname = %s AND backend_type = 'client backend'",
            (dbname,),
        ).fetchone()


class SessionSampler:
    """Samples `agent_sessions` in a thread until stopped; keeps the largest count seen."""

    def __init__(self, server_url: str, dbname: str) -> None:
        self.server_url, self.dbname = server_url, dbname
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sessions, _ = agent_sessions(self.server_url, self.dbname)
            self.peak = max(self.peak, sessions)
            self.samples += 1

    def __enter__(self) -> SessionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=HANG_TIMEOUT)


@pytest.mark.parametrize("path", ["predict from threads", "apredict on one event loop"])
def test_forty_turns_inside_the_model_with_a_pool_of_two_hold_no_connection_and_all_commit(
    pg_server_url, make_agent, path
):
    with fresh_database(pg_server_url) as url:
        model = gated_model()
        agent = make_agent(url, model=model, pool_max_size=2)
        texts = [f"block: conversation {n}" for n in range(CONCURRENT_TURNS)]

        with SessionSampler(pg_server_url, dbname_of(url)) as sampler:
            if path == "predict from threads":
                with ThreadPoolExecutor(CONCURRENT_TURNS) as pool:
                    turns = [pool.submit(say, agent, text) for text in texts]
                    try:
                        waiting = wait_for_arrivals(model, pg_server_url, url)
                    finally:
                        model.gate.set()
                    results = [outputs(turn.result(timeout=HANG_TIMEOUT)) for turn in turns]
            else:

                async def scenario():
                    turns = [asyncio.ensure_future(agent.apredict(request(text))) for text in texts]
                    try:
                        found = await asyncio.to_thread(wait_for_arrivals, model, pg_server_url, url)
                    finally:
                        model.gate.set()
                    return found, [outputs(r) for r in await asyncio.wait_for(asyncio.gather(*turns), HANG_TIMEOUT)]

                waiting, results = asyncio.run(scenario())

        # While all 40 waited inside the model, the agent held no transaction open.
        assert waiting == (waiting[0], 0) and waiting[0] <= 2
        assert sampler.samples > 0 and 1 <= sampler.peak <= 2
        assert len({r["thread_id"] for r in results}) == CONCURRENT_TURNS
        for text, result in zip(texts, results):
            assert user_texts(head_messages(agent, result["thread_id"])) == [text]


def wait_for_arrivals(model, server_url: str, url: str) -> tuple[int, int]:
    """Wait until CONCURRENT_TURNS turns are inside the model; then the agent's sessions (worst of a few looks)."""
    for _ in range(CONCURRENT_TURNS):
        assert model.arrivals.acquire(timeout=HANG_TIMEOUT), "not every turn reached the model"
    looks = [agent_sessions(server_url, dbname_of(url)) for _ in range(20)]
    return max(look[0] for look in looks), max(look[1] for look in looks)


def claim_fence(url: str, thread_id: str) -> int | None:
    if url.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(url[len("sqlite:///") :]) as conn:
            row = conn.execute("SELECT fence FROM agent_claims WHERE thread_id = ?", (thread_id,)).fetchone()
    else:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT fence FROM agent_claims WHERE thread_id = %s", (thread_id,)).fetchone()
    return row[0] if row else None


def test_a_strangers_turn_never_touches_the_owners_claim(backend_url, make_agent):
    # The claim statement refuses a thread that belongs to another user, so a stranger
    # cannot make the owner's turns busy (the first release's lock could).
    agent = make_agent(backend_url)
    thread_id = outputs(say(agent, "mine", user_id="alice"))["thread_id"]
    fence = claim_fence(backend_url, thread_id)
    for strategy in ("reject", "enqueue", "interrupt", "rollback"):
        with pytest.raises(ThreadNotFound):
            say(agent, "let me in", thread_id=thread_id, user_id="mallory", multitask_strategy=strategy)
    assert claim_fence(backend_url, thread_id) == fence and not is_claimed(backend_url, thread_id)
    assert outputs(say(agent, "still mine", thread_id=thread_id, user_id="alice", multitask_strategy="reject"))
