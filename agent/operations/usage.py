"""Token usage: a thread's total and a branch's, read from checkpoint metadata.

Each turn's checkpoint records the tokens its model calls used (`usage`) and
the running total of its branch (`branch_usage`, see
`agent.storage.summaries.model_input_summary`). A branch's total is therefore
one checkpoint's metadata, and a thread's total is the sum of `usage` over its
checkpoints: one statement, no message read, whatever the thread's length.
Turns that failed or were rolled back wrote nothing, so they count nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.operations import checks
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.operation import Operation, param
from agent.storage import ThreadStorage
from agent.types import TokenUsage

if TYPE_CHECKING:
    from agent.operations.context import OperationContext


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


# -- the operation ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class UsageArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str | None = param(
        None, source="checkpoint", check=checks.check_id, cli={"metavar": "CHECKPOINT_ID", "help": "Default: the head."}
    )
    user_id: str | None = param(None, source="user")


def get_usage(context: OperationContext, args: UsageArgs) -> TokenUsage:
    """Tokens the model used, as it reported them: `thread_usage` (every branch of the thread) and
    `branch_usage` (from the root to `checkpoint_id`, default the head), each `{"input_tokens",
    "output_tokens"}`, with `thread_id` and `checkpoint_id`.

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound`, `CheckpointNotFound`.
    """
    return token_usage(context.storage, args.thread_id, user_id=args.user_id, checkpoint_id=args.checkpoint_id)


GET_USAGE = Operation(
    name="get_usage",
    summary="Tokens the model used: the thread's total and the branch's up to checkpoint_id (default: the head).",
    args=UsageArgs,
    run=get_usage,
    positional=2,
    cli="usage",
)
