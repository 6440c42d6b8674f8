"""State updates: a new checkpoint written without running the graph (`update_checkpoint_state`,
an edit in place, a Conversations API create).

A state update is a turn without a run: it claims the thread like a turn
(same strategy, same fencing), writes its checkpoint with LangGraph's
`update_state` as the answering node into the turn's buffer, and commits it
like a turn (`commit.commit`). It stays synchronous: it streams nothing and
calls no model, so it is storage work from end to end, and the async callers
run it whole on the storage thread pool (`TurnRunner.in_io`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from agent.config import MultitaskStrategy
from agent.context.summaries import edit_keeps_summary
from agent.errors import InvalidRequest
from agent.operations.access import authorize
from agent.operations.edits import position_of, removals
from agent.operations.turns.args import Start, TurnArgs
from agent.operations.turns.commit import commit, result_of, update_as_answer
from agent.operations.turns.parts import TurnParts
from agent.operations.turns.start import claim as claim_thread
from agent.operations.turns.start import check_input_ids, check_tool_results, plan_start, prepare
from agent.state import CONTEXT_SUMMARY_CHANNEL
from agent.types import StoredResponse, TurnResult

#: The Responses API role of each LangChain message type, for errors.
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def update_state(
    parts: TurnParts,
    thread_id: str,
    checkpoint_id: str | None,
    messages: Sequence[BaseMessage],
    *,
    user_id: str | None,
    strategy: MultitaskStrategy | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    remove_message_ids: Sequence[str] = (),
    edit_message_id: str | None = None,
    new_thread: bool = False,
    metadata: Mapping[str, str] | None = None,
    answered_tool_results: bool = False,
) -> TurnResult:
    """Write a new checkpoint whose parent is `checkpoint_id` (default: the head), with `messages` applied.

    `new_thread`: `thread_id` is a new id, and the thread is created (owned by `user_id`, with
    `metadata`) with its root and, when `messages` are given, one checkpoint holding them (a
    Conversations API create), in one transaction.

    It becomes the thread head. Messages are applied with LangGraph's
    `add_messages` as if the agent node had returned them: appended, and a
    message whose `id` is already in the state replaces that message.
    With an `idempotency_key` (and the request's `request_hash`), a retry
    returns the first result and writes nothing. `remove_message_ids` are
    removed first (`edits.removals`: a tool call's results go with it); a
    removed message that one of `messages` has the id of is replaced by it
    in place instead, as `add_messages` applies a removal and a message with
    its id, so that the write holds each id once (its export imports).
    `edit_message_id`: the one message of `messages` takes that message's id,
    so it replaces it in place (the way to edit in place when the request's
    items lost their ids; see `requests.ItemIdsRequest`).
    Replacing or removing a message the branch's context summary stands for
    retires the summary (`agent.context.summaries.edit_keeps_summary`).
    `answered_tool_results`: refuse a tool result of `messages` that answers no tool call waiting for
    one, as a turn does (`start.check_tool_results`); the Conversations API adds items the way a turn's
    input would, while `update_checkpoint_state` stays an edit of the record and may store one.

    Raises:
        ThreadNotFound, CheckpointNotFound, ThreadBusy, StorageUnavailable: as for `run`.
        InvalidRequest: nothing to apply (no messages, no removals); `messages` hold two messages with
            one id (`start.check_input_ids`); the idempotency key was used for a different request; a
            `remove_message_ids` or `edit_message_id` id is not in the checkpoint, an edit changes the
            message's role, or removing leaves no message; with `answered_tool_results`, a tool result
            that answers no tool call waiting for one (naming its call_id).
    """
    if not messages and not remove_message_ids and not new_thread:
        raise InvalidRequest(
            "update_checkpoint_state needs input messages or remove_message_ids: there is nothing to apply, "
            "and nothing was written (set_head moves the head without writing)."
        )
    check_input_ids(messages, thread_id=thread_id)
    args = TurnArgs(messages, thread_id, user_id, checkpoint_id, strategy, idempotency_key, request_hash, metadata=metadata)
    if idempotency_key is not None:
        stored = parts.idempotency.lookup(user_id, idempotency_key, request_hash)
        if stored is not None:
            return result_of(stored)
    storage = parts.storage
    claim = parts.idempotency.claim_or_result(
        lambda: claim_thread(parts, thread_id, args), user_id, idempotency_key, request_hash
    )
    if isinstance(claim, StoredResponse):  # the first request with the key held the thread
        return result_of(claim)
    try:
        if not (new_thread and claim.record is None):
            authorize(claim.record, thread_id, user_id)
        begun = plan_start(parts, claim, args)
        current = claim.start.checkpoint["channel_values"].get("messages") or () if claim.start is not None else ()
        if edit_message_id is not None:
            messages = _in_place(current, messages, edit_message_id, thread_id, begun.checkpoint_id)
            begun = Start(begun.checkpoint_id, messages, begun.loaded)
        if remove_message_ids:
            removed = removals(
                current, remove_message_ids, thread_id=thread_id, checkpoint_id=begun.checkpoint_id, adding=messages
            )
            begun = Start(begun.checkpoint_id, [*removed, *messages], begun.loaded)
        if answered_tool_results:
            check_tool_results(begun, args, field="items")
        turn, start, config = prepare(parts, claim, args, begun)
        if claim.record is None and not begun.messages:
            # A new thread and nothing to add (an empty conversation): its root is the whole thread.
            outcome = commit(parts, claim, turn, args, TurnResult(thread_id, turn.new_head, None), [])
            return outcome if isinstance(outcome, TurnResult) else result_of(outcome)
        values: dict[str, Any] = {"messages": list(begun.messages)}
        if (
            CONTEXT_SUMMARY_CHANNEL in parts.graph.channels
            and begun.loaded is not None
            and not edit_keeps_summary(begun.loaded.checkpoint["channel_values"], begun.messages)
        ):
            values[CONTEXT_SUMMARY_CHANNEL] = None
        with storage.saver.buffering(turn):
            update_as_answer(parts, config, values)
        outcome = commit(parts, claim, turn, args, TurnResult(thread_id, turn.new_head, start), [])
    except BaseException:
        storage.release(claim)
        raise
    return outcome if isinstance(outcome, TurnResult) else result_of(outcome)


def _in_place(
    current: Sequence[BaseMessage], messages: Sequence[BaseMessage], edit_message_id: str, thread_id: str, checkpoint_id: str | None
) -> list[BaseMessage]:
    """`messages` with the id of the message they replace (an edit in place keeps the message's role).

    Raises:
        InvalidRequest: `edit_message_id` is not in the checkpoint, or the edit changes the message's role.
    """
    replaced = current[position_of(current, edit_message_id, thread_id=thread_id, checkpoint_id=checkpoint_id)]
    if messages[0].type != replaced.type:
        raise InvalidRequest(
            f"An edit keeps the message's role: message {edit_message_id!r} is a {_ROLES[replaced.type]} "
            f"message, the new one a {_ROLES[messages[0].type]} message. Nothing was written.",
            thread_id=thread_id,
            message_id=edit_message_id,
        )
    return [message.model_copy(update={"id": replaced.id}) for message in messages]
