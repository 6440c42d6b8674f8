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
4. **Commit** (one short transaction) or **release** (nothing written).

The async path (`arun`) is what the HTTP server uses: the model call is an
awaited HTTP request, storage calls run on a small thread pool, and a client
that leaves cancels the task, which cancels the model request and releases
the thread at once.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph.state import CompiledStateGraph

from agent.config import AgentSettings, MultitaskStrategy
from agent.context import TURN_CONTEXT_KEY, TurnContext
from agent.context.summaries import edit_keeps_summary
from agent.errors import InvalidRequest, LeaseExpired, TurnCancelled
from agent.operations.access import authorize, checkpoint_not_found
from agent.state import CONTEXT_SUMMARY_CHANNEL
from agent.storage import Claim, ThreadStorage, Turn, Tx
from agent.storage.summaries import TURN_REPORT_KEY
from agent.types import NewMessages, TextDelta, TurnResult

TurnEvent = TextDelta | NewMessages | TurnResult

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
    instructions: str | None = None
    """A system message for this turn only (not stored)."""
    max_context_tokens: int | None = None
    """This turn's token budget for the model's input (None: the agent's setting)."""


@dataclass
class _Progress:
    """What a running turn has produced so far (kept if it is interrupted)."""

    produced: list[BaseMessage] = field(default_factory=list)
    partial: dict[str, str] = field(default_factory=dict)  # streamed text of messages not finished yet, by id

    def events(self, mode: str, chunk: Any, stream_tokens: bool) -> Iterator[TextDelta | NewMessages]:
        if mode == "messages":
            token, meta = chunk
            if isinstance(token, AIMessageChunk) and token.text and meta.get("langgraph_node") == "agent":
                self.partial[token.id] = self.partial.get(token.id, "") + token.text
                if stream_tokens:
                    yield TextDelta(item_id=token.id, text=token.text)
            return
        for update in chunk.values():
            if update and update.get("messages"):
                messages = list(update["messages"])
                for message in messages:
                    self.partial.pop(message.id, None)
                self.produced.extend(messages)
                yield NewMessages(messages)

    def kept(self) -> list[BaseMessage]:
        """The finished messages, and the unfinished reply's text so far as a message marked interrupted."""
        kept = list(self.produced)
        for item_id, text in self.partial.items():
            kept.append(AIMessage(content=text, id=item_id, response_metadata={"interrupted": True}))
        return kept


class TurnRunner:
    """Runs turns and state updates on one agent's storage and graph."""

    def __init__(self, storage: ThreadStorage, graph: CompiledStateGraph, settings: AgentSettings) -> None:
        self.storage = storage
        self.graph = graph
        self.settings = settings
        # Storage calls of the async path: short, but blocking. Sized so that
        # waiting for a pooled connection never starves other work.
        self._io = ThreadPoolExecutor(max_workers=2 * settings.pool_max_size + 4, thread_name_prefix="tt-storage")

    def close(self) -> None:
        self._io.shutdown(wait=False, cancel_futures=True)

    # -- sync ----------------------------------------------------------------------------------
    def run(self, args: TurnArgs, *, stream_tokens: bool) -> Iterator[TurnEvent]:
        """Run one turn; yields text deltas (if `stream_tokens`), new messages, and last a `TurnResult`.

        Nothing is written unless the turn finishes: the `TurnResult` comes after the commit.

        Raises:
            ThreadNotFound: the thread belongs to someone else, or has no checkpoints while
                `checkpoint_id` is given.
            CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
            ThreadBusy: another turn holds the thread (see `multitask_strategy`).
            TurnCancelled: a newer turn rolled this one back (`rollback`).
            LeaseExpired, ModelError, StorageUnavailable: the claim, the model or the database failed.
            InvalidRequest: `max_context_tokens` is above the agent's (nothing is claimed or written).
        """
        self._check_budget(args)
        thread_id = args.thread_id or str(uuid.uuid4())
        claim = self._claim(thread_id, args)
        done = False
        try:
            turn, start, config = self._prepare(claim, args)
            progress = _Progress()
            with self.storage.saver.buffering(turn):
                stream = self.graph.stream(
                    {"messages": list(args.messages)}, config, stream_mode=_modes(stream_tokens), durability="exit"
                )
                try:
                    for mode, chunk in stream:
                        yield from progress.events(mode, chunk, stream_tokens)
                        if claim.stop.is_set():
                            break
                finally:
                    stream.close()
            result = self._finish(claim, turn, start, args, progress)
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
    ) -> TurnResult:
        """Write a new checkpoint whose parent is `checkpoint_id` (default: the head), with `messages` applied.

        It becomes the thread head. Messages are applied with LangGraph's
        `add_messages` as if the agent node had returned them: appended, and a
        message whose `id` is already in the state replaces that message.
        Replacing or removing a message the branch's context summary stands for
        retires the summary (`agent.context.summaries.edit_keeps_summary`).

        Raises:
            ThreadNotFound, CheckpointNotFound, ThreadBusy, StorageUnavailable: as for `run`.
        """
        args = TurnArgs(messages, thread_id, user_id, checkpoint_id, strategy)
        claim = self._claim(thread_id, args)
        try:
            authorize(claim.record, thread_id, user_id)
            turn, start, config = self._prepare(claim, args)
            values: dict[str, Any] = {"messages": list(messages)}
            if claim.start is not None and not edit_keeps_summary(claim.start.checkpoint["channel_values"], messages):
                values[CONTEXT_SUMMARY_CHANNEL] = None
            with self.storage.saver.buffering(turn):
                # As the agent node: the new checkpoint's next step then follows the
                # usual edge (tools if the last message asks for one, else the end).
                self.graph.update_state(config, values, as_node="agent")
            self.storage.commit(claim, functools.partial(_write, turn, user_id))
        except BaseException:
            self.storage.release(claim)
            raise
        return TurnResult(thread_id, turn.new_head, start)

    # -- async -----------------------------------------------------------------------------------
    async def arun(self, args: TurnArgs, *, stream_tokens: bool) -> AsyncIterator[TurnEvent]:
        """`run` on the event loop: the same events, errors and guarantees.

        Cancelling the task (a client that left) stops the model request and releases the thread at once.
        """
        self._check_budget(args)
        thread_id = args.thread_id or str(uuid.uuid4())
        claim = await self.in_io(self._claim, thread_id, args)
        done = False
        try:
            turn, start, config = self._prepare(claim, args)
            progress = _Progress()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            claim.on_stop(lambda: loop.call_soon_threadsafe(stop.set))
            with self.storage.saver.buffering(turn):
                stream = self.graph.astream(
                    {"messages": list(args.messages)}, config, stream_mode=_modes(stream_tokens), durability="exit"
                )
                try:
                    async for mode, chunk in _until(stream, stop):
                        for event in progress.events(mode, chunk, stream_tokens):
                            yield event
                finally:
                    await stream.aclose()
            result = await self.in_io(self._finish, claim, turn, start, args, progress)
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
            idempotency_key=args.idempotency_key,
        )

    def _prepare(self, claim: Claim, args: TurnArgs) -> tuple[Turn, str, dict]:
        """The turn's buffer, its start checkpoint id, and the graph config that starts there."""
        turn = Turn(thread_id=claim.thread_id, record=claim.record)
        start = self._start_of(claim, args.user_id, args.checkpoint_id)
        if start is None:
            start = _add_root(self.storage.saver, turn)
        else:
            turn.loaded[start] = claim.start
        config = _config(claim.thread_id, start)
        context = TurnContext(
            thread_id=claim.thread_id,
            user_id=args.user_id,
            start_checkpoint_id=start,
            instructions=args.instructions,
            max_context_tokens=args.max_context_tokens,
        )
        config["configurable"][TURN_CONTEXT_KEY] = context
        # The same dict, for the saver: it copies what the model was sent into the turn's checkpoint metadata.
        config["configurable"][TURN_REPORT_KEY] = context.report
        return turn, start, config

    @staticmethod
    def _start_of(claim: Claim, user_id: str | None, checkpoint_id: str | None) -> str | None:
        """The checkpoint a turn starts from; the one owner of the "head unless branching" rule.

        None for a new thread (it starts from a root checkpoint written with its first turn).
        """
        record, thread_id = claim.record, claim.thread_id
        if record is None and checkpoint_id is None:
            return None
        # Also for a thread without checkpoints: worded as for someone else's thread.
        authorize(record, thread_id, user_id)
        if checkpoint_id is None:
            return record.head_checkpoint_id
        if claim.start is None:
            raise checkpoint_not_found(thread_id, checkpoint_id)
        return checkpoint_id

    def _finish(self, claim: Claim, turn: Turn, start: str, args: TurnArgs, progress: _Progress) -> TurnResult:
        """Commit the turn (or, when a newer turn asked it to stop, what that asks for)."""
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
                self._keep_interrupted(turn, start, args, progress)
                status = "interrupted"
        self.storage.commit(claim, functools.partial(_write, turn, args.user_id))
        return TurnResult(claim.thread_id, turn.new_head, start, status)

    def _keep_interrupted(self, turn: Turn, start: str, args: TurnArgs, progress: _Progress) -> None:
        """Replace what the stopped run buffered with one checkpoint: the input and what it produced."""
        turn.puts = [put for put in turn.puts if put[2].get("source") == ROOT_SOURCE]
        turn.writes = []
        config = {**_config(turn.thread_id, start), "metadata": {"interrupted": True}}
        with self.storage.saver.buffering(turn):
            self.graph.update_state(config, {"messages": [*args.messages, *progress.kept()]}, as_node="agent")


def _write(turn: Turn, user_id: str | None, tx: Tx) -> None:
    """The commit of a turn: its checkpoints and writes, then the thread's head (and owner, when new)."""
    if not turn.puts:
        return
    tx.write_turn(turn)
    head = turn.puts[-1][1]
    tx.upsert_thread(
        turn.thread_id,
        user_id=user_id,
        head_checkpoint_id=head["id"],
        message_count=len(head["channel_values"].get("messages") or ()),
    )


def _add_root(saver: Any, turn: Turn) -> str:
    """Buffer a new thread's root: an empty checkpoint before its first message (source `root`, step -1)."""
    checkpoint = empty_checkpoint()
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
