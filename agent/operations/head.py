"""The head operation: which checkpoint a thread continues from, without reading its messages.

A client that keeps its own copy of a conversation (a chat page, a notebook) asks this before a
turn to learn whether another client moved the head (a turn, `set_head`, an edit elsewhere): one
read of the thread record, whatever the thread's length, where `get_checkpoint_state` would
also read and place every message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.operations import checks
from agent.operations.history import head
from agent.operations.operation import Operation, param

if TYPE_CHECKING:
    from agent.operations.context import OperationContext


@dataclass(frozen=True, kw_only=True)
class HeadArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    user_id: str | None = param(None, source="user")


def get_head(context: OperationContext, args: HeadArgs) -> dict[str, Any]:
    """The thread's head: `{"thread_id", "checkpoint_id"}`, the checkpoint the next turn continues from.

    Reads the thread record only (no checkpoint, no message).

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound` (unknown, or not the caller's).
    """
    return {"thread_id": args.thread_id, "checkpoint_id": head(context.storage, args.thread_id, user_id=args.user_id)}


GET_HEAD = Operation(
    name="get_head",
    summary="The thread's head checkpoint_id, without its messages.",
    args=HeadArgs,
    run=get_head,
    reads_only=True,
    cli="head",
)
