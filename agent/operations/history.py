"""Reading a thread: its checkpoints (history) and the head.

The head is the one column `agent_threads.head_checkpoint_id`, moved only by
committed writes; every reader asks `head()` (or gets `is_head` on history
entries). LangGraph's "latest checkpoint" (the largest id) is not the head:
after a branch switch it differs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from agent.errors import CheckpointNotFound, InvalidRequest, shown_id
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.operation import Operation, param
from agent.storage import BranchRecord, ThreadReads, ThreadStorage
from agent.types import CheckpointSummary
from agent.operations import checks

if TYPE_CHECKING:
    from agent.operations.context import OperationContext


def history(
    storage: ThreadReads, thread_id: str, *, user_id: str | None, limit: int, before: str | None
) -> list[CheckpointSummary]:
    """Up to `limit` checkpoints of the thread, newest first, all branches interleaved.

    The first entry of a thread's history (its oldest) is its root: an empty
    checkpoint (`source` "root", 0 messages) that the first turn starts from.
    `before` (a checkpoint_id) pages backwards. Reads summaries only, never
    messages, so it costs the same on a thread of any length. `storage` is a
    `ThreadStorage` or the light reader of read-only commands (`storage.open_reader`).

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        CheckpointNotFound: `before` is not a checkpoint of this thread.
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    if before is not None and not storage.checkpoint_in_thread(thread_id, before):
        raise checkpoint_not_found(thread_id, before)
    rows = storage.list_checkpoints(thread_id, limit=limit, before=before)
    entries = [CheckpointSummary.from_row(thread_id, row, head_checkpoint_id=record.head_checkpoint_id) for row in rows]
    records = storage.branch_records(thread_id)
    return [with_record(entry, records.get(entry.checkpoint_id)) for entry in entries]


def with_record(entry: CheckpointSummary, record: BranchRecord | None) -> CheckpointSummary:
    """The entry with its checkpoint's branch record (`label`, `pinned`, `archived`), when it has one."""
    if record is None:
        return entry
    fields = {"label": record.label, "pinned": record.pinned, "archived": record.archived}
    return replace(entry, extra={**entry.extra, **fields})


def head(storage: ThreadStorage, thread_id: str, *, user_id: str | None) -> str:
    """The thread's head checkpoint id.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
    """
    return authorize(storage.get_thread(thread_id), thread_id, user_id).head_checkpoint_id


def resolve_checkpoint_ref(entries: list[dict], thread_id: str, ref: str) -> str:
    """The full checkpoint id for `ref`: a full id (returned as is) or a unique suffix of an id in `entries`.

    `entries` is the thread's history (`get_checkpoint_history` dicts). Short ids
    are suffixes because checkpoint ids are time-ordered UUIDs: their ends are random.

    Raises:
        CheckpointNotFound: no checkpoint in `entries` ends with `ref`.
        InvalidRequest: several do.
    """
    ref = ref.strip().lstrip("…")
    if len(ref) >= 36 or any(e["checkpoint_id"] == ref for e in entries):
        return ref  # a full id; the operation that uses it checks that it belongs to the thread
    matches = [e["checkpoint_id"] for e in entries if e["checkpoint_id"].endswith(ref)]
    if not matches:
        raise CheckpointNotFound(
            f"No checkpoint of thread {shown_id(thread_id)} has the id or short id {shown_id(ref)}.",
            thread_id=thread_id,
            checkpoint_id=ref,
        )
    if len(matches) > 1:
        raise InvalidRequest(f"Short id {ref!r} matches {len(matches)} checkpoints; give more characters.")
    return matches[0]


# -- the operation ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class HistoryArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread to list."})
    limit: int = param(10, check=checks.limit(), cli={"metavar": "N", "help": "Most checkpoints to show."})
    before: str | None = param(
        None, check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "Only checkpoints older than this one (full or short id).", "checkpoint": True}
    )
    user_id: str | None = param(None, source="user")


def get_checkpoint_history(context: OperationContext, args: HistoryArgs) -> list[CheckpointSummary]:
    """The thread's checkpoints, newest first, all branches interleaved.

    Each entry: `checkpoint_id`, `parent_checkpoint_id`, `thread_id`,
    `timestamp` (ISO 8601, UTC), `next_nodes` (node names), `message_count`,
    `last_message` and `last_user_message` (at most 100 characters each),
    `source` (`root` for the thread's empty first checkpoint, `loop` for a
    turn, `update` for a state update), `step` and `is_head`; a checkpoint with a
    branch record also `label`, `pinned` and `archived` (`label_branch`, `pin_branch`,
    `archive_branch`), and a merge's `merged_from`. `before` (a checkpoint_id) pages backwards.

    Raises: `InvalidRequest` (bad ids or limit), `ThreadNotFound`, `CheckpointNotFound` (`before`).
    """
    return history(context.storage, args.thread_id, user_id=args.user_id, limit=args.limit, before=args.before)


GET_CHECKPOINT_HISTORY = Operation(
    name="get_checkpoint_history",
    summary="The thread's checkpoints, newest first (all branches interleaved).",
    args=HistoryArgs,
    run=get_checkpoint_history,
    positional=3,
    outputs=lambda entries, args: {"thread_id": args.thread_id, "history": [entry.as_dict() for entry in entries]},
    returns="list[dict[str, Any]]",
    reads_only=True,
    cli="history",
)
