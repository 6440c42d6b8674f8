"""Branch-safe tool calls, through the fake OpenAI server, on Postgres and SQLite.

A checkpoint can end in an assistant tool call with no result: written by
`update_checkpoint_state`, or by a turn that a branch later leaves behind.
OpenAI answers such a history with HTTP 400, and so does the fake server
(`tests/helpers/openai_stub.py`). The agent closes unanswered calls before the
model reads the history; `GET /_requests` shows what the model received.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from agent.messages import UNANSWERED_TOOL_CALL, close_unanswered_tool_calls
from agent.models import check_tool_calls_answered
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.scenario import outputs, request, say, text_of

DANGLING_CALL = {
    "type": "function_call",
    "call_id": "call_dangling",
    "name": "calculator",
    "arguments": json.dumps({"expression": "6 * 7"}),
}


@pytest.fixture(scope="module")
def openai_url():
    with openai_stub_server() as base_url:
        yield base_url


@pytest.fixture
def fake_agent(openai_url, backend_url, make_agent):
    _post(openai_url, "/_reset", {})
    return make_agent(backend_url, model=ChatOpenAI(base_url=openai_url, api_key="test", model="fake", max_retries=0))


def _post(base_url: str, path: str, body: dict) -> tuple[int, dict]:
    root = base_url.removesuffix("/v1")
    url = root + path if path.startswith("/_") else base_url + path
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def received(base_url: str) -> list[dict]:
    """Chat completions request bodies the fake server received, oldest first."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_requests", timeout=10) as response:
        return json.loads(response.read())


def answers_to(messages: list[dict], call_id: str) -> list[dict]:
    return [m for m in messages if m["role"] == "tool" and m.get("tool_call_id") == call_id]


def assert_dangling_call_was_closed(openai_url: str) -> dict:
    """The last request the model got answers the dangling call right after it; returns that body."""
    body = received(openai_url)[-1]
    messages = body["messages"]
    (call_index,) = [
        i for i, m in enumerate(messages) if any(c["id"] == "call_dangling" for c in m.get("tool_calls") or [])
    ]
    assert messages[call_index + 1]["role"] == "tool"
    assert messages[call_index + 1]["tool_call_id"] == "call_dangling"
    assert UNANSWERED_TOOL_CALL in json.dumps(messages[call_index + 1]["content"])
    return body


def test_a_tool_turn_runs_the_calculator_end_to_end(fake_agent, openai_url):
    response = fake_agent.predict(request("calculate 2*(3+4)"))
    items = [item if isinstance(item, dict) else item.model_dump() for item in response.output]
    kinds = [item["type"] for item in items]
    assert kinds == ["function_call", "function_call_output", "message"]
    assert items[0]["name"] == "calculator"
    assert items[1]["output"] == "14"
    assert "The calculator says: 14." in text_of(response)
    first, second = received(openai_url)
    assert "calculator" in {tool["function"]["name"] for tool in first["tools"]}
    assert answers_to(second["messages"], items[0]["call_id"])[0]["content"] == "14"


@pytest.mark.parametrize("stream", [False, True], ids=["predict", "predict_stream"])
def test_a_turn_after_update_state_with_a_dangling_tool_call_gives_the_model_a_valid_history(
    fake_agent, openai_url, stream
):
    thread_id = outputs(say(fake_agent, "I'm headed to SF!"))["thread_id"]
    updated = fake_agent.update_checkpoint_state(thread_id, None, [DANGLING_CALL])
    assert fake_agent.get_checkpoint_history(thread_id)[0]["next_nodes"] == ["tools"]

    body = request("Where am I going?", thread_id=thread_id)
    if stream:
        events = list(fake_agent.predict_stream(body))
        assert events[-1].custom_outputs["parent_checkpoint_id"] == updated["checkpoint_id"]
    else:
        assert outputs(fake_agent.predict(body))["parent_checkpoint_id"] == updated["checkpoint_id"]
    assert_dangling_call_was_closed(openai_url)


def test_branching_at_a_checkpoint_with_a_dangling_tool_call_gives_the_model_a_valid_history(fake_agent, openai_url):
    thread_id = outputs(say(fake_agent, "I'm headed to SF!"))["thread_id"]
    dangling = fake_agent.update_checkpoint_state(thread_id, None, [DANGLING_CALL])["checkpoint_id"]
    # Another update moves the head on, so the dangling checkpoint is only reachable as a branch.
    fake_agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "never mind"}])

    branched = outputs(say(fake_agent, "What did I ask?", thread_id=thread_id, checkpoint_id=dangling))
    assert branched["parent_checkpoint_id"] == dangling
    assert_dangling_call_was_closed(openai_url)


def test_the_update_state_action_with_a_dangling_tool_call_then_a_turn_gives_a_valid_history(fake_agent, openai_url):
    thread_id = outputs(say(fake_agent, "I'm headed to SF!"))["thread_id"]
    fake_agent.predict(
        {"input": [DANGLING_CALL], "custom_inputs": {"action": "update_checkpoint_state", "thread_id": thread_id}}
    )
    say(fake_agent, "Where am I going?", thread_id=thread_id)
    assert_dangling_call_was_closed(openai_url)


def test_the_fake_server_rejects_the_unrepaired_history(fake_agent, openai_url):
    """Negative control: without the repair the same request gets HTTP 400, so the tests above have teeth."""
    thread_id = outputs(say(fake_agent, "I'm headed to SF!"))["thread_id"]
    fake_agent.update_checkpoint_state(thread_id, None, [DANGLING_CALL])
    say(fake_agent, "Where am I going?", thread_id=thread_id)
    body = assert_dangling_call_was_closed(openai_url)

    status, _ = _post(openai_url, "/chat/completions", {**body, "stream": False})
    assert status == 200
    unrepaired = [m for m in body["messages"] if m.get("tool_call_id") != "call_dangling"]
    status, error = _post(openai_url, "/chat/completions", {**body, "messages": unrepaired, "stream": False})
    assert status == 400
    assert "call_dangling" in error["error"]["message"]


def test_a_stored_tool_result_that_answers_no_call_is_not_sent_to_the_model(fake_agent, openai_url):
    thread_id = outputs(say(fake_agent, "I'm headed to SF!"))["thread_id"]
    stray = {"type": "function_call_output", "call_id": "call_nobody_made", "output": "42"}
    fake_agent.update_checkpoint_state(thread_id, None, [stray])

    assert "SF" in text_of(say(fake_agent, "Where am I going?", thread_id=thread_id))
    assert not answers_to(received(openai_url)[-1]["messages"], "call_nobody_made")


def test_a_completed_tool_step_is_sent_unchanged(fake_agent, openai_url):
    thread_id = outputs(fake_agent.predict(request("calculate 6*7")))["thread_id"]
    say(fake_agent, "thanks", thread_id=thread_id)
    messages = received(openai_url)[-1]["messages"]
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["42"]


CALL_IDS = st.sampled_from(["c1", "c2", "c3"])
MESSAGES = st.one_of(
    st.builds(lambda: HumanMessage("hi")),
    st.builds(lambda: AIMessage("ok")),
    st.lists(CALL_IDS, min_size=1, max_size=2, unique=True).map(
        lambda ids: AIMessage("", tool_calls=[{"name": "calculator", "args": {}, "id": i} for i in ids])
    ),
    CALL_IDS.map(lambda i: ToolMessage("1", tool_call_id=i)),
)


@given(st.lists(MESSAGES, max_size=12))
def test_any_history_is_repaired_into_one_a_chat_api_accepts(messages):
    repaired = close_unanswered_tool_calls(messages)
    check_tool_calls_answered(repaired)  # raises on what OpenAI would answer with 400
    # Only tool messages are added or left out; everything else stays, in order.
    assert [m for m in repaired if not isinstance(m, ToolMessage)] == [
        m for m in messages if not isinstance(m, ToolMessage)
    ]
    assert close_unanswered_tool_calls(repaired) == repaired


# --- Tool results paired by call_id, as the Responses API pairs them ---------------------------


def call(call_id: str, expression: str, **extra) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "calculator",
            "arguments": json.dumps({"expression": expression}), **extra}


def result(call_id: str, output: str, **extra) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output, **extra}


def as_sent(item) -> tuple:
    """What an item says, whatever its form (an input dict, an output or a state item): type, role,
    text, call_id, name, arguments, output."""
    item = item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else item
    kind = item.get("type", "message")
    content = item.get("content")
    text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or ())
    if kind == "message":
        return (kind, item["role"], text)
    if kind == "function_call":
        return (kind, item["call_id"], item["name"], item["arguments"])
    return (kind, item["call_id"], item["output"])


def stored(agent, thread_id: str) -> list[tuple]:
    """The head's messages as `get_checkpoint_state` shows them (and `conversations.items.list` lists them)."""
    return [as_sent(item) for item in agent.get_checkpoint_state(thread_id)["messages"]]


def model_messages(base_url: str) -> list[dict]:
    """The messages of the last chat completions request, as the model received them."""
    return received(base_url)[-1]["messages"]


def calls_in(messages: list[dict]) -> list[list[str]]:
    """The call ids of each assistant message that calls tools, in order."""
    return [[c["id"] for c in m["tool_calls"]] for m in messages if m["role"] == "assistant" and m.get("tool_calls")]


def test_outputs_in_reverse_order_reach_the_model_as_the_results_of_their_calls(fake_agent, openai_url):
    sent = [{"role": "user", "content": "add both"}, call("c1", "1+1"), call("c2", "2+2"), result("c2", "4"), result("c1", "2")]
    response = fake_agent.predict({"input": sent})

    messages = model_messages(openai_url)
    # One assistant message with both calls, then both results, as the model had sent them itself.
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert calls_in(messages) == [["c1", "c2"]]
    assert [(m["tool_call_id"], m["content"]) for m in messages[2:]] == [("c2", "4"), ("c1", "2")]
    assert UNANSWERED_TOOL_CALL not in json.dumps(messages)
    assert "The calculator says: 4. The calculator says: 2." in text_of(response)
    # Stored as sent: no "tool call" message, nothing left out.
    assert stored(fake_agent, outputs(response)["thread_id"])[:-1] == [as_sent(item) for item in sent]


def test_an_output_after_an_intervening_message_reaches_the_model_as_its_calls_result(fake_agent, openai_url):
    sent = [{"role": "user", "content": "add"}, call("c1", "1+1"), {"role": "user", "content": "and then?"}, result("c1", "2")]
    response = fake_agent.predict({"input": sent})

    messages = model_messages(openai_url)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert (messages[2]["tool_call_id"], messages[2]["content"]) == ("c1", "2")
    assert UNANSWERED_TOOL_CALL not in json.dumps(messages)
    # Stored with the result in its call's place: what the history shows is what the model read.
    assert stored(fake_agent, outputs(response)["thread_id"])[:-1] == [as_sent(sent[i]) for i in (0, 1, 3, 2)]


def test_a_call_with_no_output_anywhere_is_still_closed_as_not_run_while_its_sibling_gets_its_result(
    fake_agent, openai_url
):
    fake_agent.predict({"input": [{"role": "user", "content": "add"}, call("c1", "1+1"), call("c2", "2+2"), result("c1", "2")]})

    messages = model_messages(openai_url)
    assert calls_in(messages) == [["c1", "c2"]]
    assert answers_to(messages, "c1")[0]["content"] == "2"
    assert UNANSWERED_TOOL_CALL in json.dumps(answers_to(messages, "c2")[0]["content"])


def test_an_output_in_the_input_answers_the_call_the_thread_left_open_even_after_a_message(fake_agent, openai_url):
    thread_id = outputs(say(fake_agent, "I'm headed to SF!"))["thread_id"]
    fake_agent.update_checkpoint_state(thread_id, None, [DANGLING_CALL])

    say_first = {"input": [{"role": "user", "content": "here is the result"}, result("call_dangling", "42")],
                 "custom_inputs": {"thread_id": thread_id}}
    fake_agent.predict(say_first)

    messages = model_messages(openai_url)
    (call_index,) = [i for i, ids in enumerate(m.get("tool_calls") or [] for m in messages) if ids]
    assert messages[call_index + 1] == {"role": "tool", "tool_call_id": "call_dangling", "content": "42"}
    assert messages[call_index + 2]["content"] == "here is the result"
    assert UNANSWERED_TOOL_CALL not in json.dumps(messages)


def test_replaying_the_servers_own_output_items_stores_them_exactly_as_sent(fake_agent, openai_url):
    """The OpenAI Agents SDK's sessions send the previous response's output items back as the next input."""
    first = fake_agent.predict(request("calculate 6*7"))
    replay = [{"role": "user", "content": "calculate 6*7"}, *[item.model_dump(exclude_none=True) for item in first.output]]
    assert [as_sent(item)[0] for item in replay] == ["message", "function_call", "function_call_output", "message"]

    # The same conversation continued on the server, and replayed by the client into a new thread.
    say(fake_agent, "thanks", thread_id=outputs(first)["thread_id"])
    continued = model_messages(openai_url)
    replayed = fake_agent.predict({"input": [*replay, {"role": "user", "content": "thanks"}]})

    # No "tool call" message nobody wrote: the new thread holds the items as sent, then the answer.
    thread_id = outputs(replayed)["thread_id"]
    assert stored(fake_agent, thread_id)[:-1] == [as_sent(item) for item in [*replay, {"role": "user", "content": "thanks"}]]
    assert all(item[2] != "tool call" for item in stored(fake_agent, thread_id) if item[0] == "message")
    # And the model reads what it read when the server kept the conversation itself.
    assert model_messages(openai_url) == continued


def test_replayed_assistant_text_with_its_tool_call_is_one_message_again(fake_agent, openai_url):
    sent = [
        {"role": "user", "content": "what is 1+1?"},
        {"type": "message", "role": "assistant", "id": "msg_1",
         "content": [{"type": "output_text", "text": "Let me add that.", "annotations": []}]},
        call("call_1", "1+1", id="call_1"),
        result("call_1", "2"),
        {"type": "message", "role": "assistant", "id": "msg_2", "content": [{"type": "output_text", "text": "It is 2."}]},
        {"role": "user", "content": "thanks"},
    ]
    response = fake_agent.predict({"input": sent})

    messages = model_messages(openai_url)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[1]["content"] == "Let me add that."
    assert calls_in(messages) == [["call_1"]]
    state = fake_agent.get_checkpoint_state(outputs(response)["thread_id"])["messages"]
    assert [as_sent(item) for item in state][:-1] == [as_sent(item) for item in sent]
    assert [item["id"] for item in state[1:3]] == ["msg_1", "call_1"]


@pytest.mark.parametrize(
    "case",
    ["no call anywhere", "the call is answered already", "a second output for a call in the input"],
)
def test_an_output_that_answers_no_waiting_call_is_refused_and_nothing_is_written(fake_agent, backend_url, case):
    from agent.errors import InvalidRequest
    from tests.helpers.reliability import all_rows

    first = fake_agent.predict(request("calculate 6*7"))
    thread_id = outputs(first)["thread_id"]
    answered = next(item.call_id for item in first.output if item.type == "function_call")
    items = {
        "no call anywhere": [{"role": "user", "content": "hi"}, result("call_nobody_made", "42")],
        "the call is answered already": [result(answered, "42")],
        "a second output for a call in the input": [call("c1", "1+1"), result("c1", "2"), result("c1", "3")],
    }[case]
    for custom in ({"thread_id": thread_id}, {}):  # an existing thread, and a new one
        rows = all_rows(backend_url)
        with pytest.raises(InvalidRequest) as refused:
            fake_agent.predict({"input": items, "custom_inputs": custom})
        assert repr(items[-1]["call_id"]) in refused.value.message
        assert "Nothing was written" in refused.value.message
        assert all_rows(backend_url) == rows
