"""`Memories`: a user's long-term memories over the store, with the scope rule and the turn's atomicity.

Every method takes the caller's `user_id` and touches only that user's
namespace (`scopes.namespace`), so the ownership rule is the namespace itself.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.store.base import PutOp

from agent.config import AgentSettings
from agent.errors import MemoryNotFound, shown_id
from agent.memory import open_store
from agent.memory.embeddings import PrecomputedEmbeddings, make_embeddings
from agent.memory.index import MemoryIndex, anchored, rank, visible
from agent.memory.retrieval import MAX_QUERY_CHARS, recall_query
from agent.memory.scopes import (
    ARTIFACT_KIND,
    memory_artifact,
    message_ids,
    namespace,
    prefix,
    saved_on_branch,
    written_at,
    written_by,
)
from agent.memory.store import keywords
from agent.types import Memory

logger = logging.getLogger(__name__)

#: Minutes between sweeps of expired memories (LangGraph's TTL sweeper), when `memory_ttl_seconds` is set.
SWEEP_INTERVAL_MINUTES = 5


@dataclass(frozen=True)
class Ahead:
    """A similarity search run before the claim (pgvector): valid for a copy made from `listing`."""

    query: str
    listing: str
    ranked: list[tuple[str, float]]
    limit: int
    copy: Any = None
    """The user's `MemoryIndex` copy made from `listing` (so the turn reads no listing of its own)."""


@dataclass(frozen=True)
class Primed:
    """`recall`'s reads started ahead (`Memories.prime`): the user's memory listing (a `MemoryIndex` copy)
    and the embedding of the turn's query (None: not started); with pgvector the latter also ranks the
    user's memories for that query and makes the copy from the listing it ranked among, as `Ahead` (one
    task, one statement: `listing` is then None)."""

    listing: Future | None
    vector: Future | None
    fresh: bool = True
    """Whether the copy read ahead may be used (False: turns ran while the claim waited, see `stale`)."""

    def stale(self) -> Primed:
        """This, with the copy read ahead dropped (turns that ran while the claim waited may have saved
        memories): `recall` reads its own; a search run ahead is used only if that copy matches it."""
        if self.listing is not None:
            self.listing.cancel()
        return dataclasses.replace(self, listing=None, fresh=False)

    def result(self, name: str) -> Any:
        """The result of `listing` or `vector`, once done; None when it failed or never started (the caller
        then reads itself). One still queued is cancelled rather than waited for: the caller may be a
        worker of the same pool, which must not wait for work queued behind it."""
        future = getattr(self, name)
        if future is None or future.cancel():
            return None
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - made again by the caller, which raises it then
            return None

    def cancel(self) -> None:
        """Give up what has not started (what runs finishes, unread)."""
        for future in (self.listing, self.vector):
            if future is not None:
                future.cancel()


def _answered(similar: Callable[..., Any], ahead: Ahead) -> Callable[..., Any]:
    """`similar`, answering from `ahead` the one question it was run for: the top `ahead.limit` of every
    memory of the listing its copy was made from (the same snapshot, so the answer is exact)."""

    def answer(vector: Any, limit: int, *, among: Any = None, excluding: Any = ()) -> list[tuple[str, float]]:
        if among is None and not excluding and limit == ahead.limit:
            return ahead.ranked
        return similar(vector, limit, among=among, excluding=excluding)

    return answer


class Memories:
    """The long-term memories of one agent's users (see `agent.memory`)."""

    def __init__(self, storage: Any, settings: AgentSettings, *, model: Any = None) -> None:
        """`model`: the chat model `extract_memories` asks (None: extraction is unavailable)."""
        self.settings = settings
        self.model = model
        self.keyring = storage.keyring
        self.embeddings: PrecomputedEmbeddings | None = None
        if settings.embedding_model:
            self.embeddings = make_embeddings(settings.embedding_model)
        ttl = settings.memory_ttl_seconds
        self.store = open_store(settings.database_url, storage, embeddings=self.embeddings, ttl_minutes=ttl / 60 if ttl else None)
        self.index = MemoryIndex(self.store)
        if ttl:
            self.store.start_ttl_sweeper(SWEEP_INTERVAL_MINUTES)

    @property
    def search_kind(self) -> str:
        """`keyword`, or `semantic` (cosine similarity of embeddings)."""
        return self.store.search_kind

    def close(self) -> None:
        self.store.stop_ttl_sweeper(timeout=1.0)

    # -- reads ------------------------------------------------------------------------------
    def recall(
        self,
        user_id: str | None,
        new_messages: Sequence[BaseMessage],
        history: Sequence[BaseMessage],
        *,
        primed: Future | None = None,
    ) -> tuple[Memory, ...]:
        """The memories to give the model before a turn: at most `max_memories_in_context`, most relevant
        to the turn's new messages first; `history` is the turn's start checkpoint's messages.

        Under `memory_scope="branch"` only the versions saved on the start's branch (of each memory the
        newest of those); under `user` the user's current set. By keywords, memories that share no word
        with the messages fill the places left, newest first. None without a user_id.

        `primed`: this turn's `prime`, started before its claim: its listing is used when it has one
        (the runner drops it when the claim had to wait, since turns that ran meanwhile may have saved
        memories), and its embedding is waited for, so the query's vector comes from the cache (with
        pgvector its search too, used when this turn's copy was made from the listing it ranked among).
        A read that failed there is made again here, and raises here.
        """
        limit = self.settings.max_memories_in_context
        if user_id is None or limit == 0:
            return ()
        copy = ahead = None
        if primed is not None:
            copy, ahead = primed.result("listing"), primed.result("vector")
            if copy is None and primed.fresh and isinstance(ahead, Ahead):
                copy = ahead.copy
        if copy is None:
            copy = self.index.current(prefix(user_id))
        keys = self._seen(copy, history)
        if keys is not None and not keys:
            return ()
        query = recall_query(new_messages, history)
        found = self._rank(user_id, copy, query, limit=limit, keys=keys, fill=True, ahead=ahead)
        self._used(user_id, found)
        return tuple(found)

    def prime(self, user_id: str | None, new_messages: Sequence[BaseMessage], submit: Callable[..., Future]) -> Primed | None:
        """Start `recall`'s reads before the turn's claim: the user's memory listing, and the embedding of
        the query when the new messages alone decide it (they hold a user message; a regeneration searches
        with the start's history). `submit(fn, *args)` runs them on other threads (the runner's pool), so
        they overlap the claim's round trip. None when `recall` would read nothing, or nothing ahead.
        """
        if user_id is None or self.settings.max_memories_in_context == 0:
            return None
        vector = None
        if self.embeddings is not None and any(message.type == "human" for message in new_messages):
            query = recall_query(new_messages, ())[-MAX_QUERY_CHARS:]
            if query.strip():
                vector = submit(self._embed_ahead, user_id, query)  # `_rank` then finds it in the cache
        # With pgvector the search's statement also lists the keys, and the copy is made in its task: one
        # task and one round trip fewer (a hand-off between threads costs about 0.25 ms of CPU here). On
        # SQLite the listing would wait for the claim's lock anyway, and is kept while unchanged (`sqlite`):
        # `recall` lists, without a hand-off.
        listing = None
        if self.store.parallel_reads and not (vector is not None and self.store.vectors_decided):
            listing = submit(self.index.current, prefix(user_id))
        return Primed(listing, vector) if listing is not None or vector is not None else None

    def _embed_ahead(self, user_id: str, query: str) -> Ahead | None:
        """Embed `query` (cached); with pgvector also rank the user's memories for it, so that the search
        overlaps the claim as the embedding does: the turn then makes no round trip for it."""
        self.embeddings.prime([query])
        if not self.store.vectors:
            return None
        limit = self.settings.max_memories_in_context
        listing, ranked = self.store.similar_listed(prefix(user_id), self.embeddings.embed_query(query), limit)
        return Ahead(query, listing, ranked, limit, self.index.current(prefix(user_id), listing=listing))

    def search(self, user_id: str, query: str, *, limit: int, visible: Sequence[BaseMessage] | None) -> list[Memory]:
        """The tool's search: the user's memories that match `query`, best first (every memory by
        similarity when semantic; a query without searchable words lists the newest).
        Under branch scope only those saved on the branch whose messages are `visible`."""
        copy = self.index.current(prefix(user_id))
        keys = self._seen(copy, visible)
        if keys is not None and not keys:
            return []
        found = self._rank(user_id, copy, query, limit=limit, keys=keys, fill=False)
        self._used(user_id, found)
        return found

    def list(self, user_id: str, query: str | None, *, limit: int) -> list[Memory]:
        """The user's current memories whatever the scope (the API and CLI), the newest version of each:
        newest first, or best first for `query`."""
        copy = self.index.current(prefix(user_id))
        return self._rank(user_id, copy, query, limit=limit, keys=visible(copy, None), fill=False)

    def list_as_of(
        self,
        user_id: str,
        query: str | None,
        *,
        limit: int,
        checkpoint_id: str,
        messages: Sequence[BaseMessage],
        ts: str | None = None,
    ) -> list[Memory]:
        """What the agent knew at checkpoint `checkpoint_id` (whose messages are `messages` and whose `ts`
        is `ts`), as a turn starting there would see it: under `branch` scope the versions saved on its
        branch; under `user` those written by checkpoints no later than it, in any thread (`scopes`,
        "Time": a fork's copy counts as of the checkpoint it copies), and the branch's own. Of each memory
        the newest of those versions; newest first, or best first for `query`."""
        copy = self.index.current(prefix(user_id))
        keys = self._on_branch(copy, messages)
        if self.settings.memory_scope == "user":
            bound = written_at(checkpoint_id, ts)
            keys |= {key for key, entry in copy.entries.items() if written_by(entry.memory.checkpoint_id, bound, checkpoint_id)}
        return self._rank(user_id, copy, query, limit=limit, keys=visible(copy, keys), fill=False)

    def find(self, user_id: str, memory_id: str, *, visible_messages: Sequence[BaseMessage] | None = None) -> Memory | None:
        """The current version of the user's memory `memory_id` (under branch scope with `visible_messages`:
        the newest version that branch saved), or None (also when it expired)."""
        copy = self.index.current(prefix(user_id))
        keys = self._seen(copy, visible_messages)
        keys = frozenset(copy.entries) if keys is None else keys
        versions = [key for key in keys if copy.entries[key].memory.memory_id == memory_id]
        return copy.entries[max(versions)].memory if versions else None

    def _seen(self, copy: Any, messages: Sequence[BaseMessage] | None) -> frozenset[str] | None:
        """The versions a turn whose branch holds `messages` may see (None: the current version of every
        memory, no filter needed); under branch scope without `messages`, the current set too."""
        if self.settings.memory_scope == "branch" and messages is not None:
            return visible(copy, self._on_branch(copy, messages))
        return visible(copy, None)

    @staticmethod
    def _on_branch(copy: Any, messages: Sequence[BaseMessage]) -> set[str]:
        keys = set(saved_on_branch(messages))
        if copy.anchors:
            keys |= anchored(copy, message_ids(messages))
        return keys

    def _rank(
        self, user_id: str, copy: Any, query: str | None, *, limit: int, keys: Any, fill: bool, ahead: Any = None
    ) -> list[Memory]:
        query = (query or "")[-MAX_QUERY_CHARS:]
        words = keywords(query)
        # Embedded before the store is read: no connection is held across the model call.
        vector = self.embeddings.embed_query(query) if self.embeddings is not None and query.strip() else None
        similar = None
        if vector is not None and self.store.vectors:  # pgvector ranks in the database (`postgres`)
            similar = functools.partial(self.store.similar, prefix(user_id))
            if isinstance(ahead, Ahead) and ahead.query == query and ahead.listing == copy.listing:
                similar = _answered(similar, ahead)
        return rank(
            copy, words=words, vector=vector, keys=keys, min_score=0 if fill or not words else 1, limit=limit, similar=similar
        )

    def _used(self, user_id: str, memories: Sequence[Memory]) -> None:
        # memory_ttl_seconds counts from the last time a memory was used (given to the model or found by the tool).
        if self.settings.memory_ttl_seconds and memories:
            self.store.refresh(prefix(user_id), [m.version for m in memories], self.settings.memory_ttl_seconds)

    # -- writes -----------------------------------------------------------------------------------
    def setup(self) -> None:
        """Set up the storage and the store (on Postgres with a model: look for pgvector, `postgres`).

        Raises:
            StorageUnavailable: the database failed.
        """
        self.store.setup()

    def prepare(self, content: str) -> None:
        """Embed `content` now, outside any transaction, so the commit only writes (see `embeddings`); the
        store is set up first (also outside it), so the commit knows where the vector goes."""
        if self.embeddings is not None:
            self.embeddings.prime([content])
            self.store.setup()

    def write_turn(self, new_messages: Sequence[BaseMessage], *, user_id: str, thread_id: str, checkpoint_id: str) -> None:
        """Apply the memory tools' results among a turn's committed messages, in order. Runs inside the turn's
        commit transaction: a turn that fails writes no memory, and a memory is written exactly when the
        message that reports it is. A change is a new version; a forget deletes every version."""
        for message in new_messages:
            artifact = memory_artifact(message)
            if artifact is None:
                continue
            if artifact[ARTIFACT_KIND] == "save":
                self._put(
                    user_id,
                    artifact["memory_id"],
                    artifact.get("version_id") or artifact["memory_id"],
                    artifact["content"],
                    {"thread_id": thread_id, "checkpoint_id": checkpoint_id, "supersedes": artifact.get("supersedes")},
                )
            else:
                self.store.delete_memory(prefix(user_id), artifact["memory_id"])

    def write_versions(self, user_id: str, versions: Sequence[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Write `(memory_id, version_id, content, provenance)` versions (`extract_memories`), in one batch;
        `provenance`: `thread_id`, `checkpoint_id`, `message_id` (the branch anchor), `supersedes`."""
        if self.embeddings is not None:
            self.embeddings.prime([content for _, _, content, _ in versions])
            self.store.setup()
        if versions:
            self.store.batch([self._put_op(user_id, *version) for version in versions])

    def _put(self, user_id: str, memory_id: str, version_id: str, content: str, provenance: dict[str, Any]) -> None:
        self.store.batch([self._put_op(user_id, memory_id, version_id, content, provenance)])

    def _put_op(self, user_id: str, memory_id: str, version_id: str, content: str, provenance: dict[str, Any]) -> PutOp:
        ttl = self.settings.memory_ttl_seconds
        value = {"content": self.keyring.seal_text(content), **{k: v for k, v in provenance.items() if v is not None}}
        if version_id != memory_id:
            value["memory_id"] = memory_id
        value.update(self.store.vector_fields(content))
        return PutOp(namespace(user_id), version_id, value, None, ttl / 60 if ttl else None)

    def delete(self, user_id: str, memory_id: str) -> None:
        """Delete the user's memory `memory_id`, every version of it.

        Raises:
            MemoryNotFound: no such memory among the user's (also another user's id); nothing was deleted.
        """
        if not self.store.delete_memory(prefix(user_id), memory_id):
            raise MemoryNotFound(f"Memory {shown_id(memory_id)} was not found.", memory_id=memory_id)

    def delete_thread_memories(self, user_id: str | None, thread_id: str) -> None:
        """Under branch scope, delete the memories the thread's turns wrote (call it in the deletion's transaction)."""
        if user_id is not None and self.settings.memory_scope == "branch":
            self.store.delete_thread_memories(prefix(user_id), thread_id)

    def delete_checkpoint_memories(self, user_id: str | None, thread_id: str, checkpoint_ids: Sequence[str]) -> int:
        """Under branch scope, delete the memory versions that these checkpoints of the thread wrote (a deleted
        branch's: call it in the deletion's transaction); how many. A memory whose newer version goes is
        known again by its previous one. Under user scope nothing is deleted (as with `delete_thread_memories`)."""
        if user_id is None or self.settings.memory_scope != "branch" or not checkpoint_ids:
            return 0
        return self.store.delete_checkpoint_memories(prefix(user_id), thread_id, checkpoint_ids)

    def delete_user(self, user_id: str) -> int:
        """Delete every memory of the user, in every scope; how many."""
        deleted = self.store.delete_all(prefix(user_id))
        self.index.forget(prefix(user_id))
        return deleted
