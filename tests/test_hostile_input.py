"""Hostile and odd input, in process, on Postgres and SQLite.

Every request either works or is refused with InvalidRequest (400), and a
refused request writes nothing. A request that is well formed but names a
thread or checkpoint that is not there gets ThreadNotFound or
CheckpointNotFound (404). Nothing else, in particular no 500 (a plain
AgentError) and no exception that is not an AgentError.
"""

from __future__ import annotations

import ast
import uuid

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage

from agent import create_agent
from agent.errors import AgentError, CheckpointNotFound, InvalidRequest, ThreadNotFound
from agent.config import load_settings
from agent.operations.registry import ACTIONS as ACTION_TABLE
from agent.operations.turn_options import TURN_KEYS
from agent.requests import ENVELOPE_KEYS, ParsedRequest, parse_request
from agent.serving.errors import http_status

ACTIONS = sorted(name for name in ACTION_TABLE if name != "turn")
CUSTOM_INPUT_KEYS = ENVELOPE_KEYS.union(TURN_KEYS, *(action.keys for action in ACTION_TABLE.values()))


def parse(raw, *, max_request_bytes: int):
    return parse_request(raw, load_settings(database_url="memory://", max_request_bytes=max_request_bytes))
from tests.helpers.reliability import all_rows, head_messages
from tests.helpers.scenario import outputs, request, say, text_of

#: What a well-formed request may get instead of an answer.
ACCEPTABLE = (InvalidRequest, ThreadNotFound, CheckpointNotFound)

#: Stands for a checkpoint id of the thread `known-thread` (replaced by the real one in the test).
KNOWN_CHECKPOINT = "<known checkpoint>"

SQL_IDS = [
    "x'; DROP TABLE checkpoints; --",
    "'); DELETE FROM agent_threads; --",
    "' OR '1'='1",
    'a"b\\c',
    "%s %(x)s {} {0} $1 ?",
    "thread/../../etc/passwd",
    "日本語のスレッド",
]

# --- hypothesis strategies ----------------------------------------------------------------------

TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=20)  # includes lone surrogates
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
IDS = st.one_of(st.sampled_from(SQL_IDS), TEXT, st.just("known-thread"), JSON)
CONTENT = st.one_of(
    TEXT,
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "text"]), "text": TEXT}),
            st.fixed_dictionaries({"type": JSON, "text": JSON}),
            JSON,
        ),
        max_size=3,
    ),
    JSON,
)
ITEMS = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer"]), "content": CONTENT}),
    st.fixed_dictionaries({"role": JSON, "content": CONTENT}),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": IDS, "name": st.sampled_from(["calculator", "clock"]) | TEXT,
         "arguments": st.sampled_from(['{"expression": "1+1"}', "{}", "not json"]) | JSON}
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": IDS, "output": JSON}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "web_search_call", "image", "mcp_call"]) | TEXT}),
    JSON,
)
CUSTOM_INPUTS = st.one_of(
    st.dictionaries(
        st.sampled_from(sorted(CUSTOM_INPUT_KEYS)),
        st.one_of(IDS, st.sampled_from([*ACTIONS, "turn", "reject", "enqueue"]), st.integers(-5, 2000), JSON),
        max_size=4,
    ),
    st.dictionaries(TEXT, JSON, max_size=2),
    JSON,
)
# Mostly well-formed requests, so that turns and actions run and meet the odd value or two.
PLAIN_TEXT = st.text(max_size=30)  # no surrogates, but NUL and other control characters
GOOD_ITEMS = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": PLAIN_TEXT}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.just("calculate ") | PLAIN_TEXT.map("calculate ".__add__)}),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": st.sampled_from(["c1", "c2"]), "name": st.just("calculator"),
         "arguments": st.just('{"expression": "6*7"}')}
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.sampled_from(["c1", "c2"]), "output": PLAIN_TEXT}),
)
VALID_IDS = st.sampled_from(["known-thread", "missing", *SQL_IDS]) | st.text(
    alphabet=st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=12
)
GOOD_CUSTOM_INPUTS = st.fixed_dictionaries(
    {},
    optional={
        "thread_id": VALID_IDS,
        "user_id": st.sampled_from(["alice", "bob"]),
        "checkpoint_id": st.just(KNOWN_CHECKPOINT) | VALID_IDS,
        "before": st.just(KNOWN_CHECKPOINT) | VALID_IDS,
        "action": st.sampled_from(ACTIONS),
        "limit": st.integers(-1, 1001),
        "multitask_strategy": st.sampled_from(["reject", "enqueue"]),
    },
)
WELL_FORMED = st.fixed_dictionaries(
    {"input": st.lists(GOOD_ITEMS, max_size=3)},
    optional={"custom_inputs": GOOD_CUSTOM_INPUTS, "context": st.fixed_dictionaries({}, optional={"user_id": VALID_IDS})},
)
REQUESTS = st.one_of(
    WELL_FORMED,
    WELL_FORMED,
    st.fixed_dictionaries(
        {"input": st.lists(ITEMS, max_size=3)},
        optional={
            "custom_inputs": CUSTOM_INPUTS,
            "context": st.fixed_dictionaries({}, optional={"conversation_id": IDS, "user_id": IDS}) | JSON,
        },
    ),
    st.dictionaries(st.sampled_from(["input", "custom_inputs", "context", "stream", "temperature"]), JSON, max_size=3),
    JSON,
)


@given(REQUESTS)
@settings(max_examples=400, deadline=None)
def test_the_parser_accepts_or_refuses_with_invalid_request(raw):
    try:
        parsed = parse(raw, max_request_bytes=100_000)
    except InvalidRequest:
        return
    assert isinstance(parsed, ParsedRequest)


@pytest.fixture
def fuzz_agent(backend_url):
    # Not `make_agent`: hypothesis runs many examples on one agent (closed here).
    agent = create_agent(backend_url, model="offline", tracing=False, max_request_bytes=20_000)
    known = outputs(say(agent, "a thread that exists", thread_id="known-thread"))["checkpoint_id"]
    yield agent, known
    agent.close()


@given(body=REQUESTS, stream=st.booleans())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_predict_answers_or_refuses_and_a_refusal_writes_nothing(fuzz_agent, backend_url, body, stream):
    fuzz_agent, known = fuzz_agent
    custom = body.get("custom_inputs") if isinstance(body, dict) else None
    if isinstance(custom, dict):
        body = {**body, "custom_inputs": {k: known if v == KNOWN_CHECKPOINT else v for k, v in custom.items()}}
    rows = all_rows(backend_url)
    try:
        if stream:
            list(fuzz_agent.predict_stream(body))
        else:
            fuzz_agent.predict(body)
        event("answered")
    except ACCEPTABLE as refused:
        event(type(refused).__name__)
        assert "Traceback" not in refused.message
        assert all_rows(backend_url) == rows
    except AgentError as other:
        pytest.fail(f"{type(other).__name__} (HTTP {http_status(other)}): {other.message}")


# --- specific cases -------------------------------------------------------------------------------


def stored_user_texts(url: str, thread_id: str) -> list[str]:
    """The user messages at the thread head, read by a new agent (so from the database, not a cache)."""
    with create_agent(url, model="offline", tracing=False) as fresh:
        return [m.text for m in head_messages(fresh, thread_id) if isinstance(m, HumanMessage)]


def refused(agent, url: str, body: dict, *, stream: bool = False) -> InvalidRequest:
    """The InvalidRequest `body` gets, after checking it wrote nothing."""
    rows = all_rows(url)
    with pytest.raises(InvalidRequest) as caught:
        list(agent.predict_stream(body)) if stream else agent.predict(body)
    assert all_rows(url) == rows
    return caught.value


def test_nul_characters_in_messages_are_stored_and_read_back_exactly(agent, backend_url):
    text = "before\x00after \x00\x00 end"
    thread_id = outputs(say(agent, text))["thread_id"]
    say(agent, "and \x00 again", thread_id=thread_id)
    assert "before\x00after" in text_of(say(agent, "what did I say?", thread_id=thread_id))
    assert stored_user_texts(backend_url, thread_id) == [text, "and \x00 again", "what did I say?"]
    history = agent.get_checkpoint_history(thread_id)
    assert history[1]["last_message"].startswith('[offline model] You said, in order: 1. "beforeafter')
    updated = agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "edit \x00 here"}])
    assert updated["checkpoint_id"]
    assert stored_user_texts(backend_url, thread_id)[-1] == "edit \x00 here"


def test_a_very_long_message_is_stored_and_read_back_exactly(backend_url, make_agent):
    agent = make_agent(backend_url, max_request_bytes=3_000_000)
    text = "ab\u00e9\u65e5" * 250_000  # a million characters, 1.75 MB as UTF-8
    thread_id = outputs(say(agent, text))["thread_id"]
    say(agent, "short one", thread_id=thread_id)
    assert stored_user_texts(backend_url, thread_id) == [text, "short one"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_over_max_request_bytes_is_refused(backend_url, make_agent, stream):
    agent = make_agent(backend_url, max_request_bytes=10_000)
    error = refused(agent, backend_url, request("x" * 10_001), stream=stream)
    assert "10000" in error.message
    # Bytes, not characters: 4,000 three-byte characters are 12,000 bytes.
    refused(agent, backend_url, request("\u65e5" * 4_000), stream=stream)
    assert text_of(say(agent, "x" * 9_000))


@pytest.mark.parametrize(
    "body",
    [
        request("\ud800"),
        request("lone low \udfff surrogate"),
        request("hi", thread_id="thread-\ud800"),
        request("hi", user_id="\udc00"),
        request("hi", checkpoint_id="\ud800"),
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "\ud83d"}]}]},
        {"input": [{"role": "user", "content": "hi"}], "context": {"conversation_id": "\ud800"}},
        {"input": [{"type": "function_call", "call_id": "c\ud800", "name": "calculator", "arguments": "{}"}]},
    ],
    ids=["text", "low surrogate", "thread_id", "user_id", "checkpoint_id", "text part", "conversation_id", "call_id"],
)
def test_lone_surrogates_are_refused(agent, backend_url, body):
    refused(agent, backend_url, body)
    refused(agent, backend_url, body, stream=True)
    with pytest.raises(InvalidRequest):
        parse(body, max_request_bytes=1_000_000)


@pytest.mark.parametrize("raw_id", SQL_IDS)
def test_ids_with_sql_metacharacters_are_plain_ids(agent, backend_url, raw_id):
    # Made unique: the fuzz tests may have used the same ids on the session's database.
    thread_id = f"{raw_id} {uuid.uuid4().hex[:6]}"
    user_id = thread_id[::-1]
    first = outputs(say(agent, "I'm headed to SF!", thread_id=thread_id, user_id=user_id))
    assert first["thread_id"] == thread_id
    other = outputs(say(agent, "another thread"))["thread_id"]
    second = outputs(say(agent, "Where am I going?", thread_id=thread_id, user_id=user_id))
    branched = outputs(
        say(agent, "New York instead", thread_id=thread_id, user_id=user_id, checkpoint_id=first["checkpoint_id"])
    )
    assert branched["parent_checkpoint_id"] == first["checkpoint_id"]
    history = agent.get_checkpoint_history(thread_id, user_id=user_id, before=branched["checkpoint_id"])
    assert [h["checkpoint_id"] for h in history] == [
        second["checkpoint_id"], first["checkpoint_id"], first["parent_checkpoint_id"]
    ]
    with pytest.raises(ThreadNotFound):
        agent.get_checkpoint_history(thread_id, user_id="someone else")
    assert agent.delete_user_data(user_id) == [thread_id]
    with pytest.raises(ThreadNotFound):
        agent.get_checkpoint_history(thread_id, user_id=user_id)
    # Every table is still there (all_rows reads each), and so is the other thread.
    assert all_rows(backend_url)["checkpoints"] > 0
    assert agent.get_checkpoint_history(other)


@pytest.mark.parametrize(
    "item",
    [
        {"type": "reasoning", "summary": []},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "image_generation_call", "id": "ig_1"},
        {"type": "mcp_call", "id": "m1", "name": "x", "arguments": "{}", "server_label": "s"},
        {"type": "input_image", "image_url": "http://example.invalid/x.png"},
        {"type": "no such type"},
        {"type": None, "role": "user", "content": "hi"},
        {"type": ["message"], "role": "user", "content": "hi"},
        {"role": "tool", "content": "hi"},
        {"role": ["user"], "content": "hi"},
        {"role": "user", "content": [{"type": ["input_text"], "text": "hi"}]},
        {"role": "user", "content": [{"type": "input_image", "image_url": "http://example.invalid/x.png"}]},
        {"role": "user", "content": 5},
        {"role": "user"},
        {"role": "user", "content": ""},  # as `input: ""`; an empty list of parts was refused already
        {"type": "function_call", "name": "calculator", "arguments": "{}"},
        {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": {"expression": "1"}},
        {"type": "function_call_output", "call_id": "c1"},
        "just a string",
        ["a", "list"],
        None,
    ],
)
def test_unknown_or_malformed_items_are_refused(agent, backend_url, item):
    refused(agent, backend_url, {"input": [item]})
    if item == {"role": "user", "content": ""}:
        refused(agent, backend_url, {"input": ""})
    refused(agent, backend_url, {"input": [{"role": "user", "content": "hi"}, item]}, stream=True)
    with pytest.raises(InvalidRequest):
        parse({"input": [item]}, max_request_bytes=1_000_000)


@pytest.mark.parametrize(
    "custom_inputs",
    [
        [],
        [{"thread_id": "x"}],
        "",
        "thread_id=x",
        0,
        False,
        {"thread_id": {"nested": "x"}},
        {"thread_id": ["x"]},
        {"thread_id": 7},
        {"thread_id": ""},
        {"thread_id": "x" * 257},
        {"thread_id": "tab\there"},
        {"user_id": {"id": "alice"}},
        {"user_id": True},
        {"checkpoint_id": 1.5},
        {"multitask_strategy": "parallel"},
        {"multitask_strategy": ["enqueue"]},
        {"action": ["delete_thread"]},
        {"action": {"name": "delete_thread"}},
        {"action": "drop_everything"},
        {"threadid": "typo"},
        {"thread_id": "x", "extra": {"deeply": {"nested": [1, 2, {"x": None}]}}},
    ],
)
def test_custom_inputs_of_the_wrong_type_are_refused(agent, backend_url, custom_inputs):
    body = {"input": [{"role": "user", "content": "hi"}], "custom_inputs": custom_inputs}
    refused(agent, backend_url, body)
    refused(agent, backend_url, body, stream=True)
    with pytest.raises(InvalidRequest):
        parse(body, max_request_bytes=1_000_000)


def test_a_misspelt_turn_key_is_refused_with_every_key_a_turn_accepts():
    body = {"input": [{"role": "user", "content": "hi"}], "custom_inputs": {"previous_respons_id": "resp_x"}}
    with pytest.raises(InvalidRequest) as refusal:
        parse(body, max_request_bytes=1_000_000)
    known = ast.literal_eval(str(refusal.value).split("known: ", 1)[1])
    assert set(known) == ENVELOPE_KEYS | TURN_KEYS | {"previous_response_id", "instructions", "store", "background"}


def test_a_thread_or_checkpoint_id_an_action_does_not_act_on_is_refused_naming_the_key(agent, backend_url):
    # A new-user trial got the whole history for a checkpoint_id, and every thread for a thread_id.
    thread_id = outputs(say(agent, "hi"))["thread_id"]
    for custom, key, instead in (
        ({"action": "get_checkpoint_history", "thread_id": thread_id, "checkpoint_id": "abc"}, "checkpoint_id", "before"),
        ({"action": "list_threads", "thread_id": thread_id}, "thread_id", "before"),
        ({"action": "get_head", "thread_id": thread_id, "checkpoint_id": "abc"}, "checkpoint_id", None),
        ({"action": "search_threads", "query": "hi", "thread_id": thread_id}, "thread_id", None),
    ):
        refusal = refused(agent, backend_url, {"input": [], "custom_inputs": custom})
        assert f"takes no {key}" in str(refusal) and custom["action"] in str(refusal)
        assert instead is None or f"send {instead}" in str(refusal)
    # The actions that act on them still take them; the policy keys stay ignored where they do not apply.
    history = agent.predict({"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id,
                                                             "idempotency_key": "k", "multitask_strategy": "enqueue"}})  # fmt: skip
    head = history.custom_outputs["history"][0]["checkpoint_id"]
    state = agent.predict({"input": [], "custom_inputs": {"action": "get_checkpoint_state", "thread_id": thread_id,
                                                           "checkpoint_id": head}})  # fmt: skip
    assert state.custom_outputs["checkpoint_id"] == head



def test_a_null_thread_or_checkpoint_id_is_absent_for_an_action_that_does_not_act_on_it(agent):
    # A client that serializes a fixed shape sends every key, with null where it has none.
    thread_id = outputs(say(agent, "hi"))["thread_id"]
    second = say(agent, "and again", thread_id=thread_id)
    history = agent.predict({"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id,
                                                             "checkpoint_id": None}}).custom_outputs["history"]  # fmt: skip
    assert history[0]["checkpoint_id"] == outputs(second)["checkpoint_id"] and len(history) > 2
    threads = agent.predict({"input": [], "custom_inputs": {"action": "list_threads", "thread_id": None,
                                                             "checkpoint_id": None}}).custom_outputs["threads"]  # fmt: skip
    assert thread_id in [thread["thread_id"] for thread in threads]


@pytest.mark.parametrize("limit", [True, False, "5", -1, 0, 1001, 2.5, None, [5], {"n": 5}])
def test_history_limit_of_the_wrong_type_or_range_is_refused(agent, backend_url, limit):
    thread_id = outputs(say(agent, "hi"))["thread_id"]
    body = {"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id, "limit": limit}}
    refused(agent, backend_url, body)
    with pytest.raises(InvalidRequest):
        agent.get_checkpoint_history(thread_id, limit=limit)


@pytest.mark.parametrize("context", [[], "alice", 5, {"user_id": ["alice"]}, {"conversation_id": {"id": "x"}}])
def test_context_of_the_wrong_type_is_refused(agent, backend_url, context):
    refused(agent, backend_url, {"input": [{"role": "user", "content": "hi"}], "context": context})


def test_deeply_nested_input_is_refused(agent, backend_url):
    nested: object = "bottom"
    for _ in range(5_000):
        nested = {"x": nested}
    refused(agent, backend_url, {"input": [{"role": "user", "content": "hi"}], "custom_inputs": {"thread_id": nested}})
    with pytest.raises(InvalidRequest):
        parse({"input": [], "custom_inputs": {"before": nested}}, max_request_bytes=10**9)


@pytest.mark.parametrize(
    "new_messages",
    ["not a list", [{"role": "user", "content": "\ud800"}], [{"type": "reasoning"}], [5], {"role": "user"}],
)
def test_update_checkpoint_state_refuses_bad_messages_and_writes_nothing(agent, backend_url, new_messages):
    thread_id = outputs(say(agent, "hi"))["thread_id"]
    rows = all_rows(backend_url)
    with pytest.raises(InvalidRequest):
        agent.update_checkpoint_state(thread_id, None, new_messages)
    assert all_rows(backend_url) == rows


def test_a_turn_that_sends_a_stored_messages_id_with_other_text_is_refused_and_a_replay_of_it_is_not(backend_url, make_agent):
    # add_messages would replace the stored message where it stands: the branch's past rewritten, no new branch.
    agent = make_agent(backend_url)
    first = agent.predict({"input": "first"})
    thread_id = first.custom_outputs["thread_id"]
    stored = agent.get_checkpoint_state(thread_id)["messages"]
    before = {**agent.export_thread(thread_id), "exported_at": None}
    rewrite = [{"type": "message", "role": "user", "content": "REWRITTEN", "id": stored[0]["id"]}]
    with pytest.raises(InvalidRequest, match="stands for a message of checkpoint .* with other content"):
        agent.predict({"input": rewrite, "custom_inputs": {"thread_id": thread_id}})
    as_assistant = [{"type": "message", "role": "assistant", "content": "first", "id": stored[0]["id"]}]
    with pytest.raises(InvalidRequest, match="edit_message_id"):
        agent.predict({"input": as_assistant, "custom_inputs": {"thread_id": thread_id}})
    assert {**agent.export_thread(thread_id), "exported_at": None} == before
    # A client that keeps its own history sends the conversation again, then its new message: appended once.
    replay = [{"type": "message", "role": "user", "content": "first", "id": stored[0]["id"]},
              *[item.model_dump(exclude_none=True) for item in first.output], {"role": "user", "content": "second"}]  # fmt: skip
    agent.predict({"input": replay, "custom_inputs": {"thread_id": thread_id}})
    after = agent.get_checkpoint_state(thread_id)["messages"]
    assert [m["id"] for m in after[:2]] == [m["id"] for m in stored]
    assert [(m["role"], m["content"][0]["text"][:6]) for m in after[1:]] == [
        ("assistant", "[offli"), ("user", "second"), ("assistant", "[offli")
    ]


def test_a_replayed_tool_turn_is_not_stored_twice_and_a_turn_of_stored_messages_only_is_refused(backend_url, make_agent):
    # A function_call item's id is its call_id, not the stored message's: the calls tell it is stored already.
    agent = make_agent(backend_url)
    first = agent.predict({"input": 'use calculator {"expression": "2+3"}'})
    thread_id, after_first = first.custom_outputs["thread_id"], first.custom_outputs["checkpoint_id"]
    replay = [item.model_dump(exclude_none=True) for item in first.output]
    assert [item["type"] for item in replay] == ["function_call", "function_call_output", "message"]
    agent.predict({"input": [*replay, {"role": "user", "content": "thanks"}], "custom_inputs": {"thread_id": thread_id}})
    kinds = [m["type"] for m in agent.get_checkpoint_state(thread_id)["messages"]]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message", "message"]
    head = agent.get_head(thread_id)["checkpoint_id"]
    with pytest.raises(InvalidRequest, match="Every message of the input .* is a message of checkpoint"):
        agent.predict({"input": replay, "custom_inputs": {"thread_id": thread_id, "checkpoint_id": after_first}})
    other_args = [{**replay[0], "arguments": '{"expression": "9*9"}'}, {"role": "user", "content": "and this?"}]
    with pytest.raises(InvalidRequest, match="its tool call's"):
        agent.predict({"input": other_args, "custom_inputs": {"thread_id": thread_id, "checkpoint_id": after_first}})
    assert agent.get_head(thread_id)["checkpoint_id"] == head
