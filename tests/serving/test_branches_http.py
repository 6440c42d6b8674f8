"""Branch operations over HTTP on `tt-agent serve`: every action with the official `openai` client
(`/responses`, `extra_body={"custom_inputs": ...}`) and with plain HTTP on `/invocations`; edit and
regenerate streamed; errors with their status, and nothing written.

One server process per module (as a user starts it) on a SQLite file this process also opens, with the
offline model; what the server answers is compared with the Python methods on the same file.
"""

from __future__ import annotations

import sys
import uuid
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.error_bodies import assert_error_body
from tests.helpers.scenario import TRIP, request
from tests.helpers.servers import free_port, server_process
from tests.test_errors import MISSING_CHECKPOINT, row_counts
from tests.operations.test_properties import _expected_reply

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("branches_http")
    database = cwd / "checkpoints.sqlite"
    port = free_port()
    env = {"AGENT_DATABASE_URL": f"sqlite:///{database}", "AGENT_MODEL": "offline", "AGENT_TRACING": "false"}
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
        with httpx.Client(base_url=base_url, timeout=60) as http, openai.OpenAI(
            base_url=base_url, api_key="unused", max_retries=0
        ) as client:
            yield SimpleNamespace(http=http, openai=client, database_url=f"sqlite:///{database}")


@pytest.fixture
def local(server, make_agent):
    """An agent on the server's database, for comparing answers and counting rows."""
    return make_agent(server.database_url)


def create(server, text: str | None = None, *, stream: bool = False, items: list | None = None, **custom_inputs):
    """`responses.create` with the openai client, as an app calls a deployed endpoint."""
    extra_body: dict[str, Any] = {"custom_inputs": {k: v for k, v in custom_inputs.items() if v is not None}}
    if items is None:
        items = [] if text is None else [{"role": "user", "content": text}]
    return server.openai.responses.create(model="timetravel-agent", input=items, stream=stream, extra_body=extra_body)


def invoke(server, body: dict) -> dict:
    response = server.http.post("/invocations", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def trip(server, **custom_inputs) -> dict:
    first = create(server, TRIP[0], **custom_inputs)
    thread_id = first.custom_outputs["thread_id"]
    second = create(server, TRIP[1], thread_id=thread_id, **custom_inputs)
    third = create(server, TRIP[2], thread_id=thread_id, **custom_inputs)
    return {
        "thread_id": thread_id,
        "root": first.custom_outputs["parent_checkpoint_id"],
        "after_turn1": first.custom_outputs["checkpoint_id"],
        "after_turn2": second.custom_outputs["checkpoint_id"],
        "after_turn3": third.custom_outputs["checkpoint_id"],
    }


def streamed(server, text: str | None, **custom_inputs) -> tuple[str, dict]:
    events = list(create(server, text, stream=True, **custom_inputs))
    return "".join(e.delta for e in events if e.type == "response.output_text.delta"), events[-1].custom_outputs


# -- every action, both endpoints -----------------------------------------------------------------------


def test_reading_actions_answer_like_the_python_methods_on_both_endpoints(server, local):
    ids = trip(server)
    thread_id = ids["thread_id"]
    tokyo = create(server, "I'm headed to Tokyo!", thread_id=thread_id, checkpoint_id=ids["after_turn1"])
    tokyo_id = tokyo.custom_outputs["checkpoint_id"]
    expected = {
        "get_checkpoint_state": local.get_checkpoint_state(thread_id),
        "list_branches": {"thread_id": thread_id, "branches": local.list_branches(thread_id)},
        "compare_checkpoints": local.compare_checkpoints(thread_id, ids["after_turn3"], tokyo_id),
    }
    arguments = {"compare_checkpoints": {"checkpoint_a": ids["after_turn3"], "checkpoint_b": tokyo_id}}
    for action, answer in expected.items():
        over_responses = create(server, action=action, thread_id=thread_id, **arguments.get(action, {}))
        assert over_responses.custom_outputs == answer and over_responses.output == []
        over_invocations = invoke(server, request(action=action, thread_id=thread_id, **arguments.get(action, {})))
        assert over_invocations["custom_outputs"] == answer
    state = expected["get_checkpoint_state"]
    assert state["messages"][0]["branch_checkpoint_id"] == ids["root"]
    assert state["messages"][2]["siblings"]["count"] == 2  # the SF turn and the Tokyo branch
    at_root = create(server, action="get_checkpoint_state", thread_id=thread_id, checkpoint_id=ids["root"])
    assert at_root.custom_outputs["messages"] == [] and at_root.custom_outputs["source"] == "root"


def test_set_head_and_fork_over_responses_and_invocations(server, local):
    ids = trip(server)
    thread_id = ids["thread_id"]
    moved = create(server, action="set_head", thread_id=thread_id, checkpoint_id=ids["after_turn1"])
    assert moved.custom_outputs == {"thread_id": thread_id, "checkpoint_id": ids["after_turn1"],
                                    "previous_checkpoint_id": ids["after_turn3"]}  # fmt: skip
    answer = create(server, "Where am I going?", thread_id=thread_id)
    assert answer.custom_outputs["parent_checkpoint_id"] == ids["after_turn1"] and "SF" not in answer.output_text
    back = invoke(server, request(action="set_head", thread_id=thread_id, checkpoint_id=ids["after_turn3"]))
    assert back["custom_outputs"]["checkpoint_id"] == ids["after_turn3"]

    fork = create(server, action="fork_thread", thread_id=thread_id, checkpoint_id=ids["after_turn2"])
    assert fork.custom_outputs["forked_from"] == {"thread_id": thread_id, "checkpoint_id": ids["after_turn2"]}
    fork_id = fork.custom_outputs["thread_id"]
    assert local.get_checkpoint_state(fork_id)["message_count"] == 4
    named = invoke(server, request(action="fork_thread", thread_id=thread_id, new_thread_id=f"fork-{uuid.uuid4()}"))
    assert local.get_checkpoint_state(named["custom_outputs"]["thread_id"])["message_count"] == 6
    on_fork = create(server, "I'm headed to Oslo!", thread_id=fork_id)
    assert "SF" in on_fork.output_text and "Where did I say" not in on_fork.output_text


def test_edit_and_regenerate_over_responses_streamed_and_not(server, local):
    ids = trip(server)
    thread_id = ids["thread_id"]
    first = local.get_checkpoint_state(thread_id)["messages"][0]
    text, outputs = streamed(server, "I'm planning a trip to Rome!", thread_id=thread_id, edit_message_id=first["id"])
    assert outputs["parent_checkpoint_id"] == ids["root"]
    assert text == _expected_reply([("user", "I'm planning a trip to Rome!")])
    regenerated = create(server, thread_id=thread_id, regenerate=True)
    assert regenerated.custom_outputs["parent_checkpoint_id"] == ids["root"]
    assert regenerated.output_text == text
    state = local.get_checkpoint_state(thread_id)
    assert state["messages"][0]["siblings"]["count"] == 3 and state["messages"][0]["siblings"]["index"] == 2
    # The same over /invocations.
    sf = local.get_checkpoint_state(thread_id, ids["after_turn3"])["messages"][2]
    edited = invoke(server, request("I'm headed to Lima!", thread_id=thread_id, checkpoint_id=ids["after_turn3"],
                                    edit_message_id=sf["id"]))  # fmt: skip
    assert edited["custom_outputs"]["parent_checkpoint_id"] == ids["after_turn1"]
    again = invoke(server, {"input": [], "custom_inputs": {"thread_id": thread_id, "regenerate": True}})
    assert again["custom_outputs"]["parent_checkpoint_id"] == ids["after_turn1"]


def test_replace_by_item_id_and_remove_over_responses_and_invocations(server, local):
    ids = trip(server)
    thread_id = ids["thread_id"]
    state = local.get_checkpoint_state(thread_id)
    sf = state["messages"][2]
    # The item's id survives the server's request validation (MLflow's Message type has no id).
    replaced = create(server, items=[{"role": "user", "content": "I'm headed to LA!", "id": sf["id"]}],
                      action="update_checkpoint_state", thread_id=thread_id)  # fmt: skip
    after = local.get_checkpoint_state(thread_id)
    assert after["checkpoint_id"] == replaced.custom_outputs["checkpoint_id"] and after["message_count"] == 6
    assert after["messages"][2]["content"][0]["text"] == "I'm headed to LA!" and after["messages"][2]["id"] == sf["id"]
    removed = invoke(server, request(action="update_checkpoint_state", thread_id=thread_id,
                                     remove_message_ids=[sf["id"], state["messages"][3]["id"]]))  # fmt: skip
    final = local.get_checkpoint_state(thread_id)
    assert final["checkpoint_id"] == removed["custom_outputs"]["checkpoint_id"] and final["message_count"] == 4
    in_place = invoke(server, request("I'm headed to Quito!", action="update_checkpoint_state", thread_id=thread_id,
                                      edit_message_id=final["messages"][0]["id"]))  # fmt: skip
    assert local.get_checkpoint_state(thread_id)["messages"][0]["content"][0]["text"] == "I'm headed to Quito!"
    assert in_place["custom_outputs"]["parent_checkpoint_id"] == final["checkpoint_id"]


# -- errors ----------------------------------------------------------------------------------------------


ERROR_CASES = {
    "state of an unknown thread": (lambda ids: request(action="get_checkpoint_state", thread_id=f"missing-{uuid.uuid4()}"), 404),
    "branches of another user's thread": (lambda ids: request(action="list_branches", thread_id=ids["thread_id"], user_id="bob"), 404),
    "set_head to an unknown checkpoint": (lambda ids: request(action="set_head", thread_id=ids["thread_id"], checkpoint_id=MISSING_CHECKPOINT, user_id="alice"), 404),
    "fork at an unknown checkpoint": (lambda ids: request(action="fork_thread", thread_id=ids["thread_id"], checkpoint_id=MISSING_CHECKPOINT, user_id="alice"), 404),
    "compare with another user": (lambda ids: request(action="compare_checkpoints", thread_id=ids["thread_id"], checkpoint_a=ids["root"], checkpoint_b=ids["root"], user_id="bob"), 404),
    "edit of a message not in the checkpoint": (lambda ids: request("hi", thread_id=ids["thread_id"], edit_message_id="no-such-message", user_id="alice"), 400),
    "regenerate at the root": (lambda ids: request(None, thread_id=ids["thread_id"], checkpoint_id=ids["root"], regenerate=True, user_id="alice"), 400),
    "remove a message not in the checkpoint": (lambda ids: request(action="update_checkpoint_state", thread_id=ids["thread_id"], remove_message_ids=["no-such-message"], user_id="alice"), 400),
    "fork into a thread in use": (lambda ids: request(action="fork_thread", thread_id=ids["thread_id"], new_thread_id=ids["thread_id"], user_id="alice"), 400),
}  # fmt: skip
CODES = {400: "INVALID_PARAMETER_VALUE", 404: "RESOURCE_DOES_NOT_EXIST"}


@pytest.fixture(scope="module")
def alices_trip(server) -> dict:
    return trip(server, user_id="alice")


@pytest.mark.parametrize("path", ["/responses", "/invocations"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_branch_errors_get_their_status_and_write_nothing(server, local, alices_trip, path, stream, case):
    build, status = ERROR_CASES[case]
    before = row_counts(local), local.get_checkpoint_history(alices_trip["thread_id"], limit=1000, user_id="alice")
    response = server.http.post(path, json={**build(alices_trip), "stream": stream})
    assert response.status_code == status, response.text
    assert assert_error_body(path, response.json(), CODES[status]) and "Traceback" not in response.text
    assert (row_counts(local), local.get_checkpoint_history(alices_trip["thread_id"], limit=1000, user_id="alice")) == before


def test_openai_client_raises_typed_errors_for_branch_operations(server, alices_trip):
    with pytest.raises(openai.NotFoundError) as not_found:
        create(server, action="set_head", thread_id=alices_trip["thread_id"], checkpoint_id=MISSING_CHECKPOINT, user_id="alice")
    assert MISSING_CHECKPOINT in not_found.value.message
    with pytest.raises(openai.BadRequestError) as invalid:
        create(server, thread_id=alices_trip["thread_id"], checkpoint_id=alices_trip["root"], regenerate=True,
               user_id="alice", stream=True)  # fmt: skip
    assert "no user message" in invalid.value.message


def test_without_cors_origins_a_preflight_gets_no_cors_headers(server):
    # The module's server has no AGENT_CORS_ORIGINS: no origin may call it from a browser.
    response = server.http.options(
        "/responses", headers={"Origin": "https://chat.example.com", "Access-Control-Request-Method": "POST"}
    )
    assert response.status_code == 405 and "access-control-allow-origin" not in response.headers
