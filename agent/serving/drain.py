"""The graceful stop of one server process: its runs finish, for up to `shutdown_grace_seconds`.

**Why.** On SIGINT or SIGTERM uvicorn (0.55, `Server.shutdown`) stops listening, waits for the open
connections to end (a stream is one), runs the app's lifespan exit, and returns; `asyncio.run` then cancels
the tasks left, and a single process re-raises the signal, which ends it at once. A background run (or a
stream left running under `finish_left_streams`) is a task of no connection: unless the lifespan exit waits
for it, it was dropped unrecorded, and read `in_progress` until its lease expired, then `failed`.

**One deadline.** The grace period starts when the signal arrives, not at the lifespan exit: uvicorn tells
the app nothing before that exit, which comes only once every connection closed, so `Drain.watch_signals`
chains uvicorn's signal handler to learn when the signal came. Open connections get the same deadline
(uvicorn's `timeout_graceful_shutdown`, set by `serving.app` a little later, so that the runs are stopped
and recorded before uvicorn cancels what is left of the connections). Until the deadline the process's
runs, running and queued, go on. At it, those still going are stopped the way a cancel stops them
(`Runs.stop_all`): nothing written, the thread's claim or queue place given up, and they read `failed`
("The agent stopped (shutdown) before the turn finished") at once instead of after their lease.

Each `--workers` worker drains its own runs: uvicorn's supervisor sends every worker SIGTERM and waits for
it, and each worker runs this same lifespan exit.

Kubernetes sends SIGKILL `terminationGracePeriodSeconds` (30 s by default) after SIGTERM: keep the grace a
few seconds below it (the default, 25 s, is), since recording the stopped runs' ends takes a moment too.

**`/ready` while draining** is not answered: uvicorn closes the listening sockets as soon as the signal
comes, so a load balancer's probe gets a refused connection, which stops new turns as a 503 would.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
from typing import Any

from agent.runs.service import RECORD_ENDS_SECONDS

logger = logging.getLogger(__name__)

#: How much later than the grace period uvicorn cancels the connections still open (`serving.app`), in
#: seconds: the runs of their streams are stopped, and recorded as stopped by the shutdown, first.
CONNECTIONS_MARGIN_SECONDS = 1.0


class Drain:
    """Lets `runs` (`agent.runs.Runs`, this process's) finish for `grace_seconds` after the server is asked to
    stop, then stops the rest. `watch_signals()` at start-up, `await finish()` in the lifespan exit."""

    def __init__(self, runs: Any, grace_seconds: float) -> None:
        self.runs = runs
        self.grace_seconds = grace_seconds
        #: `time.monotonic()` at which the runs still going are stopped; None until the stop is asked.
        self.deadline: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Future | None = None
        #: The handlers chained (`watch_signals`), by signal: (ours, the one before it).
        self._chained: dict[int, tuple[Any, Any]] = {}

    def watch_signals(self) -> None:
        """Start the grace period when SIGINT or SIGTERM arrives, then let the handler in place (uvicorn's) run.
        Call it from the running loop. Python runs signal handlers on the main thread only: elsewhere (a server
        in a test's thread) nothing is chained, and the grace period starts at `finish`."""
        self._loop = asyncio.get_running_loop()
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            if callable(previous):  # uvicorn's `handle_exit`
                ours = functools.partial(self._on_signal, previous)
                signal.signal(sig, ours)
                self._chained[sig] = (ours, previous)

    def _unwatch_signals(self) -> None:
        # uvicorn puts its own predecessors back once it stopped; without uvicorn nobody else would.
        for sig, (ours, previous) in self._chained.items():
            if signal.getsignal(sig) is ours:
                signal.signal(sig, previous)
        self._chained.clear()

    def _on_signal(self, previous: Any, sig: int, frame: Any) -> None:
        self.begin()
        previous(sig, frame)

    def begin(self) -> None:
        """Start the grace period, once: at its end the runs still going are stopped (`Runs.stop_all`)."""
        if self.deadline is not None:
            return
        self.deadline = time.monotonic() + self.grace_seconds
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # A signal handler runs between two bytecodes of the loop's thread: schedule, do not stop there.
            loop.call_soon_threadsafe(loop.call_later, self.grace_seconds, self._stop)

    def _stop(self) -> asyncio.Future:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_all())
        return self._stopping

    async def _stop_all(self) -> None:
        try:
            stopped = await asyncio.to_thread(self.runs.stop_all)  # it writes queued runs' ends
        except Exception:  # noqa: BLE001 - the process stops anyway; the runs' leases end them
            logger.warning("Could not stop the runs still going", exc_info=True)
            return
        if stopped:
            logger.warning(
                "Shutting down: stopped %d run(s) still going after %g s (shutdown_grace_seconds); they read failed",
                len(stopped), self.grace_seconds,
            )  # fmt: skip

    async def finish(self) -> None:
        """Wait until this process's runs have ended, or the grace period has, then stop those still going
        and wait (at most `RECORD_ENDS_SECONDS`) until their ends are recorded. Never raises."""
        self._loop = self._loop or asyncio.get_running_loop()
        self.begin()
        self._unwatch_signals()
        assert self.deadline is not None
        pending = set(self.runs.tasks)
        if pending:
            left = max(0.0, self.deadline - time.monotonic())
            logger.info("Shutting down: waiting up to %.0f s for %d run(s) to finish", left, len(self.runs.local_ids()))
        # `tasks` changes as runs end (each adds the task that records its end): wait until it stays empty.
        while pending and time.monotonic() < self.deadline:
            await asyncio.wait(pending, timeout=self.deadline - time.monotonic())
            pending = set(self.runs.tasks)
        if not pending:
            return
        await self._stop()
        pending = set(self.runs.tasks)
        if pending:
            await asyncio.wait(pending, timeout=RECORD_ENDS_SECONDS)
