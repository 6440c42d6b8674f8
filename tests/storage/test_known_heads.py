"""The head a process committed is not read back by its next claim on Postgres (`postgres.known_heads`), and
every way another writer moves or rewrites the head makes the claim read it again."""

from __future__ import annotations

import pytest

from agent.storage.postgres import storage as postgres_storage
from tests.helpers.scenario import outputs, say



@pytest.fixture
def start_reads(monkeypatch):
    """Counts the claims that read their start (`load_row`) and the ones that used a known head (`fresh`)."""
    counts = {"read": 0, "known": 0}
    load_row = postgres_storage.TurnPostgresSaver.load_row
    fresh = postgres_storage.fresh

    def counted_load_row(self, row):
        counts["read"] += 1
        return load_row(self, row)

    def counted_fresh(tup):
        counts["known"] += 1
        return fresh(tup)

    monkeypatch.setattr(postgres_storage.TurnPostgresSaver, "load_row", counted_load_row)
    monkeypatch.setattr(postgres_storage, "fresh", counted_fresh)
    return counts


def messages_of(agent, thread_id: str) -> list[str]:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    return [m.content for m in agent.graph.get_state(config).values.get("messages", [])]


def test_the_kept_head_is_what_reading_it_gives(pg_url, make_agent):
    agent = make_agent(pg_url)
    thread_id = outputs(say(agent, "first"))["thread_id"]
    say(agent, "second", thread_id=thread_id)
    known = agent.storage.known_heads.get(thread_id)
    assert known is not None
    read = agent.storage.get_checkpoint(thread_id, known.checkpoint_id)
    assert known.tup.config == read.config
    assert known.tup.checkpoint == read.checkpoint
    assert known.tup.metadata == read.metadata
    assert known.tup.parent_config == read.parent_config
    assert known.tup.pending_writes == read.pending_writes == []


def test_a_turn_after_this_process_committed_the_head_does_not_read_its_start(pg_url, make_agent, start_reads):
    agent = make_agent(pg_url)
    thread_id = outputs(say(agent, "one"))["thread_id"]
    say(agent, "two", thread_id=thread_id)
    say(agent, "three", thread_id=thread_id)
    assert start_reads == {"read": 0, "known": 2}
    assert messages_of(agent, thread_id)[::2] == ["one", "two", "three"]


def test_two_agents_writing_one_thread_alternately_see_each_others_turns(pg_url, make_agent, start_reads):
    first, second = make_agent(pg_url), make_agent(pg_url)
    thread_id = outputs(say(first, "a1"))["thread_id"]
    for n in range(2, 6):
        say(second if n % 2 == 0 else first, f"a{n}", thread_id=thread_id)
    assert messages_of(first, thread_id)[::2] == ["a1", "a2", "a3", "a4", "a5"]
    assert messages_of(second, thread_id)[::2] == ["a1", "a2", "a3", "a4", "a5"]
    # Every turn started from the other agent's head: each one read it.
    assert start_reads == {"read": 4, "known": 0}


def test_a_head_moved_by_another_agent_is_read_again(pg_url, make_agent, start_reads):
    agent, other = make_agent(pg_url), make_agent(pg_url)
    first = outputs(say(agent, "b1"))
    thread_id = first["thread_id"]
    say(agent, "b2", thread_id=thread_id)
    other.set_head(thread_id, first["checkpoint_id"])  # back to the branch point, by another process
    say(agent, "b3", thread_id=thread_id)
    assert messages_of(agent, thread_id)[::2] == ["b1", "b3"]
    assert start_reads["known"] == 1  # b2 only (the other agent's set_head reads the checkpoint it moves to)


def test_a_head_rewritten_in_place_is_read_again(pg_url, make_agent, start_reads):
    agent, other = make_agent(pg_url), make_agent(pg_url)
    thread_id = outputs(say(agent, "c1"))["thread_id"]
    say(agent, "c2", thread_id=thread_id)
    head = agent.storage.known_heads.get(thread_id)
    other.storage.saver.prune([thread_id], strategy="keep_latest")  # the same head id, made a root
    say(agent, "c3", thread_id=thread_id)
    assert start_reads == {"read": 1, "known": 1}
    third = agent.storage.get_checkpoint(thread_id, agent.storage.known_heads.get(thread_id).checkpoint_id)
    assert third.parent_config["configurable"]["checkpoint_id"] == head.checkpoint_id
    assert messages_of(agent, thread_id)[::2] == ["c1", "c2", "c3"]
