"""Thread ownership, on Postgres and SQLite.

A thread belongs to the user_id that first wrote it. Anyone else, anonymous
callers included, gets ThreadNotFound from every operation, worded exactly as
for a thread that does not exist, and changes nothing. Threads written without
a user_id are open to anonymous callers only.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from langchain_core.messages import HumanMessage

from agent.errors import AgentError, InvalidRequest, ThreadBusy, ThreadNotFound
from agent.serving.errors import http_status
from agent.models import OfflineChatModel
from tests.helpers.reliability import HANG_TIMEOUT, all_rows, gated_model, head_messages, user_texts
from tests.helpers.scenario import outputs, request, say, text_of

INTRUDERS = ["bob", None]  # another user, and an anonymous caller
TOKYO = [{"role": "user", "content": "I'm headed to Tokyo!"}]


def first_write(agent, user_id: str | None, how: str = "custom_inputs") -> dict:
    """Two turns on a new thread written as `user_id`; returns thread_id, first and head checkpoint ids."""
    body = request("I'm headed to SF!")
    if how == "context" and user_id is not None:
        body["context"] = {"user_id": user_id}
    elif user_id is not None:
        body["custom_inputs"] = {"user_id": user_id}
    first = outputs(agent.predict(body))
    second = outputs(say(agent, "Where am I going?", thread_id=first["thread_id"], user_id=user_id))
    return {"thread_id": first["thread_id"], "first": first["checkpoint_id"], "head": second["checkpoint_id"]}


def operations(agent, thread_id: str, checkpoint_id: str, user_id: str | None) -> dict:
    """Every operation on a thread, as `user_id`; each a callable that raises or returns."""
    def turn(**custom):
        return lambda: say(agent, "let me in", thread_id=thread_id, user_id=user_id, **custom)

    def stream(**custom):
        return lambda: list(agent.predict_stream(request("let me in", thread_id=thread_id, user_id=user_id, **custom)))

    def action(name, stream_it=False, items=None, **custom):
        body = {"input": items or [], "custom_inputs": {"action": name, "thread_id": thread_id, **custom}}
        if user_id is not None:
            body["custom_inputs"]["user_id"] = user_id
        if stream_it:
            return lambda: list(agent.predict_stream(body))
        return lambda: agent.predict(body)

    return {
        "predict": turn(),
        "predict from a checkpoint": turn(checkpoint_id=checkpoint_id),
        "predict_stream": stream(),
        "predict_stream from a checkpoint": stream(checkpoint_id=checkpoint_id),
        "get_checkpoint_history": lambda: agent.get_checkpoint_history(thread_id, user_id=user_id),
        "get_checkpoint_history before": lambda: agent.get_checkpoint_history(
            thread_id, before=checkpoint_id, user_id=user_id
        ),
        "update_checkpoint_state": lambda: agent.update_checkpoint_state(thread_id, None, TOKYO, user_id=user_id),
        "update_checkpoint_state at a checkpoint": lambda: agent.update_checkpoint_state(
            thread_id, checkpoint_id, TOKYO, user_id=user_id
        ),
        "delete_thread": lambda: agent.delete_thread(thread_id, user_id=user_id),
        "action get_checkpoint_history": action("get_checkpoint_history"),
        "action get_checkpoint_history streamed": action("get_checkpoint_history", stream_it=True),
        "action update_checkpoint_state": action("update_checkpoint_state", items=TOKYO, checkpoint_id=checkpoint_id),
        "action delete_thread": action("delete_thread"),
        "action delete_thread streamed": action("delete_thread", stream_it=True),
    }


def error_of(call) -> AgentError:
    with pytest.raises(AgentError) as caught:
        call()
    return caught.value


def snapshot(agent, thread_id: str, user_id: str | None) -> tuple:
    history = agent.get_checkpoint_history(thread_id, limit=100, user_id=user_id)
    return tuple(h["checkpoint_id"] for h in history), agent.storage.get_thread(thread_id)


@pytest.mark.parametrize("how", ["custom_inputs", "context"])
@pytest.mark.parametrize("intruder", INTRUDERS, ids=["other user", "anonymous"])
def test_someone_else_is_told_the_thread_does_not_exist_by_every_operation(agent, backend_url, how, intruder):
    alice = first_write(agent, "alice", how)
    before, rows = snapshot(agent, alice["thread_id"], "alice"), all_rows(backend_url)
    missing = f"missing-{uuid.uuid4()}"
    theirs = operations(agent, alice["thread_id"], alice["first"], intruder)
    nobodys = operations(agent, missing, alice["first"], intruder)

    for name, call in theirs.items():
        error = error_of(call)
        assert isinstance(error, ThreadNotFound), f"{name}: {error!r}"
        assert http_status(error) == 404
        assert error.ids.get("thread_id") == alice["thread_id"]
        if name in ("predict", "predict_stream"):
            continue  # a turn on a thread id nobody used starts that thread: nothing to compare with
        # Worded exactly as for a thread that does not exist, so nothing tells them apart.
        expected = error_of(nobodys[name])
        assert type(error) is type(expected), name
        assert error.message.replace(alice["thread_id"], "<id>") == expected.message.replace(missing, "<id>"), name

    assert snapshot(agent, alice["thread_id"], "alice") == before
    assert all_rows(backend_url) == rows
    assert agent.storage.get_thread(missing) is None


def test_the_owner_can_do_everything_the_others_cannot(agent):
    alice = first_write(agent, "alice")
    ops = operations(agent, alice["thread_id"], alice["first"], "alice")
    for name, call in ops.items():
        if "delete" not in name:
            call()
    ops["delete_thread"]()
    assert agent.storage.get_thread(alice["thread_id"]) is None


def test_the_owner_is_the_first_writer_and_never_changes(agent):
    alice = first_write(agent, "alice")
    assert agent.storage.get_thread(alice["thread_id"]).user_id == "alice"
    say(agent, "still me", thread_id=alice["thread_id"], user_id="alice")
    agent.update_checkpoint_state(alice["thread_id"], alice["first"], TOKYO, user_id="alice")
    assert agent.storage.get_thread(alice["thread_id"]).user_id == "alice"


@pytest.mark.parametrize("intruder", ["alice", "bob"])
def test_anonymous_threads_are_open_to_anonymous_callers_only(agent, intruder):
    anon = first_write(agent, None)
    say(agent, "anyone anonymous may continue", thread_id=anon["thread_id"])
    assert agent.storage.get_thread(anon["thread_id"]).user_id is None
    for name, call in operations(agent, anon["thread_id"], anon["first"], intruder).items():
        assert isinstance(error_of(call), ThreadNotFound), name


def test_a_busy_thread_does_not_tell_someone_else_it_exists(backend_url, make_agent):
    """Refusing a turn because the thread is busy would reveal that it exists: others get ThreadNotFound."""
    model = gated_model()
    agent = make_agent(backend_url, model=model, enqueue_timeout=0.2)
    alice = first_write(agent, "alice")
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(say, agent, "block while bob knocks", thread_id=alice["thread_id"], user_id="alice")
        assert model.entered.wait(HANG_TIMEOUT)
        try:
            for strategy in ("reject", "enqueue"):
                with pytest.raises(ThreadBusy):
                    say(agent, "me again", thread_id=alice["thread_id"], user_id="alice", multitask_strategy=strategy)
                for intruder in INTRUDERS:
                    with pytest.raises(ThreadNotFound):
                        say(agent, "hi", thread_id=alice["thread_id"], user_id=intruder, multitask_strategy=strategy)
                    with pytest.raises(ThreadNotFound):
                        agent.update_checkpoint_state(alice["thread_id"], None, TOKYO, user_id=intruder)
                    with pytest.raises(ThreadNotFound):
                        agent.delete_thread(alice["thread_id"], user_id=intruder)
        finally:
            model.gate.set()
        held.result(timeout=HANG_TIMEOUT)
    assert user_texts(head_messages(agent, alice["thread_id"]))[-1] == "block while bob knocks"


def test_require_user_id_refuses_requests_without_one_and_writes_nothing(backend_url, make_agent):
    agent = make_agent(backend_url, require_user_id=True)
    alice = first_write(agent, "alice")
    rows = all_rows(backend_url)
    calls = {
        "predict": lambda: say(agent, "hi"),
        "predict on a thread": lambda: say(agent, "hi", thread_id=alice["thread_id"]),
        "predict_stream": lambda: list(agent.predict_stream(request("hi"))),
        "empty context": lambda: agent.predict({**request("hi"), "context": {}}),
        **{
            name: call
            for name, call in operations(agent, alice["thread_id"], alice["first"], None).items()
            if not name.startswith(("predict ", "predict_stream "))
        },
    }
    for name, call in calls.items():
        error = error_of(call)
        assert isinstance(error, InvalidRequest), f"{name}: {error!r}"
        assert "user_id" in error.message
    assert all_rows(backend_url) == rows
    # With one, it works.
    assert "Tokyo" in text_of(say(agent, "I'm headed to Tokyo!", user_id="carol"))


@pytest.mark.parametrize("strategy", ["enqueue", "reject"])
def test_racing_first_writes_to_a_new_thread_have_exactly_one_winner(backend_url, make_agent, strategy):
    agent = make_agent(backend_url, model=OfflineChatModel(latency_ms=50))
    for _ in range(3):
        thread_id = f"race-{uuid.uuid4()}"
        barrier = threading.Barrier(2)

        def first(user_id: str):
            barrier.wait()
            try:
                return say(agent, f"{user_id} was here", thread_id=thread_id, user_id=user_id, multitask_strategy=strategy)
            except AgentError as exc:
                return exc

        with ThreadPoolExecutor(2) as pool:
            results = dict(zip(("alice", "bob"), pool.map(first, ("alice", "bob"))))

        winners = [user for user, result in results.items() if not isinstance(result, Exception)]
        assert len(winners) == 1, results
        (loser,) = set(results) - set(winners)
        allowed = (ThreadNotFound,) if strategy == "enqueue" else (ThreadNotFound, ThreadBusy)
        assert isinstance(results[loser], allowed), results[loser]
        assert agent.storage.get_thread(thread_id).user_id == winners[0]
        assert user_texts(head_messages(agent, thread_id)) == [f"{winners[0]} was here"]
        assert all(isinstance(m, HumanMessage) or f"{loser} was here" not in m.text for m in head_messages(agent, thread_id))


def test_a_client_cannot_name_another_user_than_the_host_put_in_context(backend_url, make_agent):
    # Found by trying it: custom_inputs.user_id used to win over the host's context.user_id.
    agent = make_agent(backend_url)
    alice = first_write(agent, "alice")
    rows = all_rows(backend_url)
    as_bob_claiming_alice = {
        **request("let me in", thread_id=alice["thread_id"], user_id="alice"),
        "context": {"user_id": "bob"},
    }
    with pytest.raises(InvalidRequest, match="disagree"):
        agent.predict(as_bob_claiming_alice)
    with pytest.raises(InvalidRequest, match="disagree"):
        agent.predict(
            {
                "input": [],
                "context": {"user_id": "bob"},
                "custom_inputs": {"action": "get_checkpoint_history", "thread_id": alice["thread_id"], "user_id": "alice"},
            }
        )
    assert all_rows(backend_url) == rows
    same = {**request("me again", thread_id=alice["thread_id"], user_id="alice"), "context": {"user_id": "alice"}}
    assert outputs(agent.predict(same))["thread_id"] == alice["thread_id"]
