"""`include: ["state"]` (`agent.operations.render`), on Postgres and SQLite: a turn's result and the answer of an
action that writes carry what a client re-renders (the messages from the first that changed, placed, with
their alternatives, and the head), and applied to what the client showed they equal a whole
`get_checkpoint_state`; without `include` the answers stay as small as before."""

from __future__ import annotations

import pytest

from agent.errors import InvalidRequest
from tests.helpers.render import rendered
from tests.helpers.scenario import TRIP, outputs, request, run_trip, say


def shown(agent, thread_id: str) -> list[dict]:
    return agent.get_checkpoint_state(thread_id)["messages"]


def test_a_turn_carries_its_two_new_messages_and_the_client_renders_the_whole_head_from_them(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    before = shown(agent, thread_id)
    result = outputs(say(agent, "And then Tokyo!", thread_id=thread_id, include=["state"]))
    state = result["state"]
    assert state["checkpoint_id"] == state["head_checkpoint_id"] == result["checkpoint_id"]
    assert state["message_offset"] == len(before) == 6 and len(state["messages"]) == 2
    assert rendered(before, state) == shown(agent, thread_id)


def test_an_edit_and_a_regeneration_carry_the_message_they_change_and_what_follows(agent):
    thread_id = run_trip(agent)["thread_id"]
    before = shown(agent, thread_id)
    edited = outputs(say(agent, "I'm headed to LA!", thread_id=thread_id, edit_message_id=before[2]["id"], include=["state"]))
    state = edited["state"]
    assert state["message_offset"] == 2 and state["messages"][0]["alternatives"]["count"] == 2  # the original and the edit
    assert rendered(before, state) == (now := shown(agent, thread_id))
    regenerated = outputs(
        agent.predict(request(None, thread_id=thread_id, regenerate_message_id=now[3]["id"], include=["state"]))
    )
    state = regenerated["state"]
    # From the user message on: a turn writes it with its answer, so the regeneration places it anew.
    assert state["message_offset"] == 2 and state["messages"][1]["alternatives"]["count"] == 2  # two answers to LA
    assert rendered(now, state) == shown(agent, thread_id)


def test_set_head_carries_the_messages_from_where_the_branches_part_and_changes_no_earlier_message(agent):
    thread_id = run_trip(agent)["thread_id"]
    original = shown(agent, thread_id)
    say(agent, "I'm headed to LA!", thread_id=thread_id, edit_message_id=original[2]["id"])
    now = shown(agent, thread_id)
    back = now[2]["alternatives"]["options"][0]["latest_checkpoint_id"]
    move = agent.set_head(thread_id, back, include=["state"])
    assert move["state"]["message_offset"] == 2 and move["state"]["head_checkpoint_id"] == back
    assert rendered(now, move["state"], wrote=False) == (after := shown(agent, thread_id))
    assert [item["id"] for item in after] == [item["id"] for item in original]
    assert "state" not in agent.set_head(thread_id, back)  # the default stays small


def test_a_state_update_and_a_fork_carry_their_checkpoint_as_the_action_answers(agent):
    thread_id = run_trip(agent)["thread_id"]
    before = shown(agent, thread_id)
    answer = agent.predict(
        request(None, action="update_checkpoint_state", thread_id=thread_id, remove_message_ids=[before[4]["id"]], include=["state"])
    )
    state = outputs(answer)["state"]
    # The last user message removed: the four items before it stay, its answer is placed anew.
    assert state["message_offset"] == 4 and [item["id"] for item in state["messages"]] == [before[5]["id"]]
    assert rendered(before, state) == shown(agent, thread_id)
    fork = agent.fork_thread(thread_id, include=["state"])
    assert fork["state"]["thread_id"] == fork["thread_id"] and fork["state"]["message_offset"] == 0
    assert fork["state"]["messages"] == shown(agent, fork["thread_id"]) and len(fork["state"]["messages"]) == 5


def test_a_streamed_turn_carries_the_state_on_its_last_event(agent):
    thread_id = run_trip(agent)["thread_id"]
    before = shown(agent, thread_id)
    events = list(agent.predict_stream(request("And then Tokyo!", thread_id=thread_id, include=["state"])))
    state = events[-1].custom_outputs["state"]
    assert rendered(before, state) == shown(agent, thread_id)
    plain = list(agent.predict_stream(request("And Kyoto.", thread_id=thread_id)))
    assert "state" not in plain[-1].custom_outputs


def test_an_include_other_than_a_list_of_known_names_is_refused_and_nothing_is_written(agent):
    thread_id = outputs(say(agent, TRIP[0]))["thread_id"]
    history = agent.get_checkpoint_history(thread_id, limit=100)
    for include in (["everything"], "state", [1], {"state": True}):
        with pytest.raises(InvalidRequest, match="include"):
            say(agent, TRIP[1], thread_id=thread_id, include=include)
        with pytest.raises(InvalidRequest, match="include"):
            agent.set_head(thread_id, history[-1]["checkpoint_id"], include=include)
    assert agent.get_checkpoint_history(thread_id, limit=100) == history
