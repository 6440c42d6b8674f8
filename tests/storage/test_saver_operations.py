"""The saver's own thread operations on the agent's threads (message deltas, thread records), on Postgres
and SQLite: `prune`, `delete_thread`, `copy_thread`, `delete_for_runs`; the metadata summary's layout
(under one key, smaller than the flat layout it replaced, which is still read); delta-channel history.

A cold read is made by a second agent on the same store, whose message cache is empty, so each message
list is rebuilt from the stored deltas.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, MessagesState, StateGraph

from agent.errors import InvalidRequest, ThreadBusy, ThreadExists, ThreadNotFound
from agent.storage import deltas, summaries
from agent.storage.postgres import PostgresThreadStorage
from tests.helpers.claims import other_replica_holds
from tests.helpers.scenario import outputs, run_trip, say


def conversation(agent, thread_id: str, checkpoint_id: str | None = None) -> list[tuple[str, str]]:
    messages = agent.get_checkpoint_state(thread_id, checkpoint_id)["messages"]
    assert messages
    return [(m["role"], str(m["content"])) for m in messages]


def history_ids(agent, thread_id: str) -> list[str]:
    return [entry["checkpoint_id"] for entry in agent.get_checkpoint_history(thread_id)]


def stored_metadata(storage, thread_id: str) -> dict[str, dict]:
    """Checkpoint id -> metadata as stored (root namespace)."""
    if isinstance(storage, PostgresThreadStorage):
        with storage.pool.connection() as conn:
            rows = conn.execute(
                "SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''", (thread_id,)
            ).fetchall()
        return {row["checkpoint_id"]: row["metadata"] for row in rows}
    rows = storage.saver.conn.execute(
        "SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''", (thread_id,)
    ).fetchall()
    return {cid: json.loads(meta) for cid, meta in rows}


def rewrite_metadata(storage, thread_id: str, new: dict[str, dict]) -> None:
    if isinstance(storage, PostgresThreadStorage):
        from psycopg.types.json import Jsonb

        with storage.pool.connection() as conn:
            for cid, metadata in new.items():
                conn.execute(
                    "UPDATE checkpoints SET metadata = %s WHERE thread_id = %s AND checkpoint_id = %s",
                    (Jsonb(metadata), thread_id, cid),
                )
        return
    for cid, metadata in new.items():
        storage.saver.conn.execute(
            "UPDATE checkpoints SET metadata = ? WHERE thread_id = ? AND checkpoint_id = ?",
            (json.dumps(metadata).encode(), thread_id, cid),
        )


def flat_layout(metadata: dict) -> dict:
    """The layout checkpoints were stored in before SUMMARY_KEY: the summary fields beside LangGraph's keys."""
    return {**summaries.caller_metadata(metadata), **summaries.unpack(metadata)}


def branched_trip(agent) -> dict:
    """The trip, a branch from turn 1 (New York), and the head switched back to turn 3 (not the newest)."""
    ids = run_trip(agent)
    other = say(agent, "I'm headed to New York!", thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    agent.set_head(ids["thread_id"], ids["after_turn3"])
    return {**ids, "new_york": outputs(other)["checkpoint_id"]}


# -- prune ---------------------------------------------------------------------------------------
def test_prune_keep_latest_keeps_the_head_whole_and_the_thread_goes_on(backend_url, make_agent):
    agent = make_agent(backend_url)
    ids = branched_trip(agent)
    before = conversation(agent, ids["thread_id"])
    agent.storage.saver.prune([ids["thread_id"]], strategy="keep_latest")

    cold = make_agent(backend_url)
    # The head, not LangGraph's "latest" (the New York leaf is newer): the thread record still points at it.
    assert history_ids(cold, ids["thread_id"]) == [ids["after_turn3"]]
    assert conversation(cold, ids["thread_id"]) == before
    assert agent.get_checkpoint_history(ids["thread_id"])[0]["message_count"] == len(before)
    reply = say(cold, "And after that?", thread_id=ids["thread_id"])
    assert outputs(reply)["parent_checkpoint_id"] == ids["after_turn3"]
    assert conversation(make_agent(backend_url), ids["thread_id"])[: len(before)] == before


def test_prune_delete_removes_the_threads_and_their_records(backend_url, make_agent):
    agent = make_agent(backend_url)
    kept, gone = run_trip(agent), run_trip(agent)
    asyncio.run(agent.storage.saver.aprune([gone["thread_id"]], strategy="delete"))
    with pytest.raises(ThreadNotFound):
        agent.get_thread(gone["thread_id"])
    assert agent.storage.saver.get_tuple({"configurable": {"thread_id": gone["thread_id"], "checkpoint_ns": ""}}) is None
    assert len(history_ids(agent, kept["thread_id"])) == 4


def test_bad_prune_arguments_are_refused_before_anything_is_written(backend_url, make_agent):
    agent = make_agent(backend_url)
    ids = run_trip(agent)
    with pytest.raises(InvalidRequest):
        agent.storage.saver.prune(ids["thread_id"])  # one string, not a list of ids
    with pytest.raises(InvalidRequest):
        agent.storage.saver.prune([ids["thread_id"]], strategy="keep_everything")
    with pytest.raises(InvalidRequest):
        agent.storage.saver.delete_for_runs("run-1")
    assert len(history_ids(agent, ids["thread_id"])) == 4


def test_a_thread_a_turn_holds_is_neither_pruned_nor_deleted(backend_url, make_agent):
    agent = make_agent(backend_url)
    busy, other = run_trip(agent), run_trip(agent)
    with other_replica_holds(backend_url, busy["thread_id"]):
        with pytest.raises(ThreadBusy):
            agent.storage.saver.prune([other["thread_id"], busy["thread_id"]], strategy="keep_latest")
        with pytest.raises(ThreadBusy):
            asyncio.run(agent.storage.saver.adelete_thread(busy["thread_id"]))
    # One transaction: the free thread listed first was not pruned either.
    assert len(history_ids(agent, other["thread_id"])) == 4
    assert len(history_ids(agent, busy["thread_id"])) == 4


# -- delete_thread and copy_thread -----------------------------------------------------------------
def test_delete_thread_removes_every_row_and_the_record(backend_url, make_agent):
    agent = make_agent(backend_url)
    ids = branched_trip(agent)
    agent.storage.saver.delete_thread(ids["thread_id"])
    with pytest.raises(ThreadNotFound):
        agent.get_thread(ids["thread_id"])
    assert stored_metadata(agent.storage, ids["thread_id"]) == {}
    assert agent.storage.saver.delete_thread("no-such-thread") is None


def test_copy_thread_copies_the_tree_and_the_record_and_the_copy_diverges_alone(backend_url, make_agent):
    agent = make_agent(backend_url)
    ids = branched_trip(agent)
    source, copy = ids["thread_id"], f"copy-of-{ids['thread_id']}"  # the Postgres database is the session's
    asyncio.run(agent.storage.saver.acopy_thread(source, copy))

    cold = make_agent(backend_url)
    assert history_ids(cold, copy) == history_ids(cold, source)
    assert conversation(cold, copy) == conversation(cold, source)
    assert conversation(cold, copy, ids["new_york"]) == conversation(cold, source, ids["new_york"])
    record = cold.get_thread(copy)
    assert record["checkpoint_id"] == ids["after_turn3"]
    assert record["forked_from"] == {"thread_id": source, "checkpoint_id": ids["after_turn3"]}
    say(cold, "Only in the copy.", thread_id=copy)
    assert len(history_ids(cold, copy)) == len(history_ids(cold, source)) + 1

    with pytest.raises(ThreadExists):
        agent.storage.saver.copy_thread(source, copy)
    with pytest.raises(ThreadNotFound):
        agent.storage.saver.copy_thread("no-such-thread", "another-copy")


# -- delete_for_runs -------------------------------------------------------------------------------
def chat_graph(checkpointer):
    def reply(state: MessagesState) -> dict:
        return {"messages": [AIMessage(f"reply to {state['messages'][-1].text}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=checkpointer)


def test_delete_for_runs_in_the_middle_of_a_thread_leaves_the_later_checkpoints_readable(backend_url, make_agent):
    agent = make_agent(backend_url)
    graph = chat_graph(agent.storage.saver)
    thread = {"configurable": {"thread_id": f"runs-{uuid.uuid4()}"}}
    for run, text in (("run-1", "one"), ("run-2", "two"), ("run-3", "three")):
        graph.invoke({"messages": [HumanMessage(text)]}, {**thread, "metadata": {"run_id": run}})
    before = {s.config["configurable"]["checkpoint_id"]: s for s in graph.get_state_history(thread)}

    agent.storage.saver.delete_for_runs(["run-2"])

    cold = chat_graph(make_agent(backend_url).storage.saver)
    after = list(cold.get_state_history(thread))
    assert {s.metadata["run_id"] for s in after} == {"run-1", "run-3"}
    for snapshot in after:
        old = before[snapshot.config["configurable"]["checkpoint_id"]]
        assert [(m.type, m.text) for m in snapshot.values["messages"]] == [(m.type, m.text) for m in old.values["messages"]]
    # Run 3's first checkpoint hangs from run 1's last one now; the tree has one root.
    ids = {s.config["configurable"]["checkpoint_id"] for s in after}
    parents = [s.parent_config["configurable"]["checkpoint_id"] for s in after if s.parent_config]
    assert set(parents) <= ids and len(parents) == len(after) - 1
    assert cold.invoke({"messages": [HumanMessage("four")]}, thread)["messages"][-1].text == "reply to four"


# -- the summary's layout --------------------------------------------------------------------------
def test_the_summary_is_stored_under_one_key_in_less_space_than_the_flat_layout(backend_url, make_agent):
    agent = make_agent(backend_url)
    ids = run_trip(agent)
    stored = stored_metadata(agent.storage, ids["thread_id"])
    assert all(summaries.SUMMARY_KEY in m and not set(m) & summaries.SUMMARY_FIELDS for m in stored.values())
    new = sum(len(json.dumps(m, separators=(",", ":"))) for m in stored.values())
    old = sum(len(json.dumps(flat_layout(m), separators=(",", ":"))) for m in stored.values())
    assert new < old


def test_checkpoints_stored_in_the_flat_layout_read_as_before(backend_url, make_agent):
    agent = make_agent(backend_url)
    ids = branched_trip(agent)
    thread_id = ids["thread_id"]
    expected = (
        agent.get_checkpoint_history(thread_id),
        agent.get_checkpoint_state(thread_id),
        agent.list_branches(thread_id),
        agent.get_usage(thread_id),
    )
    rewrite_metadata(agent.storage, thread_id, {c: flat_layout(m) for c, m in stored_metadata(agent.storage, thread_id).items()})

    cold = make_agent(backend_url)
    assert (
        cold.get_checkpoint_history(thread_id),
        cold.get_checkpoint_state(thread_id),
        cold.list_branches(thread_id),
        cold.get_usage(thread_id),
    ) == expected
    # A turn on top of an old checkpoint reads its parent's summary (branch usage) from the flat layout.
    say(cold, "One more.", thread_id=thread_id)
    newest = cold.get_checkpoint_history(thread_id)[0]
    assert newest["message_count"] == len(expected[1]["messages"]) + 2
    branch_before = expected[3]["branch_usage"]
    branch_after = cold.get_usage(thread_id, checkpoint_id=newest["checkpoint_id"])["branch_usage"]
    assert branch_before["input_tokens"] > 0  # the offline model reports usage
    assert branch_after["input_tokens"] > branch_before["input_tokens"]
    # keep_latest on an old-layout head keeps its layout and sets kept_messages there.
    cold.storage.saver.prune([thread_id])
    [(only, metadata)] = stored_metadata(cold.storage, thread_id).items()
    assert summaries.unpack(metadata)["kept_messages"] == 0


# -- delta-channel history -----------------------------------------------------------------------
def test_delta_channel_history_is_resolved_and_the_same_sync_and_async(backend_url, make_agent):
    agent = make_agent(backend_url)
    saver = agent.storage.saver
    graph = chat_graph(saver)
    thread = {"configurable": {"thread_id": f"delta-history-{uuid.uuid4()}"}}
    graph.invoke({"messages": [HumanMessage("one")]}, thread)
    graph.invoke({"messages": [HumanMessage("two")]}, thread)
    # A channel stored as None in an ancestor: the seed the two walks disagreed about.
    latest = saver.get_tuple(thread)
    none_config = saver.put(
        latest.config,
        {**latest.checkpoint, "id": str(uuid6()), "channel_values": {**latest.checkpoint["channel_values"], "note": None}},
        {"source": "update", "step": 9, "parents": {}},
        {},
    )
    child = saver.put(none_config, {**latest.checkpoint, "id": str(uuid6())}, {"source": "update", "step": 10, "parents": {}}, {})
    for config in (thread, child):
        sync = saver.get_delta_channel_history(config=config, channels=["messages", "note", "missing"])
        assert asyncio.run(saver.aget_delta_channel_history(config=config, channels=["messages", "note", "missing"])) == sync
        seed = sync["messages"]["seed"]
        assert deltas.is_message_list(seed) and not deltas.is_delta(seed)
        assert "seed" not in sync["missing"]
