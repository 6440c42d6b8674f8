"""A checkpoint id names one thread, on Postgres (a unique index over the rows that are no copy) and SQLite (the
primary key of `agent_checkpoint_ids`).

* Two imports racing with the same checkpoint ids into two new threads (two agents, so two connections,
  held at a barrier just before their commits): exactly one commits, the other is `ThreadExists` and
  wrote nothing.
* Every root-namespace checkpoint is registered to its thread and nothing else is: after turns, a
  fork, a keep_latest sweep and prune, deletions; a LangGraph `copy_thread` copy keeps the source's ids
  unregistered, and a response id names the source (the copy once the source is gone); a deleted
  thread's ids can be imported again; a raw saver put of another thread's id is refused.
* The migration that registers the stored checkpoints refuses a database where two threads hold one
  id (rows written with SQL before it runs), names them, applies nothing, and runs once they are gone;
  a `copy_thread` copy is not a duplicate. On Postgres the registry is then replaced by the unique index:
  the table and the old index are gone, the new indexes valid, a copy's rows marked.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import threading
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from agent import ConfigurationError, ThreadExists
from agent.config import AgentSettings
from agent.storage import open_storage
from agent.storage.postgres import MIGRATIONS as POSTGRES_MIGRATIONS
from agent.storage.postgres import checkpoint_ids
from agent.storage.postgres.migrations import REGISTRY_REPLACED
from agent.storage.postgres.migrations import PUT_WITH_REGISTRATION
from agent.storage.sqlite import MIGRATIONS as SQLITE_MIGRATIONS
from tests.helpers.databases import fresh_database
from tests.helpers.reliability import HANG_TIMEOUT, is_postgres, sqlite_path, thread_rows
from tests.helpers.scenario import outputs, say


@pytest.fixture(params=["postgres", "sqlite"])
def url(request, pg_server_url, tmp_path):
    """A database of the test's own (its tables are counted and changed by hand)."""
    if request.param == "postgres":
        with fresh_database(pg_server_url) as found:
            yield found
    else:
        yield f"sqlite:///{tmp_path / 'ids.sqlite'}"


def query(url: str, statement: str, params: tuple = ()) -> list[tuple]:
    """Run one statement on a connection of its own (committed); its rows, if any."""
    if is_postgres(url):
        with psycopg.connect(url, autocommit=True) as conn:
            cur = conn.execute(statement.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []
    with sqlite3.connect(sqlite_path(url), isolation_level=None) as conn:
        return conn.execute(statement, params).fetchall()


def registered(url: str) -> set[tuple[str, str]]:
    """The (thread, checkpoint id) pairs that name a thread: on Postgres the rows the owner index holds."""
    if is_postgres(url):
        return set(query(url, OWNER_ROWS_SQL))
    return set(query(url, "SELECT thread_id, checkpoint_id FROM agent_checkpoint_ids"))


OWNER_ROWS_SQL = "SELECT thread_id, checkpoint_id FROM checkpoints WHERE checkpoint_ns = '' AND agent_copy IS NULL"


def root_checkpoints(url: str, *, leaving_out: tuple[str, ...] = ()) -> set[tuple[str, str]]:
    rows = query(url, "SELECT thread_id, checkpoint_id FROM checkpoints WHERE checkpoint_ns = ''")
    return {row for row in rows if row[0] not in leaving_out}


def document_elsewhere(make_agent) -> dict:
    """An exported thread of three turns written in another (in-memory) database."""
    scratch = make_agent("memory://")
    thread_id = outputs(say(scratch, "I'm headed to SF!"))["thread_id"]
    say(scratch, "with my dog", thread_id=thread_id)
    return scratch.export_thread(thread_id)


def renamed(document: dict, thread_id: str) -> dict:
    """The same document (same checkpoint ids) under another thread id, as a hostile client may send it."""
    other = copy.deepcopy(document)
    other["thread"]["thread_id"] = thread_id
    return other


def test_two_imports_racing_with_the_same_checkpoint_ids_into_two_new_threads_one_commits(url, make_agent):
    document = document_elsewhere(make_agent)
    ids = {c["checkpoint_id"] for c in document["checkpoints"]}
    agents = [make_agent(url), make_agent(url)]  # two storages: two connections (pools) to the database
    both_ready = threading.Barrier(2, timeout=HANG_TIMEOUT)
    for agent in agents:
        commit = agent.storage.commit

        def held_commit(claim, apply, commit=commit):
            both_ready.wait()  # each import has claimed its thread and buffered its checkpoints
            return commit(claim, apply)

        agent.storage.commit = held_commit
    outcomes: dict[str, object] = {}

    def run(agent, thread_id: str) -> None:
        try:
            outcomes[thread_id] = agent.import_thread(renamed(document, thread_id))
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcomes[thread_id] = exc

    racers = [threading.Thread(target=run, args=(agent, f"racer-{i}")) for i, agent in enumerate(agents)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(HANG_TIMEOUT)

    won = [t for t, outcome in outcomes.items() if isinstance(outcome, dict)]
    lost = [t for t, outcome in outcomes.items() if isinstance(outcome, ThreadExists)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert "another thread" in outcomes[lost[0]].message and outcomes[lost[0]].ids["checkpoint_id"] in ids
    assert set(thread_rows(url, lost[0]).values()) == {0}  # nothing of the loser, not even its claim
    assert registered(url) == {(won[0], checkpoint_id) for checkpoint_id in ids}
    assert all(agents[0].storage.thread_of_checkpoint(checkpoint_id) == won[0] for checkpoint_id in ids)


def test_every_root_checkpoint_is_registered_to_its_thread_through_turns_forks_trims_and_deletes(url, make_agent):
    agent = make_agent(url, thread_ttl_strategy="keep_latest")
    first = outputs(say(agent, "one"))
    thread_id = first["thread_id"]
    say(agent, "two", thread_id=thread_id)
    say(agent, "a branch", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
    agent.fork_thread(thread_id, new_thread_id="a-fork")
    other = outputs(say(agent, "another thread"))["thread_id"]
    say(agent, "more", thread_id=other)
    assert registered(url) == root_checkpoints(url)

    agent.update_thread(thread_id, ttl_seconds=60)
    trimmed = agent.sweep_expired_threads(now=datetime.now(timezone.utc) + timedelta(hours=1))["trimmed"]
    assert [entry["thread_id"] for entry in trimmed] == [thread_id]  # keep_only_head
    agent.storage.saver.prune([other], strategy="keep_latest")  # the saver's own prune
    assert registered(url) == root_checkpoints(url)
    assert len([row for row in registered(url) if row[0] == thread_id]) == 1

    agent.delete_thread("a-fork")
    assert registered(url) == root_checkpoints(url)
    assert not [row for row in registered(url) if row[0] == "a-fork"]


def test_a_deleted_threads_checkpoint_ids_can_be_imported_again_under_another_thread_id(url, make_agent):
    document = document_elsewhere(make_agent)
    agent = make_agent(url)
    agent.import_thread(document)
    with pytest.raises(ThreadExists, match="checkpoints"):
        agent.import_thread(renamed(document, "second-home"))
    agent.delete_thread(document["thread"]["thread_id"])
    assert agent.import_thread(renamed(document, "second-home"))["thread_id"] == "second-home"
    assert {t for t, _ in registered(url)} == {"second-home"}


def test_a_copy_thread_copy_keeps_the_ids_and_its_response_ids_name_the_source_until_it_is_gone(url, make_agent):
    agent = make_agent(url)
    answer = outputs(say(agent, "I'm headed to SF!"))
    source, head = answer["thread_id"], answer["checkpoint_id"]
    agent.storage.saver.copy_thread(source, "the-copy")  # LangGraph's API: the same checkpoint ids
    source_ids = {c for _, c in root_checkpoints(url, leaving_out=("the-copy",))}
    assert root_checkpoints(url, leaving_out=(source,)) == {("the-copy", c) for c in source_ids}
    assert registered(url) == root_checkpoints(url, leaving_out=("the-copy",))
    assert agent.storage.thread_of_checkpoint(head) == source
    agent.delete_thread(source)
    assert agent.storage.thread_of_checkpoint(head) == "the-copy"
    assert agent.storage.thread_of_checkpoint(str(uuid.uuid4())) is None


def test_a_raw_saver_put_of_another_threads_checkpoint_id_is_refused_and_writes_nothing(url, make_agent):
    agent = make_agent(url)
    answer = outputs(say(agent, "hello"))
    saver = agent.storage.saver
    taken = saver.get_tuple({"configurable": {"thread_id": answer["thread_id"], "checkpoint_ns": ""}})
    before = thread_rows(url, "raw-thread")
    config = {"configurable": {"thread_id": "raw-thread", "checkpoint_ns": ""}}
    with pytest.raises(ThreadExists) as refused:
        saver.put(config, taken.checkpoint, {"source": "input", "step": -1}, {})
    assert refused.value.ids["checkpoint_id"] == answer["checkpoint_id"]
    assert saver.get_tuple(config) is None
    assert thread_rows(url, "raw-thread")["checkpoints"] == before["checkpoints"] == 0
    # The same checkpoint written again in its own thread is fine (LangGraph may write one twice).
    parent = answer["parent_checkpoint_id"]
    again = {"configurable": {"thread_id": answer["thread_id"], "checkpoint_ns": "", "checkpoint_id": parent}}
    saver.put(again, taken.checkpoint, taken.metadata, {})
    assert agent.storage.thread_of_checkpoint(answer["checkpoint_id"]) == answer["thread_id"]


def test_a_refused_import_of_another_users_checkpoint_ids_leaves_nothing_behind_not_even_in_memory(url, make_agent):
    # The import names Alice's checkpoints with Bob's words; the database refuses it at the commit. Nothing
    # of it may stay in the process's caches either: Alice's reads, a fork of her thread (which copies what
    # it reads) and the search rows of her next turn (whose inherited words come from the cache) must all be
    # hers, in this process and in a new one.
    agent = make_agent(url)
    answer = outputs(say(agent, "original words of alice", user_id="alice"))
    thread_id = answer["thread_id"]
    document = agent.export_thread(thread_id, user_id="alice")
    tampered = json.loads(json.dumps(renamed(document, "bobs-copy")).replace("original words", "zebra words"))
    with pytest.raises(ThreadExists):
        agent.import_thread(tampered, user_id="bob")

    def texts(reader, thread: str) -> list[str]:
        return [m["content"][0]["text"] for m in reader.get_checkpoint_state(thread, user_id="alice")["messages"]]

    assert "original words of alice" in texts(agent, thread_id)
    assert not any("zebra" in text for text in texts(agent, thread_id))
    assert agent.get_checkpoint_history(thread_id, user_id="alice", limit=1)[0]["last_user_message"] == (
        "original words of alice"
    )
    fork = agent.fork_thread(thread_id, user_id="alice")["thread_id"]
    say(agent, "a zebra at last", thread_id=thread_id, user_id="alice")
    assert {hit["thread_id"] for hit in agent.search_threads("zebra", user_id="alice")} == {thread_id}
    fresh = make_agent(url)
    assert not any("zebra" in text for text in texts(fresh, fork))
    assert "original words of alice" in texts(fresh, fork)
    assert agent.storage.thread_of_checkpoint(answer["checkpoint_id"]) == thread_id
    assert thread_rows(url, "bobs-copy")["checkpoints"] == 0


# -- the migration -------------------------------------------------------------------------------------


def registry_migration(migrations: list) -> int:
    """The position of the migration that creates agent_checkpoint_ids."""
    def creates(migration) -> bool:
        statements = migration if isinstance(migration, list) else [migration]
        return any("CREATE TABLE IF NOT EXISTS agent_checkpoint_ids" in s for s in statements)

    return next(i for i, migration in enumerate(migrations) if creates(migration))


def as_before_the_registry(url: str) -> None:
    """The database as an agent without `agent_checkpoint_ids` left it (its migrations, and on Postgres the
    later ones that replaced it by an index, not applied)."""
    if is_postgres(url):
        for statement in (
            "DROP TABLE IF EXISTS agent_checkpoint_ids",
            f"DROP INDEX {checkpoint_ids.OWNER_INDEX}",
            f"DROP INDEX {checkpoint_ids.COPIES_INDEX}",
            "ALTER TABLE checkpoints DROP COLUMN agent_copy",
        ):
            query(url, statement)
        query(url, "DELETE FROM agent_migrations WHERE v >= ?", (registry_migration(POSTGRES_MIGRATIONS),))
    else:
        query(url, "DROP TABLE agent_checkpoint_ids")
        query(url, f"PRAGMA user_version = {registry_migration(SQLITE_MIGRATIONS)}")


def duplicate_with_sql(url: str, source: str, intruder: str) -> None:
    """Copy every checkpoint row of `source` (same ids) to `intruder`, with no record: a true duplicate."""
    query(
        url,
        "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
        "metadata) SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata "
        "FROM checkpoints WHERE thread_id = ?",
        (intruder, source),
    )


def setup_of(url: str):
    return open_storage(url, AgentSettings(model="offline"))


def thread_after_setup(url: str, checkpoint_id: str) -> str | None:
    """Set the database up (its pending migrations applied) and answer which thread `checkpoint_id` names."""
    storage = setup_of(url)
    try:
        storage.setup()
        return storage.thread_of_checkpoint(checkpoint_id)
    finally:
        storage.close()


def test_the_registry_migration_refuses_checkpoint_ids_held_by_two_threads_naming_them(url, make_agent):
    agent = make_agent(url)
    answer = outputs(say(agent, "I'm headed to SF!"))
    agent.close()
    as_before_the_registry(url)
    duplicate_with_sql(url, answer["thread_id"], "intruder")
    ids = sorted(c for t, c in root_checkpoints(url) if t == "intruder")

    storage = setup_of(url)
    try:
        with pytest.raises(ConfigurationError) as refused:
            storage.setup()
    finally:
        storage.close()
    message = refused.value.message
    assert f"{len(ids)} checkpoint id(s) belong to more than one thread" in message
    assert all(checkpoint_id in message for checkpoint_id in ids)
    assert f"threads 'intruder', {answer['thread_id']!r}" in message or f"{answer['thread_id']!r}, 'intruder'" in message
    assert "tt-agent import FILE --thread-id NEW_ID" in message
    # Nothing of the migration was applied.
    if is_postgres(url):
        assert query(url, "SELECT to_regclass('agent_checkpoint_ids')") == [(None,)]
        assert query(url, "SELECT max(v) FROM agent_migrations") == [(registry_migration(POSTGRES_MIGRATIONS) - 1,)]
    else:
        assert query(url, "SELECT name FROM sqlite_master WHERE name = 'agent_checkpoint_ids'") == []
        assert query(url, "PRAGMA user_version") == [(registry_migration(SQLITE_MIGRATIONS),)]

    query(url, "DELETE FROM checkpoints WHERE thread_id = 'intruder'")  # the operator's fix
    assert thread_after_setup(url, answer["checkpoint_id"]) == answer["thread_id"]
    assert registered(url) == root_checkpoints(url)


def test_the_registry_migration_takes_a_copy_thread_copy_for_no_duplicate(url, make_agent, caplog):
    agent = make_agent(url)
    answer = outputs(say(agent, "I'm headed to SF!"))
    agent.storage.saver.copy_thread(answer["thread_id"], "the-copy")  # its record's forked_from names the source
    agent.close()
    as_before_the_registry(url)

    assert thread_after_setup(url, answer["checkpoint_id"]) == answer["thread_id"]
    assert registered(url) == root_checkpoints(url, leaving_out=("the-copy",))
    # A table a pending migration creates is an upgrade, not a dropped table: no "re-creating everything".
    assert "were missing" not in caplog.text
    if is_postgres(url):  # the registry came and went again: the index holds the rule, the copy marked
        assert query(url, "SELECT to_regclass('agent_checkpoint_ids'), to_regclass('agent_checkpoints_checkpoint_id_idx')") == [
            (None, None)
        ]
        valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(?)"
        assert query(url, valid, (checkpoint_ids.OWNER_INDEX,)) == query(url, valid, (checkpoint_ids.COPIES_INDEX,)) == [(True,)]
        marked = query(url, "SELECT DISTINCT thread_id FROM checkpoints WHERE agent_copy")
        assert marked == [("the-copy",)]


def test_the_index_migration_without_the_registry_knows_a_copy_by_its_record(pg_server_url, make_agent):
    """Migrations undone by hand back to the column's, the table already gone: a copy is still marked, by the
    `forked_from` of its record, and the unique index is built over the rest."""
    with fresh_database(pg_server_url) as url:
        agent = make_agent(url)
        answer = outputs(say(agent, "I'm headed to SF!"))
        agent.storage.saver.copy_thread(answer["thread_id"], "the-copy")
        agent.close()
        query(url, f"DROP INDEX {checkpoint_ids.OWNER_INDEX}, {checkpoint_ids.COPIES_INDEX}")
        query(url, "ALTER TABLE checkpoints DROP COLUMN agent_copy")
        query(url, "DELETE FROM agent_migrations WHERE v >= ?", (REGISTRY_REPLACED,))

        assert thread_after_setup(url, answer["checkpoint_id"]) == answer["thread_id"]
        assert query(url, "SELECT DISTINCT thread_id FROM checkpoints WHERE agent_copy") == [("the-copy",)]
        assert registered(url) == root_checkpoints(url, leaving_out=("the-copy",))


# -- found by the upgrade check of the index that replaced the registry (Postgres) ------------------------------


def root_head(saver, thread_id: str) -> dict:
    """The thread's newest root-namespace checkpoint, as LangGraph's `put` takes it."""
    return saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}).checkpoint


def raw_put(saver, thread_id: str, checkpoint: dict) -> None:
    """LangGraph's own write of `checkpoint` into `thread_id` (root namespace), as any graph may call it."""
    saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, checkpoint, {"source": "input", "step": -1}, {})


def test_a_checkpoint_id_with_a_line_break_held_by_another_thread_is_named(url, make_agent):
    """The id is parsed from the unique violation's DETAIL on Postgres; an id may hold a line break (a raw saver
    put writes any string), and the error must still name it, as the registry's error did."""
    agent = make_agent(url)
    thread_id = outputs(say(agent, "hello"))["thread_id"]
    odd = dict(root_head(agent.storage.saver, thread_id), id="two\nlines) (checkpoint_id)=(x")
    raw_put(agent.storage.saver, "owner", odd)
    with pytest.raises(ThreadExists) as refused:
        raw_put(agent.storage.saver, "thief", odd)
    assert refused.value.ids["checkpoint_id"] == odd["id"]
    assert agent.storage.thread_of_checkpoint(odd["id"]) == "owner"


def test_setup_that_cannot_build_the_owner_index_does_not_leave_the_rule_off_for_every_id(pg_server_url, make_agent):
    """Two threads hold one id (written in the upgrade's window, before the owner index was built, as its module
    docstring allows): the build fails. Setup must then either refuse, naming the id (as the registry's
    migration refused such a database), or still hold the rule for every other id; it did neither (a warning
    that "queries it serves are slower", the agent ready, any id writable into two threads)."""
    with fresh_database(pg_server_url) as url:
        agent = make_agent(url)
        answer = outputs(say(agent, "hello"))
        agent.close()
        query(url, f"DROP INDEX {checkpoint_ids.OWNER_INDEX}")  # the window between the migrations and the build
        duplicate_with_sql(url, answer["thread_id"], "intruder")
        query(url, "UPDATE checkpoints SET agent_copy = NULL WHERE thread_id = 'intruder'")

        storage = setup_of(url)
        try:
            try:
                storage.setup()
            except ConfigurationError as refused:
                assert answer["checkpoint_id"] in refused.message
                return
            assert storage.thread_of_checkpoint(answer["checkpoint_id"]) == min(answer["thread_id"], "intruder")
            fresh = dict(root_head(storage.saver, answer["thread_id"]), id=str(uuid.uuid4()))
            raw_put(storage.saver, "first", fresh)
            with pytest.raises(ThreadExists):
                raw_put(storage.saver, "second", fresh)
        finally:
            storage.close()


def test_setup_replaces_the_registry_again_when_an_older_agent_recreated_it(pg_server_url, make_agent):
    """A replica of the previous release still running during a rolling upgrade finds `agent_checkpoint_ids` gone,
    re-creates it and re-applies its migrations (its registering `agent_put_checkpoint` included), and its turns
    commit. The next setup of this release found the migrations current and left it so: deletes no longer
    unregister ids, and importing a deleted thread's ids under another thread id failed with an internal error."""
    with fresh_database(pg_server_url) as url:
        agent = make_agent(url)
        answer = outputs(say(agent, "hello"))
        document = agent.export_thread(answer["thread_id"])
        agent.close()
        # What the previous release's setup re-applies (statements kept in MIGRATIONS as history).
        registry = registry_migration(POSTGRES_MIGRATIONS)
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in (
                *POSTGRES_MIGRATIONS[registry : registry + 2],
                POSTGRES_MIGRATIONS[PUT_WITH_REGISTRATION],
                checkpoint_ids.REGISTER_STORED_SQL,
            ):
                conn.execute(statement)

        agent = make_agent(url)  # this release's next setup
        agent.delete_thread(answer["thread_id"])
        assert agent.import_thread(renamed(document, "second-home"))["thread_id"] == "second-home"
        assert query(url, "SELECT to_regclass('agent_checkpoint_ids')") == [(None,)]
