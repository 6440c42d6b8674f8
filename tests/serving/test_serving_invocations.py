"""`mlflow models serve`: the logged model behind POST /invocations, on Postgres.

One server per module: the model logged by `scripts/log_model.py`, served with
`mlflow models serve --env-manager local` on a free port, talking to the test
session's Postgres database and to the fake OpenAI server as its chat model
(so the tests can count model calls).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.helpers.claims import other_replica_holds
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.scenario import TRIP, request
from tests.helpers.servers import free_port, log_model_with_script, server_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, pg_url):
    cwd = tmp_path_factory.mktemp("models_serve")
    tracking_uri = f"sqlite:///{cwd / 'mlflow.db'}"
    uri = log_model_with_script(cwd, {"MLFLOW_TRACKING_URI": tracking_uri})
    with openai_stub_server() as model_url:
        port = free_port()
        env = {
            "MLFLOW_TRACKING_URI": tracking_uri,
            "AGENT_DATABASE_URL": pg_url,
            "AGENT_MODEL": "fake",
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "test",
            "AGENT_TRACING": "false",
            # `mlflow models serve` execs `uvicorn` from PATH, as in an activated virtualenv.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager", "local",
                   "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
        with server_process(command, port=port, health_path="/ping", env=env, cwd=cwd) as base_url:
            with httpx.Client(base_url=base_url, timeout=60) as client:
                yield SimpleNamespace(client=client, model_url=model_url)


def invoke(server, body: dict) -> httpx.Response:
    return server.client.post("/invocations", json=body)


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def text(body: dict) -> str:
    return " ".join(c["text"] for item in body["output"] if item["type"] == "message" for c in item["content"])


def trip(server, **custom_inputs) -> dict:
    first = ok(invoke(server, request(TRIP[0], **custom_inputs)))
    thread = first["custom_outputs"]["thread_id"]
    second = ok(invoke(server, request(TRIP[1], thread_id=thread, **custom_inputs)))
    third = ok(invoke(server, request(TRIP[2], thread_id=thread, **custom_inputs)))
    return {"thread_id": thread, "turns": [first, second, third]}


def model_calls(server) -> int:
    return len(httpx.get(f"{server.model_url.removesuffix('/v1')}/_requests").json())


def test_invocations_runs_the_trip_with_continuation_and_branching(server, make_agent, pg_url):
    ids = trip(server)
    first, second, third = ids["turns"]
    assert "SF" in text(third) and "[fake openai]" in text(third)
    assert third["custom_outputs"]["parent_checkpoint_id"] == second["custom_outputs"]["checkpoint_id"]
    assert second["custom_outputs"]["parent_checkpoint_id"] == first["custom_outputs"]["checkpoint_id"]

    after_turn1 = first["custom_outputs"]["checkpoint_id"]
    branch = ok(invoke(server, request("I'm headed to Tokyo!", thread_id=ids["thread_id"], checkpoint_id=after_turn1)))
    assert branch["custom_outputs"]["parent_checkpoint_id"] == after_turn1
    answer = ok(invoke(server, request(TRIP[2], thread_id=ids["thread_id"])))
    assert "Tokyo" in text(answer) and "SF" not in text(answer)

    # The server wrote to the database this process can read.
    history = make_agent(pg_url).get_checkpoint_history(ids["thread_id"], limit=10)
    assert history[0]["checkpoint_id"] == answer["custom_outputs"]["checkpoint_id"]
    assert third["custom_outputs"]["checkpoint_id"] in {entry["checkpoint_id"] for entry in history}


def test_invocations_time_travel_actions_match_python_methods_without_calling_the_model(server, make_agent, pg_url):
    ids = trip(server)
    thread = ids["thread_id"]
    after_turn1 = ids["turns"][0]["custom_outputs"]["checkpoint_id"]
    agent = make_agent(pg_url)
    calls_before = model_calls(server)

    listed = ok(invoke(server, request(action="get_checkpoint_history", thread_id=thread, limit=3)))
    assert listed["custom_outputs"]["history"] == agent.get_checkpoint_history(thread, limit=3)
    older = ok(invoke(server, request(action="get_checkpoint_history", thread_id=thread, before=after_turn1)))
    # Only the thread's empty root checkpoint is older than the first turn.
    assert [(e["source"], e["message_count"]) for e in older["custom_outputs"]["history"]] == [("root", 0)]

    updated = ok(invoke(server, request("I'm headed to Tokyo!", action="update_checkpoint_state",
                                        thread_id=thread, checkpoint_id=after_turn1)))  # fmt: skip
    assert updated["custom_outputs"]["parent_checkpoint_id"] == after_turn1
    assert agent.get_checkpoint_history(thread, limit=1)[0]["checkpoint_id"] == updated["custom_outputs"]["checkpoint_id"]
    assert model_calls(server) == calls_before

    answer = ok(invoke(server, request("Where am I going?", thread_id=thread)))
    assert "Tokyo" in text(answer) and "SF" not in text(answer)
    assert model_calls(server) == calls_before + 1


def test_invocations_branch_actions_match_python_methods(server, make_agent, pg_url):
    ids = trip(server)
    thread = ids["thread_id"]
    first, second, third = (turn["custom_outputs"]["checkpoint_id"] for turn in ids["turns"])
    agent = make_agent(pg_url)
    state = ok(invoke(server, request(action="get_checkpoint_state", thread_id=thread)))["custom_outputs"]
    assert state == agent.get_checkpoint_state(thread)
    assert state["checkpoint_id"] == third and [i["role"] for i in state["messages"]] == ["user", "assistant"] * 3

    # Edit the first message (a sibling from the thread's root), then regenerate that answer.
    edited = ok(invoke(server, request("I'm headed to Tokyo!", thread_id=thread, edit_message_id=state["messages"][0]["id"])))
    root = ids["turns"][0]["custom_outputs"]["parent_checkpoint_id"]
    assert edited["custom_outputs"]["parent_checkpoint_id"] == root and "Tokyo" in text(edited)
    again = ok(invoke(server, request(thread_id=thread, regenerate=True)))
    assert again["custom_outputs"]["parent_checkpoint_id"] == root
    assert agent.get_checkpoint_state(thread)["messages"][0]["siblings"]["count"] == 3

    # Switch back to the SF branch: no checkpoint written, and the next turn continues there.
    moved = ok(invoke(server, request(action="set_head", thread_id=thread, checkpoint_id=third)))
    assert moved["custom_outputs"]["previous_checkpoint_id"] == again["custom_outputs"]["checkpoint_id"]
    assert "SF" in text(ok(invoke(server, request("Where am I going?", thread_id=thread))))

    # This server's request model drops message items' ids; edit_message_id edits in place.
    sf = state["messages"][2]
    updated = ok(invoke(server, request("I'm headed to LA!", action="update_checkpoint_state", thread_id=thread,
                                        checkpoint_id=second, edit_message_id=sf["id"])))  # fmt: skip
    in_place = agent.get_checkpoint_state(thread, updated["custom_outputs"]["checkpoint_id"])
    assert in_place["messages"][2]["id"] == sf["id"] and in_place["messages"][2]["content"][0]["text"] == "I'm headed to LA!"
    assert ok(invoke(server, request(action="list_branches", thread_id=thread)))["custom_outputs"]["branches"] == (
        agent.list_branches(thread)
    )
    fork = ok(invoke(server, request(action="fork_thread", thread_id=thread, checkpoint_id=first)))["custom_outputs"]
    assert agent.get_checkpoint_state(fork["thread_id"])["message_count"] == 2


@pytest.mark.parametrize(
    ("case", "status", "error_code", "says"),
    [
        ("unknown custom_inputs key", 400, "INVALID_PARAMETER_VALUE", "Unknown custom_inputs"),
        ("unknown action", 400, "INVALID_PARAMETER_VALUE", "Unknown action"),
        ("empty turn", 400, "INVALID_PARAMETER_VALUE", "input is empty"),
        ("unknown thread", 404, "RESOURCE_DOES_NOT_EXIST", "was not found"),
        ("unknown checkpoint", 404, "RESOURCE_DOES_NOT_EXIST", "Checkpoint"),
        ("another user's thread", 404, "RESOURCE_DOES_NOT_EXIST", "was not found"),
        ("state at an unknown checkpoint", 404, "RESOURCE_DOES_NOT_EXIST", "Checkpoint"),
        ("edit of a message not in the checkpoint", 400, "INVALID_PARAMETER_VALUE", "no-such-message"),
        ("regenerate without a user message", 400, "INVALID_PARAMETER_VALUE", "no user message"),
    ],
)
def test_invocations_answers_agent_errors_with_4xx_and_the_message_without_a_traceback(
    server, case, status, error_code, says
):
    owned = ok(invoke(server, request(TRIP[1], user_id="alice")))["custom_outputs"]
    bodies = {
        "unknown custom_inputs key": request("hi", thread=owned["thread_id"]),
        "unknown action": request(action="rewind", thread_id=owned["thread_id"], user_id="alice"),
        "empty turn": request(thread_id=owned["thread_id"], user_id="alice"),
        "unknown thread": request(action="get_checkpoint_history", thread_id=f"missing-{uuid.uuid4()}"),
        "unknown checkpoint": request("hi", thread_id=owned["thread_id"], user_id="alice", checkpoint_id=str(uuid.uuid4())),
        "another user's thread": request("hi", thread_id=owned["thread_id"], user_id="mallory"),
        "state at an unknown checkpoint": request(action="get_checkpoint_state", thread_id=owned["thread_id"],
                                                  user_id="alice", checkpoint_id=str(uuid.uuid4())),
        "edit of a message not in the checkpoint": request("hi", thread_id=owned["thread_id"], user_id="alice",
                                                           edit_message_id="no-such-message"),
        "regenerate without a user message": request(thread_id=owned["thread_id"], user_id="alice", regenerate=True,
                                                     checkpoint_id=owned["parent_checkpoint_id"]),
    }  # fmt: skip
    response = invoke(server, bodies[case])
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error_code"] == error_code
    assert says in body["message"]
    assert "Traceback" not in response.text and 'File "' not in response.text


def test_invocations_answers_409_while_another_process_holds_the_thread(server, pg_url):
    thread = ok(invoke(server, request(TRIP[1])))["custom_outputs"]["thread_id"]
    with other_replica_holds(pg_url, thread):
        busy = invoke(server, request(TRIP[2], thread_id=thread))
    assert busy.status_code == 409, busy.text
    assert busy.json()["error_code"] == "RESOURCE_CONFLICT"
    assert "busy" in busy.json()["message"] and "Traceback" not in busy.text
    assert "SF" in text(ok(invoke(server, request(TRIP[2], thread_id=thread))))  # free again: the turn runs


def test_invocations_takes_user_id_from_custom_inputs_or_context(server):
    started = ok(invoke(server, {**request(TRIP[1]), "context": {"user_id": "alice"}}))["custom_outputs"]
    thread = started["thread_id"]
    by_custom_inputs = ok(invoke(server, request(TRIP[2], thread_id=thread, user_id="alice")))
    assert "SF" in text(by_custom_inputs)
    by_context = ok(invoke(server, {**request("And then?", thread_id=thread), "context": {"user_id": "alice"}}))
    assert by_context["custom_outputs"]["parent_checkpoint_id"] == by_custom_inputs["custom_outputs"]["checkpoint_id"]
    assert invoke(server, {**request("hi", thread_id=thread), "context": {"user_id": "bob"}}).status_code == 404
    assert invoke(server, request("hi", thread_id=thread)).status_code == 404  # anonymous


def test_invocations_answers_a_stream_request_with_one_json_response(server):
    # mlflow#12439: the scoring server never streams; README points to `tt-agent serve`.
    response = invoke(server, {**request(TRIP[1]), "stream": True})
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["custom_outputs"]["checkpoint_id"]


def test_invocations_refuses_a_lone_surrogate_with_400(server):
    body = json.dumps(request("broken \ud800 text"))  # ASCII: the surrogate travels as a \u escape
    response = server.client.post("/invocations", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "not valid Unicode" in response.json()["message"] and "Traceback" not in response.text


def test_mlflow_models_serve_never_shows_the_idempotency_key_header_but_takes_the_custom_inputs_key(server):
    thread = ok(invoke(server, request("start")))["custom_outputs"]["thread_id"]
    calls = model_calls(server)
    body, headers = request("hello again", thread_id=thread), {"Idempotency-Key": f"header-{uuid.uuid4()}"}
    first = ok(server.client.post("/invocations", json=body, headers=headers))
    second = ok(server.client.post("/invocations", json=body, headers=headers))
    # The scoring server hands the model only the body (mlflow.pyfunc.scoring_server): the header
    # is not seen, so the "retry" ran as a new turn.
    assert second["custom_outputs"]["parent_checkpoint_id"] == first["custom_outputs"]["checkpoint_id"]
    assert model_calls(server) == calls + 2

    keyed = request("once only", thread_id=thread, idempotency_key=f"body-{uuid.uuid4()}")
    once = ok(invoke(server, keyed))
    assert ok(invoke(server, keyed)) == once
    assert model_calls(server) == calls + 3
