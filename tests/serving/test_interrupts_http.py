"""Human in the loop over HTTP: `tt-agent serve --agent examples/approval_agent.py` on Postgres and SQLite.

`book_trip` asks for approval with LangGraph's `interrupt()`. Over `/responses` (the `openai`
client, streamed and not) and `/invocations` (plain HTTP, streamed and not), a turn that stops
there answers with the question as an `mcp_approval_request` output item and in
`custom_outputs.interrupts`; the next request resumes with `custom_inputs.resume` and an empty
input. Answers that cannot apply (an id that is not pending, nothing pending, another user's
thread, a new message while the question waits) are 4xx with our error body, and write nothing.
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.databases import fresh_database
from tests.helpers.servers import REPO_ROOT, free_port, server_process

pytestmark = pytest.mark.slow

APPROVAL_AGENT = REPO_ROOT / "examples" / "approval_agent.py"
BOOK_TOKYO = 'use book_trip {"destination": "Tokyo"}'
OWNER = "alice"


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def server(request, tmp_path_factory, pg_server_url):
    cwd = tmp_path_factory.mktemp(f"interrupts_{request.param}")
    with _database(request.param, pg_server_url, cwd) as url:
        port = free_port()
        command = [sys.executable, "-m", "agent", "serve", "--port", str(port), "--agent", str(APPROVAL_AGENT),
                   "--database-url", url, "--model", "offline"]  # fmt: skip
        env = {"AGENT_TRACING": "false", "AGENT_POOL_MIN_SIZE": "1"}
        with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
            with httpx.Client(base_url=base_url, timeout=60) as http, openai.OpenAI(
                base_url=base_url, api_key="unused", max_retries=0
            ) as client:
                yield SimpleNamespace(http=http, openai=client)


def _database(kind: str, pg_server_url: str, cwd):
    if kind == "postgres":
        return fresh_database(pg_server_url, prefix="tt_interrupts")
    from contextlib import nullcontext

    return nullcontext(f"sqlite:///{cwd / 'checkpoints.sqlite'}")


# -- helpers --------------------------------------------------------------------------------------------
def invoke(server, text: str | None, *, stream: bool = False, **custom: Any) -> httpx.Response | list[dict]:
    """POST /invocations; streamed: the parsed SSE events (asserting 200), else the response."""
    body = {"input": [] if text is None else [{"role": "user", "content": text}], "custom_inputs": custom}
    if not stream:
        return server.http.post("/invocations", json=body)
    with server.http.stream("POST", "/invocations", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def create(server, text: str | None, *, stream: bool = False, **custom: Any):
    """`responses.create` with the openai client; streamed: the list of events."""
    items = [] if text is None else [{"role": "user", "content": text}]
    answer = server.openai.responses.create(
        model="timetravel-agent", input=items, stream=stream, extra_body={"custom_inputs": custom}
    )
    return list(answer) if stream else answer


def head(server, thread_id: str, user_id: str | None = OWNER) -> str:
    custom = {"action": "get_checkpoint_history", "thread_id": thread_id, "limit": 1}
    if user_id:
        custom["user_id"] = user_id
    return ok(server.http.post("/invocations", json={"input": [], "custom_inputs": custom}))["custom_outputs"]["history"][0][
        "checkpoint_id"
    ]


def assert_approval_request(item: dict, interrupt: dict) -> None:
    assert item["type"] == "mcp_approval_request"
    assert item["id"] == interrupt["id"] and item["name"] == "tools" and item["server_label"] == "interrupt"
    assert json.loads(item["arguments"]) == interrupt["value"]
    assert interrupt["value"] == {"question": "Book a trip to Tokyo?", "tool": "book_trip", "destination": "Tokyo"}


def ask(server) -> dict:
    """A new thread of OWNER's, stopped at book_trip's question; its custom_outputs."""
    asked = ok(invoke(server, BOOK_TOKYO, user_id=OWNER))
    assert len(asked["custom_outputs"]["interrupts"]) == 1
    return asked["custom_outputs"]


# -- /responses, with the openai client ----------------------------------------------------------------
def test_openai_client_gets_the_question_and_resumes_it(server):
    asked = create(server, BOOK_TOKYO, user_id=OWNER)
    [interrupt] = asked.custom_outputs["interrupts"]
    [request_item] = [item for item in asked.output if item.type == "mcp_approval_request"]
    assert_approval_request(request_item.model_dump(), interrupt)
    thread_id = asked.custom_outputs["thread_id"]

    booked = create(server, None, thread_id=thread_id, resume="yes", user_id=OWNER)
    assert "interrupts" not in booked.custom_outputs
    assert booked.custom_outputs["parent_checkpoint_id"] == asked.custom_outputs["checkpoint_id"]
    assert "Booked: a trip to Tokyo, confirmation TT-" in booked.output_text
    assert head(server, thread_id) == booked.custom_outputs["checkpoint_id"]


def test_openai_client_resumes_from_the_interrupted_response_by_previous_response_id(server):
    asked = create(server, BOOK_TOKYO, user_id=OWNER)
    booked = server.openai.responses.create(
        model="timetravel-agent", input=[], previous_response_id=asked.id,
        extra_body={"custom_inputs": {"resume": "yes", "user_id": OWNER}},
    )  # fmt: skip
    assert "Booked: a trip to Tokyo" in booked.output_text
    assert booked.previous_response_id == asked.id
    assert booked.custom_outputs["thread_id"] == asked.custom_outputs["thread_id"]


def test_openai_client_streams_the_question_and_the_resumed_answer(server):
    events = create(server, BOOK_TOKYO, stream=True, user_id=OWNER)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    completed = events[-1]
    assert completed.type == "response.completed"
    [interrupt] = completed.custom_outputs["interrupts"]
    [request_item] = [item for item in done if item.type == "mcp_approval_request"]
    assert_approval_request(request_item.model_dump(), interrupt)
    assert [i.type for i in completed.response.output][-1] == "mcp_approval_request"

    thread_id = completed.custom_outputs["thread_id"]
    resumed = create(server, None, stream=True, thread_id=thread_id, resume={interrupt["id"]: {"approve": False}},
                     user_id=OWNER)  # fmt: skip
    text = "".join(e.delta for e in resumed if e.type == "response.output_text.delta")
    assert "Not booked: the user declined the trip to Tokyo." in text
    assert resumed[-1].custom_outputs["parent_checkpoint_id"] == completed.custom_outputs["checkpoint_id"]


def test_openai_client_gets_typed_errors_for_answers_that_cannot_apply(server):
    asked = ask(server)
    thread_id, waiting = asked["thread_id"], asked["checkpoint_id"]
    with pytest.raises(openai.BadRequestError, match="not pending"):
        create(server, None, thread_id=thread_id, resume={"0" * 32: "yes"}, user_id=OWNER)
    with pytest.raises(openai.NotFoundError):
        create(server, None, thread_id=thread_id, resume="yes", user_id="mallory")
    with pytest.raises(openai.ConflictError, match="waits for an answer"):
        create(server, "Where am I going?", thread_id=thread_id, user_id=OWNER)
    assert head(server, thread_id) == waiting


def test_a_fetched_response_carries_the_question_as_the_answer_did(server):
    # Anonymous: this server reads no user header, so GET /responses/{id} is an anonymous caller's.
    asked = create(server, BOOK_TOKYO)
    fetched = server.openai.responses.retrieve(asked.id)
    assert [item.model_dump() for item in fetched.output] == [item.model_dump() for item in asked.output]
    assert [item.type for item in fetched.output] == ["function_call", "mcp_approval_request"]

    queued = server.openai.responses.create(model="timetravel-agent", input=BOOK_TOKYO, background=True)
    done = server.openai.responses.retrieve(queued.id)
    for _ in range(200):
        if done.status not in ("queued", "in_progress"):
            break
        time.sleep(0.05)
        done = server.openai.responses.retrieve(queued.id)
    [interrupt] = done.custom_outputs["interrupts"]
    assert [item.type for item in done.output] == ["function_call", "mcp_approval_request"]
    assert_approval_request(done.output[-1].model_dump(), interrupt)
    by_checkpoint = server.openai.responses.retrieve(done.custom_outputs["response_id"])
    assert [item.model_dump() for item in by_checkpoint.output] == [item.model_dump() for item in done.output]


# -- /invocations ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_invocations_carry_the_question_and_resume_it(server, stream):
    if stream:
        events = invoke(server, BOOK_TOKYO, stream=True, user_id=OWNER)
        outputs = events[-1]["custom_outputs"]
        items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    else:
        asked = ok(invoke(server, BOOK_TOKYO, user_id=OWNER))
        outputs, items = asked["custom_outputs"], asked["output"]
    [interrupt] = outputs["interrupts"]
    assert_approval_request(items[-1], interrupt)
    assert items[0]["type"] == "function_call" and items[0]["name"] == "book_trip"

    resumed = ok(invoke(server, None, thread_id=outputs["thread_id"], resume=True, user_id=OWNER))
    assert resumed["output"][0]["type"] == "function_call_output"
    assert resumed["output"][0]["output"].startswith("Booked: a trip to Tokyo")
    assert resumed["custom_outputs"]["parent_checkpoint_id"] == outputs["checkpoint_id"]


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error_code", "message"}, body
    assert "Traceback" not in response.text
    return body["message"]


def test_a_wrong_interrupt_id_is_a_400_and_writes_nothing(server):
    asked = ask(server)
    message = error_of(invoke(server, None, thread_id=asked["thread_id"], resume={"f" * 32: "yes"}, user_id=OWNER), 400)
    assert "not pending" in message and asked["interrupts"][0]["id"] in message and "nothing was written" in message
    assert head(server, asked["thread_id"]) == asked["checkpoint_id"]


def test_resume_with_nothing_pending_is_a_400_and_writes_nothing(server):
    asked = ask(server)
    done = ok(invoke(server, None, thread_id=asked["thread_id"], resume="yes", user_id=OWNER))["custom_outputs"]
    message = error_of(invoke(server, None, thread_id=asked["thread_id"], resume="yes", user_id=OWNER), 400)
    assert "has none" in message
    assert head(server, asked["thread_id"]) == done["checkpoint_id"]


@pytest.mark.parametrize("intruder", ["mallory", None], ids=["another user", "anonymous"])
def test_another_users_resume_is_a_404_and_writes_nothing(server, intruder):
    asked = ask(server)
    custom = {"thread_id": asked["thread_id"], "resume": "yes"}
    if intruder:
        custom["user_id"] = intruder
    message = error_of(invoke(server, None, **custom), 404)
    assert "Booked" not in message
    # Streamed, it is refused before the first event: the same status, no stream.
    streamed = server.http.post("/invocations", json={"input": [], "custom_inputs": custom, "stream": True})
    error_of(streamed, 404)
    assert head(server, asked["thread_id"]) == asked["checkpoint_id"]
    # The owner can still answer.
    assert ok(invoke(server, None, thread_id=asked["thread_id"], resume="yes", user_id=OWNER))


def test_a_new_message_while_the_question_waits_is_a_409_unless_it_cancels(server):
    asked = ask(server)
    message = error_of(invoke(server, "Where am I going?", thread_id=asked["thread_id"], user_id=OWNER), 409)
    assert "custom_inputs.resume" in message and "cancel_interrupts" in message
    assert head(server, asked["thread_id"]) == asked["checkpoint_id"]
    past = ok(invoke(server, "Never mind.", thread_id=asked["thread_id"], cancel_interrupts=True, user_id=OWNER))
    assert past["custom_outputs"]["cancelled_interrupts"] == [asked["interrupts"][0]["id"]]
