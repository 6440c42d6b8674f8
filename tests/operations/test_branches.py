"""Branch operations through the Python API and `predict`, on Postgres and SQLite: the root, reading a
checkpoint's state, edit (the first message too), regenerate, replace and remove, list and switch
branches, fork into a new thread, compare.

Exact reply texts go through `tests.operations.test_properties._expected_reply` (the offline model's rule).
"""

from __future__ import annotations

import asyncio

import pytest

from agent.errors import InvalidRequest
from agent.operations.branches import get_checkpoint_state
from tests.helpers.scenario import TRIP, outputs, request, run_trip, say, text_of
from tests.helpers.stored_values import STORED_VALUES
from tests.operations.test_properties import _expected_reply

ITEM_PLACE_KEYS = {"checkpoint_id", "branch_checkpoint_id", "siblings"}


def texts(state: dict) -> list[tuple[str, str]]:
    """(role, text) of each `message` item of a state, in order."""
    return [(item["role"], item["content"][0]["text"]) for item in state["messages"] if item["type"] == "message"]


def user_item(state: dict, text: str) -> dict:
    return next(i for i in state["messages"] if i.get("role") == "user" and i["content"][0]["text"] == text)


def regenerate(agent, thread_id: str, **custom_inputs):
    return agent.predict(request(None, thread_id=thread_id, regenerate=True, **custom_inputs))


def edit(agent, thread_id: str, message_id: str, text: str, **custom_inputs):
    return say(agent, text, thread_id=thread_id, edit_message_id=message_id, **custom_inputs)


# -- the root ---------------------------------------------------------------------------------------


def test_every_thread_starts_at_an_empty_root_that_is_its_first_messages_branch_point(agent):
    trip = run_trip(agent)
    history = agent.get_checkpoint_history(trip["thread_id"], limit=100)
    oldest = history[-1]
    assert (oldest["checkpoint_id"], oldest["source"], oldest["step"]) == (trip["root"], "root", -1)
    assert (oldest["message_count"], oldest["parent_checkpoint_id"], oldest["last_user_message"]) == (0, None, "")
    assert agent.get_checkpoint_state(trip["thread_id"], trip["root"])["messages"] == []
    first = agent.get_checkpoint_state(trip["thread_id"])["messages"][0]
    assert first["role"] == "user" and first["branch_checkpoint_id"] == trip["root"]
    assert first["checkpoint_id"] == trip["after_turn1"]


# -- get_checkpoint_state ---------------------------------------------------------------------------


def test_state_of_the_head_has_the_history_entry_and_every_message_with_its_place(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    state = agent.get_checkpoint_state(thread_id)
    entry = agent.get_checkpoint_history(thread_id, limit=1)[0]
    assert {k: v for k, v in state.items() if k not in ("messages", "message_offset", "head_checkpoint_id")} == entry
    assert state["checkpoint_id"] == trip["after_turn3"] and state["is_head"]
    assert state["head_checkpoint_id"] == trip["after_turn3"] and state["message_offset"] == 0  # every message
    assert [role for role, _ in texts(state)] == ["user", "assistant"] * 3
    assert texts(state)[4] == ("user", "Where did I say I'm going?") and texts(state)[5][1] == trip["answer"]
    ids = [item["id"] for item in state["messages"]]
    assert all(ids) and len(set(ids)) == 6
    turn_checkpoints = [trip["after_turn1"], trip["after_turn2"], trip["after_turn3"]]
    parents = [trip["root"], *turn_checkpoints[:2]]
    for index, item in enumerate(state["messages"]):
        assert ITEM_PLACE_KEYS <= set(item)
        assert item["checkpoint_id"] == turn_checkpoints[index // 2]
        assert item["branch_checkpoint_id"] == parents[index // 2]
        assert item["siblings"] == {
            "index": 0,
            "count": 1,
            "checkpoint_ids": [turn_checkpoints[index // 2]],
            "latest_checkpoint_ids": [trip["after_turn3"]],  # the newest checkpoint after each alternative
        }


def test_state_of_an_earlier_checkpoint_has_its_own_messages_and_is_not_the_head(agent):
    trip = run_trip(agent)
    state = agent.get_checkpoint_state(trip["thread_id"], trip["after_turn1"])
    assert not state["is_head"] and state["message_count"] == 2
    assert texts(state)[0] == ("user", "I'm planning for an upcoming trip!")


def test_state_action_matches_the_python_method_on_every_path(agent):
    trip = run_trip(agent)
    body = request(action="get_checkpoint_state", thread_id=trip["thread_id"], checkpoint_id=trip["after_turn2"])
    expected = agent.get_checkpoint_state(trip["thread_id"], trip["after_turn2"])
    assert agent.predict(body).custom_outputs == expected
    assert list(agent.predict_stream(body))[-1].custom_outputs == expected
    assert asyncio.run(agent.apredict(body)).custom_outputs == expected


def test_state_shows_tool_calls_and_results_as_items_with_ids(agent):
    first = say(agent, "calculate 6*7")
    thread_id = outputs(first)["thread_id"]
    state = agent.get_checkpoint_state(thread_id)
    kinds = [item["type"] for item in state["messages"]]
    assert kinds == ["message", "function_call", "function_call_output", "message"]
    call, result = state["messages"][1], state["messages"][2]
    assert call["id"] == call["call_id"] == result["call_id"] and call["name"] == "calculator"
    assert result["output"] == "42" and result["id"] and result["id"] != call["id"]
    # The turn's output names the tool call with the same id.
    assert [i["id"] for i in (o.model_dump() for o in first.output) if i["type"] == "function_call"] == [call["id"]]


def test_state_after_a_message_has_only_the_later_items_with_their_places_and_alternatives(agent):
    thread_id = run_trip(agent)["thread_id"]
    first = agent.get_checkpoint_state(thread_id)["messages"]
    edit(agent, thread_id, first[2]["id"], "I'm headed to LA!")  # the third item gets alternatives
    whole = agent.get_checkpoint_state(thread_id)
    part = agent.get_checkpoint_state(thread_id, after_message_id=whole["messages"][1]["id"])
    assert part["message_offset"] == 2 and part["messages"] == whole["messages"][2:]
    assert part["messages"][0]["alternatives"]["count"] == 2
    assert {k: v for k, v in part.items() if k not in ("messages", "message_offset")} == {
        k: v for k, v in whole.items() if k not in ("messages", "message_offset")
    }
    assert part["head_checkpoint_id"] == whole["checkpoint_id"]
    last = agent.get_checkpoint_state(thread_id, after_message_id=whole["messages"][-1]["id"])
    assert (last["message_offset"], last["messages"]) == (4, [])  # the client is up to date
    # The same through the action, on an earlier checkpoint (which names the head apart).
    body = request(action="get_checkpoint_state", thread_id=thread_id, checkpoint_id=first[2]["checkpoint_id"])
    earlier = agent.predict({**body, "custom_inputs": {**body["custom_inputs"], "after_message_id": first[0]["id"]}})
    assert earlier.custom_outputs["messages"] == agent.get_checkpoint_state(thread_id, first[2]["checkpoint_id"])["messages"][1:]
    assert earlier.custom_outputs["head_checkpoint_id"] == whole["checkpoint_id"] and not earlier.custom_outputs["is_head"]


def test_state_after_a_tool_call_starts_after_the_message_that_made_it(agent):
    thread_id = outputs(say(agent, "calculate 6*7"))["thread_id"]
    whole = agent.get_checkpoint_state(thread_id)["messages"]
    part = agent.get_checkpoint_state(thread_id, after_message_id=whole[1]["call_id"])
    assert part["message_offset"] == 2 and part["messages"] == whole[2:]


def test_state_after_a_message_not_in_the_checkpoint_is_refused(agent):
    trip = run_trip(agent)
    later = agent.get_checkpoint_state(trip["thread_id"])["messages"][-1]["id"]
    with pytest.raises(InvalidRequest, match="No message or tool call"):
        agent.get_checkpoint_state(trip["thread_id"], trip["after_turn1"], after_message_id=later)
    with pytest.raises(InvalidRequest, match="after_message_id"):
        agent.get_checkpoint_state(trip["thread_id"], after_message_id="")


# -- edit ---------------------------------------------------------------------------------------------


def test_editing_the_first_message_makes_a_sibling_branch_from_the_root(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    first = agent.get_checkpoint_state(thread_id)["messages"][0]
    edited = edit(agent, thread_id, first["id"], "I'm planning a trip to Rome!")
    assert outputs(edited)["parent_checkpoint_id"] == trip["root"]
    assert text_of(edited) == _expected_reply([("user", "I'm planning a trip to Rome!")])
    state = agent.get_checkpoint_state(thread_id)
    assert state["checkpoint_id"] == outputs(edited)["checkpoint_id"] and state["is_head"]
    assert [role for role, _ in texts(state)] == ["user", "assistant"]
    siblings = state["messages"][0]["siblings"]
    assert siblings == {
        "index": 1,
        "count": 2,
        "checkpoint_ids": [trip["after_turn1"], outputs(edited)["checkpoint_id"]],
        "latest_checkpoint_ids": [trip["after_turn3"], outputs(edited)["checkpoint_id"]],
    }
    # The original branch is untouched and now shows 1/2.
    original = agent.get_checkpoint_state(thread_id, trip["after_turn3"])
    assert original["messages"][0]["siblings"]["index"] == 0 and original["messages"][0]["siblings"]["count"] == 2
    assert texts(original)[0] == ("user", "I'm planning for an upcoming trip!")
    # "< 1/2 >" in a UI: switch to the first alternative's newest checkpoint, the whole original conversation.
    agent.set_head(thread_id, siblings["latest_checkpoint_ids"][0])
    assert agent.get_checkpoint_state(thread_id)["checkpoint_id"] == trip["after_turn3"]


def test_editing_a_middle_message_keeps_the_messages_before_it_and_drops_the_ones_after(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    sf = user_item(agent.get_checkpoint_state(thread_id), "I'm headed to SF!")
    edited = edit(agent, thread_id, sf["id"], "I'm headed to Lisbon!")
    assert outputs(edited)["parent_checkpoint_id"] == trip["after_turn1"] == sf["branch_checkpoint_id"]
    first_reply = texts(agent.get_checkpoint_state(thread_id, trip["after_turn1"]))[1]
    context = [("user", "I'm planning for an upcoming trip!"), first_reply, ("user", "I'm headed to Lisbon!")]
    assert text_of(edited) == _expected_reply(context)
    state = agent.get_checkpoint_state(thread_id)
    assert [t for _, t in texts(state)][::2] == ["I'm planning for an upcoming trip!", "I'm headed to Lisbon!"]


def test_editing_a_message_of_an_earlier_checkpoint_uses_that_checkpoints_messages(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    sf = user_item(agent.get_checkpoint_state(thread_id, trip["after_turn2"]), "I'm headed to SF!")
    edited = edit(agent, thread_id, sf["id"], "I'm headed to Oslo!", checkpoint_id=trip["after_turn2"])
    assert outputs(edited)["parent_checkpoint_id"] == trip["after_turn1"]
    assert "Oslo" in text_of(edited) and "Where did I say" not in text_of(edited)


def test_edit_and_regenerate_stream_like_any_turn(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    sf = user_item(agent.get_checkpoint_state(thread_id), "I'm headed to SF!")
    body = request("I'm headed to Paris!", thread_id=thread_id, edit_message_id=sf["id"])
    events = [e.model_dump(exclude_none=True) for e in agent.predict_stream(body)]
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert "Paris" in streamed and "SF" not in streamed
    assert events[-1]["custom_outputs"]["parent_checkpoint_id"] == trip["after_turn1"]
    regenerated = asyncio.run(agent.apredict(request(None, thread_id=thread_id, regenerate=True)))
    assert regenerated.custom_outputs["parent_checkpoint_id"] == trip["after_turn1"]
    assert text_of(regenerated) == streamed


def test_an_edit_after_a_replaced_message_keeps_the_replacement(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    state = agent.get_checkpoint_state(thread_id)
    first = state["messages"][0]
    replaced = agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "I'm planning a cruise!", "id": first["id"]}])
    after = agent.get_checkpoint_state(thread_id)
    assert after["messages"][0]["checkpoint_id"] == replaced["checkpoint_id"]
    last_user = user_item(after, "Where did I say I'm going?")
    # A replacement in place leaves the messages after it at their places: the question stays where its
    # turn wrote it, and an edit of it branches from there (its branch_checkpoint_id) ...
    assert (last_user["checkpoint_id"], last_user["branch_checkpoint_id"]) == (trip["after_turn3"], trip["after_turn2"])
    edited = edit(agent, thread_id, last_user["id"], "Where am I going?")
    assert outputs(edited)["parent_checkpoint_id"] == trip["after_turn2"]
    # ... keeping the replacement, which the checkpoint it branches from does not hold.
    said = [t for role, t in texts(agent.get_checkpoint_state(thread_id)) if role == "user"]
    assert said == ["I'm planning a cruise!", "I'm headed to SF!", "Where am I going?"]
    assert text_of(edited) == _expected_reply(list(zip(["user", "assistant", "user", "assistant", "user"], [
        "I'm planning a cruise!", after["messages"][1]["content"][0]["text"], "I'm headed to SF!",
        after["messages"][3]["content"][0]["text"], "Where am I going?"], strict=True)))  # fmt: skip


def test_saving_an_early_message_in_place_keeps_the_switchers_of_the_messages_after_it(agent):
    """The web page's "save only": the messages after the replaced one keep their alternatives."""
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    again = outputs(regenerate(agent, thread_id))  # the last answer now has two versions
    before = agent.get_checkpoint_state(thread_id)["messages"]
    first = before[0]
    replaced = agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "I'm planning a cruise!", "id": first["id"]}])
    after = agent.get_checkpoint_state(thread_id)["messages"]
    assert [m["id"] for m in after] == [m["id"] for m in before]
    assert after[0]["checkpoint_id"] == replaced["checkpoint_id"]
    def switcher(alternatives: dict) -> tuple:  # latest_checkpoint_id moves to the new leaf, the replacement
        return alternatives["kind"], alternatives["index"], [(o["checkpoint_id"], o["preview"]) for o in alternatives["options"]]

    for old, new in zip(before[1:], after[1:], strict=True):
        assert (new["checkpoint_id"], new["branch_checkpoint_id"]) == (old["checkpoint_id"], old["branch_checkpoint_id"])
        assert switcher(new["alternatives"]) == switcher(old["alternatives"])
    assert (after[5]["alternatives"]["index"], after[5]["alternatives"]["count"]) == (1, 2)
    assert after[5]["checkpoint_id"] == again["checkpoint_id"]
    # Regenerating that answer branches where its alternatives are, and keeps the replaced first message.
    third = outputs(agent.predict(request(None, thread_id=thread_id, regenerate_message_id=after[5]["id"])))
    assert third["parent_checkpoint_id"] == trip["after_turn2"]
    now = agent.get_checkpoint_state(thread_id)
    assert texts(now)[0] == ("user", "I'm planning a cruise!")
    assert (now["messages"][5]["alternatives"]["index"], now["messages"][5]["alternatives"]["count"]) == (2, 3)


# -- regenerate ---------------------------------------------------------------------------------------


def test_regenerate_answers_the_last_user_message_again_as_a_sibling(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    again = regenerate(agent, thread_id)
    assert outputs(again)["parent_checkpoint_id"] == trip["after_turn2"]
    assert text_of(again) == trip["answer"]
    state = agent.get_checkpoint_state(thread_id)
    before = agent.get_checkpoint_state(thread_id, trip["after_turn3"])
    assert state["messages"][4]["id"] == before["messages"][4]["id"]  # the same user message
    assert state["messages"][5]["id"] != before["messages"][5]["id"]  # a new answer
    assert state["messages"][5]["siblings"] == {
        "index": 1,
        "count": 2,
        "checkpoint_ids": [trip["after_turn3"], outputs(again)["checkpoint_id"]],
        "latest_checkpoint_ids": [trip["after_turn3"], outputs(again)["checkpoint_id"]],
    }


def test_regenerate_at_a_checkpoint_ending_with_an_unanswered_user_message_answers_it_there(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    asked = agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "And the weather?"}])
    answered = regenerate(agent, thread_id)
    assert outputs(answered)["parent_checkpoint_id"] == asked["checkpoint_id"]
    assert "And the weather?" in text_of(answered)
    again = regenerate(agent, thread_id)
    assert outputs(again)["parent_checkpoint_id"] == asked["checkpoint_id"]


def test_regenerate_at_an_earlier_checkpoint_branches_there(agent):
    trip = run_trip(agent)
    again = regenerate(agent, trip["thread_id"], checkpoint_id=trip["after_turn1"])
    assert outputs(again)["parent_checkpoint_id"] == trip["root"]
    assert text_of(again) == _expected_reply([("user", "I'm planning for an upcoming trip!")])


def test_regenerate_message_id_regenerates_that_answer_not_the_one_before_it(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    before = agent.get_checkpoint_state(thread_id)
    second_answer = before["messages"][3]
    assert second_answer["role"] == "assistant"
    again = agent.predict(request(None, thread_id=thread_id, regenerate_message_id=second_answer["id"]))
    # A sibling of turn 2 (from the checkpoint before its user message), answering "I'm headed to SF!" again.
    assert outputs(again)["parent_checkpoint_id"] == second_answer["branch_checkpoint_id"] == trip["after_turn1"]
    assert text_of(again) == _expected_reply(texts(before)[:3])
    state = agent.get_checkpoint_state(thread_id)
    assert state["checkpoint_id"] == outputs(again)["checkpoint_id"] and state["message_count"] == 4
    assert [item["id"] for item in state["messages"][:3]] == [item["id"] for item in before["messages"][:3]]
    assert state["messages"][3]["id"] != second_answer["id"]


def test_regenerate_message_id_of_the_last_answer_is_regenerate(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    last = agent.get_checkpoint_state(thread_id)["messages"][-1]
    named = agent.predict(request(None, thread_id=thread_id, regenerate=True, regenerate_message_id=last["id"]))
    assert outputs(named)["parent_checkpoint_id"] == trip["after_turn2"]
    assert text_of(named) == trip["answer"]


def test_regenerate_message_id_finds_the_answer_in_the_checkpoint_named(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    first_answer = agent.get_checkpoint_state(thread_id)["messages"][1]
    agent.set_head(thread_id, trip["after_turn1"])
    again = agent.predict(
        request(None, thread_id=thread_id, checkpoint_id=trip["after_turn3"], regenerate_message_id=first_answer["id"])
    )
    assert outputs(again)["parent_checkpoint_id"] == trip["root"]
    assert text_of(again) == _expected_reply([("user", TRIP[0])])


def test_regenerate_message_id_of_an_answer_with_tool_calls_redoes_the_whole_answer(agent):
    first = say(agent, "calculate 6*7")
    thread_id = outputs(first)["thread_id"]
    items = agent.get_checkpoint_state(thread_id)["messages"]
    # The final message, the function_call (named by its call id) and its result: each names the same answer.
    for answer in (items[-1], items[1], items[2]):
        again = agent.predict(request(None, thread_id=thread_id, checkpoint_id=outputs(first)["checkpoint_id"],
                                      regenerate_message_id=answer["id"]))  # fmt: skip
        assert outputs(again)["parent_checkpoint_id"] == outputs(first)["parent_checkpoint_id"]
        state = agent.get_checkpoint_state(thread_id)
        assert [item["type"] for item in state["messages"]] == ["message", "function_call", "function_call_output", "message"]
        assert state["messages"][0]["id"] == items[0]["id"]


# -- alternatives: edits and regenerations apart ---------------------------------------------------------


def test_a_user_messages_alternatives_are_its_edits_and_an_answers_are_its_regenerations(agent, monkeypatch):
    thread_id = outputs(say(agent, TRIP[0]))["thread_id"]
    original = agent.get_checkpoint_state(thread_id)
    cruise = outputs(edit(agent, thread_id, original["messages"][0]["id"], "I'm planning a cruise!"))
    first_answer = agent.get_checkpoint_state(thread_id)["messages"][1]
    again = outputs(agent.predict(request(None, thread_id=thread_id, regenerate_message_id=first_answer["id"])))
    reads = []
    read = agent.storage.get_checkpoints
    monkeypatch.setattr(agent.storage, "get_checkpoints", lambda *a, **k: reads.append(a) or read(*a, **k))
    state = agent.get_checkpoint_state(thread_id)
    assert len(reads) == 1  # the alternatives' messages: one query, whatever their number
    user, answer = state["messages"]
    assert user["siblings"]["count"] == answer["siblings"]["count"] == 3  # every child of the root, as before
    assert user["alternatives"] == {
        "kind": "edits",
        "index": 1,
        "count": 2,
        "options": [
            {"checkpoint_id": original["checkpoint_id"], "latest_checkpoint_id": original["checkpoint_id"], "preview": TRIP[0]},
            # The edit and its regeneration hold the same user message: one version, switched to at its newest.
            {"checkpoint_id": cruise["checkpoint_id"], "latest_checkpoint_id": again["checkpoint_id"],
             "preview": "I'm planning a cruise!"},
        ],
    }  # fmt: skip
    assert answer["alternatives"]["kind"] == "regenerations"
    assert (answer["alternatives"]["index"], answer["alternatives"]["count"]) == (1, 2)
    options = answer["alternatives"]["options"]
    assert [o["checkpoint_id"] for o in options] == [cruise["checkpoint_id"], again["checkpoint_id"]]
    assert [o["latest_checkpoint_id"] for o in options] == [cruise["checkpoint_id"], again["checkpoint_id"]]
    reply = _expected_reply([("user", "I'm planning a cruise!")])
    assert [o["preview"] for o in options] == [reply[:100], reply[:100]]
    # Switching to an option shows it at its place among the same options.
    agent.set_head(thread_id, options[0]["latest_checkpoint_id"])
    switched = agent.get_checkpoint_state(thread_id)["messages"]
    assert switched[1]["alternatives"]["index"] == 0 and switched[1]["alternatives"]["options"] == options
    agent.set_head(thread_id, user["alternatives"]["options"][0]["latest_checkpoint_id"])
    back = agent.get_checkpoint_state(thread_id)["messages"]
    assert back[0]["alternatives"]["index"] == 0 and back[0]["alternatives"]["count"] == 2
    assert back[1]["alternatives"]["count"] == 1  # the original answer was never regenerated


def test_a_regenerated_answer_leaves_its_user_message_with_one_version(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    plain = agent.get_checkpoint_state(thread_id)["messages"]
    for index, item in enumerate(plain):  # no branches: each message is its only version
        alternatives = item["alternatives"]
        assert (alternatives["index"], alternatives["count"]) == (0, 1)
        assert alternatives["kind"] == ("edits" if item["role"] == "user" else "regenerations")
        assert alternatives["options"][0] == {
            "checkpoint_id": item["checkpoint_id"],
            "latest_checkpoint_id": trip["after_turn3"],
            "preview": item["content"][0]["text"][:100],
        }
    again = outputs(regenerate(agent, thread_id))
    user, answer = agent.get_checkpoint_state(thread_id)["messages"][4:]
    assert user["siblings"]["count"] == 2 and user["alternatives"]["count"] == 1
    assert user["alternatives"]["options"][0]["latest_checkpoint_id"] == again["checkpoint_id"]
    assert [o["checkpoint_id"] for o in answer["alternatives"]["options"]] == [trip["after_turn3"], again["checkpoint_id"]]
    assert answer["alternatives"]["index"] == 1


def test_every_message_of_an_answer_with_tool_calls_has_the_same_regenerations(agent):
    first = outputs(say(agent, "calculate 6*7"))
    thread_id = first["thread_id"]
    answer_id = agent.get_checkpoint_state(thread_id)["messages"][-1]["id"]
    agent.predict(request(None, thread_id=thread_id, regenerate_message_id=answer_id))
    items = agent.get_checkpoint_state(thread_id)["messages"]
    assert items[0]["alternatives"]["count"] == 1
    lists = [item["alternatives"] for item in items[1:]]
    assert all(alternatives == lists[0] for alternatives in lists) and lists[0]["count"] == 2
    assert lists[0]["options"][0]["preview"] == items[-1]["content"][0]["text"][:100]  # the answer's last message


# -- replace and remove --------------------------------------------------------------------------------


def test_an_item_whose_id_names_a_message_replaces_it_instead_of_adding_a_copy(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    sf = user_item(agent.get_checkpoint_state(thread_id), "I'm headed to SF!")
    agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "I'm headed to LA!", "id": sf["id"]}])
    state = agent.get_checkpoint_state(thread_id)
    assert state["message_count"] == 6 and texts(state)[2] == ("user", "I'm headed to LA!")
    assert state["messages"][2]["id"] == sf["id"]
    assert "LA" in text_of(say(agent, "Where am I going?", thread_id=thread_id))
    # The same through the action, with an item copied from get_checkpoint_state (its place keys included).
    item = {**agent.get_checkpoint_state(thread_id)["messages"][2], "content": [{"type": "input_text", "text": "I'm headed to NYC!"}]}
    body = request(action="update_checkpoint_state", thread_id=thread_id, checkpoint_id=state["checkpoint_id"])
    agent.predict({**body, "input": [item]})
    assert texts(agent.get_checkpoint_state(thread_id))[2] == ("user", "I'm headed to NYC!")


def test_remove_message_ids_removes_messages_and_keeps_the_earlier_checkpoint(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    state = agent.get_checkpoint_state(thread_id)
    sf, reply = state["messages"][2], state["messages"][3]
    body = request(action="update_checkpoint_state", thread_id=thread_id, remove_message_ids=[sf["id"], reply["id"]])
    removed = agent.predict(body).custom_outputs
    after = agent.get_checkpoint_state(thread_id)
    assert after["checkpoint_id"] == removed["checkpoint_id"] and after["message_count"] == 4
    assert "SF" not in " ".join(t for role, t in texts(after) if role == "user")
    assert agent.get_checkpoint_state(thread_id, trip["after_turn3"])["message_count"] == 6
    assert "SF" not in text_of(say(agent, "Where am I going?", thread_id=thread_id))


def test_removing_a_function_call_removes_its_output_too(agent):
    first = say(agent, "calculate 1+1")
    thread_id = outputs(first)["thread_id"]
    say(agent, "thanks", thread_id=thread_id)
    state = agent.get_checkpoint_state(thread_id)
    call = next(i for i in state["messages"] if i["type"] == "function_call")
    agent.update_checkpoint_state(thread_id, None, remove_message_ids=[call["id"]])
    kinds = [item["type"] for item in agent.get_checkpoint_state(thread_id)["messages"]]
    assert kinds == ["message", "message", "message", "message"]  # user, answer, user, answer
    # The model accepts the history (the offline model refuses unanswered calls, like OpenAI).
    assert text_of(say(agent, "and now?", thread_id=thread_id))


def test_removing_an_assistant_message_that_called_a_tool_removes_the_tool_result(agent):
    first = say(agent, "calculate 2+2")
    thread_id = outputs(first)["thread_id"]
    messages = get_checkpoint_state(agent.storage, thread_id, None, user_id=None).messages
    caller = next(m for m in messages if m.type == "ai" and m.tool_calls)
    agent.update_checkpoint_state(thread_id, None, remove_message_ids=[caller.id])
    kinds = [item["type"] for item in agent.get_checkpoint_state(thread_id)["messages"]]
    assert kinds == ["message", "message"]


# -- list_branches and set_head --------------------------------------------------------------------------


def test_a_thread_without_branches_has_one_branch_with_no_fork_point(agent):
    trip = run_trip(agent)
    [branch] = agent.list_branches(trip["thread_id"])
    assert branch["checkpoint_id"] == trip["after_turn3"] and branch["is_head"]
    assert branch["fork_checkpoint_id"] is None and branch["message_count"] == 6
    assert branch["last_user_message"] == "Where did I say I'm going?"
    assert branch["updated_at"] == branch["timestamp"]


def test_list_branches_has_one_entry_per_leaf_with_its_fork_point(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    tokyo = outputs(say(agent, "I'm headed to Tokyo!", thread_id=thread_id, checkpoint_id=trip["after_turn1"]))
    again = outputs(regenerate(agent, thread_id, checkpoint_id=trip["after_turn3"]))
    branches = agent.list_branches(thread_id)
    assert [b["checkpoint_id"] for b in branches] == [again["checkpoint_id"], tokyo["checkpoint_id"], trip["after_turn3"]]
    forks = {b["checkpoint_id"]: b["fork_checkpoint_id"] for b in branches}
    assert forks == {
        again["checkpoint_id"]: trip["after_turn2"],
        trip["after_turn3"]: trip["after_turn2"],
        tokyo["checkpoint_id"]: trip["after_turn1"],
    }
    assert [b["is_head"] for b in branches] == [True, False, False]
    action = agent.predict(request(action="list_branches", thread_id=thread_id)).custom_outputs
    assert action == {"thread_id": thread_id, "branches": branches}


def test_set_head_switches_branch_without_writing_a_checkpoint_and_the_next_turn_continues_there(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    tokyo = outputs(say(agent, "I'm headed to Tokyo!", thread_id=thread_id, checkpoint_id=trip["after_turn1"]))
    before = agent.get_checkpoint_history(thread_id, limit=100)
    moved = agent.set_head(thread_id, trip["after_turn3"])
    assert moved == {"thread_id": thread_id, "checkpoint_id": trip["after_turn3"], "previous_checkpoint_id": tokyo["checkpoint_id"]}
    after = agent.get_checkpoint_history(thread_id, limit=100)
    assert [e["checkpoint_id"] for e in after] == [e["checkpoint_id"] for e in before]
    assert [e["checkpoint_id"] for e in after if e["is_head"]] == [trip["after_turn3"]]
    assert agent.storage.get_thread(thread_id).message_count == 6
    answer = say(agent, "Where am I going?", thread_id=thread_id)
    assert outputs(answer)["parent_checkpoint_id"] == trip["after_turn3"]
    assert "SF" in text_of(answer) and "Tokyo" not in text_of(answer)
    # Back to the middle of the Tokyo branch, through the action.
    body = request(action="set_head", thread_id=thread_id, checkpoint_id=tokyo["checkpoint_id"])
    assert agent.predict(body).custom_outputs["checkpoint_id"] == tokyo["checkpoint_id"]
    assert "Tokyo" in text_of(say(agent, "Where am I going?", thread_id=thread_id))


def test_set_head_to_the_root_makes_the_next_turn_a_fresh_first_message(agent):
    trip = run_trip(agent)
    agent.set_head(trip["thread_id"], trip["root"])
    answer = say(agent, "Hello again", thread_id=trip["thread_id"])
    assert text_of(answer) == _expected_reply([("user", "Hello again")])


# -- fork_thread ----------------------------------------------------------------------------------------


def test_fork_is_a_new_thread_of_the_same_user_with_the_ancestor_chain(agent):
    trip = run_trip(agent, user_id="alice")
    thread_id = trip["thread_id"]
    say(agent, "I'm headed to Tokyo!", thread_id=thread_id, checkpoint_id=trip["after_turn1"], user_id="alice")
    fork = agent.fork_thread(thread_id, trip["after_turn2"], user_id="alice")
    assert fork["thread_id"] != thread_id
    assert fork["forked_from"] == {"thread_id": thread_id, "checkpoint_id": trip["after_turn2"]}
    source_state = agent.get_checkpoint_state(thread_id, trip["after_turn2"], user_id="alice")
    fork_state = agent.get_checkpoint_state(fork["thread_id"], user_id="alice")
    assert fork_state["checkpoint_id"] == fork["checkpoint_id"] != trip["after_turn2"]
    assert [(i["id"], texts({"messages": [i]})) for i in fork_state["messages"]] == [
        (i["id"], texts({"messages": [i]})) for i in source_state["messages"]
    ]
    history = agent.get_checkpoint_history(fork["thread_id"], limit=100, user_id="alice")
    assert [e["message_count"] for e in history] == [4, 2, 0]  # the chain only, with its root
    assert history[-1]["source"] == "root"
    record = agent.storage.get_thread(fork["thread_id"])
    assert record.user_id == "alice" and record.forked_from == fork["forked_from"]
    assert record.head_checkpoint_id == fork["checkpoint_id"] and record.message_count == 4
    # Another user cannot see it.
    from agent import ThreadNotFound

    with pytest.raises(ThreadNotFound):
        agent.get_checkpoint_state(fork["thread_id"], user_id="bob")


def test_a_forks_copies_keep_each_turns_model_input_and_usage_and_the_branch_totals(agent):
    """The copies carry what each turn sent the model and used, so a fork's branch totals match the source's."""
    trip = run_trip(agent)
    fork = agent.fork_thread(trip["thread_id"])
    keys = ("model_input_messages", "model_input_tokens", "summary_used", "usage", "branch_usage")

    def report(thread_id):
        return [{k: e.get(k) for k in keys} for e in agent.get_checkpoint_history(thread_id, limit=100)]

    source = report(trip["thread_id"])
    assert source[0]["usage"] is not None and source[0]["branch_usage"] != source[0]["usage"]  # three turns add up
    assert report(fork["thread_id"]) == source
    source_usage = agent.get_usage(trip["thread_id"])
    fork_usage = agent.get_usage(fork["thread_id"])
    assert (fork_usage["thread_usage"], fork_usage["branch_usage"]) == (source_usage["thread_usage"], source_usage["branch_usage"])


def test_fork_defaults_to_the_head_and_takes_a_new_thread_id(agent):
    trip = run_trip(agent)
    fork = agent.fork_thread(trip["thread_id"], new_thread_id="my-fork")
    assert fork["thread_id"] == "my-fork"
    assert fork["forked_from"]["checkpoint_id"] == trip["after_turn3"]
    body = request(action="fork_thread", thread_id=trip["thread_id"], checkpoint_id=trip["after_turn1"])
    by_action = agent.predict(body).custom_outputs
    assert agent.get_checkpoint_state(by_action["thread_id"])["message_count"] == 2


def test_fork_and_source_are_independent_and_the_fork_survives_deleting_the_source(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    fork = agent.fork_thread(thread_id)
    on_fork = say(agent, "I'm headed to Berlin!", thread_id=fork["thread_id"])
    on_source = say(agent, "I'm headed to Madrid!", thread_id=thread_id)
    assert "Madrid" not in text_of(on_fork) and "Berlin" not in text_of(on_source)
    assert "SF" in text_of(on_fork)
    assert len(agent.get_checkpoint_history(thread_id, limit=100)) == 5
    assert len(agent.get_checkpoint_history(fork["thread_id"], limit=100)) == 5
    agent.delete_thread(thread_id)
    agent.storage.saver.message_cache.clear()  # read from storage, not from memory
    for entry in agent.get_checkpoint_history(fork["thread_id"], limit=100):
        state = agent.get_checkpoint_state(fork["thread_id"], entry["checkpoint_id"])
        assert len([i for i in state["messages"] if i["type"] == "message"]) == entry["message_count"]
    assert "Berlin" in text_of(say(agent, "Where am I going?", thread_id=fork["thread_id"]))


def test_a_fork_of_a_chain_takes_about_the_storage_of_the_chain(agent):
    first = say(agent, "turn 0 " + "x" * 400)
    thread_id = outputs(first)["thread_id"]
    for n in range(1, 20):
        say(agent, f"turn {n} " + "x" * 400, thread_id=thread_id)
    fork = agent.fork_thread(thread_id)
    source_bytes, fork_bytes = stored_bytes(agent, thread_id), stored_bytes(agent, fork["thread_id"])
    # Messages stored once each (deltas within the fork), not a full copy per checkpoint (20x).
    assert fork_bytes <= 1.5 * source_bytes


def stored_bytes(agent, thread_id: str) -> int:
    from agent.storage.postgres import PostgresThreadStorage

    storage = agent.storage
    if isinstance(storage, PostgresThreadStorage):
        with storage.pool.connection() as conn:
            blobs = conn.execute(
                f"SELECT coalesce(sum(length(blob)), 0) AS n FROM {STORED_VALUES} WHERE thread_id = %s", (thread_id,)
            ).fetchone()["n"]
            rows = conn.execute(
                "SELECT sum(pg_column_size(checkpoint) + pg_column_size(metadata)) AS n FROM checkpoints WHERE thread_id = %s",
                (thread_id,),
            ).fetchone()["n"]
        return blobs + rows
    row = storage.saver.conn.execute(
        "SELECT sum(length(checkpoint) + length(metadata)) FROM checkpoints WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    return row[0]


# -- compare_checkpoints --------------------------------------------------------------------------------


def test_compare_gives_the_common_ancestor_and_the_messages_only_each_side_has(agent):
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    tokyo = outputs(say(agent, "I'm headed to Tokyo!", thread_id=thread_id, checkpoint_id=trip["after_turn1"]))
    diff = agent.compare_checkpoints(thread_id, trip["after_turn3"], tokyo["checkpoint_id"])
    assert diff["common_ancestor_checkpoint_id"] == trip["after_turn1"]
    assert [t for _, t in texts({"messages": diff["only_a"]})][::2] == ["I'm headed to SF!", "Where did I say I'm going?"]
    assert [t for _, t in texts({"messages": diff["only_b"]})][::2] == ["I'm headed to Tokyo!"]
    assert diff["only_b"][0]["checkpoint_id"] == tokyo["checkpoint_id"]
    body = request(action="compare_checkpoints", thread_id=thread_id, checkpoint_a=trip["after_turn3"],
                   checkpoint_b=tokyo["checkpoint_id"])  # fmt: skip
    assert agent.predict(body).custom_outputs == diff


def test_comparing_a_checkpoint_with_its_ancestor_gives_the_ancestor_and_the_newer_messages(agent):
    trip = run_trip(agent)
    diff = agent.compare_checkpoints(trip["thread_id"], trip["after_turn1"], trip["after_turn3"])
    assert diff["common_ancestor_checkpoint_id"] == trip["after_turn1"]
    assert diff["only_a"] == [] and len(diff["only_b"]) == 4


def test_update_with_edit_message_id_replaces_that_message_in_place(agent):
    # The form that works where a server's request model drops item ids (mlflow models serve).
    trip = run_trip(agent)
    thread_id = trip["thread_id"]
    sf = user_item(agent.get_checkpoint_state(thread_id), "I'm headed to SF!")
    body = request("I'm headed to LA!", action="update_checkpoint_state", thread_id=thread_id, edit_message_id=sf["id"])
    updated = agent.predict(body).custom_outputs
    assert updated["parent_checkpoint_id"] == trip["after_turn3"]
    state = agent.get_checkpoint_state(thread_id)
    assert state["message_count"] == 6 and texts(state)[2] == ("user", "I'm headed to LA!")
    assert state["messages"][2]["id"] == sf["id"]
