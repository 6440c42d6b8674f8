"""Retention (`agent.operations.retention`), on Postgres and SQLite: expired threads are deleted, or cut
down to their head under `keep_latest`, exactly once however many sweepers run; busy threads are skipped.

Each test gets a database of its own: a sweep covers every thread of its database, and the session's
shared database holds other tests' threads. The clock is controlled with `now=` (expiry judged as of
"updated_at + ttl + 1 s"); one test ages a thread with SQL instead, to check the real clock's path.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from datetime import datetime, timedelta

import httpx
import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from agent.cli import app as cli_app

from agent.errors import InvalidRequest, ThreadNotFound
from agent.storage import postgres as pg_storage
from agent.storage import sqlite as sqlite_storage
from tests.helpers.claims import other_replica_holds
from tests.helpers.databases import fresh_database
from tests.helpers.reliability import head_messages, is_postgres, sqlite_path, thread_rows
from tests.helpers.scenario import outputs, request, say
from tests.helpers.servers import free_port, server_process
from tests.helpers.stored_values import STORED_VALUES, begun_before_the_upgrade

TTL = 3600.0
DANGLING_CALL = {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": '{"expression": "1"}'}


@pytest.fixture(params=["postgres", "sqlite"])
def url(request, tmp_path):
    """A database of this test's own (Postgres, dropped afterwards; or a SQLite file)."""
    if request.param == "postgres":
        with fresh_database(request.getfixturevalue("pg_server_url"), prefix="tt_retention") as fresh:
            yield fresh
    else:
        yield f"sqlite:///{tmp_path / 'retention.sqlite'}"


def new_thread(agent, text: str = "I'm headed to SF!", turns: int = 1, **custom) -> str:
    thread_id = outputs(say(agent, text, **custom))["thread_id"]
    for number in range(1, turns):
        say(agent, f"turn {number + 1}", thread_id=thread_id, **custom)
    return thread_id


def updated_at(agent, thread_id: str) -> datetime:
    return datetime.fromisoformat(agent.storage.get_thread(thread_id).updated_at)


def expired_at(agent, thread_id: str, ttl: float = TTL) -> datetime:
    """The first moment (with 1 s to spare) at which the thread is expired under `ttl`."""
    return updated_at(agent, thread_id) + timedelta(seconds=ttl + 1)


def age(url: str, thread_id: str, seconds: float) -> None:
    """Move the thread's last write `seconds` into the past (the real clock's path)."""
    if is_postgres(url):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "UPDATE agent_threads SET updated_at = updated_at - make_interval(secs => %s) WHERE thread_id = %s",
                (seconds, thread_id),
            )
    else:
        with sqlite3.connect(sqlite_path(url)) as conn:
            conn.execute("UPDATE agent_threads SET updated_at = updated_at - ? WHERE thread_id = ?", (seconds, thread_id))


def rows_in_every_table(url: str, thread_id: str) -> dict[str, int]:
    """Rows of `thread_id` in every table of the storage's TABLES that has a thread_id column."""
    if is_postgres(url):
        with psycopg.connect(url) as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT table_name FROM information_schema.columns WHERE column_name = 'thread_id' "
                    "AND table_schema = current_schema() AND table_name = ANY(%s)",
                    (list(pg_storage.TABLES),),
                )
            ]
            return {
                table: conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE thread_id = %s").format(sql.Identifier(table)), (thread_id,)
                ).fetchone()[0]
                for table in tables
            }
    with sqlite3.connect(sqlite_path(url)) as conn:
        tables = [
            table
            for table in sqlite_storage.TABLES
            if any(column[1] == "thread_id" for column in conn.execute(f"PRAGMA table_info({table})"))
        ]
        return {
            table: conn.execute(f"SELECT count(*) FROM {table} WHERE thread_id = ?", (thread_id,)).fetchone()[0]
            for table in tables
        }


def message_dicts(messages) -> list[dict]:
    """What a reader sees of each message: type, id, content and tool calls."""
    return [
        {"type": m.type, "id": m.id, "content": m.content, "tool_calls": getattr(m, "tool_calls", None)}
        for m in messages
    ]


# -- expiry -------------------------------------------------------------------------------------------
def test_expired_threads_are_deleted_and_live_ones_stay(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL)
    old = new_thread(agent, "old")
    live = new_thread(agent, "live")
    # Half-way between the two threads' expiry moments: `old` is expired, `live` is not.
    gap = updated_at(agent, live) - updated_at(agent, old)
    assert gap > timedelta(0)
    now = updated_at(agent, old) + timedelta(seconds=TTL) + gap / 2

    assert agent.sweep_expired_threads(now=now) == {"deleted_thread_ids": [old], "trimmed": [], "failed_thread_ids": []}

    with pytest.raises(ThreadNotFound):
        agent.get_checkpoint_history(old)
    assert agent.get_checkpoint_history(live)
    assert agent.sweep_expired_threads(now=now) == {"deleted_thread_ids": [], "trimmed": [], "failed_thread_ids": []}


def test_without_any_ttl_nothing_ever_expires(url, make_agent):
    agent = make_agent(url)
    thread_id = new_thread(agent)
    years_later = updated_at(agent, thread_id) + timedelta(days=3650)
    assert agent.sweep_expired_threads(now=years_later) == {"deleted_thread_ids": [], "trimmed": [], "failed_thread_ids": []}
    assert agent.get_checkpoint_history(thread_id)


def test_expiry_is_judged_by_the_database_clock_when_no_now_is_given(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=60)
    idle, fresh = new_thread(agent, "idle"), new_thread(agent, "fresh")
    age(url, idle, 61)

    assert agent.sweep_expired_threads() == {"deleted_thread_ids": [idle], "trimmed": [], "failed_thread_ids": []}
    assert agent.get_checkpoint_history(fresh)


def test_a_threads_own_ttl_overrides_the_setting(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL)
    short, long_lived, default = new_thread(agent, "short"), new_thread(agent, "long"), new_thread(agent, "default")
    agent.update_thread(short, ttl_seconds=10)
    agent.update_thread(long_lived, ttl_seconds=100 * TTL)
    latest = max(updated_at(agent, t) for t in (short, long_lived, default))

    soon = latest + timedelta(seconds=11)
    assert agent.sweep_expired_threads(now=soon) == {"deleted_thread_ids": [short], "trimmed": [], "failed_thread_ids": []}
    assert agent.sweep_expired_threads(now=latest + timedelta(seconds=TTL + 1)) == {
        "deleted_thread_ids": [default],
        "trimmed": [],
        "failed_thread_ids": [],
    }
    assert agent.get_checkpoint_history(long_lived)

    # Without the setting, only threads with a ttl of their own expire.
    other = make_agent(url)
    other.update_thread(long_lived, ttl_seconds=5)
    assert other.sweep_expired_threads(now=latest + timedelta(seconds=6)) == {
        "deleted_thread_ids": [long_lived],
        "trimmed": [],
        "failed_thread_ids": [],
    }


def test_a_naive_now_is_refused(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL)
    with pytest.raises(InvalidRequest):
        agent.sweep_expired_threads(now=datetime.now())


# -- delete: the rows are gone ----------------------------------------------------------------------------
def test_no_row_of_a_deleted_thread_remains_in_any_table(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL)
    first = outputs(say(agent, "I'm headed to SF!", idempotency_key="key-1"))
    thread_id = first["thread_id"]
    begun_before_the_upgrade(agent, thread_id)  # so that its messages have blob rows too
    say(agent, "calculate 6*7", thread_id=thread_id, idempotency_key="key-2")
    say(agent, "New York instead", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
    agent.update_checkpoint_state(thread_id, None, [DANGLING_CALL])  # leaves pending writes
    agent.label_branch(thread_id, first["checkpoint_id"], "SF")  # a branch record
    keep = new_thread(agent, "another thread")
    before = rows_in_every_table(url, thread_id)
    # Every table with a thread_id column holds rows of the thread, or the test would prove little; but
    # the queue of turns waiting for the thread and the messages steered into its turns, empty once they ran,
    # and the runs, which only streamed and background turns have (`agent.runs`; these are unstreamed).
    assert before.pop("agent_claim_waiters") == 0
    assert before.pop("agent_steers") == 0
    assert before.pop("agent_runs") == 0
    assert all(count > 0 for count in before.values()), before
    assert set(before) >= set(thread_rows(url, thread_id))
    kept_before = rows_in_every_table(url, keep)

    removed = agent.sweep_expired_threads(now=expired_at(agent, thread_id))

    assert thread_id in removed["deleted_thread_ids"]
    assert rows_in_every_table(url, thread_id) == {table: 0 for table in [*before, "agent_claim_waiters", "agent_steers", "agent_runs"]}
    if keep not in removed["deleted_thread_ids"]:
        assert rows_in_every_table(url, keep) == kept_before


# -- keep_latest -----------------------------------------------------------------------------------------
def test_keep_latest_keeps_the_head_with_its_messages_and_the_thread_usable(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL, thread_ttl_strategy="keep_latest")
    first = outputs(say(agent, "I'm headed to SF!"))
    thread_id = first["thread_id"]
    say(agent, "calculate 6*7", thread_id=thread_id)
    say(agent, "New York instead", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])  # a branch
    say(agent, "Where am I going?", thread_id=thread_id)
    head = agent.storage.get_thread(thread_id).head_checkpoint_id
    head_before = message_dicts(head_messages(agent, thread_id))
    checkpoints = len(agent.get_checkpoint_history(thread_id, limit=100))
    assert checkpoints > 3 and len(head_before) >= 6

    removed = agent.sweep_expired_threads(now=expired_at(agent, thread_id))

    trimmed = [{"thread_id": thread_id, "removed_checkpoints": checkpoints - 1}]
    assert removed == {"deleted_thread_ids": [], "trimmed": trimmed, "failed_thread_ids": []}
    # A new agent has no cached message lists: the head's messages are read from what is stored now.
    reader = make_agent(url)
    assert message_dicts(head_messages(reader, thread_id)) == head_before
    state = reader.get_checkpoint_state(thread_id)
    assert state["checkpoint_id"] == head and len(state["messages"]) == len(head_before)
    [entry] = reader.get_checkpoint_history(thread_id, limit=100)
    assert entry["checkpoint_id"] == head and entry["parent_checkpoint_id"] is None and entry["is_head"]
    rows = thread_rows(url, thread_id)
    assert rows["checkpoints"] == 1
    if is_postgres(url):
        # Only the values the head points at remain (its messages in its row, or blob rows).
        with psycopg.connect(url) as conn:
            versions = conn.execute(
                "SELECT checkpoint -> 'channel_versions' FROM checkpoints WHERE thread_id = %s", (thread_id,)
            ).fetchone()[0]
            blobs = conn.execute(f"SELECT channel, version FROM {STORED_VALUES} WHERE thread_id = %s", (thread_id,)).fetchall()
        assert blobs and set(blobs) <= {(channel, str(version)) for channel, version in versions.items()}

    # The thread goes on from its head; its history is the head, then the new turn's checkpoints.
    after = outputs(say(reader, "And then?", thread_id=thread_id))
    assert after["parent_checkpoint_id"] == head
    history = reader.get_checkpoint_history(thread_id, limit=100)
    assert history[-1]["checkpoint_id"] == head and history[0]["checkpoint_id"] == after["checkpoint_id"]
    messages = message_dicts(head_messages(make_agent(url), thread_id))
    assert messages[: len(head_before)] == head_before and messages[len(head_before)]["content"] == "And then?"

    # Nothing left to trim: the next sweep leaves the thread alone (and says nothing about it).
    assert reader.sweep_expired_threads(now=expired_at(reader, thread_id)) == {"deleted_thread_ids": [], "trimmed": [], "failed_thread_ids": []}


def test_keep_latest_leaves_a_thread_of_one_checkpoint_alone(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL, thread_ttl_strategy="keep_latest")
    thread_id = new_thread(agent)
    agent.sweep_expired_threads(now=expired_at(agent, thread_id))
    assert agent.sweep_expired_threads(now=expired_at(agent, thread_id)) == {"deleted_thread_ids": [], "trimmed": [], "failed_thread_ids": []}
    assert len(agent.get_checkpoint_history(thread_id)) == 1


def test_after_keep_latest_edit_and_regenerate_say_why_not_and_what_still_works(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL, thread_ttl_strategy="keep_latest")
    thread_id = new_thread(agent, "I'm headed to SF!", turns=2)
    agent.sweep_expired_threads(now=expired_at(agent, thread_id))
    head = agent.storage.get_thread(thread_id).head_checkpoint_id
    messages = agent.get_checkpoint_state(thread_id)["messages"]
    first_user = messages[0]["id"]

    # Both are refused with the true reason, naming the checkpoint the sweep kept and the message; nothing is written.
    last_user = [m for m in messages if m["role"] == "user"][-1]["id"]
    for refused, names in (
        (lambda: say(agent, "I'm headed to Boston!", thread_id=thread_id, edit_message_id=first_user),
         f"Cannot edit message {first_user!r} of thread"),
        (lambda: agent.predict(request(None, thread_id=thread_id, regenerate=True)),
         f"Cannot regenerate the last answer (to user message {last_user!r}) of thread"),
    ):  # fmt: skip
        with pytest.raises(InvalidRequest) as error:
            refused()
        assert names in error.value.message
        assert "keep_latest retention sweep" in error.value.message
        assert "no earlier checkpoint to branch from" in error.value.message
        assert "empty root" not in error.value.message
        assert error.value.ids["checkpoint_id"] == head
    assert [h["checkpoint_id"] for h in agent.get_checkpoint_history(thread_id)] == [head]

    # What the message says still works does: a new turn, then editing and regenerating what it wrote...
    later = outputs(say(agent, "And then Boston", thread_id=thread_id))
    later_user = agent.get_checkpoint_state(thread_id)["messages"][len(messages)]["id"]
    edited = outputs(say(agent, "And then Denver", thread_id=thread_id, edit_message_id=later_user))
    assert edited["parent_checkpoint_id"] == head
    again = outputs(
        agent.predict(request(None, thread_id=thread_id, checkpoint_id=later["checkpoint_id"], regenerate=True))
    )
    assert again["parent_checkpoint_id"] == head
    # ...and update_checkpoint_state in place on the kept checkpoint, after which regenerate works.
    answer = messages[-1]["id"]
    updated = agent.update_checkpoint_state(thread_id, head, remove_message_ids=[answer])
    regenerated = outputs(agent.predict(request(None, thread_id=thread_id, regenerate=True)))
    assert regenerated["parent_checkpoint_id"] == updated["checkpoint_id"]
    assert head_messages(agent, thread_id)[-1].type == "ai"


# -- concurrency -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
def test_concurrent_sweepers_handle_each_expired_thread_exactly_once(url, make_agent, strategy):
    sweepers = [make_agent(url, thread_ttl_seconds=TTL, thread_ttl_strategy=strategy) for _ in range(2)]
    expired = [new_thread(sweepers[0], f"thread {n}", turns=2) for n in range(16)]
    live = new_thread(sweepers[0], "live")
    last_expired, live_at = updated_at(sweepers[0], expired[-1]), updated_at(sweepers[0], live)
    now = last_expired + timedelta(seconds=TTL) + (live_at - last_expired) / 2
    barrier = threading.Barrier(len(sweepers))
    results: list[dict] = [{}] * len(sweepers)

    def sweep(index: int) -> None:
        barrier.wait()
        results[index] = sweepers[index].sweep_expired_threads(now=now)

    workers = [threading.Thread(target=sweep, args=(i,)) for i in range(len(sweepers))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)

    key = "deleted_thread_ids" if strategy == "delete" else "trimmed"
    handled = [
        [entry if strategy == "delete" else entry["thread_id"] for entry in result[key]] for result in results
    ]
    assert sorted(handled[0] + handled[1]) == sorted(expired)
    assert not set(handled[0]) & set(handled[1])
    assert sweepers[0].get_checkpoint_history(live)


def test_a_thread_busy_with_a_turn_is_skipped(url, make_agent):
    agent = make_agent(url, thread_ttl_seconds=TTL)
    busy, idle = new_thread(agent, "busy"), new_thread(agent, "idle")
    now = max(expired_at(agent, busy), expired_at(agent, idle))

    with other_replica_holds(url, busy):
        assert agent.sweep_expired_threads(now=now) == {"deleted_thread_ids": [idle], "trimmed": [], "failed_thread_ids": []}
        assert agent.storage.get_thread(busy) is not None
    assert agent.sweep_expired_threads(now=now) == {"deleted_thread_ids": [busy], "trimmed": [], "failed_thread_ids": []}


def test_a_thread_that_got_a_turn_after_it_was_found_expired_survives(url, make_agent):
    """The expiry is checked again under the claim: a turn committed between the sweep's candidate
    query and its claim moves `updated_at`, and the thread stays."""
    agent = make_agent(url, thread_ttl_seconds=60)
    thread_id = new_thread(agent)
    age(url, thread_id, 61)
    candidates = agent.storage.expired_threads

    def then_a_turn(**kwargs):
        found = candidates(**kwargs)
        if found:
            say(agent, "still here", thread_id=thread_id)
        return found

    agent.storage.expired_threads = then_a_turn
    assert agent.sweep_expired_threads() == {"deleted_thread_ids": [], "trimmed": [], "failed_thread_ids": []}
    assert agent.get_checkpoint_history(thread_id)[0]["last_user_message"] == "still here"


# -- the command line and the server ---------------------------------------------------------------------
def test_tt_agent_sweep_prints_what_it_removed(tmp_path, make_agent):
    url = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    agent = make_agent(url)
    idle, fresh = new_thread(agent, "idle"), new_thread(agent, "fresh")
    age(url, idle, 120)
    agent.close()

    def tt_agent(*args: str):
        # In this process (the command's own code path; a subprocess would spend seconds importing).
        return CliRunner().invoke(cli_app, ["sweep", "--database-url", url, *args], catch_exceptions=False)

    done = tt_agent("--ttl-seconds", "60", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"deleted_thread_ids": [idle], "trimmed": [], "failed_thread_ids": []}
    done = tt_agent("--ttl-seconds", "60")
    assert done.exit_code == 0 and done.stdout.strip() == "Nothing expired."
    age(url, fresh, 120)
    done = tt_agent("--ttl-seconds", "60")
    assert done.stdout.strip() == f"deleted {fresh}"


def test_the_sweeper_in_tt_agent_serve_deletes_expired_threads(tmp_path):
    url = f"sqlite:///{tmp_path / 'served.sqlite'}"
    port = free_port()
    env = {
        "AGENT_DATABASE_URL": url,
        "AGENT_MODEL": "offline",
        "AGENT_TRACING": "false",
        "AGENT_THREAD_TTL_SECONDS": "1",
        "AGENT_SWEEP_INTERVAL_SECONDS": "0.2",
    }
    command = [sys.executable, "-m", "agent", "serve", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
        answer = httpx.post(f"{base_url}/invocations", json=request("I'm headed to SF!"), timeout=60).json()
        thread_id = answer["custom_outputs"]["thread_id"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and thread_rows(url, thread_id)["agent_threads"]:
            time.sleep(0.1)
        assert rows_in_every_table(url, thread_id) == dict.fromkeys(rows_in_every_table(url, thread_id), 0)
        history = httpx.post(
            f"{base_url}/invocations",
            json={"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id}},
            timeout=60,
        )
        assert history.status_code == 404


def test_a_ttl_beyond_a_hundred_years_is_refused_so_the_sweep_keeps_working(url, make_agent):
    agent = make_agent(url)
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    with pytest.raises(InvalidRequest, match="at most"):
        agent.update_thread(thread_id, ttl_seconds=1e13)
    with pytest.raises(InvalidRequest, match="at most"):
        agent.predict(request(action="update_thread", thread_id=thread_id, ttl_seconds=1e300))
    assert agent.get_thread(thread_id)["ttl_seconds"] is None  # nothing was written
    # The longest ttl allowed is one the sweep's query can add to a timestamp: it runs, and keeps the thread.
    agent.update_thread(thread_id, ttl_seconds=100 * 365 * 24 * 3600)
    assert agent.sweep_expired_threads() == {"deleted_thread_ids": [], "trimmed": [], "failed_thread_ids": []}
    assert agent.get_thread(thread_id)["thread_id"] == thread_id


def test_a_thread_trimmed_by_keep_latest_exports_and_imports_with_its_usage(url, make_agent):
    # The kept head is a root whose parents are gone: its turn's usage and the branch's totals cannot be
    # derived again on import, so the document carries them (found by scripts/soak.py's round trip).
    agent = make_agent(url, thread_ttl_seconds=TTL, thread_ttl_strategy="keep_latest")
    thread_id = new_thread(agent, turns=2)
    agent.sweep_expired_threads(now=expired_at(agent, thread_id))
    before = agent.get_usage(thread_id)
    assert before["thread_usage"]["input_tokens"] > 0 and before["branch_usage"]["input_tokens"] > 0

    copy = agent.import_thread(agent.export_thread(thread_id), thread_id="trimmed-copy")
    assert copy["thread_id"] == "trimmed-copy"
    after = agent.get_usage("trimmed-copy")
    assert after["branch_usage"] == before["branch_usage"]
    assert after["thread_usage"] == before["thread_usage"]
    # The copy goes on from its head, adding to the carried totals.
    say(agent, "And then?", thread_id="trimmed-copy")
    assert agent.get_usage("trimmed-copy")["branch_usage"]["input_tokens"] > before["branch_usage"]["input_tokens"]
