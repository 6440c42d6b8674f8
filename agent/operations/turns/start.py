"""Before a turn runs: claim the thread, decide where the turn starts and what it sends, set up its buffer.

Steps 1 and 2 of a turn (`agent.operations.turns`): `begin` claims the thread
and plans the start (authorizing the caller on the way), `prepare` makes the
turn's buffer and the graph config that starts there (a new thread first gets
its root checkpoint, buffered like every write, so a first turn that fails
leaves nothing), and `recall` reads the user's long-term memories for it.
Everything here is synchronous storage work: the async path runs it on the
storage thread pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph.message import add_messages

from agent.config import AgentSettings
from agent.context import TURN_CONTEXT_KEY, TurnContext
from agent.errors import InvalidRequest, ThreadBusy, TurnCancelled, shown_id
from agent.models.pairing import pairing_walk
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.edits import plan_edit, plan_regenerate
from agent.operations.idempotency import ANONYMOUS, claim_key
from agent.operations.interrupts import answer, pending_interrupts
from agent.operations.tree import fill_kept, read_tree
from agent.operations.turns import steer
from agent.operations.turns.args import Start, TurnArgs
from agent.operations.turns.parts import TurnParts
from agent.storage import Claim, Turn
from agent.storage.deltas import MessageList
from agent.storage.summaries import TURN_REPORT_KEY
from agent.validation import check_id

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple

    from agent.memory.service import Primed

#: The metadata `source` of a thread's root checkpoint.
ROOT_SOURCE = "root"


def check_budget(settings: AgentSettings, args: TurnArgs) -> None:
    """A turn may ask for a smaller token budget than the agent's `max_context_tokens`, never a larger one.

    Raises:
        InvalidRequest: `args.max_context_tokens` is above the agent's (nothing is claimed or written).
    """
    limit = settings.max_context_tokens
    if args.max_context_tokens is not None and limit is not None and args.max_context_tokens > limit:
        raise InvalidRequest(
            f"max_context_tokens {args.max_context_tokens} is above this agent's max_context_tokens ({limit}); "
            f"ask for at most {limit}."
        )


def check_input_ids(messages: Sequence[BaseMessage], *, thread_id: str | None) -> None:
    """Refuse input (a turn's, or a state update's) that holds two messages with one id, or an id that is not
    one (`agent.validation.check_id`: request items are checked when parsed, a Python caller's LangChain
    messages only here).

    A message id names one message of a state. LangGraph's `add_messages` applies a later message with an id
    already applied as a replacement, so of two input messages with one id the first would be silently lost;
    and the lists that keep the input as sent (a state update's write, kept on its parent checkpoint; the
    input of an edit that resets the state, `agent.operations.edits`) would hold both, which the import of
    the thread's export refuses (`agent.operations.transfer.parse`). Messages without an id get one from
    `add_messages`.

    Raises:
        InvalidRequest: naming the id; nothing is claimed or written.
    """
    seen: set[str] = set()
    for index, message in enumerate(messages):
        if message.id is None:
            continue
        check_id(f"input message {index}'s id", message.id)
        if message.id in seen:
            raise InvalidRequest(
                f"The input holds two messages with id {shown_id(message.id)} (a duplicate id): a message id names "
                "one message, and of two the later would replace the earlier. Send each message once, with an id "
                "of its own or none. Nothing was written.",
                thread_id=thread_id,
                message_id=message.id,
            )
        seen.add(message.id)


class ClaimHandoff:
    """A claim passed from the storage thread that waits for it to the task that asked for it.

    The task may be cancelled while the thread waits (a client that left, a queued background run cancelled from
    any replica): `abandon` then ends the wait at once (`ThreadStorage.claim`'s `abandoned`), and a claim the
    thread got anyway is never lost: either `deliver` refuses it (the thread releases it) or `abandon` returns it
    (the task releases it). Without this the wait went on to its turn, and the claim it got was held by nobody.
    """

    def __init__(self) -> None:
        self.abandoned = threading.Event()
        self._lock = threading.Lock()
        self._claim: Claim | None = None

    def deliver(self, claim: Claim) -> bool:
        """From the storage thread: hand `claim` over; False when the task abandoned it (release it then)."""
        with self._lock:
            if self.abandoned.is_set():
                return False
            self._claim = claim
            return True

    def abandon(self) -> Claim | None:
        """From the task, once it will not take the result: end the wait; the claim delivered meanwhile, if any."""
        with self._lock:
            self.abandoned.set()
            return self._claim

    async def abandon_and_release(self, in_io: Callable[..., Awaitable[Any]], parts: TurnParts) -> None:
        """From the task that failed or was cancelled while it waited: end the wait, release a claim got meanwhile
        (shielded, so a second cancellation cannot leak it)."""
        lost = self.abandon()
        if lost is not None:
            await asyncio.shield(in_io(parts.storage.release, lost))


def claim(parts: TurnParts, thread_id: str, args: TurnArgs, abandoned: threading.Event | None = None) -> Claim:
    """Claim `thread_id` for the turn `args` asks for, by its strategy (`ThreadStorage.claim` raises); the wait
    ends when `abandoned` is set.

    A `steer` turn whose messages can join another turn offers them to the running one (`steer`).

    A request with an idempotency key tries first without waiting (`reject`): when the thread is busy with
    the first request of its key (or that one just committed), the claim raises `ThreadBusy`, for
    `Idempotency.claim_or_result` to wait for that request's result. Under its own strategy it would stop
    the first request (`interrupt`, `rollback`), join it (`steer`), or queue behind it and call the model
    once more (`enqueue`). A thread busy with another turn is then claimed under the request's strategy.
    """
    strategy = strategy_of(parts, args)
    key = None if args.idempotency_key is None else claim_key(args.user_id, args.idempotency_key)

    def claim_by(strategy: str) -> Claim:
        return parts.storage.claim(
            thread_id,
            user_id=args.user_id,
            checkpoint_id=args.checkpoint_id,
            strategy=strategy,  # type: ignore[arg-type]
            timeout=parts.settings.enqueue_timeout,
            idempotency_key=key,
            steer=steer.offer(parts, args) if strategy == "steer" and steer.can_join(args) else None,
            abandoned=abandoned,
        )

    if key is None or strategy == "reject":
        return claim_by(strategy)
    try:
        return claim_by("reject")
    except ThreadBusy:
        state = parts.storage.find_idempotent(args.user_id or ANONYMOUS, args.idempotency_key, key)
        if state.response is not None or state.running_thread_id is not None:
            raise
    return claim_by(strategy)


def claim_for(parts: TurnParts, thread_id: str, args: TurnArgs, handoff: ClaimHandoff) -> Claim:
    """`claim` for a task that may abandon `handoff` while it waits (a turn without a start to plan: a merge).

    Raises:
        TurnCancelled: `handoff` was abandoned; nothing is held.
    """
    held = claim(parts, thread_id, args, handoff.abandoned)
    if not handoff.deliver(held):
        parts.storage.release(held)
        raise TurnCancelled(f"The turn on thread {thread_id!r} was cancelled; nothing was written.", thread_id=thread_id)
    return held


def strategy_of(parts: TurnParts, args: TurnArgs) -> str:
    """The turn's multitask strategy: its own, else the agent's."""
    return args.strategy or parts.settings.multitask_strategy


def begin(parts: TurnParts, thread_id: str, args: TurnArgs, handoff: ClaimHandoff | None = None) -> tuple[Claim, Start]:
    """Claim the thread and decide where the turn starts; the claim is released if that fails, or if the task
    that asked abandoned `handoff` meanwhile.

    Raises:
        InvalidRequest: as `plan_start`, or a tool result of the input answers no tool call (`check_tool_results`).
        TurnCancelled: `handoff` was abandoned; nothing is held.
    """
    held = claim(parts, thread_id, args, handoff.abandoned if handoff is not None else None)
    try:
        begun = plan_start(parts, held, args)
        # A turn adds (a state update may replace). A steering request's messages may be in the head because
        # the running turn took them: `steer.settle` tells, after this.
        if args.edit_message_id is None and not args.regenerate and held.steered_into is None:
            sent = not_stored(begun.messages, begun.loaded, thread_id, begun.checkpoint_id)
            begun = dataclasses.replace(begun, messages=sent)
        check_tool_results(begun, args)
        if handoff is not None and not handoff.deliver(held):
            raise TurnCancelled(f"The turn on thread {thread_id!r} was cancelled; nothing was written.", thread_id=thread_id)
        return held, begun
    except BaseException:
        parts.storage.release(held)
        raise


def plan_start(parts: TurnParts, claim: Claim, args: TurnArgs) -> Start:
    """Where the turn starts and what it sends (authorizing the caller on the way).

    An edit or a regeneration may start at an earlier checkpoint than the requested one
    (`agent.operations.edits` decides, from the thread's tree of checkpoint summaries).
    """
    editing = args.edit_message_id is not None or args.regenerate
    resuming = args.resume is not None
    start = start_of(claim, args.user_id, args.checkpoint_id, new_thread_allowed=not (editing or resuming))
    if not editing:
        return answering(Start(start, list(args.messages), claim.start), args)
    storage, thread_id = parts.storage, claim.thread_id
    messages = claim.start.checkpoint["channel_values"].get("messages") or ()
    tree = read_tree(storage, thread_id)
    chain = tree.chain(start)
    fill_kept(storage, tree, chain)
    if args.regenerate:
        plan = plan_regenerate(tree, chain, messages, args.regenerate_message_id)
    else:
        plan = plan_edit(tree, chain, messages, args.edit_message_id, args.messages)
    if plan.checkpoint_id == start:
        return answering(Start(start, plan.messages, claim.start), args, replacing=True)
    loaded = storage.get_checkpoint(thread_id, plan.checkpoint_id)
    if loaded is None:  # the thread was deleted meanwhile
        raise checkpoint_not_found(thread_id, plan.checkpoint_id)
    return answering(Start(plan.checkpoint_id, plan.messages, loaded), args, replacing=True)


def answering(begun: Start, args: TurnArgs, *, replacing: bool = False) -> Start:
    """`begun` with what the turn does about the interrupts its start waits on (`interrupts.answer`).

    `replacing`: an edit or a regeneration, which sends again, in place of a user message already stored
    after the start, what the turn it replaces sent. Interrupts pending at the start were left unanswered
    by that message's turn (`cancel_interrupts`), so they are again, without being asked for once more
    (a regenerate sends no message to ask it with); the result names them (`cancelled_interrupts`).
    """
    pending = pending_interrupts(begun.loaded)
    thread_id = begun.loaded.config["configurable"]["thread_id"] if begun.loaded is not None else args.thread_id
    cancel = args.cancel_interrupts or replacing
    resume, cancelled = answer(pending, args.resume, cancel, thread_id, begun.checkpoint_id)
    return dataclasses.replace(begun, resume=resume, cancelled=cancelled)


def not_stored(
    messages: Sequence[BaseMessage], loaded: CheckpointTuple | None, thread_id: str, checkpoint_id: str | None
) -> list[BaseMessage]:
    """A turn's input less the messages its start checkpoint (`loaded`) holds already, unchanged: a client
    that keeps its own history may send the conversation again, as the items our output gave it. A message
    is stored already when one has its id; a tool call (a `function_call` item, whose id is its `call_id`),
    when a stored answer made the same calls; a tool result, when its call has that result.

    A turn appends: an input message with a stored message's id but another role, text, tool calls or tool
    call id would replace it where it stands (LangGraph's `add_messages`), rewriting the branch's past with
    no new branch; a tool call or result under a stored call id with other content would stand twice.

    Raises:
        InvalidRequest: naming the message and the ways to change one, or when every input message is stored
            already (nothing new to answer: `regenerate` asks for another answer); nothing is written (the
            turn has not run).
    """
    stored = () if loaded is None else loaded.checkpoint["channel_values"].get("messages") or ()
    if not messages or not stored:
        return list(messages)
    # Read the stored messages only when the input may repeat one: an id they hold (a `MessageList` knows its
    # ids: a turn on a long thread stays O(its input)), a tool call or a tool result.
    ids = stored.ids if isinstance(stored, MessageList) else None
    sent = frozenset(m.id for m in messages if m.id is not None)
    tools = any(m.type == "tool" or (m.type == "ai" and m.tool_calls) for m in messages)
    if ids is not None and ids.isdisjoint(sent) and not tools:
        return list(messages)
    by_id = {m.id: m for m in stored}
    calls = {call["id"]: m for m in stored if m.type == "ai" for call in m.tool_calls}
    results = {m.tool_call_id: m for m in stored if m.type == "tool"}
    kept = []
    for message in messages:
        twin, same = by_id.get(message.id) if message.id is not None else None, _same_message
        if twin is None and message.type == "ai" and message.tool_calls:
            twin, same = calls.get(message.tool_calls[0]["id"]), _same_calls  # the text may come in its own item
        elif twin is None and message.type == "tool":
            twin = results.get(message.tool_call_id)
        if twin is None:
            kept.append(message)
        elif not same(message, twin):
            raise InvalidRequest(
                f"The input holds a message with id {shown_id(message.id)} that stands for a message of checkpoint "
                f"{checkpoint_id!r} of thread {thread_id!r} (its id, or its tool call's) with other content: a turn "
                "adds messages. To change that one, send the new text with custom_inputs.edit_message_id (a new "
                "branch) or use update_checkpoint_state; to add a message, send it without an id. Nothing was written.",
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
                message_id=message.id,
            )
    if not kept:
        named = ", ".join(f"call {shown_id(m.tool_call_id)}" if m.type == "tool" else shown_id(m.id) for m in messages)
        raise InvalidRequest(
            f"Every message of the input ({named}) is a message of checkpoint {checkpoint_id!r} of thread "
            f"{thread_id!r} already (sent again unchanged; a tool call's result is stored once): a turn needs a new "
            "message. For another answer to the last one, send custom_inputs.regenerate: true. Nothing was written.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    return kept


def _same_message(sent: BaseMessage, stored: BaseMessage) -> bool:
    """Whether `sent` says what `stored` says: role, text, tool calls (id, name, arguments), tool call id."""
    return (
        sent.type == stored.type
        and sent.text == stored.text
        and _same_calls(sent, stored)
        and getattr(sent, "tool_call_id", None) == getattr(stored, "tool_call_id", None)
    )


def _same_calls(sent: BaseMessage, stored: BaseMessage) -> bool:
    """Whether both make the same tool calls (id, name, arguments), in order."""
    calls = lambda m: [(c["id"], c["name"], c["args"]) for c in getattr(m, "tool_calls", None) or ()]  # noqa: E731
    return calls(sent) == calls(stored)


def check_tool_results(begun: Start, args: TurnArgs, *, field: str = "input") -> None:
    """Refuse a turn whose input holds a tool result that answers no tool call waiting for one.

    The input's results stand right after their calls (`agent.messages.to_langchain` pairs them by
    `call_id`); one whose call is not in the input must answer a call the start checkpoint's messages
    end with. Anything else (a call nobody made, a call already answered, or one that later messages
    closed) would be stored for a model that never sees it: `agent.context.repair` leaves such a result
    out of the model's input. A state update (`update_checkpoint_state`, which does not run `begin`) may
    still store one: that is an edit of the record, which the model-input repair copes with; the
    Conversations API's item writes, which add items as a turn's input would, call this too
    (`updates.update_state(answered_tool_results=True)`).

    `field` is the request field the messages came in (`items` for the Conversations API), for the message.

    Raises:
        InvalidRequest: naming the result's `call_id`; nothing is written (the turn has not run).
    """
    if not any(message.type == "tool" for message in args.messages):
        return
    history = () if begun.loaded is None else begun.loaded.checkpoint["channel_values"].get("messages") or ()
    # Copies: add_messages gives each message without an id one, in place, and the turn sends the originals.
    copies = {id(message): message.model_copy() for message in args.messages}
    sent = [copies.get(id(message), message) for message in begun.messages]
    from_input = {id(copy) for copy in copies.values()}
    # As the graph will apply them (an input message with a stored message's id replaces it).
    after = add_messages(list(history), sent)
    for kind, message in pairing_walk(after):
        if kind == "stray" and id(message) in from_input:
            calls = {call["id"] for m in after if m.type == "ai" for call in m.tool_calls}
            if message.tool_call_id in calls:
                reason = "that call has a result already, or messages after it left it without one"
            elif begun.loaded is None:
                reason = f"no function_call in the {field} has that call_id, and the thread is new"
            else:
                reason = f"no function_call in the {field} or in checkpoint {begun.checkpoint_id!r} has that call_id"
            raise InvalidRequest(
                f"{field}: the function_call_output for call_id {message.tool_call_id!r} answers no tool call "
                f"waiting for a result ({reason}); send it with its function_call, or right after the call it "
                "answers. Nothing was written.",
                thread_id=args.thread_id,
                checkpoint_id=begun.checkpoint_id,
            )


def start_of(claim: Claim, user_id: str | None, checkpoint_id: str | None, *, new_thread_allowed: bool = True) -> str | None:
    """The checkpoint a turn starts from; the one owner of the "head unless branching" rule.

    None for a new thread (it starts from a root checkpoint written with its first turn).

    Raises:
        ThreadNotFound: the thread is someone else's, or has no checkpoints while `checkpoint_id` is given.
        CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
    """
    record, thread_id = claim.record, claim.thread_id
    if record is None and checkpoint_id is None and new_thread_allowed:
        return None
    # Also for a thread without checkpoints: worded as for someone else's thread.
    authorize(record, thread_id, user_id)
    if checkpoint_id is None:
        return record.head_checkpoint_id
    if claim.start is None:
        raise checkpoint_not_found(thread_id, checkpoint_id)
    return checkpoint_id


def prepare(parts: TurnParts, claim: Claim, args: TurnArgs, begun: Start) -> tuple[Turn, str, dict]:
    """The turn's buffer (with the id its checkpoint will have, `Turn.head_id`), its start checkpoint id,
    and the graph config that starts there."""
    turn = Turn(thread_id=claim.thread_id, record=claim.record)
    start = begun.checkpoint_id
    if start is None:
        start = add_root(parts.storage.saver, turn)
    else:
        turn.loaded[start] = begun.loaded
    # Made after the claim and the root, so it sorts after the start checkpoint (`Turn.name_head`).
    turn.head_id = str(uuid6(clock_seq=-1))
    config = graph_config(claim.thread_id, start)
    context = TurnContext(
        thread_id=claim.thread_id,
        user_id=args.user_id,
        start_checkpoint_id=start,
        instructions=args.instructions,
        max_context_tokens=args.max_context_tokens,
        window=parts.window,
    )
    config["configurable"][TURN_CONTEXT_KEY] = context
    # The same dict, for the saver: it copies what the model was sent into the turn's checkpoint metadata.
    config["configurable"][TURN_REPORT_KEY] = context.report
    return turn, start, config


def recall(
    parts: TurnParts,
    turn: Turn,
    start: str,
    user_id: str | None,
    sent: list[BaseMessage],
    config: dict,
    primed: Primed | None = None,
) -> None:
    """Put the user's long-term memories for this turn into its TurnContext (a read; no connection kept).

    `primed`: the memory reads started before the claim (`TurnRunner._prime_recall`)."""
    if parts.memories is None or user_id is None:
        return
    memories = parts.memories.recall(user_id, sent, messages_of(turn, start), primed=primed)
    if memories:
        configurable = config["configurable"]
        configurable[TURN_CONTEXT_KEY] = dataclasses.replace(configurable[TURN_CONTEXT_KEY], memories=memories)


def add_root(saver: Any, turn: Turn) -> str:
    """Buffer a new thread's root: an empty checkpoint before its first message (source `root`, step -1).

    Buffered like every write of the turn, so a first turn that fails leaves nothing, not even its root.
    """
    checkpoint = empty_checkpoint()
    with saver.buffering(turn):
        saver.put(
            {"configurable": {"thread_id": turn.thread_id, "checkpoint_ns": ""}},
            checkpoint,
            {"source": ROOT_SOURCE, "step": -1, "parents": {}},
            {},
        )
    return checkpoint["id"]


def graph_config(thread_id: str, checkpoint_id: str) -> dict:
    """The graph config that runs (or updates the state) from `checkpoint_id` of `thread_id`."""
    # checkpoint_ns is explicit: SqliteSaver.put_writes needs it (KeyError otherwise).
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}


def stored_messages(turn: Turn, checkpoint_id: str) -> Sequence[BaseMessage]:
    """The messages of a checkpoint the turn loaded, as stored (a `MessageList` that may know its ids: not copied)."""
    loaded = turn.loaded.get(checkpoint_id)
    return () if loaded is None else loaded.checkpoint["channel_values"].get("messages") or ()


def messages_of(turn: Turn, checkpoint_id: str) -> list[BaseMessage]:
    """The messages of a checkpoint the turn loaded (or buffered, as a new thread's root)."""
    loaded = turn.loaded.get(checkpoint_id)
    if loaded is None:
        return []
    return list(loaded.checkpoint["channel_values"].get("messages") or ())
