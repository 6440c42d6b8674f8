"""A user's long-term memories through the API: list (now or as of a checkpoint), delete, extract from a branch.

The namespace of every query is the caller's user_id, so another user's
memory_id answers exactly as one that does not exist (`MemoryNotFound`), and
nothing is written. A checkpoint named (`as_of_checkpoint`, `extract_memories`)
is read through the thread's owner check, as every thread read is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest, MemoryNotFound, ModelError, shown_id
from agent.operations import checks
from agent.operations.access import authorize
from agent.operations.branches import checkpoint_of, messages_of
from agent.operations.operation import Operation, param
from agent.validation import check_unicode
from agent.types import Memory, MemoryExtraction, MemoryProposal

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


@dataclass(frozen=True)
class BranchAt:
    """A checkpoint whose memories are asked about: its id, its thread's owner, its messages, and its `ts`
    (a fork's copy keeps its source's: `agent.memory.scopes`, "Time")."""

    checkpoint_id: str
    owner: str | None
    messages: tuple
    ts: str | None


def branch_at(context: OperationContext, thread_id: str, checkpoint_id: str | None, user_id: str | None) -> BranchAt:
    """The checkpoint `checkpoint_id` of the thread (default: the head), read through the owner check.

    Raises: ThreadNotFound (unknown, or not the caller's), CheckpointNotFound.
    """
    record = authorize(context.storage.get_thread(thread_id), thread_id, user_id)
    target = checkpoint_id or record.head_checkpoint_id
    found = checkpoint_of(context.storage, thread_id, target)
    return BranchAt(target, record.user_id, messages_of(found), found.checkpoint.get("ts"))


def extract_memories(
    context: OperationContext, user_id: str | None, thread_id: str, checkpoint_id: str | None, *, dry_run: bool
) -> MemoryExtraction:
    """Ask the model for the memories of the branch ending at `checkpoint_id` (see `agent.memory.extraction`);
    unless `dry_run`, write them, each with the checkpoint as provenance (see `Memories.write_versions`)."""
    from langgraph.checkpoint.base.id import uuid6

    from agent.memory.extraction import extraction_request, parse_proposals

    memories = context.memories
    if memories is None or memories.model is None:
        raise InvalidRequest("extract_memories needs long-term memory and a chat model; this agent has none")
    at = branch_at(context, thread_id, checkpoint_id, user_id)
    target, messages = at.checkpoint_id, at.messages
    user = user_id or at.owner
    if user is None:
        raise InvalidRequest(f"extract_memories needs a user_id: thread {thread_id!r} has no owner", thread_id=thread_id)
    known = {
        m.memory_id: m
        for m in memories.list_as_of(user, None, limit=MAX_MEMORY_LIMIT, checkpoint_id=target, messages=messages, ts=at.ts)
    }
    request = extraction_request(messages, [(m.memory_id, m.content) for m in known.values()])
    try:
        answer = memories.model.invoke(request)
        proposed = parse_proposals(answer.text, list(known))
    except (ValueError, AttributeError) as exc:
        raise ModelError(f"The model's memories were not the JSON asked for ({exc}); nothing was written.") from None
    except Exception as exc:
        raise ModelError(f"The model failed: {type(exc).__name__}: {exc}; nothing was written.") from exc
    proposals = []
    for item in proposed:
        old = known.get(item.replaces) if item.replaces else None
        if old is not None and old.content == item.content:
            continue
        proposals.append(
            MemoryProposal("update", item.content, old.memory_id, old.version, old.content)
            if old is not None
            else MemoryProposal("new", item.content)
        )
    if not dry_run and proposals:
        anchor = next((m.id for m in reversed(messages) if m.id), None)
        written, versions = [], []
        for proposal in proposals:
            version_id = str(uuid6())
            memory_id = proposal.memory_id or version_id
            provenance = {"thread_id": thread_id, "checkpoint_id": target, "message_id": anchor, "supersedes": proposal.supersedes}
            versions.append((memory_id, version_id, proposal.content, provenance))
            written.append(dataclasses.replace(proposal, memory_id=memory_id, version_id=version_id))
        memories.write_versions(user, versions)
        proposals = written
    return MemoryExtraction(thread_id, target, dry_run, tuple(proposals))


def delete_memory(memories: Memories | None, user_id: str, memory_id: str) -> None:
    """Delete one of the user's memories.

    Raises:
        MemoryNotFound: no such memory among the user's (another user's id answers the same); nothing was deleted.
    """
    if memories is None:
        raise MemoryNotFound(f"Memory {shown_id(memory_id)} was not found.", memory_id=memory_id)
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
    thread_id: str | None = param(
        None, check=checks.check_id, cli={"metavar": "THREAD_ID", "help": "The thread of --as-of-checkpoint."}
    )
    as_of_checkpoint: str | None = param(
        None, check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "What the agent knew at this checkpoint."}
    )


def list_user_memories(context: OperationContext, args: ListMemoriesArgs) -> list[Memory]:
    """The user's long-term memories, in every `memory_scope`, the current version of each: newest first,
    or most relevant first for `query` (keyword search: only memories sharing a word with it; semantic:
    all, by similarity).

    `as_of_checkpoint` (with its `thread_id`): what the agent knew at that checkpoint instead, as a turn
    starting there would see it: under `memory_scope="branch"` the memories saved on its branch up to
    it; under `"user"` those saved by checkpoints up to it in any thread. Of each memory, the version
    it knew (a change made later, or on another branch, is not shown).

    Each entry: `memory_id`, `content`, `thread_id` and `checkpoint_id` (where this version was saved),
    `created_at` (ISO 8601, UTC), `version_id` (the first version's is the `memory_id`) and
    `supersedes` (the version it changed, or null). `limit`: 1 to 1000.

    Raises: `InvalidRequest` (bad user_id, query, limit or ids; `as_of_checkpoint` without `thread_id`),
    `ThreadNotFound` (not the user's thread), `CheckpointNotFound`.
    """
    if args.as_of_checkpoint is None:
        return list_memories(context.memories, args.user_id, query=args.query, limit=args.limit)
    if args.thread_id is None:
        raise InvalidRequest("as_of_checkpoint needs the thread_id of its thread")
    at = branch_at(context, args.thread_id, args.as_of_checkpoint, args.user_id)
    if context.memories is None:
        return []
    return context.memories.list_as_of(
        args.user_id, args.query, limit=args.limit, checkpoint_id=at.checkpoint_id, messages=at.messages, ts=at.ts
    )


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


@dataclass(frozen=True, kw_only=True)
class ExtractArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str | None = param(
        None, source="checkpoint", check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "Default: the head."}
    )
    dry_run: bool = param(True, check=checks.flag, cli={"help": "Only show the proposals (--no-dry-run writes them)."})
    user_id: str | None = param(None, source="user")


def extract_branch_memories(context: OperationContext, args: ExtractArgs) -> MemoryExtraction:
    """The model reads the branch ending at `checkpoint_id` (default: the head) and proposes memories for
    its user (the caller, else the thread's owner): `new` ones, and `update`s of memories the agent knew
    at that checkpoint, each naming the version it supersedes. With `dry_run` (the default) nothing is
    written; with `dry_run=False` each proposal is written as a version whose provenance is the thread
    and checkpoint read, visible on that checkpoint's branch and its descendants under branch scope.

    Out: `thread_id`, `checkpoint_id`, `dry_run`, `written`, `proposals` (`kind`, `content`, `memory_id`,
    `supersedes`, `superseded_content`, `version_id`; ids of new memories only once written).

    Raises: `InvalidRequest` (bad ids; no user; no memory), `ThreadNotFound`, `CheckpointNotFound`,
    `ModelError` (the model failed or did not answer JSON; nothing was written).
    """
    return extract_memories(context, args.user_id, args.thread_id, args.checkpoint_id, dry_run=args.dry_run)


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
EXTRACT_MEMORIES = Operation(
    name="extract_memories",
    summary="Memories the model proposes from a branch: shown in a dry run, written with `dry_run=False`.",
    args=ExtractArgs,
    run=extract_branch_memories,
    positional=2,
    writes=True,
    cli="extract-memories",
)
