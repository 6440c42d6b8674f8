"""The ownership rule, and the one wording of "not found".

A thread belongs to the `user_id` of its first write. To anyone else every
operation answers exactly as for a thread that does not exist, so nothing
leaks about whether it exists. Threads written without a user_id belong to
anonymous callers only. (The claim statements in `agent.storage` apply the same
rule in SQL, `storage.owned_by`, so a stranger never even makes a thread busy.)
"""

from __future__ import annotations

from agent.errors import CheckpointNotFound, ThreadNotFound, shown_id
from agent.storage import ThreadRecord, ThreadStorage, owned_by


def authorize(record: ThreadRecord | None, thread_id: str, user_id: str | None) -> ThreadRecord:
    """The record, if `user_id` may use the thread.

    Raises:
        ThreadNotFound: the thread does not exist, or its owner is not `user_id`.
    """
    if not owned_by(record, user_id):
        raise thread_not_found(thread_id)
    return record


def check_start(storage: ThreadStorage, thread_id: str, checkpoint_id: str | None, user_id: str | None) -> None:
    """Refuse, with two reads and before anything is written, a turn whose start the claim would refuse
    (`turns.start.start_of`): for a request answered before its turn runs (a background run, which is
    otherwise recorded as `queued` first). A new thread (no record, no `checkpoint_id`) passes.

    Raises:
        ThreadNotFound: the thread is someone else's, or does not exist while `checkpoint_id` is given.
        CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
    """
    record = storage.get_thread(thread_id)
    if record is None and checkpoint_id is None:
        return
    authorize(record, thread_id, user_id)
    if checkpoint_id is not None and not storage.checkpoint_in_thread(thread_id, checkpoint_id):
        raise checkpoint_not_found(thread_id, checkpoint_id)


def thread_not_found(thread_id: str) -> ThreadNotFound:
    return ThreadNotFound(f"Thread {shown_id(thread_id)} was not found.", thread_id=thread_id)


def checkpoint_not_found(thread_id: str, checkpoint_id: str) -> CheckpointNotFound:
    return CheckpointNotFound(
        f"Checkpoint {shown_id(checkpoint_id)} was not found in thread {shown_id(thread_id)}.",
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
    )
