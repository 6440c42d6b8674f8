"""The OpenAI-compatible stub (`tests.helpers.openai_stub`) run as a process: timing shape, runtime
configuration, context window, usage and embeddings, through the real OpenAI and LangChain clients.

Timings are checked only as lower bounds where the delay is the behaviour (a 1 s
model does not answer sooner); how fast it answers belongs to the benchmarks.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from agent.tools import TOOLS
from tests.helpers.openai_stub import MARKER, configure_stub, openai_stub_server

pytestmark = pytest.mark.slow

CONVERSATION = [
    SystemMessage("You are a travel agent."),
    HumanMessage("I'm planning for an upcoming trip!"),
    AIMessage("Great, where to?", name="agent"),
    HumanMessage("I'm headed to SF!"),
]


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    with openai_stub_server() as base_url:
        yield base_url


@pytest.fixture
def stub(stub_url: str) -> str:
    """The module's stub, back to its default configuration and with nothing recorded."""
    configure_stub(stub_url, latency_s=None, chunks=None, max_context_tokens=None)
    post_json(stub_url.removesuffix("/v1") + "/_reset", {})
    return stub_url


def post_json(url: str, payload: object) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def chat(base_url: str, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url, api_key="test", model="fake", max_retries=0, **kwargs)


def content_chunks(base_url: str, text: str) -> list[tuple[float, str]]:
    """(seconds since the request, content) of each non-empty content chunk of a streamed reply."""
    client = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0)
    start = time.monotonic()
    out = []
    for chunk in client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": text}], stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            out.append((time.monotonic() - start, chunk.choices[0].delta.content))
    return out


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# --- timing and chunks ----------------------------------------------------------------------


def test_a_streamed_reply_comes_as_the_configured_number_of_content_chunks(stub):
    configure_stub(stub, chunks=4)
    chunks = content_chunks(stub, "I'm headed to SF and then to New York!")
    assert len(chunks) == 4
    reply = MARKER + 'You said, in order: 1. "I\'m headed to SF and then to New York!"'
    assert "".join(text for _, text in chunks) == reply


def test_without_chunks_a_streamed_reply_has_one_chunk_every_three_words(stub):
    chunks = content_chunks(stub, "one two three four five six seven")
    reply = "".join(text for _, text in chunks)
    assert len(chunks) == math.ceil(len(reply.split()) / 3)


def test_a_reply_of_fewer_words_than_chunks_is_cut_by_characters(stub):
    reply = MARKER + 'You said, in order: 1. "hi"'
    assert len(reply.split()) < 10 < len(reply)
    configure_stub(stub, chunks=10)
    chunks = [text for _, text in content_chunks(stub, "hi")]
    assert len(chunks) == 10 and "".join(chunks) == reply


def test_a_slow_model_spreads_its_chunks_over_the_latency(stub):
    configure_stub(stub, latency_s=1.0, chunks=4)
    chunks = content_chunks(stub, "I'm headed to SF and then to New York!")
    # Lower bounds only: the i-th of 4 chunks is not sent before i/4 of the latency.
    assert [t >= (i + 1) * 0.25 for i, (t, _) in enumerate(chunks)] == [True] * 4


def test_a_slow_model_answers_a_non_streamed_request_after_its_latency(stub):
    configure_stub(stub, latency_s=1.0)
    start = time.monotonic()
    reply = chat(stub).invoke("I'm headed to SF!")
    assert time.monotonic() - start >= 1.0
    assert reply.content == MARKER + 'You said, in order: 1. "I\'m headed to SF!"'


def test_hundreds_of_concurrent_slow_streams_all_complete(stub):
    configure_stub(stub, latency_s=1.0, chunks=4)

    def one(n: int) -> str:
        return "".join(text for _, text in content_chunks(stub, f"conversation {n}"))

    with concurrent.futures.ThreadPoolExecutor(max_workers=200) as pool:
        replies = list(pool.map(one, range(200)))
    assert replies == [MARKER + f'You said, in order: 1. "conversation {n}"' for n in range(200)]


# --- configuration --------------------------------------------------------------------------


def test_config_changes_only_the_fields_given_and_null_restores_the_default(stub):
    root = stub.removesuffix("/v1")
    assert configure_stub(stub, latency_s=0.5, chunks=4) == {"latency_s": 0.5, "chunks": 4, "max_context_tokens": None}
    assert configure_stub(stub, max_context_tokens=100) == {"latency_s": 0.5, "chunks": 4, "max_context_tokens": 100}
    assert configure_stub(stub, chunks=None) == {"latency_s": 0.5, "chunks": None, "max_context_tokens": 100}
    assert get_json(root + "/_config") == {"latency_s": 0.5, "chunks": None, "max_context_tokens": 100}


@pytest.mark.parametrize(
    "changes", [{"latency": 1}, {"latency_s": -1}, {"chunks": 0}, {"chunks": 1.5}, {"max_context_tokens": "10"}]
)
def test_config_refuses_unknown_fields_and_bad_values_and_keeps_the_old_one(stub, changes):
    with pytest.raises(urllib.error.HTTPError) as caught:
        configure_stub(stub, **changes)
    assert caught.value.code == 400
    default = {"latency_s": 0.0, "chunks": None, "max_context_tokens": None}
    assert get_json(stub.removesuffix("/v1") + "/_config") == default


def test_command_line_options_set_the_starting_configuration():
    with openai_stub_server(latency_s=0.25, chunks=3, max_context_tokens=50) as base_url:
        config = get_json(base_url.removesuffix("/v1") + "/_config")
    assert config == {"latency_s": 0.25, "chunks": 3, "max_context_tokens": 50}


# --- tokens ---------------------------------------------------------------------------------


def test_a_prompt_over_the_context_window_raises_context_length_exceeded_in_chat_openai(stub):
    tokens = count_tokens_approximately(CONVERSATION)
    configure_stub(stub, max_context_tokens=tokens - 1)
    with pytest.raises(openai.BadRequestError) as caught:
        chat(stub).invoke(CONVERSATION)
    assert caught.value.status_code == 400
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.body["type"] == "invalid_request_error" and caught.value.body["param"] == "messages"
    assert f"maximum context length is {tokens - 1} tokens" in caught.value.message
    assert f"resulted in {tokens} tokens" in caught.value.message


def test_a_prompt_exactly_at_the_context_window_is_answered_with_its_token_count(stub):
    tokens = count_tokens_approximately(CONVERSATION)
    configure_stub(stub, max_context_tokens=tokens)
    reply = chat(stub).invoke(CONVERSATION)
    assert reply.usage_metadata["input_tokens"] == tokens
    assert reply.usage_metadata["output_tokens"] == math.ceil(len(reply.content) / 4)


@pytest.mark.parametrize("streaming", [False, True])
def test_usage_counts_tool_calls_and_tools_as_count_tokens_approximately_does(stub, streaming):
    model = chat(stub, streaming=streaming, stream_usage=True).bind_tools(TOOLS)
    question = HumanMessage("calculate 2 + 3 * 4")
    call = model.invoke([question])
    result = ToolMessage("14", tool_call_id=call.tool_calls[0]["id"])
    history = [SystemMessage("Be brief."), question, AIMessage("", tool_calls=call.tool_calls), result]
    reply = model.invoke(history)
    expected = count_tokens_approximately(history, tools=[convert_to_openai_tool(t) for t in TOOLS])
    assert reply.usage_metadata["input_tokens"] == expected
    assert reply.usage_metadata["total_tokens"] == expected + reply.usage_metadata["output_tokens"]


# --- embeddings -----------------------------------------------------------------------------


def test_embeddings_put_texts_that_share_words_closer_than_unrelated_texts(stub):
    embeddings = OpenAIEmbeddings(base_url=stub, api_key="x", model="fake-embed", check_embedding_ctx_length=False)
    trip, trip_again, cooking = embeddings.embed_documents(
        ["I'm headed to San Francisco next week", "Next week I am headed to San Francisco", "Bake the bread at 220 C"]
    )
    assert cosine(trip, trip_again) > cosine(trip, cooking)
    assert embeddings.embed_query("I'm headed to San Francisco next week") == pytest.approx(trip, abs=1e-6)
    assert math.isclose(sum(x * x for x in trip), 1.0, rel_tol=1e-5)


def test_embeddings_answer_in_openai_shape_and_are_recorded_apart_from_chat_requests(stub):
    root = stub.removesuffix("/v1")
    body = {"model": "fake-embed", "input": ["one text", "another text"], "encoding_format": "float"}
    answer = httpx.post(f"{stub}/embeddings", json=body, timeout=10).json()
    assert answer["object"] == "list" and answer["model"] == "fake-embed"
    assert [(d["object"], d["index"], len(d["embedding"])) for d in answer["data"]] == [
        ("embedding", 0, 64),
        ("embedding", 1, 64),
    ]
    assert answer["usage"] == {"prompt_tokens": 2 + 3, "total_tokens": 2 + 3}
    chat(stub).invoke("hi")
    assert get_json(f"{root}/_requests?path=/v1/embeddings") == [body]
    assert [b["messages"][0]["content"] for b in get_json(f"{root}/_requests")] == ["hi"]
    assert [r["path"] for r in get_json(f"{root}/_requests?path=all")] == ["/v1/embeddings", "/v1/chat/completions"]


def test_embeddings_of_an_empty_input_get_400(stub):
    response = httpx.post(f"{stub}/embeddings", json={"model": "fake-embed", "input": []}, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"


def test_a_memory_extraction_request_is_answered_with_the_json_it_asks_for():
    """The agent's own extraction request (agent.memory.extraction) gets proposals its parser reads."""
    from agent.memory.extraction import extraction_request, parse_proposals
    from tests.helpers.openai_stub import answer

    request = extraction_request([HumanMessage("Hello"), AIMessage("Hi"), HumanMessage("Remember that I am vegetarian")], [])
    body = {"messages": [{"role": "system" if m.type == "system" else "user", "content": m.text} for m in request]}
    assert [p.content for p in parse_proposals(answer(body)["content"], [])] == ["I am vegetarian"]
