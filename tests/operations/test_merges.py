"""`merge_branch` is a turn: claimed, owned and streamed (agent.operations.merges).

Through `predict_stream` with `custom_inputs.action="merge_branch"`, on Postgres and SQLite, with the
offline model: the summary streams as text deltas (the model's chunks) that add up to the merged message,
the events are a turn's (the last item and the final event carry the new checkpoint, which is the head),
`messages` mode streams its copies whole, an idempotent retry replays the first merge, a stream closed
early writes nothing and frees the thread, and a newer turn that interrupts the thread stops the merge
with nothing written. The HTTP streams (`POST /responses`, `/invocations`) are checked in
`tests/serving/test_responses_conformance.py` and `tests/serving/test_agent_server.py`.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent import TurnCancelled
from agent.context.summaries import SUMMARY_PROMPT
from agent.models.offline import OfflineChatModel
from agent.operations.merges import SUMMARY_PREFIX
from tests.helpers.reliability import gated_model
from tests.helpers.scenario import outputs, request, say
from tests.test_streaming import COMPLETED, DELTA, DONE, done_items, message_text

ADDED = "response.output_item.added"


def forked_trip(agent, **custom) -> dict:
    """A thread that branched: SF after the first turn, then NY from the same place (the head)."""
    first = outputs(say(agent, "planning a trip", **custom))
    thread_id = first["thread_id"]
    sf = outputs(say(agent, "headed to SF, booked the Golden Gate hotel", thread_id=thread_id, **custom))
    ny = outputs(say(agent, "headed to NY instead", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], **custom))
    return {"thread_id": thread_id, "first": first["checkpoint_id"], "sf": sf["checkpoint_id"], "ny": ny["checkpoint_id"]}


def merge_request(ids: dict, **custom) -> dict:
    return request(
        None, action="merge_branch", thread_id=ids["thread_id"], checkpoint_id=ids["ny"], source_checkpoint_id=ids["sf"], **custom
    )


def events_of(stream) -> list[dict]:
    return [event.model_dump(exclude_none=True) for event in stream]


def test_a_summary_merge_streams_the_models_tokens_as_deltas_and_ends_like_a_turn(agent):
    ids = forked_trip(agent)
    events = events_of(agent.predict_stream(merge_request(ids)))
    deltas = [e for e in events if e["type"] == DELTA]
    [merged] = done_items(events)
    # The prefix, then the offline model's chunks (three words each): several deltas, adding up to the message.
    assert deltas[0]["delta"] == SUMMARY_PREFIX and len(deltas) >= 4
    assert "".join(d["delta"] for d in deltas) == message_text(merged)
    assert "Golden Gate" in message_text(merged) and {d["item_id"] for d in deltas} == {merged["id"]}
    assert events.index(deltas[-1]) < events.index(next(e for e in events if e["type"] == DONE))
    # A turn's ending: the last item and response.completed carry the new checkpoint, which is the head.
    last, completed = events[-2:]
    assert (last["type"], completed["type"]) == (DONE, COMPLETED)
    custom = completed["custom_outputs"]
    assert last["custom_outputs"] == custom and custom["parent_checkpoint_id"] == ids["ny"]
    assert completed["response"]["id"] == custom["response_id"] == f"resp_{custom['checkpoint_id']}"
    assert completed["response"]["output"] == [merged]
    state = agent.get_checkpoint_state(ids["thread_id"])
    assert state["checkpoint_id"] == custom["checkpoint_id"] and state["merged_from"]["checkpoint_id"] == ids["sf"]
    assert state["messages"][-1]["content"][0]["text"] == message_text(merged)
    # The source branch is unchanged.
    assert agent.get_checkpoint_state(ids["thread_id"], ids["sf"])["message_count"] == 4


def test_a_merge_is_answered_like_a_turn_whole_too_with_the_merged_message_as_output(agent):
    ids = forked_trip(agent)
    answer = agent.predict(merge_request(ids))
    [item] = [item.model_dump(exclude_none=True) for item in answer.output]
    assert item["type"] == "message" and message_text(item).startswith(SUMMARY_PREFIX)
    assert answer.id == f"resp_{answer.custom_outputs['checkpoint_id']}"
    # The Python method runs the same body to its end.
    again = agent.merge_branch(ids["thread_id"], ids["sf"], answer.custom_outputs["checkpoint_id"])
    assert again["parent_checkpoint_id"] == answer.custom_outputs["checkpoint_id"]
    assert again["response_id"] == f"resp_{again['checkpoint_id']}"


def test_a_messages_merge_streams_its_assistant_copies_whole(agent):
    ids = forked_trip(agent)
    asked, reply = agent.get_checkpoint_state(ids["thread_id"], ids["sf"])["messages"][-2:]
    body = merge_request(ids, mode="messages", message_ids=[asked["id"], reply["id"]], include=["state"])
    events = events_of(agent.predict_stream(body))
    # A Responses output holds assistant messages only (as a turn's does): the user's copy is in the state.
    [copy] = done_items(events)
    assert message_text(copy) == reply["content"][0]["text"] and copy["id"] != reply["id"]
    assert [e["delta"] for e in events if e["type"] == DELTA] == [message_text(copy)]
    custom = events[-1]["custom_outputs"]
    assert custom["checkpoint_id"] == agent.get_head(ids["thread_id"])["checkpoint_id"]
    texts = [message["content"][0]["text"] for message in custom["state"]["messages"][-2:]]
    assert texts == [asked["content"][0]["text"], reply["content"][0]["text"]]


def test_an_idempotent_retry_of_a_streamed_merge_replays_it_and_writes_nothing(agent):
    ids = forked_trip(agent)
    body = {**merge_request(ids)}
    body["custom_inputs"] = {**body["custom_inputs"], "idempotency_key": "merge-once"}
    first = events_of(agent.predict_stream(body))
    history = agent.get_checkpoint_history(ids["thread_id"])
    again = events_of(agent.predict_stream(body))
    assert again[-1]["custom_outputs"] == first[-1]["custom_outputs"]
    assert message_text(done_items(again)[-1]) == message_text(done_items(first)[-1])
    assert agent.get_checkpoint_history(ids["thread_id"]) == history


def test_a_merge_stream_closed_after_its_first_delta_writes_nothing_and_frees_the_thread(agent):
    ids = forked_trip(agent)
    history = agent.get_checkpoint_history(ids["thread_id"])
    stream = agent.predict_stream(merge_request(ids))
    assert next(e for e in events_of(_first_delta(stream)) if e["type"] == DELTA)
    stream.close()
    assert agent.get_checkpoint_history(ids["thread_id"]) == history
    # Released: a turn that refuses to wait gets the thread at once.
    turn = say(agent, "what now?", thread_id=ids["thread_id"], multitask_strategy="reject")
    assert outputs(turn)["parent_checkpoint_id"] == ids["ny"]


def _first_delta(stream):
    for event in stream:
        yield event
        if event.type == DELTA:
            return


class SummarizesSlowly(OfflineChatModel):
    """The offline model, except that a summary waits for `gate` after its first chunk (a merge stays mid-stream)."""

    gate: object = None

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        first = True
        async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
            yield chunk
            if first and messages[-1].content == SUMMARY_PROMPT:
                await asyncio.to_thread(self.gate.wait, 30)
            first = False


def test_a_newer_turn_that_interrupts_the_thread_stops_the_merge_with_nothing_written(backend_url, make_agent):
    gate = threading.Event()
    agent = make_agent(backend_url, model=SummarizesSlowly(gate=gate))
    ids = forked_trip(agent)
    stream = agent.predict_stream(merge_request(ids))
    try:
        events = events_of(_first_delta(stream))  # the model is writing the summary
        assert events[-1]["type"] == DELTA
        newer = say(agent, "forget SF, what about Boston?", thread_id=ids["thread_id"], multitask_strategy="interrupt")
        with pytest.raises(TurnCancelled):
            list(stream)
    finally:
        gate.set()
        stream.close()
    history = agent.get_checkpoint_history(ids["thread_id"])
    assert not any(entry.get("merged_from") for entry in history)
    assert outputs(newer)["parent_checkpoint_id"] == ids["ny"] == history[1]["checkpoint_id"]


def test_a_merge_counts_as_a_turn_for_admission_and_tracing_and_a_read_does_not():
    from agent.requests import asks_for_turn

    assert asks_for_turn({"custom_inputs": {"action": "merge_branch"}}) is True
    assert asks_for_turn({"input": "hi"}) is True
    assert asks_for_turn({"custom_inputs": {"action": "get_checkpoint_history"}}) is False



def test_a_merge_cancelled_while_it_waits_for_the_thread_leaves_no_claim_behind(backend_url, make_agent):
    """Without the hand-off its wait went on in the storage thread, and the claim it got was held by nobody."""
    model = gated_model()
    agent = make_agent(backend_url, model=model)
    ids = forked_trip(agent)
    slow = threading.Thread(target=say, args=(agent, "block here"), kwargs={"thread_id": ids["thread_id"]})
    slow.start()
    assert model.entered.wait(30)  # the slow turn holds the thread

    async def cancelled_merge() -> None:
        async def consume() -> None:
            async for _ in agent.apredict_stream(merge_request(ids, multitask_strategy="enqueue")):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(1.0)  # the merge waits behind the slow turn
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancelled_merge())
    finally:
        model.gate.set()
        slow.join(30)
    # Free: a turn that refuses to wait gets the thread at once, after the slow turn's checkpoint.
    slow_head = agent.get_checkpoint_history(ids["thread_id"])[0]["checkpoint_id"]
    turn = say(agent, "what now?", thread_id=ids["thread_id"], multitask_strategy="reject")
    assert outputs(turn)["parent_checkpoint_id"] == slow_head
    assert not any(entry.get("merged_from") for entry in agent.get_checkpoint_history(ids["thread_id"]))
