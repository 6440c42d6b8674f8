"""A checkpoint stores no message preview its delta gives back, and its blobs compressed; old rows read the same.

`agent.storage.summaries` ("Previews from the delta"): a checkpoint's
`last_message` / `last_user_message` are read from the messages its stored
delta adds, and stored only when the delta cannot give them (an edit that
adds no user message, a removal). `agent.storage.encrypted` ("Compressed
blobs"): a long serialized value is stored zlib-compressed against a preset
dictionary, its type marked.
Here every checkpoint of a thread with turns, a tool call, a branch, an edit
and a removal lists the previews of its own whole message list, on both
backends, with and without encryption; and a thread rewritten in the earlier
layout (both previews in every checkpoint's metadata, sealed as one list with
a key; blobs uncompressed, or compressed without the dictionary) reads the
same through the new code and goes on.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import zlib
from collections.abc import Iterator
from pathlib import Path

import ormsgpack
import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agent import create_agent
from agent.encryption import NO_KEYS, Keyring, generate_key, parse_keys
from agent.storage import deltas, summaries
from agent.storage.compression import COMPRESS_AT, DICTIONARY_V1, DICTIONARY_V1_SHA256, ZDICT_SUFFIX, ZLIB_SUFFIX
from agent.storage.sqlite.reads import SqliteReader
from tests.helpers.databases import fresh_database
from tests.helpers.stored_values import STORED_VALUES, move_messages_to_blobs

KEY = generate_key()


class ShoutMessage(HumanMessage):
    """A subclass of a plain class: stored as the object itself, not as a record."""


@pytest.fixture(params=["postgres", "sqlite"])
def url(request, tmp_path) -> Iterator[str]:
    if request.param == "postgres":
        with fresh_database(request.getfixturevalue("pg_server_url"), prefix="tt_lean") as fresh:
            yield fresh
    else:
        yield f"sqlite:///{tmp_path / 'lean.sqlite'}"


def open_agent(url: str, key: str | None):
    return create_agent(url, model="offline", tracing=False, encryption_key=key)


def say(agent, text, **custom_inputs):
    return agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom_inputs}).custom_outputs


def write_thread(agent) -> str:
    """A thread whose checkpoints cover every way a checkpoint's messages change: turns (one with a tool
    call), a branch, an edit adding an assistant message (its delta holds no user message) and a removal
    of the last message (its delta adds nothing)."""
    first = say(agent, "I'm planning a trip " + "with many words " * 20)
    thread_id = first["thread_id"]
    say(agent, "calculate 6*7", thread_id=thread_id)
    head = say(agent, "I'm headed to SF", thread_id=thread_id)
    say(agent, "No, to New York", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
    agent.update_checkpoint_state(thread_id, head["checkpoint_id"], [{"role": "assistant", "content": "An edit"}])
    messages = agent.graph.get_state({"configurable": {"thread_id": thread_id}}).values["messages"]
    agent.update_checkpoint_state(thread_id, None, remove_message_ids=[messages[-1].id])
    return thread_id


def reads(agent, thread_id: str) -> dict:
    """What the agent shows of the thread's previews: history, branches and each checkpoint's state."""
    history = agent.get_checkpoint_history(thread_id)
    return {
        "history": history,
        "branches": agent.list_branches(thread_id),
        "states": {e["checkpoint_id"]: agent.get_checkpoint_state(thread_id, e["checkpoint_id"]) for e in history},
    }


def whole_previews(agent, thread_id: str, checkpoint_id: str) -> dict:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    return summaries.previews(agent.graph.get_state(config).values.get("messages", []))


def stored_rows(url: str) -> Iterator[tuple[dict, list[tuple[str, bytes]]]]:
    """Each root-namespace checkpoint's stored metadata, and the (type, bytes) of its blobs (SQLite: the checkpoint)."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            for meta, type_, blob in conn.execute("SELECT metadata, type, checkpoint FROM checkpoints WHERE checkpoint_ns = ''"):
                yield json.loads(meta), [(type_, blob)]
        finally:
            conn.close()
        return
    with psycopg.connect(url, row_factory=dict_row) as conn:
        blobs = [(r["type"], bytes(r["blob"])) for r in conn.execute(f"SELECT type, blob FROM {STORED_VALUES} WHERE type <> 'empty'")]
        for row in conn.execute("SELECT metadata FROM checkpoints WHERE checkpoint_ns = ''"):
            yield row["metadata"], []
    yield {}, blobs


@pytest.mark.parametrize("key", [None, KEY], ids=["plaintext", "encrypted"])
def test_every_checkpoint_lists_the_previews_of_its_whole_message_list_and_turns_store_none(url, key):
    agent = open_agent(url, key)
    try:
        thread_id = write_thread(agent)
        found = reads(agent, thread_id)
        assert len(found["history"]) == 7  # the root, four turns, the edit and the removal
        for entry in found["history"]:
            expected = whole_previews(agent, thread_id, entry["checkpoint_id"])
            assert {name: entry[name] for name in summaries.TEXT_FIELDS} == expected
            state = found["states"][entry["checkpoint_id"]]
            assert {name: state[name] for name in summaries.TEXT_FIELDS} == expected
        for branch in found["branches"]:
            assert branch["last_user_message"] == whole_previews(agent, thread_id, branch["checkpoint_id"])["last_user_message"]
        # Checkpoints whose delta gives both previews (the turns) store neither, sealed or not; the
        # others store what it cannot give.
        stored = [summaries.unpack(meta) for meta, _ in stored_rows(url) if meta]
        bare = [s for s in stored if not set(summaries.TEXT_FIELDS) & set(s) and "sealed_previews" not in s]
        assert len(bare) >= 4
        assert any("last_user_message" in s or "sealed_previews" in s for s in stored if s.get("message_count"))
        blobs = [type_ for _, found_blobs in stored_rows(url) for type_, _ in found_blobs]
        assert any(ZDICT_SUFFIX in type_ for type_ in blobs)  # the long first turn at least
        assert all(type_.endswith("+aesgcm") for type_ in blobs if key and type_ not in ("null", "empty"))
    finally:
        agent.close()
    # Read again with nothing cached: the previews come from the stored deltas.
    reopened = open_agent(url, key)
    try:
        assert reads(reopened, thread_id) == found
    finally:
        reopened.close()
    if url.startswith("sqlite:///"):
        # The light reader of read-only commands reads them from the records, without LangGraph.
        reader = SqliteReader.open(Path(url.removeprefix("sqlite:///")), Keyring(parse_keys(key)) if key else NO_KEYS)
        with reader:
            rows = reader.list_checkpoints(thread_id, limit=None, before=None)
        listed = {row["checkpoint_id"]: {n: row["metadata"][n] for n in summaries.TEXT_FIELDS} for row in rows}
        assert listed == {e["checkpoint_id"]: {n: e[n] for n in summaries.TEXT_FIELDS} for e in found["history"]}


def test_previews_read_from_compact_records_equal_those_of_the_messages():
    tool_call = {"name": "calculator", "args": {"expression": "6*7"}, "id": "call_1"}
    cases = [
        [HumanMessage("a question", id="h1"), AIMessage("an answer " * 30, id="a1")],
        [HumanMessage([{"type": "text", "text": "blocks "}, "and text", {"type": "image_url", "image_url": {"url": "x"}}])],
        [HumanMessage("calc"), AIMessage("", tool_calls=[tool_call], id="a2"), ToolMessage("42", tool_call_id="call_1")],
        [AIMessage("", tool_calls=[tool_call, {**tool_call, "name": "search", "id": "call_2"}])],
        [SystemMessage("be brief"), AIMessage("ok")],
        [],
    ]
    for messages in cases:
        stored = ormsgpack.unpackb(ormsgpack.packb(deltas.encode(messages, None, ())))
        assert summaries.record_previews(stored) == summaries.previews(messages)
    assert summaries.record_previews(deltas.encode([ShoutMessage("loud")], None, ())) is None  # an object: not light


def to_earlier_layout(url: str, serde, previews: dict[str, dict], seal) -> int:
    """Rewrite the database's rows as earlier releases wrote them: both previews in every checkpoint's
    summary (sealed as one list with a key), every other blob uncompressed and the rest compressed without
    the preset dictionary (`ZLIB_SUFFIX`) when long enough. Returns how many blobs were compressed."""
    written = 0

    def earlier_blob(type_: str, blob: bytes) -> tuple[str, bytes]:
        nonlocal written
        typ, data = serde.serde.dumps_typed(serde.loads_typed((type_, blob)))
        written += 1
        if written % 2 and len(data) >= COMPRESS_AT:
            typ, data = typ + ZLIB_SUFFIX, zlib.compress(data)
        if serde.keyring.enabled:
            name, data = serde.cipher.encrypt(data)
            typ = f"{typ}+{name}"
        return typ, data

    def earlier_metadata(checkpoint_id: str, metadata: dict) -> dict:
        summary = {**summaries.unpack(metadata), **previews[checkpoint_id]}
        summary.pop("sealed_previews", None)
        packed = summaries.pack(summary)[summaries.SUMMARY_KEY]
        if seal is not None:
            packed.pop("m"), packed.pop("u")
            packed["p"] = seal(json.dumps([previews[checkpoint_id][name] for name in summaries.TEXT_FIELDS]))
        return {**metadata, summaries.SUMMARY_KEY: packed}

    compressed = 0
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            rows = conn.execute("SELECT checkpoint_id, metadata, type, checkpoint FROM checkpoints WHERE checkpoint_ns = ''").fetchall()
            for checkpoint_id, meta, type_, blob in rows:
                compressed += ZDICT_SUFFIX in type_
                type_, blob = earlier_blob(type_, blob)
                meta = json.dumps(earlier_metadata(checkpoint_id, json.loads(meta)))
                conn.execute(
                    "UPDATE checkpoints SET metadata = ?, type = ?, checkpoint = ? WHERE checkpoint_id = ?",
                    (meta, type_, blob, checkpoint_id),
                )
        finally:
            conn.close()
        return compressed
    with psycopg.connect(url, row_factory=dict_row) as conn:
        move_messages_to_blobs(conn)  # where that layout kept them
        for row in conn.execute("SELECT checkpoint_id, metadata FROM checkpoints WHERE checkpoint_ns = ''").fetchall():
            conn.execute(
                "UPDATE checkpoints SET metadata = %s WHERE checkpoint_id = %s",
                (Jsonb(earlier_metadata(row["checkpoint_id"], row["metadata"])), row["checkpoint_id"]),
            )
        for row in conn.execute("SELECT * FROM checkpoint_blobs WHERE type <> 'empty'").fetchall():
            compressed += ZDICT_SUFFIX in row["type"]
            type_, blob = earlier_blob(row["type"], bytes(row["blob"]))
            conn.execute(
                "UPDATE checkpoint_blobs SET type = %s, blob = %s WHERE thread_id = %s AND channel = %s AND version = %s",
                (type_, blob, row["thread_id"], row["channel"], row["version"]),
            )
    return compressed


@pytest.mark.parametrize("key", [None, KEY], ids=["plaintext", "encrypted"])
def test_a_thread_in_the_earlier_layout_reads_the_same_and_goes_on(url, key):
    agent = open_agent(url, key)
    thread_id = write_thread(agent)
    before = reads(agent, thread_id)
    previews = {e["checkpoint_id"]: {n: e[n] for n in summaries.TEXT_FIELDS} for e in before["history"]}
    serde = agent.storage.saver.serde
    seal = agent.storage.saver.keyring.seal_text if key else None
    agent.close()

    assert to_earlier_layout(url, serde, previews, seal) > 0
    types = [type_ for _, blobs in stored_rows(url) for type_, _ in blobs]
    assert all(ZDICT_SUFFIX not in type_ for type_ in types) and any(ZLIB_SUFFIX in type_ for type_ in types)
    assert all(
        {"m", "u"} <= set(meta[summaries.SUMMARY_KEY]) or "p" in meta[summaries.SUMMARY_KEY]
        for meta, _ in stored_rows(url)
        if meta
    )

    upgraded = open_agent(url, key)
    try:
        assert reads(upgraded, thread_id) == before
        after = say(upgraded, "Where am I going?", thread_id=thread_id)
        [entry] = upgraded.get_checkpoint_history(thread_id, limit=1)
        assert entry["checkpoint_id"] == after["checkpoint_id"]
        assert entry["last_user_message"] == "Where am I going?"
        assert entry["last_message"] == whole_previews(upgraded, thread_id, entry["checkpoint_id"])["last_message"]
    finally:
        upgraded.close()


def test_the_preset_dictionary_is_the_one_stored_values_were_compressed_with():
    # Every value marked ZDICT_SUFFIX needs exactly these bytes to be read again.
    assert hashlib.sha256(DICTIONARY_V1).hexdigest() == DICTIONARY_V1_SHA256
