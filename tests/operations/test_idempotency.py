"""Exactly-once retries: `custom_inputs.idempotency_key` and the `Idempotency-Key` header.

A retry of a committed request returns the original result (the same
`checkpoint_id`, the model not called again), also when the retry is streamed;
a retry while the original still runs waits for it; a retry of a failed request
runs; the same key for a different request is `InvalidRequest`; keys are per
user and expire after `idempotency_ttl_seconds`. On Postgres and SQLite, in
process and over `tt-agent serve`. (`mlflow models serve` never shows a
request's headers to the model: test_serving_invocations.py shows the header is
not seen there and the `custom_inputs` key is.)
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from agent.config import load_settings
from agent.errors import InvalidRequest, ModelError, ThreadBusy
from agent.operations.idempotency import Idempotency
from tests.helpers.error_bodies import assert_error_body
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.reliability import (
    HANG_TIMEOUT,
    FailingChatModel,
    GatedChatModel,
    all_rows,
    fresh_database,
    gated_model,
    head_messages,
    history_ids,
    is_postgres,
    sqlite_path,
    user_texts,
)
from tests.helpers.scenario import outputs, request, say, text_of
from tests.helpers.servers import free_port, server_process

RETRY_PATHS = ("predict", "predict_stream", "apredict", "apredict_stream")


@pytest.fixture(params=["postgres", "sqlite"])
def backend_url(request, tmp_path):
    """Each test on an empty database of its own (Postgres, or a SQLite file): keys are global to a database."""
    if request.param == "postgres":
        with fresh_database(request.getfixturevalue("pg_server_url")) as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'checkpoints.sqlite'}"


def send(agent, body: dict, path: str = "predict") -> tuple[dict, list[dict], str]:
    """One request by `path`: (custom_outputs, output items, the assistant text the caller got)."""
    if path in ("predict", "apredict"):
        response = agent.predict(body) if path == "predict" else asyncio.run(agent.apredict(body))
        items = [item if isinstance(item, dict) else item.model_dump() for item in response.output]
        return response.custom_outputs, items, text_of(response)
    if path == "predict_stream":
        events = list(agent.predict_stream(body))
    else:

        async def consume():
            return [event async for event in agent.apredict_stream(body)]

        events = asyncio.run(consume())
    items = [e.item for e in events if e.type == "response.output_item.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return events[-1].custom_outputs, items, deltas


def stored_keys(url: str) -> list[tuple]:
    """(user_key, key, thread_id, expires_at - created_at in seconds) of every stored result."""
    query = "SELECT user_key, key, thread_id, {} FROM agent_idempotency ORDER BY user_key, key"
    if is_postgres(url):
        with psycopg.connect(url) as conn:
            return conn.execute(query.format("extract(epoch FROM expires_at - created_at)::float")).fetchall()
    with sqlite3.connect(sqlite_path(url)) as conn:
        return conn.execute(query.format("expires_at - created_at")).fetchall()


def expire_keys(url: str) -> None:
    """Move every stored result's expiry into the past, as time would."""
    if is_postgres(url):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE agent_idempotency SET expires_at = now() - interval '1 second'")
        return
    with sqlite3.connect(sqlite_path(url)) as conn:
        conn.execute("UPDATE agent_idempotency SET expires_at = ?", (time.time() - 1,))


def test_the_default_idempotency_ttl_is_24_hours():
    assert load_settings().idempotency_ttl_seconds == 24 * 3600


@pytest.mark.parametrize("retry_path", RETRY_PATHS)
@pytest.mark.parametrize("first_path", ["predict", "predict_stream"])
def test_a_retry_of_a_committed_request_returns_its_result_without_calling_the_model(
    backend_url, make_agent, first_path, retry_path
):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    body = request("I'm headed to SF!", thread_id=thread_id, idempotency_key="trip-1")

    first, first_items, first_text = send(agent, body, first_path)
    calls, rows = model.calls[0], all_rows(backend_url)
    again, items, text = send(agent, body, retry_path)

    assert again == first
    assert model.calls[0] == calls  # the model was not called again
    assert all_rows(backend_url) == rows  # nothing was written
    assert history_ids(agent, thread_id)[0] == first["checkpoint_id"]
    assert user_texts(head_messages(agent, thread_id)) == ["start", "I'm headed to SF!"]
    assert [i["id"] for i in items] == [i["id"] for i in first_items] and items[-1]["type"] == "message"
    assert "SF" in text and text == (first_text or text)  # a streamed retry replays the text as deltas


def test_a_retry_that_starts_a_thread_gets_the_same_thread(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    body = request("a new conversation", idempotency_key="new-thread", user_id="alice")
    first = outputs(agent.predict(body))
    again = outputs(agent.predict(body))
    assert again == first and model.calls[0] == 1
    assert agent.storage.threads_of_user("alice") == [first["thread_id"]]


def test_a_reply_holding_a_nul_character_is_stored_and_returned_to_a_retry(backend_url, make_agent):
    # Postgres jsonb refuses the escape \u0000 (a fresh-user run got a 500); the stored result is json.
    agent = make_agent(backend_url)
    body = request("I'm headed to S\x00F!", idempotency_key="nul-reply")
    first = agent.predict(body)
    assert "\x00" in text_of(first)  # the offline model repeats the message, NUL included
    history = history_ids(agent, outputs(first)["thread_id"])
    again = agent.predict(body)
    assert outputs(again) == outputs(first) and text_of(again) == text_of(first)
    assert history_ids(agent, outputs(first)["thread_id"]) == history  # the retry wrote nothing


def sent_twice(agent, model, body: dict, path: str) -> tuple[tuple, tuple]:
    """`body` sent, and once its model call is held (`gated_model`), sent again by `path`; checks that the
    second waits for the first; both results (`send`'s), once the model call is let go."""
    with ThreadPoolExecutor(2) as pool:
        original = pool.submit(send, agent, body)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            second = pool.submit(send, agent, body, path)
            time.sleep(0.3)
            assert not second.done(), "the second request should wait for the first"
        finally:
            model.gate.set()
        return original.result(timeout=HANG_TIMEOUT), second.result(timeout=HANG_TIMEOUT)


@pytest.mark.parametrize("path", ["predict", "apredict"])
def test_a_retry_while_the_original_still_runs_waits_for_it_and_returns_its_result(backend_url, make_agent, path):
    model = gated_model()
    agent = make_agent(backend_url, model=model)  # multitask_strategy "reject": the wait is the key's, not the thread's
    thread_id = outputs(say(agent, "start"))["thread_id"]
    body = request("block: slow answer", thread_id=thread_id, idempotency_key="slow-1")

    (first, _, first_text), (again, _, again_text) = sent_twice(agent, model, body, path)

    assert again == first and again_text == first_text
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block: slow answer"]  # written once
    # "start" and the original only. A third call (the retry's) was seen once under load: the lookup read the
    # result before the claim, and the original committed between the two reads (agent.storage.postgres.reads).
    assert model.calls[0] == 2


class FailingGatedModel(GatedChatModel):
    """A `GatedChatModel` whose next `failures[0]` held calls raise once the gate opens."""

    failures: Any = None  # Any, not list: pydantic would copy a list

    def _fail(self) -> None:
        if self.failures[0] > 0:
            self.failures[0] -= 1
            raise RuntimeError("the chat model is down (injected)")

    def _wait(self) -> None:
        super()._wait()
        self._fail()

    async def _await(self) -> None:
        await super()._await()
        self._fail()


def hide_lookups(agent) -> None:
    """Make the lookup before the claim find nothing, as it does when it runs before the first request's claim
    records the key (requests sent at the same moment)."""
    idempotency = agent.operation_context.turns.idempotency
    idempotency.lookup = lambda user_id, key, request_hash: None

    async def no_stored_result(user_id, key, request_hash, in_io):
        return None

    idempotency.alookup = no_stored_result  # `predict` runs the async turn body, which looks up with alookup


@pytest.mark.parametrize("path", ["predict", "apredict_stream"])
def test_a_duplicate_whose_lookup_ran_before_the_originals_claim_waits_for_it_instead_of_busy(
    backend_url, make_agent, path
):
    # A new-user trial sent 4 identical requests at once: one got 409 "busy" at once, as its claim found the
    # thread held by the first request of its key.
    model = gated_model()
    agent = make_agent(backend_url, model=model)  # multitask_strategy "reject"
    thread_id = outputs(say(agent, "start"))["thread_id"]
    hide_lookups(agent)
    body = request("block: at the same moment", thread_id=thread_id, idempotency_key="dup-1")

    (first, _, first_text), (again, _, again_text) = sent_twice(agent, model, body, path)

    assert again == first and (again_text or first_text) == first_text
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block: at the same moment"]
    assert model.calls[0] == 2  # "start" and the original


@pytest.mark.parametrize("strategy", ["enqueue", "interrupt", "rollback", "steer"])
def test_a_duplicate_never_stops_joins_or_queues_behind_the_original_whatever_its_strategy(
    backend_url, make_agent, strategy
):
    # Served, 4 identical requests at once under `interrupt` each stopped the one before (the first client got
    # 409 under `rollback`), and under `enqueue` or `steer` the model ran once per duplicate.
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    hide_lookups(agent)
    body = request("block: once", thread_id=thread_id, idempotency_key=f"dup-{strategy}", multitask_strategy=strategy)
    (first, _, _), (again, _, _) = sent_twice(agent, model, body, "apredict")
    # Under steer the original ran as a turn of its own (`steer: "new_turn"`, which the stored result leaves out).
    assert first.get("steer") in (None, "new_turn") and again == {k: v for k, v in first.items() if k != "steer"}
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block: once"]
    assert model.calls[0] == 2  # "start" and the original


def test_a_request_with_a_key_still_interrupts_another_turn(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(send, agent, request("block: long", thread_id=thread_id))
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            newer = outputs(agent.predict(request("now this", thread_id=thread_id, idempotency_key="newer",
                                                  multitask_strategy="interrupt")))  # fmt: skip
        finally:
            model.gate.set()
        interrupted, _, _ = running.result(timeout=HANG_TIMEOUT)
    assert newer["parent_checkpoint_id"] == interrupted["checkpoint_id"]  # it stopped the turn, then ran after it


def test_requests_with_one_key_sent_at_once_all_get_the_first_ones_result(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    body = request("block: four at once", thread_id=thread_id, idempotency_key="dup-4")
    with ThreadPoolExecutor(4) as pool:
        runs = [pool.submit(send, agent, body) for _ in range(4)]
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            time.sleep(0.3)  # the others looked the key up, or claimed, meanwhile
        finally:
            model.gate.set()
        results = [run.result(timeout=HANG_TIMEOUT)[0] for run in runs]
    assert all(result == results[0] for result in results)
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block: four at once"]


def test_a_duplicate_waiting_at_the_claim_runs_when_the_original_fails(backend_url, make_agent):
    failures = [0]
    model = FailingGatedModel(
        gate=threading.Event(), entered=threading.Event(), calls=[0], arrivals=threading.Semaphore(0), failures=failures
    )
    agent = make_agent(backend_url, model=model)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    hide_lookups(agent)
    body = request("block: flaky", thread_id=thread_id, idempotency_key="dup-failed")
    with ThreadPoolExecutor(2) as pool:
        original = pool.submit(send, agent, body)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            duplicate = pool.submit(send, agent, body, "apredict")
            time.sleep(0.3)
            assert not duplicate.done()
            # The original fails: it stored nothing, so the duplicate claims the thread and runs.
            failures[0] = 1
        finally:
            model.gate.set()
        with pytest.raises(ModelError):
            original.result(timeout=HANG_TIMEOUT)
        ran, _, _ = duplicate.result(timeout=HANG_TIMEOUT)
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block: flaky"]
    assert stored_keys(backend_url)[0][1:3] == ("dup-failed", thread_id) and ran["thread_id"] == thread_id


@pytest.mark.parametrize("path", ["claim_or_result", "aclaim_or_result"])
@pytest.mark.parametrize("busy_again", [False, True], ids=["free", "busy-again"])
def test_a_duplicate_whose_original_failed_before_its_first_look_claims_again_once(backend_url, make_agent, path, busy_again):
    # Found in review: the duplicate answered 409 "busy" although the thread was free. The window is a few
    # milliseconds between two round trips, so the claim stands in for it: refused once (the original held
    # the thread), while the real storage holds no result and no turn with the key (the original failed and
    # released the thread before the duplicate's first look).
    agent = make_agent(backend_url)
    idempotency = Idempotency(agent.storage, agent.settings)
    attempts = []

    def claim():
        attempts.append(len(attempts))
        if len(attempts) == 1 or busy_again:
            raise ThreadBusy("The thread is busy (stand-in).", thread_id="t")
        return "claimed"

    async def aclaim():
        return claim()

    async def in_io(function, *args):
        return function(*args)

    def claim_or_result():
        if path == "claim_or_result":
            return idempotency.claim_or_result(claim, None, "k", "hash")
        return asyncio.run(idempotency.aclaim_or_result(aclaim, None, "k", "hash", in_io))

    if busy_again:  # another turn holds the thread: busy, as without a key, after one more try
        with pytest.raises(ThreadBusy):
            claim_or_result()
    else:
        assert claim_or_result() == "claimed"
    assert len(attempts) == 2


def test_a_retry_of_a_failed_request_runs_and_its_own_retry_gets_its_result(backend_url, make_agent):
    failures = [0]
    agent = make_agent(backend_url, model=FailingChatModel(failures=failures))
    thread_id = outputs(say(agent, "start"))["thread_id"]
    body = request("try again", thread_id=thread_id, idempotency_key="flaky-1")

    failures[0] = 1
    with pytest.raises(ModelError):
        agent.predict(body)
    assert stored_keys(backend_url) == []
    ran = outputs(agent.predict(body))
    assert ran["parent_checkpoint_id"] == history_ids(agent, thread_id)[1]
    failures[0] = 1  # a third attempt would fail if it called the model
    assert outputs(agent.predict(body)) == ran
    assert user_texts(head_messages(agent, thread_id)) == ["start", "try again"]


def test_the_same_key_for_a_different_request_is_invalid_and_writes_nothing(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    agent.predict(request("first", thread_id=thread_id, idempotency_key="k"))
    calls, rows = model.calls[0], all_rows(backend_url)

    for different in (
        request("second", thread_id=thread_id, idempotency_key="k"),
        request("first", thread_id=thread_id, checkpoint_id=history_ids(agent, thread_id)[1], idempotency_key="k"),
        request("first", idempotency_key="k"),  # a new thread
    ):
        with pytest.raises(InvalidRequest, match="already used for a different request"):
            agent.predict(different)
    assert model.calls[0] == calls and all_rows(backend_url) == rows


def test_keys_belong_to_one_user(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    alice = outputs(agent.predict(request("hello", idempotency_key="shared", user_id="alice")))
    bob = outputs(agent.predict(request("hello", idempotency_key="shared", user_id="bob")))
    anonymous = outputs(agent.predict(request("hello", idempotency_key="shared")))
    assert len({alice["thread_id"], bob["thread_id"], anonymous["thread_id"]}) == 3 and model.calls[0] == 3
    assert outputs(agent.predict(request("hello", idempotency_key="shared", user_id="bob"))) == bob
    assert sorted((row[0], row[1]) for row in stored_keys(backend_url)) == [("", "shared"), ("alice", "shared"), ("bob", "shared")]


def test_keys_expire_after_the_ttl_and_expired_results_are_removed(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model, idempotency_ttl_seconds=3600)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    body = request("remember this", thread_id=thread_id, idempotency_key="ttl-1")
    first = outputs(agent.predict(body))
    agent.predict(request("other", thread_id=thread_id, idempotency_key="ttl-2"))
    ((_, _, stored_thread, lifetime), _) = stored_keys(backend_url)
    assert stored_thread == thread_id and lifetime == pytest.approx(3600, abs=1)

    expire_keys(backend_url)
    calls = model.calls[0]
    again = outputs(agent.predict(body))
    # An expired key is forgotten: the request ran again, and its new result replaced the old row.
    assert again["checkpoint_id"] != first["checkpoint_id"] and model.calls[0] == calls + 1
    assert [row[1] for row in stored_keys(backend_url)] == ["ttl-1", "ttl-2"]
    assert outputs(agent.predict(body)) == again
    # The other expired row is swept.
    assert agent.storage.sweep_idempotency() == 1
    assert [row[1] for row in stored_keys(backend_url)] == ["ttl-1"]


def test_two_requests_with_one_key_that_both_run_commit_once(backend_url, make_agent):
    # Both pass the lookup before either claims (forced here by hiding the lookup's answer):
    # the key's primary key lets only one commit, and the other answers with its result.
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    hide_lookups(agent)
    body = request("block: at once", idempotency_key="race-1", user_id="alice")
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(send, agent, body) for _ in range(2)]
        try:
            for _ in runs:
                assert model.arrivals.acquire(timeout=HANG_TIMEOUT)  # both are inside the model
        finally:
            model.gate.set()
        (first, _, _), (second, _, _) = (run.result(timeout=HANG_TIMEOUT) for run in runs)
    assert first == second
    assert agent.storage.threads_of_user("alice") == [first["thread_id"]]
    assert stored_keys(backend_url)[0][:3] == ("alice", "race-1", first["thread_id"])


def test_a_retried_state_update_writes_one_checkpoint(backend_url, make_agent):
    agent = make_agent(backend_url)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    body = request("I'm headed to Tokyo!", action="update_checkpoint_state", thread_id=thread_id, idempotency_key="u-1")
    first = outputs(agent.predict(body))
    assert outputs(agent.predict(body)) == first
    assert history_ids(agent, thread_id)[:2] == [first["checkpoint_id"], first["parent_checkpoint_id"]]
    assert len(history_ids(agent, thread_id)) == 3


def test_the_header_and_custom_inputs_must_agree(backend_url, make_agent):
    agent = make_agent(backend_url)
    with pytest.raises(InvalidRequest, match="disagree"):
        asyncio.run(agent.apredict(request("hi", idempotency_key="a"), idempotency_key="b"))
    assert outputs(asyncio.run(agent.apredict(request("hi", idempotency_key="a"), idempotency_key="a")))


# --- over tt-agent serve -------------------------------------------------------------------------


@pytest.fixture
def served(backend_url, tmp_path):
    """`tt-agent serve` on `backend_url` with the OpenAI stub as its model (so calls can be counted)."""
    with openai_stub_server() as stub_url:
        port = free_port()
        env = {
            "AGENT_DATABASE_URL": backend_url,
            "AGENT_MODEL": "fake",
            "AGENT_TRACING": "false",
            "OPENAI_BASE_URL": stub_url,
            "OPENAI_API_KEY": "unused",
        }
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
            with httpx.Client(base_url=base_url, timeout=HANG_TIMEOUT) as http:
                yield http, stub_url


def model_calls(stub_url: str) -> int:
    return len(httpx.get(stub_url.removesuffix("/v1") + "/_requests", timeout=10).json())


def sse_events(text: str) -> list:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/invocations", "/responses"])
def test_the_idempotency_key_header_makes_retries_exactly_once_over_the_agent_server(served, path):
    http, stub_url = served
    thread_id = http.post(path, json=request("start")).json()["custom_outputs"]["thread_id"]
    body = request("I'm headed to SF!", thread_id=thread_id)
    headers = {"Idempotency-Key": f"header-key-{path}"}

    first = http.post(path, json=body, headers=headers)
    assert first.status_code == 200, first.text
    calls = model_calls(stub_url)
    again = http.post(path, json=body, headers=headers)
    streamed = http.post(path, json={**body, "stream": True}, headers=headers)

    assert again.json() == first.json()
    events = sse_events(streamed.text)
    assert events[-1]["custom_outputs"] == first.json()["custom_outputs"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == first.json()["output"][-1]["content"][0]["text"] and "SF" in deltas
    assert model_calls(stub_url) == calls

    # The same key for another request, and a header that disagrees with custom_inputs: 400.
    different = http.post(path, json=request("something else", thread_id=thread_id), headers=headers)
    disagree = http.post(path, json=request("x", thread_id=thread_id, idempotency_key="other"), headers=headers)
    for refused in (different, disagree):
        assert refused.status_code == 400 and assert_error_body(path, refused.json(), "INVALID_PARAMETER_VALUE")
    assert model_calls(stub_url) == calls
    listed = http.post(path, json=request(action="get_checkpoint_history", thread_id=thread_id, limit=10))
    assert [e["checkpoint_id"] for e in listed.json()["custom_outputs"]["history"]][0] == first.json()["custom_outputs"]["checkpoint_id"]
    assert len(listed.json()["custom_outputs"]["history"]) == 3
