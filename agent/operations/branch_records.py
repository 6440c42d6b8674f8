"""Branch records: name a branch, pin the main one, hide dead ends, delete a subtree.

Each operation claims the thread like `set_head` (so it never races a turn),
checks the checkpoint on the claim's read, and writes in the commit through
`Tx`; none writes a checkpoint. How a record reads on the tree (what a label
or the pin names, what an archive hides, which checkpoints a branch alone
uses) is `agent.operations.branch_view`.

`delete_branch` removes the subtree where the branch through the checkpoint
starts (`branch_view.branch_start`). Messages are stored as deltas against
the parent checkpoint (`agent.storage.deltas`), so only descendants can need
a checkpoint's stored messages: removing whole subtrees never orphans a
delta, and every other checkpoint is left byte for byte as it was. It refuses
(nothing written) to remove the root or the head's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest
from agent.operations import branch_view, checks
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.operation import Operation, param
from agent.operations.tree import read_tree

if TYPE_CHECKING:
    from agent.memory.service import Memories
    from agent.operations.context import OperationContext
    from agent.storage import ThreadStorage, Tx

#: The longest label, in characters.
MAX_LABEL_CHARS = 200


def check_label(name: str, value: Any) -> str | None:
    """None (no label) or a label: 1 to `MAX_LABEL_CHARS` printable characters, trimmed."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string or null, got {type(value).__name__}")
    label = value.strip()
    if not label or len(label) > MAX_LABEL_CHARS or not label.isprintable():
        raise InvalidRequest(f"{name} must be 1 to {MAX_LABEL_CHARS} printable characters (null removes it)")
    return label


@dataclass(frozen=True)
class BranchChange:
    """What a branch record operation did (`label_branch`, `pin_branch`, `archive_branch`, `delete_branch`)."""

    thread_id: str
    checkpoint_id: str
    """The checkpoint the record is kept on (for archive and delete: where the branch starts)."""
    label: str | None = None
    pinned: bool | None = None
    archived: bool | None = None
    deleted_checkpoint_ids: tuple[str, ...] = ()
    deleted_memory_versions: int = 0
    """`delete_branch`: the long-term memory versions saved on the deleted checkpoints that went with them
    (under `memory_scope="branch"`; always 0 under "user", where the user's memories outlive the branch)."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_id": self.checkpoint_id}
        labelled = self.pinned is None and self.archived is None and not self.deleted_checkpoint_ids
        if labelled:  # a label_branch: its label, None when it removed one
            out["label"] = self.label
        for key in ("pinned", "archived"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.deleted_checkpoint_ids:
            out["deleted_checkpoint_ids"] = list(self.deleted_checkpoint_ids)
            out["deleted_memory_versions"] = self.deleted_memory_versions
        return out


def _change(
    storage: ThreadStorage,
    thread_id: str,
    checkpoint_id: str,
    user_id: str | None,
    write: Any,
) -> Any:
    """Claim the thread, check the checkpoint, and commit `write(tx, tree, head)` (which returns the result)."""
    with storage.claimed(thread_id, user_id=user_id, read_start=False) as claim:
        record = authorize(claim.record, thread_id, user_id)
        tree = read_tree(storage, thread_id)
        if checkpoint_id not in tree:
            raise checkpoint_not_found(thread_id, checkpoint_id)
        result: list[Any] = []
        plan = write(tree, record.head_checkpoint_id)

        def apply(tx: Tx) -> None:
            result.append(plan(tx))

        storage.commit(claim, apply)
    return result[0]


def label_branch(storage: ThreadStorage, thread_id: str, checkpoint_id: str, label: str | None, *, user_id: str | None) -> BranchChange:
    """Give the checkpoint's branch a label (None removes it). Raises ThreadNotFound, CheckpointNotFound, ThreadBusy."""

    def plan(tree, head):
        def write(tx: Tx) -> BranchChange:
            tx.label_branch(thread_id, checkpoint_id, label)
            return BranchChange(thread_id, checkpoint_id, label=label)

        return write

    return _change(storage, thread_id, checkpoint_id, user_id, plan)


def pin_branch(storage: ThreadStorage, thread_id: str, checkpoint_id: str, pinned: bool, *, user_id: str | None) -> BranchChange:
    """Pin the checkpoint's branch as the thread's main one (the pin moves from any other checkpoint), or
    with `pinned=False` pin none. Raises ThreadNotFound, CheckpointNotFound, ThreadBusy."""

    def plan(tree, head):
        def write(tx: Tx) -> BranchChange:
            tx.pin_branch(thread_id, checkpoint_id if pinned else None)
            return BranchChange(thread_id, checkpoint_id, label=None, pinned=pinned)

        return write

    return _change(storage, thread_id, checkpoint_id, user_id, plan)


def archive_branch(storage: ThreadStorage, thread_id: str, checkpoint_id: str, archived: bool, *, user_id: str | None) -> BranchChange:
    """Archive (hide) or unarchive the branch through the checkpoint.

    Archiving marks where the branch starts (`branch_view.branch_start`); unarchiving clears every archive
    mark on the checkpoint's chain, so what was hidden shows again.

    Raises:
        InvalidRequest: archiving the root's branch when the thread has a single branch, or the head's path.
        ThreadNotFound, CheckpointNotFound, ThreadBusy.
    """

    def plan(tree, head):
        chain = tree.chain(checkpoint_id)
        if archived:
            start = branch_start(tree, thread_id, checkpoint_id, head, "archive")
            marks = [start]
        else:
            start = checkpoint_id
            marks = chain

        def write(tx: Tx) -> BranchChange:
            for mark in marks:
                tx.archive_branch(thread_id, mark, archived)
            return BranchChange(thread_id, start, label=None, archived=archived)

        return write

    return _change(storage, thread_id, checkpoint_id, user_id, plan)


def delete_branch(
    storage: ThreadStorage,
    thread_id: str,
    checkpoint_id: str,
    *,
    user_id: str | None,
    memories: Memories | None = None,
) -> BranchChange:
    """Delete the branch through the checkpoint: the subtree where it starts (see the module docstring).

    Under `memory_scope="branch"`, the long-term memory versions those checkpoints saved (or that
    `extract_memories` read from them) go with them, in the same transaction, as `delete_thread` deletes a
    thread's (a memory whose newer version goes is known again by the version before it); under "user" the
    user's memories are the user's, not the branch's, and are kept. `memories`: the agent's, or None (none).

    Raises:
        InvalidRequest: the subtree holds the head (switch away first) or the root; nothing is written.
        ThreadNotFound, CheckpointNotFound, ThreadBusy.
    """

    def plan(tree, head):
        start = branch_start(tree, thread_id, checkpoint_id, head, "delete")
        gone = tuple(branch_view.subtree(tree, start))

        def write(tx: Tx) -> BranchChange:
            tx.delete_branch_checkpoints(thread_id, gone)
            versions = memories.delete_checkpoint_memories(user_id, thread_id, gone) if memories is not None else 0
            return BranchChange(thread_id, start, label=None, deleted_checkpoint_ids=gone, deleted_memory_versions=versions)

        return write

    return _change(storage, thread_id, checkpoint_id, user_id, plan)


def branch_start(tree, thread_id: str, checkpoint_id: str, head: str, verb: str) -> str:
    """`branch_view.branch_start`, refusing the root and a subtree that holds the head."""
    start = branch_view.branch_start(tree, checkpoint_id)
    if tree.parent(start) is None:
        raise InvalidRequest(
            f"Cannot {verb} the root of thread {thread_id!r}: a branch starts after it.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    if start in tree.chain(head) if head in tree else False:
        raise InvalidRequest(
            f"Cannot {verb} the branch of checkpoint {checkpoint_id!r}: it holds the head of thread {thread_id!r}; "
            "switch to another branch first (set_head).",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    return start


# -- the operations ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class LabelArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str = param(source="checkpoint", check=checks.required_id, cli={"argument": True, "help": "A checkpoint of the branch (its leaf, usually)."})
    label: str | None = param(None, check=check_label, python_required=True, cli={"argument": True, "help": "The label (empty or null removes it)."})
    user_id: str | None = param(None, source="user")


def run_label(context: OperationContext, args: LabelArgs) -> BranchChange:
    """Name the branch through `checkpoint_id` (a label of up to 200 characters; null removes it).

    The label is kept on the checkpoint; `list_branches` shows on each branch the label of the newest
    labelled checkpoint of its own part (so a label given to a leaf stays as the branch grows),
    `get_checkpoint_history` on the checkpoint, `get_checkpoint_state` under `branch`.

    Returns `thread_id`, `checkpoint_id`, `label`. Raises: `InvalidRequest`, `ThreadNotFound`,
    `CheckpointNotFound`, `ThreadBusy`.
    """
    return label_branch(context.storage, args.thread_id, args.checkpoint_id, args.label, user_id=args.user_id)


@dataclass(frozen=True, kw_only=True)
class PinArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str = param(source="checkpoint", check=checks.required_id, cli={"argument": True, "help": "A checkpoint of the branch."})
    pinned: bool = param(True, check=checks.flag, cli={"help": "False: pin no branch."})
    user_id: str | None = param(None, source="user")


def run_pin(context: OperationContext, args: PinArgs) -> BranchChange:
    """Pin the branch through `checkpoint_id` as the thread's main branch (one per thread: the pin moves).

    The pinned branch is the newest branch through that checkpoint: `list_branches` lists it first with
    `pinned: true`. `pinned=false` removes the thread's pin.

    Returns `thread_id`, `checkpoint_id`, `pinned`. Raises: `InvalidRequest`, `ThreadNotFound`,
    `CheckpointNotFound`, `ThreadBusy`.
    """
    return pin_branch(context.storage, args.thread_id, args.checkpoint_id, args.pinned, user_id=args.user_id)


@dataclass(frozen=True, kw_only=True)
class BranchArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str = param(source="checkpoint", check=checks.required_id, cli={"argument": True, "help": "A checkpoint of the branch (its leaf, or the alternative to remove)."})
    user_id: str | None = param(None, source="user")


def run_archive(context: OperationContext, args: BranchArgs) -> BranchChange:
    """Hide the branch through `checkpoint_id`: from where it leaves its nearest other branch on, it is left
    out of `list_branches` and of every sibling and alternative count (`include_archived` shows it).

    Nothing is deleted: the branch still reads, can be switched to and continued, and
    `unarchive_branch` shows it again. Returns `thread_id`, `checkpoint_id` (where the archived part
    starts), `archived`. Raises: `InvalidRequest` (the head's branch, or the only branch),
    `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`.
    """
    return archive_branch(context.storage, args.thread_id, args.checkpoint_id, True, user_id=args.user_id)


def run_unarchive(context: OperationContext, args: BranchArgs) -> BranchChange:
    """Show an archived branch again: clears every archive on the chain of `checkpoint_id`.

    Returns `thread_id`, `checkpoint_id`, `archived` (false). Raises: `InvalidRequest`,
    `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`.
    """
    return archive_branch(context.storage, args.thread_id, args.checkpoint_id, False, user_id=args.user_id)


def run_delete(context: OperationContext, args: BranchArgs) -> BranchChange:
    """Delete the branch through `checkpoint_id`: every checkpoint only that branch uses (from where it leaves
    its nearest other branch, everything after it), with their messages, labels and search entries, and
    under `memory_scope="branch"` the long-term memory versions saved on them (a memory changed there is
    known again by its version before); under "user" the user's memories are kept (they are the user's,
    not the branch's; `forget_memory` removes one).

    Every other checkpoint and message stays byte for byte. Refused, with nothing written, when that part
    holds the head (switch away first) or the root. Returns `thread_id`, `checkpoint_id` (where the deleted
    part started), `deleted_checkpoint_ids` (oldest first) and `deleted_memory_versions` (how many memory
    versions went with them; 0 under "user" scope). Raises: `InvalidRequest`, `ThreadNotFound`,
    `CheckpointNotFound`, `ThreadBusy`.
    """
    return delete_branch(context.storage, args.thread_id, args.checkpoint_id, user_id=args.user_id, memories=context.memories)


LABEL_BRANCH = Operation(
    name="label_branch",
    summary="Name the branch through checkpoint_id (null removes the label).",
    args=LabelArgs,
    run=run_label,
    positional=3,
    writes=True,
    cli="branch label",
)
PIN_BRANCH = Operation(
    name="pin_branch",
    summary="Pin the branch through checkpoint_id as the thread's main branch.",
    args=PinArgs,
    run=run_pin,
    positional=2,
    writes=True,
    cli="branch pin",
)
ARCHIVE_BRANCH = Operation(
    name="archive_branch",
    summary="Hide the branch through checkpoint_id from branch lists and sibling counts.",
    args=BranchArgs,
    run=run_archive,
    positional=2,
    writes=True,
    cli="branch archive",
)
UNARCHIVE_BRANCH = Operation(
    name="unarchive_branch",
    summary="Show an archived branch again.",
    args=BranchArgs,
    run=run_unarchive,
    positional=2,
    writes=True,
    cli="branch unarchive",
)
DELETE_BRANCH = Operation(
    name="delete_branch",
    summary="Delete the checkpoints only the branch through checkpoint_id uses.",
    args=BranchArgs,
    run=run_delete,
    positional=2,
    writes=True,
    cli="branch delete",
)
