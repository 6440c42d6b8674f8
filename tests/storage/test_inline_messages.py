"""A checkpoint's `messages` value in its own row on Postgres (`agent.storage.postgres.inline_messages`).

A turn's messages are stored in the row of the checkpoint that made them, with no blob row; a checkpoint that
names a version it did not make has it from a blob row, so it reads the same once the checkpoint that made it
is gone; rows of the earlier layout (blob rows) read the same and go on.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

import psycopg
from langchain_core.messages import AnyMessage
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


def test_a_checkpoint_naming_messages_it_did_not_make_reads_them_once_their_maker_is_gone(make_agent, pg_server_url):
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
        version = checkpoints[-1]["version"]
        assert checkpoints[-1]["version"] == checkpoints[-2]["version"] and not checkpoints[-1]["held"]
        # Copied from the row that made it (the input's `__start__` value has a blob row of its own).
        assert [b for b in blobs if b["channel"] == "messages"] == [{"channel": "messages", "version": version}]

        # Only the newest checkpoint is kept: the rows that made the messages go, the blob row stays.
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
