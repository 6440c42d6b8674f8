"""The trusted `user_id_header` over real HTTP: one plain value names the caller, anything else is a 400.

A proxy that appends its header instead of replacing the client's leaves two
header lines (or one comma-joined value); the first would be the client's own.
Every route refuses such a request before it runs (`agent.serving.identity`),
and nothing is written. One in-process server on a SQLite file.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from agent import create_agent
from agent.serving.agent_server import build_app
from tests.helpers.servers import in_process_server

HEADER = "X-Forwarded-User"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("identity") / "identity.sqlite"
    with create_agent(f"sqlite:///{path}", model="offline", tracing=False, user_id_header=HEADER) as agent:
        with in_process_server(build_app(agent)) as url, httpx.Client(base_url=url, timeout=60) as http:
            yield agent, http, url


def _thread_count(agent, *users) -> int:
    return sum(len(agent.list_threads(user_id=user, limit=100)) for user in users)


DOUBLED = {
    "two lines": [(HEADER, "mallory"), (HEADER, "alice")],
    "two lines, other case": [(HEADER.lower(), "mallory"), (HEADER, "alice")],
    "an empty line and a value": [(HEADER, ""), (HEADER, "alice")],
    "comma-joined": [(HEADER, "mallory, alice")],
    "comma-joined, no space": [(HEADER, "mallory,alice")],
}


@pytest.mark.parametrize("headers", list(DOUBLED.values()), ids=list(DOUBLED))
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/responses", {"input": "hi"}),
        ("POST", "/responses", {"input": "hi", "stream": True}),
        ("POST", "/invocations", {"input": [{"role": "user", "content": "hi"}]}),
        ("POST", "/conversations", {"items": [{"role": "user", "content": "hi"}]}),
        ("GET", "/conversations/some-thread", None),
    ],
    ids=["responses", "responses-stream", "invocations", "conversations-create", "conversations-get"],
)
def test_a_doubled_or_listed_header_is_a_400_and_writes_nothing(served, headers, method, path, body):
    agent, http, _ = served
    before = _thread_count(agent, "mallory", "alice", None)
    response = http.request(method, path, headers=headers, json=body)
    assert response.status_code == 400, response.text
    answer = response.json()
    if path == "/invocations":  # MLflow's error shape, and OpenAI's on its routes
        assert set(answer) == {"error_code", "message"} and answer["error_code"] == "INVALID_PARAMETER_VALUE"
        message = answer["message"]
    else:
        assert set(answer) == {"error"} and answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["param"] == HEADER
        message = answer["error"]["message"]
    assert HEADER in message and "replace" in message
    assert _thread_count(agent, "mallory", "alice", None) == before


def test_the_openai_client_gets_a_bad_request_error(served):
    _, _, url = served
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, default_headers={HEADER: "mallory,alice"})
    with pytest.raises(openai.BadRequestError, match="must be one user id"):
        client.responses.create(model="timetravel-agent", input="hi")
    client.close()


def test_one_header_names_the_caller(served):
    agent, http, _ = served
    response = http.post("/responses", headers={HEADER: "alice"}, json={"input": "I'm headed to SF!"})
    assert response.status_code == 200, response.text
    thread_id = response.json()["custom_outputs"]["thread_id"]
    assert thread_id in {t["thread_id"] for t in agent.list_threads(user_id="alice")}
    again = http.get(f"/conversations/{thread_id}", headers={HEADER: "alice"})
    assert again.status_code == 200 and again.json()["id"] == thread_id
    # Without the header the caller is anonymous, and alice's thread is not theirs.
    assert http.get(f"/conversations/{thread_id}").status_code == 404
