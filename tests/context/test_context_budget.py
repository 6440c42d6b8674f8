"""agent.context without a database: fitting a branch into a token budget at every boundary, the tool-call
pairing rule, summaries' rules, token counters and default budgets, and the append fast path of the
messages reducer (agent.state) against LangGraph's add_messages."""

from __future__ import annotations

import uuid

import pytest
import tiktoken
import tiktoken.registry
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages

from agent.context import TurnContext, prepare_model_input
from agent.context.budget import Budget, fit
from agent.context.repair import close_unanswered_tool_calls, tool_call_pairing
from agent.context.summaries import ContextSummary, edit_keeps_summary, is_summary_message, summary_message
from agent.context.tokens import (
    APPROXIMATE,
    MAX_DEFAULT_TOKENS,
    UNKNOWN_MODEL_TOKENS,
    approximate_counter,
    default_max_context_tokens,
    token_counter,
    tool_tokens,
)
from agent.models import OfflineChatModel
from agent.state import append_messages
from agent.tools import TOOLS

SCHEMAS = [convert_to_openai_tool(tool) for tool in TOOLS]


def call(call_id: str, expression: str = "1 + 1") -> dict:
    return {"name": "calculator", "args": {"expression": expression}, "id": call_id, "type": "tool_call"}


def tool_thread() -> list:
    """Six turns; even turns call the calculator twice in one message; a system message in turn 3."""
    history: list = [SystemMessage("You are a travel agent.", id="sys0")]
    for n in range(6):
        history.append(HumanMessage(f"turn {n}: how much is {n} + {n}, and where do I go next?", id=f"h{n}"))
        if n == 3:
            history.append(SystemMessage("Answer in one sentence.", id="sys3"))
        if n % 2 == 0:
            history.append(AIMessage("", tool_calls=[call(f"c{n}a"), call(f"c{n}b")], id=f"a{n}"))
            history.append(ToolMessage(str(2 * n), tool_call_id=f"c{n}a", id=f"t{n}a"))
            history.append(ToolMessage(str(2 * n), tool_call_id=f"c{n}b", id=f"t{n}b"))
        history.append(AIMessage(f"reply {n}: it is {2 * n}; go to the museum by the river.", id=f"r{n}"))
    return history


def turn_starts(messages: list) -> list[int]:
    return [i for i, m in enumerate(messages) if m.type == "human"]


def budget(max_tokens: int, strategy: str = "trim", tools: list | None = None) -> Budget:
    return Budget(max_tokens, strategy, approximate_counter(), tool_tokens=tool_tokens(tools or []))


def check_trimmed(messages: list, head: list, result, limit: Budget) -> None:
    """The input is head + older system messages + a repaired suffix from a turn start, well formed and counted."""
    sent = result.messages
    assert sent[: len(head)] == head
    hoisted = [m for m in messages[: result.kept_from] if m.type == "system"]
    assert sent[len(head) : len(head) + len(hoisted)] == hoisted
    assert sent[len(head) + len(hoisted) :] == close_unanswered_tool_calls(messages[result.kept_from :])
    assert result.kept_from in turn_starts(messages) or result.kept_from == 0
    assert tool_call_pairing(sent).well_formed
    newest_user = max(turn_starts(messages), default=None)
    if newest_user is not None:
        assert any(m is messages[newest_user] for m in sent)
    assert result.tokens == count_tokens_approximately(sent) + limit.tool_tokens
    newest_turn_only = result.kept_from == (newest_user or 0)
    assert result.tokens <= limit.max_tokens or newest_turn_only


def test_trimming_at_every_budget_keeps_whole_turns_and_every_tool_call_with_its_results():
    messages = tool_thread()
    head = [SystemMessage("Instructions for this turn only.")]
    full = count_tokens_approximately([*head, *messages], tools=SCHEMAS)
    cuts = set()
    for max_tokens in range(1, full + 2):
        limit = budget(max_tokens, tools=SCHEMAS)
        result = fit(head, messages, limit)
        check_trimmed(messages, head, result, limit)
        cuts.add(result.kept_from)
    # Every turn boundary was a cut at some budget (the first turn's start merges with the system message
    # before it, which is sent anyway), and at the full size nothing was left out.
    assert cuts == set(turn_starts(messages)[1:]) | {0}
    assert fit(head, messages, budget(full, tools=SCHEMAS)).messages == [*head, *messages]


def test_system_messages_are_always_sent_in_their_order():
    messages = tool_thread()
    result = fit([], messages, budget(1))
    systems = [m for m in result.messages if m.type == "system"]
    assert [m.id for m in systems] == ["sys0", "sys3"]
    assert result.messages[len(systems) :] == messages[turn_starts(messages)[-1] :]


def test_the_newest_turn_is_sent_whole_even_when_it_alone_is_over_the_budget():
    messages = [HumanMessage("old question", id="1"), AIMessage("old answer", id="2"), HumanMessage("x" * 4000, id="3")]
    result = fit([], messages, budget(50))
    assert result.messages == [messages[2]]
    assert result.tokens > 50


def test_a_turn_without_a_user_message_before_the_first_one_is_a_turn_too():
    messages = [AIMessage("Welcome back.", id="w"), HumanMessage("hi", id="h"), AIMessage("hello", id="a")]
    assert fit([], messages, budget(count_tokens_approximately(messages[1:]))).messages == messages[1:]
    assert fit([], messages, budget(10_000)).messages == messages


def test_an_unlimited_pipeline_sends_every_message_with_the_turn_instructions_first():
    messages = tool_thread()
    result = prepare_model_input(messages, TurnContext("t", instructions="Be brief."))
    assert [m.text for m in result.messages[:1]] == ["Be brief."]
    assert result.messages[1:] == messages and not result.summary_used


# Histories with tool calls where anything may be missing or misplaced (as after branching or edits).
def _history(draw_ops) -> list:
    out: list = []
    for kind, n in draw_ops:
        if kind == "user":
            out.append(HumanMessage(f"user {n} " + "w" * n))
        elif kind == "reply":
            out.append(AIMessage(f"reply {n} " + "v" * n))
        elif kind == "call":
            out.append(AIMessage("", tool_calls=[call(f"call{n}"), call(f"call{n}x")]))
        elif kind == "result":
            out.append(ToolMessage(str(n), tool_call_id=f"call{n}"))
        else:
            out.append(SystemMessage(f"system {n}"))
    return out


ops = st.lists(
    st.tuples(st.sampled_from(["user", "reply", "call", "result", "system"]), st.integers(0, 12)), max_size=25
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, max_tokens=st.integers(1, 600))
def test_any_history_at_any_budget_gives_a_well_formed_suffix_of_whole_turns(ops, max_tokens):
    messages = _history(ops)
    limit = budget(max_tokens)
    result = fit([], messages, limit)
    check_trimmed(messages, [], result, limit)
    # Repairing the kept turns alone gives what repairing the whole history gives from the same turn on.
    k = result.kept_from
    assert close_unanswered_tool_calls(messages[:k]) + close_unanswered_tool_calls(messages[k:]) == (
        close_unanswered_tool_calls(messages)
    )


# --- summaries --------------------------------------------------------------------------------------
def chat(turns: int) -> list:
    history: list = []
    for n in range(turns):
        history += [HumanMessage(f"question {n} about the trip", id=f"h{n}"), AIMessage(f"answer {n}", id=f"a{n}")]
    return history


def test_over_the_budget_summarize_asks_to_fold_the_oldest_whole_turns_in_requests_that_fit():
    messages = chat(30)
    limit = budget(120, "summarize")
    result = fit([], messages, limit)
    assert result.fold is not None and result.messages == []
    assert result.fold.previous is None
    ends = [chunk.end for chunk in result.fold.chunks]
    assert ends == sorted(ends) and all(end in turn_starts(messages) for end in ends)
    folded = [m for chunk in result.fold.chunks for m in chunk.messages]
    assert folded == messages[: ends[-1]]
    per_request = limit.max_tokens - limit.summary_max_tokens
    assert all(count_tokens_approximately(chunk.messages) <= per_request for chunk in result.fold.chunks)
    assert [chunk.covers for chunk in result.fold.chunks] == ends  # no system messages here

    summary = ContextSummary("They talked about a trip.", ends[-1], messages[ends[-1] - 1].id, ends[-1])
    after = fit([], messages, limit, summary, allow_fold=False)
    assert after.summary_used and after.messages[0].id == summary_message(summary).id
    assert after.messages[1:] == messages[ends[-1] :]
    assert after.tokens <= limit.max_tokens
    # Older turns kept beside the newest take at most half of what a full summary leaves: room to grow before
    # the next fold.
    newest = count_tokens_approximately(messages[-2:])
    older = after.tokens - count_tokens_approximately([after.messages[0]]) - newest
    assert older <= (120 - newest - limit.summary_max_tokens) // 2


def test_a_summary_that_still_fits_is_reused_without_folding():
    messages = chat(30)
    summary = ContextSummary("They talked about a trip.", 50, "a24", 50)
    result = fit([], messages, budget(300, "summarize"), summary)
    assert result.fold is None and result.summary_used
    assert result.messages[1:] == messages[50:]


def test_the_trim_strategy_never_sends_a_summary():
    messages = chat(30)
    summary = ContextSummary("They talked about a trip.", 50, "a24", 50)
    result = fit([], messages, budget(300, "trim"), summary)
    assert not result.summary_used and not any(map(is_summary_message, result.messages))


@pytest.mark.parametrize(
    "summary",
    [
        ContextSummary("gone", 50, "another-branch-message", 50),  # its last message is not there
        ContextSummary("gone", 60, "a29", 60),  # it would cover the newest user message
        ContextSummary("gone", 70, "a34", 70),  # longer than the branch
    ],
    ids=["moved", "covers-the-newest-question", "past-the-end"],
)
def test_a_summary_that_no_longer_describes_the_branch_is_not_used(summary):
    messages = chat(30)
    result = fit([], messages, budget(10_000, "summarize"), summary)
    assert not result.summary_used and result.messages == messages


def test_editing_or_removing_a_summarized_message_retires_the_summary_and_later_edits_do_not():
    messages = chat(10)
    state = {"messages": messages, "context_summary": ContextSummary("s", 6, "a2", 6).as_state()}
    assert not edit_keeps_summary(state, [HumanMessage("changed", id="h1")])
    assert not edit_keeps_summary(state, [RemoveMessage(id="a0")])
    assert not edit_keeps_summary(state, [RemoveMessage(id=REMOVE_ALL_MESSAGES)])
    assert edit_keeps_summary(state, [HumanMessage("changed", id="h5"), HumanMessage("new")])
    assert edit_keeps_summary({"messages": messages}, [HumanMessage("changed", id="h1")])


# --- token counters and default budgets --------------------------------------------------------------
def test_the_offline_model_and_models_without_a_loadable_encoding_are_counted_approximately():
    assert token_counter(OfflineChatModel()).name == APPROXIMATE
    # tiktoken downloads its encodings; without the network ChatOpenAI cannot count.
    stub_named = ChatOpenAI(model="fake", api_key="unused", base_url="http://127.0.0.1:9/v1")
    assert token_counter(stub_named).name == APPROXIMATE


def test_an_openai_model_whose_encoding_is_available_is_counted_with_tiktoken(monkeypatch):
    # A byte-level encoding under the name gpt-4o uses: one token per UTF-8 byte.
    encoding = tiktoken.Encoding(
        name="o200k_base", pat_str=r"\S+|\s+", mergeable_ranks={bytes([b]): b for b in range(256)}, special_tokens={}
    )
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "o200k_base", encoding)
    model = ChatOpenAI(model="gpt-4o", api_key="unused", base_url="http://127.0.0.1:9/v1")
    counter = token_counter(model)
    assert counter.name == "tiktoken o200k_base"
    message = HumanMessage("héllo")
    assert counter.count([message]) + counter.overhead == model.get_num_tokens_from_messages([message])
    assert counter.count([message, message]) == 2 * counter.count([message])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt-4o-mini", MAX_DEFAULT_TOKENS),
        ("gpt-4", 4_096),
        ("gpt-3.5-turbo", 8_192),
        ("some-local-model", UNKNOWN_MODEL_TOKENS),
    ],
)
def test_the_default_budget_is_half_the_known_context_window_at_most_64000(name, expected):
    model = ChatOpenAI(model=name, api_key="unused", base_url="http://127.0.0.1:9/v1")
    assert default_max_context_tokens(model) == expected
    assert default_max_context_tokens(OfflineChatModel()) == UNKNOWN_MODEL_TOKENS


# --- the messages reducer ------------------------------------------------------------------------------
reducer_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 3), st.booleans()),  # new messages, with or without ids
        st.tuples(st.just("replace"), st.integers(0, 100)),
        st.tuples(st.just("remove"), st.integers(0, 100)),
        st.tuples(st.just("remove_all"), st.just(0)),
    ),
    max_size=15,
)


@settings(max_examples=200, deadline=None)
@given(ops=reducer_ops)
def test_append_messages_merges_exactly_like_add_messages(ops):
    ours: list = []
    theirs: list = []
    for step, op in enumerate(ops):
        kind = op[0]
        if kind == "add":
            ids = [str(uuid.uuid4()) if op[2] else None for _ in range(op[1])]
            ours = append_messages(ours, [HumanMessage(f"m{step}.{i}", id=ids[i]) for i in range(op[1])])
            theirs = add_messages(theirs, [HumanMessage(f"m{step}.{i}", id=ids[i]) for i in range(op[1])])
        elif kind in ("replace", "remove") and theirs:
            index = op[1] % len(theirs)
            if kind == "replace":
                ours = append_messages(ours, [AIMessage(f"r{step}", id=ours[index].id)])
                theirs = add_messages(theirs, [AIMessage(f"r{step}", id=theirs[index].id)])
            else:
                ours = append_messages(ours, [RemoveMessage(id=ours[index].id)])
                theirs = add_messages(theirs, [RemoveMessage(id=theirs[index].id)])
        elif kind == "remove_all":
            ours = append_messages(ours, [RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage(f"again {step}")])
            theirs = add_messages(theirs, [RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage(f"again {step}")])
        # Generated ids differ between the two runs; everything else must be equal.
        assert [(m.type, m.text) for m in ours] == [(m.type, m.text) for m in theirs]
        assert len({m.id for m in ours}) == len(ours)
        known = getattr(ours, "ids", None)  # the ids a MessageList remembers are exactly its messages' ids
        assert known is None or (known.isdisjoint(frozenset({"absent"})) and not any(known.isdisjoint({m.id}) for m in ours))


def test_a_message_list_changed_in_place_forgets_its_ids():
    merged = append_messages([HumanMessage("a", id="1")], [HumanMessage("b", id="2")])
    assert merged.ids is not None
    merged.append(HumanMessage("c", id="3"))
    assert merged.ids is None
    # The next merge reads the ids again, so a replacement is not mistaken for an append.
    again = append_messages(merged, [HumanMessage("C", id="3")])
    assert [m.text for m in again] == ["a", "b", "C"]
