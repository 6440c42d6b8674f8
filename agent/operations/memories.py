"""A user's long-term memories through the API: list and delete, only the caller's own (see `agent.memory`).

The namespace of every query is the caller's user_id, so another user's
memory_id answers exactly as one that does not exist (`MemoryNotFound`), and
nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest, MemoryNotFound
from agent.operations import checks
from agent.operations.operation import Operation, param
from agent.validation import check_unicode
from agent.types import Memory

if TYPE_CHECKING:
    from agent.memory.service import Memories
    from agent.operations.context import OperationContext

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


# -- the operations ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ListMemoriesArgs:
    user_id: str = param(source="user", check=checks.required_id, cli={"argument": True, "help": "The user."})
    query: str | None = param(
        None, check=checks.value_only(check_query), cli={"metavar": "TEXT", "help": "Most relevant first for this text."}
    )
    limit: int = param(20, check=checks.limit(MAX_MEMORY_LIMIT), cli={"metavar": "N", "help": "Most memories to show."})


def list_user_memories(context: OperationContext, args: ListMemoriesArgs) -> list[Memory]:
    """The user's long-term memories, in every `memory_scope`: newest first, or most relevant first
    for `query` (keyword search: only memories sharing a word with it; semantic: all, by similarity).

    Each entry: `memory_id`, `content`, `thread_id` and `checkpoint_id` (the turn that saved it),
    `created_at` (ISO 8601, UTC). `limit`: 1 to 1000.

    Raises: `InvalidRequest` (bad user_id, query or limit).
    """
    return list_memories(context.memories, args.user_id, query=args.query, limit=args.limit)


@dataclass(frozen=True, kw_only=True)
class DeleteMemoryArgs:
    user_id: str = param(source="user", check=checks.required_id, cli={"argument": True, "help": "The user."})
    memory_id: str = param(check=checks.required_id, cli={"argument": True, "help": "The memory."})


def delete_user_memory(context: OperationContext, args: DeleteMemoryArgs) -> None:
    """Delete one of the user's long-term memories.

    Raises: `InvalidRequest` (bad ids), `MemoryNotFound` (no such memory among the user's; another
    user's memory answers the same, and is not deleted).
    """
    delete_memory(context.memories, args.user_id, args.memory_id)


LIST_MEMORIES = Operation(
    name="list_memories",
    summary="The user's long-term memories: newest first, or best first for `query`.",
    args=ListMemoriesArgs,
    run=list_user_memories,
    positional=3,
    outputs=lambda found, args: {"user_id": args.user_id, "memories": [memory.as_dict() for memory in found]},
    returns="list[dict[str, Any]]",
    cli="memories",
)
DELETE_MEMORY = Operation(
    name="delete_memory",
    summary="Delete one of the user's long-term memories (`memory_id`).",
    args=DeleteMemoryArgs,
    run=delete_user_memory,
    positional=2,
    outputs=lambda _, args: {"user_id": args.user_id, "memory_id": args.memory_id, "deleted": True},
    returns="None",
    writes=True,
)
