"""Branch operations refuse wrong requests with the documented error and write nothing, on Postgres and SQLite:
unknown or foreign threads (ThreadNotFound), unknown or foreign checkpoints (CheckpointNotFound), message ids
not in the checkpoint, regenerate without a user message, a turn editing an answer, an edit in place that
changes a message's role, an update with nothing to apply, and malformed arguments (InvalidRequest).

"Nothing written": every table's row count (`tests.test_errors.row_counts`) and both threads' histories
and heads are unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from agent import CheckpointNotFound, InvalidRequest, ThreadNotFound
from tests.helpers.scenario import outputs, request, run_trip, say
from tests.test_errors import MISSING_CHECKPOINT, row_counts, unused_thread_id

HOW = pytest.mark.parametrize("how", ["predict", "predict_stream"])


@pytest.fixture
def trips(agent) -> dict:
    """`mine` (alice's, with a Tokyo branch from turn 1) and `other` (bob's)."""
    mine = run_trip(agent, user_id="alice")
    tokyo = say(agent, "I'm headed to Tokyo!", thread_id=mine["thread_id"], checkpoint_id=mine["after_turn1"], user_id="alice")
    agent.set_head(mine["thread_id"], mine["after_turn3"], user_id="alice")
    return {"mine": {**mine, "tokyo": outputs(tokyo)["checkpoint_id"]}, "other": run_trip(agent, user_id="bob")}


@contextmanager
def writes_nothing(agent, trips):
    """Assert that the block changes no table's row count and neither thread's history or head."""

    def snapshot():
        owned = ((trips["mine"]["thread_id"], "alice"), (trips["other"]["thread_id"], "bob"))
        return row_counts(agent), [agent.get_checkpoint_history(t, limit=1000, user_id=u) for t, u in owned]

    before = snapshot()
    yield
    assert snapshot() == before


def run(agent, how: str, body: dict):
    if how == "predict":
        return agent.predict(body)
    return list(agent.predict_stream(body))


def actions(thread_id: str, checkpoint_id: str | None = None) -> dict[str, dict]:
    """One request per branch action on `thread_id` (at `checkpoint_id` where the action takes one)."""
    at = checkpoint_id or MISSING_CHECKPOINT
    return {
        "get_checkpoint_state": request(action="get_checkpoint_state", thread_id=thread_id, checkpoint_id=checkpoint_id, user_id="alice"),
        "list_branches": request(action="list_branches", thread_id=thread_id, user_id="alice"),
        "set_head": request(action="set_head", thread_id=thread_id, checkpoint_id=at, user_id="alice"),
        "fork_thread": request(action="fork_thread", thread_id=thread_id, checkpoint_id=checkpoint_id, user_id="alice"),
        "compare_checkpoints": request(action="compare_checkpoints", thread_id=thread_id, checkpoint_a=at, checkpoint_b=at, user_id="alice"),
        "regenerate": request(None, thread_id=thread_id, checkpoint_id=checkpoint_id, regenerate=True, user_id="alice"),
        "edit": request("hi", thread_id=thread_id, checkpoint_id=checkpoint_id, edit_message_id="m", user_id="alice"),
    }  # fmt: skip


ACTION_NAMES = list(actions("t"))


@HOW
@pytest.mark.parametrize("name", ACTION_NAMES)
def test_every_branch_operation_on_an_unknown_thread_is_thread_not_found(agent, trips, how, name):
    fresh = unused_thread_id()
    with writes_nothing(agent, trips), pytest.raises(ThreadNotFound) as err:
        run(agent, how, actions(fresh)[name])
    assert fresh in err.value.message
    assert agent.storage.get_thread(fresh) is None


@HOW
@pytest.mark.parametrize("name", ACTION_NAMES)
def test_every_branch_operation_on_another_users_thread_is_thread_not_found(agent, trips, how, name):
    other = trips["other"]
    with writes_nothing(agent, trips), pytest.raises(ThreadNotFound):
        run(agent, how, actions(other["thread_id"], other["after_turn1"])[name])


CHECKPOINT_ACTIONS = ["get_checkpoint_state", "set_head", "fork_thread", "compare_checkpoints", "regenerate", "edit"]


@HOW
@pytest.mark.parametrize("name", CHECKPOINT_ACTIONS)
@pytest.mark.parametrize("whose", ["unknown", "another thread's"])
def test_every_branch_operation_at_an_unknown_or_foreign_checkpoint_is_checkpoint_not_found(agent, trips, how, name, whose):
    mine = trips["mine"]
    checkpoint_id = MISSING_CHECKPOINT if whose == "unknown" else trips["other"]["after_turn1"]
    with writes_nothing(agent, trips), pytest.raises(CheckpointNotFound) as err:
        run(agent, how, actions(mine["thread_id"], checkpoint_id)[name])
    assert checkpoint_id in err.value.message and mine["thread_id"] in err.value.message


def test_python_methods_give_the_same_not_found_errors(agent, trips):
    mine, other = trips["mine"], trips["other"]
    with writes_nothing(agent, trips):
        for call in (
            lambda: agent.get_checkpoint_state(other["thread_id"], user_id="alice"),
            lambda: agent.list_branches(other["thread_id"]),
            lambda: agent.set_head(other["thread_id"], other["after_turn1"], user_id="alice"),
            lambda: agent.fork_thread(other["thread_id"], user_id="alice"),
            lambda: agent.compare_checkpoints(other["thread_id"], other["root"], other["after_turn1"], user_id="alice"),
        ):
            with pytest.raises(ThreadNotFound):
                call()
        with pytest.raises(CheckpointNotFound):
            agent.compare_checkpoints(mine["thread_id"], mine["after_turn1"], other["after_turn1"], user_id="alice")
        with pytest.raises(CheckpointNotFound):
            agent.set_head(mine["thread_id"], MISSING_CHECKPOINT, user_id="alice")


# -- message ids ------------------------------------------------------------------------------------


@HOW
def test_editing_a_message_that_is_not_in_the_checkpoint_is_invalid_request(agent, trips, how):
    mine = trips["mine"]
    tokyo_message = agent.get_checkpoint_state(mine["thread_id"], mine["tokyo"], user_id="alice")["messages"][2]["id"]
    with writes_nothing(agent, trips):
        for message_id in ("no-such-message", tokyo_message):  # the Tokyo message is on another branch than the head
            body = request("hi", thread_id=mine["thread_id"], edit_message_id=message_id, user_id="alice")
            with pytest.raises(InvalidRequest) as err:
                run(agent, how, body)
            assert message_id in err.value.message and "nothing was written" in err.value.message


def test_removing_or_replacing_a_message_that_is_not_in_the_checkpoint_is_invalid_request(agent, trips):
    mine = trips["mine"]
    thread_id = mine["thread_id"]
    with writes_nothing(agent, trips):
        with pytest.raises(InvalidRequest, match="no-such-message"):
            agent.update_checkpoint_state(thread_id, None, remove_message_ids=["no-such-message"], user_id="alice")
        with pytest.raises(InvalidRequest, match="no-such-message"):
            body = request("x", action="update_checkpoint_state", thread_id=thread_id, edit_message_id="no-such-message",
                           user_id="alice")  # fmt: skip
            agent.predict(body)
        # A message of the head, removed at the root: not in that checkpoint.
        head_message = agent.get_checkpoint_state(thread_id, user_id="alice")["messages"][0]["id"]
        with pytest.raises(InvalidRequest, match=head_message):
            agent.update_checkpoint_state(thread_id, mine["root"], remove_message_ids=[head_message], user_id="alice")


@HOW
def test_a_turn_that_edits_an_assistant_message_is_invalid_request(agent, trips, how):
    mine = trips["mine"]
    answer = agent.get_checkpoint_state(mine["thread_id"], user_id="alice")["messages"][1]
    assert answer["role"] == "assistant"
    body = request("fake answer", thread_id=mine["thread_id"], edit_message_id=answer["id"], user_id="alice")
    with writes_nothing(agent, trips), pytest.raises(InvalidRequest, match="not a user message"):
        run(agent, how, body)


def test_an_edit_in_place_that_changes_the_role_is_invalid_request(agent, trips):
    mine = trips["mine"]
    first = agent.get_checkpoint_state(mine["thread_id"], user_id="alice")["messages"][0]
    with writes_nothing(agent, trips), pytest.raises(InvalidRequest, match="keeps the message's role"):
        agent.update_checkpoint_state(mine["thread_id"], None, [{"role": "assistant", "content": "x"}],
                                      edit_message_id=first["id"], user_id="alice")  # fmt: skip


def test_an_update_with_nothing_to_apply_is_invalid_request(agent, trips):
    mine = trips["mine"]
    with writes_nothing(agent, trips):
        with pytest.raises(InvalidRequest, match="nothing to apply"):
            agent.update_checkpoint_state(mine["thread_id"], None, [], user_id="alice")
        with pytest.raises(InvalidRequest, match="nothing to apply"):
            agent.predict(request(None, action="update_checkpoint_state", thread_id=mine["thread_id"], user_id="alice"))


def test_removing_every_message_is_invalid_request(agent, trips):
    mine = trips["mine"]
    state = agent.get_checkpoint_state(mine["thread_id"], mine["after_turn1"], user_id="alice")
    ids = [item["id"] for item in state["messages"]]
    with writes_nothing(agent, trips), pytest.raises(InvalidRequest, match="without messages"):
        agent.update_checkpoint_state(mine["thread_id"], mine["after_turn1"], remove_message_ids=ids, user_id="alice")


@HOW
def test_regenerate_where_there_is_no_user_message_is_invalid_request(agent, trips, how):
    mine = trips["mine"]
    body = request(None, thread_id=mine["thread_id"], checkpoint_id=mine["root"], regenerate=True, user_id="alice")
    with writes_nothing(agent, trips), pytest.raises(InvalidRequest) as err:
        run(agent, how, body)
    assert "no user message" in err.value.message and mine["root"] in err.value.message


@HOW
def test_regenerate_message_id_that_is_not_an_answer_on_the_path_is_invalid_request(agent, trips, how):
    mine = trips["mine"]
    state = agent.get_checkpoint_state(mine["thread_id"], user_id="alice")
    tokyo = agent.get_checkpoint_state(mine["thread_id"], mine["tokyo"], user_id="alice")["messages"][3]
    assert tokyo["role"] == "assistant" and tokyo["id"] not in {item["id"] for item in state["messages"]}
    cases = {
        "no-such-message": "No message or tool call",
        tokyo["id"]: "No message or tool call",  # an answer of another branch than the head's
        state["messages"][2]["id"]: "not an assistant answer",  # a user message of the head
    }
    with writes_nothing(agent, trips):
        for message_id, says in cases.items():
            body = request(None, thread_id=mine["thread_id"], regenerate_message_id=message_id, user_id="alice")
            with pytest.raises(InvalidRequest) as err:
                run(agent, how, body)
            assert says in err.value.message and message_id in err.value.message
            assert "othing was written" in err.value.message


USER_ITEMS = [{"role": "user", "content": "hi"}]

#: (custom_inputs besides thread_id and user_id, input, whether the request names the thread, what the error says)
BAD_ARGUMENTS = {
    "regenerate with input": ({"regenerate": True}, USER_ITEMS, True, "empty input"),
    "regenerate and edit": ({"regenerate": True, "edit_message_id": "m"}, [], True, "not both"),
    "regenerate not a bool": ({"regenerate": "yes"}, [], True, "regenerate"),
    "edit without a thread": ({"edit_message_id": "m"}, USER_ITEMS, False, "thread_id"),
    "regenerate without a thread": ({"regenerate": True}, [], False, "thread_id"),
    "regenerate_message_id with input": ({"regenerate_message_id": "m"}, USER_ITEMS, True, "empty input"),
    "regenerate_message_id and edit": ({"regenerate_message_id": "m", "edit_message_id": "m"}, USER_ITEMS, True,
                                       "not both"),
    "regenerate_message_id and regenerate false": ({"regenerate_message_id": "m", "regenerate": False}, [], True,
                                                   "regenerate"),
    "regenerate_message_id without a thread": ({"regenerate_message_id": "m"}, [], False, "thread_id"),
    "regenerate_message_id not a string": ({"regenerate_message_id": 5}, [], True, "regenerate_message_id"),
    "set_head without a checkpoint": ({"action": "set_head"}, [], True, "checkpoint_id"),
    "compare without checkpoints": ({"action": "compare_checkpoints"}, [], True, "checkpoint_a"),
    "remove_message_ids not a list": ({"action": "update_checkpoint_state", "remove_message_ids": "m"}, [], True,
                                      "remove_message_ids"),
    "update edit with two messages": ({"action": "update_checkpoint_state", "edit_message_id": "m"}, USER_ITEMS * 2,
                                      True, "exactly one"),
    "new_thread_id not a string": ({"action": "fork_thread", "new_thread_id": 5}, [], True, "new_thread_id"),
    "get_checkpoint_state with input": ({"action": "get_checkpoint_state"}, USER_ITEMS, True, "takes no input"),
}  # fmt: skip


@pytest.mark.parametrize("custom, items, names_thread, says", list(BAD_ARGUMENTS.values()), ids=list(BAD_ARGUMENTS))
def test_malformed_branch_arguments_are_invalid_request(agent, trips, custom, items, names_thread, says):
    thread = {"thread_id": trips["mine"]["thread_id"]} if names_thread else {}
    body = {"input": items, "custom_inputs": {**custom, **thread, "user_id": "alice"}}
    with writes_nothing(agent, trips), pytest.raises(InvalidRequest) as err:
        agent.predict(body)
    assert says in err.value.message


def test_forking_into_a_thread_id_in_use_is_invalid_request(agent, trips):
    mine, other = trips["mine"], trips["other"]
    with writes_nothing(agent, trips):
        for taken in (mine["thread_id"], other["thread_id"]):  # the caller's own thread, and another user's
            with pytest.raises(InvalidRequest, match="already in use"):
                agent.fork_thread(mine["thread_id"], new_thread_id=taken, user_id="alice")


@pytest.mark.parametrize("how", ["update", "update action", "turn", "turn streamed"])
@pytest.mark.parametrize("whose", ["a new id", "a stored message's id"])
def test_an_input_holding_two_messages_with_one_id_is_invalid_request_naming_it(agent, trips, how, whose):
    # Found by a new user: an update was accepted (the later message replaced the earlier one), and its write,
    # holding both, made the thread's export impossible to import.
    thread_id = trips["mine"]["thread_id"]
    stored = agent.get_checkpoint_state(thread_id, user_id="alice")["messages"][0]["id"]
    twice = "twice" if whose == "a new id" else stored
    items = [{"role": "user", "content": "one", "id": twice}, {"role": "user", "content": "two", "id": twice}]
    with writes_nothing(agent, trips), pytest.raises(InvalidRequest) as err:
        if how == "update":
            agent.update_checkpoint_state(thread_id, None, items, user_id="alice")
        else:
            action = {"action": "update_checkpoint_state"} if how == "update action" else {}
            body = {"input": items, "custom_inputs": {**action, "thread_id": thread_id, "user_id": "alice"}}
            run(agent, "predict_stream" if how == "turn streamed" else "predict", body)
    assert "duplicate id" in err.value.message and repr(twice) in err.value.message
    assert "othing was written" in err.value.message


@HOW
@pytest.mark.parametrize("start", ["holding the messages before it", "reset"])
def test_an_edit_whose_input_has_the_id_of_a_message_before_the_edited_one_is_invalid_request(agent, trips, how, start):
    # The edit keeps the messages before the edited one. Where its start must first reset the state to them (one
    # was replaced in place later), the input was stored beside the message with its id: two messages with one
    # id, which no export of the thread could import; elsewhere it replaced that message instead of being added.
    mine = trips["mine"]
    thread_id = mine["thread_id"]
    messages = agent.get_checkpoint_state(thread_id, user_id="alice")["messages"]
    first, second = messages[0]["id"], messages[2]["id"]
    if start == "reset":
        agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "changed"}], edit_message_id=first,
                                      user_id="alice")  # fmt: skip
    body = {"input": [{"role": "user", "content": "edited", "id": first}],
            "custom_inputs": {"thread_id": thread_id, "edit_message_id": second, "user_id": "alice"}}  # fmt: skip
    with writes_nothing(agent, trips), pytest.raises(InvalidRequest) as err:
        run(agent, how, body)
    assert repr(first) in err.value.message and "othing was written" in err.value.message
    # The edited message's own id is the id an edit may keep.
    body["input"][0]["id"] = second
    edited = outputs(agent.predict(body))
    state = agent.get_checkpoint_state(thread_id, edited["checkpoint_id"], user_id="alice")
    assert state["messages"][2]["id"] == second
