"""After a turn ran: commit what it buffered in one transaction, or do what a newer turn's stop asked for.

Step 4 of a turn (`agent.operations.turns`). `finish` reads the claim's stop
signal: a lost claim is `LeaseExpired`, a `rollback` is `TurnCancelled`
(nothing written either way), an `interrupt` keeps what the turn produced so
far as one checkpoint (a resume keeps nothing, as a rollback). A resume that
wrote no checkpoint (its task asked again) is settled by `answered`. `commit` then writes the buffer, the thread's head
(and, for a new thread, its title and metadata), the long-term memory
operations among the new messages and, with an idempotency key, the response
under that key, all in one transaction; a `store: false` turn is released instead.
Everything here is synchronous storage work: the async path runs it on the
storage thread pool.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.errors import InvalidUpdateError
from langgraph.graph import START

from agent.errors import LeaseExpired, TurnCancelled
from agent.messages import to_output_items
from agent.operations.interrupts import stopped_at
from agent.operations.thread_values import default_title
from agent.operations.turns.answered import answered_in_place, wrote_root_checkpoint
from agent.operations.turns.args import Start, TurnArgs
from agent.operations.turns.parts import TurnParts
from agent.operations.turns.progress import Progress
from agent.operations.turns.start import ROOT_SOURCE, graph_config, messages_of
from agent.storage import Claim, Turn, Tx
from agent.storage.base import IdempotencyKeyTaken
from agent.types import StoredResponse, TurnResult


def finish(
    parts: TurnParts, claim: Claim, turn: Turn, start: str, args: TurnArgs, begun: Start, progress: Progress
) -> TurnResult | StoredResponse:
    """Commit the turn (or, when a newer turn asked it to stop, what that asks for).

    Returns the stored result of another request instead when that one committed the same
    idempotency key first (this turn then wrote nothing).

    Raises:
        LeaseExpired: the claim was lost to another turn; nothing was written.
        TurnCancelled: a newer turn rolled this one back; nothing was written.
    """
    status = "completed"
    if claim.stop.is_set():
        if claim.lost:
            raise LeaseExpired(
                f"The turn's claim on thread {claim.thread_id!r} expired and another turn took the thread; "
                "nothing was written.",
                thread_id=claim.thread_id,
            )
        # A resume stopped by a newer turn keeps nothing, as a rollback: what it produced is the answer it took,
        # and a checkpoint of its messages alone would leave the question unasked and unanswered.
        if claim.cancel == "rollback" or (claim.cancel == "interrupt" and begun.resume is not None):
            stopped = "rolled this turn back" if claim.cancel == "rollback" else "stopped this answer (a resume keeps nothing)"
            raise TurnCancelled(
                f"A newer turn on thread {claim.thread_id!r} {stopped}; nothing was written.", thread_id=claim.thread_id
            )
        if claim.cancel == "interrupt":
            keep_interrupted(parts, turn, start, begun.messages, progress)
            status = "interrupted"
    asked = progress.interrupts
    if begun.resume is not None and not wrote_root_checkpoint(turn) and status == "completed":
        renamed = answered_in_place(parts, turn, start)
        asked = [dataclasses.replace(item, id=renamed.get(item.id, item.id)) for item in asked]
    turn.name_head()  # the id its response was announced with (`TurnStarted`)
    waiting = tuple(stopped_at(asked, turn.writes)) if status == "completed" else ()
    result = TurnResult(
        claim.thread_id, turn.new_head, start, status, interrupts=waiting, cancelled_interrupts=begun.cancelled
    )
    return commit(parts, claim, turn, args, result, to_output_items(progress.produced))


def commit(
    parts: TurnParts, claim: Claim, turn: Turn, args: TurnArgs, result: TurnResult, output: list[dict]
) -> TurnResult | StoredResponse:
    """Commit `turn`, and with an idempotency key its response (`output` and `result`) in the same transaction.

    A `store: false` turn is released instead: nothing of it is written, not even a new thread's root.
    """
    storage = parts.storage
    if not args.store:
        storage.release(claim)
        existing = claim.record is not None
        return TurnResult(
            claim.thread_id if existing else None,
            None,
            result.parent_checkpoint_id if existing else None,
            result.status,
            # The id the turn was announced with (`TurnStarted`); it names nothing, as OpenAI's unstored responses.
            unstored_response_id=f"resp_{turn.head_id or uuid.uuid4().hex}",
        )
    apply = functools.partial(write_turn, parts, turn, result.parent_checkpoint_id, args)
    if args.idempotency_key is None:
        storage.commit(claim, apply)
        return result
    response = StoredResponse(output=output, custom_outputs=result.as_dict())
    idempotency = parts.idempotency
    try:
        storage.commit(
            claim,
            idempotency.storing(
                apply, user_id=args.user_id, key=args.idempotency_key, request_hash=args.request_hash, response=response
            ),
        )
    except IdempotencyKeyTaken:
        storage.release(claim)  # the failed commit rolled back its release too
        return idempotency.after_race(args.user_id, args.idempotency_key, args.request_hash)
    return result


def write_turn(parts: TurnParts, turn: Turn, start: str, args: TurnArgs, tx: Tx) -> None:
    """The commit of a turn: `write`, and the memory tools' results among its new messages.

    A turn that creates its thread also gives it its default title and `args.metadata` (`catalogue`).
    """
    user_id = args.user_id
    if turn.record is None:
        write(turn, user_id, tx, title=default_title(args.messages), metadata=args.metadata)
    else:
        write(turn, user_id, tx)
    if parts.memories is not None and user_id is not None and turn.puts:
        head = turn.puts[-1][1]
        new = list(head["channel_values"].get("messages") or ())[len(messages_of(turn, start)) :]
        parts.memories.write_turn(new, user_id=user_id, thread_id=turn.thread_id, checkpoint_id=head["id"])


def write(
    turn: Turn, user_id: str | None, tx: Tx, *, title: str | None = None, metadata: Mapping[str, str] | None = None
) -> None:
    """The commit of a turn: its checkpoints and writes, then the thread's head (and owner, title and
    metadata, when new)."""
    if not turn.puts:
        return
    tx.write_turn(turn)
    head = turn.puts[-1][1]
    tx.upsert_thread(
        turn.thread_id,
        user_id=user_id,
        head_checkpoint_id=head["id"],
        message_count=len(head["channel_values"].get("messages") or ()),
        title=title,
        metadata=metadata,
    )


def keep_interrupted(parts: TurnParts, turn: Turn, start: str, sent: list[BaseMessage], progress: Progress) -> None:
    """Replace what the stopped run buffered with one checkpoint: the input and what it produced."""
    turn.puts = [put for put in turn.puts if put[2].get("source") == ROOT_SOURCE]
    turn.writes = []
    config = {**graph_config(turn.thread_id, start), "metadata": {"interrupted": True}}
    with parts.storage.saver.buffering(turn):
        update_as_answer(parts, config, {"messages": [*sent, *progress.kept()]})


def update_as_answer(parts: TurnParts, config: dict, values: dict[str, Any]) -> None:
    """`graph.update_state` as the node that answers, so the new checkpoint's next step follows that
    node's edges (the built-in graph: tools if the last message asks for one, else the end).

    A user's graph: the node LangGraph infers (the last one that wrote the state; START on a root),
    and START when two nodes wrote it last (LangGraph's "Ambiguous update").
    """
    try:
        parts.graph.update_state(config, values, as_node=parts.answer_node)
    except InvalidUpdateError:
        if parts.answer_node is not None:
            raise
        parts.graph.update_state(config, values, as_node=START)


def result_of(stored: StoredResponse) -> TurnResult:
    """A state update's stored result as the TurnResult it was (its output is always empty)."""
    outputs = stored.custom_outputs
    return TurnResult(outputs["thread_id"], outputs["checkpoint_id"], outputs["parent_checkpoint_id"], outputs.get("status", "completed"))
