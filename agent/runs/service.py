"""`Runs`: this process's side of background runs and resumable streams (see the package docstring).

* `recorder(...)` gives a streamed turn its `Recorder`, which writes the run row and the event log as the
  turn runs: ops are buffered and written every `FLUSH_SECONDS` (and at the turn's end), so a token-by-token
  stream costs a few inserts per second, not one per token.
* A keeper thread (one per process, alive while it has runs) renews the leases of this process's live runs
  every `CANCEL_POLL_SECONDS` in one statement for all of them, which also says which of them a cancel was
  asked for (from any replica), and which are no longer live; those are cancelled here (`LocalRun.cancel`):
  a running run whose cancel was asked, and a queued run (waiting for its admission place or its thread)
  that a cancel ended (or a delete removed) on any replica, so that it stops waiting at once, its place and
  its ticket in the thread's queue given up, instead of seeing its status only when its turn came. One
  statement every half second per process, whatever the number of runs.
* `follow(...)` replays a run's log from the store and polls it (every `POLL_SECONDS`) until the run ends.
  Polling, not Postgres `LISTEN/NOTIFY`: it needs no connection held per listener (a listener holds its
  connection, which transaction-mode PgBouncer does not allow and the pool cannot spare for hundreds of
  followers), it works the same on SQLite, and a follower that reconnects after a drop loses nothing by
  construction (it reads from a sequence number). A follower in the process that runs the turn is woken at
  once by the recorder's write instead of waiting for its next poll.
* **How a run ends is always recorded.** `Recorder.ended` writes the run's end in a task of its own, which a
  second cancel of the turn's task cannot stop: the task of a stream whose client left is cancelled again
  while it records (Starlette cancels the request's anyio cancel scope, whose `gather` of the turn's task
  passes the cancel on; `asyncio.shield` keeps the write going, not the coroutine awaiting it). Unrecorded,
  the run read `in_progress` until its lease expired, then `failed`. An end that cannot be written (the
  database is down: the very fault the turn may have failed of) is written again by the keeper every
  `CANCEL_POLL_SECONDS` until the database is back (`Runs.end_later`): left to its lease, a turn that failed
  with StorageUnavailable read "the server running this turn stopped (its lease expired)", which was untrue.
* **A cancelled run's own stream ends like a resumed one.** A cancel (`LocalRun.cancel`) cancels the turn's
  task, which would end its stream without a word; `Recorder.cancelled` turns that cancel into `RunCancelled`,
  so the stream the turn was started with ends with an `error` event (code `cancelled`) and `[DONE]`, as a
  follower's does. The cancel carries `RUN_CANCEL_MESSAGE`, so that code outside the turn that it reaches
  instead (a server's stream waiting for room in its buffer while its client does not read:
  `serving.agent_server`) knows it from any other cancel (`run_cancelled`) and ends the stream the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agent.error_answers import answer_for
from agent.errors import AgentError, InvalidRequest, ResponseNotFound, RunCancelled, ServerStopping
from agent.runs.log import Ops, Replay, decode, encode
from agent.runs.store import FINAL, Run, RunStore, open_run_store
from agent.operations.conversations import response_not_found
from agent.turn_events import StoredResponse, TurnResult, TurnStarted

logger = logging.getLogger(__name__)

#: How long a recorder buffers ops before writing them, in seconds.
FLUSH_SECONDS = 0.1
#: How often a follower on another process looks for new events, in seconds.
POLL_SECONDS = 0.2
#: How often the keeper looks for cancel requests of this process's runs, in seconds.
CANCEL_POLL_SECONDS = 0.5
#: How often `Runs` sweeps runs whose time is up, at most, in seconds.
SWEEP_EVERY_SECONDS = 60.0


#: Why a run cancelled while it ran reads cancelled (its status's reason, its streams' `error` event).
CANCELLED_WHILE_RUNNING = "Cancelled (POST /responses/{id}/cancel) while it ran; nothing was written."
#: The message of the cancel `LocalRun.cancel` sends its run's task (`run_cancelled` tells it from any other).
RUN_CANCEL_MESSAGE = "run cancelled: POST /responses/{id}/cancel"
#: How long runs stopped at shutdown (a server's grace period over, an in-process agent's `close`) may take to
#: record their ends, in seconds.
RECORD_ENDS_SECONDS = 3.0
#: Why a run stopped at shutdown, before it finished, reads failed (`Runs.stop_all`): its server stopped, or
#: its in-process agent was closed.
STOPPED_AT_SHUTDOWN = "The agent stopped (shutdown) before the turn finished; nothing was written."
#: The code of such a run's end (its status's `code`, its streams' `error` event).
SHUTDOWN_CODE = "server_shutdown"
#: The message of the cancel `LocalRun.stop` sends its run's task.
RUN_STOP_MESSAGE = "run stopped: the server is shutting down"


@dataclass
class LocalRun:
    """A run of this process: how to stop it (its task, on its loop). `started`: its turn holds its thread."""

    loop: asyncio.AbstractEventLoop
    task: asyncio.Task | None = None
    started: bool = False
    #: A cancel was asked for it (`cancel`): its task's cancel is that, not its client leaving.
    cancelled: bool = False
    #: The server stopped it at shutdown (`stop`): its task's cancel is that.
    stopped: bool = False

    def cancel(self) -> None:
        """Cancel its task, once (the keeper sees the cancel asked at every renew until the run ends): a running
        turn stops and writes nothing; a queued one stops waiting (its admission place and its thread's queue:
        `agent.runs.places`, `ClaimHandoff`)."""
        if self.task is not None and not self.cancelled and not self.stopped:  # stopped: ending anyway
            self.cancelled = True
            self._cancel_task(RUN_CANCEL_MESSAGE)

    def stop(self) -> None:
        """Cancel its task because the server is shutting down (`Runs.stop_all`): a running turn stops and writes
        nothing, as a cancel stops it, but its run reads failed (`STOPPED_AT_SHUTDOWN`), not cancelled."""
        if self.task is not None and not self.cancelled and not self.stopped:
            self.stopped = True
            self._cancel_task(RUN_STOP_MESSAGE)

    def _cancel_task(self, message: str) -> None:
        # A loop closed under its task (an `asyncio.run` that ended while the run was pending) runs it no more:
        # nothing is left to cancel, and its end is its lease's (found by a full run: `close` raised here).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.task.cancel, message)


def run_cancelled(error: BaseException) -> RunCancelled | ServerStopping | None:
    """`RunCancelled` when `error` is the cancel `LocalRun.cancel` sent its run's task (a cancel asked for the
    run), `ServerStopping` when it is `LocalRun.stop`'s (the server's grace period at shutdown ended), None for
    any other error or cancel (a client that left). The caller that goes on instead of letting the cancel end
    its task calls `Task.uncancel`."""
    if isinstance(error, asyncio.CancelledError) and error.args == (RUN_CANCEL_MESSAGE,):
        return RunCancelled(CANCELLED_WHILE_RUNNING)
    if isinstance(error, asyncio.CancelledError) and error.args == (RUN_STOP_MESSAGE,):
        return ServerStopping(STOPPED_AT_SHUTDOWN)
    return None


def response_run_id() -> str:
    """A background run's response id, made when it is asked for (its checkpoint is named later: `agent.runs`)."""
    from langgraph.checkpoint.base.id import uuid6

    return f"resp_{uuid6(clock_seq=-1)}"


class Runs:
    """Runs on one storage: recording, following, status, cancel, delete. Thread-safe."""

    def __init__(self, storage: Any, settings: Any, *, keyring: Any = None) -> None:
        self.settings = settings
        self.store: RunStore = open_run_store(storage, settings)
        self.keyring = keyring if keyring is not None else getattr(storage, "keyring", None)
        self._local: dict[str, LocalRun] = {}
        self._wakers: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._closed = threading.Event()
        self._last_sweep = 0.0
        self.tasks: set[asyncio.Task] = set()  # tasks that outlive their request (runs, their ends), kept from the GC
        #: Ends of runs that could not be written (`end_later`): response id -> the write, retried by the keeper.
        self._unwritten_ends: dict[str, Callable[[], None]] = {}
        #: Set by `stop_all`: a turn cancelled from now on was stopped by the shutdown, not left by its client.
        self.stopping = False

    # -- this process's runs ---------------------------------------------------------------------
    def attach(self, response_id: str, local: LocalRun) -> None:
        with self._lock:
            self._local[response_id] = local
            if self._keeper is None and not self._closed.is_set():
                self._keeper = threading.Thread(target=self._keep, name="tt-run-keeper", daemon=True)
                self._keeper.start()

    def local(self, response_id: str) -> LocalRun | None:
        with self._lock:
            return self._local.get(response_id)

    def local_ids(self) -> list[str]:
        """The response ids of this process's runs not yet ended (queued here or running here)."""
        with self._lock:
            return list(self._local)

    def detach(self, response_id: str) -> None:
        with self._lock:
            self._local.pop(response_id, None)

    def close(self) -> None:
        self._closed.set()

    def stop_all(self) -> list[str]:
        """Stop every run of this process, queued or running, because the server is shutting down: each writes
        nothing, gives up its thread's claim or its place in the queue, and reads failed (`STOPPED_AT_SHUTDOWN`,
        code `SHUTDOWN_CODE`) once its task has recorded its end. Blocking (a queued run's end is written here,
        since its task may not hold a recorder yet): call it from a worker thread. Returns the response ids
        stopped. Never raises: a queued run whose end cannot be written reads failed when its lease expires."""
        self.stopping = True
        with self._lock:
            local = dict(self._local)
        for response_id, run in local.items():
            if not run.started:
                try:
                    self.store.finish(response_id, "failed", reason=STOPPED_AT_SHUTDOWN, code=SHUTDOWN_CODE)
                except Exception:  # noqa: BLE001 - its lease then ends it
                    logger.warning("Could not record the end of queued run %s", response_id, exc_info=True)
            run.stop()
        return list(local)

    def stop_and_wait(self, seconds: float) -> list[str]:
        """`stop_all`, then wait up to `seconds` until the stopped runs' tasks have recorded their ends (they
        write them on the agent's storage threads, so the agent must not close before). For an in-process
        agent's `close`; blocking, never raises. Returns the response ids stopped."""
        stopped = self.stop_all()
        deadline = time.monotonic() + seconds
        with self._lock:  # a run whose loop is closed never records its end here (`LocalRun._cancel_task`)
            waited = {rid for rid in stopped if rid in self._local and not self._local[rid].loop.is_closed()}
        # A run leaves `_local` once its end is recorded (`Recorder._ended`); its task runs on another thread's
        # loop (a sync `predict`'s run: a loop thread of its own), so this thread polls.
        while waited & set(self.local_ids()) and time.monotonic() < deadline:
            time.sleep(0.01)
        return stopped

    def end_later(self, response_id: str, write: Callable[[], None]) -> None:
        """Write the end of run `response_id` (`write`, a `RunStore.finish` whose first try failed) from the
        keeper, every cycle until it succeeds or the process closes; then its lease is the last word."""
        with self._lock:
            self._unwritten_ends[response_id] = write
            if self._keeper is None and not self._closed.is_set():
                self._keeper = threading.Thread(target=self._keep, name="tt-run-keeper", daemon=True)
                self._keeper.start()

    def _write_ends(self) -> None:
        with self._lock:
            unwritten = dict(self._unwritten_ends)
        for response_id, write in unwritten.items():
            try:
                write()
            except Exception:  # noqa: BLE001 - still down: the next cycle tries again
                continue
            with self._lock:
                self._unwritten_ends.pop(response_id, None)
            self.woken(response_id)
            logger.info("Recorded the end of run %s once the database answered again", response_id)

    def _keep(self) -> None:
        while not self._closed.wait(min(CANCEL_POLL_SECONDS, self.settings.lease_seconds / 3)):
            self._write_ends()
            with self._lock:
                local = dict(self._local)
            if not local:
                continue
            try:
                live = self.store.renew(list(local))
                for response_id, run in local.items():
                    # A running run whose cancel was asked; a queued one cancelled (or deleted) meanwhile.
                    if live.get(response_id) or (response_id not in live and not run.started):
                        run.cancel()
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the keeper; the lease has slack
                logger.warning("Could not renew %d run(s)", len(local), exc_info=True)

    def woken(self, response_id: str) -> None:
        """Wake this process's followers of `response_id` (new rows were written)."""
        with self._lock:
            events = list(self._wakers.get(response_id, ()))
        for loop, event in events:
            loop.call_soon_threadsafe(event.set)

    # -- starting ----------------------------------------------------------------------------------
    def recorder(self, parsed: Any, *, background_id: str | None = None, lifecycle: bool = True) -> Recorder:
        """The recorder of one streamed turn; `lifecycle`: its stream's event set (`request_fields`)."""
        return Recorder(self, parsed, background_id=background_id, lifecycle=lifecycle)

    def queue(self, parsed: Any) -> str:
        """Record a background run as `queued`; its response id. Sweeps ended runs now and then."""
        response_id = response_run_id()
        envelope = parsed.envelope
        self.store.create(Run(response_id, envelope.user_id, "queued", True, envelope.thread_id, request=request_fields(parsed)))
        self.maybe_sweep()
        return response_id

    def sweep_due(self) -> bool:
        return time.monotonic() - self._last_sweep >= SWEEP_EVERY_SECONDS

    def maybe_sweep(self) -> None:
        """Sweep runs whose time is up (`RunStore.sweep`), at most every `SWEEP_EVERY_SECONDS`. Never raises."""
        if self.sweep_due():
            self._last_sweep = time.monotonic()
            try:
                self.store.sweep()
            except Exception:  # noqa: BLE001 - retried at the next run
                logger.warning("Could not sweep ended runs", exc_info=True)

    # -- reading -----------------------------------------------------------------------------------
    def get(self, response_id: str, user_id: str | None) -> Run | None:
        """The run (as a reader reports it: `Run.seen`) if `user_id` may see it; None when there is no run
        (a response that was not streamed, or swept).

        Raises:
            ResponseNotFound: the run is another user's (worded as an unknown id).
        """
        run = self.store.get(response_id)
        if run is None:
            return None
        if run.user_id != user_id:  # the ownership rule of threads (`storage.owned_by`), worded as unknown
            raise response_not_found(response_id)
        return run.seen()

    def replay(self, run: Run) -> Replay:
        return Replay(model=self.settings.model, request=run.request, background_id=run.response_id if run.background else None)

    def answered_outputs(self, run: Run) -> dict[str, Any] | None:
        """The `custom_outputs` the run's turn answered (`steer` and `status` included, as a request that waited
        for it got them), from its log; None when its log holds no result (it ended without one, or was swept)."""
        outputs = None
        for _, payload in self.store.rows(run.response_id, -1):  # after the run's end: one whole-log row
            for op in decode(payload, self.keyring)[0]:
                if op[0] == "r":
                    outputs = op[1]
                elif op[0] == "x":
                    outputs = op[2]
        return outputs

    async def follow(
        self, response_id: str, user_id: str | None, after: int, in_io: Callable[..., Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """The run's stream events with `sequence_number > after`, in order, each once: those stored, then the
        live ones as they are written, to the run's end (an `error` event if it failed or was cancelled).

        Raises:
            ResponseNotFound: no such run (not streamed, swept) or another user's.
        """
        run = await in_io(self.get, response_id, user_id)
        if run is None:
            raise ResponseNotFound(
                f"Response {response_id!r} has no stored events (it was not streamed, or ended more than "
                "response_events_seconds ago).", response_id=response_id)  # fmt: skip
        replay, last_row, fed = self.replay(run), -1, 0  # `fed`: ops replayed, which a whole-log row repeats
        wake = asyncio.Event()
        waker = (asyncio.get_running_loop(), wake)
        with self._lock:
            self._wakers.setdefault(response_id, []).append(waker)
        try:
            while True:
                rows = await in_io(self.store.rows, response_id, last_row)
                for seq, payload in rows:
                    last_row = seq
                    ops, whole = decode(payload, self.keyring)
                    ops = ops[fed:] if whole else ops
                    fed += len(ops)
                    for event in replay.feed(ops):
                        if event["sequence_number"] > after:
                            yield event
                if replay.ended:
                    return
                if run.final:  # ended without a result in its log (lease expired, cancelled while queued)
                    rows = await in_io(self.store.rows, response_id, last_row)
                    if not rows:
                        # A process killed within `FLUSH_SECONDS` of sending events had not stored them: the
                        # error comes after what the client has.
                        replay.stream.sequence = max(replay.stream.sequence, after + 1)
                        yield replay.error(run.code or "server_error", run.reason or f"The response {run.status}.")
                        return
                    continue
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), POLL_SECONDS)
                except asyncio.TimeoutError:
                    pass
                run = await in_io(self.get, response_id, user_id) or run
        finally:
            with self._lock:
                waiting = self._wakers.get(response_id, [])
                if waker in waiting:
                    waiting.remove(waker)
                if not waiting:
                    self._wakers.pop(response_id, None)

    # -- cancel and delete -------------------------------------------------------------------------
    def cancel(self, response_id: str, user_id: str | None) -> Run:
        """Stop a queued or running run from any process: nothing of it is written. Waits (up to
        `lease_seconds` + 5 s) until it has stopped; returns the run as it ended.

        Raises:
            ResponseNotFound: no such run, or another user's.
            InvalidRequest: the run had already ended (its status says how); nothing was cancelled.
        """
        run = self.get(response_id, user_id)
        if run is None:
            raise response_not_found(response_id)
        if run.status == "queued" and self.store.cancel_queued(response_id):
            local = self.local(response_id)
            if local is not None:  # waiting here: it stops now (on another process, at its keeper's next renew)
                local.cancel()
            return self.get(response_id, user_id)  # type: ignore[return-value]
        if not run.final:
            self.store.request_cancel(response_id)
            local = self._local.get(response_id)
            if local is not None:
                local.cancel()
            deadline = time.monotonic() + self.settings.lease_seconds + 5
            while time.monotonic() < deadline:
                run = self.get(response_id, user_id) or run
                if run.final:
                    break
                time.sleep(0.1)
        if run.status != "cancelled":
            raise InvalidRequest(
                f"Cannot cancel response '{response_id}': it is {run.status}" + (f" ({run.reason})" if run.reason else "")
                + "; nothing was cancelled.")  # fmt: skip
        return run


def request_fields(parsed: Any, *, lifecycle: bool = True) -> dict[str, Any]:
    """What a run's response objects need of its request (`Replay`); `lifecycle` False: the turn streams MLflow's
    event set (`/invocations`, `predict_stream`), which a resumed stream keeps, numbered as it was sent."""
    envelope = parsed.envelope
    out: dict[str, Any] = {}
    if not lifecycle:
        out["stream_events"] = "mlflow"
    if envelope.instructions is not None:
        out["instructions"] = envelope.instructions
    if envelope.thread_of_checkpoint:
        out["previous_response_id"] = f"resp_{envelope.checkpoint_id}"
    return out


class Recorder:
    """Writes one streamed turn's run row and event log as it runs (`record` each turn event, then `ended`).

    A background run's row exists already (`Runs.queue`); a stream's is written at its `TurnStarted`.
    Storage work goes through `in_io` (the agent's storage pool), awaited, so the event loop never blocks.
    """

    def __init__(self, runs: Runs, parsed: Any, *, background_id: str | None, lifecycle: bool = True) -> None:
        self.runs = runs
        self.parsed = parsed
        self.lifecycle = lifecycle
        self.background_id = background_id
        self.response_id = background_id
        self.ops = Ops()
        #: Every op written so far, in order: the whole log the rows are compacted into at the end.
        self.written: list[list[Any]] = []
        self.seq = 0
        self.flushing: asyncio.Task | None = None
        self.lock = asyncio.Lock()
        self.result: TurnResult | StoredResponse | None = None
        self.in_io: Callable[..., Any] | None = None
        #: The thread the turn runs on, once known (None: a new thread); recorded with the run's end, so that
        #: deleting the thread deletes the run (`Tx.delete_thread`) whether or not it committed.
        self.thread_id: str | None = None
        #: How a cancel reaches the turn's task (`LocalRun`), once its turn started.
        self.local: LocalRun | None = None

    def cancelled(self, error: BaseException) -> RunCancelled | ServerStopping | None:
        """`RunCancelled` when `error` is the cancel of the turn's task by a cancel asked for its run
        (`LocalRun.cancel`), `ServerStopping` when it is the shutdown's (`LocalRun.stop`), after undoing that
        cancel (`Task.uncancel`), so that the caller raises it instead and its stream ends with an `error`
        event; None for any other error (a client that left, a failure)."""
        local = self.local
        if not isinstance(error, asyncio.CancelledError) or local is None or not (local.cancelled or local.stopped):
            return None
        task = asyncio.current_task()
        if task is not None and task is local.task:
            task.uncancel()
        return RunCancelled(CANCELLED_WHILE_RUNNING) if local.cancelled else ServerStopping(STOPPED_AT_SHUTDOWN)

    async def record(self, event: Any, in_io: Callable[..., Any]) -> None:
        """Record one turn event (`TurnStarted` first).

        Raises:
            RunCancelled: a background run cancelled while it waited for its thread (checked at `TurnStarted`).
        """
        self.in_io = in_io
        if isinstance(event, TurnStarted):
            if self.background_id is None:
                self.response_id = event.response_id
                run = Run(event.response_id, self.parsed.envelope.user_id, "in_progress", False, self.thread_id,
                          request=request_fields(self.parsed, lifecycle=self.lifecycle))
                await in_io(self.runs.store.create, run)
                if self.runs.sweep_due():
                    await in_io(self.runs.maybe_sweep)
            elif not await in_io(self.runs.store.start, self.background_id):
                raise RunCancelled(f"The response {self.background_id!r} was cancelled before it started; nothing was written.")
            local = self.runs.local(self.response_id) if self.background_id is not None else None
            if local is None:
                local = LocalRun(asyncio.get_running_loop(), asyncio.current_task())
                self.runs.attach(self.response_id, local)
            self.local = local
            local.started = True  # from now on only a cancel asked stops its task (before, a status no longer queued)
        if self.response_id is None:
            return  # an idempotent replay before any start: nothing runs
        self.ops.add(event)
        if isinstance(event, (TurnResult, StoredResponse)):
            self.result = event
            await self.flush()
        elif self.flushing is None:
            self.flushing = asyncio.ensure_future(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(FLUSH_SECONDS)
        self.flushing = None
        await self.flush()

    async def flush(self) -> None:
        async with self.lock:
            ops = self.ops.take()
            if not ops or self.response_id is None:
                return
            self.written += ops
            seq, self.seq = self.seq, self.seq + 1
            await self.in_io(self.runs.store.append, self.response_id, seq, encode(ops, self.runs.keyring))
        self.runs.woken(self.response_id)

    async def ended(self, error: BaseException | None, in_io: Callable[..., Any]) -> None:
        """Record how the turn ended (`error` None: it yielded its result), in a task of its own that a cancel of
        the caller's task does not stop (module docstring); returns once it is recorded, or at once when the
        caller is cancelled meanwhile (the task records on). Never raises."""
        self.in_io = self.in_io or in_io
        end = asyncio.ensure_future(self._ended(error))
        self.runs.tasks.add(end)
        end.add_done_callback(self.runs.tasks.discard)
        with contextlib.suppress(asyncio.CancelledError):  # cancelled again: `end` records on (module docstring)
            await asyncio.shield(end)

    async def _ended(self, error: BaseException | None) -> None:
        # `flushing` is set only while `_flush_later` sleeps (it clears it before writing): cancelling it then
        # stops no write, and the flush below takes its ops. A write in progress holds `lock`, which the flush
        # below waits for, so rows land in order and a follower never skips one.
        if self.flushing is not None:
            self.flushing.cancel()
            self.flushing = None
        response_id = self.response_id
        if response_id is None:  # a stream that ended before its turn started: no run was recorded
            return
        try:
            if self.result is not None:
                status, reason, code = "completed", None, None
                custom = self.result.as_dict() if isinstance(self.result, TurnResult) else self.result.custom_outputs
                if custom.get("status") == "interrupted":
                    status = "incomplete"
                thread_id, checkpoint_id = custom.get("thread_id"), custom.get("checkpoint_id")
            else:
                status, reason, code = await self.in_io(_status_of, error, self.runs, response_id)
                thread_id, checkpoint_id = self.thread_id, None
                self.ops.failed(code, reason)
            await self._end(response_id, status, reason, code, thread_id, checkpoint_id)
        except BaseException:  # noqa: BLE001 - written again by the keeper (`Runs.end_later`), else its lease ends it
            logger.warning("Could not record the end of run %s; retrying until the database answers", response_id,
                           exc_info=True)  # fmt: skip
        finally:
            self.runs.detach(response_id)

    async def _end(self, response_id, status, reason, code, thread_id, checkpoint_id) -> None:  # type: ignore[no-untyped-def]
        with contextlib.suppress(Exception):  # the events not written yet go into the whole log below
            await self.flush()
        async with self.lock:  # after any flush still running (a pending `_flush_later`)
            whole = encode(self.written, self.runs.keyring, whole=True) if self.seq else None
            last_seq = self.seq - 1

            def write() -> None:
                self.runs.store.finish(response_id, status, reason=reason, code=code, thread_id=thread_id,
                                       checkpoint_id=checkpoint_id, whole=whole, last_seq=last_seq)  # fmt: skip

            try:
                await self.in_io(write)
            except Exception:
                self.runs.end_later(response_id, write)
                raise
        self.runs.woken(response_id)


def _status_of(error: BaseException | None, runs: Runs, response_id: str) -> tuple[str, str, str]:
    """(status, reason, code) of a run that ended without its result."""
    if isinstance(error, RunCancelled):
        return "cancelled", str(error), "cancelled"
    run = None
    with contextlib.suppress(Exception):
        run = runs.store.get(response_id)
    if run is not None and run.status in FINAL:  # cancelled while queued: the task stopped waiting (`Runs._keep`)
        return run.status, run.reason or f"The response {run.status}.", run.code or run.status
    if run is not None and run.cancel_requested:
        return "cancelled", CANCELLED_WHILE_RUNNING, "cancelled"
    if error is None or isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        if runs.stopping:  # `Runs.stop_all`, or uvicorn cancelling a stream the shutdown could not wait for
            return "failed", STOPPED_AT_SHUTDOWN, SHUTDOWN_CODE
        return "cancelled", "The client left the stream, which cancelled the turn; nothing was written.", "client_left"
    if isinstance(error, AgentError):
        return "failed", error.message, answer_for(error).openai_code or "server_error"
    return "failed", f"Internal error ({type(error).__name__}); see the server log.", "server_error"
