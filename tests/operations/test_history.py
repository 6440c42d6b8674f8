"""Checkpoint history (`get_checkpoint_history` and the `get_checkpoint_history` action), on Postgres and SQLite:
the entry fields, newest-first order across branches, `limit`, paging with `before`, and `next_nodes`
agreeing with LangGraph's own `get_state(...).next` (for the built-in graph, and for graphs with a join edge
or `Send`s)."""

from __future__ import annotations

import operator
from datetime import datetime, timedelta
from typing import Annotated

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Send, interrupt

from agent.graph import call_model
from agent.models import OfflineChatModel
from tests.helpers.scenario import TRIP, outputs, request, run_trip, say, text_of

ENTRY_FIELDS = {
    "checkpoint_id",
    "parent_checkpoint_id",
    "thread_id",
    "timestamp",
    "next_nodes",
    "message_count",
    "last_message",
    "last_user_message",
    "source",
    "step",
    "is_head",
}
#: What a turn's entry adds (what the model was sent and the tokens used); a state update keeps only
#: the branch's running total (docs/context-window.md).
TURN_FIELDS = {"model_input_messages", "model_input_tokens", "summary_used", "usage", "branch_usage"}


def state_of(agent, thread_id: str, checkpoint_id: str):
    """LangGraph's own view of one checkpoint (a StateSnapshot)."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    return agent.graph.get_state(config)


def full_history(agent, thread_id: str) -> list[dict]:
    return agent.get_checkpoint_history(thread_id, limit=1000)


def branched_thread(agent) -> dict:
    """The trip, a New York branch from turn 1 (two turns), a state update with a dangling tool call
    on the SF branch, and one more turn on top. Returns the ids of every checkpoint, by name."""
    ids = run_trip(agent)
    thread_id = ids["thread_id"]
    ny = say(agent, "I'm headed to New York!", thread_id=thread_id, checkpoint_id=ids["after_turn1"])
    ny_answer = say(agent, "Where am I going?", thread_id=thread_id)
    call = {
        "type": "function_call",
        "call_id": "call_history_test",
        "name": "calculator",
        "arguments": '{"expression": "6*7"}',
    }
    dangling = agent.update_checkpoint_state(thread_id, ids["after_turn3"], [call])
    last = say(agent, "Never mind the sum, where was I going?", thread_id=thread_id)
    return {
        **ids,
        "ny": outputs(ny)["checkpoint_id"],
        "ny_answer": outputs(ny_answer)["checkpoint_id"],
        "dangling": dangling["checkpoint_id"],
        "last": outputs(last)["checkpoint_id"],
    }


def test_every_entry_has_exactly_the_documented_fields_with_their_types(agent):
    ids = branched_thread(agent)
    history = full_history(agent, ids["thread_id"])
    assert len(history) == 8  # the root and seven turns or updates
    root = history.pop()
    assert (root["checkpoint_id"], root["parent_checkpoint_id"]) == (ids["root"], None)
    assert (root["source"], root["message_count"], root["next_nodes"], root["is_head"]) == ("root", 0, [], False)
    assert [entry["is_head"] for entry in history] == [True] + [False] * 6
    for entry in history:
        assert set(entry) == ENTRY_FIELDS | (TURN_FIELDS if entry["source"] == "loop" else {"branch_usage"})
        assert isinstance(entry["checkpoint_id"], str) and entry["checkpoint_id"]
        assert entry["parent_checkpoint_id"] is None or isinstance(entry["parent_checkpoint_id"], str)
        assert entry["thread_id"] == ids["thread_id"]
        assert datetime.fromisoformat(entry["timestamp"]).utcoffset() == timedelta(0)
        assert isinstance(entry["next_nodes"], list)
        assert isinstance(entry["message_count"], int) and entry["message_count"] >= 2
        assert isinstance(entry["last_message"], str) and 0 < len(entry["last_message"]) <= 100
        assert isinstance(entry["last_user_message"], str) and 0 < len(entry["last_user_message"]) <= 100
        assert entry["source"] in ("loop", "update")
        assert isinstance(entry["step"], int)


def test_entries_summarize_the_checkpoint_they_name(agent):
    ids = branched_thread(agent)
    for entry in full_history(agent, ids["thread_id"]):
        state = state_of(agent, ids["thread_id"], entry["checkpoint_id"])
        messages = state.values["messages"]
        assert entry["message_count"] == len(messages)
        last = messages[-1] if messages else None
        # A message that only calls tools has no text: its preview names the tools (storage.summaries).
        calls = getattr(last, "tool_calls", None) if last is not None and not last.text else None
        expected = "[tool call: " + ", ".join(c["name"] for c in calls) + "]" if calls else (last.text if last else "")
        assert entry["last_message"] == expected[:100]
        users = [m for m in messages if m.type == "human"]
        assert entry["last_user_message"] == (users[-1].text[:100] if users else "")
        assert entry["parent_checkpoint_id"] == (
            state.parent_config["configurable"]["checkpoint_id"] if state.parent_config else None
        )
        assert entry["step"] == state.metadata["step"]
        assert entry["source"] == state.metadata["source"]


def test_last_message_is_the_first_100_characters_of_a_long_reply(agent):
    ids = run_trip(agent)
    head = agent.get_checkpoint_history(ids["thread_id"], limit=1)[0]
    assert len(ids["answer"]) > 100
    assert head["last_message"] == ids["answer"][:100]


def test_timestamps_follow_the_order_of_the_turns(agent):
    ids = run_trip(agent)
    stamps = [datetime.fromisoformat(e["timestamp"]) for e in full_history(agent, ids["thread_id"])]
    assert stamps == sorted(stamps, reverse=True)


def test_entry_after_turn_one_has_two_messages_and_nothing_left_to_run(agent):
    ids = run_trip(agent)
    history = full_history(agent, ids["thread_id"])
    first = next(e for e in history if e["checkpoint_id"] == ids["after_turn1"])
    assert first["message_count"] == 2
    assert first["next_nodes"] == []
    assert first["parent_checkpoint_id"] == ids["root"]
    assert first["source"] == "loop"
    assert first["last_message"].startswith("[offline model]")
    assert first["last_user_message"] == TRIP[0]
    # The root, then one checkpoint per turn, each a child of the one before.
    assert [e["checkpoint_id"] for e in history] == [ids["after_turn3"], ids["after_turn2"], ids["after_turn1"], ids["root"]]
    assert [e["parent_checkpoint_id"] for e in history] == [ids["after_turn2"], ids["after_turn1"], ids["root"], None]
    assert [e["message_count"] for e in history] == [6, 4, 2, 0]


def test_history_is_newest_first_with_branches_interleaved(agent):
    ids = branched_thread(agent)
    history = full_history(agent, ids["thread_id"])
    listed = [e["checkpoint_id"] for e in history]
    # Ids are time-ordered: strictly descending means newest first and no duplicates.
    assert all(newer > older for newer, older in zip(listed, listed[1:]))
    # Both branches, in creation order (newest first), not grouped by branch.
    assert listed == [
        ids["last"],
        ids["dangling"],
        ids["ny_answer"],
        ids["ny"],
        ids["after_turn3"],
        ids["after_turn2"],
        ids["after_turn1"],
        ids["root"],
    ]
    parents = {e["checkpoint_id"]: e["parent_checkpoint_id"] for e in history}
    assert parents[ids["ny"]] == ids["after_turn1"]
    assert parents[ids["ny_answer"]] == ids["ny"]
    assert parents[ids["dangling"]] == ids["after_turn3"]
    assert parents[ids["last"]] == ids["dangling"]
    sources = {e["checkpoint_id"]: e["source"] for e in history}
    assert sources[ids["dangling"]] == "update"
    assert sources[ids["last"]] == "loop"


def test_history_lists_only_the_threads_own_checkpoints(agent):
    mine = run_trip(agent)
    other = run_trip(agent)
    listed = {e["checkpoint_id"] for e in full_history(agent, mine["thread_id"])}
    assert listed == {mine["root"], mine["after_turn1"], mine["after_turn2"], mine["after_turn3"]}
    assert not listed & {other["root"], other["after_turn1"], other["after_turn2"], other["after_turn3"]}


def test_limit_returns_that_many_newest_entries(agent):
    ids = branched_thread(agent)
    everything = full_history(agent, ids["thread_id"])
    for limit in (1, 2, 3, 7, 50):
        page = agent.get_checkpoint_history(ids["thread_id"], limit=limit)
        assert page == everything[:limit]
    assert agent.get_checkpoint_history(ids["thread_id"], limit=1)[0]["checkpoint_id"] == ids["last"]


def test_default_limit_is_ten(agent):
    thread_id = None
    for n in range(12):
        thread_id = outputs(say(agent, f"message {n}", thread_id=thread_id))["thread_id"]
    assert len(agent.get_checkpoint_history(thread_id)) == 10
    assert len(full_history(agent, thread_id)) == 13  # the root and 12 turns


def test_before_pages_backwards_without_gaps_or_overlaps(agent):
    ids = branched_thread(agent)
    everything = full_history(agent, ids["thread_id"])
    for page_size in (1, 2, 3):
        walked: list[dict] = []
        before = None
        while True:
            page = agent.get_checkpoint_history(ids["thread_id"], limit=page_size, before=before)
            assert len(page) <= page_size
            if not page:
                break
            if before is not None:
                assert all(e["checkpoint_id"] < before for e in page)
            walked.extend(page)
            before = page[-1]["checkpoint_id"]
        assert walked == everything


def test_before_the_oldest_checkpoint_is_an_empty_page(agent):
    ids = run_trip(agent)
    assert [e["checkpoint_id"] for e in agent.get_checkpoint_history(ids["thread_id"], before=ids["after_turn1"])] == [
        ids["root"]
    ]
    assert agent.get_checkpoint_history(ids["thread_id"], before=ids["root"]) == []


def test_history_action_matches_the_python_api(agent):
    ids = branched_thread(agent)
    thread_id = ids["thread_id"]
    expected = agent.get_checkpoint_history(thread_id, limit=3, before=ids["dangling"])
    body = request(action="get_checkpoint_history", thread_id=thread_id, limit=3, before=ids["dangling"])
    response = agent.predict(body)
    assert response.output == []
    assert outputs(response) == {"thread_id": thread_id, "history": expected}
    assert [e["checkpoint_id"] for e in expected] == [ids["ny_answer"], ids["ny"], ids["after_turn3"]]
    # Without limit/before: the ten newest.
    default = outputs(agent.predict(request(action="get_checkpoint_history", thread_id=thread_id)))
    assert default["history"] == full_history(agent, thread_id)[:10]


def test_next_nodes_equal_langgraph_next_for_every_checkpoint(agent):
    ids = branched_thread(agent)
    thread_id = ids["thread_id"]
    # A plain user message written by a state update, too.
    agent.update_checkpoint_state(thread_id, ids["ny"], [{"role": "user", "content": "Or maybe Boston?"}])
    history = full_history(agent, thread_id)
    assert len(history) == 9  # the root, seven, and the update
    for entry in history:
        assert entry["next_nodes"] == list(state_of(agent, thread_id, entry["checkpoint_id"]).next)


class ForkJoinState(MessagesState):
    answers: Annotated[list[str], operator.add]


def fork_join_graph(*, ask: bool = False, send: bool = False) -> StateGraph:
    """`agent`, then `left` and `right` in one superstep, then `gate` once both are done (a join edge,
    `add_edge(["left", "right"], "gate")`, which LangGraph runs through a barrier channel); with `ask`,
    `left` and `right` each ask a question (`interrupt`); with `send`, `agent` sends two tasks to `left`
    instead (`Send`), and `gate` follows `left` alone."""
    model = OfflineChatModel()

    def agent_node(state: ForkJoinState, config: RunnableConfig) -> dict:
        return call_model(model, state, config)

    def branch(name: str):
        def node(state: ForkJoinState) -> dict:
            return {"answers": [str(interrupt(f"{name}?")) if ask else name]}

        return node

    builder = StateGraph(ForkJoinState)
    builder.add_node("agent", agent_node)
    builder.add_node("left", branch("left"))
    builder.add_node("right", branch("right"))
    builder.add_node("gate", lambda state: {"answers": ["gate"]})
    builder.add_edge(START, "agent")
    if send:
        builder.add_conditional_edges("agent", lambda state: [Send("left", state), Send("left", state)], ["left"])
        builder.add_edge("left", "gate")
    else:
        builder.add_edge("agent", "left")
        builder.add_edge("agent", "right")
        builder.add_edge(["left", "right"], "gate")
    builder.add_edge("gate", END)
    return builder


def assert_next_nodes_are_langgraph_next(agent, thread_id: str) -> None:
    history = full_history(agent, thread_id)
    assert [(e["checkpoint_id"], e["next_nodes"]) for e in history] == [
        (e["checkpoint_id"], list(state_of(agent, thread_id, e["checkpoint_id"]).next)) for e in history
    ]
    head = agent.get_checkpoint_state(thread_id)
    assert head["next_nodes"] == list(agent.graph.get_state({"configurable": {"thread_id": thread_id}}).next)


def test_a_finished_turn_of_a_graph_with_a_join_edge_waits_for_nothing(backend_url, make_agent):
    # LangGraph's barrier channel moves its version when `gate` consumes it, so a rule that only compares
    # versions listed `gate` as waiting on every finished turn.
    agent = make_agent(backend_url, graph=fork_join_graph())
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    say(agent, "again", thread_id=thread_id)
    assert agent.get_checkpoint_state(thread_id)["next_nodes"] == []
    assert_next_nodes_are_langgraph_next(agent, thread_id)


def test_answering_two_parallel_questions_before_a_join_leaves_nothing_waiting(backend_url, make_agent):
    agent = make_agent(backend_url, graph=fork_join_graph(ask=True))
    asked = outputs(say(agent, "hello"))
    thread_id = asked["thread_id"]
    assert agent.get_checkpoint_state(thread_id)["next_nodes"] == ["left", "right"]
    answers = {question["id"]: question["value"].replace("?", "!") for question in asked["interrupts"]}
    agent.predict(request(None, thread_id=thread_id, resume=answers))
    assert agent.graph.get_state({"configurable": {"thread_id": thread_id}}).values["answers"][-1] == "gate"
    assert agent.get_checkpoint_state(thread_id)["next_nodes"] == []
    assert_next_nodes_are_langgraph_next(agent, thread_id)
    say(agent, "next", thread_id=thread_id)  # asks both questions again
    assert_next_nodes_are_langgraph_next(agent, thread_id)


def test_tasks_sent_to_a_node_are_listed_as_waiting(backend_url, make_agent):
    agent = make_agent(backend_url, graph=fork_join_graph(ask=True, send=True))
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    assert agent.get_checkpoint_state(thread_id)["next_nodes"] == ["left", "left"]
    assert_next_nodes_are_langgraph_next(agent, thread_id)


def test_assistant_tool_call_without_result_has_tools_next(agent):
    ids = run_trip(agent)
    call = {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": '{"expression": "1+1"}'}
    updated = agent.update_checkpoint_state(ids["thread_id"], ids["after_turn1"], [call])
    head = agent.get_checkpoint_history(ids["thread_id"], limit=1)[0]
    assert head["checkpoint_id"] == updated["checkpoint_id"]
    assert head["next_nodes"] == ["tools"]
    assert list(state_of(agent, ids["thread_id"], updated["checkpoint_id"]).next) == ["tools"]
    assert head["message_count"] == 3
    assert head["source"] == "update"
    assert head["parent_checkpoint_id"] == ids["after_turn1"]


def test_turn_after_a_dangling_tool_call_finishes_with_nothing_next(agent):
    ids = branched_thread(agent)
    head = agent.get_checkpoint_history(ids["thread_id"], limit=1)[0]
    assert head["checkpoint_id"] == ids["last"]
    assert head["next_nodes"] == []
    # The dangling call stays in the stored state; the turn added the user message and a reply.
    assert head["message_count"] == 9
    reply = text_of(say(agent, "And now?", thread_id=ids["thread_id"]))
    assert "SF" in reply and TRIP[0] in reply
