"""`merge_branch`: carry what one branch concluded into another, as one new checkpoint on the target branch.

It is a turn without a graph run, like a state update (`turns.updates`): it
claims the thread with the turn's strategy and fencing (so it never races a
turn, and only the thread's owner gets it), reads both branches, calls the
model when it summarizes (holding no database connection meanwhile, as a turn
does), writes its checkpoint as the answering node into the turn's buffer,
and commits it like a turn (with an idempotency key, a retry gets the first
result). The source branch is only read.

* `mode="summary"`: the model summarizes the messages the source branch added
  since the common ancestor, with the context pipeline's summary request
  (`agent.context.summaries.summary_request`, the summarizer of the agent's
  context window); the new checkpoint adds one assistant message with it.
* `mode="messages"`: the new checkpoint adds copies (new ids, text only) of the
  chosen messages of the source checkpoint, in the source's order.

The new checkpoint's metadata records `merged_from` (`thread_id`,
`checkpoint_id`, `common_ancestor_checkpoint_id`, `mode`, `message_ids`: the
source messages brought in or summarized); history and `get_checkpoint_state`
show it. It becomes the head.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agent.errors import InvalidRequest
from agent.operations import checks
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.operation import Operation, param
from agent.operations.render import with_state
from agent.operations.tree import read_tree
from agent.storage.deltas import common_prefix
from agent.types import TurnResult

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from agent.operations.context import OperationContext
    from agent.operations.turns.parts import TurnParts

MergeMode = Literal["summary", "messages"]
MODES = ("summary", "messages")
#: The summary's length asked of the model, in tokens.
SUMMARY_TOKENS = 300
#: What the summary message starts with, so a reader (and the model later) knows where it came from.
SUMMARY_PREFIX = "Summary of another branch of this conversation: "


def check_mode(name: str, value: Any) -> str:
    if value not in MODES:
        raise InvalidRequest(f"{name} must be one of {list(MODES)}, got {value!r:.40}")
    return value


def merge_branch(
    parts: TurnParts,
    thread_id: str,
    source_checkpoint_id: str,
    target_checkpoint_id: str,
    *,
    mode: MergeMode,
    message_ids: Sequence[str],
    user_id: str | None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    strategy: Any = None,
) -> TurnResult:
    """Write one checkpoint on `target_checkpoint_id` bringing in the source branch (see the module docstring).

    Raises:
        ThreadNotFound, CheckpointNotFound, ThreadBusy, StorageUnavailable: as for a turn.
        InvalidRequest: the source adds nothing since the common ancestor (it is the target or one of
            its ancestors); `messages` mode without `message_ids`, or with an id not in the source, or
            one of a tool message or a tool call; `summary` mode with `message_ids`.
        ModelError: the model failed while summarizing; nothing was written.
    """
    from agent.operations.turns.args import Start, TurnArgs
    from agent.operations.turns.commit import commit, result_of, update_as_answer
    from agent.operations.turns.start import claim as claim_thread
    from agent.operations.turns.start import prepare

    if mode == "messages" and not message_ids:
        raise InvalidRequest("merge_branch with mode 'messages' needs message_ids: the source messages to bring in")
    if mode == "summary" and message_ids:
        raise InvalidRequest("merge_branch with mode 'summary' takes no message_ids: it summarizes what the source added")
    args = TurnArgs([], thread_id, user_id, target_checkpoint_id, strategy, idempotency_key, request_hash)
    if idempotency_key is not None:
        stored = parts.idempotency.lookup(user_id, idempotency_key, request_hash)
        if stored is not None:
            return result_of(stored)
    storage = parts.storage
    claim = claim_thread(parts, thread_id, args)
    try:
        authorize(claim.record, thread_id, user_id)
        if claim.start is None:
            raise checkpoint_not_found(thread_id, target_checkpoint_id)
        tree = read_tree(storage, thread_id)
        if source_checkpoint_id not in tree:
            raise checkpoint_not_found(thread_id, source_checkpoint_id)
        ancestor = tree.common_ancestor(source_checkpoint_id, target_checkpoint_id)
        if ancestor == source_checkpoint_id:
            raise InvalidRequest(
                f"Checkpoint {source_checkpoint_id!r} is on the target's branch: there is nothing to merge. Nothing was written.",
                thread_id=thread_id,
                checkpoint_id=source_checkpoint_id,
            )
        source = _messages(storage, thread_id, source_checkpoint_id)
        base = _messages(storage, thread_id, ancestor) if ancestor is not None else ()
        added = list(source[common_prefix(source, base) :])
        if mode == "messages":
            chosen = _chosen(source, message_ids, thread_id, source_checkpoint_id)
            new = [_copy(message) for message in chosen]
            brought = [message.id for message in chosen]
        else:
            if not added:
                raise InvalidRequest(
                    f"Checkpoint {source_checkpoint_id!r} adds no message since the common ancestor. Nothing was written.",
                    thread_id=thread_id,
                    checkpoint_id=source_checkpoint_id,
                )
            new = [_summary(parts, added)]
            brought = [message.id for message in added]
        provenance = {
            "thread_id": thread_id,
            "checkpoint_id": source_checkpoint_id,
            "common_ancestor_checkpoint_id": ancestor,
            "mode": mode,
            "message_ids": brought,
        }
        begun = Start(target_checkpoint_id, new, claim.start)
        turn, start, config = prepare(parts, claim, args, begun)
        with storage.saver.buffering(turn):
            update_as_answer(parts, config, {"messages": new})
        # The provenance rides in the new checkpoint's metadata (a caller's key: the saver keeps it).
        put_config, checkpoint, metadata, versions = turn.puts[-1]
        turn.puts[-1] = (put_config, checkpoint, {**metadata, "merged_from": provenance}, versions)
        outcome = commit(parts, claim, turn, args, TurnResult(thread_id, turn.new_head, start), [])
    except BaseException:
        storage.release(claim)
        raise
    return outcome if isinstance(outcome, TurnResult) else result_of(outcome)


def _messages(storage: Any, thread_id: str, checkpoint_id: str) -> tuple:
    found = storage.get_checkpoint(thread_id, checkpoint_id)
    if found is None:
        raise checkpoint_not_found(thread_id, checkpoint_id)
    return tuple(found.checkpoint["channel_values"].get("messages") or ())


def _chosen(source: Sequence[BaseMessage], message_ids: Sequence[str], thread_id: str, checkpoint_id: str) -> list[BaseMessage]:
    by_id = {message.id: message for message in source}
    for message_id in message_ids:
        message = by_id.get(message_id)
        if message is None:
            raise InvalidRequest(
                f"Message {message_id!r} is not in checkpoint {checkpoint_id!r}. Nothing was written.",
                thread_id=thread_id,
                message_id=message_id,
            )
        if message.type not in ("human", "ai") or getattr(message, "tool_calls", None):
            raise InvalidRequest(
                f"Message {message_id!r} is a tool call or result: merge brings in user and assistant text. Nothing was written.",
                thread_id=thread_id,
                message_id=message_id,
            )
    wanted = set(message_ids)
    return [message for message in source if message.id in wanted]


def _copy(message: BaseMessage) -> BaseMessage:
    from langchain_core.messages import AIMessage, HumanMessage

    kind = HumanMessage if message.type == "human" else AIMessage
    return kind(content=message.content, id=str(uuid.uuid4()))


def _summary(parts: TurnParts, added: list[BaseMessage]) -> BaseMessage:
    """The model's summary of `added`, through the context pipeline's summary request.

    Raises:
        ModelError: the model failed.
    """
    from langchain_core.messages import AIMessage

    from agent.context.repair import close_unanswered_tool_calls
    from agent.context.summaries import summary_request
    from agent.errors import ModelError

    window = parts.window
    if window is None or window.summarizer is None:
        raise InvalidRequest("merge_branch with mode 'summary' needs the agent's own chat model (a context window)")
    request = summary_request(None, close_unanswered_tool_calls(added), SUMMARY_TOKENS)
    try:
        answer = window.summarizer.invoke(request)
    except Exception as exc:  # the model's own errors, whatever their type
        raise ModelError(f"The model failed while summarizing the branch: {exc}. Nothing was written.") from None
    return AIMessage(content=SUMMARY_PREFIX + answer.text, id=str(uuid.uuid4()))


# -- the operation ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MergeArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    source_checkpoint_id: str = param(
        check=checks.required_id, cli={"argument": True, "help": "The branch to bring in (its leaf, usually).", "checkpoint": True}
    )
    target_checkpoint_id: str = param(
        source="checkpoint", check=checks.required_id, cli={"argument": True, "help": "Where the merge checkpoint is written."}
    )
    mode: str = param("summary", check=check_mode, cli={"help": "summary (the model summarizes) or messages."})
    message_ids: tuple[str, ...] = param(None, check=checks.id_list, cli={"help": "With mode messages: the source messages."})
    include: tuple[str, ...] = param((), check=checks.include)
    user_id: str | None = param(None, source="user")
    multitask_strategy: str | None = param(None, source="envelope", python=False)
    idempotency_key: str | None = param(None, source="envelope", python=False)
    request_hash: str | None = param(None, source="envelope", python=False)


def run_merge(context: OperationContext, args: MergeArgs) -> TurnResult:
    """Bring the branch of `source_checkpoint_id` into the branch of `target_checkpoint_id`: one new checkpoint
    on the target, which becomes the head; the source branch is unchanged.

    `mode="summary"` (default): one assistant message with the model's summary of what the source
    added since the common ancestor. `mode="messages"`: copies (new ids) of the source's messages
    `message_ids` (user and assistant text). The new checkpoint's `merged_from` (history,
    `get_checkpoint_state`) names the source `thread_id`, `checkpoint_id`,
    `common_ancestor_checkpoint_id`, `mode` and `message_ids`. Claimed like a turn (the thread's
    strategy; an idempotency key makes a retry safe).

    Returns `thread_id`, `checkpoint_id` (the new one), `parent_checkpoint_id` (the target); with
    `include=["state"]` also `state`. Raises: `InvalidRequest` (nothing to merge, bad ids or mode),
    `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`, `ModelError`.
    """
    result = merge_branch(
        context.turns.parts,
        args.thread_id,
        args.source_checkpoint_id,
        args.target_checkpoint_id,
        mode=args.mode,  # type: ignore[arg-type]
        message_ids=args.message_ids,
        user_id=args.user_id,
        idempotency_key=args.idempotency_key,
        request_hash=args.request_hash,
        strategy=args.multitask_strategy,
    )
    if checks.STATE not in args.include:
        return result
    return with_state(context.storage, result, user_id=args.user_id)


MERGE_BRANCH = Operation(
    name="merge_branch",
    summary="One new checkpoint on target_checkpoint_id bringing in the source branch (a summary, or chosen messages).",
    args=MergeArgs,
    run=run_merge,
    positional=3,
    writes=True,
    cli="branch merge",
)
