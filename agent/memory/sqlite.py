"""LangGraph's `SqliteStore` on the storage's one connection: search (keywords, or vectors), deletion, TTL (see `store`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
import sqlite_vec
from langgraph.store.base import TTLConfig
from langgraph.store.sqlite import SqliteStore

from agent.memory.embeddings import PrecomputedEmbeddings, cosine_distance
from agent.memory.store import to_memory
from agent.storage.sqlite import SqliteThreadStorage
from agent.types import Memory

_NOT_EXPIRED = "(s.expires_at IS NULL OR julianday(s.expires_at) > julianday('now'))"
_IN_SCOPE = "s.prefix = :prefix AND (:keys IS NULL OR s.key IN (SELECT value FROM json_each(:keys)))"
SEARCH_KEYWORDS_SQL = f"""
SELECT key, value, created_at, score FROM (
    SELECT s.key, s.value, s.created_at,
        (SELECT count(*) FROM json_each(:words) AS w
         WHERE instr(lower(json_extract(s.value, '$.content')), w.value) > 0) AS score
    FROM store s
    WHERE {_IN_SCOPE} AND {_NOT_EXPIRED}
)
WHERE score >= :min_score
ORDER BY score DESC, key DESC
LIMIT :limit
"""
# The score LangGraph's SqliteStore computes for distance_type "cosine".
SEARCH_VECTOR_SQL = f"""
SELECT s.key, s.value, s.created_at,
    CASE WHEN sv.embedding IS NULL THEN NULL ELSE 1.0 - vec_distance_cosine(sv.embedding, :vector) END AS score
FROM store s
LEFT JOIN store_vectors sv ON sv.prefix = s.prefix AND sv.key = s.key AND sv.field_name = 'content'
WHERE {_IN_SCOPE} AND {_NOT_EXPIRED}
ORDER BY score IS NULL, score DESC, s.key DESC
LIMIT :limit
"""
REFRESH_SQL = """
UPDATE store SET expires_at = :expires_at
WHERE prefix = :prefix AND key IN (SELECT value FROM json_each(:keys)) AND expires_at IS NOT NULL
"""
DELETE_MEMORY_SQL = [
    "DELETE FROM store_vectors WHERE prefix = :prefix AND key = :key",
    "DELETE FROM store WHERE prefix = :prefix AND key = :key",
]
DELETE_THREAD_MEMORIES_SQL = [
    """DELETE FROM store_vectors WHERE prefix = :prefix AND key IN (
        SELECT key FROM store WHERE prefix = :prefix AND json_extract(value, '$.thread_id') = :thread_id)""",
    "DELETE FROM store WHERE prefix = :prefix AND json_extract(value, '$.thread_id') = :thread_id",
]
DELETE_ALL_SQL = [
    "DELETE FROM store_vectors WHERE prefix = :prefix",
    "DELETE FROM store WHERE prefix = :prefix",
]
SWEEP_SQL = [
    """DELETE FROM store_vectors WHERE (prefix, key) IN (
        SELECT prefix, key FROM store WHERE expires_at IS NOT NULL AND julianday(expires_at) <= julianday('now'))""",
    "DELETE FROM store WHERE expires_at IS NOT NULL AND julianday(expires_at) <= julianday('now')",
]


class SqliteMemoryStore(SqliteStore):
    """`SqliteStore` on `storage`'s connection, under its saver's lock, inside its transactions when one is open."""

    def __init__(
        self, storage: SqliteThreadStorage, *, embeddings: PrecomputedEmbeddings | None, ttl: TTLConfig | None
    ) -> None:
        # "text_fields" is what SqliteStore reads ("fields" is PostgresStore's name for it).
        index = {"dims": 0, "embed": embeddings, "text_fields": ["content"]} if embeddings is not None else None
        SqliteStore.__init__(self, storage.saver.conn, index=index, ttl=ttl)
        self.storage = storage
        self.is_setup = True  # the storage's setup creates the tables
        self.search_kind = "keyword"
        if embeddings is not None:
            self.search_kind = "semantic (sqlite-vec)" if _load_sqlite_vec(self.conn) else "semantic (python)"

    def setup(self) -> None:
        """The storage's setup creates the store's tables (LangGraph's migrations)."""
        self.storage.setup()

    @contextmanager
    def _cursor(self, *, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        # One connection for checkpoints and memories: its saver's lock and transactions
        # (a write inside a commit joins it: TurnSqliteSaver.cursor sees the open transaction).
        self.storage.setup()
        saver = self.storage.saver
        with self.storage._errors():
            if transaction and not getattr(saver._in_transaction, "active", False):
                with saver.transaction() as cur:
                    yield cur
            else:
                with saver.cursor(transaction=False) as cur:
                    yield cur

    # -- the agent's queries ------------------------------------------------------------------
    def search(
        self,
        prefix: str,
        *,
        words: Sequence[str],
        vector: Sequence[float] | None,
        keys: Sequence[str] | None,
        min_score: float,
        limit: int,
    ) -> list[Memory]:
        params: dict[str, Any] = {
            "prefix": prefix,
            "keys": None if keys is None else json.dumps(list(keys)),
            "limit": limit,
        }
        if vector is not None:
            query, params["vector"] = SEARCH_VECTOR_SQL, sqlite_vec.serialize_float32(list(vector))
        else:
            query, params["words"], params["min_score"] = SEARCH_KEYWORDS_SQL, json.dumps(list(words)), min_score
        with self._cursor(transaction=False) as cur:
            rows = cur.execute(query, params).fetchall()
        return [to_memory(key, orjson.loads(value), created, score) for key, value, created, score in rows]

    def refresh(self, prefix: str, keys: Sequence[str], ttl_seconds: float) -> None:
        # The format LangGraph's SqliteStore writes expires_at in (sqlite3's datetime adapter).
        expires = (datetime.now(timezone.utc) + timedelta(seconds=ttl_seconds)).isoformat(" ")
        with self._cursor() as cur:
            cur.execute(REFRESH_SQL, {"expires_at": expires, "prefix": prefix, "keys": json.dumps(list(keys))})

    def delete_memory(self, prefix: str, key: str) -> bool:
        return self._delete(DELETE_MEMORY_SQL, {"prefix": prefix, "key": key}) > 0

    def delete_thread_memories(self, prefix: str, thread_id: str) -> int:
        return self._delete(DELETE_THREAD_MEMORIES_SQL, {"prefix": prefix, "thread_id": thread_id})

    def delete_all(self, prefix: str) -> int:
        return self._delete(DELETE_ALL_SQL, {"prefix": prefix})

    def sweep_ttl(self) -> int:
        """Delete expired memories and their vectors (LangGraph's sweep leaves the vectors); how many."""
        return self._delete(SWEEP_SQL, {})

    def _delete(self, statements: Sequence[str], params: dict[str, Any]) -> int:
        """Run `statements` in one transaction; the rows the last one deleted (the `store` rows)."""
        with self._cursor() as cur:
            for statement in statements[:-1]:
                cur.execute(statement, params)
            return cur.execute(statements[-1], params).rowcount


def _load_sqlite_vec(conn: sqlite3.Connection) -> bool:
    """Load sqlite-vec into `conn` if this Python's sqlite3 can load extensions; else register the same
    `vec_distance_cosine` in Python. Whether sqlite-vec was loaded."""
    if hasattr(conn, "enable_load_extension"):
        try:
            conn.enable_load_extension(True)
            try:
                sqlite_vec.load(conn)
            finally:
                conn.enable_load_extension(False)
            return True
        except sqlite3.Error:
            pass
    conn.create_function("vec_distance_cosine", 2, cosine_distance, deterministic=True)
    return False
