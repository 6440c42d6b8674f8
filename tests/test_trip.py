"""The trip scenario end to end, on Postgres and SQLite."""

from __future__ import annotations

import uuid

import pytest

from agent import ThreadNotFound
from tests.helpers.scenario import TRIP, outputs, run_trip, say, text_of


def test_thread_remembers_earlier_turns(agent):
    ids = run_trip(agent)
    assert "SF" in ids["answer"]
    assert TRIP[0] in ids["answer"]


def test_branch_from_first_turn_sees_new_york_not_sf(agent):
    ids = run_trip(agent)
    branched = say(agent, "I'm headed to New York!", thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    assert outputs(branched)["thread_id"] == ids["thread_id"]
    assert outputs(branched)["parent_checkpoint_id"] == ids["after_turn1"]
    answer = say(agent, "Where am I going?", thread_id=ids["thread_id"])
    assert outputs(answer)["parent_checkpoint_id"] == outputs(branched)["checkpoint_id"]
    assert "New York" in text_of(answer) and "SF" not in text_of(answer)
    listed = {entry["checkpoint_id"] for entry in agent.get_checkpoint_history(ids["thread_id"], limit=50)}
    assert ids["after_turn3"] in listed  # the SF branch is still there


def test_update_checkpoint_state_makes_new_head(agent):
    ids = run_trip(agent)
    updated = agent.update_checkpoint_state(
        ids["thread_id"], ids["after_turn1"], [{"role": "user", "content": "I'm headed to Tokyo!"}]
    )
    assert updated["parent_checkpoint_id"] == ids["after_turn1"]
    answer = say(agent, "Where am I going?", thread_id=ids["thread_id"])
    assert outputs(answer)["parent_checkpoint_id"] == updated["checkpoint_id"]
    assert "Tokyo" in text_of(answer) and "SF" not in text_of(answer)


# --- which thread a request goes to ---------------------------------------------------------


def test_context_conversation_id_is_the_thread_id(agent):
    conversation_id = f"conversation-{uuid.uuid4()}"
    context = {"conversation_id": conversation_id}
    first = agent.predict({"input": [{"role": "user", "content": TRIP[1]}], "context": context})
    assert outputs(first)["thread_id"] == conversation_id
    root = outputs(first)["parent_checkpoint_id"]  # a new thread starts from its empty root checkpoint
    second = agent.predict({"input": [{"role": "user", "content": TRIP[2]}], "context": context})
    assert outputs(second)["thread_id"] == conversation_id
    assert outputs(second)["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]
    assert "SF" in text_of(second)
    history = agent.get_checkpoint_history(conversation_id)
    assert [e["checkpoint_id"] for e in history] == [outputs(second)["checkpoint_id"], outputs(first)["checkpoint_id"], root]


def test_custom_inputs_thread_id_wins_over_conversation_id(agent):
    ids = run_trip(agent)
    conversation_id = f"conversation-{uuid.uuid4()}"
    answer = agent.predict(
        {
            "input": [{"role": "user", "content": "Where am I going?"}],
            "custom_inputs": {"thread_id": ids["thread_id"]},
            "context": {"conversation_id": conversation_id},
        }
    )
    assert outputs(answer)["thread_id"] == ids["thread_id"]
    assert outputs(answer)["parent_checkpoint_id"] == ids["after_turn3"]
    assert "SF" in text_of(answer)
    with pytest.raises(ThreadNotFound):
        agent.get_checkpoint_history(conversation_id)


def test_request_without_thread_or_conversation_id_starts_a_fresh_thread(agent):
    first = say(agent, TRIP[1])
    second = say(agent, TRIP[2])
    threads = [outputs(first)["thread_id"], outputs(second)["thread_id"]]
    assert threads[0] != threads[1]
    for thread_id in threads:
        assert str(uuid.UUID(thread_id)) == thread_id
    root = outputs(second)["parent_checkpoint_id"]
    assert "SF" not in text_of(second)  # nothing carried over from the other thread
    history = agent.get_checkpoint_history(threads[1])
    assert [(e["checkpoint_id"], e["source"]) for e in history] == [(outputs(second)["checkpoint_id"], "loop"), (root, "root")]


def test_branch_on_a_conversation_id_thread(agent):
    conversation_id = f"conversation-{uuid.uuid4()}"
    context = {"conversation_id": conversation_id}
    first = agent.predict({"input": [{"role": "user", "content": TRIP[0]}], "context": context})
    agent.predict({"input": [{"role": "user", "content": TRIP[1]}], "context": context})
    branched = agent.predict(
        {
            "input": [{"role": "user", "content": "I'm headed to New York!"}],
            "custom_inputs": {"checkpoint_id": outputs(first)["checkpoint_id"]},
            "context": context,
        }
    )
    assert outputs(branched)["thread_id"] == conversation_id
    assert outputs(branched)["parent_checkpoint_id"] == outputs(first)["checkpoint_id"]
    assert "New York" in text_of(branched) and "SF" not in text_of(branched)
