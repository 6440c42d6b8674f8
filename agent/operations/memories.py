"""A user's long-term memories through the API: list and delete, only the caller's own (see `agent.memory`).

The namespace of every query is the caller's user_id, so another user's
memory_id answers exactly as one that does not exist (`MemoryNotFound`), and
nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest, MemoryNotFound
from agent.validation import check_limit, check_unicode, required_id
from agent.types import Memory

if TYPE_CHECKING:
    from agent.memory.service import Memories
    from agent.operations import Threads
    from agent.requests import Envelope

#: Most memories one listing returns.
MAX_MEMORY_LIMIT = 1000
#: Longest search query, in characters.
MAX_QUERY_CHARS = 1000


def list_memories(memories: Memories | None, user_id: str, *, query: str | None, limit: int) -> list[Memory]:
    """Up to `limit` of the user's memories in every scope: newest first, or best first for `query`
    (by keywords: only those sharing a word with it; a query without searchable words lists the newest)."""
    if memories is None:
        return []
    return memories.list(user_id, query, limit=limit)


def delete_memory(memories: Memories | None, user_id: str, memory_id: str) -> None:
    """Delete one of the user's memories.

    Raises:
        MemoryNotFound: no such memory among the user's (another user's id answers the same); nothing was deleted.
    """
    if memories is None:
        raise MemoryNotFound(f"Memory {memory_id!r} was not found.", memory_id=memory_id)
    memories.delete(user_id, memory_id)


def check_query(value: Any) -> str | None:
    """None, or a search query: a string of at most `MAX_QUERY_CHARS` characters of valid Unicode."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"query must be a string, got {type(value).__name__}")
    if len(value) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"query must be at most {MAX_QUERY_CHARS} characters long")
    check_unicode("query", value)
    return value


# -- the actions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ListMemoriesArgs:
    query: str | None
    limit: int


@dataclass(frozen=True)
class DeleteMemoryArgs:
    memory_id: str


def parse_list(envelope: Envelope, custom: Mapping[str, Any]) -> ListMemoriesArgs:
    return ListMemoriesArgs(
        query=check_query(custom.get("query")),
        limit=check_limit(custom.get("limit", 20), maximum=MAX_MEMORY_LIMIT),
    )


def run_list(threads: Threads, envelope: Envelope, args: ListMemoriesArgs) -> dict[str, Any]:
    found = threads.list_memories(envelope.user_id, args.query, args.limit)
    return {"user_id": envelope.user_id, "memories": [memory.as_dict() for memory in found]}


def parse_delete(envelope: Envelope, custom: Mapping[str, Any]) -> DeleteMemoryArgs:
    return DeleteMemoryArgs(memory_id=required_id("memory_id", custom.get("memory_id")))


def run_delete(threads: Threads, envelope: Envelope, args: DeleteMemoryArgs) -> dict[str, Any]:
    threads.delete_memory(envelope.user_id, args.memory_id)
    return {"user_id": envelope.user_id, "memory_id": args.memory_id, "deleted": True}
