"""Turns: claim the thread, run the graph with its writes buffered, commit. Synchronous and async.

A turn (see `agent.storage.base` for why it is built this way):

1. **Claim** the thread (one short round trip, which also reads the thread
   record and the start checkpoint). A stranger's thread answers ThreadNotFound.
2. **Prepare**: authorize; pick the start ("head unless branching", the one
   owner of that rule is `_start_of`); a new thread gets its empty **root**
   checkpoint first, so that its first message can be edited like any other.
3. **Run** the graph (`graph.stream`, or `graph.astream` on the async path)
   with every checkpoint and write buffered in memory. No connection is held.
   The claim is renewed meanwhile; if a newer turn asks this one to stop
   (`interrupt` / `rollback`), the run stops at its next step.
4. **Commit** (one short transaction) or **release** (nothing written). The commit also
   applies the long-term memory operations among the turn's new messages (`agent.memory`).

Between 2 and 3 the user's long-term memories for the turn are read (`_recall`)
and handed to the model-input pipeline in the turn's `TurnContext`.

An edit (`edit_message_id`) or a regeneration starts elsewhere, with other
messages: `agent.operations.edits` decides where and what, reading only the
thread's tree of checkpoint summaries and the start checkpoint (done with
the claim, on the storage thread pool on the async path).

A turn with an idempotency key first looks it up, and its commit stores its
result under the key (`idempotency`): a retry gets that result as a
`StoredResponse` instead of a run.

Stopping early: a newer turn's `interrupt` or `rollback` (or a claim found
lost) sets `claim.stop`. The async path cancels the pending step at once,
model request included. The sync path cannot cancel a task LangGraph runs
on a worker thread (closing `graph.stream` waits for it), so a callback
stops a streaming model at its next token (`_StopOnSignal`); a model call
that streams nothing (the offline model's `invoke`) ends first, and the turn
stops at the next graph step.

The async path (`arun`) is what the HTTP server uses: the model call is an
awaited HTTP request, storage calls run on a small thread pool, and a client
that leaves cancels the task, which cancels the model request and releases
the thread at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.errors import InvalidUpdateError
from langgraph.graph import START
from langgraph.types import Command
from langgraph.graph.state import CompiledStateGraph

from agent.config import AgentSettings, MultitaskStrategy
from agent.context import TURN_CONTEXT_KEY, TurnContext
from agent.context.summaries import edit_keeps_summary
from agent.errors import InvalidRequest, LeaseExpired, TurnCancelled
from agent.messages import to_output_items
from agent.operations.access import authorize, checkpoint_not_found
from agent.operations.catalogue import default_title
from agent.operations.edits import plan_edit, plan_regenerate, position_of, removals
from agent.operations.idempotency import Idempotency, claim_key
from agent.operations.interrupts import answer, pending_interrupts, stopped_at
from agent.operations.tree import fill_kept, read_tree
from agent.state import CONTEXT_SUMMARY_CHANNEL
from agent.storage import Claim, ThreadStorage, Turn, Tx
from agent.storage.base import IdempotencyKeyTaken
from agent.storage.summaries import TURN_REPORT_KEY
from agent.types import NewMessages, StoredResponse, TextDelta, TurnResult

if TYPE_CHECKING:
    from agent.context.window import ContextWindow
    from agent.memory.service import Memories
    from agent.operations.turn_options import Resume

TurnEvent = TextDelta | NewMessages | TurnResult | StoredResponse

#: The Responses API role of each LangChain message type, for errors.
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
#: The key under which LangGraph's "updates" stream reports a run's pending interrupts.
INTERRUPT = "__interrupt__"
#: The metadata `source` of a thread's root checkpoint.
ROOT_SOURCE = "root"


@dataclass(frozen=True)
class TurnArgs:
    """What one turn needs: the new messages, and where and how to run them."""

    messages: Sequence[BaseMessage]
    thread_id: str | None
    """None starts a new thread with a new id."""
    user_id: str | None
    checkpoint_id: str | None = None
    """Start from this checkpoint (a branch) instead of the head."""
    strategy: MultitaskStrategy | None = None
    """None: the agent's `multitask_strategy`."""
    idempotency_key: str | None = None
    """A retry with the same key (and `request_hash`) gets the first result (`agent.operations.idempotency`)."""
    request_hash: str | None = None
    """The request's fingerprint (`idempotency.request_fingerprint`); set whenever `idempotency_key` is."""
    instructions: str | None = None
    """A system message for this turn only (not stored)."""
    store: bool = True
    """False: run from the requested state and write nothing (OpenAI's `store: false`); the claim is released."""
    max_context_tokens: int | None = None
    """This turn's token budget for the model's input (None: the agent's setting)."""
    edit_message_id: str | None = None
    """Put `messages` in place of this message of the start checkpoint (a sibling branch; see `edits`)."""
    regenerate: bool = False
    """Answer the start checkpoint's last user message again (`messages` empty; see `edits`)."""
    metadata: Mapping[str, str] | None = None
    """Stored with the thread when this turn creates it (`catalogue`); ignored on an existing thread."""
    resume: Resume | None = None
    """Answer the start checkpoint's pending interrupts instead of sending messages (`interrupts`)."""
    cancel_interrupts: bool = False
    """Send `messages` although interrupts wait at the start (they stay unanswered there)."""


@dataclass(frozen=True)
class _Start:
    """Where a turn starts (None: a new thread, from its root) and the messages it sends."""

    checkpoint_id: str | None
    messages: list[BaseMessage]
    loaded: CheckpointTuple | None = None
    """The start checkpoint, as read with the claim (so the run reads nothing)."""
    resume: Resume | None = None
    """Answer the start's pending interrupts (`messages` is then empty)."""
    cancelled: tuple[str, ...] = ()
    """The start's pending interrupts this turn leaves unanswered."""

    def graph_input(self) -> Any:
        """What the graph runs on: LangGraph's `Command(resume=...)`, or the new messages."""
        if self.resume is not None:
            return Command(resume=self.resume.value)
        return {"messages": list(self.messages)}


@dataclass
class _Progress:
    """What a running turn has produced so far (kept if it is interrupted)."""

    produced: list[BaseMessage] = field(default_factory=list)
    partial: dict[str, str] = field(default_factory=dict)  # streamed text of messages not finished yet, by id
    interrupts: list[Any] = field(default_factory=list)  # LangGraph `Interrupt`s the run stopped at
    unconverted: bool = False  # a node returned messages as dicts or tuples (add_messages converts them)

    def events(self, mode: str, chunk: Any, stream_tokens: bool) -> Iterator[TextDelta | NewMessages]:
        if mode == "messages":
            token, meta = chunk
            # From any node of the graph (a user's graph names its own); LangGraph leaves out calls tagged "nostream".
            if isinstance(token, AIMessageChunk) and token.text:
                self.partial[token.id] = self.partial.get(token.id, "") + token.text
                if stream_tokens:
                    yield TextDelta(item_id=token.id, text=token.text)
            return
        for node, update in chunk.items():
            if node == INTERRUPT:
                self.interrupts.extend(update)
                continue
            if not isinstance(update, Mapping) or not update.get("messages"):
                continue
            messages = update["messages"]
            # A node may return one message rather than a list, and dicts (add_messages takes all of them).
            given = messages if isinstance(messages, list) else [messages]
            messages = [m for m in given if isinstance(m, BaseMessage)]
            self.unconverted = self.unconverted or len(messages) < len(given)
            if messages:
                for message in messages:
                    self.partial.pop(message.id, None)
                self.produced.extend(messages)
                yield NewMessages(messages)

    def stored_events(self, turn: Turn, start: str) -> Iterator[NewMessages]:
        """The new messages of the turn's last checkpoint that the stream gave in another form (a node's dict
        messages, which add_messages converted and gave ids): reported as stored, so the client gets their ids."""
        if not self.unconverted or not turn.puts:
            return
        known = {m.id for m in _messages_of(turn, start)} | {m.id for m in self.produced}
        head = turn.puts[-1][1]["channel_values"].get("messages") or []
        missing = [m for m in head if isinstance(m, BaseMessage) and m.id not in known]
        if missing:
            self.produced.extend(missing)
            yield NewMessages(missing)

    def kept(self) -> list[BaseMessage]:
        """The finished messages, and the unfinished reply's text so far as a message marked interrupted."""
        kept = list(self.produced)
        for item_id, text in self.partial.items():
            kept.append(AIMessage(content=text, id=item_id, response_metadata={"interrupted": True}))
        return kept


class _Stopped(BaseException):
    """Raised inside a streaming model call of a sync turn that was asked to stop.

    A BaseException, so that neither the agent node's model-error handling nor
    LangChain's and LangGraph's `except Exception` handlers take it for a failure.
    """


class _StopOnSignal(BaseCallbackHandler):
    """Ends a sync turn's streaming model call at its next token once the claim was signalled."""

    raise_error = True

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        if self.claim.stop.is_set():
            raise _Stopped()


class TurnRunner:
    """Runs turns and state updates on one agent's storage and graph."""

    def __init__(
        self,
        storage: ThreadStorage,
        graph: CompiledStateGraph,
        settings: AgentSettings,
        memories: Memories | None = None,
        window: ContextWindow | None = None,
        answer_node: str | None = None,
    ) -> None:
        self.storage = storage
        self.graph = graph
        #: The agent's context window, handed to a user graph's own model node in each TurnContext.
        self.window = window
        #: The node a state update is written as (the built-in graph's "agent"); None: LangGraph infers it.
        self.answer_node = answer_node
        self.settings = settings
        self.idempotency = Idempotency(storage, settings)
        self.memories = memories
        # Storage calls of the async path: short, but blocking. Sized so that
        # waiting for a pooled connection never starves other work.
        self._io = ThreadPoolExecutor(max_workers=2 * settings.pool_max_size + 4, thread_name_prefix="tt-storage")

    def close(self) -> None:
        self._io.shutdown(wait=False, cancel_futures=True)

    # -- sync ----------------------------------------------------------------------------------
    def run(self, args: TurnArgs, *, stream_tokens: bool) -> Iterator[TurnEvent]:
        """Run one turn; yields text deltas (if `stream_tokens`), new messages, and last a `TurnResult`.

        Nothing is written unless the turn finishes: the `TurnResult` comes after the commit.
        A request whose idempotency key already has a stored result yields only that
        `StoredResponse` (the model is not called).

        Raises:
            ThreadNotFound: the thread belongs to someone else, or has no checkpoints while
                `checkpoint_id` is given.
            CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
            ThreadBusy: another turn holds the thread (see `multitask_strategy`).
            TurnCancelled: a newer turn rolled this one back (`rollback`).
            InvalidRequest: the idempotency key was used for a different request; `edit_message_id` is not in
                the start checkpoint, or `regenerate` finds no user message; `max_context_tokens` is above the
                agent's (nothing is claimed or written).
            LeaseExpired, ModelError, StorageUnavailable: the claim, the model or the database failed.
        """
        self._check_budget(args)
        if args.idempotency_key is not None:
            stored = self.idempotency.lookup(args.user_id, args.idempotency_key, args.request_hash)
            if stored is not None:
                yield stored
                return
        thread_id = args.thread_id or str(uuid.uuid4())
        claim, begun = self._begin(thread_id, args)
        done = False
        try:
            turn, start, config = self._prepare(claim, args, begun)
            config["callbacks"] = [_StopOnSignal(claim)]
            self._recall(turn, start, args.user_id, begun.messages, config)
            progress = _Progress()
            with self.storage.saver.buffering(turn):
                stream = self.graph.stream(
                    begun.graph_input(), config, stream_mode=_modes(stream_tokens), durability="exit"
                )
                try:
                    for mode, chunk in stream:
                        yield from progress.events(mode, chunk, stream_tokens)
                        if claim.stop.is_set():
                            break
                except _Stopped:
                    pass  # `_finish` does what the stop asked for
                finally:
                    stream.close()
            yield from progress.stored_events(turn, start)
            result = self._finish(claim, turn, start, args, begun, progress)
            done = True
            yield result
        finally:
            if not done:
                self.storage.release(claim)

    def update_state(
        self,
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
        removed first (`edits.removals`: a tool call's results go with it).
        `edit_message_id`: the one message of `messages` takes that message's id,
        so it replaces it in place (the way to edit in place when the request's
        items lost their ids; see `requests.ItemIdsRequest`).
        Replacing or removing a message the branch's context summary stands for
        retires the summary (`agent.context.summaries.edit_keeps_summary`).

        Raises:
            ThreadNotFound, CheckpointNotFound, ThreadBusy, StorageUnavailable: as for `run`.
            InvalidRequest: nothing to apply (no messages, no removals); the idempotency key was used for a
                different request; a `remove_message_ids` or `edit_message_id` id is not in the checkpoint, an
                edit changes the message's role, or removing leaves no message.
        """
        if not messages and not remove_message_ids and not new_thread:
            raise InvalidRequest(
                "update_checkpoint_state needs input messages or remove_message_ids: there is nothing to apply, "
                "and nothing was written (set_head moves the head without writing)."
            )
        args = TurnArgs(messages, thread_id, user_id, checkpoint_id, strategy, idempotency_key, request_hash, metadata=metadata)
        if idempotency_key is not None:
            stored = self.idempotency.lookup(user_id, idempotency_key, request_hash)
            if stored is not None:
                return _result_of(stored)
        claim = self._claim(thread_id, args)
        try:
            if not (new_thread and claim.record is None):
                authorize(claim.record, thread_id, user_id)
            begun = self._start(claim, args)
            current = claim.start.checkpoint["channel_values"].get("messages") or () if claim.start is not None else ()
            if edit_message_id is not None:
                replaced = current[position_of(current, edit_message_id, thread_id=thread_id, checkpoint_id=begun.checkpoint_id)]
                if messages[0].type != replaced.type:
                    raise InvalidRequest(
                        f"An edit keeps the message's role: message {edit_message_id!r} is a {_ROLES[replaced.type]} "
                        f"message, the new one a {_ROLES[messages[0].type]} message. Nothing was written.",
                        thread_id=thread_id,
                        message_id=edit_message_id,
                    )
                messages = [message.model_copy(update={"id": replaced.id}) for message in messages]
                begun = _Start(begun.checkpoint_id, messages, begun.loaded)
            if remove_message_ids:
                removed = removals(
                    current, remove_message_ids, thread_id=thread_id, checkpoint_id=begun.checkpoint_id, adding=len(messages)
                )
                begun = _Start(begun.checkpoint_id, [*removed, *messages], begun.loaded)
            turn, start, config = self._prepare(claim, args, begun)
            if claim.record is None and not begun.messages:
                # A new thread and nothing to add (an empty conversation): its root is the whole thread.
                result = TurnResult(thread_id, turn.new_head, None)
                outcome = self._commit(claim, turn, args, result, [])
                return outcome if isinstance(outcome, TurnResult) else _result_of(outcome)
            values: dict[str, Any] = {"messages": list(begun.messages)}
            if (
                CONTEXT_SUMMARY_CHANNEL in self.graph.channels
                and begun.loaded is not None
                and not edit_keeps_summary(begun.loaded.checkpoint["channel_values"], begun.messages)
            ):
                values[CONTEXT_SUMMARY_CHANNEL] = None
            with self.storage.saver.buffering(turn):
                self._update(config, values)
            result = TurnResult(thread_id, turn.new_head, start)
            outcome = self._commit(claim, turn, args, result, [])
        except BaseException:
            self.storage.release(claim)
            raise
        return outcome if isinstance(outcome, TurnResult) else _result_of(outcome)

    # -- async -----------------------------------------------------------------------------------
    async def arun(self, args: TurnArgs, *, stream_tokens: bool) -> AsyncIterator[TurnEvent]:
        """`run` on the event loop: the same events, errors and guarantees.

        Cancelling the task (a client that left) stops the model request and releases the thread at once.
        """
        self._check_budget(args)
        if args.idempotency_key is not None:
            stored = await self.idempotency.alookup(args.user_id, args.idempotency_key, args.request_hash, self.in_io)
            if stored is not None:
                yield stored
                return
        thread_id = args.thread_id or str(uuid.uuid4())
        claim, begun = await self.in_io(self._begin, thread_id, args)
        done = False
        try:
            turn, start, config = self._prepare(claim, args, begun)
            await self.in_io(self._recall, turn, start, args.user_id, begun.messages, config)
            progress = _Progress()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            claim.on_stop(lambda: loop.call_soon_threadsafe(stop.set))
            with self.storage.saver.buffering(turn):
                stream = self.graph.astream(
                    begun.graph_input(), config, stream_mode=_modes(stream_tokens), durability="exit"
                )
                try:
                    async for mode, chunk in _until(stream, stop):
                        for event in progress.events(mode, chunk, stream_tokens):
                            yield event
                finally:
                    await stream.aclose()
            for event in progress.stored_events(turn, start):
                yield event
            result = await self.in_io(self._finish, claim, turn, start, args, begun, progress)
            done = True
            yield result
        finally:
            if not done:
                await asyncio.shield(self.in_io(self.storage.release, claim))

    async def in_io(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the storage thread pool, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self._io, functools.partial(function, *args))

    # -- steps ------------------------------------------------------------------------------------
    def _check_budget(self, args: TurnArgs) -> None:
        """A turn may ask for a smaller token budget than the agent's `max_context_tokens`, never a larger one."""
        limit = self.settings.max_context_tokens
        if args.max_context_tokens is not None and limit is not None and args.max_context_tokens > limit:
            raise InvalidRequest(
                f"max_context_tokens {args.max_context_tokens} is above this agent's max_context_tokens ({limit}); "
                f"ask for at most {limit}."
            )

    def _claim(self, thread_id: str, args: TurnArgs) -> Claim:
        return self.storage.claim(
            thread_id,
            user_id=args.user_id,
            checkpoint_id=args.checkpoint_id,
            strategy=args.strategy or self.settings.multitask_strategy,
            timeout=self.settings.enqueue_timeout,
            idempotency_key=None if args.idempotency_key is None else claim_key(args.user_id, args.idempotency_key),
        )

    def _begin(self, thread_id: str, args: TurnArgs) -> tuple[Claim, _Start]:
        """Claim the thread and decide where the turn starts; the claim is released if that fails."""
        claim = self._claim(thread_id, args)
        try:
            return claim, self._start(claim, args)
        except BaseException:
            self.storage.release(claim)
            raise

    def _start(self, claim: Claim, args: TurnArgs) -> _Start:
        """Where the turn starts and what it sends (authorizing the caller on the way)."""
        editing = args.edit_message_id is not None or args.regenerate
        resuming = args.resume is not None
        start = self._start_of(claim, args.user_id, args.checkpoint_id, new_thread_allowed=not (editing or resuming))
        if not editing:
            return self._answering(_Start(start, list(args.messages), claim.start), args)
        thread_id = claim.thread_id
        messages = claim.start.checkpoint["channel_values"].get("messages") or ()
        tree = read_tree(self.storage, thread_id)
        chain = tree.chain(start)
        fill_kept(self.storage, tree, chain)
        if args.regenerate:
            plan = plan_regenerate(tree, chain, messages)
        else:
            plan = plan_edit(tree, chain, messages, args.edit_message_id, args.messages)
        if plan.checkpoint_id == start:
            return self._answering(_Start(start, plan.messages, claim.start), args)
        loaded = self.storage.get_checkpoint(thread_id, plan.checkpoint_id)
        if loaded is None:  # the thread was deleted meanwhile
            raise checkpoint_not_found(thread_id, plan.checkpoint_id)
        return self._answering(_Start(plan.checkpoint_id, plan.messages, loaded), args)

    @staticmethod
    def _answering(begun: _Start, args: TurnArgs) -> _Start:
        """`begun` with what the turn does about the interrupts its start waits on (`interrupts.answer`)."""
        pending = pending_interrupts(begun.loaded)
        thread_id = begun.loaded.config["configurable"]["thread_id"] if begun.loaded is not None else args.thread_id
        resume, cancelled = answer(pending, args.resume, args.cancel_interrupts, thread_id, begun.checkpoint_id)
        return dataclasses.replace(begun, resume=resume, cancelled=cancelled)

    def _prepare(self, claim: Claim, args: TurnArgs, begun: _Start) -> tuple[Turn, str, dict]:
        """The turn's buffer, its start checkpoint id, and the graph config that starts there."""
        turn = Turn(thread_id=claim.thread_id, record=claim.record)
        start = begun.checkpoint_id
        if start is None:
            start = _add_root(self.storage.saver, turn)
        else:
            turn.loaded[start] = begun.loaded
        config = _config(claim.thread_id, start)
        context = TurnContext(
            thread_id=claim.thread_id,
            user_id=args.user_id,
            start_checkpoint_id=start,
            instructions=args.instructions,
            max_context_tokens=args.max_context_tokens,
            window=self.window,
        )
        config["configurable"][TURN_CONTEXT_KEY] = context
        # The same dict, for the saver: it copies what the model was sent into the turn's checkpoint metadata.
        config["configurable"][TURN_REPORT_KEY] = context.report
        return turn, start, config

    def _recall(self, turn: Turn, start: str, user_id: str | None, sent: list[BaseMessage], config: dict) -> None:
        """Put the user's long-term memories for this turn into its TurnContext (a read; no connection kept)."""
        if self.memories is None or user_id is None:
            return
        memories = self.memories.recall(user_id, sent, _messages_of(turn, start))
        if memories:
            configurable = config["configurable"]
            configurable[TURN_CONTEXT_KEY] = dataclasses.replace(configurable[TURN_CONTEXT_KEY], memories=memories)

    @staticmethod
    def _start_of(
        claim: Claim, user_id: str | None, checkpoint_id: str | None, *, new_thread_allowed: bool = True
    ) -> str | None:
        """The checkpoint a turn starts from; the one owner of the "head unless branching" rule.

        None for a new thread (it starts from a root checkpoint written with its first turn).
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

    def _finish(
        self, claim: Claim, turn: Turn, start: str, args: TurnArgs, begun: _Start, progress: _Progress
    ) -> TurnResult | StoredResponse:
        """Commit the turn (or, when a newer turn asked it to stop, what that asks for).

        Returns the stored result of another request instead when that one committed the same
        idempotency key first (this turn then wrote nothing).
        """
        status = "completed"
        if claim.stop.is_set():
            if claim.lost:
                raise LeaseExpired(
                    f"The turn's claim on thread {claim.thread_id!r} expired and another turn took the thread; "
                    "nothing was written.",
                    thread_id=claim.thread_id,
                )
            if claim.cancel == "rollback":
                raise TurnCancelled(
                    f"A newer turn on thread {claim.thread_id!r} rolled this turn back; nothing was written.",
                    thread_id=claim.thread_id,
                )
            if claim.cancel == "interrupt":
                self._keep_interrupted(turn, start, begun.messages, progress)
                status = "interrupted"
        waiting = tuple(stopped_at(progress.interrupts, turn.writes)) if status == "completed" else ()
        result = TurnResult(
            claim.thread_id, turn.new_head, start, status, interrupts=waiting, cancelled_interrupts=begun.cancelled
        )
        return self._commit(claim, turn, args, result, to_output_items(progress.produced))

    def _commit(
        self, claim: Claim, turn: Turn, args: TurnArgs, result: TurnResult, output: list[dict]
    ) -> TurnResult | StoredResponse:
        """Commit `turn`, and with an idempotency key its response (`output` and `result`) in the same transaction.

        A `store: false` turn is released instead: nothing of it is written, not even a new thread's root.
        """
        if not args.store:
            self.storage.release(claim)
            existing = claim.record is not None
            return TurnResult(
                claim.thread_id if existing else None,
                None,
                result.parent_checkpoint_id if existing else None,
                result.status,
                unstored_response_id=f"resp_{uuid.uuid4().hex}",
            )
        apply = functools.partial(self._write_turn, turn, result.parent_checkpoint_id, args)
        if args.idempotency_key is None:
            self.storage.commit(claim, apply)
            return result
        response = StoredResponse(output=output, custom_outputs=result.as_dict())
        try:
            self.storage.commit(
                claim,
                self.idempotency.storing(
                    apply, user_id=args.user_id, key=args.idempotency_key, request_hash=args.request_hash, response=response
                ),
            )
        except IdempotencyKeyTaken:
            self.storage.release(claim)  # the failed commit rolled back its release too
            return self.idempotency.after_race(args.user_id, args.idempotency_key, args.request_hash)
        return result

    def _write_turn(self, turn: Turn, start: str, args: TurnArgs, tx: Tx) -> None:
        """The commit of a turn: `_write`, and the memory tools' results among its new messages.

        A turn that creates its thread also gives it its default title and `args.metadata` (`catalogue`).
        """
        user_id = args.user_id
        if turn.record is None:
            _write(turn, user_id, tx, title=default_title(args.messages), metadata=args.metadata)
        else:
            _write(turn, user_id, tx)
        if self.memories is not None and user_id is not None and turn.puts:
            head = turn.puts[-1][1]
            new = list(head["channel_values"].get("messages") or ())[len(_messages_of(turn, start)) :]
            self.memories.write_turn(new, user_id=user_id, thread_id=turn.thread_id, checkpoint_id=head["id"])

    def _keep_interrupted(self, turn: Turn, start: str, sent: list[BaseMessage], progress: _Progress) -> None:
        """Replace what the stopped run buffered with one checkpoint: the input and what it produced."""
        turn.puts = [put for put in turn.puts if put[2].get("source") == ROOT_SOURCE]
        turn.writes = []
        config = {**_config(turn.thread_id, start), "metadata": {"interrupted": True}}
        with self.storage.saver.buffering(turn):
            self._update(config, {"messages": [*sent, *progress.kept()]})

    def _update(self, config: dict, values: dict[str, Any]) -> None:
        """`graph.update_state` as the node that answers, so the new checkpoint's next step follows that
        node's edges (the built-in graph: tools if the last message asks for one, else the end).

        A user's graph: the node LangGraph infers (the last one that wrote the state; START on a root),
        and START when two nodes wrote it last (LangGraph's "Ambiguous update").
        """
        try:
            self.graph.update_state(config, values, as_node=self.answer_node)
        except InvalidUpdateError:
            if self.answer_node is not None:
                raise
            self.graph.update_state(config, values, as_node=START)


def _write(
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


def _result_of(stored: StoredResponse) -> TurnResult:
    """A state update's stored result as the TurnResult it was (its output is always empty)."""
    outputs = stored.custom_outputs
    return TurnResult(outputs["thread_id"], outputs["checkpoint_id"], outputs["parent_checkpoint_id"], outputs.get("status", "completed"))


def _messages_of(turn: Turn, checkpoint_id: str) -> list[BaseMessage]:
    """The messages of a checkpoint the turn loaded (or buffered, as a new thread's root)."""
    loaded = turn.loaded.get(checkpoint_id)
    if loaded is None:
        return []
    return list(loaded.checkpoint["channel_values"].get("messages") or ())


def _add_root(saver: Any, turn: Turn) -> str:
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


def _modes(stream_tokens: bool) -> list[str]:
    # "messages" makes LangGraph stream the model's reply token by token; without it
    # the model is called once for the whole reply (a JSON request, not SSE).
    return ["messages", "updates"] if stream_tokens else ["updates"]


def _config(thread_id: str, checkpoint_id: str) -> dict:
    # checkpoint_ns is explicit: SqliteSaver.put_writes needs it (KeyError otherwise).
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}


async def _until(stream: AsyncIterator[Any], stop: asyncio.Event) -> AsyncIterator[Any]:
    """The items of `stream` until it ends or `stop` is set (then the pending step is cancelled)."""
    iterator = stream.__aiter__()
    stopped = asyncio.ensure_future(stop.wait())
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(iterator.__anext__())
            await asyncio.wait({step, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                try:
                    await step
                except (asyncio.CancelledError, StopAsyncIteration):
                    pass
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        stopped.cancel()
        if step is not None and not step.done():
            # The caller was cancelled (a client that left) while a step ran: stop the step too, or it
            # would finish the graph on its own after the turn released its thread, writing unclaimed.
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await step
