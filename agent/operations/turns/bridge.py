"""Sync calls into the async turn: event loops on threads of their own (`LoopThreads`).

The turn is written once, as an async generator (`TurnRunner.arun`), and the
sync `TurnRunner.run` drives it from the caller's thread, the way langgraph's
`checkpoint/postgres/aio.py` bridges its sync methods to the async ones
(`asyncio.run_coroutine_threadsafe(self.aget_tuple(config), self.loop).result()`)
and psycopg_pool generates its sync pool from the async one (`pool.py` is
generated from `pool_async.py`): one body, so the two paths cannot drift.

Why it is built this way:

* **A loop on a thread of its own**, not `asyncio.run` in the caller's thread:
  the caller may already run a loop (a Jupyter cell, an async web framework
  calling `predict`), where `asyncio.run` refuses to start, and a loop thread
  is reused from turn to turn instead of a loop being made per call.
* **One loop per turn at a time** (a small pool of loop threads, each started
  on first need and kept for the next turn), not one loop for every turn of
  the process: LangGraph runs a node that has no async body *on the event
  loop's thread* (`RunnableCallable.ainvoke` calls `invoke` when it has no
  `afunc`), so a user graph's sync node would block every other sync turn
  sharing that loop. With a loop per turn, sync turns run side by side as they
  do on caller threads. A bridged turn's storage calls run on its loop thread
  (`in_current_thread`): blocking it blocks that turn alone, as the sync path
  always has, without a hop to the storage thread pool that async turns share.
* **Running ahead, up to the commit** (`iterate`): the loop computes events
  while the caller reads them, so a burst of tokens costs no thread switch
  per token; but before it commits, the turn waits until the caller has read
  every event and asked for the next (`caught_up`). A caller that stops early
  (closing the sync generator) therefore stops the turn before it writes, as
  when the sync path ran in the caller's own thread. One task drives the
  generator for the whole turn, in a copy of the caller's context
  (`contextvars`), so an MLflow span open in the caller is the parent of the
  turn's spans, and a context variable set in one step is still set in the next.
* **Leaving early** (a closed generator, a KeyboardInterrupt in the caller's
  thread) cancels the task, as a client that leaves cancels an async turn, and
  the caller waits until the generator has finished cleaning up, so the thread
  is released when `close()` returns. Errors reach the caller as the very
  exception objects the turn raised, after the events before them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: Loop threads kept for the next sync turn once their turn ends (more are stopped): sync turns at once are
#: bounded by the caller's threads, and a thread kept idle costs only its stack.
KEEP_IDLE = 8

_local = threading.local()
#: The reading of the sync caller whose iteration runs in this context (None: an async caller).
_reader: contextvars.ContextVar[_Reader | None] = contextvars.ContextVar("tt_bridge_reader", default=None)
#: What the driver puts after the last item.
_END = object()


def in_current_thread() -> bool:
    """Whether the calling thread is one of the loop threads of a `LoopThreads` (a bridged sync turn runs here)."""
    return getattr(_local, "bridged", False)


async def caught_up() -> None:
    """Wait until a sync caller has read every item so far and asked for the next; at once for an async caller.

    An async generator calls it before a step that must not happen unless its caller goes on reading
    (a turn, before its commit): an async caller's `anext` already means that.
    """
    reader = _reader.get()
    if reader is not None:
        await reader.caught_up()


class _Reader:
    """How far the sync caller has read (kept on the loop's side: every method runs on the loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.given = 0
        self.asked = 0
        self._waiter: asyncio.Future | None = None

    def ask(self, taken: int) -> None:
        """The caller has taken `taken` items and waits for another."""
        self.asked = max(self.asked, taken)
        if self._waiter is not None and not self._waiter.done() and self.asked >= self.given:
            self._waiter.set_result(None)

    async def caught_up(self) -> None:
        while self.asked < self.given:
            self._waiter = self.loop.create_future()
            await self._waiter


class _LoopThread:
    """One event loop running forever on a daemon thread, with a default executor of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        # LangChain runs a sync model's `_generate` (and sync tools) in the loop's default executor.
        self.executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix=f"{name}-exec")
        self.loop.set_default_executor(self.executor)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        _local.bridged = True
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def iterate(self, items: AsyncIterator[T], context: contextvars.Context) -> Iterator[T]:
        """The items of `items`, computed on this loop inside `context` (see the module docstring)."""
        loop = self.loop
        out: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        finished = threading.Event()
        reader = _Reader(loop)

        async def drive() -> None:
            _reader.set(reader)
            try:
                async for item in items:
                    reader.given += 1
                    out.put((True, item))
                out.put((False, _END))
            except BaseException as exc:  # the turn's errors, and its cancellation by a caller that left
                out.put((False, exc))
            finally:
                try:
                    await items.aclose()  # after the end or an error: does nothing
                finally:
                    finished.set()

        started: concurrent.futures.Future[asyncio.Task] = concurrent.futures.Future()
        loop.call_soon_threadsafe(lambda: started.set_result(loop.create_task(drive(), context=context)))
        task = started.result()
        taken = 0
        ended = False
        try:
            while True:
                try:
                    ok, value = out.get_nowait()
                except queue.Empty:
                    loop.call_soon_threadsafe(reader.ask, taken)
                    ok, value = out.get()
                if not ok:
                    ended = True
                    if value is _END:
                        return
                    raise value
                taken += 1
                yield value
        finally:
            if not ended:
                loop.call_soon_threadsafe(task.cancel)
            finished.wait()


class LoopThreads:
    """Runs async iterators for sync callers, each on an event loop of its own thread (see the module docstring).

    Threads are started on first need and reused; `close()` stops them (a busy one when its iteration ends).
    """

    def __init__(self, name: str = "tt-turn", *, keep_idle: int = KEEP_IDLE) -> None:
        self.name = name
        self.keep_idle = keep_idle
        self._idle: list[_LoopThread] = []
        self._started = 0
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """The items of `items` as a sync iterator (close it to stop early), computed in a copy of the caller's
        context; `items` may run ahead of the reader up to a `caught_up()`.

        Raises:
            whatever `items` raises, in the caller's thread.
            RuntimeError: the `LoopThreads` was closed.
        """
        context = contextvars.copy_context()
        worker = self._checkout()
        try:
            yield from worker.iterate(items, context)
        finally:
            self._checkin(worker)

    def close(self) -> None:
        """Stop the idle loop threads; a busy one stops when its iteration ends. Later calls to `iterate` fail."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def _checkout(self) -> _LoopThread:
        with self._lock:
            if self._closed:
                raise RuntimeError("The agent was closed; its turns cannot run.")
            if self._pid != os.getpid():  # a forked child: the parent's threads do not exist here
                self._idle, self._pid = [], os.getpid()
            if self._idle:
                return self._idle.pop()
            self._started += 1
            number = self._started
        return _LoopThread(f"{self.name}-{number}")

    def _checkin(self, worker: _LoopThread) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.keep_idle and self._pid == os.getpid():
                self._idle.append(worker)
                return
        worker.stop()
