"""`search_threads`: every branch is searched, each hit names where its message first appeared, no user sees
another's text, and a deleted branch's or thread's text is no longer found. On Postgres and on a SQLite file."""

from __future__ import annotations

import uuid

import pytest

from agent import InvalidRequest
from tests.helpers.scenario import outputs, say


def test_search_finds_text_on_every_branch_where_it_first_appeared(agent):
    first = outputs(say(agent, "I'm planning for an upcoming trip!", user_id="ada"))
    thread_id = first["thread_id"]
    sf = outputs(say(agent, "I'm headed to Sausalito by ferry", thread_id=thread_id, user_id="ada"))
    say(agent, "What should I pack?", thread_id=thread_id, user_id="ada")
    ny = outputs(say(agent, "I'm headed to Brooklyn by ferry", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="ada"))

    hits = agent.search_threads("ferry", user_id="ada", limit=50)
    found = {(hit["checkpoint_id"], hit["message_id"]) for hit in hits}
    for said in (sf, ny):
        user_message = agent.get_checkpoint_state(thread_id, said["checkpoint_id"], user_id="ada")["messages"][-2]
        assert (said["checkpoint_id"], user_message["id"]) in found  # one hit on each branch
    branches = [b["checkpoint_id"] for b in agent.list_branches(thread_id, user_id="ada")]
    for hit in hits:
        assert hit["thread_id"] == thread_id and "ferry" in hit["snippet"]
        # The hit names the checkpoint where its message first appeared on a branch: a client opens it there.
        assert any(
            item["id"] == hit["message_id"] and item["checkpoint_id"] == hit["checkpoint_id"]
            for leaf in branches
            for item in agent.get_checkpoint_state(thread_id, leaf, user_id="ada")["messages"]
        )
    # Every word must appear; case does not matter.
    assert [hit["checkpoint_id"] for hit in agent.search_threads("BROOKLYN ferry", user_id="ada") if "Brooklyn" in hit["snippet"]][0] == ny["checkpoint_id"]
    assert agent.search_threads("Brooklyn Sausalito", user_id="ada") == []


def test_search_never_sees_another_users_text(agent):
    mine = outputs(say(agent, "the secret word is zanzibar", user_id="ada"))
    theirs = outputs(say(agent, "my zanzibar notes", user_id="bob"))
    assert {hit["thread_id"] for hit in agent.search_threads("zanzibar", user_id="ada")} == {mine["thread_id"]}
    assert {hit["thread_id"] for hit in agent.search_threads("zanzibar", user_id="bob")} == {theirs["thread_id"]}
    assert agent.search_threads("zanzibar", user_id="eve") == []


def test_a_deleted_branchs_text_is_no_longer_found(agent):
    # A user of its own: other modules on the same database write "Lisbon" for "ada" too.
    ada = f"ada-{uuid.uuid4().hex[:8]}"
    first = outputs(say(agent, "planning a trip", user_id=ada))
    thread_id = first["thread_id"]
    doomed = outputs(say(agent, "maybe Reykjavik instead", thread_id=thread_id, user_id=ada))
    say(agent, "no, Lisbon", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id=ada)
    assert agent.search_threads("Reykjavik", user_id=ada)
    agent.delete_branch(thread_id, doomed["checkpoint_id"], user_id=ada)
    assert agent.search_threads("Reykjavik", user_id=ada) == []
    assert agent.search_threads("Lisbon", user_id=ada)
    agent.delete_thread(thread_id, user_id=ada)
    assert agent.search_threads("Lisbon", user_id=ada) == []


def test_a_query_without_words_is_refused(agent):
    with pytest.raises(InvalidRequest, match="word"):
        agent.search_threads("  ?! ", user_id="ada")


def test_search_is_an_action_too(agent):
    thread_id = outputs(say(agent, "walrus facts please", user_id="ada"))["thread_id"]
    response = agent.predict({"input": [], "custom_inputs": {"action": "search_threads", "query": "walrus", "user_id": "ada"}})
    hits = response.custom_outputs["hits"]
    assert hits and all(hit["thread_id"] == thread_id for hit in hits)


def test_after_keep_latest_the_heads_text_is_found_at_the_head_and_nothing_else(backend_url, make_agent):
    from tests.operations.test_retention import TTL, expired_at

    agent = make_agent(backend_url, thread_ttl_seconds=TTL, thread_ttl_strategy="keep_latest")
    first = outputs(say(agent, "pelican sighting", user_id="ada"))
    thread_id = first["thread_id"]
    say(agent, "kestrel sighting", thread_id=thread_id, user_id="ada")
    say(agent, "osprey sighting", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="ada")
    head = agent.get_head(thread_id, user_id="ada")["checkpoint_id"]
    agent.sweep_expired_threads(now=expired_at(agent, thread_id))
    assert agent.search_threads("kestrel", user_id="ada") == []  # the other branch is gone
    for word in ("pelican", "osprey"):
        hits = agent.search_threads(word, user_id="ada")
        assert hits and {hit["checkpoint_id"] for hit in hits} == {head}


def test_backfill_indexes_messages_written_before_the_index_and_a_second_run_does_nothing(agent):
    first = outputs(say(agent, "the albatross circled", user_id="ada"))
    thread_id = first["thread_id"]
    say(agent, "then a second albatross", thread_id=thread_id, user_id="ada")
    say(agent, "a cormorant dived", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="ada")
    before = agent.search_threads("albatross", user_id="ada")
    assert len(before) >= 2
    # What an upgrade leaves: checkpoints without index rows (the migration drops the earlier layout's).
    agent.storage.clear_search_index()
    assert agent.search_threads("albatross", user_id="ada") == []

    indexed = agent.backfill_search_index(batch_size=1)  # one checkpoint per transaction: pages must chain
    assert indexed["indexed_checkpoints"] >= 3
    assert sorted(map(str, agent.search_threads("albatross", user_id="ada"))) == sorted(map(str, before))
    assert agent.search_threads("cormorant", user_id="ada")
    assert agent.backfill_search_index() == {"indexed_checkpoints": 0}
    assert sorted(map(str, agent.search_threads("albatross", user_id="ada"))) == sorted(map(str, before))


def test_a_rebuild_forgets_deleted_branches_and_finds_the_rest(agent):
    first = outputs(say(agent, "planning a trip", user_id="ada"))
    thread_id = first["thread_id"]
    doomed = outputs(say(agent, "maybe Reykjavik instead", thread_id=thread_id, user_id="ada"))
    say(agent, "no, Lisbon", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="ada")
    agent.delete_branch(thread_id, doomed["checkpoint_id"], user_id="ada")
    lisbon = agent.search_threads("Lisbon", user_id="ada")
    assert agent.backfill_search_index(rebuild=True)["indexed_checkpoints"] >= 2
    assert agent.search_threads("Reykjavik", user_id="ada") == []
    assert agent.search_threads("Lisbon", user_id="ada") == lisbon


def test_a_forks_messages_are_found_in_the_fork_too(agent):
    first = outputs(say(agent, "a narwhal surfaced", user_id="ada"))
    fork = agent.fork_thread(first["thread_id"], user_id="ada")
    found = {hit["thread_id"] for hit in agent.search_threads("narwhal", user_id="ada")}
    assert found == {first["thread_id"], fork["thread_id"]}


def rows_holding(url: str, word: str) -> int:
    """How many search index rows hold `word`'s key, as the backend's index (GIN, FTS5) finds them."""
    from agent.storage import search

    key = search.word_key(word)
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(url) as conn:
            return conn.execute("SELECT count(*) FROM checkpoints WHERE agent_terms @> ARRAY[%s]", (key,)).fetchone()[0]
    import sqlite3

    conn = sqlite3.connect(url.split("sqlite:///", 1)[1])
    try:
        match = f'"{search.fts5_token(key)}"'
        return conn.execute("SELECT count(*) FROM agent_message_terms WHERE agent_message_terms MATCH ?", (match,)).fetchone()[0]
    finally:
        conn.close()


def test_the_index_holds_word_keys_not_text(backend_url, make_agent):
    from agent.storage import search

    agent = make_agent(backend_url)
    say(agent, "xylophonist quartets", user_id="ada")
    assert rows_holding(backend_url, "xylophonist") == 1
    if backend_url.startswith("postgres"):
        import psycopg

        with psycopg.connect(backend_url) as conn:
            rows = conn.execute("SELECT agent_terms FROM checkpoints WHERE agent_terms IS NOT NULL").fetchall()
        assert rows and all(isinstance(k, int) for (terms,) in rows for k in terms)
    else:
        import sqlite3

        with sqlite3.connect(backend_url.split("sqlite:///", 1)[1]) as conn:
            stored = b"".join(bytes(block) for (block,) in conn.execute("SELECT block FROM agent_message_terms_data"))
            stored += "".join(terms for (terms,) in conn.execute("SELECT terms FROM agent_message_rows")).encode()
        conn.close()
        assert search.fts5_token(search.word_key("xylophonist")).encode() in stored
        assert b"xylophonist" not in stored and b"quartets" not in stored


def test_every_fts5_token_is_one_token_of_the_sqlite_index(tmp_path, make_agent):
    import sqlite3

    from agent.storage import search

    make_agent(f"sqlite:///{tmp_path / 'tokens.sqlite'}").close()
    conn = sqlite3.connect(str(tmp_path / "tokens.sqlite"), isolation_level=None)
    try:
        # Every digit in every place of a token, and a key whose token is all punctuation.
        keys = [sum(d << shift for shift in (18, 12, 6, 0)) for d in range(64)] + [0x9E79E7, 0xFFFFFF]
        for n, key in enumerate(keys):
            conn.execute("INSERT INTO agent_message_rows (thread_id, checkpoint_id, terms) VALUES ('t', ?, ?)",
                         (str(n), search.fts5_tokens([key, keys[n - 1]])))  # fmt: skip
        for n, key in enumerate(keys):
            match = f'"{search.fts5_token(key)}"'
            found = {row for (row,) in conn.execute(
                "SELECT m.checkpoint_id FROM agent_message_terms JOIN agent_message_rows m ON m.id = agent_message_terms.rowid "
                "WHERE agent_message_terms MATCH ?", (match,))}  # fmt: skip
            assert str(n) in found and found <= {str(i) for i, k in enumerate(keys) if key in (k, keys[i - 1])}
    finally:
        conn.close()


def test_a_word_said_on_every_turn_is_indexed_once_per_branch_and_found_at_every_turn(agent, backend_url):
    first = outputs(say(agent, "the shoebill by the weir", user_id="ada"))
    thread_id = first["thread_id"]
    said = [first]
    for text in ("another shoebill", "a third shoebill", "one more shoebill"):
        said.append(outputs(say(agent, text, thread_id=thread_id, user_id="ada")))
    # A branch from before the word was said brings it to that branch once more.
    said.append(outputs(say(agent, "a grey shoebill", thread_id=thread_id, checkpoint_id=first["parent_checkpoint_id"], user_id="ada")))
    said.append(outputs(say(agent, "that shoebill again", thread_id=thread_id, user_id="ada")))

    assert rows_holding(backend_url, "shoebill") == 2  # once per branch, not once per turn
    hits = agent.search_threads("shoebill", user_id="ada", limit=100)
    found = {(hit["checkpoint_id"], hit["message_id"]) for hit in hits}
    for turn in said:
        user_message = agent.get_checkpoint_state(thread_id, turn["checkpoint_id"], user_id="ada")["messages"][-2]
        assert "shoebill" in str(user_message["content"]) and (turn["checkpoint_id"], user_message["id"]) in found
    ids = [hit["checkpoint_id"] for hit in hits]
    assert ids == sorted(ids, reverse=True)  # newest first


def test_deleting_the_branch_that_said_a_word_first_keeps_it_found_on_a_sibling(agent, backend_url):
    first = outputs(say(agent, "planning a trip", user_id="ada"))
    thread_id = first["thread_id"]
    doomed = outputs(say(agent, "maybe Reykjavik", thread_id=thread_id, user_id="ada"))
    kept = outputs(say(agent, "Reykjavik in winter", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="ada"))
    agent.delete_branch(thread_id, doomed["checkpoint_id"], user_id="ada")
    hits = agent.search_threads("Reykjavik", user_id="ada")
    assert hits and all(hit["checkpoint_id"] >= kept["checkpoint_id"] for hit in hits)
    assert agent.search_threads("maybe Reykjavik", user_id="ada") == []


def test_a_deleted_branch_leaves_no_index_entry(agent, backend_url):
    first = outputs(say(agent, "planning a trip", user_id="ada"))
    thread_id = first["thread_id"]
    doomed = outputs(say(agent, "maybe Ouagadougou instead", thread_id=thread_id, user_id="ada"))
    say(agent, "no, Valparaiso", thread_id=thread_id, checkpoint_id=first["checkpoint_id"], user_id="ada")
    assert rows_holding(backend_url, "ouagadougou") == 1
    agent.delete_branch(thread_id, doomed["checkpoint_id"], user_id="ada")
    # On SQLite the FTS5 index forgets the row too (the contentless table before kept it until a rebuild).
    assert rows_holding(backend_url, "ouagadougou") == 0
    assert rows_holding(backend_url, "valparaiso") == 1


def test_limit_keeps_the_newest_hits_over_every_thread(agent):
    threads = []
    for n in range(4):
        thread_id = outputs(say(agent, f"puffin colony {n}", user_id="ada"))["thread_id"]
        threads.append(thread_id)
        say(agent, f"more puffin notes {n}", thread_id=thread_id, user_id="ada")
    say(agent, "a last puffin", thread_id=threads[0], user_id="ada")  # the oldest thread has the newest hit
    every = agent.search_threads("puffin", user_id="ada", limit=100)
    assert len({hit["thread_id"] for hit in every}) == 4
    assert [hit["checkpoint_id"] for hit in every] == sorted((hit["checkpoint_id"] for hit in every), reverse=True)
    assert every[0]["thread_id"] == threads[0]
    for limit in (1, 3, 5):
        assert agent.search_threads("puffin", user_id="ada", limit=limit) == every[:limit]


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_an_index_in_the_earlier_layout_goes_at_the_upgrade_and_the_backfill_finds_its_messages(
    backend, pg_server_url, tmp_path, make_agent
):
    import sqlite3

    import psycopg

    from agent.storage.postgres.migrations import MIGRATIONS as POSTGRES_MIGRATIONS
    from agent.storage.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS
    from tests.helpers.databases import fresh_database

    with fresh_database(pg_server_url) as pg:
        url = pg if backend == "postgres" else f"sqlite:///{tmp_path / 'earlier.sqlite'}"
        agent = make_agent(url)
        first = outputs(say(agent, "a heron by the weir", user_id="ada"))
        say(agent, "and a kingfisher", thread_id=first["thread_id"], user_id="ada")
        before = agent.search_threads("heron", user_id="ada")
        assert before
        agent.close()

        # The previous release's search tables (with a row of text) and schema version.
        if backend == "postgres":
            earlier = next(i for i, m in enumerate(POSTGRES_MIGRATIONS) if m == "DROP TABLE IF EXISTS agent_message_text")
            with psycopg.connect(url) as conn:
                conn.execute("ALTER TABLE checkpoints DROP COLUMN agent_terms")
                for migration in POSTGRES_MIGRATIONS[:earlier]:
                    if "agent_message_text" in migration:
                        conn.execute(migration)
                conn.execute("INSERT INTO agent_message_text VALUES (%s, %s, 'm1', 'a heron by the weir')",
                             (first["thread_id"], first["checkpoint_id"]))  # fmt: skip
                conn.execute("DELETE FROM agent_migrations WHERE v >= %s", (earlier,))
        else:
            earlier = next(i for i, m in enumerate(SQLITE_MIGRATIONS) if "DROP TABLE IF EXISTS agent_message_text" in m)
            conn = sqlite3.connect(str(tmp_path / "earlier.sqlite"), isolation_level=None)
            conn.execute("DROP TABLE agent_message_terms")
            conn.execute("DROP TABLE agent_message_rows")
            for migration in SQLITE_MIGRATIONS[:earlier]:
                if any("agent_message_text" in statement for statement in migration):
                    for statement in migration:
                        conn.execute(statement)
            conn.execute("INSERT INTO agent_message_text (thread_id, checkpoint_id, message_ids, body) VALUES (?, ?, 'm1', 'a heron by the weir')",
                         (first["thread_id"], first["checkpoint_id"]))  # fmt: skip
            conn.execute(f"PRAGMA user_version = {earlier}")
            conn.close()

        upgraded = make_agent(url)
        assert upgraded.search_threads("heron", user_id="ada") == []  # the earlier rows (and their text) are gone
        assert upgraded.backfill_search_index()["indexed_checkpoints"] >= 2
        assert upgraded.search_threads("heron", user_id="ada") == before
        assert upgraded.search_threads("kingfisher", user_id="ada")
        if backend == "postgres":
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT to_regclass('agent_message_text')").fetchone()[0] is None
        else:
            conn = sqlite3.connect(str(tmp_path / "earlier.sqlite"))
            assert not conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'agent_message_text%'").fetchall()
            conn.close()
        upgraded.close()


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_the_index_of_every_checkpoints_words_goes_at_the_upgrade_and_the_backfill_indexes_once_per_branch(
    backend, pg_server_url, tmp_path, make_agent
):
    import sqlite3

    import psycopg

    from agent.storage import search
    from agent.storage.postgres.migrations import MIGRATIONS as POSTGRES_MIGRATIONS
    from agent.storage.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS
    from tests.helpers.databases import fresh_database

    with fresh_database(pg_server_url) as pg:
        path = tmp_path / "earlier.sqlite"
        url = pg if backend == "postgres" else f"sqlite:///{path}"
        agent = make_agent(url)
        first = outputs(say(agent, "a spoonbill by the weir", user_id="ada"))
        second = outputs(say(agent, "the spoonbill again", thread_id=first["thread_id"], user_id="ada"))
        before = agent.search_threads("spoonbill", user_id="ada")
        assert len(before) >= 2
        agent.close()

        # The previous release's index: a row per checkpoint with every word of its new messages.
        old_keys = search.query_keys(["the", "spoonbill", "again"])
        if backend == "postgres":
            earlier = POSTGRES_MIGRATIONS.index("TRUNCATE agent_message_terms")
            with psycopg.connect(url) as conn:
                conn.execute("ALTER TABLE checkpoints DROP COLUMN agent_terms")
                for migration in POSTGRES_MIGRATIONS[:earlier]:
                    if "agent_message_terms" in migration and "FUNCTION" not in migration:
                        conn.execute(migration)
                conn.execute("INSERT INTO agent_message_terms VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                             (first["thread_id"], second["checkpoint_id"], old_keys))  # fmt: skip
                conn.execute("DELETE FROM agent_migrations WHERE v >= %s", (earlier,))
        else:
            earlier = next(i for i, m in enumerate(SQLITE_MIGRATIONS) if "DROP TABLE IF EXISTS agent_message_rows" in m)
            previous = next(m for m in SQLITE_MIGRATIONS[:earlier] if any("content='', detail=none" in s for s in m))
            conn = sqlite3.connect(str(path), isolation_level=None)
            conn.execute("DROP TABLE agent_message_terms")
            conn.execute("DROP TABLE agent_message_rows")
            for statement in previous:
                if "agent_message_rows" in statement or "agent_message_terms" in statement:
                    conn.execute(statement)
            conn.execute("INSERT INTO agent_message_rows (thread_id, checkpoint_id) VALUES (?, ?)", (first["thread_id"], second["checkpoint_id"]))
            conn.execute("INSERT INTO agent_message_terms (rowid, body) VALUES (last_insert_rowid(), ?)", (search.fts5_tokens(old_keys),))
            conn.execute(f"PRAGMA user_version = {earlier}")
            conn.close()

        upgraded = make_agent(url)
        assert upgraded.search_threads("spoonbill", user_id="ada") == []  # the earlier rows are gone
        assert rows_holding(url, "spoonbill") == 0
        # A turn before the backfill indexes only what it brings: the backfill indexes the whole thread.
        later = outputs(say(upgraded, "a spoonbill at dusk", thread_id=first["thread_id"], user_id="ada"))
        assert upgraded.search_threads("spoonbill", user_id="ada") == []
        assert upgraded.backfill_search_index()["indexed_checkpoints"] >= 3
        found = upgraded.search_threads("spoonbill", user_id="ada")
        assert found[0]["checkpoint_id"] == later["checkpoint_id"] and found[len(found) - len(before):] == before
        assert rows_holding(url, "spoonbill") == 1  # once on the branch, not once per checkpoint
        assert upgraded.backfill_search_index() == {"indexed_checkpoints": 0}
        upgraded.close()


def test_the_backfill_finds_what_the_live_index_found_after_edits_and_regenerations(agent, backend_url):
    from tests.operations.test_branches import edit, regenerate

    first = outputs(say(agent, "a petrel offshore", user_id="ada"))
    thread_id = first["thread_id"]
    say(agent, "a skua chasing it", thread_id=thread_id, user_id="ada")
    say(agent, "then a gannet diving", thread_id=thread_id, user_id="ada")
    state = agent.get_checkpoint_state(thread_id, user_id="ada")
    skua = next(m for m in state["messages"] if m.get("role") == "user" and "skua" in str(m["content"]))
    edit(agent, thread_id, skua["id"], "a fulmar chasing the petrel", user_id="ada")
    regenerate(agent, thread_id, user_id="ada")
    say(agent, "the petrel and the gannet again", thread_id=thread_id, user_id="ada")
    words = ("petrel", "skua", "gannet", "fulmar", "petrel gannet", "chasing")
    live = {word: agent.search_threads(word, user_id="ada", limit=100) for word in words}
    assert all(live.values())
    rows = {word: rows_holding(backend_url, word) for word in ("petrel", "fulmar", "gannet")}
    assert rows["petrel"] == 1  # said on every branch, brought once

    agent.storage.clear_search_index()
    agent.backfill_search_index()
    assert {word: agent.search_threads(word, user_id="ada", limit=100) for word in words} == live
    assert {word: rows_holding(backend_url, word) for word in rows} == rows


def test_the_search_table_of_the_previous_release_moves_into_the_checkpoints_at_the_upgrade(pg_server_url, make_agent):
    """The previous release kept the terms in `agent_message_terms`; the upgrade moves each row into its
    checkpoint's `agent_terms` and drops the table: everything is found as before, without a backfill."""
    import psycopg

    from agent.storage.postgres.migrations import MIGRATIONS
    from tests.helpers.databases import fresh_database

    with fresh_database(pg_server_url) as url:
        agent = make_agent(url)
        first = outputs(say(agent, "an avocet on the mudflat", user_id="ada"))
        second = outputs(say(agent, "the avocet flew off", thread_id=first["thread_id"], user_id="ada"))
        say(agent, "a godwit instead", thread_id=first["thread_id"], checkpoint_id=first["checkpoint_id"], user_id="ada")
        before = {word: agent.search_threads(word, user_id="ada", limit=50) for word in ("avocet", "godwit", "flew")}
        assert all(before.values())
        held = rows_holding(url, "avocet")
        agent.close()

        # The previous release's layout: the table (as its migrations left it) holds the rows, no column.
        moved = MIGRATIONS.index("ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS agent_terms INTEGER[]")
        with psycopg.connect(url) as conn:
            for migration in MIGRATIONS[:moved]:
                if "agent_message_terms" in migration and "FUNCTION" not in migration and "TRUNCATE" not in migration:
                    conn.execute(migration)
            conn.execute("""INSERT INTO agent_message_terms (thread_id, checkpoint_id, terms)
                SELECT thread_id, checkpoint_id, agent_terms FROM checkpoints WHERE agent_terms IS NOT NULL""")
            rows = conn.execute("SELECT count(*) FROM agent_message_terms").fetchone()[0]
            assert rows >= 3
            conn.execute("ALTER TABLE checkpoints DROP COLUMN agent_terms")
            conn.execute("DELETE FROM agent_migrations WHERE v >= %s", (moved,))

        upgraded = make_agent(url)
        try:
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT to_regclass('agent_message_terms')").fetchone()[0] is None
                assert conn.execute("SELECT count(*) FROM checkpoints WHERE agent_terms IS NOT NULL").fetchone()[0] == rows
            assert {word: upgraded.search_threads(word, user_id="ada", limit=50) for word in before} == before
            assert rows_holding(url, "avocet") == held
            assert upgraded.backfill_search_index() == {"indexed_checkpoints": 0}  # nothing was lost to index again
            later = outputs(say(upgraded, "a second avocet", thread_id=first["thread_id"], checkpoint_id=second["checkpoint_id"], user_id="ada"))
            assert upgraded.search_threads("second avocet", user_id="ada")[0]["checkpoint_id"] == later["checkpoint_id"]
        finally:
            upgraded.close()
