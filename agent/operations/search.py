"""`search_threads`: find a sentence said on any branch of any of a user's threads, and where to open it.

The index (`agent.storage.search`) is written with each checkpoint, in the
commit that writes it. It holds word keys, not text, and only the words new
to each branch: it names the candidate threads, whose messages are then read
(`search.search`), which finds the hits and their snippets. So a hit is never
ahead of or behind the checkpoints, and a deleted thread's or branch's text is
not found (its checkpoints are not read). Only the caller's threads are
searched (the query joins the thread records on `user_id`), so another user's
text is never seen, not even as a count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest
from agent.operations import checks
from agent.operations.operation import Operation, param
from agent.storage import search

if TYPE_CHECKING:
    from agent.operations.context import OperationContext

#: The most hits one search returns.
MAX_SEARCH_LIMIT = 100
#: The longest query, in characters.
MAX_QUERY_CHARS = 500


@dataclass(frozen=True)
class SearchHit:
    """One message that holds every word of a query."""

    thread_id: str
    checkpoint_id: str
    """The checkpoint where the message first appeared: open it (`get_checkpoint_state`, `set_head`) to
    show the message on its branch."""
    message_id: str
    snippet: str
    """About 160 characters of the message around the first word found, `…` where cut."""

    def as_dict(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "checkpoint_id": self.checkpoint_id, "message_id": self.message_id, "snippet": self.snippet}


def check_query(name: str, value: Any) -> str:
    """A query: a string with at least one word, at most `MAX_QUERY_CHARS` characters."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"{name} must be at most {MAX_QUERY_CHARS} characters")
    if not search.terms(value):
        raise InvalidRequest(f"{name} must hold at least one word")
    return value


@dataclass(frozen=True, kw_only=True)
class SearchArgs:
    query: str = param(check=check_query, cli={"argument": True, "help": "The words to find (every one must appear)."})
    limit: int = param(20, check=checks.limit(MAX_SEARCH_LIMIT), cli={"metavar": "N", "help": "Most hits."})
    user_id: str | None = param(None, source="user")


def search_threads(context: OperationContext, args: SearchArgs) -> list[SearchHit]:
    """Full-text search over every message of every branch of the caller's threads.

    A hit is a message holding every word of `query` (words as written: no stemming, any case),
    newest checkpoint first (then the greater thread id; messages of one checkpoint in their order); each names `thread_id`, `checkpoint_id` (where the message first
    appeared, so a client opens that exact branch), `message_id` and a `snippet`. A message repeated
    on several branches is a hit on each branch where it first appeared. Never another user's text;
    a deleted thread's or branch's text is no longer found. Off with encryption at rest (the index
    would hold the text in the clear).

    Raises: `InvalidRequest` (no word in `query`, bad `limit`, encryption at rest).
    """
    if context.storage.keyring.enabled:
        raise InvalidRequest("search_threads is not available with encryption at rest: messages are not indexed")
    words = search.terms(args.query)
    return [
        SearchHit(hit.thread_id, hit.checkpoint_id, hit.message_id, search.snippet(hit.text, words))
        for hit in search.search(context.storage, args.user_id, words, args.limit)
    ]


SEARCH_THREADS = Operation(
    name="search_threads",
    summary="Full-text search over every message of every branch of the caller's threads.",
    args=SearchArgs,
    run=search_threads,
    positional=1,
    outputs=lambda found, args: {"hits": [hit.as_dict() for hit in found]},
    returns="list[dict[str, Any]]",
    cli="search",
)


#: The largest `batch_size` of `backfill_search_index`.
MAX_BACKFILL_BATCH = 10_000


@dataclass(frozen=True, kw_only=True)
class BackfillArgs:
    rebuild: bool = param(False, check=checks.flag, cli={"help": "Remove every row first and index everything again."})
    batch_size: int = param(search.BACKFILL_BATCH, check=checks.limit(MAX_BACKFILL_BATCH), cli={"metavar": "N", "help": "Threads listed per query (each is indexed in its own transaction)."})


def backfill_search_index(context: OperationContext, args: BackfillArgs) -> dict[str, int]:
    """Index the threads that have no search index row at their root: messages written before the index
    existed or before its current layout (an upgrade drops the earlier rows), so that `search_threads`
    finds them.

    Every user's threads, `batch_size` threads listed per query, each indexed in its own transaction
    (turns go on meanwhile); running it again finds nothing to do. `rebuild=True` removes every row first.
    Nothing is indexed with encryption at rest.

    Returns: `{"indexed_checkpoints": N}` (the root-namespace checkpoints of the threads indexed).

    Raises: `InvalidRequest` (a bad `batch_size`), `StorageUnavailable`.
    """
    return {"indexed_checkpoints": search.backfill(context.storage, batch_size=args.batch_size, rebuild=args.rebuild)}


BACKFILL_SEARCH_INDEX = Operation(
    name="backfill_search_index",
    summary="Index the threads that have no search index row (messages written before the index, or before its layout).",
    args=BackfillArgs,
    run=backfill_search_index,
    positional=0,
    python=lambda found: found,
    action=False,
    writes=True,
    cli="search-index",
)
