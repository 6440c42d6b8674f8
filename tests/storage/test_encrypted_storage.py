"""Encryption at rest on Postgres and SQLite (`agent.encryption`, `agent.storage.encrypted`).

With a key, the rows themselves (every column of every table, read straight from the database) hold no
word of a conversation: not the messages, the previews in checkpoint metadata, the title, a memory or a
stored response; and everything reads back through the agent. Rotation reads old data and writes with the
new key; a missing or wrong key is `EncryptionKeyError` naming the setting (a 500 with its message over
HTTP, nothing written, the thread not left held); rows written before encryption still read; exports are
sealed unless asked for plaintext; the message deltas stay linear.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from typing import TypedDict

import httpx
import psycopg
import pytest
from psycopg.types.string import TextLoader

from agent import EncryptionKeyError, InvalidRequest, create_agent
from agent.encryption import OVERHEAD_BYTES, Keyring, generate_key, parse_keys
from agent.serving.agent_server import build_app
from agent.storage.postgres import PostgresThreadStorage
from tests.helpers.databases import fresh_database
from tests.helpers.error_bodies import assert_error_body
from tests.helpers.scenario import outputs, request, say, text_of
from tests.helpers.servers import in_process_server
from tests.helpers.stored_values import STORED_VALUES

A, B = generate_key(), generate_key()


@pytest.fixture(params=["postgres", "sqlite"])
def url(request, tmp_path) -> Iterator[str]:
    """A database of this test only (its raw rows are scanned whole), on each backend."""
    if request.param == "postgres":
        with fresh_database(request.getfixturevalue("pg_server_url"), prefix="tt_enc") as fresh:
            yield fresh
    else:
        yield f"sqlite:///{tmp_path / 'encrypted.sqlite'}"


def open_agent(url: str, key: str | None = None, **settings):
    return create_agent(url, model="offline", tracing=False, encryption_key=key, **settings)


def raw_rows(url: str) -> bytes:
    """Every value of every row of every table of the database at `url`, as bytes, read with SQL (no agent)."""
    def encode(value) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, (dict, list)):
            return json.dumps(value, ensure_ascii=False).encode()
        return str(value).encode("utf-8", "surrogatepass")

    out: list[bytes] = []
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                out += [encode(value) for row in conn.execute(f'SELECT * FROM "{table}"') for value in row]
        return b"\n".join(out)
    with psycopg.connect(url) as conn:
        for name in ("timestamptz", "timestamp"):  # as text: the claims table holds '-infinity'
            conn.adapters.register_loader(name, TextLoader)
        for (table,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall():
            out += [encode(value) for row in conn.execute(f'SELECT * FROM "{table}"') for value in row]
    return b"\n".join(out)


def row_counts(url: str) -> dict[str, int]:
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {n: conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}
    with psycopg.connect(url) as conn:
        names = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return {n: conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}


def user_texts(state: dict) -> list[str]:
    """The user messages' texts of a `get_checkpoint_state` answer."""
    return [item["content"][0]["text"] for item in state["messages"] if item.get("role") == "user"]


def secret() -> str:
    return f"Zanzibar{uuid.uuid4().hex[:10]}"


def converse(agent, words: str, user_id: str) -> dict:
    """A thread that stores `words` everywhere the agent keeps text: a memory (a tool call and its result),
    the default title, history previews, an edited branch, a stored idempotent response, a new title."""
    key = f"key-{uuid.uuid4().hex[:8]}"  # an id the client chose: stored as it is
    first = say(agent, f"Remember that my passport is {words}", user_id=user_id, idempotency_key=key)
    thread_id = outputs(first)["thread_id"]
    second = say(agent, f"Where is {words}?", user_id=user_id, thread_id=thread_id)
    human = next(m for m in agent.get_checkpoint_state(thread_id, user_id=user_id)["messages"] if m["role"] == "user")
    say(agent, f"I meant {words} island", user_id=user_id, thread_id=thread_id, edit_message_id=human["id"])
    agent.set_head(thread_id, outputs(second)["checkpoint_id"], user_id=user_id)
    return {"thread_id": thread_id, "first": first, "head": outputs(second)["checkpoint_id"], "key": key}


def assert_reads_back(agent, words: str, user_id: str, found: dict) -> None:
    thread_id = found["thread_id"]
    assert agent.get_thread(thread_id, user_id=user_id)["title"] == f"Remember that my passport is {words}"
    assert f"Remember that my passport is {words}" in [t["title"] for t in agent.list_threads(user_id=user_id)]
    # The title search compares the opened titles (the database holds them sealed).
    assert thread_id in [t["thread_id"] for t in agent.list_threads(user_id=user_id, title_contains=f"PASSPORT IS {words}")]
    history = agent.get_checkpoint_history(thread_id, user_id=user_id)
    assert {h["last_user_message"] for h in history} >= {f"Where is {words}?", f"I meant {words} island"}
    assert f"Where is {words}?" in user_texts(agent.get_checkpoint_state(thread_id, user_id=user_id))
    assert [m["content"] for m in agent.list_memories(user_id)] == [f"my passport is {words}"]
    retried = say(agent, f"Remember that my passport is {words}", user_id=user_id, idempotency_key=found["key"])
    assert text_of(retried) == text_of(found["first"]) and outputs(retried) == outputs(found["first"])
    recalled = say(agent, "What do you know about my passport?", user_id=user_id)  # another thread
    assert f"my passport is {words}" in text_of(recalled)


def where(words: str, url: str) -> list[str]:
    """The tables and columns holding `words` (for a failing assertion's message)."""
    found = []
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                cur = conn.execute(f'SELECT * FROM "{table}"')
                names = [d[0] for d in cur.description]
                for row in cur:
                    found += [f"{table}.{n}" for n, v in zip(names, row) if words.encode() in (v if isinstance(v, bytes) else str(v).encode())]
    return found


def test_with_a_key_no_row_holds_the_words_of_a_conversation_and_everything_reads_back(url):
    words, user = secret(), f"u-{uuid.uuid4().hex[:6]}"
    with open_agent(url, A) as agent:
        found = converse(agent, words, user)
        agent.update_thread(found["thread_id"], user_id=user, title=f"Trip to {words}")
        assert agent.get_thread(found["thread_id"], user_id=user)["title"] == f"Trip to {words}"
        agent.update_thread(found["thread_id"], user_id=user, title=f"Remember that my passport is {words}")
        assert_reads_back(agent, words, user, found)
    assert words.encode() not in raw_rows(url), where(words, url)
    with open_agent(url, A) as fresh:  # a new process: nothing cached
        assert_reads_back(fresh, words, user, found)
    assert words.encode() not in raw_rows(url)


def test_rows_written_before_encryption_still_read_and_new_rows_are_sealed(url):
    old, new, user = secret(), secret(), "u-old"
    with open_agent(url) as plain:
        found = converse(plain, old, user)
    assert old.encode() in raw_rows(url)  # the scan sees plaintext where it is
    with open_agent(url, A) as agent:
        assert_reads_back(agent, old, user, found)
        say(agent, f"Now {new}", user_id=user, thread_id=found["thread_id"])
        assert f"Now {new}" in user_texts(agent.get_checkpoint_state(found["thread_id"], user_id=user))
    rows = raw_rows(url)
    assert old.encode() in rows and new.encode() not in rows


def test_rotation_reads_every_old_key_and_writes_with_the_first(url):
    user = "u-rotate"
    with open_agent(url, A) as agent:
        under_a = outputs(say(agent, "written under A", user_id=user))["thread_id"]
    with open_agent(url, f"{B},{A}") as agent:
        assert agent.get_thread(under_a, user_id=user)["title"] == "written under A"
        say(agent, "continued under B", user_id=user, thread_id=under_a)
        under_b = outputs(say(agent, "written under B", user_id=user))["thread_id"]
        say(agent, "Remember that B is the new key", user_id=user, thread_id=under_b)
    with open_agent(url, B) as agent:
        state = agent.get_checkpoint_state(under_b, user_id=user)
        assert user_texts(state) == ["written under B", "Remember that B is the new key"]
        assert [m["content"] for m in agent.list_memories(user)] == ["B is the new key"]
        with pytest.raises(EncryptionKeyError) as err:
            agent.get_checkpoint_state(under_a, user_id=user)  # its title and first turn are A's
        assert Keyring(parse_keys(A)).key_ids[0] in err.value.message


def test_a_missing_or_wrong_key_is_an_error_naming_the_setting_and_writes_nothing(url):
    user = "u-keys"
    with open_agent(url, A) as agent:
        thread_id = outputs(say(agent, "sealed with A", user_id=user))["thread_id"]
    before = row_counts(url)
    for key in (B, None):
        with open_agent(url, key) as agent:
            for read in (
                lambda: agent.get_thread(thread_id, user_id=user),
                lambda: agent.get_checkpoint_history(thread_id, user_id=user),
                lambda: say(agent, "more", user_id=user, thread_id=thread_id),
                lambda: agent.export_thread(thread_id, user_id=user, plaintext=True),
            ):
                with pytest.raises(EncryptionKeyError) as err:
                    read()
                assert "encryption_key (AGENT_ENCRYPTION_KEY)" in err.value.message
    assert row_counts(url) == before
    with open_agent(url, A) as agent:  # the failed turns left the thread free (strategy "reject")
        assert "more" in text_of(say(agent, "more", user_id=user, thread_id=thread_id, multitask_strategy="reject"))


def test_over_http_a_wrong_key_is_a_500_with_the_message_and_no_traceback(tmp_path):
    url = f"sqlite:///{tmp_path / 'http.sqlite'}"
    with open_agent(url, A) as agent:
        thread_id = outputs(say(agent, "sealed with A"))["thread_id"]
    with open_agent(url, B) as agent, in_process_server(build_app(agent)) as base, httpx.Client(base_url=base, timeout=30) as http:
        for body in (request("more", thread_id=thread_id), request(action="get_checkpoint_history", thread_id=thread_id)):
            answer = http.post("/responses", json=body)
            assert answer.status_code == 500, answer.text
            assert "AGENT_ENCRYPTION_KEY" in assert_error_body("/responses", answer.json(), "INTERNAL_ERROR")
            assert "Traceback" not in answer.text and 'File "' not in answer.text


def test_exports_are_sealed_unless_plaintext_is_asked_for(url, tmp_path):
    words, user = secret(), "u-export"
    with open_agent(url, A) as agent:
        thread_id = outputs(say(agent, f"Export {words}", user_id=user))["thread_id"]
        sealed = agent.export_thread(thread_id, user_id=user)
        by_action = outputs(agent.predict(request(action="export_thread", thread_id=thread_id, user_id=user)))["document"]
        plain = agent.export_thread(thread_id, user_id=user, plaintext=True)
    assert sealed["format"] == by_action["format"] == "timetravel-agent.sealed-thread"
    assert sealed["thread_id"] == thread_id and words not in json.dumps(sealed) + json.dumps(by_action)
    assert plain["format"] == "timetravel-agent.thread" and words in json.dumps(plain)

    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    with open_agent(other, B) as stranger:
        with pytest.raises(InvalidRequest, match="sealed with key id .* plaintext=True"):
            stranger.import_thread(sealed, user_id="u-2")
        tampered = {**sealed, "thread_id": "another-thread"}
        assert stranger.import_thread(plain, user_id="u-2")["title"] == f"Export {words}"
    assert row_counts(other)["checkpoints"] == 2
    with open_agent(f"sqlite:///{tmp_path / 'rotated.sqlite'}", f"{B},{A}") as rotated:
        with pytest.raises(InvalidRequest):
            rotated.import_thread(tampered, user_id="u-3")  # the thread id is authenticated
        assert rotated.import_thread(sealed, user_id="u-3")["title"] == f"Export {words}"
        assert rotated.export_thread(thread_id, user_id="u-3", plaintext=True)["checkpoints"] == plain["checkpoints"]


def test_the_command_line_exports_sealed_documents_and_decrypted_ones_with_plaintext(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agent.cli import app

    source, target = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    with open_agent(source, A) as agent:
        thread_id = outputs(say(agent, "Quokka", user_id="u"))["thread_id"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENT_ENCRYPTION_KEY", A)
    run = lambda *args: CliRunner().invoke(app, list(args))  # noqa: E731
    sealed = run("export", thread_id, "--user-id", "u", "--database-url", source, "-o", "sealed.json")
    plain = run("export", thread_id, "--user-id", "u", "--database-url", source, "--plaintext")
    assert sealed.exit_code == 0 and plain.exit_code == 0, sealed.output + plain.output
    assert json.loads((tmp_path / "sealed.json").read_text())["format"] == "timetravel-agent.sealed-thread"
    assert json.loads(plain.stdout)["format"] == "timetravel-agent.thread"
    assert run("import", "sealed.json", "--user-id", "w", "--database-url", target).exit_code == 0
    again = run("import", "sealed.json", "--user-id", "w", "--database-url", target)
    assert again.exit_code == 0 and "already there" in again.stdout
    # The read-only commands' light SQLite reader opens the previews and titles too.
    history = run("history", thread_id, "--user-id", "u", "--database-url", source)
    listed = run("threads", "--user-id", "u", "--database-url", source)
    assert history.exit_code == 0 and "Quokka" in history.stdout, history.output
    assert listed.exit_code == 0 and "Quokka" in listed.stdout, listed.output
    monkeypatch.setenv("AGENT_ENCRYPTION_KEY", B)
    for command in (("export", thread_id), ("history", thread_id), ("threads",)):
        refused = run(*command, "--user-id", "u", "--database-url", source)
        assert refused.exit_code == 1 and "AGENT_ENCRYPTION_KEY" in refused.output, (command, refused.output)
        assert "Traceback" not in refused.output


class Note(TypedDict):
    note: str


def test_a_graph_channel_holding_a_string_is_sealed_too(url):
    # LangGraph's Postgres saver keeps a string channel value inline in the checkpoint's JSONB row.
    from langgraph.graph import END, START, StateGraph

    words = secret()
    with open_agent(url, A) as agent:
        builder = StateGraph(Note)
        builder.add_node("write", lambda state: {"note": f"{state['note']} and {words}"})
        builder.add_edge(START, "write")
        builder.add_edge("write", END)
        graph = builder.compile(checkpointer=agent.storage.saver)
        config = {"configurable": {"thread_id": f"note-{uuid.uuid4().hex[:6]}"}}
        graph.invoke({"note": "start"}, config)
        assert graph.get_state(config).values["note"] == f"start and {words}"
        assert [s.values.get("note") for s in graph.get_state_history(config)][:2] == [f"start and {words}", "start"]
    assert words.encode() not in raw_rows(url)


def stored_message_bytes(agent, thread_id: str) -> int:
    """Bytes the database holds for the thread's messages (Postgres: its `messages` blobs; SQLite: its
    checkpoint rows, which hold the channel values)."""
    store = agent.storage
    if isinstance(store, PostgresThreadStorage):
        with store.pool.connection() as conn:
            return conn.execute(
                f"SELECT coalesce(sum(length(blob)), 0) AS n FROM {STORED_VALUES} WHERE thread_id = %s AND channel = 'messages'",
                (thread_id,),
            ).fetchone()["n"]
    return store.saver.conn.execute(
        "SELECT coalesce(sum(length(checkpoint)), 0) FROM checkpoints WHERE thread_id = ?", (thread_id,)
    ).fetchone()[0]


def test_sealed_deltas_stay_linear_and_cost_at_most_33_bytes_more_per_blob(url):
    sizes = {}
    for key in (None, A):
        with open_agent(url, key) as agent:
            thread_id = None
            at = {}
            for n in range(1, 41):
                thread_id = outputs(say(agent, f"Turn {n}: one more detail about the trip to keep in mind.", thread_id=thread_id))["thread_id"]
                if n in (10, 20, 40):
                    at[n] = stored_message_bytes(agent, thread_id)
            sizes[key] = at
    sealed, plain = sizes[A], sizes[None]
    assert sealed[40] < 6 * sealed[10] and sealed[40] - sealed[20] < 1.5 * sealed[20]  # deltas, not whole lists
    # Each sealed blob adds its key id, nonce, tag and format byte, and is compressed first when that helps
    # (so it may well be smaller); a turn writes a few blobs.
    assert sealed[40] <= plain[40] + 40 * 4 * OVERHEAD_BYTES
