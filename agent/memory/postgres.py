"""LangGraph's `PostgresStore` on the storage's pool: reads by key, vectors, deletion and TTL refresh (see `store`).

Semantic search on any Postgres, decided once per process when the store is
set up (`setup`, also on first use; `vectors` says which):

* **pgvector, when the server has it.** Setup looks for the `vector`
  extension and, if it is not installed, creates it (`CREATE EXTENSION IF NOT
  EXISTS`, in a savepoint). A server without the extension, or a role without
  the privilege to create it (pgvector is not a trusted extension) or the
  vectors' table, falls back to the exact path below: logged once, never an
  error. With it, a memory's vector is a row of LangGraph's `store_vectors`
  (`vector` column, cosine), written by LangGraph's own `PostgresStore` in the
  memory's commit (its `index=` config, from the embeddings cache: nothing is
  embedded inside the transaction), and a search ranks in the server
  (`SIMILAR_SQL`): one query over the user's vectors, the top k by cosine
  distance, the newer key first among equals, so the results are those of the
  exact path. The in-process copy (`index`) then holds no vectors. A turn's
  search runs while its claim is on the way (`similar_listed`, with the key
  listing it ranked among, read by the same statement; `Memories.prime`), so
  the turn makes no round trip for it.
* **Exact cosine over stored embeddings, when it does not.** A memory's vector
  rides in its row's value (`embedding`: base64 of float32, 4 bytes a
  dimension) and is read with the memory into the in-process copy, where
  searches rank by exact cosine similarity (`index`), as on SQLite.

Which index, and why: the search reads the user's vectors through the primary
key of `store_vectors` (prefix, key, field_name), a B-tree whose recall is
exact, and orders them by `1 - (embedding <=> query)`, an expression no ANN
index serves, so the planner never swaps in an approximate scan. No HNSW or
IVFFlat index is built (LangGraph's `ann_index_config` kind `flat`): every
search is filtered to one user, and pgvector applies such a filter after the
index scan (`hnsw.ef_search`, 40 candidates by default, across every user), so
a user's top k could come back short or different from the exact ranking;
LangGraph's own search avoids its ANN index for the same reason
(`get_distance_operator`). An HNSW index would also cost every memory write an
insertion into the graph and its bytes on disk, for searches it cannot serve.
For the thousands of memories one user has, the exact scan is a fraction of a
millisecond in the server.

The vectors' table differs from LangGraph's migration in one point: its column
is `vector` without a dimension (LangGraph's is `vector(dims)`), because the
dimension is known only once the embeddings model answers, and a model with
other dimensions must not make writes fail; searches compare vectors of the
query's dimension only (`vector_dims`), as the exact path does. It is recorded
in LangGraph's `vector_migrations` (versions 0 and 1), so LangGraph's own setup
finds it applied. Not in `migrations.TABLES`: it exists only where pgvector
does, and a missing one is no reason to re-apply the schema.

Migration: memories saved before pgvector appeared carry their vector in their
value. They get their `store_vectors` row lazily, when a process with pgvector
first reads them (`read`, a user's memories are read on the user's first
search in each process): the vector is inserted and removed from the value in
one transaction, so it happens once, whichever process reads first, and costs
nothing when there is nothing to move. Deletion needs nothing more:
`store_vectors` references `store` with `ON DELETE CASCADE`, so `forget`,
`delete_user_data`, branch deletion and the TTL sweep take the vectors with the
rows.

Every statement goes through the storage's hook for running inside the commit
(`PostgresThreadStorage.cursor` for LangGraph's own queries, `.run` for the
agent's): a memory written by a turn lands in the turn's commit.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from langgraph.store.base import TTLConfig
from langgraph.store.postgres import PostgresStore
from langgraph.store.postgres.base import VECTOR_MIGRATIONS, _ensure_index_config

from agent.memory.embeddings import OpenedEmbeddings, PrecomputedEmbeddings
from agent.memory.store import to_memory
from agent.storage.postgres import schema
from agent.storage.postgres.storage import PostgresThreadStorage
from agent.types import Memory

logger = logging.getLogger(__name__)

LIVE_KEYS_SQL = """
SELECT coalesce(string_agg(key, ',' ORDER BY key), '') AS keys FROM store
WHERE prefix = %s AND (expires_at IS NULL OR expires_at > now())
"""
READ_SQL = "SELECT key, value, created_at FROM store WHERE prefix = %s AND key = ANY(%s::text[])"
# With pgvector the vector is not read: the server ranks. A value that still carries one (saved before
# pgvector appeared) is returned whole, to be moved (`MOVE_VECTORS_SQL`).
READ_WITHOUT_VECTORS_SQL = """
SELECT key, value - 'embedding' AS value, created_at, value ->> 'embedding' AS embedding
FROM store WHERE prefix = %s AND key = ANY(%s::text[])
"""
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

# -- pgvector ------------------------------------------------------------------------------------
VECTORS_READY_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector') AS installed,
    EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') AS available,
    to_regclass('store_vectors') IS NOT NULL AS has_table
"""
# LangGraph's store_vectors (VECTOR_MIGRATIONS[1]) with an undimensioned `vector` column (see above), kept
# in the row (MAIN) while it fits, as a 1536-dimension vector (6 kB) does: pgvector's type defaults to
# EXTERNAL, and fetching a thousand vectors from TOAST took 3-5 ms of a search that otherwise takes 1-2.
CREATE_VECTORS_SQL = """
CREATE TABLE IF NOT EXISTS store_vectors (
    prefix text NOT NULL,
    key text NOT NULL,
    field_name text NOT NULL,
    embedding vector,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (prefix, key, field_name),
    FOREIGN KEY (prefix, key) REFERENCES store(prefix, key) ON DELETE CASCADE
);
ALTER TABLE store_vectors ALTER COLUMN embedding SET STORAGE MAIN
"""
#: LangGraph's vector migrations as applied here: the extension (its text), the table (ours, see above).
VECTOR_SCHEMA = (VECTOR_MIGRATIONS[0].sql, CREATE_VECTORS_SQL)
RECORD_VECTOR_MIGRATION_SQL = "INSERT INTO vector_migrations (v) VALUES (%s) ON CONFLICT DO NOTHING"
# The exact top k: the user's rows by the primary key, ordered by an expression (not the bare `<=>`),
# so no ANN index could serve it; among equal scores the newer (greater) key first, as `index.rank`.
# Candidates are named only when few (`key = ANY` over a thousand keys cost more than the ranking).
_SIMILAR = """
SELECT key, 1 - (embedding <=> %(query)s::real[]::vector) AS score FROM store_vectors
WHERE prefix = %(prefix)s AND field_name = 'content' AND vector_dims(embedding) = %(dims)s AND {keys}
ORDER BY score DESC, key DESC
LIMIT %(limit)s
"""
SIMILAR_SQL = _SIMILAR.format(keys="key <> ALL(%(keys)s::text[])")
SIMILAR_AMONG_SQL = _SIMILAR.format(keys="key = ANY(%(keys)s::text[])")
# The top k of all the user's vectors and, in the same statement (one snapshot), the listing of the keys
# they were ranked among (LIVE_KEYS_SQL's): a search run ahead of the copy it is used with (`similar_listed`).
SIMILAR_LISTED_SQL = f"""
WITH top AS ({SIMILAR_SQL})
SELECT (SELECT coalesce(string_agg(key, ',' ORDER BY key), '') FROM store
        WHERE prefix = %(prefix)s AND (expires_at IS NULL OR expires_at > now())) AS listing,
    coalesce((SELECT array_agg(key ORDER BY score DESC, key DESC) FROM top), '{{}}') AS keys,
    coalesce((SELECT array_agg(score ORDER BY score DESC, key DESC) FROM top), '{{}}') AS scores
"""
MOVE_VECTORS_SQL = [
    """INSERT INTO store_vectors (prefix, key, field_name, embedding)
    SELECT %(prefix)s, key, 'content', vector::vector
    FROM unnest(%(keys)s::text[], %(vectors)s::text[]) AS moved(key, vector)
    ON CONFLICT DO NOTHING""",
    "UPDATE store SET value = value - 'embedding' WHERE prefix = %(prefix)s AND key = ANY(%(keys)s::text[])",
]


#: What setting up pgvector may meet and fall back from: no privilege to create the extension (it is not
#: trusted) or the table, a read-only server, an extension listed but not loadable.
NOT_PERMITTED = (
    psycopg.errors.InsufficientPrivilege,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.errors.UndefinedFile,
    psycopg.errors.FeatureNotSupported,
)


class PostgresMemoryStore(PostgresStore):
    """`PostgresStore` on `storage`'s pool (or its write transaction's connection), with the agent's queries."""

    def __init__(self, storage: PostgresThreadStorage, *, embeddings: PrecomputedEmbeddings | None, ttl: TTLConfig | None) -> None:
        PostgresStore.__init__(self, storage.pool, ttl=ttl)
        self.storage = storage
        self.precomputed = embeddings
        self.search_kind = "semantic" if embeddings is not None else "keyword"
        self._vectors: bool | None = None  # decided by `setup`
        self._setup_lock = threading.Lock()
        self.parallel_reads = True  # each read on a pooled connection of its own

    @property
    def vectors(self) -> bool:
        """Whether vectors are kept and ranked by pgvector (`store_vectors`); False: in the rows' values,
        ranked exactly in the process. Set up the store first if it was not."""
        if self._vectors is None:
            self.setup()
        return bool(self._vectors)

    @property
    def vectors_decided(self) -> bool | None:
        """`vectors` if setup has decided it, else None; never sets up (a caller that must not block asks this)."""
        return self._vectors

    def vector_fields(self, content: str) -> dict[str, Any]:
        """What a memory's stored value carries besides its text: without pgvector `{"embedding": base64
        float32}` of `content` (the plaintext; computed once, before the commit, see `embeddings`); with it,
        or without a model, nothing (LangGraph writes the `store_vectors` row, from the cache)."""
        if self.precomputed is None or self.vectors:
            return {}
        import numpy

        [vector] = self.precomputed.embed_documents([content])
        return {"embedding": base64.b64encode(numpy.asarray(vector, dtype=numpy.float32).tobytes()).decode("ascii")}

    def setup(self) -> None:
        """The storage's setup creates the store's tables (LangGraph's migrations, in its one transaction); with
        an embeddings model, then, pgvector is looked for (see above), once per process.

        Raises:
            StorageUnavailable: the database failed (a missing extension or privilege only falls back).
        """
        self.storage.setup()
        if self._vectors is not None:
            return
        with self._setup_lock:
            if self._vectors is None:
                found = False
                if self.precomputed is not None:
                    # A pooled connection of its own, never a commit's: setup's DDL is no part of a turn.
                    with self.storage.connections.faults("look for pgvector", None), self.storage.connection() as conn:
                        found = self._set_up_vectors(conn)
                if found:
                    embed = self.precomputed
                    if self.storage.keyring.enabled:
                        embed = OpenedEmbeddings(embed, self.storage.keyring.open_text)  # the stored content is sealed
                    # LangGraph's `fields`; `flat`: no ANN index (see above); dims only names the config here.
                    config = {"dims": 0, "embed": embed, "fields": ["content"], "ann_index_config": {"kind": "flat"}}
                    self.embeddings, self.index_config = _ensure_index_config(config)
                self._vectors = found

    def _set_up_vectors(self, conn: psycopg.Connection) -> bool:
        """Whether pgvector holds the vectors, creating the extension and `store_vectors` if needed (a read only
        when both exist). False, logged, when the server lacks the extension or the role the privilege."""
        state = conn.execute(VECTORS_READY_SQL).fetchone()
        if state["installed"] and state["has_table"]:
            return True
        if not state["installed"] and not state["available"]:
            logger.info("pgvector is not installed on %s: semantic memory search ranks exactly in the process", self.storage.masked)
            return False
        try:
            with conn.transaction():
                conn.execute(schema.UNLIMITED_SQL)
                conn.execute(schema.SETUP_LOCK_SQL, (schema.SETUP_LOCK_KEY,))
                conn.execute("CREATE TABLE IF NOT EXISTS vector_migrations (v INTEGER PRIMARY KEY)")
                for version, statement in enumerate(VECTOR_SCHEMA):
                    conn.execute(statement)
                    conn.execute(RECORD_VECTOR_MIGRATION_SQL, (version,))
        except NOT_PERMITTED as exc:
            logger.info(
                "pgvector could not be set up on %s (%s): semantic memory search ranks exactly in the process",
                self.storage.masked,
                str(exc).splitlines()[0],
            )
            return False
        return True

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
        """With pgvector the vectors stay in the server (None each), and vectors still in values move there."""
        keyring = self.storage.keyring
        if not self.vectors:
            rows = self._execute("read memories", lambda conn: conn.execute(READ_SQL, (prefix, list(keys))).fetchall())
            return [(to_memory(row["key"], row["value"], row["created_at"], None, keyring), _vector(row["value"])) for row in rows]
        rows = self._execute("read memories", lambda conn: conn.execute(READ_WITHOUT_VECTORS_SQL, (prefix, list(keys))).fetchall())
        unmoved = [row for row in rows if row["embedding"]]
        if unmoved:
            self._move_vectors(prefix, unmoved)
        return [(to_memory(row["key"], row["value"], row["created_at"], None, keyring), None) for row in rows]

    def similar(
        self, prefix: str, vector: Sequence[float], limit: int, *, among: Sequence[str] | None = None, excluding: Sequence[str] = ()
    ) -> list[tuple[str, float]]:
        """With pgvector: of the memories under `prefix` that have a vector of `vector`'s dimension (only
        those `among`, if given, else all but those `excluding`), the `limit` most similar to `vector` by
        cosine, best first, the newer (greater key) first among equals, as `(key, similarity)`."""
        statement = SIMILAR_SQL if among is None else SIMILAR_AMONG_SQL
        keys = list(excluding if among is None else among)
        params = {"query": [float(x) for x in vector], "prefix": prefix, "keys": keys, "dims": len(vector), "limit": limit}
        rows = self._execute("search memories", lambda conn: conn.execute(statement, params).fetchall())
        return [(row["key"], float(row["score"])) for row in rows]

    def similar_listed(self, prefix: str, vector: Sequence[float], limit: int) -> tuple[str, list[tuple[str, float]]]:
        """`similar(prefix, vector, limit)` and, read at the same moment, `live_keys(prefix)`: a search run
        before the in-process copy is known, valid for a copy made from that listing (`Memories.prime`)."""
        params = {"query": [float(x) for x in vector], "prefix": prefix, "keys": [], "dims": len(vector), "limit": limit}
        row = self._execute("search memories", lambda conn: conn.execute(SIMILAR_LISTED_SQL, params).fetchone())
        return row["listing"], [(key, float(score)) for key, score in zip(row["keys"], row["scores"], strict=True)]

    def _move_vectors(self, prefix: str, rows: Sequence[Any]) -> None:
        """Give memories saved before pgvector appeared their `store_vectors` row (see above)."""
        params = {
            "prefix": prefix,
            "keys": [row["key"] for row in rows],
            "vectors": ["[" + ",".join(map(repr, _vector(row).tolist())) + "]" for row in rows],
        }

        def move(conn: psycopg.Connection) -> None:
            with conn.transaction():
                for statement in MOVE_VECTORS_SQL:
                    conn.execute(statement, params)

        self._execute("move memory vectors to pgvector", move)

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
