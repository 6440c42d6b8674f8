"""A write transaction's cache entries wait in its scope until it commits (`agent.storage.staging`), and the
scope holds no more of them for a cache than the cache itself keeps."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from agent.storage import staging
from agent.storage.deltas import MessageCache
from agent.storage.search import KeySets


def said(text: str) -> HumanMessage:
    """A message with an id: only those have search keys (`search.message_keys`)."""
    return HumanMessage(text, id=f"m-{text}")


def test_a_scope_holds_no_more_entries_for_a_message_cache_than_it_keeps():
    # A large import used to hold one message list per checkpoint until its commit.
    cache = MessageCache(2)
    with staging.scope() as staged:
        for n in (1, 2, 3):
            cache.put(f"c{n}", [HumanMessage(f"message {n}")])
        assert staged.get(cache, "c1") is None  # the oldest was dropped
        assert cache.get("c1") is None  # a lookup in the transaction misses it, and reads the rows instead
        assert [m.content for m in cache.get("c3")] == ["message 3"]
        assert cache.get("c2") is not None
        staged.publish()
    assert cache.get("c1") is None
    assert [m.content for m in cache.get("c2")] == ["message 2"]
    assert [m.content for m in cache.get("c3")] == ["message 3"]


def test_a_scope_holds_no_more_entries_for_the_search_keys_than_they_keep():
    keys = KeySets(maxsize=2)
    with staging.scope() as staged:
        for n in (1, 2, 3):
            keys.row(f"c{n}", None, [said(f"word{n}")], kept=0)
        assert staged.get(keys, "c1") is None
        assert staged.get(keys, "c2") is not None and staged.get(keys, "c3") is not None
        staged.publish()
    # A child whose new message repeats its parent's word gets an empty row when the parent's keys come from
    # the cache; the inherited message passed here does not hold the word, so a miss (re-reading it) does not.
    assert keys.row("c4", "c3", [said("unread"), said("word3")], kept=1) == []
    assert keys.row("c5", "c1", [said("unread"), said("word1")], kept=1) != []


def test_a_later_put_of_a_key_counts_as_the_newest_entry():
    cache = MessageCache(2)
    with staging.scope() as staged:
        cache.put("c1", [HumanMessage("first")])
        cache.put("c2", [HumanMessage("second")])
        cache.put("c1", [HumanMessage("first, again")])
        cache.put("c3", [HumanMessage("third")])
        assert staged.get(cache, "c2") is None
        assert [m.content for m in cache.get("c1")] == ["first, again"]
        staged.publish()
    assert cache.get("c2") is None and cache.get("c1") is not None and cache.get("c3") is not None
