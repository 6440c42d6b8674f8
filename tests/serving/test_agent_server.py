"""The MLflow Agent Server: `python -m agent serve`, used with the
official `openai` client and with plain HTTP, streaming and not.

One server process per module (the CLI, as a user starts it) on a SQLite file
this process also opens, with tracing on into a SQLite tracking store the
tests read back. Apps built around a stand-in chat model (one that fails
mid-stream, one that waits for the test) run in-process with uvicorn.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import httpx
import mlflow
import openai
import pytest

from agent import create_agent
from agent.models import OfflineChatModel
from agent.serving.agent_server import build_app
from tests.helpers.claims import is_claimed, other_replica_holds
from tests.helpers.error_bodies import assert_error_body, openai_code
from tests.helpers.scenario import TRIP, request
from tests.helpers.servers import free_port, in_process_server, server_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("agent_server")
    database = cwd / "checkpoints.sqlite"
    tracking_uri = f"sqlite:///{cwd / 'mlflow.db'}"
    port = free_port()
    env = {
        "AGENT_DATABASE_URL": f"sqlite:///{database}",
        "AGENT_MODEL": "offline",
        "AGENT_TRACING": "true",
        "AGENT_TRACE_SAMPLE_RATIO": "1",  # every turn (into a local store the default keeps a share)
        "MLFLOW_TRACKING_URI": tracking_uri,
    }
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
        with httpx.Client(base_url=base_url, timeout=60) as http, openai.OpenAI(
            base_url=base_url, api_key="unused", max_retries=0
        ) as client:
            yield SimpleNamespace(
                base_url=base_url,
                http=http,
                openai=client,
                database=database,
                database_url=f"sqlite:///{database}",
                tracking_uri=tracking_uri,
            )


def create(server, text: str | None = None, *, stream: bool = False, context: dict | None = None, **custom_inputs):
    """`responses.create` with the openai client, as an app developer calls a deployed endpoint."""
    extra_body: dict[str, Any] = {"custom_inputs": {k: v for k, v in custom_inputs.items() if v is not None}}
    if context:
        extra_body["context"] = context
    items = [] if text is None else [{"role": "user", "content": text}]
    return server.openai.responses.create(model="timetravel-agent", input=items, stream=stream, extra_body=extra_body)


def streamed(server, text: str, **custom_inputs) -> tuple[str, dict]:
    """Stream one turn with the openai client; returns (the text from the deltas, the last event's custom_outputs)."""
    events = list(create(server, text, stream=True, **custom_inputs))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return deltas, events[-1].custom_outputs


def sse_events(body: str) -> list[Any]:
    return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]" for line in body.splitlines() if line.startswith("data: ")]


def test_openai_client_runs_the_trip_on_responses(server, make_agent):
    first = create(server, TRIP[0])
    thread = first.custom_outputs["thread_id"]
    second = create(server, TRIP[1], thread_id=thread)
    third = create(server, TRIP[2], thread_id=thread)
    assert "SF" in third.output_text
    assert third.custom_outputs["parent_checkpoint_id"] == second.custom_outputs["checkpoint_id"]

    branch = create(server, "I'm headed to Tokyo!", thread_id=thread, checkpoint_id=first.custom_outputs["checkpoint_id"])
    assert branch.custom_outputs["parent_checkpoint_id"] == first.custom_outputs["checkpoint_id"]
    answer = create(server, TRIP[2], thread_id=thread)
    assert "Tokyo" in answer.output_text and "SF" not in answer.output_text

    history = make_agent(server.database_url).get_checkpoint_history(thread, limit=10)
    assert history[0]["checkpoint_id"] == answer.custom_outputs["checkpoint_id"]


def test_openai_client_streams_the_trip_and_gets_the_new_checkpoint_in_the_last_event(server, make_agent):
    first = create(server, TRIP[0])
    thread = first.custom_outputs["thread_id"]
    _, second = streamed(server, TRIP[1], thread_id=thread)
    text, third = streamed(server, TRIP[2], thread_id=thread)
    assert "SF" in text
    assert second["parent_checkpoint_id"] == first.custom_outputs["checkpoint_id"]
    assert third["parent_checkpoint_id"] == second["checkpoint_id"]
    assert make_agent(server.database_url).get_checkpoint_history(thread, limit=1)[0]["checkpoint_id"] == third["checkpoint_id"]

    text, branch = streamed(server, "I'm headed to Tokyo!", thread_id=thread, checkpoint_id=second["checkpoint_id"])
    assert branch["parent_checkpoint_id"] == second["checkpoint_id"]
    assert "Tokyo" in text and "Where did I say" not in text


def test_openai_client_time_travel_actions_match_the_python_methods(server, make_agent):
    first = create(server, TRIP[0])
    thread = first.custom_outputs["thread_id"]
    second = create(server, TRIP[1], thread_id=thread)
    agent = make_agent(server.database_url)

    listed = create(server, action="get_checkpoint_history", thread_id=thread, limit=5)
    assert listed.custom_outputs["history"] == agent.get_checkpoint_history(thread, limit=5)
    assert listed.output == []
    streamed_history = list(create(server, action="get_checkpoint_history", thread_id=thread, stream=True))
    assert streamed_history[-1].custom_outputs["history"] == agent.get_checkpoint_history(thread, limit=10)

    updated = create(server, "I'm headed to Tokyo!", action="update_checkpoint_state",
                     thread_id=thread, checkpoint_id=first.custom_outputs["checkpoint_id"])  # fmt: skip
    assert updated.custom_outputs["parent_checkpoint_id"] == first.custom_outputs["checkpoint_id"]
    assert agent.get_checkpoint_history(thread, limit=1)[0]["checkpoint_id"] == updated.custom_outputs["checkpoint_id"]
    answer = create(server, "Where am I going?", thread_id=thread)
    assert "Tokyo" in answer.output_text and "SF" not in answer.output_text
    assert second.custom_outputs["checkpoint_id"] in {e["checkpoint_id"] for e in agent.get_checkpoint_history(thread, limit=10)}


def test_user_id_arrives_in_custom_inputs_or_in_context(server):
    started = create(server, TRIP[1], context={"user_id": "alice"})
    thread = started.custom_outputs["thread_id"]
    by_custom_inputs = create(server, TRIP[2], thread_id=thread, user_id="alice")
    assert "SF" in by_custom_inputs.output_text
    by_context = create(server, "And then?", thread_id=thread, context={"user_id": "alice"})
    assert by_context.custom_outputs["parent_checkpoint_id"] == by_custom_inputs.custom_outputs["checkpoint_id"]
    with pytest.raises(openai.NotFoundError):
        create(server, "hi", thread_id=thread, context={"user_id": "bob"})
    with pytest.raises(openai.NotFoundError):
        create(server, "hi", thread_id=thread, stream=True, user_id="bob")
    with pytest.raises(openai.NotFoundError):
        create(server, "hi", thread_id=thread)  # anonymous


def test_context_conversation_id_names_the_thread(server):
    conversation = f"conversation-{uuid.uuid4()}"
    first = create(server, TRIP[1], context={"conversation_id": conversation})
    second = create(server, TRIP[2], context={"conversation_id": conversation})
    assert first.custom_outputs["thread_id"] == second.custom_outputs["thread_id"] == conversation
    assert "SF" in second.output_text


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/responses", "/invocations"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("case", "status", "error_code"),
    [
        ("unknown custom_inputs key", 400, "INVALID_PARAMETER_VALUE"),
        ("unknown action", 400, "INVALID_PARAMETER_VALUE"),
        ("unknown thread", 404, "RESOURCE_DOES_NOT_EXIST"),
        ("unknown checkpoint", 404, "RESOURCE_DOES_NOT_EXIST"),
        ("busy thread", 409, "RESOURCE_CONFLICT"),
    ],
)
def test_agent_errors_get_their_status_and_a_json_body_without_traceback(server, path, stream, case, status, error_code):
    thread = create(server, TRIP[1]).custom_outputs["thread_id"]
    bodies = {
        "unknown custom_inputs key": request("hi", thread=thread),
        "unknown action": request(action="rewind", thread_id=thread),
        "unknown thread": request("hi", thread_id=f"missing-{uuid.uuid4()}", checkpoint_id=str(uuid.uuid4())),
        "unknown checkpoint": request("hi", thread_id=thread, checkpoint_id=str(uuid.uuid4())),
        "busy thread": request("hi", thread_id=thread),
    }
    with other_process_holds(server.database, thread if case == "busy thread" else None):
        response = server.http.post(path, json={**bodies[case], "stream": stream})
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = assert_error_body(path, response.json(), error_code)  # OpenAI's body on /responses, MLflow's on /invocations
    assert message and "Traceback" not in response.text and 'File "' not in response.text


def test_openai_client_raises_typed_errors_with_the_agent_message(server):
    thread = create(server, TRIP[1]).custom_outputs["thread_id"]
    missing = str(uuid.uuid4())
    with pytest.raises(openai.NotFoundError) as not_found:
        create(server, "hi", thread_id=thread, checkpoint_id=missing, stream=True)
    assert missing in not_found.value.message and not_found.value.code == "not_found"
    with pytest.raises(openai.BadRequestError) as invalid:
        create(server, "hi", thread_id=thread, limit=0)
    assert "limit" in invalid.value.message
    with other_process_holds(server.database, thread), pytest.raises(openai.ConflictError) as busy:
        create(server, "hi", thread_id=thread)
    assert "busy" in busy.value.message


class other_process_holds:
    """Holds `thread_id` as another replica would (None: holds nothing)."""

    def __init__(self, database, thread_id: str | None) -> None:
        self.database, self.thread_id = database, thread_id
        self.held = other_replica_holds(f"sqlite:///{database}", thread_id) if thread_id is not None else None

    def __enter__(self) -> None:
        if self.held is not None:
            self.held.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        if self.held is not None:
            self.held.__exit__(*exc_info)


# --- tracing ---------------------------------------------------------------------------------


def test_served_turns_are_traced_with_the_thread_as_session_and_their_checkpoints(server):
    whole = create(server, TRIP[1])
    thread = whole.custom_outputs["thread_id"]
    _, stream = streamed(server, TRIP[2], thread_id=thread)
    traces = wait_for_traces(server.tracking_uri, thread, count=2)
    checkpoints = {t.info.trace_metadata.get("checkpoint_id") for t in traces}
    assert {whole.custom_outputs["checkpoint_id"], stream["checkpoint_id"]} <= checkpoints
    streamed_trace = next(t for t in traces if t.info.trace_metadata.get("checkpoint_id") == stream["checkpoint_id"])
    assert streamed_trace.info.trace_metadata["parent_checkpoint_id"] == whole.custom_outputs["checkpoint_id"]
    # The turn's span (the Agent Server's, around its handler) and one span for the one model call.
    client = mlflow.MlflowClient(tracking_uri=server.tracking_uri)
    for trace in traces:
        spans = client.get_trace(trace.info.trace_id).data.spans
        assert sorted((span.parent_id is None, span.span_type) for span in spans) == [(False, "CHAT_MODEL"), (True, "UNKNOWN")]


def test_served_reads_are_not_traced(server):
    first = create(server, TRIP[1])
    thread = first.custom_outputs["thread_id"]
    for action in ("get_checkpoint_state", "get_checkpoint_history"):
        for stream in (False, True):
            answer = server.http.post("/invocations", json={**request(action=action, thread_id=thread), "stream": stream})
            assert answer.status_code == 200, answer.text
    last = create(server, TRIP[2], thread_id=thread)
    traces = wait_for_traces(server.tracking_uri, thread, count=2)
    time.sleep(1.0)  # a read's trace, had there been one, was exported before the last turn's
    traces = wait_for_traces(server.tracking_uri, thread, count=2)
    assert sorted(t.info.trace_metadata.get("checkpoint_id") for t in traces) == sorted(
        [first.custom_outputs["checkpoint_id"], last.custom_outputs["checkpoint_id"]]
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_refused_lone_surrogate_is_traced_and_so_is_the_next_turn(server, stream):
    # MLflow records the request before the agent refuses it; unscrubbed, the
    # surrogate makes the export of that trace (and at times of the next) fail.
    marker = uuid.uuid4().hex
    body = json.dumps({**request(f"broken \ud800 {marker}"), "stream": stream})  # ASCII: the surrogate travels as a \u escape
    refused = server.http.post("/invocations", content=body, headers={"content-type": "application/json"})
    assert refused.status_code == 400 and "not valid Unicode" in refused.json()["message"]
    turn = create(server, TRIP[1])
    traces = wait_for_traces(server.tracking_uri, turn.custom_outputs["thread_id"], count=1)
    assert traces[0].info.trace_metadata["checkpoint_id"] == turn.custom_outputs["checkpoint_id"]
    client = mlflow.MlflowClient(tracking_uri=server.tracking_uri)

    def refused_traces() -> list:
        stored = client.search_traces(locations=["0"], include_spans=False, max_results=1000)
        return [t.info.state.value for t in stored if marker in (t.info.request_preview or "")]

    # The server's span of the refused request (a stream's too: its span covers the whole turn) is
    # exported as a failed trace with a scrubbed preview.
    deadline = time.monotonic() + 30  # exported in the background, in no set order
    while not refused_traces() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert refused_traces() == ["ERROR"]


def wait_for_traces(tracking_uri: str, thread_id: str, *, count: int, timeout: float = 60.0) -> list:
    """The traces of `thread_id`'s session, once at least `count` are stored (the server exports them in the background)."""
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    query = f"metadata.`mlflow.trace.session` = '{thread_id}'"
    deadline = time.monotonic() + timeout
    while True:
        traces = list(client.search_traces(locations=["0"], filter_string=query, include_spans=False))
        if len(traces) >= count or time.monotonic() > deadline:
            assert len(traces) >= count, f"found {len(traces)} traces of session {thread_id}"
            return traces
        time.sleep(0.2)


# --- in-process servers around stand-in chat models ----------------------------------------------


class BreaksMidStream(OfflineChatModel):
    """Streams the first chunk of its reply, then loses its connection."""

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        yield next(iter(super()._stream(messages, stop, run_manager, **kwargs)))
        raise ConnectionError("upstream connection reset")

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
            yield chunk
            raise ConnectionError("upstream connection reset")


class WaitsForGate(OfflineChatModel):
    """Streams the first chunk, then waits until the test opens `gate` (a threading.Event)."""

    gate: Any = None

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        chunks = iter(super()._stream(messages, stop, run_manager, **kwargs))
        yield next(chunks)
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        yield from chunks

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        first = True
        async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
            yield chunk
            if first and not await asyncio.to_thread(self.gate.wait, 60):
                raise TimeoutError("the test never opened the gate")
            first = False


def test_error_after_the_first_event_ends_the_stream_with_an_error_event():
    with create_agent("memory://", model=BreaksMidStream(), tracing=False) as agent, in_process_server(build_app(agent)) as url:
        response = httpx.post(f"{url}/responses", json={**request(TRIP[1]), "stream": True}, timeout=30)
        assert response.status_code == 200  # the status went out with the first event
        events = sse_events(response.text)
        assert [event["type"] for event in events[:2]] == ["response.created", "response.in_progress"]
        assert any(event["type"] == "response.output_text.delta" for event in events[2:-2])
        error = events[-2]
        assert error["type"] == "error" and error["code"] == openai_code("TEMPORARILY_UNAVAILABLE")
        assert error["sequence_number"] == events[-3]["sequence_number"] + 1
        assert "The chat model failed" in error["message"] and "upstream connection reset" in error["message"]
        assert events[-1] == "[DONE]"
        assert "Traceback" not in response.text

        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client, pytest.raises(
            openai.APIError, match="The chat model failed"
        ):
            list(client.responses.create(model="m", input=[{"role": "user", "content": "hi"}], stream=True))


def test_a_waiting_turn_does_not_block_other_requests():
    gate = threading.Event()
    with create_agent("memory://", model=WaitsForGate(gate=gate), tracing=False) as agent, in_process_server(build_app(agent)) as url:
        with httpx.Client(base_url=url, timeout=30) as http:
            with http.stream("POST", "/responses", json={**request(TRIP[1]), "stream": True}) as waiting:
                lines = waiting.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))  # the turn is mid-stream
                # The server still answers while that turn waits inside the model.
                assert http.get("/health").json() == {"status": "healthy"}
                other = http.post("/responses", json=request(action="get_checkpoint_history", thread_id="nobody"))
                assert other.status_code == 404
                gate.set()
                rest = sse_events("\n".join(lines))
            assert rest[-1] == "[DONE]" and rest[-2]["custom_outputs"]["checkpoint_id"]


class PausesMidStream(OfflineChatModel):
    """The offline model, except that after its first chunk it waits for `gate`: a turn stays mid-stream."""

    gate: Any = None

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        chunks = super()._stream(messages, stop, run_manager, **kwargs)
        yield next(chunks)
        self.gate.wait(30)
        yield from chunks

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        first = True
        async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
            yield chunk
            if first:
                await asyncio.to_thread(self.gate.wait, 30)
            first = False


def test_a_client_that_leaves_a_stream_ends_its_turn_and_frees_the_thread(tmp_path):
    # Found by trying it: the turn stayed suspended, holding the thread's lock and
    # a pooled connection, until garbage collection got to it.
    gate = threading.Event()
    url = f"sqlite:///{tmp_path / 'left.sqlite'}"
    with create_agent(url, model=PausesMidStream(gate=gate), tracing=False) as agent, in_process_server(build_app(agent)) as base:
        thread_id = agent.predict(request("I'm planning for an upcoming trip!")).custom_outputs["thread_id"]
        with httpx.Client(base_url=base, timeout=30) as http:
            with http.stream("POST", "/responses", json={**request(TRIP[1], thread_id=thread_id), "stream": True}) as left:
                next(left.iter_lines())  # the first delta arrived; then the client goes away
        gc_was_enabled = gc.isenabled()
        gc.disable()  # the turn must end because the client left, not because a collector ran
        try:
            gate.set()
            deadline = time.monotonic() + 10
            while is_claimed(url, thread_id) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not is_claimed(url, thread_id) and agent.storage.saver.active_turn(thread_id) is None
            history = agent.get_checkpoint_history(thread_id)
            assert [entry["message_count"] for entry in history] == [2, 0]  # the abandoned turn wrote nothing
            answer = agent.predict(request("Where am I going?", thread_id=thread_id, multitask_strategy="reject"))
            assert answer.custom_outputs["parent_checkpoint_id"] == history[0]["checkpoint_id"]
        finally:
            if gc_was_enabled:
                gc.enable()


def test_a_client_that_leaves_a_merge_stream_writes_nothing_and_frees_the_thread(tmp_path):
    gate = threading.Event()
    url = f"sqlite:///{tmp_path / 'left-merge.sqlite'}"
    with create_agent(url, model=PausesMidStream(gate=gate), tracing=False) as agent, in_process_server(build_app(agent)) as base:
        say = lambda text, **custom: agent.predict(request(text, **custom)).custom_outputs  # noqa: E731
        first = say("I'm planning for an upcoming trip!")
        thread_id = first["thread_id"]
        sf = say(TRIP[1], thread_id=thread_id)
        ny = say("I'm headed to NY!", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
        history = agent.get_checkpoint_history(thread_id)
        merge = request(action="merge_branch", thread_id=thread_id, checkpoint_id=ny["checkpoint_id"],
                        source_checkpoint_id=sf["checkpoint_id"])  # fmt: skip
        with httpx.Client(base_url=base, timeout=30) as http:
            with http.stream("POST", "/responses", json={**merge, "stream": True}) as left:
                # The model is writing the summary (a delta came); then the client goes away.
                assert any('"response.output_text.delta"' in line for line in left.iter_lines())
        gate.set()
        deadline = time.monotonic() + 10
        while is_claimed(url, thread_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_claimed(url, thread_id)
        assert agent.get_checkpoint_history(thread_id) == history  # the abandoned merge wrote nothing
        answer = agent.predict(request("Where am I going?", thread_id=thread_id, multitask_strategy="reject"))
        assert answer.custom_outputs["parent_checkpoint_id"] == ny["checkpoint_id"]


@pytest.mark.parametrize("body", [b"[]", b"null", b'"text"', b"42", b"{not json"])
def test_a_body_that_is_not_a_json_object_is_a_400_with_the_error_body(server, body):
    for path in ("/invocations", "/responses"):
        response = server.http.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, (path, body, response.text)
        assert_error_body(path, response.json(), "INVALID_PARAMETER_VALUE")
        assert "Traceback" not in response.text


def test_an_oversized_body_is_refused_before_it_is_read(tmp_path):
    with create_agent("memory://", model="offline", tracing=False, max_request_bytes=1000) as agent, in_process_server(build_app(agent)) as base:
        huge = json.dumps(request("x" * 200_000)).encode()
        response = httpx.post(f"{base}/invocations", content=huge, headers={"Content-Type": "application/json"}, timeout=30)
        assert response.status_code == 400
        assert "limit" in response.json()["message"]
