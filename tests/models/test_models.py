"""agent.models: the offline model shows memory and the tool path; the factory picks the model;
ChatOpenAI really talks to the fake OpenAI server (tests.helpers.openai_stub)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI

from agent.config import DEFAULT_OPENAI_MODEL
from agent.errors import ConfigurationError
from agent.models import OfflineChatModel, make_chat_model
from agent.tools import TOOLS, calculator
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.offline import offline_reply

TRIP = [
    HumanMessage("I'm planning for an upcoming trip!"),
    AIMessage("Nice."),
    HumanMessage("I'm headed to SF!"),
    AIMessage("Great."),
    HumanMessage("Where should I eat?"),
]
TRIP_QUOTE = (
    'You said, in order: 1. "I\'m planning for an upcoming trip!" 2. "I\'m headed to SF!" 3. "Where should I eat?"'
)


def dangling_tool_call_history() -> list:
    """A tool call followed by a user message instead of its result."""
    call = {"name": "calculator", "args": {"expression": "1+1"}, "id": "call_dangling", "type": "tool_call"}
    return [HumanMessage("calculate 1+1"), AIMessage(content="", tool_calls=[call]), HumanMessage("never mind")]


def join_stream(model, messages):
    """The streamed chunks of `model` for `messages`, and their sum."""
    chunks = list(model.stream(messages))
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return chunks, total


# --- OfflineChatModel -----------------------------------------------------------------------


def test_offline_reply_says_it_is_offline_and_quotes_user_messages_in_order():
    messages = [SystemMessage("Be brief."), *TRIP]
    reply = OfflineChatModel().invoke(messages)
    assert reply.content == offline_reply(messages, tools=())
    assert reply.content.startswith("[offline model] " + TRIP_QUOTE + " [received 6 messages, ")


def test_offline_reply_cuts_each_user_message_to_80_characters():
    long = "a" * 79 + "bc"
    reply = OfflineChatModel().invoke([HumanMessage(long)])
    assert f'1. "{"a" * 79}b"' in reply.content
    assert "bc" not in reply.content


def test_offline_reply_keeps_only_the_last_10_user_messages():
    messages = [HumanMessage(f"message {n:02d}") for n in range(1, 13)]
    reply = OfflineChatModel().invoke(messages).content
    assert "message 01" not in reply and "message 02" not in reply
    assert '1. "message 03"' in reply and '10. "message 12"' in reply
    assert reply.index("message 03") < reply.index("message 07") < reply.index("message 12")


def test_offline_reply_reads_text_content_blocks():
    blocks = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    assert '1. "Hello there" [received 1 message' in OfflineChatModel().invoke([HumanMessage(content=blocks)]).content


def test_offline_stream_yields_several_chunks_that_join_to_the_invoke_text():
    model = OfflineChatModel()
    chunks, total = join_stream(model, TRIP)
    assert len([c for c in chunks if c.content]) >= 5
    assert total.content == model.invoke(TRIP).content


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=120), max_size=14))
def test_offline_stream_and_invoke_agree_for_any_user_messages(texts):
    model = OfflineChatModel()
    messages = [HumanMessage(t) for t in texts]
    invoked = model.invoke(messages).content
    _, total = join_stream(model, messages)
    assert total.content == invoked
    assert invoked.startswith("[offline model] ")


def test_offline_async_calls_match_sync_calls():
    model = OfflineChatModel()

    async def run():
        streamed = "".join([c.content async for c in model.astream(TRIP)])
        return (await model.ainvoke(TRIP)).content, streamed

    assert asyncio.run(run()) == (model.invoke(TRIP).content,) * 2


def test_offline_latency_ms_delays_each_call():
    started = time.monotonic()
    OfflineChatModel(latency_ms=100).invoke("hi")
    assert time.monotonic() - started >= 0.1


def test_offline_ai_messages_get_langchain_ids_and_deterministic_content():
    first, second = OfflineChatModel().invoke(TRIP), OfflineChatModel().invoke(TRIP)
    assert first.content == second.content
    assert first.id and second.id and first.id != second.id


def test_bind_tools_returns_a_copy_that_knows_the_tool_names():
    model = OfflineChatModel(latency_ms=5)
    bound = model.bind_tools(TOOLS, tool_choice="auto")
    assert bound.tool_names == ("calculator", "clock")
    assert bound.latency_ms == 5
    assert model.tool_names == ()


def test_offline_calls_the_calculator_when_asked_and_bound():
    model = OfflineChatModel().bind_tools(TOOLS)
    reply = model.invoke([HumanMessage("Calculate (2 + 3) * 4")])
    assert reply.content == ""
    [call] = reply.tool_calls
    assert call["name"] == "calculator" and call["args"] == {"expression": "(2 + 3) * 4"}
    assert call["id"].startswith("call_")
    assert model.invoke([HumanMessage("Calculate (2 + 3) * 4")]).tool_calls[0]["id"] == call["id"]


def test_offline_does_not_call_a_tool_that_is_not_bound():
    reply = OfflineChatModel().invoke([HumanMessage("calculate 1 + 1")])
    assert reply.tool_calls == []
    assert reply.content.startswith("[offline model] ")


def test_offline_streamed_tool_call_joins_to_the_invoked_call():
    model = OfflineChatModel().bind_tools(TOOLS)
    messages = [HumanMessage("calculate 6 * 7")]
    _, total = join_stream(model, messages)
    assert total.tool_calls == model.invoke(messages).tool_calls


def test_offline_reply_after_a_tool_result_quotes_the_result():
    model = OfflineChatModel().bind_tools(TOOLS)
    question = HumanMessage("calculate 2 + 3 * 4")
    call_message = model.invoke([question])
    result = calculator.invoke(call_message.tool_calls[0])
    assert isinstance(result, ToolMessage)
    history = [question, call_message, result]
    reply = model.invoke(history)
    assert reply.content == offline_reply(history, tools=model.tool_schemas, prefix="The calculator says: 14. ")
    assert reply.content.startswith('[offline model] The calculator says: 14. You said, in order: 1. "calculate 2 + 3 * 4"')


def test_offline_rejects_a_dangling_tool_call_as_invalid_chat_history():
    with pytest.raises(ValueError, match="INVALID_CHAT_HISTORY") as caught:
        OfflineChatModel().invoke(dangling_tool_call_history())
    assert "call_dangling" in str(caught.value)


def test_offline_rejects_a_tool_message_that_answers_no_tool_call():
    with pytest.raises(ValueError, match="INVALID_CHAT_HISTORY") as caught:
        OfflineChatModel().invoke([HumanMessage("hi"), ToolMessage("14", tool_call_id="call_stray")])
    assert "call_stray" in str(caught.value)


# --- make_chat_model ------------------------------------------------------------------------


@pytest.fixture
def no_openai_env(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    return monkeypatch


def test_make_chat_model_returns_a_given_chat_model_as_is():
    model = OfflineChatModel(latency_ms=1)
    assert make_chat_model(model) is model


def test_make_chat_model_is_offline_by_name_or_without_openai_settings(no_openai_env):
    assert isinstance(make_chat_model("offline"), OfflineChatModel)
    assert isinstance(make_chat_model(None), OfflineChatModel)


def test_make_chat_model_uses_a_streaming_chat_openai_when_a_base_url_is_set(no_openai_env):
    no_openai_env.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    model = make_chat_model(None)
    assert isinstance(model, ChatOpenAI)
    assert (model.model_name, model.streaming) == (DEFAULT_OPENAI_MODEL, True)
    # Local servers need no key, but the openai client insists on one.
    assert model.openai_api_key.get_secret_value() == "unused"


@pytest.mark.parametrize("model", ["", "   ", 42, ["offline"]])
def test_make_chat_model_rejects_an_empty_name_or_a_non_model(model):
    with pytest.raises(ConfigurationError):
        make_chat_model(model)


def test_make_chat_model_reports_missing_openai_credentials_as_configuration_error(no_openai_env):
    with pytest.raises(ConfigurationError, match="gpt-4o-mini"):
        make_chat_model("gpt-4o-mini")


# --- ChatOpenAI against the fake OpenAI server ----------------------------------------------
# Marked `slow`, as pyproject.toml defines it: they start a server process (once for the module).


@pytest.fixture(scope="module")
def fake_openai_base_url():
    with openai_stub_server() as base_url:
        yield base_url


@pytest.fixture
def fake_openai(fake_openai_base_url):
    """The base URL of the fake server, with its recorded requests cleared."""
    post(fake_openai_base_url.removesuffix("/v1") + "/_reset")
    return fake_openai_base_url


def post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b""), timeout=5).close()


def recorded_requests(base_url: str) -> list[dict]:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_requests", timeout=5) as response:
        return json.load(response)


def chat_openai(base_url: str, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url, api_key="test", model="fake", max_retries=0, **kwargs)


@pytest.mark.slow
def test_chat_openai_invoke_gets_the_user_messages_quoted(fake_openai):
    reply = chat_openai(fake_openai).invoke(TRIP)
    assert reply.content == "[fake openai] " + TRIP_QUOTE
    [request] = recorded_requests(fake_openai)
    assert request["stream"] is False
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "user", "assistant", "user"]


@pytest.mark.slow
def test_chat_openai_stream_gets_several_chunks_without_usage_by_default(fake_openai):
    chunks, total = join_stream(chat_openai(fake_openai), TRIP)
    assert len([c for c in chunks if c.content]) >= 5
    assert total.content == "[fake openai] " + TRIP_QUOTE
    [request] = recorded_requests(fake_openai)
    # langchain-openai asks for usage only when talking to api.openai.com (no base URL given).
    assert request["stream"] is True and "stream_options" not in request


@pytest.mark.slow
def test_chat_openai_stream_usage_gets_a_final_usage_chunk(fake_openai):
    _, total = join_stream(chat_openai(fake_openai, stream_usage=True), TRIP)
    assert total.usage_metadata["output_tokens"] > 0
    [request] = recorded_requests(fake_openai)
    assert request["stream_options"] == {"include_usage": True}


@pytest.mark.slow
def test_make_chat_model_talks_to_the_server_in_openai_base_url(fake_openai, no_openai_env):
    no_openai_env.setenv("OPENAI_BASE_URL", fake_openai)
    reply = make_chat_model("fake").invoke(TRIP)
    assert reply.content == "[fake openai] " + TRIP_QUOTE
    # streaming=True: even invoke() streams.
    assert recorded_requests(fake_openai)[0]["stream"] is True


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.slow
def test_chat_openai_tool_call_round_trip_through_bind_tools(fake_openai, streaming):
    model = chat_openai(fake_openai, streaming=streaming).bind_tools(TOOLS)
    question = HumanMessage("calculate 2 + 3 * 4")
    call_message = model.invoke([question])
    [call] = call_message.tool_calls
    assert (call["name"], call["args"]) == ("calculator", {"expression": "2 + 3 * 4"})
    reply = model.invoke([question, call_message, calculator.invoke(call)])
    assert reply.content == '[fake openai] The calculator says: 14. You said, in order: 1. "calculate 2 + 3 * 4"'
    offered = [t["function"]["name"] for t in recorded_requests(fake_openai)[0]["tools"]]
    assert offered == ["calculator", "clock"]


@pytest.mark.slow
def test_chat_openai_gets_400_for_a_dangling_tool_call(fake_openai):
    with pytest.raises(openai.BadRequestError, match="call_dangling") as caught:
        chat_openai(fake_openai).invoke(dangling_tool_call_history())
    assert caught.value.status_code == 400
    assert caught.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "robot", "content": "hi"}],
        [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_stray", "content": "14"}],
    ],
    ids=["empty", "unknown-role", "stray-tool-message"],
)
@pytest.mark.slow
def test_fake_server_rejects_invalid_histories_like_openai(fake_openai, messages):
    client = openai.OpenAI(base_url=fake_openai, api_key="test", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake", messages=messages)
    assert len(recorded_requests(fake_openai)) == 1
