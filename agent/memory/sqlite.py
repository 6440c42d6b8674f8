"""LangGraph's `SqliteStore` on the storage's one connection: reads by key, deletion, TTL (see `store`).

Every statement goes through the storage's hook for running inside the commit
(`SqliteThreadStorage.cursor`): a memory written by a turn lands in the turn's
transaction, and one connection serves checkpoints and memories under one lock.

**The key listing is kept while provably unchanged** (`live_keys`). Listing a
user's 1,000 keys costs about 0.3 ms of SQLite's CPU before every turn with
memory (half of what semantic search adds besides the embedding call), and it
almost never changes between turns. SQLite says cheaply when it may have:
`PRAGMA data_version` changes when any other connection, in this process or
another, commits to the file (a few microseconds, no table read), and this
connection's own writes to the store all pass through `_cursor`, which counts
them on entry and on exit (so a listing read during a write, or a write
rolled back, is not trusted afterwards). A listing is reused only when
neither changed since it was read and no memory in it has reached its
`expires_at` (the earliest is read with the listing). Anything else lists
again, so a memory written, deleted or expired through any connection is
never missed; a process whose file other processes write to just lists every
time, as before.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson
from langgraph.store.base import TTLConfig
from langgraph.store.sqlite import SqliteStore

from agent.memory.embeddings import OpenedEmbeddings, PrecomputedEmbeddings
from agent.memory.store import to_memory
from agent.storage.sqlite.storage import SqliteThreadStorage
from agent.types import Memory

# group_concat keeps the subquery's order in practice; if it did not, a listing would only look changed.
# The earliest expiry (a Julian day, NULL when none expires) bounds how long the listing may be reused.
LIVE_KEYS_SQL = """
SELECT coalesce(group_concat(key, ','), ''), min(expiry) FROM (
    SELECT key, julianday(expires_at) AS expiry FROM store
    WHERE prefix = ? AND (expires_at IS NULL OR julianday(expires_at) > julianday('now'))
    ORDER BY key
)
"""
#: Users whose last listing is kept (`live_keys`); the listings are the strings `index` keeps anyway.
KEPT_LISTINGS = 1024
_UNIX_EPOCH_JULIAN_DAY = 2440587.5
READ_SQL = """
SELECT s.key, s.value, s.created_at, sv.embedding FROM store s
LEFT JOIN store_vectors sv ON sv.prefix = s.prefix AND sv.key = s.key AND sv.field_name = 'content'
WHERE s.prefix = ? AND s.key IN (SELECT value FROM json_each(?))
"""
REFRESH_SQL = """
UPDATE store SET expires_at = :expires_at
WHERE prefix = :prefix AND key IN (SELECT value FROM json_each(:keys)) AND expires_at IS NOT NULL
"""
# Every version of a memory: its first is keyed by the memory_id, the others name it in their value.
DELETE_MEMORY_SQL = [
    """DELETE FROM store_vectors WHERE prefix = :prefix AND key IN (
        SELECT key FROM store WHERE prefix = :prefix AND (key = :key OR json_extract(value, '$.memory_id') = :key))""",
    "DELETE FROM store WHERE prefix = :prefix AND (key = :key OR json_extract(value, '$.memory_id') = :key)",
]
DELETE_THREAD_MEMORIES_SQL = [
    """DELETE FROM store_vectors WHERE prefix = :prefix AND key IN (
        SELECT key FROM store WHERE prefix = :prefix AND json_extract(value, '$.thread_id') = :thread_id)""",
    "DELETE FROM store WHERE prefix = :prefix AND json_extract(value, '$.thread_id') = :thread_id",
]
_CHECKPOINT_VERSIONS = """SELECT key FROM store WHERE prefix = :prefix AND json_extract(value, '$.thread_id') = :thread_id
        AND json_extract(value, '$.checkpoint_id') IN (SELECT value FROM json_each(:checkpoint_ids))"""
DELETE_CHECKPOINT_MEMORIES_SQL = [
    f"DELETE FROM store_vectors WHERE prefix = :prefix AND key IN ({_CHECKPOINT_VERSIONS})",
    f"DELETE FROM store WHERE prefix = :prefix AND key IN ({_CHECKPOINT_VERSIONS})",
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
        if embeddings is not None and storage.keyring.enabled:
            embeddings = OpenedEmbeddings(embeddings, storage.keyring.open_text)  # the stored content is sealed
        # "text_fields" is what SqliteStore reads ("fields" is PostgresStore's name for it).
        index = {"dims": 0, "embed": embeddings, "text_fields": ["content"]} if embeddings is not None else None
        SqliteStore.__init__(self, storage.saver.conn, index=index, ttl=ttl)
        self.storage = storage
        self.is_setup = True  # the storage's setup creates the tables
        self.search_kind = "semantic" if embeddings is not None else "keyword"
        self.vectors = self.vectors_decided = False  # ranked in the process (`index`): SQLite has no pgvector
        self.parallel_reads = False  # one connection, under the saver's lock
        # `live_keys`' reuse (see above): the writes through this store, and each user's last listing with
        # the (connection, data_version, writes) it was read at and its earliest expiry.
        self._writes = 0
        self._writes_lock = threading.Lock()
        self._listings: OrderedDict[str, tuple[tuple[Any, int, int], float | None, str]] = OrderedDict()

    def setup(self) -> None:
        """The storage's setup creates the store's tables (LangGraph's migrations)."""
        self.storage.setup()

    @contextmanager
    def _cursor(self, *, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        # LangGraph's `transaction=True` is a write: it joins the commit running on this thread, if any.
        if not transaction:
            with self.storage.cursor(write=False) as cur:
                yield cur
            return
        self._wrote()
        try:
            with self.storage.cursor(write=True) as cur:
                yield cur
        finally:
            self._wrote()  # also after a rollback: a listing read meanwhile is not reused

    def _wrote(self) -> None:
        with self._writes_lock:
            self._writes += 1

    def vector_fields(self, content: str) -> dict[str, Any]:
        """Nothing: LangGraph's index writes the vector to `store_vectors` itself (from the cache, see `embeddings`)."""
        return {}

    # -- the agent's queries ------------------------------------------------------------------
    def live_keys(self, prefix: str) -> str:
        """As `MemoryStore.live_keys`; the last listing of `prefix` when nothing can have changed it (see above)."""
        if self.storage.saver.in_transaction:  # it sees writes not yet committed, which may roll back
            with self._cursor(transaction=False) as cur:
                return cur.execute(LIVE_KEYS_SQL, (prefix,)).fetchone()[0]
        with self._cursor(transaction=False) as cur:  # under the saver's lock: one listing at a time
            # Read before the listing: a commit between the two makes the listing look older, never newer.
            stamp = (cur.connection, cur.execute("PRAGMA data_version").fetchone()[0], self._writes)
            held = self._listings.get(prefix)
            if held is not None and held[0] == stamp and (held[1] is None or _julian_day_now() < held[1]):
                self._listings.move_to_end(prefix)
                return held[2]
            listing, expiry = cur.execute(LIVE_KEYS_SQL, (prefix,)).fetchone()
            self._listings[prefix] = (stamp, expiry, listing)
            self._listings.move_to_end(prefix)
            if len(self._listings) > KEPT_LISTINGS:
                self._listings.popitem(last=False)
        return listing

    def read(self, prefix: str, keys: Sequence[str]) -> list[tuple[Memory, list[float] | None]]:
        with self._cursor(transaction=False) as cur:
            rows = cur.execute(READ_SQL, (prefix, json.dumps(list(keys)))).fetchall()
        return [
            (to_memory(key, orjson.loads(value), created, None, self.storage.keyring), _vector(embedding))
            for key, value, created, embedding in rows
        ]

    def refresh(self, prefix: str, keys: Sequence[str], ttl_seconds: float) -> None:
        # The format LangGraph's SqliteStore writes expires_at in (sqlite3's datetime adapter).
        expires = (datetime.now(timezone.utc) + timedelta(seconds=ttl_seconds)).isoformat(" ")
        with self._cursor() as cur:
            cur.execute(REFRESH_SQL, {"expires_at": expires, "prefix": prefix, "keys": json.dumps(list(keys))})

    def delete_memory(self, prefix: str, key: str) -> bool:
        return self._delete(DELETE_MEMORY_SQL, {"prefix": prefix, "key": key}) > 0

    def delete_thread_memories(self, prefix: str, thread_id: str) -> int:
        return self._delete(DELETE_THREAD_MEMORIES_SQL, {"prefix": prefix, "thread_id": thread_id})

    def delete_checkpoint_memories(self, prefix: str, thread_id: str, checkpoint_ids: Sequence[str]) -> int:
        params = {"prefix": prefix, "thread_id": thread_id, "checkpoint_ids": json.dumps(list(checkpoint_ids))}
        return self._delete(DELETE_CHECKPOINT_MEMORIES_SQL, params)

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


def _julian_day_now() -> float:
    """Now as SQLite's `julianday('now')` counts it (UTC days)."""
    return time.time() / 86400.0 + _UNIX_EPOCH_JULIAN_DAY


def _vector(blob: bytes | None) -> list[float] | None:
    """A vector from its `store_vectors` blob (sqlite-vec's float32 format, `sqlite_vec.serialize_float32`)."""
    if blob is None:
        return None
    import numpy  # a dependency of MLflow; only stored embeddings need it (about 0.1 s to import)

    return numpy.frombuffer(blob, dtype=numpy.float32)
