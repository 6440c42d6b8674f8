"""`merge_branch`: carry what one branch concluded into another, as one new checkpoint on the target branch.

It is a turn without a graph run: it claims the thread with the turn's
strategy and fencing (so it never races a turn, and only the thread's owner
gets it), reads both branches, calls the model when it summarizes (holding no
database connection meanwhile, as a turn does), writes its checkpoint as the
answering node into the turn's buffer, and commits it like a turn (with an
idempotency key, a retry gets the first result). The source branch is only read.

**It streams like a turn.** The body is one async generator (`amerge`) that
yields a turn's events (`agent.operations.turns.args.TurnEvent`): `TurnStarted`
once it holds the thread (its response id names the checkpoint it will write),
the summary's text as `TextDelta`s while the model writes it (the
`SUMMARY_PREFIX` first, then the model's tokens), `NewMessages` with the merged
message(s), and last the `TurnResult` after the commit (an idempotent retry:
only the first request's `StoredResponse`). So the Responses adapter streams a
merge exactly as it streams a turn (`predict_stream`, `POST /responses` with
`stream: true`, `/invocations`: the same events, numbered, `custom_outputs` on
the last item and on `response.completed`), and a resumable stream records it
like a turn's. The Python method and the command line drive the same body to its
end on the turn runner's loop threads (`merge_branch`, as a sync turn does:
`agent.operations.turns.bridge`). Nothing is written until the caller has read
every event (`bridge.caught_up`): a stream closed early, a client that leaves
or a cancelled task stops the model call and releases the thread with nothing
written. A newer turn that interrupts or rolls back the thread stops the merge
the same way (`TurnCancelled`; a half-written summary is not worth keeping, so
`interrupt` keeps nothing either), and a lost claim is `LeaseExpired`.

* `mode="summary"`: the model summarizes the messages the source branch added
  since the common ancestor, with the context pipeline's summary request
  (`agent.context.summaries.summary_request`, the summarizer of the agent's
  context window); the new checkpoint adds one assistant message with it.
* `mode="messages"`: the new checkpoint adds copies (new ids, text only) of the
  chosen messages of the source checkpoint, in the source's order (no model call,
  so no deltas: each message arrives whole, as a turn's unstreamed message does).

The new checkpoint's metadata records `merged_from` (`thread_id`,
`checkpoint_id`, `common_ancestor_checkpoint_id`, `mode`, `message_ids`: the
source messages brought in or summarized); history and `get_checkpoint_state`
show it. It becomes the head.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agent.errors import InvalidRequest, LeaseExpired, TurnCancelled
from agent.operations import checks
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.operation import Operation, param
from agent.operations.render import with_state
from agent.operations.tree import read_tree
from agent.storage.deltas import common_prefix
from agent.types import NewMessages, StoredResponse, TextDelta, TurnResult, TurnStarted

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from agent.operations.context import OperationContext
    from agent.operations.turns import TurnEvent, TurnRunner
    from agent.operations.turns.args import TurnArgs
    from agent.operations.turns.parts import TurnParts
    from agent.storage import Claim, Turn

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


@dataclass(frozen=True)
class _Plan:
    """What a merge brings in, decided from both branches once the thread is held."""

    mode: MergeMode
    ancestor: str | None
    copies: list[BaseMessage]
    """`messages` mode: the new messages (copies of the chosen ones)."""
    added: list[BaseMessage]
    """`summary` mode: what the source added since the common ancestor (the model summarizes it)."""
    brought: list[str]
    """The source message ids brought in or summarized (`merged_from.message_ids`)."""


def merge_branch(turns: TurnRunner, args: MergeArgs) -> TurnResult:
    """Write one checkpoint on `args.target_checkpoint_id` bringing in the source branch (see the module
    docstring): `amerge` driven to its end from the caller's thread (no token streaming); its `TurnResult`
    (an idempotent retry: the first request's). The errors are `amerge`'s."""
    result: Any = None
    for event in turns.bridge.iterate(amerge(turns, args, stream_tokens=False)):
        result = event
    from agent.operations.turns.commit import result_of

    return result if isinstance(result, TurnResult) else result_of(result)


async def amerge(turns: TurnRunner, args: MergeArgs, *, stream_tokens: bool) -> AsyncIterator[TurnEvent]:
    """The merge as a turn's events (module docstring): `TurnStarted`, the summary's `TextDelta`s (when
    `stream_tokens`, in `summary` mode), `NewMessages`, then the committed `TurnResult`; or only the
    `StoredResponse` of an idempotent retry.

    Closing the generator before its end (a client that left) stops the model call and releases the thread:
    nothing is written.

    Raises:
        ThreadNotFound, CheckpointNotFound, ThreadBusy, StorageUnavailable: as for a turn.
        InvalidRequest: the source adds nothing since the common ancestor (it is the target or one of
            its ancestors); `messages` mode without `message_ids`, or with an id not in the source, or
            one of a tool message or a tool call; `summary` mode with `message_ids`, or an agent
            without its own chat model.
        ModelError: the model failed while summarizing; nothing was written.
        TurnCancelled: a newer turn interrupted or rolled back the thread meanwhile; nothing was written.
        LeaseExpired: the claim was lost meanwhile; nothing was written.
    """
    from agent.operations.turns.args import Start, TurnArgs
    from agent.operations.turns.bridge import caught_up
    from agent.operations.turns.start import ClaimHandoff, claim_for, prepare

    parts, in_io = turns.parts, turns.in_io
    _check_request(args)
    turn_args = TurnArgs(
        [], args.thread_id, args.user_id, args.target_checkpoint_id, args.multitask_strategy,  # type: ignore[arg-type]
        args.idempotency_key, args.request_hash,
    )  # fmt: skip
    if args.idempotency_key is not None:
        stored = await parts.idempotency.alookup(args.user_id, args.idempotency_key, args.request_hash, in_io)
        if stored is not None:
            yield stored
            return
    handoff = ClaimHandoff()
    try:
        claimed = await parts.idempotency.aclaim_or_result(
            lambda: turns.in_claim(claim_for, parts, args.thread_id, turn_args, handoff),
            args.user_id, args.idempotency_key, args.request_hash, in_io,
        )  # fmt: skip
    except BaseException:
        await handoff.abandon_and_release(in_io, parts)  # cancelled while the claim waited: nothing is held
        raise
    if isinstance(claimed, StoredResponse):  # the first request with the key held the thread
        yield claimed
        return
    claim = claimed
    done = False
    try:
        plan = await in_io(_plan, parts, claim, args)
        turn, start, config = prepare(parts, claim, turn_args, Start(args.target_checkpoint_id, [], claim.start))
        yield TurnStarted(f"resp_{turn.head_id}")
        if plan.mode == "messages":
            new = plan.copies
        else:
            item_id = str(uuid.uuid4())
            text = ""
            async for delta in _summary(parts, plan.added, claim, stream_tokens):
                text += delta
                if stream_tokens:
                    yield TextDelta(item_id=item_id, text=delta)
            new = [_ai_message(text, item_id)]
        _stopped(claim)
        yield NewMessages(list(new))
        await caught_up()  # a sync caller that stops reading now stops the merge before it writes
        result = await in_io(_commit, parts, claim, turn, turn_args, config, start, new, _provenance(args, plan))
        done = True
        yield result
    finally:
        if not done:
            await asyncio.shield(in_io(parts.storage.release, claim))


def _check_request(args: MergeArgs) -> None:
    if args.mode == "messages" and not args.message_ids:
        raise InvalidRequest("merge_branch with mode 'messages' needs message_ids: the source messages to bring in")
    if args.mode == "summary" and args.message_ids:
        raise InvalidRequest("merge_branch with mode 'summary' takes no message_ids: it summarizes what the source added")


def _plan(parts: TurnParts, claim: Claim, args: MergeArgs) -> _Plan:
    """What the merge brings in (storage reads, with the thread held).

    Raises: ThreadNotFound, CheckpointNotFound, InvalidRequest (see `amerge`).
    """
    storage, thread_id = parts.storage, args.thread_id
    source_id, target_id = args.source_checkpoint_id, args.target_checkpoint_id
    authorize(claim.record, thread_id, args.user_id)
    if claim.start is None:
        raise checkpoint_not_found(thread_id, target_id)
    tree = read_tree(storage, thread_id)
    if source_id not in tree:
        raise checkpoint_not_found(thread_id, source_id)
    ancestor = tree.common_ancestor(source_id, target_id)
    if ancestor == source_id:
        raise InvalidRequest(
            f"Checkpoint {source_id!r} is on the target's branch: there is nothing to merge. Nothing was written.",
            thread_id=thread_id,
            checkpoint_id=source_id,
        )
    source = _messages(storage, thread_id, source_id)
    if args.mode == "messages":
        chosen = _chosen(source, args.message_ids, thread_id, source_id)
        return _Plan("messages", ancestor, [_copy(m) for m in chosen], [], [m.id for m in chosen])
    base = _messages(storage, thread_id, ancestor) if ancestor is not None else ()
    added = list(source[common_prefix(source, base) :])
    if not added:
        raise InvalidRequest(
            f"Checkpoint {source_id!r} adds no message since the common ancestor. Nothing was written.",
            thread_id=thread_id,
            checkpoint_id=source_id,
        )
    if parts.window is None or parts.window.summarizer is None:
        raise InvalidRequest("merge_branch with mode 'summary' needs the agent's own chat model (a context window)")
    return _Plan("summary", ancestor, [], added, [m.id for m in added])


def _provenance(args: MergeArgs, plan: _Plan) -> dict[str, Any]:
    return {
        "thread_id": args.thread_id,
        "checkpoint_id": args.source_checkpoint_id,
        "common_ancestor_checkpoint_id": plan.ancestor,
        "mode": plan.mode,
        "message_ids": plan.brought,
    }


def _commit(
    parts: TurnParts,
    claim: Claim,
    turn: Turn,
    args: TurnArgs,
    config: dict,
    start: str,
    new: list[BaseMessage],
    provenance: dict[str, Any],
) -> TurnResult | StoredResponse:
    """Buffer the merge's checkpoint (the answering node's update, `merged_from` in its metadata) and commit
    it like a turn, with its messages as the stored response's output (a streamed retry replays them)."""
    from agent.messages import to_output_items
    from agent.operations.turns.commit import commit, update_as_answer

    with parts.storage.saver.buffering(turn):
        update_as_answer(parts, config, {"messages": new})
    # The provenance rides in the new checkpoint's metadata (a caller's key: the saver keeps it).
    put_config, checkpoint, metadata, versions = turn.puts[-1]
    turn.puts[-1] = (put_config, checkpoint, {**metadata, "merged_from": provenance}, versions)
    turn.name_head()  # the id its response was announced with (`TurnStarted`)
    return commit(parts, claim, turn, args, TurnResult(args.thread_id, turn.new_head, start), to_output_items(new))


def _stopped(claim: Claim) -> None:
    """Raise when a newer turn (or a lost claim) stopped the merge; nothing has been written.

    Raises: LeaseExpired, TurnCancelled.
    """
    if not claim.stop.is_set():
        return
    if claim.lost:
        raise LeaseExpired(
            f"The merge's claim on thread {claim.thread_id!r} expired and another turn took the thread; nothing was written.",
            thread_id=claim.thread_id,
        )
    raise TurnCancelled(
        f"A newer turn on thread {claim.thread_id!r} stopped this merge ({claim.cancel}); nothing was written.",
        thread_id=claim.thread_id,
    )


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


def _ai_message(text: str, item_id: str) -> BaseMessage:
    from langchain_core.messages import AIMessage

    return AIMessage(content=text, id=item_id)


async def _summary(parts: TurnParts, added: list[BaseMessage], claim: Claim, stream_tokens: bool) -> AsyncIterator[str]:
    """The summary message's text in pieces: `SUMMARY_PREFIX`, then the model's summary of `added` (through
    the context pipeline's summary request) as it writes it (`stream_tokens`), else whole. Stops, cancelling
    the model's request, when a newer turn stops the claim (the caller then raises: `_stopped`).

    Raises:
        ModelError: the model failed.
    """
    from agent.context.repair import close_unanswered_tool_calls
    from agent.context.summaries import summary_request
    from agent.errors import ModelError
    from agent.operations.turns.progress import until

    summarizer = parts.window.summarizer  # checked by `_plan`
    request = summary_request(None, close_unanswered_tool_calls(added), SUMMARY_TOKENS)
    stop = asyncio.Event()
    claim.on_stop(functools.partial(_wake, asyncio.get_running_loop(), stop))
    yield SUMMARY_PREFIX
    try:
        if stream_tokens:
            async with contextlib.aclosing(until(summarizer.astream(request), stop)) as chunks:
                async for chunk in chunks:
                    if chunk.text:
                        yield chunk.text
        else:
            async with contextlib.aclosing(until(_one(summarizer.ainvoke(request)), stop)) as answers:
                async for answer in answers:
                    yield answer.text
    except Exception as exc:  # the model's own errors, whatever their type
        raise ModelError(f"The model failed while summarizing the branch: {exc}. Nothing was written.") from None


async def _one(awaitable: Any) -> AsyncIterator[Any]:
    yield await awaitable


def _wake(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set `stop` on its loop, from the claim keeper's thread (a loop already closed is ignored)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(stop.set)


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
    strategy; an idempotency key makes a retry safe), and streamed like one: `predict_stream` (or
    `POST /responses` with `stream: true`) with `custom_inputs.action="merge_branch"` yields a turn's
    events, the summary's text as deltas while the model writes it; closing the stream early writes nothing.

    Returns `thread_id`, `checkpoint_id` (the new one), `parent_checkpoint_id` (the target),
    `response_id`; with `include=["state"]` also `state`. Raises: `InvalidRequest` (nothing to merge,
    bad ids or mode), `ThreadNotFound`, `CheckpointNotFound`, `ThreadBusy`, `ModelError`, `TurnCancelled`
    (a newer turn stopped it).
    """
    result = merge_branch(context.turns, args)
    if checks.STATE not in args.include:
        return result
    return with_state(context.storage, result, user_id=args.user_id)


def stream_merge(context: OperationContext, args: MergeArgs, *, stream_tokens: bool) -> AsyncIterator[TurnEvent]:
    """The merge's events as a turn yields them (`amerge`), for the Responses adapter."""
    return amerge(context.turns, args, stream_tokens=stream_tokens)


MERGE_BRANCH = Operation(
    name="merge_branch",
    summary="One new checkpoint on target_checkpoint_id bringing in the source branch (a summary, or chosen messages).",
    args=MergeArgs,
    run=run_merge,
    stream=stream_merge,
    positional=3,
    writes=True,
    cli="branch merge",
)
