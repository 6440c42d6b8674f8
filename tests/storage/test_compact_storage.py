"""Threads stored in the earlier layout read the same after the upgrade to the compact one, and go on.

The compact layout (`agent.storage.deltas` "Compact records", `agent.storage.saver` "Short channel
versions", `agent.storage.postgres.saver` "Compact rows", the dropped indexes of the migrations) is
what this release writes; nothing rewrites stored rows. Here a thread is written, its rows are turned
into the earlier layout (messages as LangChain objects in a `DELTA_KEY` delta, an earlier version form:
LangGraph's 32 digits or the saver's earlier 10 digits, on Postgres the metadata's summary as an object
rather than text and every field of a checkpoint as jsonb, half of them whole documents and half
without their id), the schema is set
back to before the new migrations, and a new agent must read every checkpoint as before and continue
the thread in the thread's own version form.
"""

from __future__ import annotations

import json
import random
import sqlite3

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, AIMessageChunk, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agent.storage import deltas, summaries
from agent.storage.saver import version_counter
from agent.storage.summaries import SUMMARY_KEY
from agent.storage.postgres import checkpoint_ids
from agent.storage.postgres.migrations import DROPPED_INDEXES
from agent.storage.postgres.migrations import MIGRATIONS as POSTGRES_MIGRATIONS
from agent.storage.postgres.saver import REST_KEY, expand_checkpoint
from agent.storage.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS
from tests.helpers.databases import fresh_database
from tests.helpers.stored_values import move_messages_to_blobs


def say(agent, text, **custom_inputs):
    return agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom_inputs}).custom_outputs


class LongVersions:
    """Each compact version mapped to one of an earlier form with the same counter: LangGraph's long form
    (`f"{n:032}.{random():016}"`, `digits=32`) or the saver's earlier short one (`f"{n:010}.{hex:07x}"`,
    `digits=10`)."""

    def __init__(self, digits: int = 32) -> None:
        self.long: dict[str, str] = {}
        self.draw = random.Random(7)
        self.digits = digits

    def __call__(self, version: str) -> str:
        if version not in self.long:
            tail = f"{self.draw.random():016}" if self.digits == 32 else f"{self.draw.getrandbits(28):07x}"
            self.long[version] = f"{version_counter(version):0{self.digits}}.{tail}"
        return self.long[version]

    def checkpoint(self, checkpoint: dict) -> dict:
        return {
            **checkpoint,
            "channel_versions": {c: self(v) for c, v in checkpoint["channel_versions"].items()},
            "versions_seen": {n: {c: self(v) for c, v in seen.items()} for n, seen in checkpoint["versions_seen"].items()},
        }


def earlier_messages_value(value):
    """A stored `messages` value in the earlier delta layout (messages as LangChain objects)."""
    if not deltas.is_delta(value):
        return value
    base, keep, added = deltas.parts(value)
    return {deltas.DELTA_KEY: 1, "base": base, "keep": keep, "add": added}


#: The indexes the upgrade drops (`DROPPED_INDEXES`), as the previous release had them.
EARLIER_INDEXES = {
    "checkpoints_thread_id_idx": ("checkpoints", "thread_id"),
    "checkpoint_blobs_thread_id_idx": ("checkpoint_blobs", "thread_id"),
    "checkpoint_writes_thread_id_idx": ("checkpoint_writes", "thread_id"),
    "agent_threads_user_id_idx": ("agent_threads", "user_id"),
    "agent_checkpoints_checkpoint_id_idx": ("checkpoints", "checkpoint_id"),
}


#: The schema versions of the previous release's layout: before the checkpoint compaction (the migration
#: before the index drop) on Postgres, before the index drop on SQLite; later migrations are re-applied too.
EARLIER_POSTGRES_VERSION = next(i for i, m in enumerate(POSTGRES_MIGRATIONS) if m.startswith("DROP INDEX IF EXISTS checkpoints_thread_id_idx")) - 1
EARLIER_SQLITE_VERSION = next(i for i, m in enumerate(SQLITE_MIGRATIONS) if m == ["DROP INDEX IF EXISTS agent_threads_user_id_idx"])


def to_earlier_postgres(url: str, serde, versions: LongVersions) -> int:
    """Rewrite every row of the database in the earlier layout; how many message deltas were rewritten."""
    rewritten = 0
    with psycopg.connect(url, row_factory=dict_row) as conn:
        move_messages_to_blobs(conn)  # where that layout kept them
        conn.execute("ALTER TABLE checkpoints DROP COLUMN agent_messages_type, DROP COLUMN agent_messages")
        rows = conn.execute("SELECT * FROM checkpoints ORDER BY checkpoint_id").fetchall()
        assert rows and all(REST_KEY in row["checkpoint"] for row in rows)  # written with the rest as text
        assert all(isinstance(row["metadata"][SUMMARY_KEY], str) for row in rows)  # and the summary as text
        for n, row in enumerate(rows):
            checkpoint = versions.checkpoint(expand_checkpoint(row["checkpoint"], row["checkpoint_id"], row["metadata"]))
            if n % 2:  # the compact row of the previous release: no id, every other field jsonb
                checkpoint = {k: v for k, v in checkpoint.items() if k != "id"}
            conn.execute(  # the summary as an object, as before `summaries.as_text`
                "UPDATE checkpoints SET checkpoint = %s, metadata = %s "
                "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s",
                (Jsonb(checkpoint), Jsonb(summaries.as_object(row["metadata"])), row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"]),
            )
        for row in conn.execute("SELECT * FROM checkpoint_blobs").fetchall():
            type_, blob = row["type"], row["blob"]
            if row["channel"] == "messages" and type_ != "empty":
                value = serde.loads_typed((type_, bytes(blob)))
                rewritten += deltas.COMPACT_KEY in value
                type_, blob = serde.dumps_typed(earlier_messages_value(value))
            conn.execute(
                "UPDATE checkpoint_blobs SET version = %s, type = %s, blob = %s "
                "WHERE thread_id = %s AND checkpoint_ns = %s AND channel = %s AND version = %s",
                (versions(row["version"]), type_, blob, row["thread_id"], row["checkpoint_ns"], row["channel"], row["version"]),
            )
        # The schema as the previous release left it: its indexes, its checkpoint-id registry in place of the
        # unique index (`checkpoint_ids`), and the new migrations not applied.
        for name, (table, column) in EARLIER_INDEXES.items():
            conn.execute(f"CREATE INDEX {name} ON {table} ({column})")
        conn.execute("CREATE TABLE agent_checkpoint_ids (checkpoint_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL)")
        conn.execute(
            "INSERT INTO agent_checkpoint_ids SELECT checkpoint_id, thread_id FROM checkpoints WHERE checkpoint_ns = ''"
        )
        conn.execute(f"DROP INDEX {checkpoint_ids.OWNER_INDEX}, {checkpoint_ids.COPIES_INDEX}")
        conn.execute("ALTER TABLE checkpoints DROP COLUMN agent_copy")
        conn.execute("DELETE FROM agent_migrations WHERE v >= %s", (EARLIER_POSTGRES_VERSION,))
    return rewritten


def to_earlier_sqlite(path: str, serde, versions: LongVersions) -> int:
    """Rewrite every checkpoint of the file in the earlier layout; how many message deltas were rewritten."""
    rewritten = 0
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        rows = conn.execute("SELECT thread_id, checkpoint_ns, checkpoint_id, type, checkpoint FROM checkpoints").fetchall()
        for thread_id, ns, checkpoint_id, type_, blob in rows:
            checkpoint = versions.checkpoint(serde.loads_typed((type_, blob)))
            values = checkpoint["channel_values"]
            if "messages" in values:
                rewritten += deltas.is_delta(values["messages"]) and deltas.COMPACT_KEY in values["messages"]
                values["messages"] = earlier_messages_value(values["messages"])
            type_, blob = serde.dumps_typed(checkpoint)
            conn.execute(
                "UPDATE checkpoints SET type = ?, checkpoint = ? WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                (type_, blob, thread_id, ns, checkpoint_id),
            )
        conn.execute("CREATE INDEX agent_threads_user_id_idx ON agent_threads (user_id)")
        conn.execute(f"PRAGMA user_version = {EARLIER_SQLITE_VERSION}")
    finally:
        conn.close()
    return rewritten


def reads(agent, thread_id: str) -> dict:
    """Everything a caller reads of the thread: its record, history, and each checkpoint's messages and state."""
    history = agent.get_checkpoint_history(thread_id)
    states = {}
    for entry in history:
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": entry["checkpoint_id"]}}
        tup = agent.storage.saver.get_tuple(config)
        checkpoint = {k: v for k, v in tup.checkpoint.items() if k not in ("channel_versions", "versions_seen")}
        states[entry["checkpoint_id"]] = {
            "messages": agent.graph.get_state(config).values.get("messages"),
            "checkpoint": checkpoint,
            "metadata": tup.metadata,
            "parent": tup.parent_config,
        }
    record = agent.get_thread(thread_id)
    links = sorted(agent.storage.checkpoint_links(thread_id), key=lambda link: link.checkpoint_id)
    usage = {entry["checkpoint_id"]: agent.storage.token_usage(thread_id, entry["checkpoint_id"]) for entry in history}
    return {
        "history": history, "states": states, "record": json.dumps(record, sort_keys=True, default=str),
        "links": links, "usage": usage,
    }  # fmt: skip


def version_forms(agent, thread_id: str, checkpoint_id: str) -> set[int]:
    """The forms of the checkpoint's channel versions: the digits before the dot (32: LangGraph's, 10: the
    saver's earlier short form), 0 for the compact form (a letter first)."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    checkpoint = agent.storage.saver.get_tuple(config).checkpoint
    found = list(checkpoint["channel_versions"].values())
    found += [v for seen in checkpoint["versions_seen"].values() for v in seen.values()]
    return {len(v.split(".")[0]) if v[0].isdigit() else 0 for v in found}


@pytest.mark.parametrize("digits", [32, 10], ids=["langgraph-versions", "earlier-short-versions"])
@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_a_thread_in_the_earlier_layout_reads_the_same_after_the_upgrade_and_goes_on(
    backend, digits, pg_server_url, tmp_path, make_agent
):
    with fresh_database(pg_server_url) as pg:
        url = pg if backend == "postgres" else f"sqlite:///{tmp_path / 'earlier.sqlite'}"
        agent = make_agent(url)
        first = say(agent, "I'm planning a trip")
        thread_id = first["thread_id"]
        say(agent, "calculate 6*7", thread_id=thread_id)  # a tool call: messages of four kinds
        say(agent, "I'm headed to SF", thread_id=thread_id)
        branch = say(agent, "No, to New York", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
        assert version_forms(agent, thread_id, branch["checkpoint_id"]) == {0}  # written in the compact form
        before = reads(agent, thread_id)
        serde = agent.storage.saver.serde
        agent.close()

        versions = LongVersions(digits)
        if backend == "postgres":
            rewritten = to_earlier_postgres(url, serde, versions)
        else:
            rewritten = to_earlier_sqlite(str(tmp_path / "earlier.sqlite"), serde, versions)
        assert rewritten == 4  # each of the four turns wrote one checkpoint, holding a compact delta

        assert set(EARLIER_INDEXES) == set(DROPPED_INDEXES)
        upgraded = make_agent(url)
        assert reads(upgraded, thread_id) == before
        assert version_forms(upgraded, thread_id, branch["checkpoint_id"]) == {digits}
        if backend == "postgres":
            with psycopg.connect(url) as conn:
                left = conn.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s)", (list(DROPPED_INDEXES),)).fetchall()
            assert left == []  # the upgrade's migration dropped them again
        # The thread goes on, in its own version form, on both branches.
        after = say(upgraded, "Where am I going?", thread_id=thread_id)
        assert version_forms(upgraded, thread_id, after["checkpoint_id"]) == {digits}
        messages = upgraded.graph.get_state({"configurable": {"thread_id": thread_id}}).values["messages"]
        assert "New York" in messages[-1].text and len(messages) == 6
        old_branch = before["history"][-2]  # the SF head's ancestor chain is intact
        again = say(upgraded, "And then?", thread_id=thread_id, checkpoint_id=before["history"][1]["checkpoint_id"])
        assert version_forms(upgraded, thread_id, again["checkpoint_id"]) == {digits}
        assert old_branch["checkpoint_id"] in {e["checkpoint_id"] for e in upgraded.get_checkpoint_history(thread_id)}
        # A new thread is written in the compact form.
        fresh = say(upgraded, "A new trip")
        assert version_forms(upgraded, fresh["thread_id"], fresh["checkpoint_id"]) == {0}
        upgraded.close()


class ShoutMessage(HumanMessage):
    """A subclass of a plain class: stored as the object itself, never as a record of its base class."""


def test_every_kind_of_message_reads_back_equal_and_of_its_own_class_from_a_compact_delta():
    messages = [
        SystemMessage("be brief", id="s1"),
        HumanMessage("hi", id="h1", name="ann", additional_kwargs={"x": 1}),
        AIMessage("", id="a1", tool_calls=[{"name": "calc", "args": {"e": "6*7"}, "id": "c1", "type": "tool_call"}],
                  usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}),  # fmt: skip
        ToolMessage("42", tool_call_id="c1", id="t1", status="success"),
        AIMessage([{"type": "text", "text": "It is 42."}], id="a2", response_metadata={"model_name": "m"}),
        ChatMessage("hello", role="critic", id="x1"),
        ShoutMessage("HEY", id="u1"),
        AIMessageChunk("partial", id="k1"),
    ]
    delta = deltas.encode(messages, None, ())
    records = delta["a"]
    assert [isinstance(r, list) for r in records] == [True] * 6 + [False, False]
    base, keep, added = deltas.parts(delta)
    assert (base, keep) == (None, 0)
    assert added == messages and [type(m) for m in added] == [type(m) for m in messages]


def test_compact_versions_sort_as_their_counters_and_differ_between_siblings():
    from agent.storage.saver import compact_version

    draw = random.Random(11)
    counters = sorted({draw.randrange(10**draw.randrange(1, 12)) for _ in range(2000)} | {0, 9, 10, 35, 36, 1295, 1296})
    versions = [compact_version(n) for n in counters]
    assert versions == sorted(versions)  # LangGraph compares versions as text (`max()`, `>`)
    assert [version_counter(v) for v in versions] == counters
    assert all(v[0].isalpha() for v in versions)  # never taken for a digit-led (earlier) form
    assert len({compact_version(42) for _ in range(50)}) == 50  # two forks from one parent: two blob keys
    with pytest.raises(ValueError):
        version_counter("c12.abcdef")  # `c` says three digits


@pytest.mark.parametrize(
    "ts",
    [
        "2026-12-06T04:13:22.253992+00:00",  # LangGraph's form: stored as microseconds
        "2026-12-06T04:13:22+00:00",  # no microseconds: the same text back
        "1969-07-20T20:17:40.000001+00:00",  # before the epoch
        "2026-12-06T05:13:22.253992+01:00",  # another offset: kept as text
        "2026-12-06T04:13:22.253992Z",
        "not a time",
    ],
)
def test_a_summary_stored_as_text_reads_back_the_same(ts):
    metadata = {"step": 3, "source": "loop", **summaries.pack({"ts": ts, "message_count": 4, "usage": {"input_tokens": 5, "output_tokens": 6}})}
    stored = summaries.as_text(metadata)
    assert isinstance(stored[SUMMARY_KEY], str) and json.loads(json.dumps(stored)) == stored
    assert summaries.as_object(stored) == metadata
    assert summaries.unpack(stored) == summaries.unpack(metadata)
    if ts.startswith("2026-12-06T04"):
        assert isinstance(json.loads(stored[SUMMARY_KEY])["t"], int) == ts.endswith("+00:00")


def test_a_compacted_checkpoint_expands_to_what_was_put():
    from agent.storage.postgres.saver import compact_checkpoint

    metadata = summaries.pack({"ts": "2026-12-06T04:13:22.253992+00:00"})
    checkpoint = {
        "v": 4, "id": "1f1f12a5-042c-6d0f-bfff-4ddc0dc8a38f", "ts": "2026-12-06T04:13:22.253992+00:00",
        "channel_values": {"topic": "x"}, "channel_versions": {"messages": "c1ab.k3x9q0"},
        "versions_seen": {"agent": {"messages": "c1aa.000001"}, "__input__": {}}, "updated_channels": ["messages"],
        "pending_sends": [],
    }  # fmt: skip
    stored = dict(compact_checkpoint(checkpoint, metadata))
    assert set(stored) == {"v", "id", "channel_values", "channel_versions", REST_KEY}
    stored.pop("id")  # agent_put_checkpoint keeps the id in its column
    assert expand_checkpoint(stored, checkpoint["id"], summaries.as_text(metadata)) == checkpoint
    # A different ts stays in the row; a field named like a short name leaves the checkpoint whole.
    other = {**checkpoint, "ts": "2026-12-06T04:13:23.000001+00:00"}
    assert expand_checkpoint(dict(compact_checkpoint(other, metadata)), checkpoint["id"], metadata) == other
    assert compact_checkpoint({**checkpoint, "s": 1}, metadata) == {**checkpoint, "s": 1}


_SUMMARY_VALUES = {
    "message_count": st.integers(0, 10**6),
    "last_message": st.text(max_size=5),
    "last_user_message": st.text(max_size=5),
    "next_nodes": st.lists(st.sampled_from(["agent", "tools"]), max_size=2),
    "ts": st.sampled_from(["2026-12-06T04:13:22.253992+00:00", "2026-12-06T05:13:22+01:00", "x"]),
    "kept_messages": st.integers(0, 10**6),
    "kept_trailing": st.integers(1, 9),
    "model_input_messages": st.integers(0, 10**6),
    "model_input_tokens": st.integers(0, 10**9),
    "summary_used": st.booleans(),
    "usage": st.fixed_dictionaries({"input_tokens": st.integers(0, 10**9), "output_tokens": st.integers(0, 10**9)}),
    "branch_usage": st.fixed_dictionaries({"input_tokens": st.integers(0, 10**9), "output_tokens": st.integers(0, 10**9)}),
    "recalled_memories": st.lists(st.text(max_size=3), max_size=2),
}
# Any subset of the fields; a value may also be null, an empty list, false or 0, the values the positional
# text implies or cannot hold (but `ts` is never a number: LangGraph writes a string, and the text keeps a
# UTC one as its microseconds).
_SUMMARIES = st.dictionaries(
    st.sampled_from(sorted(_SUMMARY_VALUES)),
    st.none() | st.just([]) | st.just(False) | st.just(0),
).map(lambda odd: {k: v for k, v in odd.items() if not (k == "ts" and type(v) is int)}).flatmap(
    lambda odd: st.fixed_dictionaries(
        {name: (st.just(value) if value is not None or name in ("kept_messages", "next_nodes") else _SUMMARY_VALUES[name])
         for name, value in odd.items()},
        optional={name: _SUMMARY_VALUES[name] for name in _SUMMARY_VALUES if name not in odd},
    )
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_SUMMARIES)
def test_a_summary_stored_as_text_in_either_layout_reads_back_the_same_values_of_the_same_types(summary):
    metadata = {"step": 1, **summaries.pack(summary)}
    stored = summaries.as_text(metadata)
    assert isinstance(stored[SUMMARY_KEY], str)
    for kept in (stored, json.loads(json.dumps(summaries.as_positional(metadata)))):  # Postgres' text, SQLite's JSON
        back = summaries.as_object(kept)
        assert back == metadata
        assert all(type(back[SUMMARY_KEY][k]) is type(v) for k, v in metadata[SUMMARY_KEY].items())


def test_a_turns_summary_is_stored_positionally_and_shorter():
    summary = {"message_count": 20, "next_nodes": [], "ts": "2026-12-06T04:13:22.253992+00:00", "kept_messages": 18,
               "model_input_messages": 19, "model_input_tokens": 2254, "summary_used": False,
               "usage": {"input_tokens": 2254, "output_tokens": 236}, "branch_usage": {"input_tokens": 12804, "output_tokens": 1392}}  # fmt: skip
    packed = summaries.pack(summary)
    stored = summaries.as_text(packed)[SUMMARY_KEY]
    assert json.loads(stored) == [20, 1796530402253992, 18, 19, 2254, [2254, 236], [12804, 1392]]
    assert len(stored) < len(json.dumps(packed[SUMMARY_KEY], separators=(",", ":"))) - 40
    assert summaries.unpack({SUMMARY_KEY: stored}) == summary


def test_postgres_reads_the_same_summary_fields_from_every_layout(pg_server_url):
    """The SQL that reads summary fields (the tree, token usage, making a kept head a root) gives the same
    values whether the summary is flat, an object, an object's text or the positional text."""
    from agent.storage.postgres import sql

    summary = {"message_count": 7, "next_nodes": [], "ts": "2026-12-06T04:13:22.253992+00:00", "kept_messages": 5,
               "kept_trailing": 2, "model_input_messages": 6, "model_input_tokens": 40, "summary_used": False,
               "usage": {"input_tokens": 40, "output_tokens": 9}, "branch_usage": {"input_tokens": 80, "output_tokens": 20}}  # fmt: skip
    packed = summaries.pack(summary)
    object_text = {SUMMARY_KEY: json.dumps(packed[SUMMARY_KEY])}
    positional = summaries.as_text(packed)
    assert positional[SUMMARY_KEY].startswith("[")
    layouts = {"flat": dict(summary), "object": packed, "object text": object_text, "positional": positional}
    fields = {
        "n": sql.summary_field("message_count"), "k": sql.summary_field("kept_messages"),
        "kt": sql.summary_field("kept_trailing"), "in": sql.summary_field("usage", index=0),
        "out": sql.summary_field("usage", index=1),
    }  # fmt: skip
    select = ", ".join(f"({expression}) #>> '{{}}' AS {name}" for name, expression in fields.items())
    with fresh_database(pg_server_url) as url, psycopg.connect(url, row_factory=dict_row) as conn:
        conn.execute("CREATE TABLE checkpoints (thread_id TEXT, checkpoint_ns TEXT, checkpoint_id TEXT, parent_checkpoint_id TEXT, metadata JSONB)")
        for name, metadata in layouts.items():
            conn.execute("INSERT INTO checkpoints VALUES (%s, '', 'c1', 'c0', %s)", (name, Jsonb(metadata)))
        read = {row.pop("thread_id"): row for row in conn.execute(f"SELECT thread_id, {select} FROM checkpoints").fetchall()}
        assert all(values == {"n": "7", "k": "5", "kt": "2", "in": "40", "out": "9"} for values in read.values()), read
        for name in layouts:
            conn.execute(sql.MAKE_ROOT_SQL, {"thread_id": name, "head": "c1"})
        rows = conn.execute("SELECT thread_id, parent_checkpoint_id, metadata FROM checkpoints").fetchall()
        assert all(row["parent_checkpoint_id"] is None for row in rows)
        assert all(summaries.unpack(row["metadata"]) == {**summary, "kept_messages": 0} for row in rows), rows


def test_a_checkpoints_search_terms_are_stored_in_its_row_whether_it_is_compacted_or_kept_whole(pg_server_url):
    """The terms ride to `agent_put_checkpoint` in the compact checkpoint (`TERMS_KEY`), which stores them in
    `agent_terms` and not in the document; a checkpoint kept whole (a field named like a short name) keeps
    every key it has, and gets its terms by a statement of its own."""
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    from agent.config import AgentSettings
    from agent.storage import open_storage, search
    from agent.storage.postgres.migrations import TERMS_KEY

    with fresh_database(pg_server_url) as url:
        storage = open_storage(url, AgentSettings(model="offline"))
        try:
            saver = storage.saver
            config = {"configurable": {"thread_id": "terms", "checkpoint_ns": ""}}
            root = {**empty_checkpoint(), "id": str(uuid6()), "channel_values": {"messages": [HumanMessage("a pelican", id="m1")]},
                    "channel_versions": {"messages": saver.get_next_version(None, None)}}  # fmt: skip
            first = saver.put(config, root, {"source": "input", "step": -1, "parents": {}}, dict(root["channel_versions"]))
            whole = {**root, "id": str(uuid6()), "s": "a field named like a short name",
                     "channel_values": {"messages": [HumanMessage("a pelican", id="m1"), HumanMessage("a cormorant", id="m2")]},
                     "channel_versions": {"messages": saver.get_next_version(root["channel_versions"]["messages"], None)}}  # fmt: skip
            second = saver.put(first, whole, {"source": "update", "step": 0, "parents": {}}, dict(whole["channel_versions"]))
            with psycopg.connect(url, row_factory=dict_row) as conn:
                rows = {row["checkpoint_id"]: row for row in conn.execute("SELECT checkpoint_id, checkpoint, agent_terms FROM checkpoints")}
            compact, kept = rows[root["id"]], rows[whole["id"]]
            assert REST_KEY in compact["checkpoint"] and TERMS_KEY not in compact["checkpoint"]
            assert search.word_key("pelican") in compact["agent_terms"]
            assert REST_KEY not in kept["checkpoint"] and kept["checkpoint"]["s"] == whole["s"]
            assert kept["agent_terms"] == [search.word_key("cormorant")]  # only the word new to the branch
            assert saver.get_tuple(second).checkpoint["s"] == whole["s"]
        finally:
            storage.close()


def test_sqlite_reads_the_same_summary_fields_from_every_layout(tmp_path):
    """SQLite stores the positional array itself (`summaries.as_positional`); its SQL that reads summary
    fields (the tree, token usage) gives the same values from the flat layout, the object and the array."""
    from agent.storage.sqlite import sql as sqlite_sql

    summary = {"message_count": 7, "next_nodes": [], "ts": "2026-12-06T04:13:22.253992+00:00", "kept_messages": 5,
               "kept_trailing": 2, "model_input_messages": 6, "model_input_tokens": 40, "summary_used": False,
               "usage": {"input_tokens": 40, "output_tokens": 9}, "branch_usage": {"input_tokens": 80, "output_tokens": 20}}  # fmt: skip
    packed = summaries.pack(summary)
    positional = summaries.as_positional(packed)
    assert isinstance(positional[SUMMARY_KEY], list)
    assert len(json.dumps(positional)) < len(json.dumps(packed)) - 50
    layouts = {"flat": dict(summary), "object": packed, "positional": positional}
    fields = {
        "n": sqlite_sql.summary_field("message_count"), "k": sqlite_sql.summary_field("kept_messages"),
        "kt": sqlite_sql.summary_field("kept_trailing"), "in": sqlite_sql.summary_field("usage", index=0),
        "out": sqlite_sql.summary_field("usage", index=1),
    }  # fmt: skip
    conn = sqlite3.connect(tmp_path / "layouts.sqlite")
    try:
        conn.execute("CREATE TABLE checkpoints (thread_id TEXT, metadata BLOB)")
        for name, metadata in layouts.items():  # SqliteSaver stores metadata as a JSON blob
            conn.execute("INSERT INTO checkpoints VALUES (?, ?)", (name, json.dumps(metadata).encode()))
        select = ", ".join(expression for expression in fields.values())
        read = {row[0]: row[1:] for row in conn.execute(f"SELECT thread_id, {select} FROM checkpoints")}
    finally:
        conn.close()
    assert read == {name: (7, 5, 2, 40, 9) for name in layouts}, read
