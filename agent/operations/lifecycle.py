"""Ending threads: delete one, or every thread of a user (and the user's long-term memories).

Deletion claims the thread like a turn (so it never races a running turn),
checks ownership on the record the claim read, and deletes every row of the
thread in the commit's transaction; under `memory_scope="branch"` also the
memories the thread's turns wrote (under `user` scope they outlive the thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.errors import ThreadNotFound
from agent.operations.access import authorize
from agent.storage import ThreadStorage, Tx

if TYPE_CHECKING:
    from agent.memory.service import Memories


def delete_thread(
    storage: ThreadStorage, thread_id: str, *, user_id: str | None, memories: Memories | None = None
) -> None:
    """Delete every checkpoint, write and record of a thread (and its branch-scoped memories), in one transaction.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        ThreadBusy: a turn held the thread for longer than `enqueue_timeout`.
    """

    with storage.claimed(thread_id, user_id=user_id) as claim:
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

    Each thread is deleted in its own transaction, after checking on its claim
    that `user_id` still owns it.
    """
    deleted = []
    for thread_id in storage.threads_of_user(user_id):
        try:
            delete_thread(storage, thread_id, user_id=user_id, memories=memories)
        except ThreadNotFound:
            continue  # deleted meanwhile
        deleted.append(thread_id)
    if memories is not None:
        memories.delete_user(user_id)
    return deleted
