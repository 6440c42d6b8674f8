"""The context window on a real agent, on Postgres and SQLite: what each turn sends the model (recorded by
the offline model itself), the budget and its per-request override, summaries that belong to their branch,
the model input and token usage in checkpoint metadata and history, and the thread's and branch's totals."""

from __future__ import annotations

import asyncio
import logging
import math

import psycopg
import pytest

from agent.context.summaries import SUMMARY_HEADER, is_summary_message
from agent.errors import CheckpointNotFound, InvalidRequest, ThreadNotFound
from agent.models import model_input_note
from tests.helpers.offline import RecordingOfflineModel, received_tokens
from tests.helpers.scenario import outputs, request, say, text_of
from tests.helpers.stored_values import STORED_VALUES


def history(agent, thread_id: str) -> dict[str, dict]:
    return {entry["checkpoint_id"]: entry for entry in agent.get_checkpoint_history(thread_id, limit=1000)}


def stored(agent, thread_id: str, checkpoint_id: str | None = None) -> dict:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return agent.graph.get_state({"configurable": configurable}).values


def texts(messages) -> list[str]:
    return [m.text for m in messages]


def long_text(n: int) -> str:
    return f"Day {n}: the museum in the morning, lunch by the river, a concert at night, and a late train back."


def run_turns(agent, count: int, *, thread_id: str | None = None, start: int = 0) -> tuple[str, list[str]]:
    """`count` turns on the thread (a new one if None); returns its id and the checkpoint after each turn."""
    checkpoints = []
    for n in range(start, start + count):
        ids = outputs(say(agent, long_text(n), thread_id=thread_id))
        thread_id = ids["thread_id"]
        checkpoints.append(ids["checkpoint_id"])
    return thread_id, checkpoints


@pytest.fixture
def recording(backend_url, make_agent):
    """A factory: an agent on each backend whose offline model records what it is sent."""

    def make(**settings):
        model = RecordingOfflineModel()
        return make_agent(backend_url, model=model, **settings), model

    return make


def test_each_turn_records_what_the_model_was_sent_and_the_offline_reply_says_the_same(recording):
    agent, model = recording()
    first = say(agent, "I'm planning a trip!")
    thread_id = outputs(first)["thread_id"]
    second = say(agent, "I'm headed to SF!", thread_id=thread_id)
    entries = history(agent, thread_id)
    branch_input = branch_output = 0
    for response, sent in zip((first, second), model.calls, strict=True):
        entry = entries[outputs(response)["checkpoint_id"]]
        tokens = received_tokens(sent)
        reply = text_of(response)
        assert entry["model_input_messages"] == len(sent)
        assert entry["model_input_tokens"] == tokens
        assert entry["summary_used"] is False
        assert entry["usage"] == {"input_tokens": tokens, "output_tokens": math.ceil(len(reply) / 4)}
        branch_input, branch_output = branch_input + tokens, branch_output + math.ceil(len(reply) / 4)
        assert entry["branch_usage"] == {"input_tokens": branch_input, "output_tokens": branch_output}
        assert reply.endswith(" " + model_input_note(len(sent), tokens, summary=False))
    root = entries[outputs(first)["parent_checkpoint_id"]]
    assert not {"model_input_tokens", "usage", "branch_usage"} & set(root)


def test_a_streamed_turn_records_the_same_model_input_and_usage(recording):
    agent, model = recording()
    events = list(agent.predict_stream(request("I'm planning a trip!")))
    ids = events[-1].custom_outputs
    reply = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    entry = history(agent, ids["thread_id"])[ids["checkpoint_id"]]
    tokens = received_tokens(model.calls[-1])
    assert entry["model_input_tokens"] == tokens
    assert entry["usage"] == {"input_tokens": tokens, "output_tokens": math.ceil(len(reply) / 4)}


def test_a_state_update_keeps_the_branch_total_but_records_no_model_input(recording):
    agent, _ = recording()
    thread_id, [turn] = run_turns(agent, 1)
    update = agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "one more thing"}])
    entries = history(agent, thread_id)
    assert entries[update["checkpoint_id"]]["branch_usage"] == entries[turn]["branch_usage"]
    assert "model_input_tokens" not in entries[update["checkpoint_id"]]
    assert "usage" not in entries[update["checkpoint_id"]]


def test_a_long_thread_sends_the_model_only_its_newest_whole_turns_within_the_budget(recording):
    agent, model = recording(max_context_tokens=700)
    thread_id, checkpoints = run_turns(agent, 25)
    entries = history(agent, thread_id)
    messages = stored(agent, thread_id)["messages"]
    assert len(messages) == 50 and entries[checkpoints[-1]]["message_count"] == 50  # time travel sees everything
    for sent, checkpoint_id in zip(model.calls, checkpoints, strict=True):
        assert received_tokens(sent) == entries[checkpoint_id]["model_input_tokens"] <= 700
    last = model.calls[-1]
    assert last[0].type == "human" and texts(last) == texts(messages[len(messages) - 1 - len(last) : -1])
    assert len(last) < 49  # older turns were left out
    assert texts(model.calls[0]) == [long_text(0)]


def test_a_turn_may_ask_for_a_smaller_budget_but_not_for_a_larger_one(recording):
    agent, model = recording(max_context_tokens=1500)
    thread_id, _ = run_turns(agent, 12)
    # 700: the tool schemas alone (built-in and memory tools) take about 450 of them.
    small = say(agent, "Where was I on day 3?", thread_id=thread_id, max_context_tokens=700)
    assert history(agent, thread_id)[outputs(small)["checkpoint_id"]]["model_input_tokens"] <= 700
    assert received_tokens(model.calls[-1]) <= 700 < received_tokens(model.calls[-2])
    before = agent.get_checkpoint_history(thread_id, limit=1000)
    with pytest.raises(InvalidRequest, match="1500"):
        say(agent, "And now?", thread_id=thread_id, max_context_tokens=1501)
    assert agent.get_checkpoint_history(thread_id, limit=1000) == before  # nothing was written
    assert len(model.calls) == 13


def test_the_default_budget_is_the_models_and_is_in_the_settings(make_agent):
    agent = make_agent("memory://")
    assert agent.settings.max_context_tokens == 8_000
    with pytest.raises(InvalidRequest):
        say(agent, "hi", max_context_tokens=8_001)


# --- summaries ------------------------------------------------------------------------------------------
def summarized_thread(agent, turns: int = 14) -> tuple[str, list[str]]:
    thread_id, checkpoints = run_turns(agent, turns)
    assert stored(agent, thread_id)["context_summary"] is not None, "the budget is small enough to need a summary"
    return thread_id, checkpoints


def first_with_summary(agent, thread_id: str, checkpoints: list[str]) -> int:
    return next(i for i, c in enumerate(checkpoints) if stored(agent, thread_id, c).get("context_summary"))


def test_summarize_folds_the_oldest_turns_into_a_summary_the_model_reads_first(recording):
    agent, model = recording(max_context_tokens=900, context_strategy="summarize")
    thread_id, checkpoints = summarized_thread(agent)
    entries = history(agent, thread_id)
    summary = stored(agent, thread_id)["context_summary"]
    messages = stored(agent, thread_id)["messages"]
    sent = model.turn_calls()[-1]
    assert is_summary_message(sent[0])
    assert sent[0].text == SUMMARY_HEADER.format(messages=summary["messages"]) + summary["text"]
    assert texts(sent[1:]) == texts(messages[summary["count"] : -1])  # then the newest turns, in order
    assert messages[summary["count"] - 1].id == summary["through"]
    assert summary["text"].startswith("[offline summary] The user said, in order:")
    assert entries[checkpoints[-1]]["summary_used"] is True
    assert text_of(agent.predict(request("Where was I?", thread_id=thread_id))).endswith("with a summary]")
    for sent in model.turn_calls():
        assert received_tokens(sent) <= 900


def test_a_branch_from_before_the_summary_never_sees_it_or_the_other_branch(recording):
    agent, model = recording(max_context_tokens=900, context_strategy="summarize")
    thread_id, checkpoints = summarized_thread(agent)
    branch_point = checkpoints[2]
    assert stored(agent, thread_id, branch_point).get("context_summary") is None
    ids = outputs(say(agent, "Let's go to Tokyo instead.", thread_id=thread_id, checkpoint_id=branch_point))
    own = stored(agent, thread_id, ids["checkpoint_id"])["messages"]
    sent = model.turn_calls()[-1]
    assert not any(map(is_summary_message, sent))
    assert texts(sent) == texts(own[:-1])  # exactly its own branch: no message of the other one
    assert history(agent, thread_id)[ids["checkpoint_id"]]["summary_used"] is False
    assert stored(agent, thread_id, ids["checkpoint_id"]).get("context_summary") is None


def test_a_branch_from_after_the_summary_reuses_it(recording):
    agent, model = recording(max_context_tokens=900, context_strategy="summarize")
    thread_id, checkpoints = summarized_thread(agent)
    # Right after a fold the kept turns take at most half the room: a short turn there needs no new fold.
    at = checkpoints[first_with_summary(agent, thread_id, checkpoints)]
    summary = stored(agent, thread_id, at)["context_summary"]
    ids = outputs(say(agent, "ok", thread_id=thread_id, checkpoint_id=at))
    sent = model.turn_calls()[-1]
    assert is_summary_message(sent[0]) and sent[0].text.endswith(summary["text"])
    assert stored(agent, thread_id, ids["checkpoint_id"])["context_summary"] == summary


def test_a_summary_is_stored_in_the_checkpoint_of_the_turn_that_made_it_and_inherited_by_its_children(recording):
    agent, model = recording(max_context_tokens=900, context_strategy="summarize")
    thread_id, checkpoints = summarized_thread(agent)
    made = first_with_summary(agent, thread_id, checkpoints)
    assert all(stored(agent, thread_id, c).get("context_summary") is None for c in checkpoints[:made])
    first = stored(agent, thread_id, checkpoints[made])["context_summary"]
    # The summary request went to the chat model in that turn, and its usage counts in the turn's usage.
    requests = [call for call in model.calls if call not in model.turn_calls()]
    assert requests, "a summary request reached the model"
    entry = history(agent, thread_id)[checkpoints[made]]
    turn_input = received_tokens(model.turn_calls()[made])
    assert entry["usage"]["input_tokens"] > turn_input  # the summary request's tokens are in it
    assert first["count"] > 0


def test_editing_a_summarized_message_retires_the_summary_and_the_next_summary_reads_the_edit(recording):
    agent, model = recording(max_context_tokens=900, context_strategy="summarize")
    thread_id, _ = summarized_thread(agent)
    state = stored(agent, thread_id)
    first_user = state["messages"][0]
    assert state["context_summary"]["count"] > 0
    edited = agent.operation_context.turns.update_state(
        thread_id, None, [type(first_user)(content="I'm going to Lisbon.", id=first_user.id)], user_id=None
    )
    assert stored(agent, thread_id, edited.checkpoint_id).get("context_summary") is None
    calls_before = len(model.calls)
    say(agent, "Where am I going?", thread_id=thread_id)
    assert stored(agent, thread_id)["context_summary"] is not None
    # A new summary was made from the branch's first message on, which now reads as edited.
    [request, *_] = [call for call in model.calls[calls_before:] if call not in model.turn_calls()]
    assert len(request) > 1 and not is_summary_message(request[1])  # no earlier summary to grow
    assert "I'm going to Lisbon." in texts(request) and long_text(0) not in texts(request)


def test_the_async_path_summarizes_and_records_the_same_way(recording):
    agent, model = recording(max_context_tokens=900, context_strategy="summarize")

    async def turns():
        thread_id = None
        for n in range(14):
            response = await agent.apredict(request(long_text(n), thread_id=thread_id))
            thread_id = outputs(response)["thread_id"]
        return thread_id, outputs(response)["checkpoint_id"]

    thread_id, head = asyncio.run(turns())
    assert stored(agent, thread_id)["context_summary"] is not None
    entry = history(agent, thread_id)[head]
    assert entry["summary_used"] is True
    assert entry["model_input_tokens"] == received_tokens(model.turn_calls()[-1])


# --- token totals ---------------------------------------------------------------------------------------
def test_thread_and_branch_usage_totals_add_up_every_turn_once(recording):
    agent, _ = recording()
    thread_id, trunk = run_turns(agent, 3)
    branch = outputs(say(agent, "A branch from turn 1.", thread_id=thread_id, checkpoint_id=trunk[0]))["checkpoint_id"]
    entries = history(agent, thread_id)

    def total(ids):
        return {key: sum(entries[i]["usage"][key] for i in ids) for key in ("input_tokens", "output_tokens")}

    usage = agent.get_usage(thread_id)
    assert usage["checkpoint_id"] == branch  # the head
    assert usage["thread_usage"] == total([*trunk, branch])
    assert usage["branch_usage"] == total([trunk[0], branch]) == entries[branch]["branch_usage"]
    assert agent.get_usage(thread_id, trunk[-1])["branch_usage"] == total(trunk)
    assert agent.get_usage(thread_id, entries[trunk[0]]["parent_checkpoint_id"])["branch_usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
    }
    action = agent.predict(request(None, thread_id=thread_id, checkpoint_id=trunk[-1], action="get_usage"))
    assert outputs(action) == agent.get_usage(thread_id, trunk[-1])


def test_usage_of_an_unknown_checkpoint_or_of_someone_elses_thread_is_not_found(recording):
    agent, _ = recording()
    thread_id = outputs(say(agent, "mine", user_id="alice"))["thread_id"]
    with pytest.raises(CheckpointNotFound):
        agent.get_usage(thread_id, "no-such-checkpoint", user_id="alice")
    with pytest.raises(ThreadNotFound):
        agent.get_usage(thread_id, user_id="bob")


def test_the_token_counter_and_budget_are_logged_at_start_up(make_agent, caplog):
    with caplog.at_level(logging.INFO, logger="agent.context.window"):
        make_agent("memory://", max_context_tokens=1234, context_strategy="summarize")
    assert "max_context_tokens=1234, context_strategy=summarize, token counter: approximate" in caplog.text


def test_an_unchanged_summary_is_stored_once_not_once_per_checkpoint(pg_url, make_agent):
    agent = make_agent(pg_url, max_context_tokens=900, context_strategy="summarize")
    thread_id, checkpoints = run_turns(agent, 24)
    summaries = {str(stored(agent, thread_id, c).get("context_summary")) for c in checkpoints} - {"None"}
    with psycopg.connect(pg_url) as conn:
        rows = dict(
            conn.execute(
                f"SELECT channel, count(*) FROM {STORED_VALUES} WHERE thread_id = %s GROUP BY channel",
                (thread_id,),
            ).fetchall()
        )
    assert 1 <= rows["context_summary"] == len(summaries) < len(checkpoints)
    # What each turn sent the model is metadata, not a state channel with a blob per turn.
    assert set(rows) == {"messages", "context_summary"}
