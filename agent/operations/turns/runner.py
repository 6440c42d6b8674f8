"""`TurnRunner`: one turn body, async, with the sync path a bridge over it.

`arun` is the turn (`_turn`, steps 1 to 4 of `agent.operations.turns`); `run`
drives the same generator from the caller's thread on a loop thread of the
runner's own (`bridge.LoopThreads`), so both paths yield the same events,
raise the same errors and stop the same way: a newer turn's `interrupt` or
`rollback` cancels the pending graph step at once (model request included),
and a caller that leaves (a closed sync generator, a cancelled task) ends the
turn with nothing written and the thread released. On the sync path the loop
computes events ahead of the caller's reading, but the turn commits only once
the caller has read them all and asked for the next (`bridge.caught_up`), as
an async caller's `anext` asks.

The two paths differ only in where they wait:

* **Storage calls** are short but blocking (both backends' drivers are
  synchronous). An async turn runs them on the runner's storage thread pool
  (`in_io`), so the caller's event loop never blocks; a bridged sync turn runs
  them on its own loop thread, which serves that turn alone.
* **A claim may wait** for the turn that holds its thread (`enqueue`, and
  `interrupt`, `rollback`, `steer` after their request), seconds at a time, in
  a thread (`ThreadStorage.claim`). On the storage pool, 24 turns queued on one
  thread took every storage thread, and the turn they waited for could not
  commit (nor any read run) until they timed out. So an async turn's claim runs
  on a pool of its own (`in_claim`), a thread for every turn the server admits
  at once (`max_running_turns`), and an action that writes (it claims its
  thread too, and waits under `enqueue`) on another (`in_update`), bounded
  because nothing bounds how many actions arrive: a flood of more than
  `UPDATE_THREADS` of them waiting on one busy thread delays other writing
  actions (they queue for the pool's threads), never a read, a commit or a turn.
* **The idempotency lookup** before the claim may wait for a turn that runs
  with the same key right now: `run` waits in the caller's thread, as the
  caller of a sync call expects, and `arun` awaits without holding a thread.
  A claim that finds the thread busy with the first request of the key waits
  for it too (`Idempotency.claim_or_result`), on the turn's loop.

State updates (`update_state`, `updates.py`) stay synchronous: they stream
nothing and call no model, so they are storage work from end to end, and the
async callers run them whole on the storage thread pool (`in_io`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from langgraph.graph.state import CompiledStateGraph

from agent.config import AgentSettings
from agent.operations.idempotency import Idempotency
from agent.operations.turns.args import TurnArgs, TurnEvent
from agent.operations.turns.bridge import LoopThreads, caught_up, in_current_thread
from agent.operations.turns.commit import finish
from agent.operations.turns.parts import TurnParts
from agent.operations.turns.progress import Progress, modes, until
from agent.context import TURN_CONTEXT_KEY
from agent.messages import with_ids
from agent.operations.turns import steer
from agent.operations.turns.start import (
    ClaimHandoff,
    begin,
    check_budget,
    check_input_ids,
    prepare,
    recall,
    stored_messages,
    strategy_of,
)
from agent.operations.turns.updates import update_state
from agent.storage import ThreadStorage
from agent.types import NewMessages, StoredResponse, TurnResult, TurnStarted

if TYPE_CHECKING:
    from agent.context.window import ContextWindow
    from agent.memory.service import Memories, Primed


#: Threads for writing actions, which may wait for their thread's claim (`TurnRunner.in_update`), at least. Each
#: waiting claim polls the database (about 10 times a second), so this also bounds that load; beyond it, writing
#: actions queue for a thread, and their `enqueue_timeout` counts from when they get one. A claim that waited on
#: the event loop instead of in a thread would need neither bound (not done: the claim protocol is synchronous).
UPDATE_THREADS = 256


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
        self.parts = TurnParts(
            storage=storage,
            graph=graph,
            settings=settings,
            idempotency=Idempotency(storage, settings),
            memories=memories,
            window=window,
            answer_node=answer_node,
        )
        # Storage calls of the async path: short, but blocking. Sized so that
        # waiting for a pooled connection never starves other work.
        io_workers = 2 * settings.pool_max_size + 4
        self._io = ThreadPoolExecutor(max_workers=io_workers, thread_name_prefix="tt-storage")
        # Claims, which may wait for their thread (module docstring): a turn's, one thread for every turn the
        # server admits at once; a writing action's, a bounded pool. Threads are made only as claims need them.
        claims = settings.max_running_turns or io_workers
        self._claims = ThreadPoolExecutor(max_workers=claims, thread_name_prefix="tt-claim")
        self._updates = ThreadPoolExecutor(max_workers=max(UPDATE_THREADS, io_workers), thread_name_prefix="tt-update")
        # The sync path's event loops (`bridge`), started on the first sync turn.
        self._loops = LoopThreads()

    @property
    def storage(self) -> ThreadStorage:
        return self.parts.storage

    @property
    def graph(self) -> CompiledStateGraph:
        return self.parts.graph

    @property
    def settings(self) -> AgentSettings:
        return self.parts.settings

    @property
    def idempotency(self) -> Idempotency:
        """Results stored by idempotency key (`agent.operations.idempotency`)."""
        return self.parts.idempotency

    @property
    def bridge(self) -> LoopThreads:
        """The sync path's event loops: `bridge.iterate(async_iterator)` consumes an async body from sync code
        (`predict` iterates the Responses events through it)."""
        return self._loops

    def close(self) -> None:
        """Stop the storage thread pool and the sync path's loop threads (a running sync turn's when it ends)."""
        self._io.shutdown(wait=False, cancel_futures=True)
        self._claims.shutdown(wait=False, cancel_futures=True)
        self._updates.shutdown(wait=False, cancel_futures=True)
        self._loops.close()

    def run(self, args: TurnArgs, *, stream_tokens: bool) -> Iterator[TurnEvent]:
        """Run one turn; yields text deltas (if `stream_tokens`), new messages, and last a `TurnResult`.

        Nothing is written unless the turn finishes: the `TurnResult` comes after the commit.
        A request whose idempotency key already has a stored result yields only that
        `StoredResponse` (the model is not called). Closing the iterator early ends the
        turn with nothing written and the thread released. Works inside a running event
        loop too (a notebook): the turn runs on a loop thread of its own.

        Raises:
            ThreadNotFound: the thread belongs to someone else, or has no checkpoints while
                `checkpoint_id` is given.
            CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
            ThreadBusy: another turn holds the thread (see `multitask_strategy`).
            TurnCancelled: a newer turn rolled this one back (`rollback`).
            InvalidRequest: the idempotency key was used for a different request; `edit_message_id` is not in
                the start checkpoint, or `regenerate` finds no user message; `max_context_tokens` is above the
                agent's, or the input holds two messages with one id (`check_input_ids`): nothing is claimed or
                written.
            LeaseExpired, ModelError, StorageUnavailable: the claim, the model or the database failed.
        """
        check_budget(self.settings, args)
        check_input_ids(args.messages, thread_id=args.thread_id)
        if args.idempotency_key is not None:
            stored = self.idempotency.lookup(args.user_id, args.idempotency_key, args.request_hash)
            if stored is not None:
                yield stored
                return
        yield from self._loops.iterate(self._turn(args, stream_tokens))

    async def arun(self, args: TurnArgs, *, stream_tokens: bool) -> AsyncIterator[TurnEvent]:
        """`run` on the event loop: the same events, errors and guarantees.

        Cancelling the task (a client that left) stops the model request and releases the thread at once.
        """
        check_budget(self.settings, args)
        check_input_ids(args.messages, thread_id=args.thread_id)
        if args.idempotency_key is not None:
            stored = await self.idempotency.alookup(args.user_id, args.idempotency_key, args.request_hash, self.in_io)
            if stored is not None:
                yield stored
                return
        async with contextlib.aclosing(self._turn(args, stream_tokens)) as events:
            async for event in events:
                yield event

    def update_state(self, *args: Any, **kwargs: Any) -> TurnResult:
        """`updates.update_state` on this runner's storage and graph: the same arguments, result and errors."""
        return update_state(self.parts, *args, **kwargs)

    async def in_io(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the storage thread pool, awaited (on a bridged sync turn's loop: called in place)."""
        return await self._in(self._io, function, *args)

    async def in_claim(self, function: Callable[..., Any], *args: Any) -> Any:
        """`in_io` for a turn's claim, which may wait for its thread: on the claims' pool, so that waiting
        claims never hold the storage pool (module docstring)."""
        return await self._in(self._claims, function, *args)

    async def in_update(self, function: Callable[..., Any], *args: Any) -> Any:
        """`in_io` for an action that writes (a state update, a branch or thread change), which claims its
        thread and may wait for it: on the updates' pool (module docstring)."""
        return await self._in(self._updates, function, *args)

    async def _in(self, pool: ThreadPoolExecutor, function: Callable[..., Any], *args: Any) -> Any:
        if in_current_thread():
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(function, *args))

    async def _turn(self, args: TurnArgs, stream_tokens: bool) -> AsyncIterator[TurnEvent]:
        """The turn after its idempotency lookup: claim, prepare, run, commit (the one body of `run` and `arun`)."""
        parts = self.parts
        steering = strategy_of(parts, args) == "steer"
        # Every message a turn sends has its id before the graph runs: a steering request finds its messages
        # in the thread by it, and the turn's output leaves out a message a node gives back unchanged (`Progress`).
        args = dataclasses.replace(args, messages=with_ids(args.messages))
        primed = self._prime_recall(args)
        handoff = ClaimHandoff()
        thread_id = args.thread_id or str(uuid.uuid4())
        try:
            claimed = await parts.idempotency.aclaim_or_result(
                lambda: self.in_claim(begin, parts, thread_id, args, handoff),
                args.user_id, args.idempotency_key, args.request_hash, self.in_io,
            )  # fmt: skip
        except BaseException:
            if primed is not None:
                primed.cancel()
            await handoff.abandon_and_release(self.in_io, parts)  # cancelled while the claim waited
            raise
        if isinstance(claimed, StoredResponse):  # the first request with the key held the thread
            if primed is not None:
                primed.cancel()
            yield claimed
            return
        claim, begun = claimed
        done = False
        try:
            if claim.steered_into is not None:  # its messages were offered to the turn that ran: did it take them?
                joined = await self.in_io(steer.settle, parts, claim, args)
                if joined is not None:
                    after, result = joined
                    await self.in_io(parts.storage.release, claim)
                    done = True
                    yield TurnStarted(result.response_id)
                    if after:
                        yield NewMessages(after)
                    yield result
                    return
            turn, start_id, config = prepare(parts, claim, args, begun)
            context = config["configurable"][TURN_CONTEXT_KEY]
            config["configurable"][TURN_CONTEXT_KEY] = dataclasses.replace(
                context, inbox=steer.SteerInbox(parts.storage, claim, self.in_io)
            )
            yield TurnStarted(f"resp_{turn.head_id}")
            if primed is not None and claim.waited:  # turns that ran meanwhile may have saved memories
                primed = primed.stale()
            await self.in_io(recall, parts, turn, start_id, args.user_id, begun.messages, config, primed)
            primed = None
            progress = Progress(start=stored_messages(turn, start_id), sent=begun.messages)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            claim.on_stop(functools.partial(_wake, loop, stop))
            with parts.storage.saver.buffering(turn):
                stream = parts.graph.astream(begun.graph_input(), config, stream_mode=modes(stream_tokens), durability="exit")
                try:
                    async with contextlib.aclosing(until(stream, stop)) as chunks:
                        async for mode, chunk in chunks:
                            for event in progress.events(mode, chunk, stream_tokens):
                                yield event
                finally:
                    await stream.aclose()
            for event in progress.stored_events(turn, start_id):
                yield event
            await caught_up()  # a sync caller that stops reading now stops the turn before it writes
            result = await self.in_io(finish, parts, claim, turn, start_id, args, begun, progress)
            done = True
            if steering and isinstance(result, TurnResult):
                result = dataclasses.replace(result, steer="new_turn")
            yield result
        finally:
            if primed is not None:  # the turn ended before its recall: the embedding is not waited for
                primed.cancel()
            if not done:
                await asyncio.shield(self.in_io(parts.storage.release, claim))

    def _prime_recall(self, args: TurnArgs) -> Primed | None:
        """Start the turn's long-term memory reads (the user's memory listing, the query's embedding) on
        the storage thread pool, so that they run while the claim's round trip does (`Memories.prime`);
        `recall` then waits for them instead of making them one after another after the claim.

        Only a plain turn: an edit, a regeneration or a resume searches with messages the claim's start
        decides (`start.recall`). Real threads even on a bridged sync turn, whose `in_io` runs in place.
        A read that fails there is made again by `recall`, which raises it.
        """
        memories = self.parts.memories
        if memories is None or args.edit_message_id is not None or args.regenerate or args.resume is not None:
            return None
        return memories.prime(args.user_id, args.messages, self._io.submit)


def _wake(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set `stop` on its loop, from the claim keeper's thread."""
    # A signal that comes after the turn ended may find a bridged turn's loop already closed.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(stop.set)
