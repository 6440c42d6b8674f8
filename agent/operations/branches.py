"""Branch operations: read a checkpoint's state, list branches, switch the head, fork a thread, compare checkpoints.

Edits and regenerations are turns (`TurnArgs.edit_message_id`, `regenerate`;
planned by `agent.operations.edits`), so they stream and follow the multitask
strategy like any turn; this module holds the operations that are not turns.

* **Reads** (`get_checkpoint_state`, `list_branches`, `compare_checkpoints`)
  claim nothing: checkpoints never change once written. They read the thread's
  tree of checkpoint summaries (`agent.operations.tree`, no messages) and the
  messages of the checkpoints asked for, never of the whole tree.
* **`set_head`** claims the thread like a turn (so it never races one), checks
  the checkpoint on the claim's read, and moves `agent_threads.head_checkpoint_id`
  in the commit: no checkpoint is written, and the next turn continues there.
* **`fork_thread`** writes a NEW thread: it claims the new id (a new thread is
  claimable; one in use is refused), reads the source's ancestor chain without
  claiming the source (its checkpoints are immutable, and claiming it would make
  a running turn's fork wait or fail), and commits, in one transaction, a copy
  of each checkpoint of the chain with a new id and the thread record (owner,
  `forked_from`, title, metadata). The copies' messages are re-encoded as
  deltas within the new thread, never copied as blobs (a delta's base names a
  checkpoint of its own thread), so the fork is independent of the source
  (deleting the source leaves it whole) and its storage is linear in its
  messages like any thread's. New ids rather than the source's: checkpoint ids
  then stay unique across threads, which the message cache and every reader
  that keys by checkpoint id may assume.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest, ThreadBusy, ThreadNotFound
from agent.operations import checks
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.interrupts import pending_interrupts
from agent.operations.operation import Operation, param
from agent.operations.tree import ThreadTree, places_of, read_tree
from agent.storage import ThreadStorage, Turn
from agent.storage.deltas import common_prefix
from agent.types import BranchSummary, CheckpointDiff, CheckpointState, CheckpointSummary, ForkResult, HeadMove
from agent.validation import check_id

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple

    from agent.operations.context import OperationContext


def get_checkpoint_state(
    storage: ThreadStorage, thread_id: str, checkpoint_id: str | None, *, user_id: str | None
) -> CheckpointState:
    """The thread head (or `checkpoint_id`): its history entry and its messages, each placed in the tree.

    Reads the thread record, the checkpoint (messages resolved from their
    deltas, usually cached) and the tree's summaries: three queries whatever
    the thread's size and number of branches.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    target = checkpoint_id or record.head_checkpoint_id
    found = _checkpoint(storage, thread_id, target)
    messages = _messages(found)
    tree = read_tree(storage, thread_id)
    places = places_of(storage, tree, tree.chain(target), messages)
    summary = _summary(thread_id, found, record.head_checkpoint_id)
    waiting = summary.next_nodes[0] if len(summary.next_nodes) == 1 else None
    interrupts = tuple(replace(i, node=waiting) for i in pending_interrupts(found))
    return CheckpointState(summary, messages, tuple(places), interrupts)


def list_branches(storage: ThreadStorage, thread_id: str, *, user_id: str | None) -> list[BranchSummary]:
    """One entry per leaf of the thread's checkpoint tree, newest first. Reads summaries only.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    rows = storage.list_checkpoints(thread_id, limit=None, before=None)
    tree = ThreadTree.from_rows(thread_id, rows)
    by_id = {row["checkpoint_id"]: row for row in rows}
    return [
        BranchSummary(
            CheckpointSummary.from_row(thread_id, by_id[leaf], head_checkpoint_id=record.head_checkpoint_id),
            tree.fork_point(leaf),
        )
        for leaf in tree.leaves()
    ]


def set_head(storage: ThreadStorage, thread_id: str, checkpoint_id: str, *, user_id: str | None) -> HeadMove:
    """Make `checkpoint_id` (any checkpoint of the thread) its head; the next turn continues there.

    Writes no checkpoint. Waits for a running turn like `enqueue`.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
        ThreadBusy: a turn held the thread for longer than `enqueue_timeout`.
    """
    with storage.claimed(thread_id, user_id=user_id, checkpoint_id=checkpoint_id) as claim:
        record = authorize(claim.record, thread_id, user_id)
        if claim.start is None:
            raise checkpoint_not_found(thread_id, checkpoint_id)
        count = len(_messages(claim.start))
        storage.commit(claim, lambda tx: tx.set_head(thread_id, checkpoint_id, message_count=count))
    return HeadMove(thread_id, checkpoint_id, record.head_checkpoint_id)


def fork_thread(
    storage: ThreadStorage,
    thread_id: str,
    checkpoint_id: str | None,
    *,
    new_thread_id: str | None,
    user_id: str | None,
) -> ForkResult:
    """A new thread, owned by `user_id`, whose history is the ancestor chain of `checkpoint_id` (default: the head).

    See the module docstring for how it is written.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
        InvalidRequest: `new_thread_id` is already in use (by anyone).
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    source = checkpoint_id or record.head_checkpoint_id
    chain = read_tree(storage, thread_id).chain(source)
    new_id = new_thread_id or str(uuid.uuid4())
    in_use = InvalidRequest(
        f"new_thread_id {new_id!r} is already in use; omit it to get a new id. Nothing was written.", thread_id=new_id
    )
    try:
        claim = storage.claim(new_id, user_id=user_id, checkpoint_id=None, strategy="reject", timeout=0)
    except (ThreadNotFound, ThreadBusy):  # another user's thread, or one being written: the id is taken
        raise in_use from None
    try:
        if claim.record is not None:
            raise in_use
        copies = _copies(storage, thread_id, chain)
        turn = Turn(thread_id=new_id)
        new_ids = _write_copies(storage, turn, copies)
        head_count = len(_messages(copies[-1]))

        def apply(tx) -> None:
            tx.write_turn(turn)
            tx.insert_thread(
                new_id,
                user_id=user_id,
                head_checkpoint_id=new_ids[-1],
                message_count=head_count,
                title=record.title,
                metadata=record.metadata,
                forked_from={"thread_id": thread_id, "checkpoint_id": source},
            )

        storage.commit(claim, apply)
    except BaseException:
        storage.release(claim)
        raise
    return ForkResult(new_id, new_ids[-1], thread_id, source)


def compare_checkpoints(
    storage: ThreadStorage, thread_id: str, checkpoint_a: str, checkpoint_b: str, *, user_id: str | None
) -> CheckpointDiff:
    """Two checkpoints of the thread: their newest common ancestor and the messages only each side has.

    "Only" means after the longest run of leading messages both share (equal
    messages with the same ids), each message placed in the tree as by
    `get_checkpoint_state`.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        CheckpointNotFound: either checkpoint is not in this thread.
    """
    authorize(storage.get_thread(thread_id), thread_id, user_id)
    found_a = _checkpoint(storage, thread_id, checkpoint_a)
    found_b = _checkpoint(storage, thread_id, checkpoint_b)
    tree = read_tree(storage, thread_id)
    chain_a, chain_b = tree.chain(checkpoint_a), tree.chain(checkpoint_b)
    messages_a, messages_b = _messages(found_a), _messages(found_b)
    shared = common_prefix(messages_a, messages_b)
    return CheckpointDiff(
        thread_id=thread_id,
        checkpoint_a=checkpoint_a,
        checkpoint_b=checkpoint_b,
        common_ancestor_checkpoint_id=tree.common_ancestor(checkpoint_a, checkpoint_b),
        only_a=messages_a[shared:],
        only_b=messages_b[shared:],
        places_a=tuple(places_of(storage, tree, chain_a, messages_a)[shared:]),
        places_b=tuple(places_of(storage, tree, chain_b, messages_b)[shared:]),
    )


# -- helpers ----------------------------------------------------------------------------------------
def _checkpoint(storage: ThreadStorage, thread_id: str, checkpoint_id: str) -> CheckpointTuple:
    found = storage.get_checkpoint(thread_id, checkpoint_id)
    if found is None:
        raise checkpoint_not_found(thread_id, checkpoint_id)
    return found


def _messages(found: CheckpointTuple) -> tuple:
    return tuple(found.checkpoint["channel_values"].get("messages") or ())


def _summary(thread_id: str, found: CheckpointTuple, head_checkpoint_id: str) -> CheckpointSummary:
    parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    row = {"checkpoint_id": found.config["configurable"]["checkpoint_id"], "parent_checkpoint_id": parent, "metadata": found.metadata}
    return CheckpointSummary.from_row(thread_id, row, head_checkpoint_id=head_checkpoint_id)


def _copies(storage: ThreadStorage, thread_id: str, chain: Sequence[str]) -> list[CheckpointTuple]:
    """The chain's checkpoints (messages resolved), oldest first."""
    found = {tup.config["configurable"]["checkpoint_id"]: tup for tup in storage.get_checkpoints(thread_id, chain)}
    missing = [c for c in chain if c not in found]
    if missing:  # the source was deleted while being read
        raise checkpoint_not_found(thread_id, missing[0])
    return [found[c] for c in chain]


def _write_copies(storage: ThreadStorage, turn: Turn, copies: Sequence[CheckpointTuple]) -> list[str]:
    from langgraph.checkpoint.base.id import uuid6  # here: importing this module must not load LangGraph

    """Buffer a copy of each checkpoint in `turn`'s (new) thread, each the child of the previous; their new ids."""
    saver = storage.saver
    new_ids: list[str] = []
    with saver.buffering(turn):
        for source in copies:
            # uuid6 like LangGraph's own ids: time-ordered, so the copies sort in chain order.
            new_id = str(uuid6(clock_seq=source.metadata.get("step", -1)))
            checkpoint = {**source.checkpoint, "id": new_id, "channel_values": dict(source.checkpoint["channel_values"])}
            configurable: dict[str, Any] = {"thread_id": turn.thread_id, "checkpoint_ns": ""}
            if new_ids:
                configurable["checkpoint_id"] = new_ids[-1]
            # Every channel's value is written anew: the new thread has no blobs to point at.
            saver.put({"configurable": configurable}, checkpoint, dict(source.metadata), dict(checkpoint["channel_versions"]))
            written = {"configurable": {"thread_id": turn.thread_id, "checkpoint_ns": "", "checkpoint_id": new_id}}
            for task_id, writes in _writes_by_task(source.pending_writes or ()).items():
                saver.put_writes(written, writes, task_id)
            new_ids.append(new_id)
    return new_ids


def _writes_by_task(pending: Sequence[tuple]) -> dict[str, list[tuple[str, Any]]]:
    grouped: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in pending:
        grouped.setdefault(task_id, []).append((channel, value))
    return grouped


# -- the operations ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class StateArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str | None = param(
        None, source="checkpoint", check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "Default: the head."}
    )
    user_id: str | None = param(None, source="user")


def get_state(context: OperationContext, args: StateArgs) -> CheckpointState:
    """The head (or `checkpoint_id`) with its messages: what a chat UI renders.

    Out: the history entry's fields (`checkpoint_id`, `parent_checkpoint_id`,
    `message_count`, `last_user_message`, `is_head`, …) and `messages`, the whole
    list as Responses items (`message`, `function_call`, `function_call_output`),
    oldest first, each with its `id` and: `checkpoint_id` (where the message first
    appeared), `branch_checkpoint_id` (the checkpoint before it: where an edit or a
    regeneration of it branches from; the thread's root for the first message) and
    `siblings` (`{"index", "count", "checkpoint_ids"}`: every alternative at that
    position, this one included, oldest first). At the root: no messages. A checkpoint
    where the graph waits on `interrupt()` also has `interrupts` (`[{"id", "value", "node"}]`:
    what `custom_inputs.resume` answers).

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`.
    """
    return get_checkpoint_state(context.storage, args.thread_id, args.checkpoint_id, user_id=args.user_id)


@dataclass(frozen=True, kw_only=True)
class ThreadArgs:
    """A thread, and the caller."""

    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    user_id: str | None = param(None, source="user")


def branches_of(context: OperationContext, args: ThreadArgs) -> list[BranchSummary]:
    """One entry per branch (a leaf of the checkpoint tree), newest first.

    Each: the leaf's history-entry fields (`checkpoint_id`, `message_count`,
    `last_user_message`, `is_head`, …), `fork_checkpoint_id` (where the branch leaves
    its nearest other branch; None for a thread without branches) and `updated_at`
    (the leaf's timestamp, ISO 8601 UTC).

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound`.
    """
    return list_branches(context.storage, args.thread_id, user_id=args.user_id)


@dataclass(frozen=True, kw_only=True)
class SetHeadArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str = param(
        source="checkpoint", check=checks.required_id, cli={"argument": True, "help": "The checkpoint to switch to."}
    )
    user_id: str | None = param(None, source="user")


def switch_head(context: OperationContext, args: SetHeadArgs) -> HeadMove:
    """Switch the thread to another branch: `checkpoint_id` (any checkpoint of it) becomes the head,
    without writing a checkpoint; the next turn continues there.

    Returns `thread_id`, `checkpoint_id` and `previous_checkpoint_id` (the head before).

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`.
    """
    return set_head(context.storage, args.thread_id, args.checkpoint_id, user_id=args.user_id)


@dataclass(frozen=True, kw_only=True)
class ForkArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread to fork."})
    checkpoint_id: str | None = param(
        None, source="checkpoint", check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "Default: the head."}
    )
    new_thread_id: str | None = param(None, check=checks.check_id, cli={"metavar": "THREAD_ID", "help": "Default: a new id."})
    user_id: str | None = param(None, source="user")


def fork(context: OperationContext, args: ForkArgs) -> ForkResult:
    """A new thread, owned by the same user, whose history is the ancestor chain of `checkpoint_id`
    (default: the head), with the same messages; independent of the source afterwards.

    Returns `thread_id` and `checkpoint_id` (the new thread and its head) and
    `forked_from` (`{"thread_id", "checkpoint_id"}`, also kept in the new thread's record).

    Raises: `InvalidRequest` (bad ids, or `new_thread_id` in use), `ThreadNotFound`, `CheckpointNotFound`.
    """
    return fork_thread(
        context.storage, args.thread_id, args.checkpoint_id, new_thread_id=args.new_thread_id, user_id=args.user_id
    )


@dataclass(frozen=True, kw_only=True)
class CompareArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_a: str = param(check=checks.required_id, cli={"argument": True, "help": "One checkpoint.", "checkpoint": True})
    checkpoint_b: str = param(check=checks.required_id, cli={"argument": True, "help": "The other.", "checkpoint": True})
    user_id: str | None = param(None, source="user")


def compare(context: OperationContext, args: CompareArgs) -> CheckpointDiff:
    """Two checkpoints of a thread side by side.

    Returns `thread_id`, `checkpoint_a`, `checkpoint_b`, `common_ancestor_checkpoint_id` and
    `only_a` / `only_b`: the messages (items as in `get_checkpoint_state`) each side has after
    the leading messages both share.

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`.
    """
    return compare_checkpoints(context.storage, args.thread_id, args.checkpoint_a, args.checkpoint_b, user_id=args.user_id)


GET_CHECKPOINT_STATE = Operation(
    name="get_checkpoint_state",
    summary="The head (or checkpoint_id): its history entry and its messages, each placed in the tree.",
    args=StateArgs,
    run=get_state,
    positional=2,
    cli="state",
)
LIST_BRANCHES = Operation(
    name="list_branches",
    summary="One entry per leaf of the thread's checkpoint tree, newest first.",
    args=ThreadArgs,
    run=branches_of,
    outputs=lambda found, args: {"thread_id": args.thread_id, "branches": [branch.as_dict() for branch in found]},
    returns="list[dict[str, Any]]",
    cli="branches",
)
SET_HEAD = Operation(
    name="set_head",
    summary="Switch the thread to checkpoint_id without writing a checkpoint.",
    args=SetHeadArgs,
    run=switch_head,
    positional=2,
    writes=True,
    returns="dict[str, str]",
    cli="switch",
)
FORK_THREAD = Operation(
    name="fork_thread",
    summary="A new thread whose history is the ancestor chain of checkpoint_id (default: the head).",
    args=ForkArgs,
    run=fork,
    positional=2,
    writes=True,
    cli="fork",
)
COMPARE_CHECKPOINTS = Operation(
    name="compare_checkpoints",
    summary="The common ancestor of checkpoint_a and checkpoint_b and the messages only each has.",
    args=CompareArgs,
    run=compare,
    positional=3,
    cli="compare",
)
