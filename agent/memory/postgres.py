"""LangGraph's `PostgresStore` on the storage's pool: reads by key, vectors, deletion and TTL refresh (see `store`).

Semantic search on any Postgres: a memory's vector rides in its row's value
(`embedding`: base64 of float32, 4 bytes a dimension) and is read with the
memory into the in-process copy, where searches rank by exact cosine
similarity (`index`), as on SQLite. So it needs no extension (pgvector is
absent from many servers, and from this project's test machines); with a
user's memories already in the process, a search costs one key listing and
one matrix product, which an index in the server would not beat for the
thousands of memories one user has.

Every statement goes through the storage's hook for running inside the commit
(`PostgresThreadStorage.cursor` for LangGraph's own queries, `.run` for the
agent's): a memory written by a turn lands in the turn's commit.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from langgraph.store.base import TTLConfig
from langgraph.store.postgres import PostgresStore

from agent.memory.embeddings import PrecomputedEmbeddings
from agent.memory.store import to_memory
from agent.storage.postgres import PostgresThreadStorage
from agent.types import Memory

LIVE_KEYS_SQL = """
SELECT coalesce(string_agg(key, ',' ORDER BY key), '') AS keys FROM store
WHERE prefix = %s AND (expires_at IS NULL OR expires_at > now())
"""
READ_SQL = "SELECT key, value, created_at FROM store WHERE prefix = %s AND key = ANY(%s::text[])"
REFRESH_SQL = """
UPDATE store SET expires_at = now() + make_interval(secs => %s)
WHERE prefix = %s AND key = ANY(%s::text[]) AND expires_at IS NOT NULL
"""
DELETE_MEMORY_SQL = "DELETE FROM store WHERE prefix = %s AND (key = %s OR value ->> 'memory_id' = %s)"
DELETE_THREAD_MEMORIES_SQL = "DELETE FROM store WHERE prefix = %s AND value ->> 'thread_id' = %s"
DELETE_CHECKPOINT_MEMORIES_SQL = """
DELETE FROM store WHERE prefix = %s AND value ->> 'thread_id' = %s AND value ->> 'checkpoint_id' = ANY(%s::text[])
"""
DELETE_ALL_SQL = "DELETE FROM store WHERE prefix = %s"


class PostgresMemoryStore(PostgresStore):
    """`PostgresStore` on `storage`'s pool (or its write transaction's connection), with the agent's queries."""

    def __init__(self, storage: PostgresThreadStorage, *, embeddings: PrecomputedEmbeddings | None, ttl: TTLConfig | None) -> None:
        PostgresStore.__init__(self, storage.pool, ttl=ttl)
        self.storage = storage
        self.embeddings = embeddings
        self.search_kind = "semantic" if embeddings is not None else "keyword"

    def vector_fields(self, content: str) -> dict[str, Any]:
        """What a memory's stored value carries besides its text: `{"embedding": base64 float32}` of `content`
        (the plaintext; computed once, before the commit, see `embeddings`), or nothing without a model."""
        if self.embeddings is None:
            return {}
        import numpy

        [vector] = self.embeddings.embed_documents([content])
        return {"embedding": base64.b64encode(numpy.asarray(vector, dtype=numpy.float32).tobytes()).decode("ascii")}

    def setup(self) -> None:
        """The storage's setup creates the store's tables (LangGraph's migrations, in its one transaction)."""
        self.storage.setup()

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[psycopg.Cursor]:
        # As the saver's: the write transaction's connection if one is open on this thread, else a
        # pooled one; no instance lock (langgraph#7259).
        with self.storage.cursor(pipeline=pipeline) as cur:
            yield cur

    def _execute(self, action: str, work: Callable[[psycopg.Connection], Any]) -> Any:
        return self.storage.run(action, work)

    # -- the agent's queries ------------------------------------------------------------------
    def live_keys(self, prefix: str) -> str:
        return self._execute("list memories", lambda conn: conn.execute(LIVE_KEYS_SQL, (prefix,)).fetchone()["keys"])

    def read(self, prefix: str, keys: Sequence[str]) -> list[tuple[Memory, list[float] | None]]:
        rows = self._execute("read memories", lambda conn: conn.execute(READ_SQL, (prefix, list(keys))).fetchall())
        keyring = self.storage.keyring
        return [(to_memory(row["key"], row["value"], row["created_at"], None, keyring), _vector(row["value"])) for row in rows]

    def refresh(self, prefix: str, keys: Sequence[str], ttl_seconds: float) -> None:
        self._execute("refresh memories", lambda conn: conn.execute(REFRESH_SQL, (ttl_seconds, prefix, list(keys))))

    def delete_memory(self, prefix: str, key: str) -> bool:
        return self._execute("delete a memory", lambda conn: conn.execute(DELETE_MEMORY_SQL, (prefix, key, key)).rowcount) > 0

    def delete_thread_memories(self, prefix: str, thread_id: str) -> int:
        return self._execute(
            "delete a thread's memories", lambda conn: conn.execute(DELETE_THREAD_MEMORIES_SQL, (prefix, thread_id)).rowcount
        )

    def delete_checkpoint_memories(self, prefix: str, thread_id: str, checkpoint_ids: Sequence[str]) -> int:
        return self._execute(
            "delete a branch's memories",
            lambda conn: conn.execute(DELETE_CHECKPOINT_MEMORIES_SQL, (prefix, thread_id, list(checkpoint_ids))).rowcount,
        )

    def delete_all(self, prefix: str) -> int:
        return self._execute("delete memories", lambda conn: conn.execute(DELETE_ALL_SQL, (prefix,)).rowcount)


def _vector(value: dict[str, Any]) -> Any:
    """The vector a stored value carries (`PostgresMemoryStore.vector_fields`), or None."""
    encoded = value.get("embedding")
    if not encoded:
        return None
    import numpy  # a dependency of MLflow; only stored embeddings need it

    return numpy.frombuffer(base64.b64decode(encoded), dtype=numpy.float32)
