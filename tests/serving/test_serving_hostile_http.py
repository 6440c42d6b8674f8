"""Hostile input over HTTP: every error answer of the Agent Server has the documented
body of its route (`{"error_code", "message"}`, OpenAI's on `/responses`), deep nesting is a 400 on every path, a slow body is a 408, too many
input items is a 400, and a 4xx is logged as one line while a 5xx keeps its traceback in the log.

Apps are served in-process with uvicorn (real sockets, real HTTP), so the tests can read the log records.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid

import httpx
import pytest

from agent import create_agent
from agent.models import OfflineChatModel
from agent.serving.agent_server import build_app
from agent.serving.limits import MAX_JSON_DEPTH
from tests.helpers.error_bodies import assert_error_body as error_body_of_route
from tests.helpers.scenario import request
from tests.helpers.servers import in_process_server

pytestmark = pytest.mark.slow

PATHS = ["/responses", "/invocations"]


@pytest.fixture(scope="module")
def base_url():
    with create_agent("memory://", model="offline", tracing=False, max_input_items=5, body_timeout=1.0) as agent:
        with in_process_server(build_app(agent)) as url:
            yield url


@pytest.fixture
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=30) as client:
        yield client


def assert_error_body(response: httpx.Response, status: int, error_code: str) -> dict:
    """The answer's body has the error shape of its route (OpenAI's on /responses); returns {"message": ...}."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = error_body_of_route(response.request.url.path, response.json(), error_code)
    assert message and "Traceback" not in response.text and 'File "' not in response.text
    return {"message": message}


# --- the error body on every kind of error answer -------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error_code"),
    [
        ("GET", "/no-such-route", None, 404, "ENDPOINT_NOT_FOUND"),
        ("POST", "/no-such-route", b"{}", 404, "ENDPOINT_NOT_FOUND"),
        ("GET", "/responses", None, 405, "BAD_REQUEST"),
        ("DELETE", "/invocations", None, 405, "BAD_REQUEST"),
        ("POST", "/health", b"{}", 405, "BAD_REQUEST"),
        ("POST", "/responses", b"{not json", 400, "INVALID_PARAMETER_VALUE"),
        ("POST", "/responses", b"[1, 2]", 400, "INVALID_PARAMETER_VALUE"),
        # MLflow's own validator (HTTPException(400, detail=...)): a temperature that is not a number.
        ("POST", "/responses", json.dumps({"input": [], "temperature": "hot"}).encode(), 400, "INVALID_PARAMETER_VALUE"),
        ("POST", "/invocations", json.dumps({"input": 42, "stream": True}).encode(), 400, "INVALID_PARAMETER_VALUE"),
        # `stream` is read by its truth to pick the streaming handler: anything but a bool is refused first.
        ("POST", "/responses", json.dumps({"input": "hi", "stream": "false"}).encode(), 400, "INVALID_PARAMETER_VALUE"),
        ("POST", "/invocations", json.dumps({"input": "hi", "stream": 1}).encode(), 400, "INVALID_PARAMETER_VALUE"),
        # The agent's own errors.
        ("POST", "/responses", json.dumps(request("hi", thread=1)).encode(), 400, "INVALID_PARAMETER_VALUE"),
        ("POST", "/invocations", json.dumps(request(action="get_checkpoint_history", thread_id="nobody")).encode(),
         404, "RESOURCE_DOES_NOT_EXIST"),
    ],
)
def test_every_error_answer_has_the_error_body(http, method, path, body, status, error_code):
    response = http.request(method, path, content=body, headers={"content-type": "application/json"})
    assert_error_body(response, status, error_code)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_more_input_items_than_max_input_items_is_a_400(http, path, stream):
    items = [{"role": "user", "content": f"message {n}"} for n in range(6)]
    body = assert_error_body(http.post(path, json={"input": items, "stream": stream}), 400, "INVALID_PARAMETER_VALUE")
    assert "6 items" in body["message"] and "limit is 5" in body["message"]
    answered = http.post(path, json={"input": items[:5]})
    assert answered.status_code == 200 and answered.json()["custom_outputs"]["checkpoint_id"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("items", [[{"role": "user"}], [42], [{"type": "function_call", "name": "x"}]], ids=["no content", "a number", "no call_id"])
def test_a_malformed_input_item_is_a_400_whose_message_is_one_line_naming_the_item(http, path, stream, items):
    body = assert_error_body(http.post(path, json={"input": items, "stream": stream}), 400, "INVALID_PARAMETER_VALUE")
    message = body["message"]
    # As `predict` words it (tests/test_errors.py): no pydantic validator names, documentation links or newlines.
    assert "\n" not in message and "pydantic.dev" not in message and "function-after" not in message
    assert "input.0" in message


# --- nesting ---------------------------------------------------------------------------------------


# Around the limit here, pydantic's serialization limit (255), and json's recursion limit (about 1,000).
DEPTHS = [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 254, 255, 256, 900, 999, 1000, 1001, 5000, 100_000]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("where", ["custom_inputs", "content", "context"])
def test_deep_nesting_is_a_400_on_every_path_and_the_connection_stays_usable(http, path, stream, where):
    for depth in DEPTHS:
        text = deep_body(where, depth, stream)
        assert depth > 300 or _depth(json.loads(text)) == depth
        response = http.post(path, content=text.encode(), headers={"content-type": "application/json"})
        if depth > MAX_JSON_DEPTH:
            answer = assert_error_body(response, 400, "INVALID_PARAMETER_VALUE")
            assert f"nested more than {MAX_JSON_DEPTH} levels" in answer["message"], (depth, answer)
        elif response.status_code != 200:  # within the limit: answered, or refused for what it says
            assert_error_body(response, 400, "INVALID_PARAMETER_VALUE")
    # The keep-alive connection still carries requests.
    assert http.get("/health").json() == {"status": "healthy"}


#: Levels of a body above the nested value, by where the value sits.
OVERHEAD = {"custom_inputs": 2, "content": 4, "context": 1}


def deep_body(where: str, depth: int, stream: bool) -> str:
    """A request body nested exactly `depth` levels deep (written by hand: json.dumps stops at about 1,000)."""
    levels = depth - OVERHEAD[where]
    inner = '{"x":' * levels + '"bottom"' + "}" * levels
    tail = f', "stream": {json.dumps(stream)}}}'
    if where == "custom_inputs":
        return '{"input": [{"role": "user", "content": "hi"}], "custom_inputs": {"thread_id": ' + inner + "}" + tail
    if where == "content":
        return '{"input": [{"role": "user", "content": [' + inner + "]}]" + tail
    return '{"input": [{"role": "user", "content": "hi"}], "context": ' + inner + tail


def _depth(value: object) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if children is None else 1 + max((_depth(c) for c in children), default=0)


# --- a slow body -------------------------------------------------------------------------------------


def test_a_body_slower_than_body_timeout_gets_a_408_and_the_connection_is_closed(base_url):
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps(request("hi")).encode()
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(
            b"POST /responses HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        started = time.monotonic()
        answer = _read_until_closed(client)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in head.lower()
    message = error_body_of_route("/responses", json.loads(payload), "DEADLINE_EXCEEDED")
    assert message == "The request body did not arrive within 1 s"
    assert time.monotonic() - started < 20  # the server ended it, not the client's 30 s timeout


def test_a_body_that_trickles_in_within_body_timeout_is_answered(base_url):
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps(request("hi")).encode()
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(
            b"POST /responses HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        for start in range(0, len(body), 20):
            client.sendall(body[start : start + 20])
            time.sleep(0.01)
        answer = _read_until_closed(client)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def _read_until_closed(client: socket.socket) -> bytes:
    chunks = []
    while chunk := client.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


# --- logs ------------------------------------------------------------------------------------------


class FailsWithABug(OfflineChatModel):
    """A chat model with a bug: every call raises a plain Python exception."""

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        raise KeyError("a bug in the model client")

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        raise KeyError("a bug in the model client")


def test_a_4xx_is_logged_as_one_line_and_a_5xx_with_its_traceback(caplog):
    caplog.set_level(logging.INFO, logger="agent")
    with create_agent("memory://", model=FailsWithABug(), tracing=False) as agent, in_process_server(build_app(agent)) as url:
        with httpx.Client(base_url=url, timeout=30) as http:
            missing = f"missing-{uuid.uuid4()}"
            refused = http.post("/invocations", json=request(action="get_checkpoint_history", thread_id=missing))
            assert refused.status_code == 404
            not_json = http.post("/responses", content=b"{oops", headers={"content-type": "application/json"})
            assert not_json.status_code == 400
            failed = http.post("/responses", json=request("hi"))
            assert failed.status_code == 503 and "Traceback" not in failed.text and "KeyError" in failed.json()["error"]["message"]
    records = [r for r in caplog.records if r.name.startswith("agent")]
    client_errors = [r for r in records if " -> 4" in r.getMessage()]
    assert len(client_errors) == 2
    for record in client_errors:
        assert record.levelno == logging.INFO and record.exc_info is None
        assert "\n" not in record.getMessage()
    assert missing in client_errors[0].getMessage() and "/invocations -> 404 RESOURCE_DOES_NOT_EXIST" in client_errors[0].getMessage()
    server_errors = [r for r in records if " -> 503" in r.getMessage()]
    assert len(server_errors) == 1 and server_errors[0].levelno == logging.ERROR
    assert server_errors[0].exc_info is not None  # the traceback stays in the log
    assert "a bug in the model client" in logging.Formatter().formatException(server_errors[0].exc_info)


@pytest.mark.parametrize("path", ["/conversations", "/conversations/conv_x/items"])
def test_a_body_nested_too_deep_on_the_conversation_routes_is_a_400_in_openais_shape(http, path):
    # Found by a new user: refusals made before the body is parsed answered in MLflow's shape there.
    text = '{"items": [{"role": "user", "content": ' + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + "}]}"
    response = http.post(path, content=text.encode(), headers={"content-type": "application/json"})
    answer = assert_error_body(response, 400, "INVALID_PARAMETER_VALUE")
    assert f"nested more than {MAX_JSON_DEPTH} levels" in answer["message"]


# --- ids in the path ----------------------------------------------------------------------------------

#: Every route of `agent.serving.openai` with an id in its path, as (method, path template, JSON body).
PATH_ID_ROUTES = [
    ("GET", "/responses/{id}", None),
    ("GET", "/responses/{id}?stream=true", None),
    ("GET", "/responses/{id}/input_items", None),
    ("POST", "/responses/{id}/cancel", {}),
    ("DELETE", "/responses/{id}", None),
    ("GET", "/conversations/{id}", None),
    ("POST", "/conversations/{id}", {"metadata": {"k": "v"}}),
    ("DELETE", "/conversations/{id}", None),
    ("GET", "/conversations/{id}/items", None),
    ("POST", "/conversations/{id}/items", {"items": [{"role": "user", "content": "hi"}]}),
]
#: Path ids holding a control character, percent-encoded as a client sends them: NUL (which Postgres text
#: cannot hold: it answered 500 there, 404 on SQLite) and ESC.
CONTROL_IDS = ["resp_%00abc", "%00", "a%00b", "resp_%1Babc", "a%1Bb"]


def test_a_control_character_in_a_path_id_is_the_same_400_on_every_route_and_backend(backend_url, make_agent, caplog):
    # Found by a new user: `GET /responses/resp_%00abc` was a 500 (psycopg.DataError) with a traceback on Postgres.
    caplog.set_level(logging.INFO, logger="agent")
    agent = make_agent(backend_url)
    before = len(agent.list_threads(limit=100))
    answers = {}
    with in_process_server(build_app(agent)) as url, httpx.Client(base_url=url, timeout=30) as http:
        for method, template, body in PATH_ID_ROUTES:
            for path_id in CONTROL_IDS:
                answers[method, template.format(id=path_id)] = http.request(method, template.format(id=path_id), json=body)
    for (method, path), response in answers.items():
        answer = assert_error_body(response, 400, "INVALID_PARAMETER_VALUE")
        assert "must not contain control characters" in answer["message"], (method, path, answer)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    # Each refusal is one log line, its path escaped: a raw ESC in a log would reach the reader's terminal.
    refused = [r.getMessage() for r in caplog.records if " -> 400 " in r.getMessage()]
    assert len(refused) == len(answers) and all(line.isprintable() for line in refused), refused
    assert len(agent.list_threads(limit=100)) == before  # nothing was written


def test_items_with_one_id_twice_are_a_400_naming_it_on_every_route_that_takes_items(backend_url, make_agent):
    # Found by a new user: an update holding two messages with one id was accepted, and the thread's export
    # could no longer be imported. An app of its own: a process serves the agent of the last `build_app`
    # (`agent.serving.agent_server`), and an earlier test of this module builds one and closes its agent.
    with in_process_server(build_app(make_agent(backend_url))) as url, httpx.Client(base_url=url, timeout=30) as http:
        _refuse_items_with_one_id_twice(http)


def _refuse_items_with_one_id_twice(http: httpx.Client) -> None:
    twice = [{"role": "user", "content": "one", "id": "twice"}, {"role": "user", "content": "two", "id": "twice"}]
    conversation = http.post("/conversations", json={}).json()["id"]
    cases = [
        ("/invocations", {"input": twice, "custom_inputs": {"action": "update_checkpoint_state", "thread_id": conversation}}),
        ("/invocations", {"input": twice, "custom_inputs": {"thread_id": conversation}}),
        ("/responses", {"input": twice, "conversation": conversation}),
        ("/responses", {"input": twice, "conversation": conversation, "stream": True}),
        ("/conversations", {"items": twice}),
        (f"/conversations/{conversation}/items", {"items": twice}),
    ]
    for path, body in cases:
        answer = assert_error_body(http.post(path, json=body), 400, "INVALID_PARAMETER_VALUE")
        assert "duplicate id" in answer["message"] and "'twice'" in answer["message"], (path, answer)
    assert http.get(f"/conversations/{conversation}/items").json()["data"] == []  # nothing was written
