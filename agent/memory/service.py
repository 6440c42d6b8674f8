"""`Memories`: a user's long-term memories over the store, with the scope rule and the turn's atomicity.

Every method takes the caller's `user_id` and touches only that user's
namespace (`scopes.namespace`), so the ownership rule is the namespace itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.store.base import PutOp

from agent.config import AgentSettings, is_postgres_url
from agent.errors import MemoryNotFound
from agent.memory import open_store
from agent.memory.embeddings import PrecomputedEmbeddings, make_embeddings
from agent.memory.index import MemoryIndex, rank
from agent.memory.retrieval import MAX_QUERY_CHARS, recall_query
from agent.memory.scopes import ARTIFACT_KIND, memory_artifact, namespace, prefix, saved_on_branch
from agent.memory.store import keywords
from agent.types import Memory

logger = logging.getLogger(__name__)

#: Minutes between sweeps of expired memories (LangGraph's TTL sweeper), when `memory_ttl_seconds` is set.
SWEEP_INTERVAL_MINUTES = 5


class Memories:
    """The long-term memories of one agent's users (see `agent.memory`)."""

    def __init__(self, storage: Any, settings: AgentSettings) -> None:
        self.settings = settings
        self.keyring = storage.keyring
        self.embeddings: PrecomputedEmbeddings | None = None
        if settings.embedding_model:
            if is_postgres_url(settings.database_url):
                logger.warning(
                    "embedding_model %r is set, but semantic memory search needs sqlite-vec (SQLite) and is not "
                    "available on Postgres in this version; memories are searched by keywords.",
                    settings.embedding_model,
                )
            else:
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
        self, user_id: str | None, new_messages: Sequence[BaseMessage], history: Sequence[BaseMessage]
    ) -> tuple[Memory, ...]:
        """The memories to give the model before a turn: at most `max_memories_in_context`, most relevant
        to the turn's new messages first; `history` is the turn's start checkpoint's messages.

        Under `memory_scope="branch"` only those saved on the start's branch. By keywords, memories that
        share no word with the messages fill the places left, newest first. None without a user_id.
        """
        limit = self.settings.max_memories_in_context
        if user_id is None or limit == 0:
            return ()
        keys = None
        if self.settings.memory_scope == "branch":
            keys = saved_on_branch(history)
            if not keys:
                return ()
        found = self._search(user_id, recall_query(new_messages, history), limit=limit, keys=keys, fill=True)
        self._used(user_id, found)
        return tuple(found)

    def search(self, user_id: str, query: str, *, limit: int, visible: Sequence[BaseMessage] | None) -> list[Memory]:
        """The tool's search: the user's memories that match `query`, best first (every memory by
        similarity when semantic; a query without searchable words lists the newest).
        Under branch scope only those saved on the branch whose messages are `visible`."""
        keys = saved_on_branch(visible) if self.settings.memory_scope == "branch" and visible is not None else None
        if keys is not None and not keys:
            return []
        found = self._search(user_id, query, limit=limit, keys=keys, fill=False)
        self._used(user_id, found)
        return found

    def list(self, user_id: str, query: str | None, *, limit: int) -> list[Memory]:
        """Every memory of the user whatever the scope (the API and CLI): newest first, or best first for `query`."""
        return self._search(user_id, query, limit=limit, keys=None, fill=False)

    def find(self, user_id: str, memory_id: str) -> Memory | None:
        """The user's memory `memory_id`, or None (also when it expired)."""
        entry = self.index.current(prefix(user_id)).entries.get(memory_id)
        return entry.memory if entry is not None else None

    def _search(self, user_id: str, query: str | None, *, limit: int, keys: Any, fill: bool) -> list[Memory]:
        query = (query or "")[-MAX_QUERY_CHARS:]
        words = keywords(query)
        # Embedded before the store is read: no connection is held across the model call.
        vector = self.embeddings.embed_query(query) if self.embeddings is not None and query.strip() else None
        return rank(self.index.current(prefix(user_id)), words=words, vector=vector, keys=keys, min_score=0 if fill or not words else 1, limit=limit)

    def _used(self, user_id: str, memories: Sequence[Memory]) -> None:
        # memory_ttl_seconds counts from the last time a memory was used (given to the model or found by the tool).
        if self.settings.memory_ttl_seconds and memories:
            self.store.refresh(prefix(user_id), [m.memory_id for m in memories], self.settings.memory_ttl_seconds)

    # -- writes -----------------------------------------------------------------------------------
    def prepare(self, content: str) -> None:
        """Embed `content` now, outside any transaction, so the commit only writes (see `embeddings`)."""
        if self.embeddings is not None:
            self.embeddings.prime([content])

    def write_turn(self, new_messages: Sequence[BaseMessage], *, user_id: str, thread_id: str, checkpoint_id: str) -> None:
        """Apply the memory tools' results among a turn's committed messages, in order. Runs inside the turn's
        commit transaction: a turn that fails writes no memory, and a memory is written exactly when the
        message that reports it is."""
        ttl = self.settings.memory_ttl_seconds
        for message in new_messages:
            artifact = memory_artifact(message)
            if artifact is None:
                continue
            if artifact[ARTIFACT_KIND] == "save":
                content = self.keyring.seal_text(artifact["content"])  # sealed when encryption is on
                value = {"content": content, "thread_id": thread_id, "checkpoint_id": checkpoint_id}
                self.store.batch([PutOp(namespace(user_id), artifact["memory_id"], value, None, ttl / 60 if ttl else None)])
            else:
                self.store.delete_memory(prefix(user_id), artifact["memory_id"])

    def delete(self, user_id: str, memory_id: str) -> None:
        """Delete the user's memory `memory_id`.

        Raises:
            MemoryNotFound: no such memory among the user's (also another user's id); nothing was deleted.
        """
        if not self.store.delete_memory(prefix(user_id), memory_id):
            raise MemoryNotFound(f"Memory {memory_id!r} was not found.", memory_id=memory_id)

    def delete_thread_memories(self, user_id: str | None, thread_id: str) -> None:
        """Under branch scope, delete the memories the thread's turns wrote (call it in the deletion's transaction)."""
        if user_id is not None and self.settings.memory_scope == "branch":
            self.store.delete_thread_memories(prefix(user_id), thread_id)

    def delete_user(self, user_id: str) -> int:
        """Delete every memory of the user, in every scope; how many."""
        deleted = self.store.delete_all(prefix(user_id))
        self.index.forget(prefix(user_id))
        return deleted
