"""Long-term memory: what the agent learns about a user, kept across threads, searchable, owned by that user.

Short-term memory is a thread's checkpoints (`agent.storage`); long-term memory
is a LangGraph store beside them, in the same database, namespaced
`("user_memories", <user_id>)` as in the Databricks long-term-memory template.

Modules: `store` (what the agent asks of LangGraph's `PostgresStore` /
`SqliteStore` on the storage's own connections, and why), `postgres`, `sqlite`
(one per backend, opened by `open_store` here by URL, as
`agent.storage.open_storage` opens the storage), `index` (the in-process copy searches rank over), `embeddings`
(semantic search's model, called outside transactions), `scopes` (the
namespace and the branch rule), `service` (`Memories`), `tools` (what the
model calls), `retrieval` (what the model is given before a turn).

Design, and where it departs from the suggestions it started from:

* **Writes are part of the turn.** The tools never write: `save_memory` and
  `forget_memory` return their operation as the tool result's `artifact`, and
  the turn's commit applies the artifacts of the messages it commits, in the
  same transaction as the checkpoints (`Memories.write_turn`). So the
  project's rule holds: a turn that fails, is rolled back or loses its claim
  writes no memory; an interrupted turn keeps exactly the memories whose
  results it kept. A memory's provenance is the thread and the checkpoint that
  commit wrote.
* **The branch rule costs no query** (`scopes`): the memories saved on a
  branch are the `save_memory` results among its head's messages.
* **Retrieval runs once per turn, before the graph** (`TurnRunner`): between
  the claim and the model call, on the storage's thread pool on the async
  path, with no connection held afterwards; the memories ride in the turn's
  `TurnContext`, and `agent.context` puts them before the conversation as one
  system message. So the model-input pipeline stays free of I/O.
* **`memory://` uses `SqliteStore`**, not `InMemoryStore`: `memory://` is
  SQLite `:memory:` for checkpoints, and one connection lets memory writes
  share the checkpoints' transaction.
* **Search** is by keywords (the query's words a memory contains), or by
  cosine similarity of embeddings when `embedding_model` is set (on SQLite
  and on any Postgres: exact, over the stored vectors; by pgvector in the
  server when setup finds or can create it, `postgres`), and
  it ranks in Python over an in-process copy of the user's memories that one
  key listing per search keeps exact (`index`): ranking in SQL read and parsed
  every memory on every turn (3 ms for 1,000 memories, as long as the turn).
* **Versions, not overwrites** (`scopes`, `index.visible`): a changed memory
  is a new version that supersedes the old one, each recording its checkpoint,
  so a turn sees memories as they were on its branch, and `list_memories`
  shows what the agent knew at any checkpoint. Forgetting deletes every version.
* **Extraction on demand** (`extraction`): the model reads a branch and
  proposes new and changed memories; a dry run writes nothing.
* **No user_id, no long-term memory.** The tools answer so and nothing is
  retrieved.
"""

from __future__ import annotations

from typing import Any

#: The names of the memory tools (the offline model calls them by name).
SAVE_MEMORY_TOOL = "save_memory"
SEARCH_MEMORIES_TOOL = "search_memories"
FORGET_MEMORY_TOOL = "forget_memory"


def open_store(url: str, storage: Any, *, embeddings: Any = None, ttl_minutes: float | None = None) -> Any:
    """LangGraph's store for `storage` (the `ThreadStorage` opened on `url`), on its connections (see `store`).

    `embeddings` indexes each memory's `content` for semantic search;
    `ttl_minutes` is the default time to live of new memories (None: forever).
    The backend is imported here, when used: this package's names load nothing.
    """
    from langgraph.store.base import TTLConfig

    from agent.config import is_postgres_url

    ttl = TTLConfig(default_ttl=ttl_minutes, refresh_on_read=False) if ttl_minutes else None
    if is_postgres_url(url):
        from agent.memory.postgres import PostgresMemoryStore

        return PostgresMemoryStore(storage, embeddings=embeddings, ttl=ttl)
    from agent.memory.sqlite import SqliteMemoryStore

    return SqliteMemoryStore(storage, embeddings=embeddings, ttl=ttl)
