"""The sync path as a bridge over the async one: an async iterator consumed from synchronous code.

A turn is written once, as an async generator (`TurnRunner.arun`); `predict`,
`predict_stream` and the other synchronous callers iterate it through
`LoopThread.iterate`, which runs it on an event loop of its own in a background
thread, one step (`__anext__`) at a time. This is langgraph's bridge for its
async savers (`aio.py`: `asyncio.run_coroutine_threadsafe(coro, self.loop).result()`)
and psycopg_pool's reason for generating its sync pool from the async one: one
body, so the two paths cannot drift apart.

Each step runs in a copy of the caller's context (`contextvars`), so what the
caller set (MLflow's active trace span, for one) is seen by the turn. Closing
the sync iterator early (a client that stops reading) closes the async
generator on its loop, which ends the turn the way a cancelled task does.
The loop's own thread means the bridge also works where the caller already runs
a loop (a notebook cell).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread, started on first use; `close()` stops it."""

    def __init__(self, name: str = "tt-turns") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T], context: contextvars.Context | None = None) -> T:
        """`coroutine`'s result, run on the loop (in `context`, default a copy of the caller's)."""
        future = self._submit(coroutine, context or contextvars.copy_context())
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        """The items of `iterator`, each step run on the loop in one copy of the caller's context.

        Exceptions it raises are raised here, as they are. Closing this generator (or an exception
        in the consumer) closes `iterator` on the loop and waits for it to finish.
        """
        context = contextvars.copy_context()
        steps = iterator.__aiter__()
        try:
            while True:
                try:
                    item = self.run(steps.__anext__(), context)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            aclose = getattr(steps, "aclose", None)
            if aclose is not None:
                self.run(aclose(), context)

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5)
            if not loop.is_running():
                loop.close()

    def _submit(self, coroutine: Coroutine[Any, Any, T], context: contextvars.Context) -> concurrent.futures.Future[T]:
        loop = self.loop()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            if not done.set_running_or_notify_cancel():
                coroutine.close()
                return
            task = loop.create_task(coroutine, context=context)

            def finished(task: asyncio.Task) -> None:
                if task.cancelled():
                    done.set_exception(concurrent.futures.CancelledError())
                elif task.exception() is not None:
                    done.set_exception(task.exception())
                else:
                    done.set_result(task.result())

            task.add_done_callback(finished)

        loop.call_soon_threadsafe(start)
        return done
