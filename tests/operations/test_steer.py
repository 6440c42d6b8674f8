"""Steering (`multitask_strategy="steer"`): a message sent while a turn runs joins that turn before its next
model call, in order, and otherwise runs as the next turn; the request's answer says which.

Shown on Postgres and SQLite: a turn held in a slow tool call takes the steered message after the tool
result, in exactly one follow-on model call; a turn already in its last model call leaves it to run next;
a running turn that dies leaves it to run too (the offer is a row in the database, bound to the dead claim);
and a property test drives random steer / enqueue / interrupt interleavings on one thread against the plain
rule that every user message is in the thread exactly once, in the order the requests arrived.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool

from agent.models import OfflineChatModel
from tests.helpers.claims import TOKEN, other_replica_holds
from tests.helpers.offline import RecordingOfflineModel
from tests.helpers.reliability import HANG_TIMEOUT, gated_model, head_messages, user_texts
from tests.helpers.scenario import outputs, say


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def offered_to(agent, thread_id: str, target: str) -> bool:
    """Whether a steering request's messages wait for the running turn whose claim token is `target`."""
    return bool(agent.storage.steered_messages(thread_id, target))


def running_claim(agent, thread_id: str):
    wait_until(lambda: agent.storage.keeper.local(thread_id) is not None, "the turn holds its thread")
    return agent.storage.keeper.local(thread_id)


def test_a_message_steered_during_a_slow_tool_call_joins_the_turn_after_the_tool_result(backend_url, make_agent):
    gate, entered = threading.Event(), threading.Event()

    @tool
    def slow_lookup() -> str:
        """Looks something up, slowly."""
        entered.set()
        gate.wait(HANG_TIMEOUT)
        return "the lookup's answer"

    model = RecordingOfflineModel()
    agent = make_agent(backend_url, model=model, tools=[slow_lookup])
    thread_id = outputs(say(agent, "start"))["thread_id"]
    calls_before = len(model.turn_calls())
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(say, agent, "use slow_lookup {}", thread_id=thread_id)
        try:
            assert entered.wait(HANG_TIMEOUT)
            claim = running_claim(agent, thread_id)
            steering = pool.submit(say, agent, "and also this", thread_id=thread_id, multitask_strategy="steer")
            wait_until(lambda: offered_to(agent, thread_id, claim.token), "the steered message is offered")
        finally:
            gate.set()
        first, steered = outputs(running.result(HANG_TIMEOUT)), steering.result(HANG_TIMEOUT)

    # One follow-on model call, which sees the tool result and then the steered message.
    calls = model.turn_calls()[calls_before:]
    assert len(calls) == 2
    *_, result, message = calls[1]
    assert isinstance(result, ToolMessage) and result.content == "the lookup's answer"
    assert isinstance(message, HumanMessage) and message.text == "and also this"
    # The steering request joined that turn: its answer names the turn's checkpoint and carries the reply.
    assert outputs(steered)["steer"] == "joined"
    assert outputs(steered)["checkpoint_id"] == first["checkpoint_id"]
    assert outputs(steered)["response_id"] == first["response_id"]
    assert '3. "and also this"' in steered.output[-1].content[0]["text"]
    assert user_texts(head_messages(agent, thread_id)) == ["start", "use slow_lookup {}", "and also this"]
    assert agent.storage.steered_messages(thread_id, claim.token) == []  # settled: nothing left behind
    # The steered message was written once, by the turn it joined: one checkpoint for both.
    assert [e["checkpoint_id"] for e in agent.get_checkpoint_history(thread_id)][:2] == [
        first["checkpoint_id"],
        first["parent_checkpoint_id"],
    ]


def test_a_message_steered_during_the_last_model_call_starts_the_next_turn(backend_url, make_agent):
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(say, agent, "block: answer slowly", thread_id=thread_id)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            claim = running_claim(agent, thread_id)
            steering = pool.submit(say, agent, "one more thing", thread_id=thread_id, multitask_strategy="steer")
            wait_until(lambda: offered_to(agent, thread_id, claim.token), "the steered message is offered")
        finally:
            model.gate.set()
        first, steered = outputs(running.result(HANG_TIMEOUT)), outputs(steering.result(HANG_TIMEOUT))

    assert steered["steer"] == "new_turn"
    assert steered["parent_checkpoint_id"] == first["checkpoint_id"]
    assert user_texts(head_messages(agent, thread_id)) == ["start", "block: answer slowly", "one more thing"]
    # On an idle thread a steering request is a turn at once.
    idle = outputs(say(agent, "and then", thread_id=thread_id, multitask_strategy="steer"))
    assert idle["steer"] == "new_turn" and idle["parent_checkpoint_id"] == steered["checkpoint_id"]


def test_a_message_steered_into_a_turn_whose_replica_dies_is_run_as_the_next_turn(backend_url, make_agent):
    agent = make_agent(backend_url)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    holder = other_replica_holds(backend_url, thread_id)
    holder.__enter__()
    try:
        with ThreadPoolExecutor(1) as pool:
            steering = pool.submit(say, agent, "are you there?", thread_id=thread_id, multitask_strategy="steer")
            # The offer is in the database, where the replica running the turn reads it.
            wait_until(lambda: offered_to(agent, thread_id, TOKEN), "the steered message is offered")
            holder.__exit__(None, None, None)  # that replica dies without committing: nothing of its turn is written
            holder = None
            steered = outputs(steering.result(HANG_TIMEOUT))
    finally:
        if holder is not None:
            holder.__exit__(None, None, None)
    assert steered["steer"] == "new_turn"
    assert user_texts(head_messages(agent, thread_id)) == ["start", "are you there?"]


# -- random interleavings ---------------------------------------------------------------------------------
def messages_at(agent, thread_id: str, checkpoint_id: str) -> list:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    return list(agent.graph.get_state(config).values.get("messages", []))


@pytest.fixture(scope="module")
def interleaving_agent():
    from agent import create_agent

    # A model slow enough for requests to meet, with the calculator for tool rounds (safe points).
    with create_agent("memory://", model=OfflineChatModel(latency_ms=15), tracing=False, enqueue_timeout=60) as agent:
        arrivals: list[str] = []
        lock = threading.Lock()
        try_claim = agent.storage._try_claim

        def recording(thread_id, token, **kwargs):
            attempt = try_claim(thread_id, token, **kwargs)
            # A request's first attempt claims, or queues, in that round trip: it has arrived once the attempt
            # returns (counted before it, the next request could queue first).
            with lock:
                if token not in arrivals:
                    arrivals.append(token)
            return attempt

        agent.storage._try_claim = recording
        yield agent, arrivals


REQUEST = st.tuples(
    st.sampled_from(["steer", "enqueue", "interrupt"]),
    st.booleans(),  # the turn calls a tool (one more model call: a safe point to join)
    st.sampled_from([0.0, 0.005, 0.02, 0.05]),  # seconds before the next request is sent
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(REQUEST, min_size=2, max_size=5))
def test_steer_enqueue_and_interrupt_keep_every_user_message_once_in_arrival_order(interleaving_agent, requests):
    agent, arrivals = interleaving_agent
    thread_id = outputs(say(agent, "m0"))["thread_id"]
    texts = [f'use calculator {{"expression": "{i}"}}' if uses_tool else f"m{i}" for i, (_, uses_tool, _) in
             enumerate(requests, start=1)]  # fmt: skip
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = []
        for text, (strategy, _, pause) in zip(texts, requests):
            arrived = len(arrivals)
            answers.append(pool.submit(say, agent, text, thread_id=thread_id, multitask_strategy=strategy))
            # Sent one after another: each request has arrived (claimed or queued) before the next is sent.
            wait_until(lambda: len(arrivals) > arrived or answers[-1].done(), "the request arrives")
            time.sleep(pause)
        results = [outputs(answer.result(HANG_TIMEOUT)) for answer in answers]

    # The plain-Python model: the thread holds every user message exactly once, in the order sent.
    assert user_texts(head_messages(agent, thread_id)) == ["m0", *texts]
    # A request that ran its own turn sent a message the thread did not hold yet; one that joined answers
    # with the checkpoint of an earlier request's turn.
    own = {}
    for text, (strategy, _, _), result in zip(texts, requests, results, strict=True):
        if strategy != "steer":
            assert "steer" not in result
        if "steer" in result:
            event(f"steer {result['steer']}")  # both outcomes come up (pytest --hypothesis-show-statistics)
        if result.get("steer") == "joined":
            assert result["checkpoint_id"] in own
            assert text in user_texts(messages_at(agent, thread_id, result["checkpoint_id"]))
            continue
        assert result.get("steer", "new_turn") == "new_turn"
        assert text not in user_texts(messages_at(agent, thread_id, result["parent_checkpoint_id"]))
        own[result["checkpoint_id"]] = text
    # One linear chain: every turn (or joined group) starts where the one before it ended.
    entries = agent.get_checkpoint_history(thread_id, limit=100)
    assert [e["parent_checkpoint_id"] for e in entries[:-1]] == [e["checkpoint_id"] for e in entries[1:]]
