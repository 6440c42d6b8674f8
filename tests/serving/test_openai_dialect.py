"""The OpenAI dialect on `tt-agent serve`, with the official `openai` client and no `extra_body`:
`previous_response_id`, `conversation`, `instructions`, `store`, refused fields, stored responses,
the Conversations API, and ownership through the trusted `user_id_header`.

One server process per module on a fresh Postgres database of its own (so rows can be counted),
with the offline model and `AGENT_USER_ID_HEADER=X-Forwarded-User`; the tests read the same
database with an agent of their own to check what was stored.
"""

from __future__ import annotations

import re
import sys
import uuid
from types import SimpleNamespace

import httpx
import openai
import psycopg
import pytest

from agent.dialect import REFUSED_BECAUSE
from tests.helpers.databases import fresh_database
from tests.helpers.scenario import TRIP
from tests.helpers.servers import free_port, server_process

pytestmark = pytest.mark.slow

HEADER = "X-Forwarded-User"
MODEL = "timetravel-agent"


@pytest.fixture(scope="module")
def server(tmp_path_factory, pg_server_url):
    cwd = tmp_path_factory.mktemp("openai_dialect")
    with fresh_database(pg_server_url) as url:
        port = free_port()
        env = {
            "AGENT_DATABASE_URL": url,
            "AGENT_MODEL": "offline",
            "AGENT_TRACING": "false",
            "AGENT_USER_ID_HEADER": HEADER,
        }
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
        with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
            clients = {
                user: openai.OpenAI(
                    base_url=base_url, api_key="unused", max_retries=0, default_headers={HEADER: user} if user else None
                )
                for user in ("alice", "bob", None)
            }
            with httpx.Client(base_url=base_url, timeout=60) as http:
                yield SimpleNamespace(base_url=base_url, url=url, http=http, alice=clients["alice"], bob=clients["bob"],
                                      anonymous=clients[None])  # fmt: skip
            for client in clients.values():
                client.close()


@pytest.fixture
def local(server, make_agent):
    """An agent on the server's database, to check what the server stored."""
    return make_agent(server.url)


def respond(client: openai.OpenAI, text: str, *, stream: bool = False, **fields):
    """One turn; returns (response id, reply text, custom_outputs), from the final event when streamed."""
    if not stream:
        response = client.responses.create(model=MODEL, input=text, **fields)
        return response.id, response.output_text, response.custom_outputs
    events = list(client.responses.create(model=MODEL, input=text, stream=True, **fields))
    final = events[-1]
    assert final.type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    return final.response.id, deltas, final.custom_outputs


def row_counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "agent_threads", "agent_claims")
        }


def received_messages(reply: str) -> int:
    """How many messages the offline model says it was sent."""
    return int(re.search(r"received (\d+) messages?", reply).group(1))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_trip_with_previous_response_id_then_conversation(server, local, stream):
    client = server.alice
    first, _, outputs = respond(client, TRIP[0], stream=stream)
    assert first == f"resp_{outputs['checkpoint_id']}" == outputs["response_id"]
    second, _, _ = respond(client, TRIP[1], stream=stream, previous_response_id=first)
    third, answer, third_outputs = respond(client, TRIP[2], stream=stream, previous_response_id=second)
    assert "SF" in answer and TRIP[0] in answer
    thread_id = third_outputs["thread_id"]
    assert third_outputs["parent_checkpoint_id"] == second.removeprefix("resp_")

    # The conversation is the thread: its head is the third turn, and the next turn continues there.
    _, again, outputs = respond(client, "Where am I going?", stream=stream, conversation=thread_id)
    assert "SF" in again and outputs["parent_checkpoint_id"] == third.removeprefix("resp_")
    _, _, outputs = respond(client, "And when?", stream=stream, conversation={"id": thread_id})
    assert outputs["thread_id"] == thread_id
    assert local.get_checkpoint_history(thread_id, limit=1, user_id="alice")[0]["checkpoint_id"] == outputs["checkpoint_id"]

    # The client's stream helper gives the final response with its custom_outputs, as retrieve does.
    with client.responses.stream(model=MODEL, input="And how?", conversation=thread_id) as events:
        final = events.get_final_response()
    assert final.custom_outputs["thread_id"] == thread_id and final.id == final.custom_outputs["response_id"]

    # A stored response reads back with the same output and its place in the chain.
    stored = client.responses.retrieve(third)
    assert stored.id == third and stored.output_text == answer and stored.previous_response_id == second
    items = client.responses.input_items.list(third, order="asc")
    assert [item.content[0].text for item in items.data if item.role == "user"] == list(TRIP)


def test_a_conversation_created_with_the_client_carries_the_trip(server):
    client = server.alice
    conversation = client.conversations.create(items=[{"role": "user", "content": TRIP[0]}])
    for text in TRIP[1:]:
        _, answer, outputs = respond(client, text, conversation=conversation.id)
    assert outputs["thread_id"] == conversation.id
    assert "SF" in answer and TRIP[0] in answer
    assert client.conversations.retrieve(conversation.id).id == conversation.id


def test_two_requests_from_one_previous_response_are_sibling_branches(server, local):
    client = server.alice
    first, _, outputs = respond(client, TRIP[0])
    _, sf, a = respond(client, "I'm headed to SF!", previous_response_id=first)
    _, tokyo, b = respond(client, "I'm headed to Tokyo!", previous_response_id=first)
    assert a["parent_checkpoint_id"] == b["parent_checkpoint_id"] == outputs["checkpoint_id"]
    branches = local.list_branches(outputs["thread_id"], user_id="alice")
    assert {branch["checkpoint_id"] for branch in branches} == {a["checkpoint_id"], b["checkpoint_id"]}
    assert {branch["fork_checkpoint_id"] for branch in branches} == {outputs["checkpoint_id"]}
    # Each branch remembers only its own message.
    _, answer, _ = respond(client, "Where am I going?", previous_response_id=f"resp_{b['checkpoint_id']}")
    assert "Tokyo" in answer and "SF" not in answer


def test_another_users_response_and_conversation_are_not_found(server, local):
    response_id, _, outputs = respond(server.alice, TRIP[0])
    thread_id = outputs["thread_id"]
    for client in (server.bob, server.anonymous):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response_id)
        with pytest.raises(openai.NotFoundError):
            client.responses.input_items.list(response_id)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=MODEL, input="mine now", previous_response_id=response_id)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=MODEL, input="mine now", conversation=thread_id)
        with pytest.raises(openai.NotFoundError):
            client.conversations.retrieve(thread_id)
        with pytest.raises(openai.NotFoundError):
            client.conversations.items.list(thread_id)
        with pytest.raises(openai.NotFoundError):
            client.conversations.items.create(thread_id, items=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError):
            client.conversations.delete(thread_id)
    # Unknown ids answer the same.
    with pytest.raises(openai.NotFoundError):
        server.alice.responses.retrieve("resp_" + "0" * 36)
    with pytest.raises(openai.NotFoundError):
        server.alice.conversations.retrieve("no-such-conversation")
    # Nothing of bob's attempts reached alice's thread.
    assert [e["checkpoint_id"] for e in local.get_checkpoint_history(thread_id, user_id="alice", limit=1)] == [outputs["checkpoint_id"]]


def test_the_trusted_header_is_the_only_source_of_the_user(server):
    # A body may not speak for another user than the header's ...
    response = server.http.post(
        "/responses",
        headers={HEADER: "alice"},
        json={"input": "hi", "custom_inputs": {"user_id": "bob"}},
    )
    assert response.status_code == 400 and "disagree" in response.json()["error"]["message"]
    # ... nor name a user when the header is absent.
    response = server.http.post("/responses", json={"input": "hi", "context": {"user_id": "alice"}})
    assert response.status_code == 400 and "trusted header" in response.json()["error"]["message"]


REFUSED = [
    ("temperature", {"temperature": 0.2}),
    ("top_p", {"top_p": 0.5}),
    ("max_output_tokens", {"max_output_tokens": 50}),
    ("reasoning", {"reasoning": {"effort": "low"}}),
    ("tools", {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]}),
    ("tool_choice", {"tool_choice": "required"}),
    ("background", {"extra_body": {"background": "yes"}}),  # honoured (agent.runs), but only true or false
    ("background", {"background": True, "store": False}),  # a background response is fetched later: stored
    ("prompt", {"prompt": {"id": "pmpt_1"}}),
    ("truncation", {"truncation": "disabled"}),
    ("text", {"text": {"format": {"type": "json_object"}}}),
    ("include", {"include": ["message.output_text.logprobs"]}),
    ("service_tier", {"service_tier": "flex"}),
    ("previous_response_id", {"previous_response_id": "resp_x", "conversation": "some-thread"}),
    ("previous_response_id", {"previous_response_id": "not-a-response-id"}),
    ("mystery_field", {"extra_body": {"mystery_field": 1}}),
    ("store", {"extra_body": {"store": "no"}}),  # pydantic would read "no" as false: nothing written, silently
    ("store", {"extra_body": {"store": 1}}),
]


@pytest.mark.parametrize(("field", "fields"), REFUSED, ids=[f"{f}-{i}" for i, (f, _) in enumerate(REFUSED)])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_every_field_the_agent_cannot_honour_is_a_400_naming_it(server, field, fields, stream):
    before = row_counts(server.url)
    with pytest.raises(openai.BadRequestError) as raised:
        server.alice.responses.create(model=MODEL, input="hi", stream=stream, **fields)
    assert field in str(raised.value)
    if field in REFUSED_BECAUSE or field == "mystery_field":  # a field the agent does not take: named as `param`
        assert raised.value.param == field
    assert row_counts(server.url) == before


def test_harmless_fields_the_client_sends_are_accepted(server):
    response = server.alice.responses.create(
        model=MODEL, input="hi", user="end-user-7", truncation="auto", tool_choice="auto", parallel_tool_calls=True,
        store=True, background=False, metadata={"app": "test"},
    )  # fmt: skip
    assert response.id.startswith("resp_")


def test_instructions_reach_the_model_for_one_turn_and_are_not_stored(server, local):
    client = server.alice
    first, plain, outputs = respond(client, TRIP[0])
    _, instructed, instructed_outputs = respond(
        client, TRIP[1], previous_response_id=first, instructions="Answer like a pirate."
    )
    _, after, _ = respond(client, TRIP[2], previous_response_id=instructed_outputs["response_id"])
    # The instructed call got one message more (its system message); the next one did not keep it.
    assert received_messages(instructed) == received_messages(plain) + 3
    assert received_messages(after) == received_messages(instructed) + 2 - 1
    state = local.get_checkpoint_state(outputs["thread_id"], user_id="alice")
    assert "pirate" not in str(state["messages"])
    assert [m["role"] for m in state["messages"] if m["type"] == "message"] == ["user", "assistant"] * 3


def test_store_false_runs_from_the_requested_state_and_writes_nothing(server, local):
    client = server.alice
    first, _, outputs = respond(client, TRIP[0])
    second, _, _ = respond(client, TRIP[1], previous_response_id=first)
    before = row_counts(server.url)
    for stream in (False, True):
        unstored, answer, custom = respond(client, TRIP[2], stream=stream, previous_response_id=second, store=False)
        assert "SF" in answer  # it ran from the requested checkpoint
        assert custom["checkpoint_id"] is None and custom["stored"] is False
        # The id names nothing, as OpenAI's unstored responses.
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(unstored)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=MODEL, input="more", previous_response_id=unstored)
    unstored, _, custom = respond(client, "A new conversation?", store=False)
    assert custom["thread_id"] is None
    assert row_counts(server.url) == before
    assert local.get_checkpoint_history(outputs["thread_id"], user_id="alice", limit=1)[0]["checkpoint_id"] == second.removeprefix("resp_")


def test_conversation_items_list_pages_the_heads_messages(server, local):
    client = server.alice
    conversation = client.conversations.create(
        items=[{"role": "user", "content": f"message {i}"} for i in range(3)], metadata={"topic": "paging"}
    )
    assert conversation.metadata == {"topic": "paging"}
    respond(client, TRIP[1], conversation=conversation.id)
    head = local.get_checkpoint_state(conversation.id, user_id="alice")["messages"]
    head_ids = [item["id"] for item in head]
    assert len(head_ids) == 5

    first_page = client.conversations.items.list(conversation.id, limit=2, order="asc")
    assert [item.id for item in first_page.data] == head_ids[:2] and first_page.has_more is True
    # The client follows `last_id` until `has_more` is false: every message once, in order.
    assert [item.id for item in client.conversations.items.list(conversation.id, limit=2, order="asc")] == head_ids
    assert [item.id for item in client.conversations.items.list(conversation.id, limit=3)] == head_ids[::-1]

    added = client.conversations.items.create(conversation.id, items=[{"role": "user", "content": "one more"}])
    assert [item.content[0].text for item in added.data] == ["one more"]
    assert client.conversations.items.list(conversation.id, limit=1).data[0].id == added.data[0].id
    # The addition is a new checkpoint on the head; the next turn sees it.
    _, answer, _ = respond(client, "What did I add?", conversation=conversation.id)
    assert "one more" in answer

    updated = client.conversations.update(conversation.id, metadata={"topic": "renamed"})
    assert updated.metadata == {"topic": "renamed"} == client.conversations.retrieve(conversation.id).metadata
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_metadata_of_a_response_is_stored_with_the_thread_it_creates(server):
    _, _, outputs = respond(server.alice, TRIP[0], metadata={"source": "openai-client"})
    assert server.alice.conversations.retrieve(outputs["thread_id"]).metadata == {"source": "openai-client"}


def test_string_input_is_one_user_message_on_invocations_too(server):
    response = server.http.post("/invocations", headers={HEADER: "alice"}, json={"input": "Hi there"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == body["custom_outputs"]["response_id"]
    assert '"Hi there"' in body["output"][-1]["content"][0]["text"]


def test_replayed_output_items_are_listed_as_sent_with_no_invented_message(server):
    """The OpenAI Agents SDK's sessions send the previous response's output items back as the next input."""
    client = server.alice
    first = client.responses.create(model=MODEL, input="calculate 6*7")
    replay = [{"role": "user", "content": "calculate 6*7"}, *[item.model_dump(exclude_none=True) for item in first.output],
              {"role": "user", "content": "thanks"}]  # fmt: skip
    assert [item.get("type") for item in replay[1:-1]] == ["function_call", "function_call_output", "message"]

    replayed = client.responses.create(model=MODEL, input=replay)
    listed = client.conversations.items.list(replayed.custom_outputs["thread_id"], order="asc").data

    def said(item):
        item = item if isinstance(item, dict) else item.model_dump(exclude_none=True)
        content = item.get("content")
        text = content if isinstance(content, str) else "".join(part["text"] for part in content or ())
        return item.get("type", "message"), item.get("call_id"), item.get("output"), text

    assert [said(item) for item in listed[:-1]] == [said(item) for item in replay]
    assert not any(item.type == "message" and item.content[0].text == "tool call" for item in listed)


def test_an_output_for_a_call_nobody_made_is_a_400_naming_the_call(server):
    before = row_counts(server.url)
    with pytest.raises(openai.BadRequestError) as refused:
        server.alice.responses.create(
            model=MODEL, input=[{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "call_nobody_made", "output": "42"}]
        )
    assert "call_nobody_made" in str(refused.value)
    assert row_counts(server.url) == before


def test_conversation_item_writes_refuse_an_output_for_a_call_nobody_made_naming_it_and_write_nothing(server):
    # Found by a new user: items.create stored it (a result the model would never see); a turn refuses it.
    client = server.alice
    conversation = client.conversations.create(items=[{"role": "user", "content": "hi"}])
    orphan = {"type": "function_call_output", "call_id": "call_nobody_made", "output": "42"}
    before = row_counts(server.url)
    with pytest.raises(openai.BadRequestError, match="call_id 'call_nobody_made' answers no tool call"):
        client.conversations.items.create(conversation.id, items=[orphan])
    with pytest.raises(openai.BadRequestError, match="call_id 'call_nobody_made' answers no tool call"):
        client.conversations.create(items=[{"role": "user", "content": "hi"}, orphan])
    assert row_counts(server.url) == before
    # With its call, the same output is added.
    call = {"type": "function_call", "call_id": "call_nobody_made", "name": "calculator", "arguments": '{"expression": "6*7"}'}
    added = client.conversations.items.create(conversation.id, items=[call, orphan])
    assert [item.type for item in added.data] == ["function_call", "function_call_output"]


def test_conversation_routes_refuse_a_body_over_max_request_bytes_and_write_nothing(server):
    # Found by a new user: these routes stored a 5.9 MB item that a turn or an action refuses.
    client = server.alice
    big = [{"role": "user", "content": "y" * 1_100_000}]  # over the default max_request_bytes (1,000,000)
    before = row_counts(server.url)
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.create(items=big)
    assert "the limit is 1000000 bytes" in refused.value.message
    conversation = client.conversations.create(items=[{"role": "user", "content": "small"}])
    with pytest.raises(openai.BadRequestError, match="the limit is 1000000 bytes"):
        client.conversations.items.create(conversation.id, items=big)
    assert [item.content[0].text for item in client.conversations.items.list(conversation.id)] == ["small"]
    after = row_counts(server.url)
    assert after["agent_threads"] == before["agent_threads"] + 1  # the small conversation only


def test_a_conversation_whose_id_holds_a_slash_is_reachable_on_every_conversation_route(server):
    # Found by a new user: the client sends `team%2F...`, the path arrives decoded, and every route answered 404.
    client = server.alice
    thread_id = f"team/{uuid.uuid4().hex[:8]}"
    client.responses.create(model=MODEL, input="Hi", extra_body={"custom_inputs": {"thread_id": thread_id}})

    assert client.conversations.retrieve(thread_id).id == thread_id
    assert client.conversations.update(thread_id, metadata={"team": "yes"}).metadata == {"team": "yes"}
    added = client.conversations.items.create(thread_id, items=[{"role": "user", "content": "Later"}])
    listed = client.conversations.items.list(thread_id, order="asc").data
    assert [item.id for item in listed][-1] == added.data[-1].id
    # Unencoded, the same conversation.
    assert server.http.get(f"/conversations/{thread_id}", headers={HEADER: "alice"}).json()["id"] == thread_id
    assert client.conversations.delete(thread_id).deleted
    with pytest.raises(openai.NotFoundError, match=re.escape(thread_id)):
        client.conversations.retrieve(thread_id)


def test_conversation_items_retrieve_and_delete_name_an_unknown_item_and_its_conversation(server, local):
    # Found by a new user: both answered a bare 404 "Not Found" (the routes did not exist).
    client = server.alice
    conversation = client.conversations.create(items=[{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    first, second = client.conversations.items.list(conversation.id, order="asc").data
    assert client.conversations.items.retrieve(first.id, conversation_id=conversation.id).content[0].text == "one"

    before = row_counts(server.url)
    for call in (client.conversations.items.retrieve, client.conversations.items.delete):
        with pytest.raises(openai.NotFoundError) as unknown:
            call("msg_nobody_wrote", conversation_id=conversation.id)
        assert "msg_nobody_wrote" in unknown.value.message and conversation.id in unknown.value.message
    assert row_counts(server.url) == before

    assert client.conversations.items.delete(first.id, conversation_id=conversation.id).id == conversation.id
    assert [item.id for item in client.conversations.items.list(conversation.id).data] == [second.id]
    # Another user's conversation answers as an unknown one, whatever the item.
    with pytest.raises(openai.NotFoundError, match=re.escape(f"Thread {conversation.id!r} was not found")):
        server.bob.conversations.items.retrieve(second.id, conversation_id=conversation.id)
