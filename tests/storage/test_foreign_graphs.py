"""Graphs that are not the agent's, compiled directly with our savers (outside the turn protocol), give the
same results as with LangGraph's `InMemorySaver`: history, time travel (a run from an earlier checkpoint,
`update_state` then a run), interrupts and `Command(resume=...)`, subgraphs (checkpoint_ns), custom state
keys (a `messages` channel that is not a list of LangChain messages among them) and the metadata keys the
caller wrote, whatever their names.

Each scenario runs once on `InMemorySaver` and once on our saver with the same deterministic nodes; what
is compared is normalised (`observe`): checkpoint ids become positions in the history, messages become
(type, text), message ids are dropped. Our summary key (`summaries.SUMMARY_KEY`) is the one metadata key
ours adds.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Interrupt, interrupt
from typing_extensions import TypedDict

from agent.config import AgentSettings
from agent.storage import open_storage, summaries
from tests.helpers.databases import fresh_database

#: Metadata a caller puts on its runs: named like the summary fields the agent stores, on purpose.
CALLER_METADATA = {"message_count": "caller's own", "ts": "caller-ts", "kept_messages": "kept by caller", "team": "a"}


@pytest.fixture(params=["postgres", "sqlite", "memory"])
def our_saver(request, pg_server_url, tmp_path) -> Iterator[Any]:
    """One of our savers on a fresh store, used directly as a LangGraph checkpointer."""
    if request.param == "postgres":
        with fresh_database(pg_server_url) as url:
            storage = open_storage(url, AgentSettings(model="offline"))
            yield storage.saver
            storage.close()
        return
    url = f"sqlite:///{tmp_path / 'foreign.sqlite'}" if request.param == "sqlite" else "memory://"
    storage = open_storage(url, AgentSettings(model="offline"))
    yield storage.saver
    storage.close()


# -- normalising ---------------------------------------------------------------------------------
def _value(value: Any) -> Any:
    if isinstance(value, BaseMessage):
        return (value.type, value.text)
    if isinstance(value, Interrupt):  # its id is derived from the checkpoint's
        return ("interrupt", _value(value.value))
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    return value


def _checkpoint_id(config) -> str | None:
    return (config or {}).get("configurable", {}).get("checkpoint_id")


def observe(graph, config, *, subgraphs: bool = False) -> list[dict]:
    """The thread's whole history (newest first, as LangGraph lists it), ids replaced by positions."""
    history = list(graph.get_state_history(config))
    position = {_checkpoint_id(s.config): i for i, s in enumerate(history)}
    seen = []
    for snapshot in history:
        metadata = {k: v for k, v in (snapshot.metadata or {}).items() if k != summaries.SUMMARY_KEY}
        metadata["parents"] = sorted((metadata.get("parents") or {}).keys())
        seen.append(
            {
                "values": _value(snapshot.values),
                "next": snapshot.next,
                "metadata": metadata,
                "parent": position.get(_checkpoint_id(snapshot.parent_config)),
                "tasks": [(t.name, [_value(i.value) for i in t.interrupts], t.error is not None) for t in snapshot.tasks],
                "interrupts": [_value(i.value) for i in snapshot.interrupts],
            }
        )
    if subgraphs:
        state = graph.get_state(config, subgraphs=True)
        seen.append(
            {
                "subgraph_states": [
                    (t.name, _value(t.state.values), t.state.next, [_value(i.value) for i in t.state.interrupts])
                    for t in state.tasks
                    if t.state is not None and hasattr(t.state, "values")
                ]
            }
        )
    return seen


def at(graph, config, index: int) -> dict:
    """The config of the history entry at `index` (as `observe` numbers them)."""
    return list(graph.get_state_history(config))[index].config


def same_on_both(scenario: Callable[[Any], list], saver) -> list:
    """Run `scenario` on InMemorySaver and on `saver`; they must observe the same; returns what was observed."""
    expected = scenario(InMemorySaver())
    assert scenario(saver) == expected
    return expected


# -- graphs --------------------------------------------------------------------------------------
def reply(state: MessagesState) -> dict:
    last = state["messages"][-1].text
    return {"messages": [AIMessage(f"echo {last} ({len(state['messages'])} before)")]}


def chat_graph(checkpointer):
    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=checkpointer)


class Custom(TypedDict):
    messages: Annotated[list[str], operator.add]  # named like the agent's channel, but plain strings
    count: int
    notes: dict


def custom_graph(checkpointer):
    def step(state: Custom) -> dict:
        count = state.get("count", 0) + 1
        return {"messages": [f"step {count}"], "count": count, "notes": {**state.get("notes", {}), str(count): count * count}}

    builder = StateGraph(Custom)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["count"] < 3 else END)
    return builder.compile(checkpointer=checkpointer)


def approval_graph(checkpointer):
    def draft(state: MessagesState) -> dict:
        return {"messages": [AIMessage("draft: " + state["messages"][-1].text)]}

    def approve(state: MessagesState) -> dict:
        answer = interrupt({"question": "send it?", "draft": state["messages"][-1].text})
        return {"messages": [AIMessage(f"sent ({answer})")]}

    builder = StateGraph(MessagesState)
    builder.add_node("draft", draft)
    builder.add_node("approve", approve)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "approve")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=checkpointer)


def parallel_interrupts_graph(checkpointer):
    def ask(name: str):
        def node(state: MessagesState) -> dict:
            return {"messages": [AIMessage(f"{name}: {interrupt(name)}")]}

        return node

    builder = StateGraph(MessagesState)
    builder.add_node("left", ask("left"))
    builder.add_node("right", ask("right"))
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")
    return builder.compile(checkpointer=checkpointer)


def subgraph_graph(checkpointer):
    def ask(state: MessagesState) -> dict:
        return {"messages": [AIMessage(f"inner got {interrupt('inner question')}")]}

    def answer(state: MessagesState) -> dict:
        return {"messages": [AIMessage(f"inner answer after {len(state['messages'])}")]}

    inner = StateGraph(MessagesState)
    inner.add_node("ask", ask)
    inner.add_node("answer", answer)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", "answer")

    outer = StateGraph(MessagesState)
    outer.add_node("prepare", lambda s: {"messages": [AIMessage("prepared")]})
    outer.add_node("inner", inner.compile())
    outer.add_node("finish", lambda s: {"messages": [AIMessage(f"finished with {len(s['messages'])}")]})
    outer.add_edge(START, "prepare")
    outer.add_edge("prepare", "inner")
    outer.add_edge("inner", "finish")
    return outer.compile(checkpointer=checkpointer)


# -- scenarios -----------------------------------------------------------------------------------
def test_a_plain_messages_graph_runs_lists_and_travels_in_time_as_on_langgraphs_saver(our_saver):
    def scenario(checkpointer):
        graph = chat_graph(checkpointer)
        config = {"configurable": {"thread_id": "plain"}, "metadata": CALLER_METADATA}
        seen = [_value(graph.invoke({"messages": [HumanMessage("hi")]}, config))]
        seen.append(_value(graph.invoke({"messages": [HumanMessage("again")]}, config)))
        # Time travel: a run from the checkpoint after the first turn; the other branch stays.
        first_turn = at(graph, config, 3)
        seen.append(_value(graph.invoke({"messages": [HumanMessage("instead")]}, {**first_turn, "metadata": CALLER_METADATA})))
        # update_state at an earlier checkpoint, then continue from what it wrote.
        updated = graph.update_state(at(graph, config, 5), {"messages": [HumanMessage("edited")]}, as_node="__start__")
        seen.append(_value(graph.invoke(None, updated)))
        seen.append(observe(graph, {"configurable": {"thread_id": "plain"}}))
        return seen

    seen = same_on_both(scenario, our_saver)
    history = seen[-1]
    assert seen[0]["messages"] == [("human", "hi"), ("ai", "echo hi (1 before)")]
    assert len(seen[1]["messages"]) == 4 and len(seen[2]["messages"]) == 4
    assert seen[2]["messages"][2:] == [("human", "instead"), ("ai", "echo instead (3 before)")]
    # Three leaves hang from one tree: parents point inside the history.
    assert sum(1 for entry in history if entry["parent"] is None) == 1
    # The runs given CALLER_METADATA recorded it whole on every checkpoint they wrote.
    tagged = [entry["metadata"] for entry in history if "team" in entry["metadata"]]
    assert len(tagged) >= 6
    assert all({k: metadata[k] for k in CALLER_METADATA} == CALLER_METADATA for metadata in tagged)


def test_caller_metadata_named_like_our_summary_fields_is_kept(our_saver):
    graph = chat_graph(our_saver)
    config = {"configurable": {"thread_id": "meta"}}
    graph.invoke({"messages": [HumanMessage("hi")]}, config)
    graph.update_state(config, {"messages": [AIMessage("noted")]}, as_node="reply")
    latest = our_saver.get_tuple(config)
    # Written by the caller straight into put: every key survives, next to our own one.
    written = our_saver.put(
        latest.config,
        {**latest.checkpoint, "id": str(uuid6())},
        {**CALLER_METADATA, "source": "update", "step": 9, "parents": {}},
        {},
    )
    stored = our_saver.get_tuple(written).metadata
    assert {k: stored[k] for k in CALLER_METADATA} == CALLER_METADATA
    assert set(stored) == {*CALLER_METADATA, "source", "step", "parents", summaries.SUMMARY_KEY}
    assert summaries.unpack(stored)["message_count"] == 3


def test_custom_state_keys_and_a_messages_channel_of_strings_round_trip(our_saver):
    def scenario(checkpointer):
        graph = custom_graph(checkpointer)
        config = {"configurable": {"thread_id": "custom"}}
        seen = [graph.invoke({"messages": ["start"], "count": 0, "notes": {}}, config)]
        seen.append(graph.invoke({"messages": ["more"], "count": 1}, {**at(graph, config, 2), "metadata": {"ts": "x"}}))
        seen.append(observe(graph, config))
        return seen

    seen = same_on_both(scenario, our_saver)
    assert seen[0] == {"messages": ["start", "step 1", "step 2", "step 3"], "count": 3, "notes": {"1": 1, "2": 4, "3": 9}}


def test_an_interrupt_stops_the_run_and_command_resume_continues_it(our_saver):
    def scenario(checkpointer):
        graph = approval_graph(checkpointer)
        config = {"configurable": {"thread_id": "approval"}}
        seen = [_value(graph.invoke({"messages": [HumanMessage("an email")]}, config))]
        state = graph.get_state(config)
        seen.append((state.next, [_value(i.value) for i in state.interrupts]))
        seen.append(_value(graph.invoke(Command(resume="yes"), config)))
        # Resume again from the interrupted checkpoint: LangGraph replays the answer stored there as a
        # pending write (the first resume's), so the pending writes must have been kept.
        interrupted = next(s.config for s in graph.get_state_history(config) if s.next == ("approve",))
        seen.append(_value(graph.invoke(Command(resume="no"), interrupted)))
        seen.append(observe(graph, config))
        return seen

    seen = same_on_both(scenario, our_saver)
    assert seen[1] == (("approve",), [{"question": "send it?", "draft": "draft: an email"}])
    assert seen[2]["messages"][-1] == ("ai", "sent (yes)")
    assert seen[3]["messages"][-1] == ("ai", "sent (yes)")


def test_parallel_interrupts_resume_by_id(our_saver):
    def scenario(checkpointer):
        graph = parallel_interrupts_graph(checkpointer)
        config = {"configurable": {"thread_id": "parallel"}}
        graph.invoke({"messages": [HumanMessage("go")]}, config)
        state = graph.get_state(config)
        answers = {i.id: f"answer to {i.value}" for i in state.interrupts}
        seen = [sorted(_value(i.value) for i in state.interrupts), state.next]
        seen.append(_value(graph.invoke(Command(resume=answers), config)))
        seen.append(observe(graph, config))
        return seen

    seen = same_on_both(scenario, our_saver)
    assert seen[0] == ["left", "right"]
    assert sorted(seen[2]["messages"][1:]) == [("ai", "left: answer to left"), ("ai", "right: answer to right")]


def test_a_subgraph_interrupt_is_kept_in_its_namespace_and_resumed(our_saver):
    def scenario(checkpointer):
        graph = subgraph_graph(checkpointer)
        config = {"configurable": {"thread_id": "subgraph"}}
        graph.invoke({"messages": [HumanMessage("start")]}, config)
        seen = [observe(graph, config, subgraphs=True)]
        seen.append(_value(graph.invoke(Command(resume="42"), config)))
        seen.append(observe(graph, config))
        return seen

    seen = same_on_both(scenario, our_saver)
    [(name, values, waiting, interrupts)] = seen[0][-1]["subgraph_states"]
    assert (name, waiting, interrupts) == ("inner", ("ask",), ["inner question"])
    assert values["messages"] == [("human", "start"), ("ai", "prepared")]
    assert seen[1]["messages"][-3:] == [("ai", "inner got 42"), ("ai", "inner answer after 3"), ("ai", "finished with 4")]


def test_async_runs_match_sync_ones(our_saver):
    import asyncio

    async def arun(checkpointer):
        graph = approval_graph(checkpointer)
        config = {"configurable": {"thread_id": "async"}}
        await graph.ainvoke({"messages": [HumanMessage("async email")]}, config)
        final = await graph.ainvoke(Command(resume="ok"), config)
        return _value(final), [(_value(s.values), s.next) async for s in graph.aget_state_history(config)]

    expected = asyncio.run(arun(InMemorySaver()))
    assert asyncio.run(arun(our_saver)) == expected
