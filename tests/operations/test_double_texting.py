"""Double texting: `interrupt` and `rollback`, as LangGraph Agent Server defines them.

A new turn on a thread that another turn holds asks the running turn to stop,
then waits for the thread (up to `enqueue_timeout`):

* `interrupt`: the running turn commits its input and what it produced so far as
  its own checkpoint (metadata `interrupted: true`; an unfinished streamed reply
  is kept as an AI message with `response_metadata.interrupted`), and its caller
  gets `custom_outputs.status == "interrupted"`. The new turn starts from there.
* `rollback`: the running turn writes nothing and its caller gets `TurnCancelled`
  (HTTP 409). The new turn starts from the previous head.

Either way the thread's history stays one linear chain. Shown for every way of
running the stopped turn (predict, predict_stream, apredict, apredict_stream),
with the strategy as a setting and per request, on Postgres and SQLite; with the
stopped turn in another process; and over `tt-agent serve`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from agent.errors import ThreadBusy, TurnCancelled
from tests.helpers.error_bodies import openai_code
from tests.helpers.openai_stub import configure_stub, openai_stub_server
from tests.helpers.claims import other_replica_holds
from tests.helpers.reliability import HANG_TIMEOUT, Child, gated_model, head_messages, user_texts
from tests.helpers.scenario import outputs, request, say
from tests.helpers.servers import free_port, server_process

PATHS = ("predict", "predict_stream", "apredict", "apredict_stream")
STRATEGIES = ("interrupt", "rollback")


def history(agent, thread_id: str) -> list[dict]:
    return agent.get_checkpoint_history(thread_id, limit=100)


def assert_linear(entries: list[dict]) -> None:
    """History entries (newest first) form one chain: each is the parent of the one before it."""
    assert [e["parent_checkpoint_id"] for e in entries[:-1]] == [e["checkpoint_id"] for e in entries[1:]]


def run_turn(agent, body: dict, path: str) -> tuple[dict, str]:
    """Run one turn by `path`; returns (custom_outputs, the text the caller saw streamed or returned)."""
    if path == "predict":
        response = agent.predict(body)
        return outputs(response), ""
    if path == "predict_stream":
        events = list(agent.predict_stream(body))
        return events[-1].custom_outputs, "".join(e.delta for e in events if e.type == "response.output_text.delta")
    if path == "apredict":
        return outputs(asyncio.run(agent.apredict(body))), ""

    async def consume():
        return [event async for event in agent.apredict_stream(body)]

    events = asyncio.run(consume())
    return events[-1].custom_outputs, "".join(e.delta for e in events if e.type == "response.output_text.delta")


def wait_for_cancel_request(agent, thread_id: str) -> None:
    """Wait until this process's running turn on `thread_id` was asked to stop (or has already ended)."""
    deadline = time.monotonic() + HANG_TIMEOUT
    while (claim := agent.storage.keeper.local(thread_id)) is not None and claim.cancel is None:
        assert time.monotonic() < deadline, "the running turn was never asked to stop"
        time.sleep(0.01)


@pytest.mark.parametrize("where", ["setting", "custom_inputs"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("path", PATHS)
def test_a_newer_turn_stops_the_running_one_in_process(backend_url, make_agent, path, strategy, where):
    model = gated_model(mid_stream=True)
    if where == "setting":
        agent = make_agent(backend_url, model=model, multitask_strategy=strategy)
        custom: dict[str, Any] = {}
    else:
        agent = make_agent(backend_url, model=model)
        custom = {"multitask_strategy": strategy}
    thread_id = outputs(say(agent, "start"))["thread_id"]
    head_before = history(agent, thread_id)[0]["checkpoint_id"]

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(run_turn, agent, request("block: the first text", thread_id=thread_id), path)
        try:
            assert model.entered.wait(HANG_TIMEOUT)
            newer = pool.submit(say, agent, "the second text", thread_id=thread_id, **custom)
            if path.startswith("predict"):
                # Opened only once the request to stop arrived: the sync turn stops with its model call pending.
                wait_for_cancel_request(agent, thread_id)
                model.gate.set()
            # The async turns stop with the gate still shut: the pending model call is cancelled.
            second = outputs(newer.result(timeout=HANG_TIMEOUT))
        finally:
            model.gate.set()
        if strategy == "rollback":
            with pytest.raises(TurnCancelled) as cancelled:
                running.result(timeout=HANG_TIMEOUT)
            assert "nothing was written" in cancelled.value.message
        else:
            first, seen = running.result(timeout=HANG_TIMEOUT)

    entries = history(agent, thread_id)
    assert_linear(entries)
    messages = head_messages(agent, thread_id)
    if strategy == "rollback":
        # Nothing of the stopped turn; the newer one starts from the previous head.
        assert second["parent_checkpoint_id"] == head_before
        assert [e["checkpoint_id"] for e in entries[:2]] == [second["checkpoint_id"], head_before]
        assert user_texts(messages) == ["start", "the second text"]
        return

    assert first["status"] == "interrupted" and "status" not in second
    assert second["parent_checkpoint_id"] == first["checkpoint_id"]
    assert first["parent_checkpoint_id"] == head_before
    assert [e["checkpoint_id"] for e in entries[:3]] == [second["checkpoint_id"], first["checkpoint_id"], head_before]
    assert entries[1]["interrupted"] is True and "interrupted" not in entries[0]
    assert user_texts(messages) == ["start", "block: the first text", "the second text"]
    # What the stopped turn produced is in its checkpoint, right after its input.
    kept = head_messages_at(agent, thread_id, first["checkpoint_id"])
    assert isinstance(kept[2], HumanMessage) and kept[2].text == "block: the first text"
    if path in ("apredict", "predict"):
        # Stopped before the model answered: the input alone (the sync path runs the same async turn).
        assert len(kept) == 3
    else:
        partial = kept[3]
        assert isinstance(partial, AIMessage) and partial.response_metadata["interrupted"] is True
        assert partial.text == seen  # exactly the text its caller saw streamed
        full = model._reply(kept[:3]).text
        assert full.startswith(partial.text) and len(partial.text) < len(full)
    # The newer turn's model saw the stopped turn's input.
    assert '"block: the first text"' in messages[-1].text


def head_messages_at(agent, thread_id: str, checkpoint_id: str) -> list:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    return list(agent.graph.get_state(config).values["messages"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_turn_that_does_not_stop_in_time_leaves_the_newer_one_thread_busy(backend_url, make_agent, strategy):
    # The holder here is another replica that never answers the request to stop.
    agent = make_agent(backend_url, enqueue_timeout=0.5)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    before = history(agent, thread_id)
    with other_replica_holds(backend_url, thread_id):
        with pytest.raises(ThreadBusy):
            say(agent, "stop it", thread_id=thread_id, multitask_strategy=strategy)
    assert history(agent, thread_id) == before


# --- across processes ------------------------------------------------------------------------

# A child process whose turn streams a first chunk and then goes on slowly for minutes; it says
# "ready" once the first chunk is out, and prints its custom_outputs or the error it got.
CHILD_SLOW_TURN = """
import asyncio, json, sys, time
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk
from agent import create_agent
from agent.errors import AgentError
from agent.models import OfflineChatModel

def chunk(n):
    return ChatGenerationChunk(message=AIMessageChunk(content=f"part {n} "))

class Slow(OfflineChatModel):
    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        for n in range(10000):
            yield chunk(n)
            if n == 0:
                print(json.dumps("ready"), flush=True)
            time.sleep(0.05)

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        yield chunk(0)
        print(json.dumps("ready"), flush=True)
        await asyncio.sleep(3600)

url, thread_id, path = sys.argv[1:]
agent = create_agent(url, model=Slow(), tracing=False)
body = {"input": [{"role": "user", "content": "the child's text"}], "custom_inputs": {"thread_id": thread_id}}

async def consume():
    return [e async for e in agent.apredict_stream(body)]

try:
    events = list(agent.predict_stream(body)) if path == "predict_stream" else asyncio.run(consume())
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    print(json.dumps({"custom_outputs": events[-1].custom_outputs, "text": text}), flush=True)
except AgentError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": exc.message}), flush=True)
agent.close()
"""


@pytest.mark.slow
# Pairwise, not the whole product: each strategy meets both stream paths and both backends (a child process per
# case costs the suite seconds of CPU; the in-process test above covers the whole product).
@pytest.mark.parametrize(
    ("backend_url", "strategy", "child_path"),
    [
        ("postgres", "rollback", "predict_stream"),
        ("postgres", "interrupt", "apredict_stream"),
        ("sqlite", "rollback", "apredict_stream"),
        ("sqlite", "interrupt", "predict_stream"),
    ],
    indirect=["backend_url"],
)
def test_a_turn_in_another_process_is_stopped_by_a_newer_turn_here(backend_url, make_agent, strategy, child_path):
    agent = make_agent(backend_url)
    thread_id = outputs(say(agent, "start"))["thread_id"]
    head_before = history(agent, thread_id)[0]["checkpoint_id"]
    child = Child(CHILD_SLOW_TURN, backend_url, thread_id, child_path)
    try:
        child.wait_ready()
        second = outputs(say(agent, "the second text", thread_id=thread_id, multitask_strategy=strategy))
        (result,) = child.results_until_exit()
    finally:
        child.kill()

    entries = history(agent, thread_id)
    assert_linear(entries)
    if strategy == "rollback":
        assert result["error"] == "TurnCancelled"
        assert second["parent_checkpoint_id"] == head_before
        assert user_texts(head_messages(agent, thread_id)) == ["start", "the second text"]
        return
    first = result["custom_outputs"]
    assert first["status"] == "interrupted" and first["parent_checkpoint_id"] == head_before
    assert second["parent_checkpoint_id"] == first["checkpoint_id"]
    assert entries[1]["checkpoint_id"] == first["checkpoint_id"] and entries[1]["interrupted"] is True
    kept = head_messages_at(agent, thread_id, first["checkpoint_id"])
    assert [m.text for m in kept[2:]] == ["the child's text", result["text"]]
    assert kept[3].response_metadata["interrupted"] is True and result["text"].startswith("part 0 ")


# --- over tt-agent serve ------------------------------------------------------------------------


@pytest.fixture
def served(backend_url, tmp_path):
    """`tt-agent serve` on `backend_url` with a slow streaming OpenAI stub as its model:
    yields (base_url, stub_url); each reply of the stub streams 30 pieces over 60 s until reconfigured."""
    with openai_stub_server(latency_s=60, chunks=30) as stub_url:
        port = free_port()
        env = {
            "AGENT_DATABASE_URL": backend_url,
            "AGENT_MODEL": "fake",
            "AGENT_TRACING": "false",
            "OPENAI_BASE_URL": stub_url,
            "OPENAI_API_KEY": "unused",
        }
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
            yield base_url, stub_url


def sse_events(lines) -> list[Any]:
    return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]" for line in lines if line.startswith("data: ")]


def model_calls(stub_url: str) -> int:
    return len(httpx.get(stub_url.removesuffix("/v1") + "/_requests", timeout=10).json())


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_newer_request_stops_a_streaming_one_over_the_agent_server(served, strategy):
    base_url, stub_url = served
    with httpx.Client(base_url=base_url, timeout=HANG_TIMEOUT) as http:
        configure_stub(stub_url, latency_s=0)
        first_turn = http.post("/responses", json=request("start")).json()["custom_outputs"]
        thread_id, head_before = first_turn["thread_id"], first_turn["checkpoint_id"]
        configure_stub(stub_url, latency_s=60)

        with http.stream("POST", "/responses", json={**request("the first text", thread_id=thread_id), "stream": True}) as first:
            assert first.status_code == 200
            lines = first.iter_lines()
            seen = [next(line for line in lines if line.startswith("data: "))]  # the first delta: mid-reply
            configure_stub(stub_url, latency_s=0)
            newer = http.post("/responses", json=request("the second text", thread_id=thread_id, multitask_strategy=strategy))
            seen += list(lines)
        assert newer.status_code == 200, newer.text
        second = newer.json()["custom_outputs"]

        events = sse_events(seen)
        assert events[-1] == "[DONE]"
        deltas = "".join(e["delta"] for e in events[:-1] if e.get("type") == "response.output_text.delta")
        listed = http.post("/responses", json=request(action="get_checkpoint_history", thread_id=thread_id, limit=10))
        entries = listed.json()["custom_outputs"]["history"]

    assert_linear(entries)
    if strategy == "rollback":
        error = events[-2]
        assert error["type"] == "error" and error["code"] == openai_code("RESOURCE_CONFLICT")  # the /responses stream's
        assert "rolled this turn back" in error["message"]
        assert second["parent_checkpoint_id"] == head_before
        assert [e["last_user_message"] for e in entries[:2]] == ["the second text", "start"]
        return
    first_outputs = events[-2]["custom_outputs"]
    assert first_outputs["status"] == "interrupted" and first_outputs["parent_checkpoint_id"] == head_before
    assert second["parent_checkpoint_id"] == first_outputs["checkpoint_id"]
    assert entries[1]["checkpoint_id"] == first_outputs["checkpoint_id"] and entries[1]["interrupted"] is True
    assert entries[1]["last_message"] == deltas and deltas  # the unfinished reply, as the client saw it


@pytest.mark.slow
def test_a_rolled_back_unstreamed_request_gets_409_over_the_agent_server(served):
    base_url, stub_url = served
    with httpx.Client(base_url=base_url, timeout=HANG_TIMEOUT) as http:
        configure_stub(stub_url, latency_s=0)
        thread_id = http.post("/responses", json=request("start")).json()["custom_outputs"]["thread_id"]
        configure_stub(stub_url, latency_s=60)
        calls = model_calls(stub_url)
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(http.post, "/invocations", json=request("the first text", thread_id=thread_id))
            deadline = time.monotonic() + HANG_TIMEOUT
            while model_calls(stub_url) == calls:  # the first request is inside the model
                assert time.monotonic() < deadline
                time.sleep(0.02)
            configure_stub(stub_url, latency_s=0)
            newer = http.post("/invocations", json=request("the second text", thread_id=thread_id, multitask_strategy="rollback"))
            cancelled = first.result(timeout=HANG_TIMEOUT)
    assert newer.status_code == 200
    assert cancelled.status_code == 409
    assert cancelled.json()["error_code"] == "RESOURCE_CONFLICT" and "Traceback" not in cancelled.text
