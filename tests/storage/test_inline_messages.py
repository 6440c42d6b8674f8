"""A checkpoint's `messages` value in its own row on Postgres (`agent.storage.postgres.inline_messages`).

A turn's messages are stored in the row of its checkpoint, with no blob row, also where the checkpoint did not
make them (a copy, an update of another key); a put that names a version without its value gets a blob row
copied from the row that holds it; each reads the same once the checkpoint that made the version is gone;
rows of the earlier layout (blob rows) read the same and go on.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

import psycopg
from langchain_core.messages import AnyMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from psycopg.rows import dict_row

from agent.models import OfflineChatModel
from tests.helpers.databases import fresh_database
from tests.helpers.scenario import outputs, say
from tests.helpers.stored_values import begun_before_the_upgrade


def rows(url: str, thread_id: str) -> tuple[list[dict], list[dict]]:
    """The thread's checkpoint rows (id, messages version, whether the row holds messages) and blob rows."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        checkpoints = conn.execute(
            "SELECT checkpoint_id, checkpoint -> 'channel_versions' ->> 'messages' AS version,"
            " agent_messages IS NOT NULL AS held FROM checkpoints WHERE thread_id = %s ORDER BY checkpoint_id",
            (thread_id,),
        ).fetchall()
        blobs = conn.execute(
            "SELECT channel, version FROM checkpoint_blobs WHERE thread_id = %s ORDER BY version", (thread_id,)
        ).fetchall()
    return checkpoints, blobs


def test_a_turn_stores_its_messages_in_its_checkpoint_row_and_no_blob_row(pg_url, make_agent):
    agent = make_agent(pg_url)
    first = outputs(say(agent, "I'm headed to SF"))
    thread_id = first["thread_id"]
    say(agent, "calculate 6*7", thread_id=thread_id)  # a tool call: several steps in one turn
    checkpoints, blobs = rows(pg_url, thread_id)
    assert blobs == []
    assert all(row["held"] for row in checkpoints if row["version"] is not None)
    # Read back by a new agent (no cache): the same conversation.
    messages = make_agent(pg_url).graph.get_state({"configurable": {"thread_id": thread_id}}).values["messages"]
    assert [m.type for m in messages][:2] == ["human", "ai"] and "42" in messages[-1].text


class NotedState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    note: str


def noted_graph() -> StateGraph:
    """One node answering with the offline model; the state has a key besides the messages."""

    def answer(state: NotedState) -> dict:
        return {"messages": [OfflineChatModel().invoke(state["messages"])]}

    builder = StateGraph(NotedState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder


def test_a_checkpoint_naming_messages_it_did_not_make_holds_them_and_reads_them_once_their_maker_is_gone(
    make_agent, pg_server_url
):
    with fresh_database(pg_server_url) as url:
        agent = make_agent(url)
        graph = noted_graph().compile(checkpointer=agent.storage.saver)  # LangGraph's API on our saver
        config = {"configurable": {"thread_id": "noted"}}
        graph.invoke({"messages": [("user", "I'm headed to SF")]}, config)
        made = graph.get_state(config)
        graph.update_state(config, {"note": "pack an umbrella"})  # a new checkpoint, the same messages
        noted = graph.get_state(config)
        assert noted.config["configurable"]["checkpoint_id"] != made.config["configurable"]["checkpoint_id"]
        checkpoints, blobs = rows(url, "noted")
        assert checkpoints[-1]["version"] == checkpoints[-2]["version"] and checkpoints[-1]["held"]
        assert [b for b in blobs if b["channel"] == "messages"] == []

        # Only the newest checkpoint is kept: the rows that made the messages go.
        agent.storage.saver.prune(["noted"], strategy="keep_latest")
        checkpoints, blobs = rows(url, "noted")
        assert [row["checkpoint_id"] for row in checkpoints] == [noted.config["configurable"]["checkpoint_id"]]
        fresh = noted_graph().compile(checkpointer=make_agent(url).storage.saver)
        state = fresh.get_state(config)
        assert state.values["note"] == "pack an umbrella"
        assert [m.text for m in state.values["messages"]] == [m.text for m in noted.values["messages"]]
        # And the conversation goes on from it.
        fresh.invoke({"messages": [("user", "And then?")]}, config)
        assert len(fresh.get_state(config).values["messages"]) == 4


def test_a_put_naming_messages_without_their_value_gets_a_blob_row_that_outlives_their_maker(make_agent, pg_server_url):
    # LangGraph's `put` contract: a checkpoint may name a version another one stored, with no value of its own.
    with fresh_database(pg_server_url) as url:
        saver = make_agent(url).storage.saver
        config = {"configurable": {"thread_id": "named", "checkpoint_ns": ""}}
        maker = empty_checkpoint()
        maker["channel_values"] = {"messages": [HumanMessage("I'm headed to SF", id="m1")]}
        maker["channel_versions"] = {"messages": "00001.5"}
        made = saver.put(config, maker, {"source": "input", "step": -1, "parents": {}}, {"messages": "00001.5"})
        naming = empty_checkpoint()
        naming["channel_versions"] = {"messages": "00001.5"}
        named = saver.put(made, naming, {"source": "loop", "step": 0, "parents": {}}, {})
        checkpoints, blobs = rows(url, "named")
        assert [row["held"] for row in checkpoints] == [True, False]
        assert blobs == [{"channel": "messages", "version": "00001.5"}]  # copied from the maker's row

        saver.prune(["named"], strategy="keep_latest")
        assert [row["checkpoint_id"] for row in rows(url, "named")[0]] == [named["configurable"]["checkpoint_id"]]
        values = make_agent(url).storage.saver.get_tuple(named).checkpoint["channel_values"]
        assert [m.text for m in values["messages"]] == ["I'm headed to SF"]


def test_a_thread_begun_in_the_earlier_layout_reads_the_same_and_goes_on_in_the_new_one(pg_url, make_agent):
    agent = make_agent(pg_url)
    first = outputs(say(agent, "I'm headed to SF"))
    thread_id = first["thread_id"]
    say(agent, "And then to New York", thread_id=thread_id)
    before = agent.get_checkpoint_history(thread_id)
    begun_before_the_upgrade(agent, thread_id)
    checkpoints, blobs = rows(pg_url, thread_id)
    assert not any(row["held"] for row in checkpoints) and blobs

    reader = make_agent(pg_url)
    assert reader.get_checkpoint_history(thread_id) == before
    after = outputs(say(reader, "Where am I going?", thread_id=thread_id))
    checkpoints, _ = rows(pg_url, thread_id)
    assert [row["held"] for row in checkpoints if row["checkpoint_id"] == after["checkpoint_id"]] == [True]
    messages = make_agent(pg_url).graph.get_state({"configurable": {"thread_id": thread_id}}).values["messages"]
    assert [m.type for m in messages] == ["human", "ai"] * 3 and "New York" in messages[2].text


def test_a_copy_of_a_checkpoint_keeps_its_messages_and_what_is_built_on_it_after_its_source_goes(make_agent, pg_server_url):
    # LangGraph's `__copy__` puts the source's values and versions with the source's parent as parent, which
    # holds another version of the messages (found by a review of this layout).
    with fresh_database(pg_server_url) as url:
        graph = noted_graph().compile(checkpointer=make_agent(url).storage.saver)
        config = {"configurable": {"thread_id": "copied"}}
        graph.invoke({"messages": [("user", "I'm headed to SF")]}, config)
        source = graph.get_state(config)
        copied = graph.update_state(source.config, None, as_node="__copy__")
        saver = make_agent(url).storage.saver  # another process: nothing cached
        texts = [m.text for m in source.values["messages"]]
        assert [m.text for m in saver.get_tuple(copied).checkpoint["channel_values"]["messages"]] == texts
        after = graph.update_state(copied, {"messages": [("user", "added to the copy")]})
        assert [m.text for m in noted_graph().compile(checkpointer=saver).get_state(after).values["messages"]] == [
            *texts, "added to the copy"
        ]
        saver.prune(["copied"], strategy="keep_latest")
        kept = noted_graph().compile(checkpointer=make_agent(url).storage.saver).get_state(config)
        assert [m.text for m in kept.values["messages"]] == [*texts, "added to the copy"]
