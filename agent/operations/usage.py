"""Token usage: a thread's total and a branch's, read from checkpoint metadata.

Each turn's checkpoint records the tokens its model calls used (`usage`) and
the running total of its branch (`branch_usage`, see
`agent.storage.summaries.model_input_summary`). A branch's total is therefore
one checkpoint's metadata, and a thread's total is the sum of `usage` over its
checkpoints: one statement, no message read, whatever the thread's length.
Turns that failed or were rolled back wrote nothing, so they count nothing.
"""

from __future__ import annotations

from agent.operations.access import authorize, checkpoint_not_found
from agent.storage import ThreadStorage
from agent.types import TokenUsage


def token_usage(storage: ThreadStorage, thread_id: str, *, user_id: str | None, checkpoint_id: str | None) -> TokenUsage:
    """The thread's token usage and that of the branch up to `checkpoint_id` (None: the head).

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    target = checkpoint_id or record.head_checkpoint_id
    found = storage.token_usage(thread_id, target)
    if found is None:
        raise checkpoint_not_found(thread_id, target)
    thread_usage, branch_usage = found
    return TokenUsage(thread_id, target, thread_usage, branch_usage or {"input_tokens": 0, "output_tokens": 0})
