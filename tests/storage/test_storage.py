"""Storage, on Postgres and SQLite: messages stored as deltas (linear growth), old checkpoints read
back exactly (also with a cold cache and from a new agent), history that reads summaries only, and
threads that outlive the agent instance."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from agent.storage.postgres import PostgresThreadStorage
from tests.helpers.databases import dbname_of, fresh_database
from tests.helpers.scenario import TRIP, outputs, run_trip, say, text_of
from tests.helpers.stored_values import STORED_VALUES


def state_of(agent, thread_id: str, checkpoint_id: str):
    """LangGraph's own view of one checkpoint (a StateSnapshot)."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
    return agent.graph.get_state(config)


def stored_message_bytes(agent, thread_id: str) -> int:
    """Bytes the database holds for the thread's `messages` values."""
    store = agent.storage
    if isinstance(store, PostgresThreadStorage):
        with store.pool.connection() as conn:
            row = conn.execute(
                f"SELECT coalesce(sum(length(blob)), 0) AS n FROM {STORED_VALUES}"
                " WHERE thread_id = %s AND channel = 'messages'",
                (thread_id,),
            ).fetchone()
            return row["n"]
    # SqliteSaver keeps channel values inside the serialized checkpoint.
    row = store.saver.conn.execute(
        "SELECT coalesce(sum(length(checkpoint)), 0) FROM checkpoints WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    return row[0]


def user_text(n: int) -> str:
    """A user message of about 100 characters, different each turn."""
    return f"Turn {n}: here is one more detail about the trip that I would like you to keep in mind."


def converse(agent, turns: int, *, thread_id: str | None = None, checkpoint_id: str | None = None, start: int = 1):
    """`turns` user turns; returns the thread id and, per turn, (checkpoint_id, parent, user text, reply text)."""
    record = []
    for n in range(start, start + turns):
        response = say(agent, user_text(n), thread_id=thread_id, checkpoint_id=checkpoint_id)
        ids = outputs(response)
        thread_id, checkpoint_id = ids["thread_id"], None
        record.append((ids["checkpoint_id"], ids["parent_checkpoint_id"], user_text(n), text_of(response)))
    return thread_id, record


def expected_messages(records) -> dict[str, list[tuple[str, str]]]:
    """Checkpoint id -> its (type, text) messages, rebuilt from what each turn sent and got back."""
    expected: dict[str, list[tuple[str, str]]] = {}
    for checkpoint_id, parent, user, reply in records:
        expected[checkpoint_id] = [*expected.get(parent, []), ("human", user), ("ai", reply)]
    return expected


def read_messages(agent, thread_id: str, checkpoint_id: str) -> list[tuple[str, str]]:
    return [(m.type, m.text) for m in state_of(agent, thread_id, checkpoint_id).values["messages"]]


def test_stored_messages_grow_linearly_with_the_number_of_turns(agent):
    thread_id, _ = converse(agent, 10)
    at_10 = stored_message_bytes(agent, thread_id)
    converse(agent, 10, thread_id=thread_id, start=11)
    at_20 = stored_message_bytes(agent, thread_id)
    converse(agent, 20, thread_id=thread_id, start=21)
    at_40 = stored_message_bytes(agent, thread_id)
    assert at_10 > 0
    # Whole lists per checkpoint would make 40 turns cost about 16x what 10 cost, and
    # turns 21-40 cost about 3x what turns 1-20 cost. Deltas: about 4x and 1x.
    assert at_40 < 6 * at_10
    assert at_40 - at_20 < 1.5 * at_20


def test_old_checkpoints_read_back_exactly_their_messages_after_many_turns(agent, make_agent, backend_url):
    thread_id, main = converse(agent, 30)
    # A branch from turn 5 grows on the same thread.
    _, branch = converse(agent, 5, thread_id=thread_id, checkpoint_id=main[4][0], start=100)
    expected = expected_messages(main + branch)
    sample = [main[0][0], main[4][0], main[15][0], main[-1][0], branch[0][0], branch[-1][0]]

    warm = {cid: read_messages(agent, thread_id, cid) for cid in sample}
    agent.storage.saver.message_cache.clear()
    cold = {cid: read_messages(agent, thread_id, cid) for cid in sample}
    fresh_agent = make_agent(backend_url)
    fresh = {cid: read_messages(fresh_agent, thread_id, cid) for cid in sample}

    for cid in sample:
        assert warm[cid] == expected[cid]
        assert cold[cid] == expected[cid]
        assert fresh[cid] == expected[cid]
    assert len(expected[main[-1][0]]) == 60
    assert len(expected[branch[-1][0]]) == 20
    assert not any("Turn 6:" in text for _, text in expected[branch[-1][0]])


def test_message_ids_survive_a_cold_read(agent):
    thread_id, record = converse(agent, 12)
    old = record[3][0]
    before = [m.id for m in state_of(agent, thread_id, old).values["messages"]]
    agent.storage.saver.message_cache.clear()
    after = [m.id for m in state_of(agent, thread_id, old).values["messages"]]
    assert before == after and len(before) == 8 and all(before)


def test_a_turn_from_an_old_checkpoint_with_a_cold_cache_continues_from_it(agent):
    thread_id, record = converse(agent, 20)
    agent.storage.saver.message_cache.clear()
    response = say(agent, "What did I tell you?", thread_id=thread_id, checkpoint_id=record[2][0])
    reply = text_of(response)
    assert "Turn 3:" in reply and "Turn 4:" not in reply
    new_head = outputs(response)["checkpoint_id"]
    assert len(read_messages(agent, thread_id, new_head)) == 8


def test_history_of_a_long_thread_reads_the_listed_checkpoints_own_deltas_in_one_query_and_resolves_none(
    agent, monkeypatch
):
    thread_id, record = converse(agent, 40)
    saver = agent.storage.saver
    serde = saver.serde
    loads = serde.loads_typed
    decoded, fetches = [], []

    def counting_loads(data):
        decoded.append(data[0])
        return loads(data)

    def counting_fetch(fetch):
        return lambda *args: fetches.append(args) or fetch(*args)

    def no_thread_read(*args):
        raise AssertionError("history read the thread's messages")

    monkeypatch.setattr(serde, "loads_typed", counting_loads)
    monkeypatch.setattr(saver, "_fetch_checkpoint_messages", counting_fetch(saver._fetch_checkpoint_messages))
    monkeypatch.setattr(saver, "_fetch_thread_messages", no_thread_read)
    saver.message_cache.clear()
    history = agent.get_checkpoint_history(thread_id, limit=1000)
    # The previews come from each turn's own delta (`summaries`, "Previews from the delta"): one
    # query for all, one blob each (SQLite: the checkpoint), no base resolved.
    assert len(fetches) == 1 and len(decoded) == len(record)
    decoded.clear()
    assert agent.get_checkpoint_history(thread_id, limit=1000) == history
    assert len(fetches) == 2 and len(decoded) == len(record)  # read again: a history entry is not cached

    root = history.pop()
    assert (root["checkpoint_id"], root["message_count"], root["source"]) == (record[0][1], 0, "root")
    assert [e["checkpoint_id"] for e in history] == [cid for cid, *_ in reversed(record)]
    assert [e["message_count"] for e in history] == list(range(80, 0, -2))
    assert [e["last_message"] for e in history] == [reply[:100] for *_, reply in reversed(record)]
    assert all(e["next_nodes"] == [] for e in history)
    assert [e["parent_checkpoint_id"] for e in history] == [parent for _, parent, *_ in reversed(record)]
    steps = [e["step"] for e in history]
    assert steps == sorted(steps, reverse=True) and len(set(steps)) == 40

    # The check can see reads: loading one old checkpoint does deserialize.
    state_of(agent, thread_id, record[0][0])
    assert decoded


def test_a_new_agent_on_the_same_database_sees_the_thread(agent, make_agent, backend_url):
    ids = run_trip(agent)
    history = agent.get_checkpoint_history(ids["thread_id"], limit=100)
    restarted = make_agent(backend_url)
    assert restarted.get_checkpoint_history(ids["thread_id"], limit=100) == history

    answer = say(restarted, "Where am I going?", thread_id=ids["thread_id"])
    assert outputs(answer)["parent_checkpoint_id"] == ids["after_turn3"]
    assert "SF" in text_of(answer) and TRIP[0] in text_of(answer)
    branched = say(restarted, "I'm headed to New York!", thread_id=ids["thread_id"], checkpoint_id=ids["after_turn1"])
    assert "SF" not in text_of(branched)
    # The first agent sees the head the second one moved.
    head = agent.get_checkpoint_history(ids["thread_id"], limit=1)[0]
    assert head["checkpoint_id"] == outputs(branched)["checkpoint_id"]
    assert "New York" in text_of(say(agent, "Where am I going?", thread_id=ids["thread_id"]))


@pytest.mark.parametrize("edit", ["update", "branch"])
def test_stored_bytes_for_a_branch_do_not_copy_the_shared_prefix(agent, edit):
    thread_id, record = converse(agent, 30)
    before = stored_message_bytes(agent, thread_id)
    if edit == "update":
        agent.update_checkpoint_state(thread_id, record[0][0], [{"role": "user", "content": "I'm headed to Tokyo!"}])
    else:
        say(agent, "I'm headed to Tokyo!", thread_id=thread_id, checkpoint_id=record[-2][0])
    added = stored_message_bytes(agent, thread_id) - before
    # One turn's worth of bytes, not the 58 messages before the branch point.
    assert added < 2 * (before / 30)


def test_text_that_means_something_to_sql_is_stored_and_read_back_exactly(agent, make_agent, backend_url):
    # On Postgres a commit's statements are bound on the client and sent as one query (`postgres.batch`):
    # quoting must survive every character SQL, psycopg or JSON give a meaning to.
    hazards = [
        "it's O'Brien's; --",
        "back\\slash \\x00 \\\\ E'\\n' $$dollar$$ $1 %s %(name)s %% {0}",
        '"double" \u00e9\u65e5\u672c \U0001f600 tab\there\nnew line',
        "'); DELETE FROM agent_threads; --",
    ]
    thread_id = None
    for text in hazards:
        thread_id = outputs(say(agent, text, thread_id=thread_id))["thread_id"]
    head = agent.get_checkpoint_history(thread_id, limit=1)[0]["checkpoint_id"]
    cold = make_agent(backend_url)
    stored = [m.text for m in state_of(cold, thread_id, head).values["messages"] if m.type == "human"]
    assert stored == hazards
    assert len(cold.get_checkpoint_history(thread_id, limit=100)) == len(agent.get_checkpoint_history(thread_id, limit=100))


def test_a_database_whose_default_client_encoding_is_not_utf8_stores_and_reads_unicode(pg_server_url, make_agent):
    # Found by a fresh-user run: with LATIN1 as the database's default, a turn was committed and then
    # reported as failed (UnicodeDecodeError), and an emoji could not be written at all.
    with fresh_database(pg_server_url, prefix="tt_latin1") as url:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} SET client_encoding = 'LATIN1'").format(sql.Identifier(dbname_of(url))))
        agent = make_agent(url)
        texts = ["Un café à Paris", "Party time \U0001f389 and \u65e5\u672c"]
        thread_id = None
        for text in texts:
            thread_id = outputs(say(agent, text, thread_id=thread_id))["thread_id"]
        head = agent.get_checkpoint_history(thread_id, limit=1)[0]["checkpoint_id"]
        cold = make_agent(url)
        assert [m.text for m in state_of(cold, thread_id, head).values["messages"] if m.type == "human"] == texts
