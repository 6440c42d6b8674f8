"""The Responses wire format, whole: every event, item, response and error body of `POST /responses`,
the stored-response routes and the Conversations API validates against the `openai` package's own
models, and the client's `responses.stream()` helper consumes a turn.

Modelled on the Open Responses compliance cases (a text turn, a tool-call turn, an error turn, a
non-streamed response, stored responses), with our stateful ones: sibling branches from one
`previous_response_id`, `store: false`, an idempotent retry replayed as a stream, an unknown
`previous_response_id` (`previous_response_not_found`), a turn that stops at the graph's `interrupt()`.

One in-process server for the module (the offline model, an in-memory store); its model breaks
mid-stream when asked to, for the error event.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.conversations import ConversationItem
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from openai.types.shared import ErrorObject

from agent import create_agent
from agent.models.offline import OfflineChatModel
from agent.operations.merges import SUMMARY_PREFIX
from agent.serving.agent_server import build_app
from tests.helpers.scenario import TRIP
from tests.helpers.servers import in_process_server
from tests.operations.test_interrupts import BOOK, approval_graph

MODEL = "timetravel-agent"
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
RESPONSE_ITEM = pydantic.TypeAdapter(ResponseItem)
CONVERSATION_ITEM = pydantic.TypeAdapter(ConversationItem)
#: What makes the module's model lose its connection after its first chunk.
BREAK = "break mid-stream"


class BreaksWhenAsked(OfflineChatModel):
    """The offline model, except that a last message saying `BREAK` streams one chunk and then fails."""

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        chunks = super()._astream(messages, stop, run_manager, **kwargs)
        async for chunk in chunks:
            yield chunk
            if BREAK in str(messages[-1].content):
                raise ConnectionError("upstream connection reset")


@pytest.fixture(scope="module")
def server():
    with create_agent("memory://", model=BreaksWhenAsked(), tracing=False) as agent, in_process_server(build_app(agent)) as url:
        with httpx.Client(base_url=url, timeout=30) as http, openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            yield SimpleNamespace(http=http, client=client)


def streamed(server, text: str | None = None, *, path: str = "/responses", headers: dict | None = None, **fields: Any) -> list[dict]:
    """The events of one streamed request, as sent (without `[DONE]`, which must end the stream)."""
    body = {"input": text, "stream": True, **fields} if text is not None else {"stream": True, **fields}
    response = server.http.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(line) for line in data[:-1]]


def assert_conforms(events: list[dict]) -> Response:
    """Every event validates as OpenAI's and the stream is well formed; returns its final response.

    Well formed: numbered 0, 1, 2 …; `response.created` and `response.in_progress` first, with the id of
    `response.completed`; each item added before its content and done, at one `output_index`, its deltas
    adding up to its text; `response.completed` last, its output the finished items, with `custom_outputs`
    (as the last `output_item.done`).
    """
    for event in events:
        EVENT.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events[:2]] == ["response.created", "response.in_progress"]
    completed = events[-1]
    assert completed["type"] == "response.completed"
    final = Response.model_validate(completed["response"])
    assert events[0]["response"]["id"] == events[1]["response"]["id"] == final.id
    assert events[0]["response"]["status"] == "in_progress" and final.status == "completed"
    added = {event["output_index"]: event["item"] for event in events if event["type"] == "response.output_item.added"}
    done = {event["output_index"]: event["item"] for event in events if event["type"] == "response.output_item.done"}
    assert sorted(added) == sorted(done) == list(range(len(final.output)))
    assert [done[index] for index in sorted(done)] == completed["response"]["output"]
    for index, item in done.items():
        assert added[index]["type"] == item["type"] and added[index].get("id") == item.get("id")
        assert item["status"] == "completed"
        if item["type"] == "message":
            deltas = [e for e in events if e["type"] == "response.output_text.delta" and e["output_index"] == index]
            assert all(e["item_id"] == item["id"] and e["content_index"] == 0 and e["logprobs"] == [] for e in deltas)
            assert "".join(e["delta"] for e in deltas) == item["content"][0]["text"]
            order = [e["type"] for e in events if e.get("output_index") == index]
            assert order[:2] == ["response.output_item.added", "response.content_part.added"]
            assert order[-3:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    last_done = [event for event in events if event["type"] == "response.output_item.done"][-1]
    assert last_done["custom_outputs"] == completed["custom_outputs"]
    assert final.id == completed["custom_outputs"]["response_id"] == f"resp_{completed['custom_outputs']['checkpoint_id']}"
    return final


def test_a_text_turn_streams_events_that_validate_and_a_well_formed_stream(server):
    events = streamed(server, TRIP[0])
    final = assert_conforms(events)
    assert [item.type for item in final.output] == ["message"] and TRIP[0] in final.output_text
    assert (final.model, final.object, final.tools, final.tool_choice, final.parallel_tool_calls) == (
        "offline", "response", [], "auto", True,
    )  # fmt: skip
    assert sum(event["type"] == "response.output_text.delta" for event in events) >= 3
    # `/invocations` keeps MLflow's stream: no lifecycle events, the same numbering.
    mlflow = streamed(server, TRIP[0], path="/invocations")
    assert {event["type"] for event in mlflow} == {"response.output_text.delta", "response.output_item.done", "response.completed"}
    assert [event["sequence_number"] for event in mlflow] == list(range(len(mlflow)))


def test_a_tool_call_turn_streams_each_item_with_its_output_index(server):
    final = assert_conforms(streamed(server, "calculate 6*7"))
    call, result, reply = final.output
    assert (call.type, result.type, reply.type) == ("function_call", "function_call_output", "message")
    assert result.call_id == call.call_id and result.id and result.status == "completed" and "42" in reply.content[0].text
    # The same turn, not streamed, validates too.
    whole = server.http.post("/responses", json={"input": "calculate 6*7"}).json()
    assert [item.type for item in Response.model_validate(whole).output] == ["function_call", "function_call_output", "message"]


def test_the_clients_stream_helper_consumes_a_turn_and_its_id_continues_the_thread(server):
    client = server.client
    with client.responses.stream(model=MODEL, input=TRIP[0]) as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        first = stream.get_final_response()
    assert first.output_text == text and TRIP[0] in text
    with client.responses.stream(model=MODEL, input=TRIP[1], previous_response_id=first.id) as stream:
        second = stream.get_final_response()
    assert second.previous_response_id == first.id and TRIP[0] in second.output_text and TRIP[1] in second.output_text
    # Stored: it reads back whole, and validates.
    stored = server.http.get(f"/responses/{second.id}").json()
    assert Response.model_validate(stored).output_text == second.output_text


def test_the_items_of_stored_responses_and_conversations_validate(server):
    first = server.http.post("/responses", json={"input": "calculate 6*7"}).json()
    second = server.http.post("/responses", json={"input": "thanks", "previous_response_id": first["id"]}).json()
    inputs = server.http.get(f"/responses/{second['id']}/input_items", params={"order": "asc"}).json()["data"]
    head = server.http.get(f"/conversations/{second['custom_outputs']['thread_id']}/items", params={"order": "asc"}).json()["data"]
    types = ["message", "function_call", "function_call_output", "message", "message"]
    assert [item["type"] for item in inputs] == types and [item["type"] for item in head] == [*types, "message"]
    for item in inputs:
        RESPONSE_ITEM.validate_python(item)
    for item in head:
        CONVERSATION_ITEM.validate_python(item)
    assert {item["status"] for item in head} == {"completed"}


def test_a_non_streamed_response_and_a_stored_one_validate(server):
    body = server.http.post("/responses", json={"input": TRIP[0], "instructions": "Be brief."}).json()
    response = Response.model_validate(body)
    assert response.id == body["custom_outputs"]["response_id"] and response.status == "completed"
    assert response.instructions == "Be brief." and response.output[0].status == "completed"
    assert abs(response.created_at - body["created_at"]) < 1e-6 and response.created_at > 1.7e9
    stored = Response.model_validate(server.http.get(f"/responses/{response.id}").json())
    assert stored.id == response.id and stored.output_text == response.output_text


def test_sibling_branches_from_one_previous_response_both_validate(server):
    first = assert_conforms(streamed(server, TRIP[0]))
    branches = [assert_conforms(streamed(server, text, previous_response_id=first.id)) for text in (TRIP[1], "I'm headed to Tokyo!")]
    sf, tokyo = branches
    assert sf.id != tokyo.id and sf.previous_response_id == tokyo.previous_response_id == first.id
    assert "SF" in sf.output_text and "Tokyo" in tokyo.output_text and "SF" not in tokyo.output_text


def test_an_unstored_response_keeps_one_id_and_names_nothing(server):
    final = assert_conforms_unstored(streamed(server, TRIP[0], store=False))
    with pytest.raises(openai.NotFoundError):
        server.client.responses.retrieve(final.id)


def assert_conforms_unstored(events: list[dict]) -> Response:
    for event in events:
        EVENT.validate_python(event)
    ids = {event["response"]["id"] for event in events if "response" in event}
    assert len(ids) == 1 and events[-1]["custom_outputs"]["response_id"] in ids
    assert events[-1]["custom_outputs"]["stored"] is False
    return Response.model_validate(events[-1]["response"])


def test_an_idempotent_retry_streams_the_first_response_again(server):
    headers = {"Idempotency-Key": "conformance-retry"}
    first = assert_conforms(streamed(server, TRIP[0], headers=headers))
    again = assert_conforms(streamed(server, TRIP[0], headers=headers))
    assert again.id == first.id and again.output_text == first.output_text and again.created_at == first.created_at


def test_an_action_streams_an_empty_response_with_its_results(server):
    thread_id = streamed(server, TRIP[0])[-1]["custom_outputs"]["thread_id"]
    events = streamed(server, **{"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id}})
    for event in events:
        EVENT.validate_python(event)
    assert [event["type"] for event in events] == ["response.created", "response.in_progress", "response.completed"]
    assert events[-1]["response"]["output"] == [] and len(events[-1]["custom_outputs"]["history"]) == 2


def test_a_merge_streams_like_a_turn_events_that_validate_and_the_clients_helper_consumes_it(server):
    first = streamed(server, TRIP[0])[-1]["custom_outputs"]
    sf = streamed(server, TRIP[1], previous_response_id=first["response_id"])[-1]["custom_outputs"]
    ny = streamed(server, "I'm headed to NY!", previous_response_id=first["response_id"])[-1]["custom_outputs"]
    merge = {"action": "merge_branch", "thread_id": first["thread_id"], "checkpoint_id": ny["checkpoint_id"],
             "source_checkpoint_id": sf["checkpoint_id"]}  # fmt: skip
    events = streamed(server, input=[], custom_inputs=merge)
    final = assert_conforms(events)
    assert [item.type for item in final.output] == ["message"] and final.output_text.startswith(SUMMARY_PREFIX)
    assert "SF" in final.output_text and sum(event["type"] == "response.output_text.delta" for event in events) >= 3
    assert events[-1]["custom_outputs"]["parent_checkpoint_id"] == ny["checkpoint_id"]
    # Recorded like a turn's stream: it can be resumed from the start, and retrieved whole.
    resumed = server.http.get(f"/responses/{final.id}", params={"stream": "true", "starting_after": "-1"})
    replay = [json.loads(line[6:]) for line in resumed.text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]
    assert [event["type"] for event in replay] == [event["type"] for event in events]
    assert Response.model_validate(server.http.get(f"/responses/{final.id}").json()).output_text == final.output_text
    # `/invocations` keeps MLflow's stream, as for a turn.
    again = {**merge, "checkpoint_id": events[-1]["custom_outputs"]["checkpoint_id"]}
    mlflow = streamed(server, input=[], custom_inputs=again, path="/invocations")
    assert {event["type"] for event in mlflow} == {"response.output_text.delta", "response.output_item.done", "response.completed"}
    assert [event["sequence_number"] for event in mlflow] == list(range(len(mlflow)))
    # The openai client's helper reads a merge as a turn.
    after = {**merge, "checkpoint_id": mlflow[-1]["custom_outputs"]["checkpoint_id"]}
    with server.client.responses.stream(model=MODEL, input=[], extra_body={"custom_inputs": after}) as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        response = stream.get_final_response()
    assert response.output_text == text and text.startswith(SUMMARY_PREFIX)
    assert response.id == f"resp_{server.http.post('/responses', json={'input': [], 'custom_inputs': {'action': 'get_head', 'thread_id': first['thread_id']}}).json()['custom_outputs']['checkpoint_id']}"


def test_an_unknown_previous_response_id_is_previous_response_not_found(server):
    unknown = "resp_" + "0" * 8 + "-0000-6000-8000-" + "0" * 12
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as raised:
            server.client.responses.create(model=MODEL, input="hi", previous_response_id=unknown, stream=stream)
        error = raised.value
        assert (error.code, error.param, error.type) == ("previous_response_not_found", "previous_response_id", "invalid_request_error")
        assert ErrorObject.model_validate(error.body).message == f"Previous response with id {unknown!r} not found."


def test_error_answers_on_every_openai_route_have_openais_body(server):
    answers = [
        server.http.get("/conversations/no-such-conversation"),
        server.http.post("/conversations", json={"items": "not a list"}),
        server.http.get("/responses/resp_nothing"),
        server.http.delete("/responses/resp_nothing/input_items"),  # a method the route does not have
        server.http.post("/responses", content=b"{not json", headers={"content-type": "application/json"}),
        server.http.post("/responses", json={"input": "hi", "temperature": 0.5}),
    ]
    assert [answer.status_code for answer in answers] == [404, 400, 404, 405, 400, 400]
    for answer in answers:
        body = answer.json()
        assert set(body) == {"error"}, body
        ErrorObject.model_validate(body["error"])
    assert [answer.json()["error"]["code"] for answer in answers] == [
        "not_found", "invalid_request", "not_found", "bad_request", "invalid_request", "invalid_request",
    ]  # fmt: skip
    with pytest.raises(openai.NotFoundError) as raised:
        server.client.conversations.retrieve("no-such-conversation")
    assert raised.value.code == "not_found"
    # The MLflow route keeps MLflow's body.
    assert set(server.http.post("/invocations", json={"input": "hi", "temperature": 0.5}).json()) == {"error_code", "message"}


def test_a_turn_that_fails_mid_stream_ends_with_an_error_event_that_validates(server):
    events = streamed(server, BREAK)
    for event in events:
        EVENT.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events[:2]] == ["response.created", "response.in_progress"]
    error = events[-1]
    assert error["type"] == "error" and error["code"] == "unavailable" and "upstream connection reset" in error["message"]
    with pytest.raises(openai.APIError, match="The chat model failed") as raised:
        list(server.client.responses.create(model=MODEL, input=BREAK, stream=True))
    assert raised.value.code == "unavailable"


def test_a_turn_that_stops_at_an_interrupt_streams_events_that_validate_and_names_the_waiting_checkpoint():
    # In process (`apredict_stream` with OpenAI's events, as `POST /responses` streams them): a graph of its own.
    async def events(agent, body):
        return [event.model_dump(exclude_none=True) async for event in agent.apredict_stream(body, openai_events=True)]

    with create_agent("memory://", graph=approval_graph(), tracing=False) as agent:
        asked = asyncio.run(events(agent, {"input": BOOK}))
        for event in asked:
            EVENT.validate_python(event)
        final, custom = Response.model_validate(asked[-1]["response"]), asked[-1]["custom_outputs"]
        # Its checkpoint keeps LangGraph's id (the interrupt's id derives from it): the final id is that one.
        assert final.id == f"resp_{custom['checkpoint_id']}" and final.output[-1].type == "mcp_approval_request"
        assert final.output[-1].id == custom["interrupts"][0]["id"]
        answered = asyncio.run(events(agent, {"input": [], "previous_response_id": final.id, "custom_inputs": {"resume": "yes"}}))
        assert_conforms(answered)
        assert "booked Tokyo" in Response.model_validate(answered[-1]["response"]).output_text
