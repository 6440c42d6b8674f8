"""The state-update operation: a new checkpoint with messages applied, replaced or removed (`TurnRunner.update_state`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest
from agent.operations import checks
from agent.operations.operation import Operation, param
from agent.operations.render import with_state
from agent.types import TurnResult

if TYPE_CHECKING:
    from agent.operations.context import OperationContext


@dataclass(frozen=True, kw_only=True)
class UpdateArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    checkpoint_id: str | None = param(
        None,
        source="checkpoint",
        check=checks.check_id,
        python_required=True,
        cli={"metavar": "CHECKPOINT_ID", "help": "The parent of the new checkpoint. Default: the head."},
    )
    new_messages: list[Any] = param(None, source="input", check=checks.messages)
    remove_message_ids: tuple[str, ...] = param(None, check=checks.id_list)
    edit_message_id: str | None = param(None, check=checks.check_id)
    include: tuple[str, ...] = param((), check=checks.include)
    user_id: str | None = param(None, source="user")
    multitask_strategy: str | None = param(None, source="envelope", python=False)
    idempotency_key: str | None = param(None, source="envelope", python=False)
    request_hash: str | None = param(None, source="envelope", python=False)

    def __post_init__(self) -> None:
        if self.edit_message_id is not None and len(self.new_messages) != 1:
            raise InvalidRequest("With edit_message_id, update_checkpoint_state takes exactly one input message")


def update_checkpoint_state(context: OperationContext, args: UpdateArgs) -> TurnResult:
    """Create a checkpoint whose parent is `checkpoint_id` (None: the head), with Responses-style
    `new_messages` (e.g. `[{"role": "user", "content": "I'm headed to Tokyo!"}]`) applied.

    An item whose `id` names a message of the checkpoint replaces it (LangGraph's
    `add_messages`); others are appended. No two items may have one id (of two,
    `add_messages` would keep only the later). `remove_message_ids` (message ids, or
    a `function_call` item's id) are removed first; removing a tool call removes its
    result too. Removing a message and sending an item with its id replaces it in
    place, as `add_messages` does (what the removal takes along still goes).
    `edit_message_id` with exactly one item: that item replaces the message with that
    id, in place. It becomes the thread head. Returns `thread_id`,
    `checkpoint_id` (the new one) and `parent_checkpoint_id`; with `include=["state"]`
    also `state`: the new checkpoint as `get_checkpoint_state` gives it, from its first
    message that differs from the parent's on (`message_offset`; `agent.operations.render`).

    Raises: `InvalidRequest` (also: two items have one id, an id to remove is not in the
    checkpoint, nothing would be left, or `include` names something else), `ThreadNotFound`,
    `CheckpointNotFound`, `ThreadBusy`.
    """
    result = context.turns.update_state(
        args.thread_id,
        args.checkpoint_id,
        args.new_messages,
        user_id=args.user_id,
        strategy=args.multitask_strategy,
        idempotency_key=args.idempotency_key,
        request_hash=args.request_hash,
        remove_message_ids=args.remove_message_ids,
        edit_message_id=args.edit_message_id,
    )
    if checks.STATE not in args.include:
        return result
    return with_state(context.storage, result, user_id=args.user_id)


UPDATE_CHECKPOINT_STATE = Operation(
    name="update_checkpoint_state",
    summary="A new checkpoint on checkpoint_id (default: the head) with the input messages applied "
    "(an item whose id names a message replaces it) and remove_message_ids removed.",
    args=UpdateArgs,
    run=update_checkpoint_state,
    positional=3,
    writes=True,
    returns="dict[str, Any]",
)
