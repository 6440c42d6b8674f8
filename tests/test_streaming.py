"""`predict_stream`, on Postgres and SQLite: text deltas as the model produces them, one
`response.output_item.done` per item in a sensible order, then `response.completed` with the response's id;
the turn's ids on the last item and on `response.completed`."""

from __future__ import annotations

import asyncio

from tests.helpers.scenario import TRIP, outputs, request, run_trip

DELTA = "response.output_text.delta"
DONE = "response.output_item.done"
COMPLETED = "response.completed"


def stream(agent, text: str, **custom_inputs) -> list[dict]:
    """The events of one streamed turn, as plain dicts."""
    return [event.model_dump(exclude_none=True) for event in agent.predict_stream(request(text, **custom_inputs))]


def done_items(events: list[dict]) -> list[dict]:
    return [e["item"] for e in events if e["type"] == DONE]


def message_text(item: dict) -> str:
    return "".join(part["text"] for part in item["content"])


def test_stream_yields_several_text_deltas_that_add_up_to_the_reply(agent):
    events = stream(agent, TRIP[0])
    deltas = [e for e in events if e["type"] == DELTA]
    # The offline model streams three words per chunk, so one reply is several deltas.
    assert len(deltas) >= 3
    [reply] = done_items(events)
    assert reply["type"] == "message" and reply["role"] == "assistant"
    assert "".join(d["delta"] for d in deltas) == message_text(reply)
    assert {d["item_id"] for d in deltas} == {reply["id"]}
    # Every delta comes before the finished item.
    assert events.index(deltas[-1]) < events.index(next(e for e in events if e["type"] == DONE))
    assert {e["type"] for e in events} == {DELTA, DONE, COMPLETED}
    # The stream ends with the whole response: its id names the turn's checkpoint.
    completed = events[-1]
    assert completed["type"] == COMPLETED and completed["response"]["output"] == [reply]
    assert completed["response"]["id"] == "resp_" + completed["custom_outputs"]["checkpoint_id"]


def test_last_event_carries_the_new_head_and_where_the_turn_started(agent):
    first = stream(agent, TRIP[0])
    ids = first[-1]["custom_outputs"]
    root = agent.get_checkpoint_history(ids["thread_id"])[-1]
    assert (ids["parent_checkpoint_id"], root["source"]) == (root["checkpoint_id"], "root")
    thread_id = ids["thread_id"]
    second = stream(agent, TRIP[1], thread_id=thread_id)
    last, completed = second[-2:]
    assert last["type"] == DONE and last["item"]["type"] == "message"
    assert completed["type"] == COMPLETED and completed["custom_outputs"] == last["custom_outputs"]
    assert set(last["custom_outputs"]) == {"thread_id", "checkpoint_id", "parent_checkpoint_id", "response_id"}
    assert last["custom_outputs"]["thread_id"] == thread_id
    assert last["custom_outputs"]["parent_checkpoint_id"] == ids["checkpoint_id"]
    head = agent.get_checkpoint_history(thread_id, limit=1)[0]
    assert last["custom_outputs"]["checkpoint_id"] == head["checkpoint_id"]
    assert head["parent_checkpoint_id"] == ids["checkpoint_id"]
    assert head["message_count"] == 4
    # Only the last item and the final event carry custom_outputs.
    assert all("custom_outputs" not in e for e in second[:-2])


def test_streamed_turns_are_remembered_like_predicted_ones(agent):
    ids = run_trip(agent)
    events = stream(agent, "Where am I going again?", thread_id=ids["thread_id"])
    reply = message_text(done_items(events)[-1])
    assert "SF" in reply and TRIP[0] in reply
    assert events[-1]["custom_outputs"]["parent_checkpoint_id"] == ids["after_turn3"]


def test_streamed_branch_reports_the_branch_point_as_parent(agent):
    ids = run_trip(agent)
    events = stream(agent, "I'm headed to New York!", thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    custom = events[-1]["custom_outputs"]
    assert custom["thread_id"] == ids["thread_id"]
    assert custom["parent_checkpoint_id"] == ids["after_turn1"]
    reply = "".join(e["delta"] for e in events if e["type"] == DELTA)
    assert "New York" in reply and "SF" not in reply
    assert agent.get_checkpoint_history(ids["thread_id"], limit=1)[0]["checkpoint_id"] == custom["checkpoint_id"]


def test_tool_call_turn_streams_call_then_result_then_reply(agent):
    events = stream(agent, "calculate 2*(3+4)")
    items = done_items(events)
    assert [item["type"] for item in items] == ["function_call", "function_call_output", "message"]
    call, result, reply = items
    assert call["name"] == "calculator"
    assert call["arguments"].replace(" ", "") == '{"expression":"2*(3+4)"}'
    assert result["call_id"] == call["call_id"]
    assert result["output"] == "14"
    assert "14" in message_text(reply)
    # The reply's deltas come after the tool result, and only the reply has deltas.
    deltas = [e for e in events if e["type"] == DELTA]
    assert deltas and {d["item_id"] for d in deltas} == {reply["id"]}
    result_at = next(i for i, e in enumerate(events) if e.get("item") is result)
    assert all(events.index(d) > result_at for d in deltas)
    assert "".join(d["delta"] for d in deltas) == message_text(reply)
    # The turn is stored whole: user, tool call, tool result, reply.
    custom = events[-1]["custom_outputs"]
    head = agent.get_checkpoint_history(custom["thread_id"], limit=1)[0]
    assert head["checkpoint_id"] == custom["checkpoint_id"]
    assert head["message_count"] == 4


def test_stream_and_predict_give_the_same_items(agent):
    streamed = done_items(stream(agent, "calculate 2*(3+4)"))
    predicted = [item.model_dump(exclude_none=True) for item in agent.predict(request("calculate 2*(3+4)")).output]
    assert [i["type"] for i in streamed] == [i["type"] for i in predicted]
    assert message_text(streamed[-1]) == message_text(predicted[-1])


def test_stream_of_an_action_is_one_event_with_its_outputs(agent):
    ids = run_trip(agent)
    events = list(agent.predict_stream(request(action="get_checkpoint_history", thread_id=ids["thread_id"], limit=2)))
    assert len(events) == 1
    assert events[0].type == "response.completed"
    custom = outputs(events[0])
    assert custom["thread_id"] == ids["thread_id"]
    assert [e["checkpoint_id"] for e in custom["history"]] == [ids["after_turn3"], ids["after_turn2"]]


def test_an_async_stream_closed_early_as_its_event_loop_ends_releases_the_thread(agent):
    thread_id = outputs(agent.predict(request("hi")))["thread_id"]

    async def leave_after_the_first_event():
        events = agent.apredict_stream(request("long " * 100, thread_id=thread_id))
        await events.__anext__()
        await events.aclose()

    asyncio.run(leave_after_the_first_event())  # the loop ends right after the close
    # Nothing of the left turn was written, and the thread is free at once (not ThreadBusy).
    after = outputs(agent.predict(request("after", thread_id=thread_id, multitask_strategy="reject")))
    assert [e["last_user_message"] for e in agent.get_checkpoint_history(thread_id)[:2]] == ["after", "hi"]
    assert after["thread_id"] == thread_id
