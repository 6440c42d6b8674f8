"""The LangGraph store beside the checkpointer, on the same connections: what the agent asks of it, and why.

`agent.memory.open_store(url, storage, ...)` gives LangGraph's `PostgresStore`
on the storage's pool (`postgres`), or `SqliteStore` on the storage's one
SQLite connection (`sqlite`; also for `memory://`, which is SQLite `:memory:`:
one code path, and memory writes share the checkpoints' transaction, which
`InMemoryStore` could not). Its tables
(`store`, `store_vectors` on SQLite) are created by the storage's own setup,
with the checkpoint tables, in its one migration transaction.

What the agent changes in LangGraph's stores, and why:

* **Connections.** `_cursor` is overridden as the saver's is, through the
  storage's public hook for running inside the commit
  (`PostgresThreadStorage.cursor` / `.run`, `SqliteThreadStorage.cursor`): the
  connection of the write transaction in progress, so memory writes commit or
  roll back with the turn, else a pooled connection (Postgres) or the saver's
  lock (SQLite). No instance lock (langgraph#7259), no prepared statements
  (the pool's `prepare_threshold`), no session state.
* **Search.** LangGraph's `search` ignores `query` without a vector index,
  cannot restrict a search to a set of keys (the branch rule), embeds the
  query while it holds a connection, and ranks in SQL by reading every memory
  of the user on every turn. So the agent ranks in Python over an in-process
  copy of the user's memories that the store's key listing keeps exact
  (`index`): keyword search (`keywords`: the words of the query a memory
  contains) on both backends, and on SQLite with an embeddings model the
  cosine similarity of the vectors LangGraph stores in `store_vectors`
  (sqlite-vec's float32 format; sqlite-vec itself is not needed to compare
  them, and Python builds without `enable_load_extension`, such as pyenv's
  default, could not load it). On Postgres with pgvector (found or created
  at setup) the vector is a row of LangGraph's `store_vectors` and the
  server ranks, exactly (`similar`); without it the vector is kept in the
  row's value (`embedding`, base64 float32) and compared the same way as on
  SQLite, exactly, in the process: so it works on any Postgres, with the
  same results (`postgres`).
* **Versions** are rows: a memory's first version is keyed by its
  `memory_id` (as every memory was before versions, so those read as
  one-version memories with no migration), each later version by its own id
  with `memory_id` and `supersedes` in its value.
* **Deletion** is SQL too: by memory (every version), by thread, by user, and on SQLite from
  `store_vectors` as well (its foreign key is not enforced without
  `PRAGMA foreign_keys`, so LangGraph's deletes leave vectors behind).
* **Encryption at rest** (`agent.encryption`): with a key configured, a
  memory's `content` is stored sealed (its `thread_id` and `checkpoint_id`
  stay plaintext: deletion by thread queries them) and opened when read, so
  the in-process copy that searches rank over holds plaintext, and no search
  needs to decrypt in SQL. On SQLite the embeddings model is handed the
  plaintext (`embeddings.OpenedEmbeddings`): LangGraph embeds the stored value.
* **TTL.** LangGraph writes `expires_at` from `TTLConfig.default_ttl`; reads
  skip expired memories; the agent refreshes `expires_at` (to the second, where
  Postgres's `ttl_minutes` column is whole minutes) when memories are used.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Protocol

from agent.encryption import NO_KEYS, Keyring
from agent.types import Memory

#: Words a keyword search ignores: they occur in most sentences.
STOPWORDS = frozenset(
    """a about after all also am an and any are as at be been but by can could did do does for from get got had has
    have he her hers him his how i if im in into is it its just know like me my no not now of on or our please
    remember remembered say said she so some tell than that the their them then there they this to told us was we
    were what when where which who why will with would you your yours""".split()
)
#: Most words of a query that count (the rest are ignored).
MAX_QUERY_WORDS = 16
_WORD = re.compile(r"\w+")


def keywords(text: str | None) -> list[str]:
    """The searchable words of `text`: lower-cased, two characters or more, not `STOPWORDS`, first
    `MAX_QUERY_WORDS`, each once. A memory matches a word when its content contains it (so "trip"
    matches "trips")."""
    found: dict[str, None] = {}
    for word in _WORD.findall((text or "").lower()):
        if len(word) >= 2 and word not in STOPWORDS:
            found.setdefault(word, None)
        if len(found) == MAX_QUERY_WORDS:
            break
    return list(found)


class MemoryStore(Protocol):
    """What the agent asks of a backend's store. Every method raises StorageUnavailable when the database fails."""

    #: "keyword" or "semantic": how searches rank (see `index.rank`).
    search_kind: str
    #: Whether the database ranks vectors (`similar`: pgvector, `postgres`); False: `index.rank` does.
    vectors: bool
    #: `vectors` once setup has decided it, else None (reading it never sets up).
    vectors_decided: bool | None
    #: Whether a read on another thread runs alongside the turn's claim (Postgres: a pooled connection each),
    #: rather than waiting for it (SQLite: one connection under one lock), so starting it early gains time.
    parallel_reads: bool

    def setup(self) -> None:
        """Set up the storage's tables and, on Postgres with a model, pgvector (once per process)."""

    def live_keys(self, prefix: str) -> str:
        """The keys of the memories under `prefix` that have not expired, sorted, joined by commas ("" for
        none): one value, cheap to compare with the last listing (reads no memory)."""

    def read(self, prefix: str, keys: Sequence[str]) -> list[tuple[Memory, list[float] | None]]:
        """The memories `keys` under `prefix` that exist, each with its content's vector (None without one)."""

    def similar(
        self, prefix: str, vector: Sequence[float], limit: int, *, among: Sequence[str] | None = None, excluding: Sequence[str] = ()
    ) -> list[tuple[str, float]]:
        """When `vectors`: of the memories under `prefix` with a vector of `vector`'s dimension (only those
        `among` if given, else all but those `excluding`), the `limit` most similar to `vector` by cosine,
        best first, the newer (greater key) first among equals, as `(key, similarity)`."""

    def refresh(self, prefix: str, keys: Sequence[str], ttl_seconds: float) -> None:
        """Move the expiry of these memories (those that expire) to `ttl_seconds` from now."""

    def delete_memory(self, prefix: str, key: str) -> bool:
        """Delete one memory, every version of it (`key` is its `memory_id`); whether it existed."""

    def delete_thread_memories(self, prefix: str, thread_id: str) -> int:
        """Delete the memories under `prefix` that a turn of `thread_id` wrote; how many."""

    def delete_checkpoint_memories(self, prefix: str, thread_id: str, checkpoint_ids: Sequence[str]) -> int:
        """Delete the versions under `prefix` written by (or extracted at) these checkpoints of `thread_id`; how many."""

    def delete_all(self, prefix: str) -> int:
        """Delete every memory under `prefix`; how many."""


def to_memory(key: str, value: Mapping[str, Any], created_at: Any, score: Any, keyring: Keyring = NO_KEYS) -> Memory:
    """A `Memory` from a store row (`created_at` a datetime or SQLite's `YYYY-MM-DD HH:MM:SS` in UTC), its
    content opened with `keyring`.

    Raises:
        EncryptionKeyError: the content is sealed with a key `keyring` lacks.
    """
    if isinstance(created_at, str):
        created_at = datetime.fromisoformat(created_at)
    if isinstance(created_at, datetime):
        if created_at.tzinfo is None:
            created_at = created_at.replace(tzinfo=timezone.utc)
        created_at = created_at.astimezone(timezone.utc).isoformat()
    return Memory(
        memory_id=value.get("memory_id") or key,  # rows written before versions: one version, keyed by the memory
        content=keyring.open_text(value["content"], what=f"Memory {key!r}"),
        thread_id=value["thread_id"],
        checkpoint_id=value["checkpoint_id"],
        created_at=created_at,
        score=None if score is None else float(score),
        version_id=key,
        supersedes=value.get("supersedes"),
        source_message_id=value.get("message_id"),
    )
