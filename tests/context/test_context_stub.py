"""The context window through the real langchain-openai path, against the OpenAI-compatible stub started as a
process with a context limit (it answers 400 `context_length_exceeded` above it), on Postgres and SQLite:
a long thread never exceeds it, the agent counts the prompt exactly as the model does, and summaries
are written by the chat model through the stub.

The long thread is 150 turns: the window first drops turns at about turn 6, and under `summarize` about 70
summaries are written, so both strategies go through their whole cycle many times over. It was 500 turns,
half a minute of CPU per case on the suite's 2-CPU machine; the 500-turn figures are the context
benchmark's (`bench/context.py`)."""

from __future__ import annotations

import json

import pytest

from agent.context.summaries import SUMMARY_INSTRUCTIONS, SUMMARY_PROMPT
from agent.errors import ModelError
from tests.helpers.openai_stub import (
    MARKER,
    answer,
    configure_stub,
    count_prompt_tokens,
    openai_stub_server,
    received,
    reset_stub,
)
from tests.helpers.scenario import outputs, say

#: The stub's context limit, and the agent's budget.
LIMIT = 1200
TURNS = 150

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stub_url():
    with openai_stub_server(max_context_tokens=LIMIT) as base_url:
        yield base_url


@pytest.fixture
def stub(stub_url, monkeypatch):
    """The stub, reset, as the agent's model server (`model="fake"` through `OPENAI_BASE_URL`)."""
    configure_stub(stub_url, max_context_tokens=LIMIT)
    reset_stub(stub_url)
    monkeypatch.setenv("OPENAI_BASE_URL", stub_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return stub_url




def text(n: int) -> str:
    return f"Turn {n}: tomorrow the museum, then lunch by the river and a late train back to the hotel."


def run(agent, turns: int) -> str:
    thread_id = None
    for n in range(turns):
        thread_id = outputs(say(agent, text(n), thread_id=thread_id))["thread_id"]
    return thread_id


def is_summary_body(body: dict) -> bool:
    first = body["messages"][0]
    return first["role"] == "system" and first["content"].startswith(SUMMARY_INSTRUCTIONS.split("{")[0])


# Each strategy on one backend: the window is built the same way on both, and a long thread costs the suite
# seconds of CPU per case.
@pytest.mark.parametrize(("backend_url", "strategy"), [("postgres", "summarize"), ("sqlite", "trim")], indirect=["backend_url"])
def test_a_long_thread_never_exceeds_the_models_context(stub, backend_url, make_agent, strategy):
    agent = make_agent(backend_url, model="fake", max_context_tokens=LIMIT, context_strategy=strategy)
    thread_id = run(agent, TURNS)  # a request over the limit would raise ModelError
    bodies = received(stub)
    assert all(count_prompt_tokens(body) <= LIMIT for body in bodies)
    turns = [entry for entry in agent.get_checkpoint_history(thread_id, limit=1000) if entry["source"] == "loop"]
    assert len(turns) == TURNS and turns[0]["message_count"] == 2 * TURNS
    turn_bodies = [body for body in bodies if not is_summary_body(body)]
    assert len(turn_bodies) == TURNS
    for entry, body in zip(reversed(turns), turn_bodies, strict=True):
        # The agent's count of what it sent is the model's own count of what it received.
        assert entry["model_input_tokens"] == count_prompt_tokens(body) <= LIMIT
        assert entry["model_input_messages"] == len(body["messages"])
    if strategy == "trim":
        assert all(entry["usage"]["input_tokens"] == entry["model_input_tokens"] for entry in turns)
        assert not any(entry["summary_used"] for entry in turns)
    else:
        assert sum(entry["summary_used"] for entry in turns) > TURNS // 2
    usage = agent.get_usage(thread_id)
    assert usage["thread_usage"] == usage["branch_usage"]
    assert usage["thread_usage"]["input_tokens"] == sum(entry["usage"]["input_tokens"] for entry in turns)


def test_the_summary_is_written_by_the_chat_model_through_the_stub(stub, backend_url, make_agent):
    agent = make_agent(backend_url, model="fake", max_context_tokens=LIMIT, context_strategy="summarize")
    thread_id = run(agent, 30)
    summaries = [body for body in received(stub) if is_summary_body(body)]
    assert summaries, "the thread outgrew the budget"
    last = summaries[-1]
    assert last["messages"][-1] == {"role": "user", "content": SUMMARY_PROMPT}
    assert last["tool_choice"] == "none" and last["tools"]  # tools defined, never called
    assert all(count_prompt_tokens(body) <= LIMIT for body in summaries)
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    summary = agent.graph.get_state(config).values["context_summary"]
    # The stored summary is the stub's reply to the last request (cut to the summary's share of the budget).
    reply = answer(last)["content"]
    assert summary["text"].startswith(MARKER + "You said, in order: ") and reply.startswith(summary["text"])


def test_without_a_budget_below_its_context_the_model_refuses_a_long_thread(stub, backend_url, make_agent):
    # The control for the tests above: the same thread with a budget larger than the model's context fails.
    agent = make_agent(backend_url, model="fake", max_context_tokens=10 * LIMIT)
    with pytest.raises(ModelError, match=f"maximum context length is {LIMIT} tokens"):
        run(agent, 40)
