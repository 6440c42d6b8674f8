"""The retention sweeper of `tt-agent serve`: a background thread that sweeps expired threads every
`sweep_interval_seconds` (`operations.retention`), while the server runs.

Why a thread, not an asyncio task: a sweep is blocking storage work (one claim
and one commit per expired thread), and on a thread of its own it never holds
the event loop or a request's worker. It sweeps once at start-up, then every
interval. Under `tt-agent serve --workers N` each worker runs one; that is
safe because sweeps are (each thread is claimed, and handled by one sweeper),
and only costs N candidate queries per interval.

The same schedule also deletes expired idempotency results
(`ThreadStorage.sweep_idempotency`): the request path sweeps them too, at most
every few minutes, but a server that gets no requests would never do it.

A sweep that fails (the database is down) is logged as one warning and tried
again at the next interval. A thread the sweep cannot handle does not fail it:
the sweep skips it with a warning of its own and counts it
(`SweepResult.failed_thread_ids`, see `operations.retention`). `stop()` ends the loop after the thread being
swept, so a shutdown waits for at most one thread's commit.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from agent.errors import AgentError
from agent.operations.retention import sweep_expired_threads

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent
    from agent.types import SweepResult

logger = logging.getLogger(__name__)


class Sweeper:
    """Sweeps `agent`'s expired threads every `interval` seconds on a daemon thread, from `start()` to `stop()`."""

    def __init__(self, agent: LangGraphResponsesAgent, interval: float) -> None:
        self.agent = agent
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tt-retention-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the loop to end and wait for it (at most `timeout` seconds). Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sweep_once()
            if self._stop.wait(self.interval):
                return

    def sweep_once(self) -> SweepResult | None:
        """One sweep; logs one line when it removed something. Never raises: returns None when it failed."""
        try:
            context = self.agent.operation_context
            result = sweep_expired_threads(context.storage, context.settings, memories=context.memories, stop=self._stop)
            self.agent.storage.sweep_idempotency()
        except AgentError as exc:
            logger.warning("Retention sweep failed (retried in %s s): %s", self.interval, exc)
            return None
        except Exception:  # noqa: BLE001 - the sweeper must outlive one bad sweep
            logger.exception("Retention sweep failed (retried in %s s)", self.interval)
            return None
        if result or result.failed_thread_ids:
            removed = sum(t.removed_checkpoints for t in result.trimmed)
            logger.info(
                "Retention sweep: deleted %d expired thread(s), trimmed %d to their head (%d checkpoint(s) removed), "
                "skipped %d it could not handle",
                len(result.deleted_thread_ids),
                len(result.trimmed),
                removed,
                len(result.failed_thread_ids),
            )
        return result
