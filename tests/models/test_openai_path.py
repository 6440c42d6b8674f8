"""The langchain-openai path end to end: `create_agent(model="fake")` (and a `ChatOpenAI` instance)
talking HTTP to the fake OpenAI-compatible server in `tests.helpers.openai_stub`, JSON and SSE.

What the server received (GET /_requests) shows which history the agent sent on each call.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from langchain_openai import ChatOpenAI

from agent.config import DEFAULT_OPENAI_MODEL
from tests.helpers.openai_stub import MARKER, openai_stub_server
from tests.helpers.scenario import TRIP, outputs, request, run_trip, say, text_of

NEW_YORK = "I'm headed to New York!"


class FakeOpenAI:
    """The running fake server: its base URL and what it received."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.root = base_url.removesuffix("/v1")

    def received(self) -> list[dict]:
        """Every chat completions request body since the last reset, oldest first."""
        with urllib.request.urlopen(f"{self.root}/_requests", timeout=10) as response:
            return json.load(response)

    def reset(self) -> None:
        reset = urllib.request.Request(f"{self.root}/_reset", data=b"", method="POST")
        urllib.request.urlopen(reset, timeout=10).close()


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeOpenAI]:
    with openai_stub_server() as base_url:
        yield FakeOpenAI(base_url)


@pytest.fixture
def fake_openai(fake_server: FakeOpenAI, monkeypatch) -> FakeOpenAI:
    """The fake server, reset, with OPENAI_BASE_URL / OPENAI_API_KEY pointing at it."""
    fake_server.reset()
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key-for-the-fake-server")
    monkeypatch.delenv("AGENT_MODEL", raising=False)
    return fake_server


def user_texts(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def stream_events(agent, text: str, **custom_inputs) -> list[dict]:
    return [e.model_dump(exclude_none=True) for e in agent.predict_stream(request(text, **custom_inputs))]


def done_items(events: list[dict]) -> list[dict]:
    return [e["item"] for e in events if e["type"] == "response.output_item.done"]


def streamed_reply(events: list[dict]) -> str:
    """The text of the finished assistant message items of a stream."""
    return "".join(part["text"] for item in done_items(events) if item["type"] == "message" for part in item["content"])


def test_trip_and_branch_through_the_openai_client(backend_url, make_agent, fake_openai):
    agent = make_agent(backend_url, model="fake")
    ids = run_trip(agent)
    assert ids["answer"].startswith(MARKER)
    assert "SF" in ids["answer"] and TRIP[0] in ids["answer"]
    branched = say(agent, NEW_YORK, thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    answer = say(agent, "Where am I going?", thread_id=ids["thread_id"])
    assert outputs(branched)["parent_checkpoint_id"] == ids["after_turn1"]
    assert "New York" in text_of(answer) and "SF" not in text_of(answer)

    bodies = fake_openai.received()
    assert len(bodies) == 5
    assert {body["model"] for body in bodies} == {"fake"}
    assert [user_texts(body) for body in bodies] == [
        [TRIP[0]],
        [TRIP[0], TRIP[1]],
        list(TRIP),
        [TRIP[0], NEW_YORK],
        [TRIP[0], NEW_YORK, "Where am I going?"],
    ]
    # The third call carries the whole thread, the assistant's earlier replies included.
    assert [m["role"] for m in bodies[2]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    # The branch call has the turn-1 checkpoint's messages only: no SF anywhere.
    assert [m["role"] for m in bodies[3]["messages"]] == ["user", "assistant", "user"]
    assert "SF" not in json.dumps(bodies[3]["messages"]) and "SF" not in json.dumps(bodies[4]["messages"])
    # Tools are offered on every call.
    assert all("calculator" in {t["function"]["name"] for t in body.get("tools", [])} for body in bodies)


def test_streamed_trip_and_branch_use_sse_and_stream_deltas(make_agent, fake_openai):
    agent = make_agent("memory://", model="fake")
    first = stream_events(agent, TRIP[0])
    thread_id = first[-1]["custom_outputs"]["thread_id"]
    after_turn1 = first[-1]["custom_outputs"]["checkpoint_id"]
    stream_events(agent, TRIP[1], thread_id=thread_id)
    third = stream_events(agent, TRIP[2], thread_id=thread_id)
    deltas = [e["delta"] for e in third if e["type"] == "response.output_text.delta"]
    # The fake server sends three words per SSE chunk.
    assert len(deltas) >= 3
    assert "".join(deltas) == streamed_reply(third)
    assert "SF" in streamed_reply(third)
    branch = stream_events(agent, NEW_YORK, thread_id=thread_id, checkpoint_id=after_turn1)
    assert branch[-1]["custom_outputs"]["parent_checkpoint_id"] == after_turn1
    assert "New York" in streamed_reply(branch) and "SF" not in streamed_reply(branch)
    head = agent.get_checkpoint_history(thread_id, limit=1)[0]
    assert head["checkpoint_id"] == branch[-1]["custom_outputs"]["checkpoint_id"]

    bodies = fake_openai.received()
    assert len(bodies) == 4
    assert all(body["stream"] is True for body in bodies)
    assert user_texts(bodies[3]) == [TRIP[0], NEW_YORK]


def test_tool_call_round_trip_through_the_openai_client(make_agent, fake_openai):
    agent = make_agent("memory://", model="fake")
    for how in ("predict", "predict_stream"):
        fake_openai.reset()
        if how == "predict":
            response = agent.predict(request("calculate 2*(3+4)"))
            items = [item.model_dump(exclude_none=True) for item in response.output]
        else:
            items = done_items(stream_events(agent, "calculate 2*(3+4)"))
        assert [item["type"] for item in items] == ["function_call", "function_call_output", "message"]
        assert items[1]["output"] == "14"
        assert "14" in "".join(part["text"] for part in items[2]["content"])
        first, second = fake_openai.received()
        assert first["messages"][-1] == {"role": "user", "content": "calculate 2*(3+4)"}
        call = second["messages"][-2]
        assert call["role"] == "assistant" and call["tool_calls"][0]["function"]["name"] == "calculator"
        assert second["messages"][-1] == {"role": "tool", "content": "14", "tool_call_id": call["tool_calls"][0]["id"]}


def test_chat_openai_instance_as_model_uses_json_for_predict_and_sse_for_predict_stream(
    make_agent, fake_openai, monkeypatch
):
    # The instance carries its own base URL and key; the environment must not be what makes it work.
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    model = ChatOpenAI(base_url=fake_openai.base_url, api_key="test-key", model="fake")
    agent = make_agent("memory://", model=model)
    ids = run_trip(agent)
    assert ids["answer"].startswith(MARKER) and "SF" in ids["answer"]
    events = stream_events(agent, NEW_YORK, thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    assert len([e for e in events if e["type"] == "response.output_text.delta"]) >= 3
    assert "New York" in streamed_reply(events) and "SF" not in streamed_reply(events)

    bodies = fake_openai.received()
    assert [body.get("stream", False) for body in bodies] == [False, False, False, True]
    assert user_texts(bodies[-1]) == [TRIP[0], NEW_YORK]


def test_agent_model_env_var_names_the_openai_model(make_agent, fake_openai, monkeypatch):
    monkeypatch.setenv("AGENT_MODEL", "fake")
    agent = make_agent("memory://", model=None)
    assert text_of(say(agent, TRIP[1])).startswith(MARKER)
    assert [body["model"] for body in fake_openai.received()] == ["fake"]


def test_openai_base_url_alone_selects_the_default_openai_model_without_a_key(make_agent, fake_openai, monkeypatch):
    # Local OpenAI-compatible servers (vLLM, Ollama) need no key.
    monkeypatch.delenv("OPENAI_API_KEY")
    agent = make_agent("memory://", model=None)
    assert text_of(say(agent, TRIP[1])).startswith(MARKER)
    assert [body["model"] for body in fake_openai.received()] == [DEFAULT_OPENAI_MODEL]
