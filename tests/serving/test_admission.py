"""Turn admission on `tt-agent serve` (`agent.serving.admission`): one turn runs, one waits, more get 429;
background runs and streams left to run on (`agent.runs.places`) count until their turn ends.

One server process for the module (the CLI, as a user starts it) with `AGENT_MAX_RUNNING_TURNS=1`,
`AGENT_MAX_WAITING_TURNS=1` and `AGENT_FINISH_LEFT_STREAMS=true`, on a SQLite file, its model the OpenAI-compatible stub slowed to
`MODEL_LATENCY_S` per reply, so that a turn is still running while the next requests arrive.
Everything goes over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.helpers.error_bodies import assert_error_body
from tests.helpers.openai_stub import configure_stub, openai_stub_server, received
from tests.helpers.scenario import request
from tests.helpers.servers import free_port, server_process

pytestmark = pytest.mark.slow

#: Seconds the model takes per reply: long enough for the other requests of a test to arrive meanwhile.
MODEL_LATENCY_S = 1.0
#: Seconds for a request sent after another to reach the server first (the order of arrival matters).
ARRIVAL_S = 0.4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("admission")
    with openai_stub_server(chunks=2) as model_url:
        port = free_port()
        env = {
            "AGENT_DATABASE_URL": f"sqlite:///{cwd / 'checkpoints.sqlite'}",
            "AGENT_MODEL": "fake",
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "unused",
            "AGENT_TRACING": "false",
            "AGENT_MAX_RUNNING_TURNS": "1",
            "AGENT_MAX_WAITING_TURNS": "1",
            "AGENT_FINISH_LEFT_STREAMS": "true",
        }
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
            # A thread to read while turns run, written before the model is slowed.
            seeded = httpx.post(f"{base_url}/invocations", json=request("I'm planning a trip."), timeout=60)
            assert seeded.status_code == 200, seeded.text
            configure_stub(model_url, latency_s=MODEL_LATENCY_S)
            yield SimpleNamespace(base_url=base_url, model_url=model_url, thread_id=seeded.json()["custom_outputs"]["thread_id"])


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: Any
    ended: float
    """`time.monotonic()` when the whole answer had arrived."""


async def send(http: httpx.AsyncClient, path: str, body: dict, *, stream: bool = False) -> Answer:
    """POST `body` (a turn: `stream` adds `"stream": true`) and read the whole answer."""
    if stream:
        body = {**body, "stream": True}
    async with http.stream("POST", path, json=body) as response:
        raw = await response.aread()
    ended = time.monotonic()
    text = raw.decode()
    parsed = [line[6:] for line in text.splitlines() if line.startswith("data: ")] if text.startswith("data: ") else json.loads(text)
    return Answer(response.status_code, response.headers, parsed, ended)


def turn_text(label: str) -> str:
    return f"{label} {uuid.uuid4().hex[:8]}"


async def until_the_model_got(server, text: str) -> None:
    """Wait until the model was asked about `text` (its turn is running)."""
    deadline = time.monotonic() + 30
    while not any(text in json.dumps(body) for body in await asyncio.to_thread(received, server.model_url)):
        assert time.monotonic() < deadline, f"the model never got {text!r}"
        await asyncio.sleep(0.05)


def the_model_never_got(server, text: str) -> bool:
    return not any(text in json.dumps(body) for body in received(server.model_url))


def history_status(server, thread_id: str) -> int:
    body = request(action="get_checkpoint_history", thread_id=thread_id)
    return httpx.post(f"{server.base_url}/invocations", json=body, timeout=30).status_code


def client(server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.base_url, timeout=60)


@pytest.mark.parametrize(("path", "stream"), [("/responses", True), ("/invocations", False)])
def test_a_turn_beyond_the_running_and_the_waiting_one_gets_429_with_retry_after_and_writes_nothing(server, path, stream):
    first, second, third = turn_text("first"), turn_text("second"), turn_text("third")
    threads = {text: f"admission-{uuid.uuid4().hex}" for text in (first, second, third)}

    async def scenario() -> tuple[Answer, list[Answer]]:
        async with client(server) as http:
            running = asyncio.create_task(send(http, path, request(first, thread_id=threads[first]), stream=stream))
            await until_the_model_got(server, first)
            # Two more at once: whichever arrives first waits, the other is one too many.
            others = [send(http, path, request(text, thread_id=threads[text]), stream=stream) for text in (second, third)]
            answers = await asyncio.gather(running, *others)
            return answers[0], list(answers[1:])

    ran, (answer_2, answer_3) = asyncio.run(scenario())
    assert ran.status == 200
    assert sorted([answer_2.status, answer_3.status]) == [200, 429], (answer_2, answer_3)
    waited, refused = (answer_2, answer_3) if answer_2.status == 200 else (answer_3, answer_2)
    refused_text = third if refused is answer_3 else second

    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["content-type"] == "application/json"  # an error answer, never a stream
    message = assert_error_body(path, refused.body, "REQUEST_LIMIT_EXCEEDED")
    assert "busy" in message and "nothing was written" in message and "Traceback" not in message
    assert history_status(server, threads[refused_text]) == 404  # no thread: nothing written
    assert the_model_never_got(server, refused_text)

    assert waited.ended > ran.ended  # it ran once the first had ended
    assert history_status(server, threads[second if refused_text == third else third]) == 200


def test_health_ready_and_read_actions_never_wait_behind_turns(server):
    running_text, waiting_text = turn_text("running"), turn_text("waiting")
    read = request(action="get_checkpoint_history", thread_id=server.thread_id)

    async def scenario() -> tuple[Answer, Answer, list[httpx.Response], float]:
        async with client(server) as http:
            running = asyncio.create_task(send(http, "/responses", request(running_text), stream=True))
            await until_the_model_got(server, running_text)
            waiting = asyncio.create_task(send(http, "/invocations", request(waiting_text)))
            await asyncio.sleep(ARRIVAL_S)
            # The one place is taken and the one place in the queue too: none of these may wait.
            quick = [
                await http.get("/health"),
                await http.get("/ready"),
                await http.post("/invocations", json=read),
                await http.post("/responses", json=request(action="get_checkpoint_state", thread_id=server.thread_id)),
                await http.post("/responses", json=read),
            ]
            answered = time.monotonic()
            return await running, await waiting, quick, answered

    running, waiting, reads, answered = asyncio.run(scenario())
    assert [response.status_code for response in reads] == [200] * 5, [r.text for r in reads]
    assert answered < running.ended  # all answered while the turn still ran: none waited behind it
    assert running.status == waiting.status == 200


def test_a_waiting_turn_whose_client_leaves_leaves_the_queue_and_never_runs(server):
    running_text, leaving_text, probe_text, next_text = (turn_text(label) for label in ("running", "leaving", "probe", "next"))
    leaving_thread = f"admission-{uuid.uuid4().hex}"

    async def scenario() -> tuple[Answer, Answer, Answer, float]:
        async with client(server) as http, client(server) as leaving_http:
            running = asyncio.create_task(send(http, "/responses", request(running_text), stream=True))
            await until_the_model_got(server, running_text)
            leaving = asyncio.create_task(
                send(leaving_http, "/responses", request(leaving_text, thread_id=leaving_thread), stream=True)
            )
            await asyncio.sleep(ARRIVAL_S)
            probe = await send(http, "/responses", request(probe_text))  # the queue is full: the leaving turn waits
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
            await leaving_http.aclose()  # its connection closes while its turn waits
            await asyncio.sleep(ARRIVAL_S)
            sent = time.monotonic()
            following = await send(http, "/responses", request(next_text))  # its place in the queue is free again
            return await running, probe, following, sent

    # The first turn must still run when the last one is sent: a slower model for this test.
    configure_stub(server.model_url, latency_s=2 * MODEL_LATENCY_S)
    try:
        running, probe, following, following_sent = asyncio.run(scenario())
    finally:
        configure_stub(server.model_url, latency_s=MODEL_LATENCY_S)
    assert probe.status == 429
    assert running.status == 200
    assert following_sent < running.ended  # sent while the one place was taken: it waited, not refused
    assert following.status == 200 and following.ended > running.ended
    assert history_status(server, leaving_thread) == 404
    assert the_model_never_got(server, leaving_text)


def background(text: str) -> dict:
    return {**request(text, thread_id=f"admission-{uuid.uuid4().hex}"), "background": True}


async def run_status(http: httpx.AsyncClient, response_id: str) -> str:
    answer = await http.get(f"/responses/{response_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()["status"]


async def until_ended(http: httpx.AsyncClient, response_id: str) -> tuple[str, float]:
    """Poll a background run until it ended: (its status, `time.monotonic()` when it was seen ended)."""
    deadline = time.monotonic() + 60
    while (status := await run_status(http, response_id)) in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"{response_id} still {status}"
        await asyncio.sleep(0.1)
    return status, time.monotonic()


async def two_more_turns(http: httpx.AsyncClient) -> list[Answer]:
    """Two turns sent at once; with the one place taken, one waits and the other is refused (or both run)."""
    return list(await asyncio.gather(*(send(http, "/responses", request(turn_text("more"))) for _ in range(2))))


def test_a_background_run_holds_its_place_until_its_turn_ends(server):
    text = turn_text("background")

    async def scenario() -> tuple[Answer, list[Answer], tuple[str, float]]:
        async with client(server) as http:
            queued = await send(http, "/responses", background(text))
            await until_the_model_got(server, text)  # the request has ended; its turn runs
            more = await two_more_turns(http)
            return queued, more, await until_ended(http, queued.body["id"])

    queued, more, (status, _) = asyncio.run(scenario())
    assert queued.status == 200 and queued.body["status"] == "queued"
    # The run holds the one place: of two more turns one waits, the other is one too many.
    assert sorted(answer.status for answer in more) == [200, 429], more
    assert status == "completed"


def test_a_background_run_beyond_the_running_turns_answers_queued_at_once_and_waits_for_a_place(server):
    running_text, background_text = turn_text("running"), turn_text("background")

    async def scenario() -> tuple[Answer, Answer, float, Answer, tuple[str, float]]:
        async with client(server) as http:
            running = asyncio.create_task(send(http, "/responses", request(running_text), stream=True))
            await until_the_model_got(server, running_text)
            sent = time.monotonic()
            queued = await send(http, "/responses", background(background_text))
            refused = await send(http, "/responses", request(turn_text("refused")))  # the run waits in the queue
            never_before = the_model_never_got(server, background_text)
            assert never_before, "the background run started while the one place was taken"
            return await running, queued, sent, refused, await until_ended(http, queued.body["id"])

    running, queued, sent, refused, (status, _) = asyncio.run(scenario())
    # Answered at once (not held in the queue for the running turn), and queued behind it.
    assert queued.status == 200 and queued.body["status"] == "queued"
    assert queued.ended < running.ended and queued.ended - sent < MODEL_LATENCY_S
    assert refused.status == 429 and int(refused.headers["retry-after"]) >= 1
    assert running.status == 200 and status == "completed"


def test_cancelling_a_background_run_that_waits_for_a_place_frees_its_place_in_the_queue_at_once(server):
    running_text, background_text, next_text = turn_text("running"), turn_text("background"), turn_text("next")

    async def scenario() -> tuple[Answer, Answer, Answer, str]:
        async with client(server) as http:
            running = asyncio.create_task(send(http, "/responses", request(running_text), stream=True))
            await until_the_model_got(server, running_text)
            queued = await send(http, "/responses", background(background_text))  # the one waiting place
            cancelled = await http.post(f"/responses/{queued.body['id']}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
            # While the running turn still runs: the waiting place is free again, so this turn waits in it.
            following = await send(http, "/responses", request(next_text))
            return await running, queued, following, await run_status(http, queued.body["id"])

    running, queued, following, status = asyncio.run(scenario())
    assert queued.status == 200 and queued.body["status"] == "queued"
    assert following.status == 200, following.body
    assert running.status == 200 and status == "cancelled"
    assert the_model_never_got(server, background_text)


def test_a_left_stream_that_runs_on_holds_its_place_until_its_turn_ends(server):
    left_text = turn_text("left")

    async def scenario() -> list[Answer]:
        async with client(server) as http, client(server) as leaving_http:
            leaving = asyncio.create_task(send(leaving_http, "/responses", request(left_text), stream=True))
            await until_the_model_got(server, left_text)
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
            await leaving_http.aclose()  # the client left; under finish_left_streams its turn runs on
            await asyncio.sleep(ARRIVAL_S)
            return await two_more_turns(http)

    # Still running when the two arrive, and streaming a delta every 0.2 s, so that the server sees at once
    # that its client left (it finds out when it next writes) and the request ends long before the turn.
    configure_stub(server.model_url, latency_s=4 * MODEL_LATENCY_S, chunks=20)
    try:
        more = asyncio.run(scenario())
    finally:
        configure_stub(server.model_url, latency_s=MODEL_LATENCY_S, chunks=2)
    assert sorted(answer.status for answer in more) == [200, 429], more
