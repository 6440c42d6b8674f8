"""How a run's streams end when it does not complete: its client leaves (default `finish_left_streams: false`),
or it is cancelled (`POST /responses/{id}/cancel`) while it runs, as a stream or in the background.

One `tt-agent serve` per backend (Postgres, a SQLite file), with the default lease (15 s) and the
OpenAI-compatible stub slowed so that a turn streams for a few seconds. A run whose end was not recorded
reads `in_progress` until its lease expires, then `failed` (`lease_expired`); here it must read its real end
well within the lease, and every stream of it (the one it was started with, and any follower) must end with
an `error` event and `[DONE]` at once, never stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
import time
from typing import Any

import httpx
import pydantic
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk
from openai.types.responses import ResponseStreamEvent

from agent import create_agent
from agent.models import OfflineChatModel
from agent.serving.agent_server import build_app

from tests.helpers.databases import fresh_database
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.servers import free_port, server_process

pytestmark = pytest.mark.slow

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
USER = {"X-User": "alice"}
#: Seconds the stub takes per reply, its text in `CHUNKS` deltas spread over it.
SLOW_S = 4.0
CHUNKS = 8
#: Seconds within which a run's end must be seen: generous, yet well under the default 15 s lease.
SOON_S = 5.0


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def server(request, tmp_path_factory, pg_server_url):
    cwd = tmp_path_factory.mktemp("endings")
    with openai_stub_server(chunks=CHUNKS, latency_s=SLOW_S) as model_url, _database(request.param, pg_server_url, cwd) as db:
        env = {
            "AGENT_DATABASE_URL": db,
            "AGENT_MODEL": "fake",
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "unused",
            "AGENT_TRACING": "false",
            "AGENT_USER_ID_HEADER": "X-User",
        }
        port = free_port()
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base:
            yield base


def _database(backend: str, pg_server_url: str, cwd):
    if backend == "postgres":
        return fresh_database(pg_server_url)
    return contextlib.nullcontext(f"sqlite:///{cwd / 'checkpoints.sqlite'}")


def new_thread(base: str) -> str:
    answer = httpx.post(f"{base}/responses", json={"input": "Hello there"}, headers=USER, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["custom_outputs"]["thread_id"]


def history_length(base: str, thread_id: str) -> int:
    answer = httpx.get(f"{base}/conversations/{thread_id}/items", params={"limit": 100}, headers=USER, timeout=30)
    assert answer.status_code == 200, answer.text
    return len(answer.json()["data"])


def status_soon(base: str, response_id: str) -> dict:
    """The run's response object once it is no longer queued or in progress, or after `SOON_S`."""
    deadline = time.monotonic() + SOON_S
    while True:
        body = httpx.get(f"{base}/responses/{response_id}", headers=USER, timeout=30).json()
        if body.get("status") not in ("queued", "in_progress") or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


class Stream:
    """The server-sent events of one open stream, read line by line: `events` (validated with the `openai`
    package's model), `done` once `[DONE]` came. A read waits at most `SOON_S` for the next line."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.iter_lines()
        self.events: list[dict] = []
        self.done = False

    def read_until(self, wanted) -> dict:  # type: ignore[no-untyped-def]
        for line in self.lines:
            if line == "data: [DONE]":
                self.done = True
                break
            if line.startswith("data: "):
                event = json.loads(line[6:])
                EVENT.validate_python(event)
                self.events.append(event)
                if wanted(event):
                    return event
        raise AssertionError(f"the stream ended before the event wanted; it sent {[e['type'] for e in self.events]}")

    def rest(self) -> list[dict]:
        """The events to the stream's end (`[DONE]` then the connection closes)."""
        start = len(self.events)
        for line in self.lines:
            if line == "data: [DONE]":
                self.done = True
            elif line.startswith("data: "):
                self.events.append(json.loads(line[6:]))
        return self.events[start:]


def open_stream(base: str, path: str, **kwargs):  # type: ignore[no-untyped-def]
    timeout = httpx.Timeout(30, read=SOON_S)  # a stream left open after its run ended fails its read
    return httpx.stream(kwargs.pop("method", "GET"), f"{base}{path}", headers=USER, timeout=timeout, **kwargs)


def resume(base: str, response_id: str) -> Stream:
    with open_stream(base, f"/responses/{response_id}", params={"stream": "true"}) as response:
        assert response.status_code == 200, response.read()
        stream = Stream(response)
        stream.rest()
    return stream


def without_none(value):  # type: ignore[no-untyped-def]
    if isinstance(value, dict):
        return {key: without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value]
    return value


def is_delta(event: dict) -> bool:
    return event["type"] == "response.output_text.delta"


def test_a_client_that_leaves_its_stream_cancels_its_run_at_once(server):
    thread_id = new_thread(server)
    before = history_length(server, thread_id)
    body = json.dumps({"input": "Tell me about Lisbon", "stream": True, "conversation": thread_id}).encode()
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as raw:  # a client that goes away without a word
        # The Host header a client sends (`tt-agent serve` on loopback answers only loopback names: allowed_hosts).
        raw.sendall(b"POST /responses HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\nX-User: alice\r\n"
                    b"Content-Length: %d\r\n\r\n" % (host.encode(), port.encode(), len(body)) + body)  # fmt: skip
        received = b""
        while b"response.output_text.delta" not in received:
            chunk = raw.recv(65536)
            assert chunk, received
            received += chunk
    response_id = json.loads(received.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]

    run = status_soon(server, response_id)
    assert run["status"] == "cancelled", run  # not in_progress until its lease expires, then failed
    assert run["custom_outputs"]["code"] == "client_left" and run["custom_outputs"]["written"] is False
    resumed = resume(server, response_id)
    assert resumed.done and resumed.events[-1]["type"] == "error" and resumed.events[-1]["code"] == "client_left"
    assert [e["sequence_number"] for e in resumed.events] == list(range(len(resumed.events)))
    assert history_length(server, thread_id) == before  # nothing written


def test_a_cancel_ends_the_stream_the_turn_was_started_with_as_it_ends_a_resumed_one(server):
    thread_id = new_thread(server)
    before = history_length(server, thread_id)
    body = {"input": "Write a poem", "stream": True, "conversation": thread_id}
    with open_stream(server, "/responses", method="POST", json=body) as response:
        assert response.status_code == 200
        stream = Stream(response)
        response_id = stream.read_until(lambda e: e["type"] == "response.created")["response"]["id"]
        stream.read_until(is_delta)
        cancelled = httpx.post(f"{server}/responses/{response_id}/cancel", headers=USER, timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
        assert cancelled.json()["custom_outputs"]["thread_id"] == thread_id  # as the turn's own answer names it
        rest = stream.rest()  # a stream left open fails its read (httpx.ReadTimeout) here
    assert stream.done and rest[-1]["type"] == "error" and rest[-1]["code"] == "cancelled"
    EVENT.validate_python(rest[-1])
    # The very events a client resuming it gets, numbered alike, the error event included.
    assert resume(server, response_id).events == stream.events
    assert history_length(server, thread_id) == before


def test_a_background_run_cancelled_while_running_ends_every_follower_stream(server):
    thread_id = new_thread(server)
    before = history_length(server, thread_id)
    body = {"input": "Plan a trip", "stream": True, "background": True, "conversation": thread_id}
    followers: dict[str, Stream] = {}
    errors: list[BaseException] = []

    def follow(response_id: str) -> None:
        try:
            with open_stream(server, f"/responses/{response_id}", params={"stream": "true"}) as response:
                stream = Stream(response)
                stream.rest()
                followers["resumed"] = stream
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    with open_stream(server, "/responses", method="POST", json=body) as response:
        assert response.status_code == 200
        started = Stream(response)  # the POST's own stream follows the run
        response_id = started.read_until(lambda e: e["type"] == "response.created")["response"]["id"]
        started.read_until(is_delta)
        follower = threading.Thread(target=follow, args=(response_id,))
        follower.start()
        cancelled = httpx.post(f"{server}/responses/{response_id}/cancel", headers=USER, timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
        started.rest()
        follower.join(timeout=30)
    assert not errors, errors
    for stream in (started, followers["resumed"]):
        assert stream.done and stream.events[-1]["type"] == "error" and stream.events[-1]["code"] == "cancelled"
        assert [e["sequence_number"] for e in stream.events] == list(range(len(stream.events)))
    # The same events (the POST's stream, through MLflow's event model, leaves out fields that are null).
    assert [without_none(e) for e in followers["resumed"].events] == [without_none(e) for e in started.events]
    assert status_soon(server, response_id)["custom_outputs"]["written"] is False
    assert history_length(server, thread_id) == before



# --- a client that stopped reading ----------------------------------------------------------------


class Floods(OfflineChatModel):
    """Streams `chunks` short chunks, then waits for `gate` (a threading.Event) before its last one."""

    chunks: int = 1000
    gate: Any = None

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
        for index in range(self.chunks):
            yield ChatGenerationChunk(message=AIMessageChunk(content=f"w{index} "))
            await asyncio.sleep(0)
        await asyncio.to_thread(self.gate.wait, 60)
        yield ChatGenerationChunk(message=AIMessageChunk(content="end"))


class StalledClient:
    """The ASGI side of an HTTP client that reads its answer up to its first text delta, then stops reading until
    `reads_again` is set (the server's `send` waits, as uvicorn's does once the socket is full); `body`: what it
    got. It never disconnects."""

    def __init__(self, method: str, path: str, body: bytes = b"", query: bytes = b"") -> None:
        self.scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                      "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
                      "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                  (b"content-length", str(len(body)).encode())],
                      "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}  # fmt: skip
        self.request = [{"type": "http.request", "body": body, "more_body": False}]
        self.reads_again = asyncio.Event()
        self.status: int | None = None
        self.body = b""

    async def receive(self) -> dict:
        if self.request:
            return self.request.pop()
        await asyncio.Event().wait()  # never leaves
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            if b"response.output_text.delta" in self.body:
                await self.reads_again.wait()
            self.body += message.get("body", b"")

    def events(self) -> list:
        lines = [line[6:] for line in self.body.decode().split("\n") if line.startswith("data: ")]
        return [line if line == "[DONE]" else json.loads(line) for line in lines]


async def stalled(agent, response_id: str) -> None:  # type: ignore[no-untyped-def]
    """Wait until the turn `response_id` records no more events (it writes them every 0.1 s while it takes
    them): the turn waits for room in its stream's buffer, which its client no longer reads."""
    rows, deadline = -1, time.monotonic() + 60
    while time.monotonic() < deadline:
        now = len(await asyncio.to_thread(agent.runs.store.rows, response_id, -1))
        if now == rows:
            return
        rows = now
        await asyncio.sleep(0.5)
    raise AssertionError("the turn kept taking events: its stream never filled")


def test_a_cancel_while_the_client_has_stopped_reading_still_ends_its_stream_with_the_cancelled_event(tmp_path):
    # The cancel reached the turn's task while it waited for room in its stream's buffer, outside the turn, so
    # the stream never got its `error` event nor `[DONE]`: the client read what was buffered, then waited for ever.
    gate = threading.Event()
    model = Floods(gate=gate)
    with create_agent(f"sqlite:///{tmp_path / 'stalled.sqlite'}", model=model, tracing=False) as agent:
        app = build_app(agent)

        async def scenario() -> tuple[list, list]:
            client = StalledClient("POST", "/responses", json.dumps({"input": "Tell me everything", "stream": True}).encode())
            answer = asyncio.create_task(app(client.scope, client.receive, client.send))
            try:
                async with asyncio.timeout(30):
                    while b"response.output_text.delta" not in client.body:
                        await asyncio.sleep(0.05)
                response_id = client.events()[0]["response"]["id"]
                await stalled(agent, response_id)
                run = await asyncio.to_thread(agent.runs.cancel, response_id, None)
                assert run.status == "cancelled"
                client.reads_again.set()
                await asyncio.wait_for(asyncio.shield(answer), SOON_S)  # a timeout here: the stream was left open
            finally:
                gate.set()
                client.reads_again.set()
                if not answer.done():
                    answer.cancel()  # the client leaves
                await asyncio.gather(answer, return_exceptions=True)
            follower = StalledClient("GET", f"/responses/{response_id}", query=b"stream=true")
            follower.reads_again.set()
            await app(follower.scope, follower.receive, follower.send)
            return client.events(), follower.events()

        live, resumed = asyncio.run(scenario())
    assert live[-1] == "[DONE]" and live[-2]["type"] == "error" and live[-2]["code"] == "cancelled", live[-3:]
    EVENT.validate_python(live[-2])
    numbers = [event["sequence_number"] for event in live[:-1]]
    assert numbers == list(range(len(numbers)))
    assert resumed == live  # a client resuming it gets the very events the stream sent, the end included
    # The client had stopped reading: the cancel cut the stream short.
    assert sum(event != "[DONE]" and event["type"] == "response.output_text.delta" for event in live) < model.chunks
