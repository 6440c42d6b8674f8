"""`agent.runs` on each backend, in process (offline model): a streamed turn's stored log replays the very
events the stream sent, within its storage bound; `predict` with `custom_inputs.background` runs on without
its caller; a run's owner alone sees it."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from agent.errors import CheckpointNotFound, ResponseNotFound, ThreadNotFound
from agent.runs.log import DELTA_OVERHEAD
from agent.serving import run_views
from tests.helpers.reliability import FailingChatModel, all_rows, gated_model

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
#: Bytes a run's log may take beyond its text and its deltas' lengths (ids, custom_outputs).
PER_TURN_BYTES = 700


def streamed(agent, request: dict, *, openai_events: bool = True) -> list[dict]:
    """The events of one streamed turn: OpenAI's whole set (`POST /responses`), else MLflow's (`/invocations`)."""

    async def collect() -> list[dict]:
        return [e.model_dump(exclude_none=True) async for e in agent.apredict_stream(request, openai_events=openai_events)]

    return asyncio.run(collect())


def followed(agent, response_id: str, user_id: str | None, after: int = -1) -> list[dict]:
    async def collect() -> list[dict]:
        return [e async for e in agent.runs.follow(response_id, user_id, after, agent.operation_context.in_io)]

    return asyncio.run(collect())


@pytest.fixture
def agent(make_agent, tmp_path):
    """An offline agent on a SQLite file (the server tests run the same on Postgres)."""
    return make_agent(f"sqlite:///{tmp_path / 'checkpoints.sqlite'}")


def test_a_streamed_turn_is_replayed_from_the_store_as_it_was_sent_within_its_bound(agent):
    request = {"input": [{"role": "user", "content": "Tell me a long story about the sea " * 20}],
               "custom_inputs": {"user_id": "alice"}}  # fmt: skip
    live = streamed(agent, request)
    for event in live:
        EVENT.validate_python(event)
    response_id = live[0]["response"]["id"]
    assert followed(agent, response_id, "alice") == live
    assert followed(agent, response_id, "alice", after=3) == live[4:]
    # The log costs the turn's text, not the stream's five copies of it.
    text = "".join(e["delta"] for e in live if e["type"] == "response.output_text.delta")
    deltas = sum(1 for e in live if e["type"] == "response.output_text.delta")
    stored = sum(len(payload) for _, payload in agent.runs.store.rows(response_id, -1))
    assert stored <= len(text.encode()) + DELTA_OVERHEAD * deltas + PER_TURN_BYTES
    assert sum(len(str(e)) for e in live) > 3 * len(text)  # what storing the stream itself would have cost
    run = agent.runs.get(response_id, "alice")
    assert run.status == "completed" and run.checkpoint_id == live[-1]["custom_outputs"]["checkpoint_id"]
    with pytest.raises(ResponseNotFound):
        agent.runs.get(response_id, "mallory")


def test_a_turn_streamed_with_mlflows_events_resumes_with_them_numbered_as_it_was_sent(agent):
    # `/invocations` streams MLflow's event set (no response.created / in_progress ...), numbered from 0: a client
    # resuming with starting_after=N must get the events that followed its own N, not those of another numbering.
    request = {"input": [{"role": "user", "content": "Tell me a story about the sea " * 5}], "custom_inputs": {"user_id": "alice"}}
    live = streamed(agent, request, openai_events=False)
    assert [e["sequence_number"] for e in live] == list(range(len(live)))
    assert live[0]["type"] == "response.output_text.delta"
    response_id = agent.runs.get(live[-1]["response"]["id"], "alice").response_id
    assert followed(agent, response_id, "alice") == live
    assert followed(agent, response_id, "alice", after=2) == live[3:]


def test_predict_with_custom_inputs_background_answers_queued_and_the_turn_completes(agent):
    queued = agent.predict({"input": [{"role": "user", "content": "Hi"}], "custom_inputs": {"background": True}})
    assert queued.status == "queued" and queued.output == []
    deadline = time.monotonic() + 20
    while (run := agent.runs.get(queued.id, None)).status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.status == "completed"
    whole = run_views.retrieve(agent, queued.id, None)
    Response.model_validate(whole)
    assert whole["id"] == queued.id and whole["status"] == "completed" and whole["output"][-1]["content"][0]["text"]
    assert agent.get_checkpoint_state(run.thread_id, run.checkpoint_id)["messages"]  # it was committed
    # Streamed, a background run's events come from its log, to its end.
    events = streamed(agent, {"input": "Hi again", "background": True})
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["id"] == events[0]["response"]["id"]
    # Its id continues from its checkpoint, as the checkpoint's own id does.
    follow_up = agent.predict({"input": "And then?", "previous_response_id": queued.id})
    assert follow_up.custom_outputs["parent_checkpoint_id"] == run.checkpoint_id


def test_closing_the_agent_stops_its_background_run_and_records_its_end_before_it_returns(backend_url, make_agent, caplog):
    # Before, `close` shut the storage threads while the run went on: its end could not be recorded (a traceback in
    # the log), and it read in_progress until its lease expired.
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    queued = agent.predict({"input": "Hi, block", "custom_inputs": {"background": True, "thread_id": "t-closed"}})
    assert model.entered.wait(20)  # the run is inside the model
    try:
        agent.close()
    finally:
        model.gate.set()
    reader = make_agent(backend_url)
    run = reader.runs.get(queued.id, None)
    assert (run.status, run.code, run.checkpoint_id) == ("failed", "server_shutdown", None)
    assert "nothing was written" in run.reason
    with pytest.raises(ThreadNotFound):  # nothing was written
        reader.get_checkpoint_history("t-closed")
    # and the thread is free at once, not after the run's lease:
    done = reader.predict({"input": "Hi", "custom_inputs": {"thread_id": "t-closed", "multitask_strategy": "reject"}})
    assert done.custom_outputs["thread_id"] == "t-closed"
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


def test_closing_the_agent_with_a_run_whose_event_loop_closed_neither_raises_nor_waits_for_it(make_agent):
    # An `asyncio.run` that ended while a background run was pending leaves a run no loop will run again; `close`
    # raised "Event loop is closed" on it (seen in a full run of the suite).
    from agent.runs.service import LocalRun

    agent = make_agent("memory://")
    loop = asyncio.new_event_loop()
    task = loop.create_task(asyncio.sleep(60))
    loop.run_until_complete(asyncio.sleep(0))  # the task started
    loop.close()
    agent.runs.attach("resp_dead_loop", LocalRun(loop, task, started=True))
    began = time.monotonic()
    agent.close()
    assert time.monotonic() - began < 1.0  # not RECORD_ENDS_SECONDS waiting for an end that never comes


def test_a_streamed_turns_stored_events_are_sealed_when_encryption_is_on(make_agent, tmp_path):
    from agent.encryption import generate_key

    agent = make_agent(f"sqlite:///{tmp_path / 'sealed.sqlite'}", encryption_key=generate_key())
    live = streamed(agent, {"input": "Zanzibarian marmalade"})
    response_id = live[0]["response"]["id"]
    rows = agent.runs.store.rows(response_id, -1)
    assert rows and all(b"Zanzibarian" not in payload for _, payload in rows)
    assert followed(agent, response_id, None) == live


def test_ended_runs_are_swept_after_response_events_seconds(make_agent, tmp_path):
    agent = make_agent(f"sqlite:///{tmp_path / 'swept.sqlite'}", response_events_seconds=0.2)
    response_id = streamed(agent, {"input": "Hi"})[0]["response"]["id"]
    assert agent.runs.get(response_id, None).status == "completed"
    time.sleep(0.3)
    assert agent.runs.store.sweep() == 1
    assert agent.runs.get(response_id, None) is None and agent.runs.store.rows(response_id, -1) == []


def test_a_stream_its_caller_leaves_reads_cancelled_and_wrote_nothing(agent):
    async def leave_after_first_delta() -> str:
        events = agent.apredict_stream({"input": "Tell me about Lisbon " * 10}, openai_events=True)
        async for event in events:
            if event.type == "response.output_text.delta":
                await events.aclose()
                return response_id
            if event.type == "response.created":
                response_id = event.model_dump()["response"]["id"]
        raise AssertionError("no delta")

    response_id = asyncio.run(leave_after_first_delta())
    run = agent.runs.get(response_id, None)
    assert (run.status, run.code, run.checkpoint_id) == ("cancelled", "client_left", None)
    assert followed(agent, response_id, None)[-1]["code"] == "client_left"
    assert agent.list_threads() == []  # its new thread was never written


@pytest.mark.parametrize("deletion", ["delete_thread", "delete_user_data", "retention sweep"])
def test_deleting_a_thread_or_a_user_deletes_its_runs_and_their_events(backend_url, make_agent, deletion):
    agent = make_agent(backend_url, thread_ttl_seconds=3600)

    def turn(user: str, thread_id: str | None = None) -> tuple[str, str]:
        custom = {"user_id": user, "thread_id": thread_id} if thread_id else {"user_id": user}
        live = streamed(agent, {"input": [{"role": "user", "content": f"a secret of {user}"}], "custom_inputs": custom})
        return live[0]["response"]["id"], live[-1]["custom_outputs"]["thread_id"]

    (first, thread_id), (kept, _) = turn("alice"), turn("bob")
    second, _ = turn("alice", thread_id)
    for gone in (first, second):
        assert agent.runs.store.rows(gone, -1)
    if deletion == "delete_thread":
        agent.delete_thread(thread_id, user_id="alice")
    elif deletion == "delete_user_data":
        agent.delete_user_data("alice")
    else:
        agent.update_thread(thread_id, user_id="alice", ttl_seconds=60)  # expires before bob's
        swept = agent.sweep_expired_threads(now=datetime.now(timezone.utc) + timedelta(seconds=600))
        assert swept["deleted_thread_ids"] == [thread_id]
    for gone in (first, second):
        assert agent.runs.store.get(gone) is None and agent.runs.store.rows(gone, -1) == []
    assert agent.runs.get(kept, "bob").status == "completed" and agent.runs.store.rows(kept, -1)  # another user's stays


def test_deleting_a_thread_deletes_its_runs_that_ended_without_committing(agent):
    thread_id = streamed(agent, {"input": "Hi"})[-1]["custom_outputs"]["thread_id"]

    async def leave_after_first_delta() -> str:
        events = agent.apredict_stream({"input": "Tell me about Lisbon " * 10, "custom_inputs": {"thread_id": thread_id}},
                                       openai_events=True)  # fmt: skip
        async for event in events:
            if event.type == "response.created":
                response_id = event.model_dump()["response"]["id"]
            if event.type == "response.output_text.delta":
                await events.aclose()
                return response_id
        raise AssertionError("no delta")

    left = asyncio.run(leave_after_first_delta())
    assert agent.runs.store.get(left).status == "cancelled" and agent.runs.store.rows(left, -1)
    agent.delete_thread(thread_id)
    assert agent.runs.store.get(left) is None and agent.runs.store.rows(left, -1) == []


def waiters(url: str, thread_id: str) -> int:
    """The thread's tickets in its claim queue (`agent_claim_waiters`): the turns waiting for it."""
    statement = "SELECT count(*) FROM agent_claim_waiters WHERE thread_id = {}"
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as conn:
            return conn.execute(statement.format("%s"), (thread_id,)).fetchone()[0]
    import sqlite3

    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return conn.execute(statement.format("?"), (thread_id,)).fetchone()[0]


def eventually(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_run_queued_for_its_thread_stops_waiting_at_once_when_another_replica_cancels_it(backend_url, make_agent):
    agent = make_agent(backend_url, multitask_strategy="enqueue", enqueue_timeout=60)
    thread_id = outputs_of(agent.predict({"input": "Hi", "custom_inputs": {"thread_id": "t-queued"}}))["thread_id"]
    before = agent.get_checkpoint_history(thread_id)
    held = agent.storage.claim(thread_id, user_id=None, checkpoint_id=None, strategy="reject", timeout=0)  # a turn running
    try:
        queued = agent.predict({"input": "Write a poem", "custom_inputs": {"background": True, "thread_id": thread_id}})
        response_id = queued.id
        assert eventually(lambda: waiters(backend_url, thread_id) == 1)
        # Another replica cancels it: a write to the database, nothing else (this process learns it from there).
        assert agent.runs.store.cancel_queued(response_id)
        # It stops waiting while the thread is still held: out of the thread's queue, its task ended.
        assert eventually(lambda: waiters(backend_url, thread_id) == 0 and agent.runs.local(response_id) is None)
    finally:
        agent.storage.release(held)
    run = agent.runs.get(response_id, None)
    assert (run.status, run.code) == ("cancelled", "cancelled") and "before it started" in run.reason
    time.sleep(0.5)  # had it still waited, it would claim the thread now
    assert agent.get_checkpoint_history(thread_id) == before and agent.runs.get(response_id, None).status == "cancelled"
    follow_up = agent.predict({"input": "Still there?", "custom_inputs": {"thread_id": thread_id, "multitask_strategy": "reject"}})
    assert outputs_of(follow_up)["parent_checkpoint_id"] == before[0]["checkpoint_id"]  # the thread is free


def outputs_of(response) -> dict:
    return response.custom_outputs


def ended(agent, response_id: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 20
    while (run := agent.runs.get(response_id, None)).status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
    return run


def test_background_and_cancel_answers_name_the_thread_and_the_steer_outcome_as_a_foreground_turn_does(agent):
    thread_id = outputs_of(agent.predict({"input": "Hi", "custom_inputs": {"thread_id": "t-outputs"}}))["thread_id"]
    steer = {"thread_id": thread_id, "multitask_strategy": "steer"}
    # On an idle thread a steering request runs as a turn of its own: `steer: "new_turn"`, in the foreground ...
    foreground = outputs_of(agent.predict({"input": "In front", "custom_inputs": steer}))
    assert foreground["steer"] == "new_turn"
    # ... and in the background: its queued answer names its thread, its retrieved answer the same fields.
    queued = agent.predict({"input": "Behind", "custom_inputs": {**steer, "background": True}})
    assert outputs_of(queued) == {"response_id": queued.id, "background": True, "thread_id": thread_id}
    assert ended(agent, queued.id).status == "completed"
    background = run_views.retrieve(agent, queued.id, None)["custom_outputs"]
    assert background.pop("background") is True
    assert background.keys() == foreground.keys() and background["steer"] == "new_turn"
    assert background["thread_id"] == thread_id and background["parent_checkpoint_id"] == foreground["checkpoint_id"]

    # A cancelled run (here while it waited for its thread) names its thread, and no checkpoint: nothing written.
    held = agent.storage.claim(thread_id, user_id=None, checkpoint_id=None, strategy="reject", timeout=0)
    try:
        waiting = agent.predict({"input": "Never", "custom_inputs": {"thread_id": thread_id, "background": True,
                                                                     "multitask_strategy": "enqueue"}})  # fmt: skip
        cancelled = run_views.cancel(agent, waiting.id, None)
    finally:
        agent.storage.release(held)
    assert cancelled["status"] == "cancelled"
    assert cancelled["custom_outputs"] == {
        "response_id": waiting.id, "background": True, "thread_id": thread_id, "checkpoint_id": None,
        "code": "cancelled", "reason": cancelled["custom_outputs"]["reason"], "written": False,
    }  # fmt: skip
    assert run_views.retrieve(agent, waiting.id, None)["custom_outputs"] == cancelled["custom_outputs"]


def run_rows(url: str) -> int:
    """The run records of the database (`agent_runs`)."""
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as conn:
            return conn.execute("SELECT count(*) FROM agent_runs").fetchone()[0]
    import sqlite3

    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return conn.execute("SELECT count(*) FROM agent_runs").fetchone()[0]


def test_a_background_turn_from_an_unknown_checkpoint_or_thread_is_refused_at_once_and_records_no_run(
    backend_url, make_agent
):
    # A new-user trial got `queued` (a run record written) and a run that failed later, with `server_error`.
    agent = make_agent(backend_url)
    thread_id = outputs_of(agent.predict({"input": "Hi", "custom_inputs": {"user_id": "alice"}}))["thread_id"]
    runs, rows = run_rows(backend_url), all_rows(backend_url)
    refused = (
        ({"thread_id": thread_id, "checkpoint_id": "abc", "user_id": "alice"}, CheckpointNotFound),
        ({"thread_id": thread_id, "user_id": "mallory"}, ThreadNotFound),  # another user's thread
        ({"thread_id": "no-such-thread", "checkpoint_id": "abc"}, ThreadNotFound),
    )
    for custom, error in refused:
        with pytest.raises(error):
            agent.predict({"input": "Again", "custom_inputs": {**custom, "background": True}})
    assert run_rows(backend_url) == runs and all_rows(backend_url) == rows


def test_a_failed_background_run_answers_its_own_code_in_custom_outputs_and_openais_in_error(tmp_path, make_agent):
    agent = make_agent(f"sqlite:///{tmp_path / 'checkpoints.sqlite'}", model=FailingChatModel(failures=[1]))
    queued = agent.predict({"input": "Hi", "custom_inputs": {"background": True}})
    assert ended(agent, queued.id).status == "failed"
    failed = run_views.retrieve(agent, queued.id, None)
    assert failed["custom_outputs"]["code"] == "unavailable"  # the model failed
    # OpenAI's Response allows only its own codes in `error`: an OpenAI client must be able to read the run.
    assert failed["error"]["code"] == "server_error"
    Response.model_validate(failed)


@pytest.mark.parametrize("table", ["agent_runs", "agent_run_events"])
def test_a_dropped_run_table_is_created_again_by_setups_repair_and_the_stream_is_recorded(backend_url, make_agent, table):
    agent = make_agent(backend_url)
    streamed(agent, {"input": [{"role": "user", "content": "first"}], "custom_inputs": {"user_id": "alice"}})
    drop_table(backend_url, table)  # by hand, as an operator might
    live = streamed(agent, {"input": [{"role": "user", "content": "second"}], "custom_inputs": {"user_id": "alice"}})
    response_id = live[0]["response"]["id"]
    assert followed(agent, response_id, "alice") == live
    assert agent.runs.get(response_id, "alice").status == "completed"


def drop_table(url: str, table: str) -> None:
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")  # a fixed name from the test's parameters
    else:
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(f"DROP TABLE {table}")
