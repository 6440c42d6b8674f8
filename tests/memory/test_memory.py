"""Long-term memory (agent.memory): recall across threads for one user only, the branch scope, provenance,
deletion, search by keywords and by embeddings, TTL, atomicity with the turn, and the memory actions."""

from __future__ import annotations

import functools
import json
import logging
import re
import shlex
import sqlite3
import sys
import time
import urllib.request
import uuid

import httpx
import psycopg
import pytest

from agent import create_agent
from agent.context import TURN_CONTEXT_KEY, TurnContext
from agent.errors import InvalidRequest, MemoryNotFound, ModelError
from agent.memory.scopes import namespace, prefix
from agent.memory.store import keywords
from agent.memory.tools import memory_tools
from agent.models import OfflineChatModel
from tests.helpers.openai_stub import openai_stub_server
from tests.helpers.scenario import outputs, request, say, text_of
from tests.helpers.servers import free_port, server_process



@pytest.fixture
def alice() -> str:
    """A user id of this test only (the Postgres database is shared by the session's tests); it has a dot."""
    return f"alice.{uuid.uuid4().hex[:8]}@example.com"


@pytest.fixture
def bob() -> str:
    return f"bob-{uuid.uuid4().hex[:8]}"


def remembered(response) -> str:
    """The part of an offline reply that quotes the memories the model was given ("" if none)."""
    text = text_of(response)
    return text.split("I remember: ", 1)[1].split(". You said", 1)[0] if "I remember: " in text else ""


def store_rows(url: str, user_id: str) -> dict[str, int]:
    """Rows of `user_id`'s namespace in every table of LangGraph's store, read straight from the database."""
    tables = ("store", "store_vectors")
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///") :]) as conn:
            return {t: conn.execute(f"SELECT count(*) FROM {t} WHERE prefix = ?", (prefix(user_id),)).fetchone()[0] for t in tables}
    with psycopg.connect(url) as conn:
        present = [t for t in tables if conn.execute("SELECT to_regclass(%s)", (t,)).fetchone()[0] is not None]
        return {t: conn.execute(f"SELECT count(*) FROM {t} WHERE prefix = %s", (prefix(user_id),)).fetchone()[0] for t in present}


# -- recall across threads ------------------------------------------------------------------------
def test_a_fact_saved_in_one_thread_is_given_to_the_model_in_another_thread_of_the_same_user_only(backend_url, make_agent, alice, bob):
    agent = make_agent(backend_url)
    saved = say(agent, "Remember that I'm vegetarian", user_id=alice)
    assert "save_memory says: Saved" in text_of(saved)

    other_thread = say(agent, "Can you suggest a dinner place?", user_id=alice)
    assert outputs(other_thread)["thread_id"] != outputs(saved)["thread_id"]
    assert remembered(other_thread) == '1. "I\'m vegetarian"'

    stranger = say(agent, "Can you suggest a dinner place?", user_id=bob)
    assert remembered(stranger) == ""
    assert agent.list_memories(bob) == []


def test_a_memory_records_the_thread_and_checkpoint_of_the_turn_that_saved_it(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    saved = outputs(say(agent, "Remember that my sister lives in Lisbon", user_id=alice))
    [memory] = agent.list_memories(alice)
    assert memory["content"] == "my sister lives in Lisbon"
    assert (memory["thread_id"], memory["checkpoint_id"]) == (saved["thread_id"], saved["checkpoint_id"])
    assert memory["created_at"].endswith("+00:00")
    history = agent.get_checkpoint_history(saved["thread_id"], user_id=alice)
    assert history[0]["checkpoint_id"] == memory["checkpoint_id"] and history[0]["is_head"]


def test_user_ids_that_differ_only_after_a_dot_do_not_share_memories(backend_url, make_agent):
    agent = make_agent(backend_url)
    say(agent, "Remember that I'm the dotted one", user_id="a.b")
    assert namespace("a.b") == ("user_memories", "a%2Eb")
    assert agent.list_memories("a") == [] and agent.list_memories("a%2Eb") == []
    assert remembered(say(agent, "hello", user_id="a")) == ""
    assert [m["content"] for m in agent.list_memories("a.b")] == ["I'm the dotted one"]


def test_without_a_user_id_nothing_is_remembered_and_the_reply_says_so(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    reply = text_of(say(agent, "Remember that I'm vegetarian"))
    assert "long-term memory is off in this conversation because the request has no user_id" in reply
    assert remembered(say(agent, "Suggest a dinner place")) == ""
    assert remembered(say(agent, "Suggest a dinner place", user_id=alice)) == ""


def test_at_most_max_memories_in_context_are_given_the_most_relevant_first(backend_url, make_agent, alice):
    agent = make_agent(backend_url, max_memories_in_context=2)
    for fact in ("I live in Porto", "I like green tea", "My cat is called Miso"):
        say(agent, f"Remember that {fact}", user_id=alice)
    reply = say(agent, "What should I name a kitten? My cat Miso needs a friend.", user_id=alice)
    # "cat" and "miso" match one memory; the newest of the others fills the second place.
    assert remembered(reply) == '1. "My cat is called Miso" 2. "I like green tea"'
    assert remembered(make_agent(backend_url, max_memories_in_context=0).predict(request("hi", user_id=alice))) == ""


# -- branch scope (the trip scenario) ------------------------------------------------------------------
def trip_with_a_fact_on_the_sf_branch(agent, alice) -> dict:
    first = outputs(say(agent, "I'm planning for an upcoming trip!", user_id=alice))
    sf = outputs(say(agent, "Remember that I'm headed to SF", thread_id=first["thread_id"], user_id=alice))
    return {"thread_id": first["thread_id"], "after_turn1": first["checkpoint_id"], "sf_head": sf["checkpoint_id"]}


def test_under_branch_scope_a_fact_from_the_sf_branch_is_not_given_on_the_new_york_branch(backend_url, make_agent, alice):
    agent = make_agent(backend_url, memory_scope="branch")
    trip = trip_with_a_fact_on_the_sf_branch(agent, alice)
    new_york = say(
        agent, "I'm headed to New York! Where am I going?", thread_id=trip["thread_id"],
        checkpoint_id=trip["after_turn1"], user_id=alice,
    )  # fmt: skip
    assert remembered(new_york) == ""
    on_sf = say(agent, "Where am I going?", thread_id=trip["thread_id"], checkpoint_id=trip["sf_head"], user_id=alice)
    assert remembered(on_sf) == '1. "I\'m headed to SF"'
    assert remembered(say(agent, "Where am I going?", user_id=alice)) == ""  # another thread: another branch
    assert [m["content"] for m in agent.list_memories(alice)] == ["I'm headed to SF"]  # the API lists every scope


def test_under_user_scope_the_sf_fact_is_given_on_the_new_york_branch_too(backend_url, make_agent, alice):
    agent = make_agent(backend_url, memory_scope="user")
    trip = trip_with_a_fact_on_the_sf_branch(agent, alice)
    new_york = say(
        agent, "I'm headed to New York! Where am I going?", thread_id=trip["thread_id"],
        checkpoint_id=trip["after_turn1"], user_id=alice,
    )  # fmt: skip
    assert remembered(new_york) == '1. "I\'m headed to SF"'


def test_under_branch_scope_a_memory_of_another_branch_cannot_be_forgotten_from_this_one(backend_url, make_agent, alice):
    agent = make_agent(backend_url, memory_scope="branch")
    trip = trip_with_a_fact_on_the_sf_branch(agent, alice)
    [memory] = agent.list_memories(alice)
    forget = {tool.name: tool for tool in memory_tools(agent.operation_context.memories)}["forget_memory"]
    config = {"configurable": {TURN_CONTEXT_KEY: TurnContext(thread_id=trip["thread_id"], user_id=alice)}}
    new_york_state = {"messages": []}  # the New York branch holds no save_memory result
    call = {"name": "forget_memory", "args": {"memory_id": memory["memory_id"], "state": new_york_state}, "id": "c1", "type": "tool_call"}
    result = forget.invoke(call, config)
    assert "there is no memory" in result.content and result.artifact is None
    assert agent.list_memories(alice) == [memory]


# -- forgetting and deletion --------------------------------------------------------------------------
def test_forget_deletes_the_memory_when_its_turn_commits(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    say(agent, "Remember that I'm vegetarian", user_id=alice)
    say(agent, "Remember that I live in Porto", user_id=alice)
    forgot = text_of(say(agent, "Forget that I'm vegetarian", user_id=alice))
    assert "forget_memory says: Forgotten (when this turn completes): I'm vegetarian" in forgot
    assert [m["content"] for m in agent.list_memories(alice)] == ["I live in Porto"]
    assert "The search_memories says: " in text_of(say(agent, "What do you remember about me?", user_id=alice))


def test_delete_user_data_leaves_no_row_of_the_user_in_any_store_table(backend_url, make_agent, tmp_path, alice, bob):
    agent = make_agent(backend_url, memory_scope="branch")
    say(agent, "Remember that I'm vegetarian", user_id=alice)
    say(agent, "Remember that I like tea", user_id=alice)
    say(agent, "Remember that I'm Bob", user_id=bob)
    assert store_rows(backend_url, alice)["store"] == 2
    agent.delete_user_data(alice)
    assert all(count == 0 for count in store_rows(backend_url, alice).values())
    assert agent.list_memories(alice) == []
    assert [m["content"] for m in agent.list_memories(bob)] == ["I'm Bob"]


def test_delete_thread_removes_its_memories_under_branch_scope_and_keeps_them_under_user_scope(backend_url, make_agent, alice):
    branch = make_agent(backend_url, memory_scope="branch")
    kept = outputs(say(branch, "Remember that I like tea", user_id=alice))
    gone = outputs(say(branch, "Remember that I'm vegetarian", user_id=alice))
    branch.delete_thread(gone["thread_id"], user_id=alice)
    assert [m["content"] for m in branch.list_memories(alice)] == ["I like tea"]

    user = make_agent(backend_url, memory_scope="user")
    user.delete_thread(kept["thread_id"], user_id=alice)
    [memory] = user.list_memories(alice)
    assert memory["content"] == "I like tea" and memory["thread_id"] == kept["thread_id"]


def test_delete_memory_deletes_only_the_callers_own(backend_url, make_agent, alice, bob):
    agent = make_agent(backend_url)
    say(agent, "Remember that I'm vegetarian", user_id=alice)
    [memory] = agent.list_memories(alice)
    with pytest.raises(MemoryNotFound):
        agent.delete_memory(bob, memory["memory_id"])
    assert agent.list_memories(alice) == [memory]
    agent.delete_memory(alice, memory["memory_id"])
    assert agent.list_memories(alice) == []
    with pytest.raises(MemoryNotFound):
        agent.delete_memory(alice, memory["memory_id"])


# -- atomicity with the turn ------------------------------------------------------------------------------
class SavesThenFails(OfflineChatModel):
    """Calls save_memory, then fails when it is called with the tool's result."""

    def _reply(self, messages):
        if messages[-1].type == "tool":
            raise RuntimeError("the model went away")
        return super()._reply(messages)


def test_a_turn_that_fails_after_saving_writes_no_memory(backend_url, make_agent, alice):
    agent = make_agent(backend_url, model=SavesThenFails())
    with pytest.raises(ModelError):
        say(agent, "Remember that I'm vegetarian", user_id=alice)
    assert agent.list_memories(alice) == [] and store_rows(backend_url, alice)["store"] == 0


# -- search ---------------------------------------------------------------------------------------------
def test_keyword_search_lists_only_memories_sharing_a_word_most_words_first(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    for fact in ("I live in Porto", "My sister lives in Lisbon", "I fly to Lisbon in May"):
        say(agent, f"Remember that {fact}", user_id=alice)
    assert [m["content"] for m in agent.list_memories(alice, query="Lisbon in May")] == [
        "I fly to Lisbon in May",
        "My sister lives in Lisbon",
    ]
    assert agent.list_memories(alice, query="Tokyo") == []
    newest_first = ["I fly to Lisbon in May", "My sister lives in Lisbon", "I live in Porto"]
    assert [m["content"] for m in agent.list_memories(alice)] == newest_first
    assert [m["content"] for m in agent.list_memories(alice, query="what about me?")] == newest_first  # no searchable word
    assert [m["content"] for m in agent.list_memories(alice, limit=1)] == newest_first[:1]


def test_keywords_drop_short_and_common_words():
    assert keywords("What do you remember about my trip to SF, Lisbon and LISBON?") == ["trip", "sf", "lisbon"]


@pytest.fixture
def embeddings_stub(monkeypatch):
    with openai_stub_server() as base_url:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "unused")
        yield base_url


def embedding_requests(base_url: str) -> list[dict]:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_requests?path=/v1/embeddings") as answer:
        return json.loads(answer.read())


def test_with_an_embeddings_model_memories_are_ranked_by_similarity_on_sqlite(embeddings_stub, make_agent, tmp_path, alice):
    url = f"sqlite:///{tmp_path / 'memory.sqlite'}"
    agent = make_agent(url, embedding_model="fake-embed")
    assert agent.operation_context.memories.search_kind.startswith("semantic")
    for fact in ("I live in Porto", "My sister Ana lives in Lisbon", "I like green tea"):
        say(agent, f"Remember that {fact}", user_id=alice)
    assert store_rows(url, alice) == {"store": 3, "store_vectors": 3}
    ranked = [m["content"] for m in agent.list_memories(alice, query="sister Ana")]
    assert ranked[0] == "My sister Ana lives in Lisbon" and len(ranked) == 3  # similarity ranks every memory
    reply = say(agent, "Where does my sister Ana live?", user_id=alice)
    assert remembered(reply).startswith('1. "My sister Ana lives in Lisbon"')
    embedded = [text for body in embedding_requests(embeddings_stub) for text in body["input"]]
    assert "My sister Ana lives in Lisbon" in embedded and "Where does my sister Ana live?" in embedded


def test_with_a_key_memories_are_stored_sealed_and_the_embeddings_model_is_given_their_plaintext(
    embeddings_stub, make_agent, tmp_path, alice
):
    from agent.encryption import SEALED_PREFIX, generate_key

    url = f"sqlite:///{tmp_path / 'sealed-memory.sqlite'}"
    agent = make_agent(url, embedding_model="fake-embed", encryption_key=generate_key())
    for fact in ("I live in Porto", "My sister Ana lives in Lisbon", "I like green tea"):
        say(agent, f"Remember that {fact}", user_id=alice)
    assert [m["content"] for m in agent.list_memories(alice, query="sister Ana")][0] == "My sister Ana lives in Lisbon"
    embedded = [text for body in embedding_requests(embeddings_stub) for text in body["input"]]
    assert "My sister Ana lives in Lisbon" in embedded and not any(text.startswith(SEALED_PREFIX) for text in embedded)
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        values = [row[0] for row in conn.execute("SELECT value FROM store WHERE prefix = ?", (prefix(alice),))]
    assert len(values) == 3 and not any(b"Lisbon" in bytes(value) for value in values)
    assert all(json.loads(value)["content"].startswith(SEALED_PREFIX) for value in values)


def test_semantic_search_on_postgres_ranks_exactly_over_stored_vectors_as_sqlite_does(
    embeddings_stub, pg_url, make_agent, tmp_path, alice
):
    facts = ("I live in Porto", "My sister Ana lives in Lisbon", "I like green tea", "My cat Miso likes tea")
    queries = ("sister Ana", "tea for the cat", "Porto weather")
    rankings = []
    for url in (pg_url, f"sqlite:///{tmp_path / 'semantic.sqlite'}"):
        agent = make_agent(url, embedding_model="fake-embed")
        assert agent.operation_context.memories.search_kind == "semantic"
        for fact in facts:
            say(agent, f"Remember that {fact}", user_id=alice)
        rankings.append({q: [(m["content"], round(m_score, 5)) for m, m_score in scored(agent, alice, q)] for q in queries})
    assert rankings[0] == rankings[1]
    assert rankings[0]["sister Ana"][0][0] == "My sister Ana lives in Lisbon"
    # Each memory was embedded once (when saved), not again when another process or search read it.
    embedded = [text for body in embedding_requests(embeddings_stub) for text in body["input"]]
    assert embedded.count("My sister Ana lives in Lisbon") <= 2  # once per backend at most (the cache is per agent)
    fresh = make_agent(pg_url, embedding_model="fake-embed")
    before = len(embedding_requests(embeddings_stub))
    assert [m["content"] for m in fresh.list_memories(alice, query="sister Ana")][0] == "My sister Ana lives in Lisbon"
    assert [t for body in embedding_requests(embeddings_stub)[before:] for t in body["input"]] == ["sister Ana"]


FACTS = (
    "I live in Porto", "My sister Ana lives in Lisbon", "I like green tea", "My cat Miso likes tea",
    "I cycle to work", "I am allergic to peanuts", "My brother Rui plays jazz", "I fly to Tokyo in May",
    "I read crime novels", "My sister Ana has two kids", "I prefer trains to planes", "I like sushi",
)
QUERIES = ("sister Ana", "tea for the cat", "Porto weather", "music my brother plays", "what can I not eat", "travel")


def create_pgvector(url: str) -> None:
    """Create pgvector in `url`'s database, or skip the test saying why the server refused."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        pytest.skip(f"CREATE EXTENSION vector failed on the test server, so pgvector cannot be compared: {exc}")


def semantic_rankings(agent, user_id, *, limit=10):
    """Each of QUERIES' ranking: (content, similarity) best first."""
    return {q: [(m["content"], s) for m, s in scored(agent, user_id, q)][:limit] for q in QUERIES}


def assert_same_rankings(got, expected):
    for query in QUERIES:
        assert [c for c, _ in got[query]] == [c for c, _ in expected[query]], query
        assert [s for _, s in got[query]] == pytest.approx([s for _, s in expected[query]], abs=1e-5), query


def memory_values(url, user_id):
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute("SELECT value FROM store WHERE prefix = %s", (prefix(user_id),))]


def spy(method, calls, name):
    """`method`, appending `name` to `calls` on each call."""

    def spied(*args, **kwargs):
        calls.append(name)
        return method(*args, **kwargs)

    return spied


def ranked_among(agent, user_id, contents, query="family and food", limit=3):
    """`index.rank` of `user_id`'s memories whose content is one of `contents`: (content, score) best first."""
    from agent.memory import index

    memories = agent.operation_context.memories
    copy = memories.index.current(prefix(user_id))
    keys = {key for key, entry in copy.entries.items() if entry.memory.content in contents}
    similar = functools.partial(memories.store.similar, prefix(user_id)) if memories.store.vectors else None
    vector = memories.embeddings.embed_query(query)
    found = index.rank(copy, words=[], vector=vector, keys=keys, min_score=0, limit=limit, similar=similar)
    return [(memory.content, memory.score) for memory in found]


def test_semantic_search_returns_the_same_results_with_and_without_pgvector(
    embeddings_stub, pg_server_url, make_agent, alice, caplog, monkeypatch
):
    from agent.memory import index
    from tests.helpers.databases import fresh_database, owned_by_plain_role

    with fresh_database(pg_server_url, prefix="tt_pgvector") as with_url, fresh_database(pg_server_url, prefix="tt_plain") as plain_db:
        create_pgvector(with_url)
        with owned_by_plain_role(plain_db) as without_url:
            # The plain role may create tables but not pgvector (not a trusted extension): it falls back, logged.
            with caplog.at_level(logging.INFO, logger="agent.memory.postgres"):
                without = make_agent(without_url, embedding_model="fake-embed")  # setup looks for pgvector
            assert without.operation_context.memories.store.vectors is False
            assert "pgvector could not be set up" in caplog.text and "permission denied" in caplog.text
            with_ = make_agent(with_url, embedding_model="fake-embed")
            assert with_.operation_context.memories.store.vectors is True
            for agent in (with_, without):
                for fact in FACTS:
                    say(agent, f"Remember that {fact}", user_id=alice)
            assert store_rows(with_url, alice) == {"store": len(FACTS), "store_vectors": len(FACTS)}
            assert store_rows(without_url, alice) == {"store": len(FACTS)}  # no vectors' table: in the values
            assert not any("embedding" in value for value in memory_values(with_url, alice))
            expected = semantic_rankings(without, alice)
            assert expected["sister Ana"][0][0].startswith("My sister Ana")
            assert_same_rankings(semantic_rankings(with_, alice), expected)
            for limit in (1, 3):
                assert [m["content"] for m in with_.list_memories(alice, query="tea for the cat", limit=limit)] == [
                    c for c, _ in expected["tea for the cat"][:limit]
                ]
            # Among some of the memories only (the branch rule, versions): named to the server when few,
            # else the others excluded.
            chosen = {"My sister Ana has two kids", "I like green tea", "I cycle to work", "I like sushi", "I live in Porto"}
            for named in (index.MAX_NAMED_CANDIDATES, 0):
                monkeypatch.setattr(index, "MAX_NAMED_CANDIDATES", named)
                got, expected_among = ranked_among(with_, alice, chosen), ranked_among(without, alice, chosen)
                assert [c for c, _ in got] == [c for c, _ in expected_among] and len(got) == 3
                assert [s for _, s in got] == pytest.approx([s for _, s in expected_among], abs=1e-5)
            # A turn's recall ranks in the database the same way, with one search: the one run while the claim
            # is on the way (with the listing it ranked among, which the turn's copy matches), or, when the
            # pool had not started it by the time recall needed it (a loaded machine), recall's own; never both.
            store, calls = with_.operation_context.memories.store, []
            for name in ("similar", "similar_listed"):
                monkeypatch.setattr(store, name, spy(getattr(store, name), calls, name))
            asked = "Where does my sister Ana live?"
            assert remembered(say(with_, asked, user_id=alice)) == remembered(say(without, asked, user_id=alice))
            assert calls in (["similar_listed"], ["similar"])
            without.close()

        # pgvector appears on the database whose memories carry their vectors in their values: the first
        # read moves each vector to a store_vectors row, once, and the rankings stay the same.
        create_pgvector(plain_db)
        upgraded = make_agent(plain_db, embedding_model="fake-embed")
        assert upgraded.operation_context.memories.store.vectors is True
        assert store_rows(plain_db, alice) == {"store": len(FACTS), "store_vectors": 0}
        assert_same_rankings(semantic_rankings(upgraded, alice), expected)
        assert store_rows(plain_db, alice) == {"store": len(FACTS), "store_vectors": len(FACTS)}
        assert not any("embedding" in value for value in memory_values(plain_db, alice))
        assert_same_rankings(semantic_rankings(make_agent(plain_db, embedding_model="fake-embed"), alice), expected)

        # Deletion takes the vectors with the memories.
        [ana] = [m for m in with_.list_memories(alice) if m["content"] == "My sister Ana lives in Lisbon"]
        with_.delete_memory(alice, ana["memory_id"])
        assert store_rows(with_url, alice) == {"store": len(FACTS) - 1, "store_vectors": len(FACTS) - 1}
        assert "My sister Ana lives in Lisbon" not in [c for c, _ in semantic_rankings(with_, alice)["sister Ana"]]
        with_.delete_user_data(alice)  # delete_user_data
        assert store_rows(with_url, alice) == {"store": 0, "store_vectors": 0}
        for agent in (with_, upgraded):
            agent.close()


def test_with_pgvector_and_a_key_memories_are_sealed_and_their_plaintext_is_embedded_and_ranked(
    embeddings_stub, pg_server_url, make_agent, alice
):
    from agent.encryption import SEALED_PREFIX, generate_key
    from tests.helpers.databases import fresh_database

    with fresh_database(pg_server_url, prefix="tt_pgvector") as url:
        create_pgvector(url)
        agent = make_agent(url, embedding_model="fake-embed", encryption_key=generate_key())
        assert agent.operation_context.memories.store.vectors is True
        for fact in ("I live in Porto", "My sister Ana lives in Lisbon", "I like green tea"):
            say(agent, f"Remember that {fact}", user_id=alice)
        assert store_rows(url, alice) == {"store": 3, "store_vectors": 3}
        assert [m["content"] for m in agent.list_memories(alice, query="sister Ana")][0] == "My sister Ana lives in Lisbon"
        embedded = [text for body in embedding_requests(embeddings_stub) for text in body["input"]]
        assert "My sister Ana lives in Lisbon" in embedded and not any(text.startswith(SEALED_PREFIX) for text in embedded)
        values = memory_values(url, alice)
        assert all(value["content"].startswith(SEALED_PREFIX) and "embedding" not in value for value in values)
        agent.close()


def test_a_turn_embeds_its_memory_query_once_and_a_regeneration_searches_with_the_history(
    embeddings_stub, pg_url, make_agent, alice
):
    # The query's vector is computed while the claim is on the way (`TurnRunner._prime_recall`) and
    # recall takes it from the cache: the embeddings model is asked once per turn, and the same memory wins.
    agent = make_agent(pg_url, embedding_model="fake-embed")
    for fact in ("I live in Porto", "My sister Ana lives in Lisbon", "I like green tea"):
        first = say(agent, f"Remember that {fact}", user_id=alice)
    thread_id = first.custom_outputs["thread_id"]
    before = len(embedding_requests(embeddings_stub))
    reply = say(agent, "Where does my sister Ana live?", user_id=alice, thread_id=thread_id)
    assert remembered(reply).startswith('1. "My sister Ana lives in Lisbon"')
    asked = [text for body in embedding_requests(embeddings_stub)[before:] for text in body["input"]]
    assert asked == ["Where does my sister Ana live?"]
    # A regeneration has no new user message: nothing is embedded ahead, recall uses the cached query.
    again = say(agent, None, user_id=alice, thread_id=thread_id, regenerate=True)
    assert remembered(again).startswith('1. "My sister Ana lives in Lisbon"')
    assert len(embedding_requests(embeddings_stub)) == before + 1


def test_a_turn_queued_behind_one_that_saves_a_memory_is_given_that_memory(pg_url, make_agent, alice):
    # A turn lists the user's memories while its claim is on the way; when the claim had to wait for
    # another turn, that listing may predate the other turn's commit, so the turn lists them again.
    import threading

    from agent.models import OfflineChatModel

    agent = make_agent(pg_url, model=OfflineChatModel(latency_ms=400), multitask_strategy="enqueue")
    thread_id = outputs(say(agent, "Hello", user_id=alice))["thread_id"]
    first = threading.Thread(target=say, args=(agent, "Remember that I live in Porto"), kwargs={"user_id": alice, "thread_id": thread_id})
    first.start()
    time.sleep(0.2)  # the first turn holds the thread (its model takes 400 ms per call)
    reply = say(agent, "Where do I live? Porto?", user_id=alice, thread_id=thread_id)
    first.join()
    assert "I live in Porto" in remembered(reply)


def scored(agent, user_id, query):
    """The memories a semantic search ranks, with their cosine similarity."""
    found = agent.operation_context.memories.list(user_id, query, limit=10)
    return [(memory.as_dict(), memory.score) for memory in found]


# -- retention -------------------------------------------------------------------------------------------
def test_memories_expire_after_memory_ttl_seconds_and_the_sweep_deletes_them(backend_url, make_agent, alice):
    agent = make_agent(backend_url, memory_ttl_seconds=1)
    say(agent, "Remember that I'm in a hurry", user_id=alice)
    assert len(agent.list_memories(alice)) == 1
    time.sleep(1.5)
    assert agent.list_memories(alice) == []
    assert remembered(say(agent, "hello", user_id=alice)) == ""
    assert store_rows(backend_url, alice)["store"] == 1  # expired, not yet swept
    agent.operation_context.memories.store.sweep_ttl()
    assert store_rows(backend_url, alice)["store"] == 0


def test_on_sqlite_a_kept_key_listing_is_read_again_after_any_connection_changes_the_store(tmp_path, make_agent, alice):
    url = f"sqlite:///{tmp_path / 'memories.sqlite'}"
    agent, other = make_agent(url), make_agent(url)
    say(agent, "Remember that I like green tea", user_id=alice)
    listings = []
    agent.operation_context.memories.store.storage.saver.conn.set_trace_callback(
        lambda statement: listings.append(statement) if "group_concat" in statement else None
    )
    contents = lambda: [memory["content"] for memory in agent.list_memories(alice)]  # noqa: E731
    assert contents() == ["I like green tea"]
    assert contents() == ["I like green tea"]
    assert len(listings) == 1  # nothing changed: the listing read first is reused

    say(other, "Remember that I live in Porto", user_id=alice)  # another connection (as another process)
    assert sorted(contents()) == ["I like green tea", "I live in Porto"]
    [porto] = [m["memory_id"] for m in agent.list_memories(alice) if "Porto" in m["content"]]
    agent.delete_memory(alice, porto)  # this connection's own write
    assert contents() == ["I like green tea"]
    with sqlite3.connect(tmp_path / "memories.sqlite") as conn:  # a write behind the agents' backs
        conn.execute("DELETE FROM store WHERE prefix = ?", (prefix(alice),))
    assert contents() == []
    assert len(listings) == 4


# -- the actions, and hostile input --------------------------------------------------------------------------
def action(agent, name: str, **custom):
    return agent.predict(request(None, action=name, **custom)).custom_outputs


def test_list_and_delete_memory_actions_match_the_python_methods(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    say(agent, "Remember that I'm vegetarian", user_id=alice)
    listed = action(agent, "list_memories", user_id=alice, query="vegetarian", limit=5)
    assert listed == {"user_id": alice, "memories": agent.list_memories(alice, query="vegetarian", limit=5)}
    memory_id = listed["memories"][0]["memory_id"]
    assert action(agent, "delete_memory", user_id=alice, memory_id=memory_id) == {
        "user_id": alice, "memory_id": memory_id, "deleted": True,
    }  # fmt: skip
    assert action(agent, "list_memories", user_id=alice)["memories"] == []


@pytest.mark.parametrize(
    "name, custom",
    [
        ("list_memories", {}),  # no user_id
        ("list_memories", {"user_id": "ALICE", "query": "x" * 1001}),
        ("list_memories", {"user_id": "ALICE", "query": 42}),
        ("list_memories", {"user_id": "ALICE", "query": "\ud800"}),
        ("list_memories", {"user_id": "ALICE", "limit": 0}),
        ("list_memories", {"user_id": "ALICE", "limit": 10**9}),
        ("list_memories", {"user_id": "ALICE", "limit": "5"}),
        ("list_memories", {"user_id": "ALICE", "thread": "t"}),
        ("delete_memory", {"user_id": "ALICE"}),
        ("delete_memory", {"user_id": "ALICE", "memory_id": 7}),
        ("delete_memory", {"user_id": "ALICE", "memory_id": "x" * 10_000}),
        ("delete_memory", {"user_id": "ALICE", "memory_id": "a\nb"}),
        ("delete_memory", {"user_id": ["alice"], "memory_id": "m"}),
        ("delete_memory", {"memory_id": "m"}),
    ],
)
def test_malformed_memory_actions_are_invalid_requests_and_change_nothing(backend_url, make_agent, name, custom, alice):
    agent = make_agent(backend_url)
    say(agent, "Remember that I'm vegetarian", user_id=alice)
    custom = {key: alice if value == "ALICE" else value for key, value in custom.items()}
    before = agent.list_memories(alice)
    with pytest.raises(InvalidRequest):
        action(agent, name, **custom)
    assert agent.list_memories(alice) == before


def test_another_users_memory_id_is_not_found_over_the_action_and_is_kept(backend_url, make_agent, alice, bob):
    agent = make_agent(backend_url)
    say(agent, "Remember that I'm vegetarian", user_id=alice)
    [memory] = agent.list_memories(alice)
    with pytest.raises(MemoryNotFound) as caught:
        action(agent, "delete_memory", user_id=bob, memory_id=memory["memory_id"])
    assert "was not found" in str(caught.value)
    assert agent.list_memories(alice) == [memory]


def test_the_model_cannot_save_an_oversized_memory(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    reply = text_of(say(agent, "Remember that " + "very " * 300 + "long", user_id=alice))
    assert "longer than 1000 characters; nothing was saved" in reply
    assert agent.list_memories(alice) == []


def test_the_model_cannot_save_control_characters_and_the_turn_still_completes(backend_url, make_agent, alice):
    agent = make_agent(backend_url)
    reply = say(agent, "Remember that a\x00b", user_id=alice)
    assert "holds control characters; nothing was saved" in text_of(reply)
    assert outputs(reply)["checkpoint_id"] and agent.list_memories(alice) == []


def test_memories_work_through_a_transaction_mode_pgbouncer(pgbouncer_url, make_agent, alice):
    agent = make_agent(pgbouncer_url)
    say(agent, "Remember that I'm behind a pooler", user_id=alice)
    assert remembered(say(agent, "Hello again", user_id=alice)) == '1. "I\'m behind a pooler"'
    [memory] = agent.list_memories(alice)
    agent.delete_memory(alice, memory["memory_id"])
    assert agent.list_memories(alice) == []


# -- over HTTP ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_over_http_memory_crosses_threads_for_the_context_user_only(backend_url, tmp_path, alice, bob):
    port = free_port()
    env = {"AGENT_DATABASE_URL": backend_url, "AGENT_MODEL": "offline", "AGENT_TRACING": "false"}
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=tmp_path) as base_url:
        with httpx.Client(base_url=base_url, timeout=60) as http:

            def turn(text: str, user_id: str) -> dict:
                body = {"input": [{"role": "user", "content": text}], "context": {"user_id": user_id}}
                answer = http.post("/invocations", json=body)
                assert answer.status_code == 200, answer.text
                return answer.json()

            turn("Remember that I'm vegetarian", alice)
            assert remembered(turn("Suggest a dinner place", alice)) == "1. \"I'm vegetarian\""
            assert remembered(turn("Suggest a dinner place", bob)) == ""
            listed = http.post(
                "/invocations", json={"input": [], "context": {"user_id": bob}, "custom_inputs": {"action": "list_memories"}}
            )
            assert listed.status_code == 200 and listed.json()["custom_outputs"]["memories"] == []
            listed_alice = http.post(
                "/invocations", json={"input": [], "context": {"user_id": alice}, "custom_inputs": {"action": "list_memories"}}
            ).json()
            [memory] = listed_alice["custom_outputs"]["memories"]
            stolen = http.post(
                "/invocations",
                json={"input": [], "context": {"user_id": bob}, "custom_inputs": {"action": "delete_memory", "memory_id": memory["memory_id"]}},
            )
            assert stolen.status_code == 404 and "traceback" not in stolen.text.lower()


# -- the command line --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_demo_memory_shows_a_fact_crossing_threads_and_tt_agent_memories_lists_it(tmp_path):
    from tests.cli.test_cli import run_cli

    url = f"sqlite:///{tmp_path / 'memories.sqlite'}"
    demo = run_cli("demo", "memory", "--database-url", url, cwd=tmp_path, env={"COLUMNS": "1000"})
    assert demo.returncode == 0, demo.stderr
    assert demo.stdout.count("✓") == 3 and "Not as expected" not in demo.stdout
    # The last line is a command that reads the demo's store: --database-url repeated.
    last = demo.stdout.strip().splitlines()[-1]
    hint = re.fullmatch(r"List a user's memories with: .* (memories --user-id \S+ --database-url \S+)", last)
    assert hint, last
    command = shlex.split(hint.group(1))
    user = command[2]

    with create_agent(url, model="offline", tracing=False) as agent:
        say(agent, "Remember that I like tea", user_id=user)
    listed = run_cli(*command, "--query", "tea", cwd=tmp_path, env={"COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    assert "I like tea" in listed.stdout and "I'm vegetarian" not in listed.stdout
    other = run_cli("memories", "--user-id", "nobody-at-all", "--database-url", url, cwd=tmp_path)
    assert other.returncode == 0 and "no memories" in other.stdout
    missing = run_cli("memories", "--user-id", user, cwd=tmp_path)  # the default store, which is not here
    assert missing.returncode == 1 and "There is no store" in missing.stderr
