"""Ending threads: delete one, or every thread of a user (and the user's long-term memories).

Deletion claims the thread like a turn (so it never races a running turn),
checks ownership on the record the claim read, and deletes every row of the
thread in the commit's transaction; under `memory_scope="branch"` also the
memories the thread's turns wrote (under `user` scope they outlive the thread).

Deleting a user's data first takes a claim on the user (`storage.user_claimed`;
the protocol is in `storage.turns`): from then on no turn, fork or import for
the user can start (`UserBeingDeleted`), so the list of threads to delete can
no longer grow. It is the user's threads plus the threads of turns already
running for the user (`claimed_threads_of_user`): a turn's new thread has no
record until its turn commits, and listing the records alone left it behind.
Each is claimed like a turn (waiting for the running one), and deleted if it
exists by then. Each thread is still deleted in its own transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.errors import ThreadNotFound
from agent.operations import checks
from agent.operations.access import authorize
from agent.operations.operation import Operation, param
from agent.storage import ThreadStorage, Tx, UserClaim

if TYPE_CHECKING:
    from agent.memory.service import Memories
    from agent.operations.context import OperationContext


def delete_thread(
    storage: ThreadStorage,
    thread_id: str,
    *,
    user_id: str | None,
    memories: Memories | None = None,
    user_claim: UserClaim | None = None,
) -> None:
    """Delete every checkpoint, write and record of a thread (and its branch-scoped memories), in one transaction.

    `user_claim`: the deletion of the user's data this is part of (see `delete_user_data`).

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        ThreadBusy: a turn held the thread for longer than `enqueue_timeout`.
        UserBeingDeleted: `delete_user_data` is deleting the user's data (and this is not part of it).
    """

    with storage.claimed(thread_id, user_id=user_id, user_claim=user_claim) as claim:
        authorize(claim.record, thread_id, user_id)
        storage.commit(claim, lambda tx: delete_rows(tx, thread_id, user_id=user_id, memories=memories))


def delete_rows(tx: Tx, thread_id: str, *, user_id: str | None, memories: Memories | None) -> None:
    """In a claimed commit's transaction: every row of the thread, and its branch-scoped memories
    (owner `user_id`). The one way a thread is deleted (also by the retention sweep)."""
    tx.delete_thread(thread_id)
    if memories is not None:
        memories.delete_thread_memories(user_id, thread_id)


def delete_user_data(storage: ThreadStorage, user_id: str, *, memories: Memories | None = None) -> list[str]:
    """Delete every thread `user_id` owns, then all the user's long-term memories; returns the thread ids, sorted.

    Holds the user for the whole deletion, so that no turn for the user starts meanwhile, and includes
    the threads that turns running when it began create (see the module docstring). Each thread is
    deleted in its own transaction, after checking on its claim that `user_id` owns it.

    Raises:
        UserBeingDeleted: another deletion of the same user's data is running; nothing was deleted.
        ThreadBusy: a turn held one of the threads for longer than `enqueue_timeout`; the threads
            before it are deleted, the user is free again.
        StorageUnavailable: the database failed; what was deleted before stays deleted.
    """
    deleted = []
    with storage.user_claimed(user_id) as held:
        # After the user claim: every claim for the user made before it is visible, none is made after it.
        thread_ids = sorted(set(storage.threads_of_user(user_id)) | set(storage.claimed_threads_of_user(user_id)))
        for thread_id in thread_ids:
            storage.renew_user_claim(held)
            try:
                delete_thread(storage, thread_id, user_id=user_id, memories=memories, user_claim=held)
            except ThreadNotFound:
                continue  # deleted meanwhile, or a running turn's new thread that was never committed
            deleted.append(thread_id)
        if memories is not None:
            memories.delete_user(user_id)
    return deleted


# -- the operations ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class DeleteThreadArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    user_id: str | None = param(None, source="user")


def delete_one_thread(context: OperationContext, args: DeleteThreadArgs) -> None:
    """Delete every checkpoint, write and the ownership record of a thread.

    Raises: `InvalidRequest`, `ThreadNotFound` (unknown, or not the caller's).
    """
    delete_thread(context.storage, args.thread_id, user_id=args.user_id, memories=context.memories)


@dataclass(frozen=True, kw_only=True)
class UserArgs:
    user_id: str = param(source="user", check=checks.required_id, cli={"argument": True, "help": "The user."})


def delete_all_user_data(context: OperationContext, args: UserArgs) -> list[str]:
    """Delete every thread `user_id` owns and all the user's long-term memories; returns the deleted
    thread ids, sorted."""
    deleted = delete_user_data(context.storage, args.user_id, memories=context.memories)
    forget_runs(context, user_id=args.user_id)
    return deleted


def forget_runs(context: OperationContext, *, user_id: str) -> None:
    """Delete the stored runs (status and stream events, `agent.runs`) of a deleted user: their events hold the
    turns' text. A thread's runs go with its rows (`Tx.delete_thread`); this also takes the user's runs that
    name no thread (a first turn that failed). After the threads' own transactions: a run is kept at most
    `response_events_seconds` anyway, and one that outlives a failure here is swept then."""
    from agent.runs.store import open_run_store

    open_run_store(context.storage, context.settings).forget(user_id=user_id)


DELETE_THREAD = Operation(
    name="delete_thread",
    summary="Delete the thread and all its checkpoints.",
    args=DeleteThreadArgs,
    run=delete_one_thread,
    outputs=lambda _, args: {"thread_id": args.thread_id, "deleted": True},
    returns="None",
    writes=True,
)
DELETE_USER_DATA = Operation(
    name="delete_user_data",
    summary="Delete every thread of the user, and all the user's long-term memories.",
    args=UserArgs,
    run=delete_all_user_data,
    outputs=lambda deleted, args: {"user_id": args.user_id, "deleted_thread_ids": deleted},
    returns="list[str]",
    writes=True,
)
