"""Ending threads: delete one, or every thread of a user.

Deletion claims the thread like a turn (so it never races a running turn),
checks ownership on the record the claim read, and deletes every row of the
thread in the commit's transaction.
"""

from __future__ import annotations

from agent.errors import ThreadNotFound
from agent.operations.access import authorize
from agent.storage import ThreadStorage


def delete_thread(storage: ThreadStorage, thread_id: str, *, user_id: str | None) -> None:
    """Delete every checkpoint, write and record of a thread, in one transaction.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        ThreadBusy: a turn held the thread for longer than `enqueue_timeout`.
    """
    with storage.claimed(thread_id, user_id=user_id) as claim:
        authorize(claim.record, thread_id, user_id)
        storage.commit(claim, lambda tx: tx.delete_thread(thread_id))


def delete_user_data(storage: ThreadStorage, user_id: str) -> list[str]:
    """Delete every thread `user_id` owns; returns their ids, sorted.

    Each thread is deleted in its own transaction, after checking on its claim
    that `user_id` still owns it.
    """
    deleted = []
    for thread_id in storage.threads_of_user(user_id):
        try:
            delete_thread(storage, thread_id, user_id=user_id)
        except ThreadNotFound:
            continue  # deleted meanwhile
        deleted.append(thread_id)
    return deleted
