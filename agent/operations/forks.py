"""Forking: a new thread whose history is the ancestor chain of a checkpoint of another.

`fork_thread` writes a NEW thread: it claims the new id (a new thread is
claimable; one in use is refused), reads the source's ancestor chain without
claiming the source (its checkpoints are immutable, and claiming it would make
a running turn's fork wait or fail), and commits, in one transaction, a copy
of each checkpoint of the chain with a new id and the thread record (owner,
`forked_from`, title, metadata). The copies' messages are re-encoded as
deltas within the new thread, never copied as blobs (a delta's base names a
checkpoint of its own thread), so the fork is independent of the source
(deleting the source leaves it whole) and its storage is linear in its
messages like any thread's. Each copy keeps what its turn sent the model and
used: it is handed to the saver as that turn's report (as `import_thread`
does), from which the saver also derives the branch totals, so a fork's
`get_usage` is its source's. New ids rather than the source's: checkpoint ids
then stay unique across threads, which the message cache and every reader
that keys by checkpoint id may assume.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest, ThreadBusy, ThreadNotFound
from agent.operations import checks
from agent.operations.access import authorize
from agent.operations.branches import messages_of
from agent.operations.copied_writes import copied_writes, writes_by_task
from agent.operations.operation import Operation, param
from agent.operations.render import render_state
from agent.operations.tree import read_tree
from agent.storage import ThreadStorage, Turn
from agent.storage.summaries import TURN_REPORT_KEY, replayed_report
from agent.types import ForkResult

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.graph.state import CompiledStateGraph

    from agent.operations.context import OperationContext


def fork_thread(
    storage: ThreadStorage,
    thread_id: str,
    checkpoint_id: str | None,
    *,
    new_thread_id: str | None,
    user_id: str | None,
    graph: CompiledStateGraph | None = None,
) -> ForkResult:
    """A new thread, owned by `user_id`, whose history is the ancestor chain of `checkpoint_id` (default: the head).

    See the module docstring for how it is written. `graph`: the graph the thread runs, which names the tasks
    of the copies' pending writes (`copied_writes`: a question the source waits on can be answered by the id
    the fork lists); None copies them as they are.

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
        new_ids = _write_copies(storage, turn, copies, graph)
        head_count = len(messages_of(copies[-1]))

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



def _copies(storage: ThreadStorage, thread_id: str, chain: Sequence[str]) -> list[CheckpointTuple]:
    """The chain's checkpoints (messages resolved), oldest first."""
    found = {tup.config["configurable"]["checkpoint_id"]: tup for tup in storage.get_checkpoints(thread_id, chain)}
    missing = [c for c in chain if c not in found]
    if missing:  # the source was deleted while being read
        raise checkpoint_not_found(thread_id, missing[0])
    return [found[c] for c in chain]


def _write_copies(
    storage: ThreadStorage, turn: Turn, copies: Sequence[CheckpointTuple], graph: CompiledStateGraph | None
) -> list[str]:
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
                # Without the turn's report the saver would drop what the turn sent the model and used,
                # and each copy's branch total would be its source parent's (one turn short).
                configurable[TURN_REPORT_KEY] = replayed_report(source.metadata, new_ids[-1])
            # Every channel's value is written anew: the new thread has no blobs to point at.
            saver.put({"configurable": configurable}, checkpoint, dict(source.metadata), dict(checkpoint["channel_versions"]))
            written = {"configurable": {"thread_id": turn.thread_id, "checkpoint_ns": "", "checkpoint_id": new_id}}
            for (task_id, path), writes in writes_by_task(copied_writes(graph, source, checkpoint)).items():
                saver.put_writes(written, writes, task_id, path)
            new_ids.append(new_id)
    return new_ids


@dataclass(frozen=True, kw_only=True)
class ForkArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread to fork."})
    checkpoint_id: str | None = param(
        None, source="checkpoint", check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "Default: the head."}
    )
    new_thread_id: str | None = param(None, check=checks.check_id, cli={"metavar": "THREAD_ID", "help": "Default: a new id."})
    include: tuple[str, ...] = param((), check=checks.include)
    user_id: str | None = param(None, source="user")


def fork(context: OperationContext, args: ForkArgs) -> ForkResult:
    """A new thread, owned by the same user, whose history is the ancestor chain of `checkpoint_id`
    (default: the head), with the same messages; independent of the source afterwards.

    Returns `thread_id` and `checkpoint_id` (the new thread and its head) and
    `forked_from` (`{"thread_id", "checkpoint_id"}`, also kept in the new thread's record); with
    `include=["state"]` also `state`: the new thread's head as `get_checkpoint_state` gives it, every
    message placed in the new thread's tree (`agent.operations.render`).

    Raises: `InvalidRequest` (bad ids, `new_thread_id` in use, or `include` names something else),
    `ThreadNotFound`, `CheckpointNotFound`.
    """
    result = fork_thread(
        context.storage, args.thread_id, args.checkpoint_id, new_thread_id=args.new_thread_id, user_id=args.user_id,
        graph=context.graph,
    )
    if checks.STATE not in args.include:
        return result
    state = render_state(context.storage, result.thread_id, result.checkpoint_id, None, user_id=args.user_id)
    return replace(result, state=state)



FORK_THREAD = Operation(
    name="fork_thread",
    summary="A new thread whose history is the ancestor chain of checkpoint_id (default: the head).",
    args=ForkArgs,
    run=fork,
    positional=2,
    writes=True,
    cli="fork",
)
