"""Branch operations: read a checkpoint's state, list branches, switch the head, compare checkpoints.

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
* **`fork_thread`** writes a new thread: `agent.operations.forks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.operations import branch_view, checks
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.alternatives import with_alternatives
from agent.operations.interrupts import pending_interrupts, stopped_at
from agent.operations.operation import Operation, param
from agent.operations.tree import ThreadTree, fill_kept, places_of, read_tree
from agent.storage import ThreadStorage
from agent.storage.deltas import common_prefix
from agent.types import BranchSummary, CheckpointDiff, CheckpointState, CheckpointSummary, HeadMove, PendingInterrupt

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple

    from agent.operations.context import OperationContext


def get_checkpoint_state(
    storage: ThreadStorage,
    thread_id: str,
    checkpoint_id: str | None,
    *,
    user_id: str | None,
    alternatives: bool = True,
    after_message_id: str | None = None,
    since_checkpoint_id: str | None = None,
    include_archived: bool = False,
) -> CheckpointState:
    """The thread head (or `checkpoint_id`): its history entry and its messages, each placed in the tree.

    `after_message_id` (a message of the checkpoint): only the messages after it, for a client that
    shows the messages up to it. `since_checkpoint_id` (another checkpoint of the thread): only the
    messages from the first one that differs from that checkpoint's (or has another place in the tree),
    for a client that shows it (`agent.operations.render`). Either way `message_offset` is how many
    items of the whole `messages` list come before the first one returned.

    Reads the thread record, the checkpoint (messages resolved from their
    deltas, usually cached) and the tree's summaries: three queries whatever
    the thread's size and number of branches; and when a message of the
    branch has alternatives, one more for the messages of the alternatives'
    checkpoints (`agent.operations.alternatives`; `alternatives=False` leaves them out,
    for callers that show no switcher).

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        CheckpointNotFound: `checkpoint_id` (or `since_checkpoint_id`) is not a checkpoint of this thread.
        InvalidRequest: `after_message_id` is not a message (or tool call) of the checkpoint.
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    target = checkpoint_id or record.head_checkpoint_id
    found = checkpoint_of(storage, thread_id, target)
    messages = messages_of(found)
    offset = 0
    # Here, not at the top: these import LangChain, and the command line's reads load none of it.
    from agent.items import to_state_items
    from agent.operations.edits import position_of

    if after_message_id is not None:
        offset = position_of(messages, after_message_id, thread_id=thread_id, checkpoint_id=target) + 1
    tree = read_tree(storage, thread_id)
    records = storage.branch_records(thread_id)
    branch = branch_view.record_of_chain(tree.chain(target), tree, records)
    keep = tree.chain(target) + (tree.chain(since_checkpoint_id) if since_checkpoint_id in tree else [])
    if not include_archived:  # archived branches count in no sibling or alternative (`branch_view`)
        tree = branch_view.visible_tree(tree, records, keep=keep)
    places = places_of(storage, tree, tree.chain(target), messages)
    if since_checkpoint_id is not None:
        fill_kept(storage, tree, tree.chain(since_checkpoint_id))
        offset = min(tree.shared_messages(since_checkpoint_id, target), len(messages))
    if alternatives:
        places = with_alternatives(storage, tree, tree.chain(target), messages, places, start=offset)
    else:
        places = places[offset:]
    summary = _summary(thread_id, found, record.head_checkpoint_id)
    interrupts = _waiting_interrupts(storage, thread_id, target, found, summary)
    return CheckpointState(
        summary,
        messages[offset:],
        tuple(places),
        interrupts,
        message_offset=sum(len(to_state_items(message)) for message in messages[:offset]),
        head_checkpoint_id=record.head_checkpoint_id,
        branch=branch,
        context_summary=_context_summary(found, summary),
    )


def _context_summary(found: CheckpointTuple, summary: CheckpointSummary) -> str | None:
    """The text of the summary the model was sent for the checkpoint's answer: the branch's summary in its
    state (a state channel, inherited along the branch: read here, not copied into metadata), when the
    checkpoint's metadata says one was used."""
    if not summary.extra.get("summary_used"):
        return None
    from agent.state import CONTEXT_SUMMARY_CHANNEL  # LangChain: see get_checkpoint_state

    value = found.checkpoint["channel_values"].get(CONTEXT_SUMMARY_CHANNEL)
    text = value.get("text") if isinstance(value, Mapping) else None
    return text if isinstance(text, str) and text else None


def _waiting_interrupts(
    storage: ThreadStorage, thread_id: str, checkpoint_id: str, found: CheckpointTuple, summary: CheckpointSummary
) -> tuple[PendingInterrupt, ...]:
    """The checkpoint's pending interrupts, each with the node that waits on it, as the turn that stopped there
    named them (`interrupts.stopped_at`): the one node waiting when there is one (no read); when several wait
    (parallel nodes that each called `interrupt()`), the node of the task whose pending write holds it, from
    its stored task path (`ThreadStorage.task_paths`, one query); None when the path is not stored (a write
    copied without it)."""
    pending = pending_interrupts(found)
    if not pending:
        return ()
    if len(summary.next_nodes) == 1:
        return tuple(replace(interrupt, node=summary.next_nodes[0]) for interrupt in pending)
    paths = storage.task_paths(thread_id, checkpoint_id)
    # In the shape of the saver's buffered writes that `stopped_at` reads at a turn's end.
    writes = [(None, [(channel, value)], task_id, paths.get(task_id)) for task_id, channel, value in found.pending_writes]
    return tuple(stopped_at(pending, writes))


def list_branches(
    storage: ThreadStorage, thread_id: str, *, user_id: str | None, include_archived: bool = False
) -> list[BranchSummary]:
    """One entry per leaf of the thread's checkpoint tree: the pinned branch first, then newest first.
    Reads summaries and branch records only.

    Archived branches (`archive_branch`) are left out unless `include_archived`; the fork points are
    then those of the branches listed. The head's branch is always listed, with `archived: true` when it
    is archived (the head was set there, `set_head`, and maybe continued): a client must always find
    the branch it is on. Listing it, rather than having the switch or the turn unarchive it, keeps a
    read and a turn from rewriting the user's branch records: an archived branch "still reads, can be
    switched to and continued" while staying archived until `unarchive_branch`.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    rows = storage.list_checkpoints(thread_id, limit=None, before=None, previews=False)  # the leaves' below
    records = storage.branch_records(thread_id)
    tree = ThreadTree.from_rows(thread_id, rows)
    gone = branch_view.hidden(tree, records)
    if gone and not include_archived:
        head = record.head_checkpoint_id
        kept = set(tree.chain(head)) if head in tree else set()  # the head's branch is always listed
        rows = [row for row in rows if row["checkpoint_id"] not in gone or row["checkpoint_id"] in kept]
        tree = ThreadTree.from_rows(thread_id, rows)
    by_id = {row["checkpoint_id"]: row for row in rows}
    pinned = branch_view.pinned_leaf(tree, records)
    leaves = sorted(tree.leaves(), key=lambda leaf: leaf != pinned)  # stable: newest first otherwise
    storage.fill_previews(thread_id, [by_id[leaf] for leaf in leaves])
    return [
        BranchSummary(
            CheckpointSummary.from_row(thread_id, by_id[leaf], head_checkpoint_id=record.head_checkpoint_id),
            tree.fork_point(leaf),
            label=branch_view.label_of(tree, leaf, records),
            pinned=leaf == pinned,
            archived=leaf in gone,
        )
        for leaf in leaves
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
        count = len(messages_of(claim.start))
        storage.commit(claim, lambda tx: tx.set_head(thread_id, checkpoint_id, message_count=count))
    return HeadMove(thread_id, checkpoint_id, record.head_checkpoint_id)


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
    found_a = checkpoint_of(storage, thread_id, checkpoint_a)
    found_b = checkpoint_of(storage, thread_id, checkpoint_b)
    tree = read_tree(storage, thread_id)
    chain_a, chain_b = tree.chain(checkpoint_a), tree.chain(checkpoint_b)
    messages_a, messages_b = messages_of(found_a), messages_of(found_b)
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
def checkpoint_of(storage: ThreadStorage, thread_id: str, checkpoint_id: str) -> CheckpointTuple:
    found = storage.get_checkpoint(thread_id, checkpoint_id)
    if found is None:
        raise checkpoint_not_found(thread_id, checkpoint_id)
    return found


def messages_of(found: CheckpointTuple) -> tuple:
    return tuple(found.checkpoint["channel_values"].get("messages") or ())


def _summary(thread_id: str, found: CheckpointTuple, head_checkpoint_id: str) -> CheckpointSummary:
    parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    row = {"checkpoint_id": found.config["configurable"]["checkpoint_id"], "parent_checkpoint_id": parent, "metadata": found.metadata}
    return CheckpointSummary.from_row(thread_id, row, head_checkpoint_id=head_checkpoint_id)


# -- the operations ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class StateArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str | None = param(
        None, source="checkpoint", check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "Default: the head."}
    )
    after_message_id: str | None = param(
        None,
        check=checks.check_id,
        cli={"metavar": "MESSAGE_ID", "help": "Only the messages after this one (what a client that shows up to it lacks)."},
    )
    include_archived: bool = param(False, check=checks.flag, cli={"help": "Count archived branches among siblings too."})
    user_id: str | None = param(None, source="user")


def get_state(context: OperationContext, args: StateArgs) -> CheckpointState:
    """The head (or `checkpoint_id`) with its messages: what a chat UI renders.

    Out: the history entry's fields (`checkpoint_id`, `parent_checkpoint_id`,
    `message_count`, `last_user_message`, `is_head`, …) and `messages`, the whole
    list as Responses items (`message`, `function_call`, `function_call_output`),
    oldest first, each with its `id` and: `checkpoint_id` (where the message first
    appeared), `branch_checkpoint_id` (the checkpoint before it, the parent of its
    alternatives; the thread's root for the first message),
    `siblings` (`{"index", "count", "checkpoint_ids", "latest_checkpoint_ids"}`: every
    child of `branch_checkpoint_id`, this one included, oldest first) and `alternatives`
    (`{"kind", "index", "count", "options"}`: a user message's edits or an answer's
    regenerations, oldest first, each `{"checkpoint_id", "latest_checkpoint_id", "preview"}`).
    At the root: no messages. A checkpoint
    where the graph waits on `interrupt()` also has `interrupts` (`[{"id", "value", "node"}]`:
    what `custom_inputs.resume` answers). Also `head_checkpoint_id` (the thread's head) and
    `message_offset` (the index of the first item returned in the whole list: 0). When the model
    was sent a summary for this checkpoint's answer (`summary_used`), `context_summary`: its text;
    `recalled_memories` (a history-entry field, when the turn recalled some): the ids of the
    long-term memories the model was sent.

    `after_message_id`: only the messages after that one (a message or tool call of the checkpoint),
    with their places and alternatives; `message_offset` is the number of items up to it (its
    message's last item included). A client that shows the items up to it keeps them and appends these.

    Archived branches (`archive_branch`) count in no `siblings` or `alternatives` unless
    `include_archived` (a checkpoint's own chain always counts). With branch records, `branch` says
    what they say of this checkpoint's branch: `label`, `pinned`, `archived`; a merge's checkpoint has
    `merged_from` (`merge_branch`).

    Raises: `InvalidRequest` (bad ids; `after_message_id` not in the checkpoint), `ThreadNotFound`,
    `CheckpointNotFound`.
    """
    return get_checkpoint_state(
        context.storage,
        args.thread_id,
        args.checkpoint_id,
        user_id=args.user_id,
        after_message_id=args.after_message_id,
        include_archived=args.include_archived,
    )


@dataclass(frozen=True, kw_only=True)
class ThreadArgs:
    """A thread, and the caller."""

    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    include_archived: bool = param(False, check=checks.flag, cli={"help": "List archived branches too."})
    user_id: str | None = param(None, source="user")


def branches_of(context: OperationContext, args: ThreadArgs) -> list[BranchSummary]:
    """One entry per branch (a leaf of the checkpoint tree): the pinned one first, then newest first.

    Each: the leaf's history-entry fields (`checkpoint_id`, `message_count`,
    `last_user_message`, `is_head`, …), `fork_checkpoint_id` (where the branch leaves
    its nearest other branch; None for a thread without branches), `updated_at`
    (the leaf's timestamp, ISO 8601 UTC), `label` (`label_branch`; None), `pinned`
    (`pin_branch`) and `archived`. Archived branches (`archive_branch`) are left out
    unless `include_archived`, except the head's: the branch with `is_head: true` is always
    listed (with `archived: true` when the head was moved onto an archived branch; it stays
    archived until `unarchive_branch`).

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound`.
    """
    return list_branches(context.storage, args.thread_id, user_id=args.user_id, include_archived=args.include_archived)


@dataclass(frozen=True, kw_only=True)
class SetHeadArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str = param(
        source="checkpoint", check=checks.required_id, cli={"argument": True, "help": "The checkpoint to switch to."}
    )
    include: tuple[str, ...] = param((), check=checks.include)
    user_id: str | None = param(None, source="user")


def switch_head(context: OperationContext, args: SetHeadArgs) -> HeadMove:
    """Switch the thread to another branch: `checkpoint_id` (any checkpoint of it) becomes the head,
    without writing a checkpoint; the next turn continues there.

    Returns `thread_id`, `checkpoint_id` and `previous_checkpoint_id` (the head before); with
    `include=["state"]` also `state`: `checkpoint_id` as `get_checkpoint_state` gives it, from where
    its branch parts from the previous head's on (`message_offset`; `agent.operations.render`).

    Raises: `InvalidRequest` (bad ids, or `include` names something else), `ThreadNotFound`,
    `CheckpointNotFound`, `ThreadBusy`.
    """
    move = set_head(context.storage, args.thread_id, args.checkpoint_id, user_id=args.user_id)
    if checks.STATE not in args.include:
        return move
    state = get_checkpoint_state(
        context.storage, move.thread_id, move.checkpoint_id, user_id=args.user_id, since_checkpoint_id=move.previous_checkpoint_id
    )
    return replace(move, state=state)


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
    returns="dict[str, Any]",
    cli="switch",
)
COMPARE_CHECKPOINTS = Operation(
    name="compare_checkpoints",
    summary="The common ancestor of checkpoint_a and checkpoint_b and the messages only each has.",
    args=CompareArgs,
    run=compare,
    positional=3,
    cli="compare",
)
