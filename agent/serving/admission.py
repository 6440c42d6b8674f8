"""`TurnAdmission`: ASGI middleware that bounds the turns one server process runs at once.

A turn costs the server process CPU at its start (parse, claim, history, trace) and
its end (commit, trace), all on the process's one event loop. Without a bound, a
burst of hundreds of turns keeps that loop busy: every turn of the burst finishes
near its end, and `GET /health` waits seconds for its turn on the loop. So:

* At most `max_running_turns` turns run at once (`anyio.CapacityLimiter`, which
  hands a freed place to the turn that has waited longest: first come, first served).
* Up to `max_waiting_turns` more wait for a place, with their body read. A waiting
  turn whose client goes away (its connection closes) leaves the queue and never runs.
* Beyond that a turn is refused at the door with `ServerBusy`: 429, the route's
  error body (OpenAI's on `/responses`, MLflow's on `/invocations`: `serving.errors`)
  and `Retry-After`. It never reached the agent: nothing was written.

Only turns count: `POST /responses` and `POST /invocations` whose body asks for a
turn (`agent.requests.asks_for_turn`: no `custom_inputs.action`, or an action that runs
as a turn, `merge_branch`, which calls the model), streamed or not; a stream holds its
place until its last event. A turn that outlives its request keeps its place until it
ends (`agent.runs.places`): a background run, and a stream whose client left under
`finish_left_streams`. A background request is never held in the queue, since it
answers `queued` at once: when every place is taken it takes a waiting place and its
run waits for a running one, reading `queued` meanwhile; with the queue full it gets the
429 like any turn. Other actions (history, state, branches, threads: they never call the
model), the `/conversations` and `/responses/{id}`
routes, `GET /health`, `GET /ready` and every other route pass at once: they never
wait behind turns.

**The loop's lag sets how many of them run** (`loop_lag_target_seconds`, 0.02 s by
default; 0 turns it off), `max_running_turns` being the most. What keeps `GET /health`
and reads fast is how long a round of the event loop takes (a request waits for about
two: one before its bytes are read, one before its handler runs), and during a burst a
round is the running turns' steps (a chunk each, starts, commits) over the share of a
core the process gets, which the machine's other work sets, not the process. Measured
with `bench.users` (500 streamed turns of a 2 s model on a shared 2-CPU machine at load
average 13 to 15, a probe in the server): with 200 running, the server's main thread
ran 6.9 s and waited 13.2 s for a CPU during the burst, the loop ran a timer up to 0.19 s
late (p99) and `/health` took 0.52 s (p99); with 50 running, 0.07 s and 0.18 s, for the
same wall (33 s against 27 to 35 s), since the loop is busy either way. Garbage
collections (under 0.1 s each since `serving.collector`), slow callbacks (none over
0.11 s), MLflow's trace writers and the storage threads (about 2 s of CPU in a 14 s burst)
were not where it waited: turning tracing off did not lower the p99. A fixed number cannot
fit every machine and load, so the bound adapts, like a congestion window: a timer reads
how late the loop runs it, every `LAG_TICK_S`, into a moving average (`LAG_WEIGHT`); while
that is over the target, the bound goes down to 3/4 of the turns running (not below
`MIN_RUNNING_TURNS`), at most once per mean turn length (`HOLD_MIN_S` to `HOLD_MAX_S`: the
turns already running end only then); while it is under a quarter of the target and turns
wait, it grows by 2% per tick, up to `max_running_turns`. A burst starts from
`MIN_RUNNING_TURNS`: started all at once, 200 turns' first steps would hold the loop for
seconds before any lag was seen. Running turns are never stopped; only the start of
waiting ones is paced. Idle (nothing running or waiting), the timer stops and the bound
goes back to its start.

`Retry-After` is about one turn length, in whole seconds from 1 to 60: after about one
turn length the running turns have ended and as many waiting ones have started, so the
queue has room again. The `openai` client waits that long and retries by itself (twice,
by default). A turn length is the mean time the last turns held their place (an
exponential moving average). Before any turn has ended (a cold start) there is no
mean: then it is `COLD_TURN_SECONDS` (5 s), or how long the oldest running turn has
run so far when that is longer (every running turn will have taken at least that).
Not 1 s: a client that retries before a place frees is refused again and has spent one
of its retries, while one that retries a little late only waits.

Runs inside `RequestBodyLimits` (`serving.limits`), which has read the body whole,
checked it and left its parsed object in the scope: a turn is told apart from an
action without parsing its body again, and waiting does not count against `body_timeout`.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import anyio

from agent.errors import ServerBusy
from agent.requests import asks_for_background, asks_for_turn
from agent.runs.places import request_place
from agent.serving.errors import answer_body, http_status, send_error_answer
from agent.serving.limits import JSON_BODY_KEY

#: The routes whose requests may be turns.
TURN_PATHS = frozenset({"/responses", "/invocations"})
#: Bounds of `Retry-After`, in seconds (the `openai` client ignores a longer one and backs off on its own).
RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S = 1, 60
#: Weight of the latest turn in the mean turn length behind `Retry-After`.
TURN_LENGTH_WEIGHT = 0.2
#: The turn length `Retry-After` assumes before any turn has ended, in seconds: a turn with a hosted model
#: commonly takes a few seconds (the benchmarks' stand-in model: 2 s), and erring long costs a client less.
COLD_TURN_SECONDS = 5
#: The adaptive bound (module docstring): its floor and start, how often the loop's lag is read (seconds),
#: how far it goes down and up, and how long it waits after going down (seconds, around the mean turn length).
MIN_RUNNING_TURNS = 32
LAG_TICK_S = 0.05
BOUND_DECREASE, BOUND_INCREASE = 0.75, 0.02
#: Weight of the latest tick in the loop's lag (a moving average over about 10 ticks: one late round is noise).
LAG_WEIGHT = 0.1
HOLD_MIN_S, HOLD_MAX_S = 0.5, 2.0


class AdmissionPlace:
    """One turn's place (`agent.runs.places.Place`): held among the running turns, or waiting in the queue.

    The `CapacityLimiter` counts it as its borrower while it is held. Used on the server's event loop only.
    """

    def __init__(self, admission: TurnAdmission) -> None:
        self.admission = admission
        self.held = self.queued = self.kept = self.released = False
        self.started = 0.0

    def take_now(self) -> bool:
        """Take a running place if one is free; whether it did."""
        try:
            self.admission.running.acquire_on_behalf_of_nowait(self)
        except anyio.WouldBlock:
            return False
        self._held()
        return True

    def enqueue(self) -> None:
        """Count this place among the waiting ones (the caller checked that the queue has room)."""
        self.admission.waiting += 1
        self.queued = True

    async def wait(self) -> None:
        if self.held or self.released:
            return
        if not self.queued:
            self.enqueue()
        try:
            await self.admission.running.acquire_on_behalf_of(self)
        finally:
            self._unqueue()
        self._held()

    def keep(self) -> None:
        self.kept = True

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._unqueue()
        if self.held:
            self.held = False
            self.admission.running.release_on_behalf_of(self)
            self.admission.holding.pop(self, None)
            self.admission.record(time.monotonic() - self.started)

    def _held(self) -> None:
        self.held, self.started = True, time.monotonic()
        self.admission.holding[self] = None

    def _unqueue(self) -> None:
        if self.queued:
            self.queued = False
            self.admission.waiting -= 1


class TurnAdmission:
    """ASGI middleware: at most `max_running` turns run at once (fewer while the event loop lags more than
    `lag_target` seconds; 0: always up to `max_running`), `max_waiting` more wait, others get 429."""

    def __init__(self, app: Any, *, max_running: int, max_waiting: int, lag_target: float = 0.0) -> None:
        self.app = app
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.lag_target = lag_target
        #: Where the bound starts a burst: all of `max_running` when it does not adapt.
        self.start_bound = min(max_running, MIN_RUNNING_TURNS) if lag_target else max_running
        self.running = anyio.CapacityLimiter(self.start_bound)
        #: Turns waiting for a place now.
        self.waiting = 0
        #: Mean seconds a turn held its place (0 until one finished), for `Retry-After`.
        self.mean_turn_seconds = 0.0
        #: The places held now, oldest first (a dict keeps its insertion order), for `Retry-After` at a cold start.
        self.holding: dict[AdmissionPlace, None] = {}
        #: The loop's lag, seconds: a moving average of how late the ticks ran.
        self.lag = 0.0
        self._ticking = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hold_until = 0.0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body = scope.get(JSON_BODY_KEY) if scope["type"] == "http" and scope["method"] == "POST" else None
        if body is None or scope.get("path") not in TURN_PATHS or not asks_for_turn(body):
            await self.app(scope, receive, send)
            return
        if self.lag_target and (not self._ticking or self._loop is not asyncio.get_running_loop()):
            self._start_ticking()  # the first turn, the first after an idle time, or a new loop (a test client's)
        place = AdmissionPlace(self)
        if not place.take_now():
            if self.waiting >= self.max_waiting:
                await self._refuse(scope, send)
                return
            if asks_for_background(body):
                place.enqueue()  # answered at once; its run waits for the place (`agent.runs.places`)
            else:
                receive = await self._wait(place, receive)
                if receive is None:
                    return  # the client left while its turn waited: it never runs
        token = request_place.set(place)
        try:
            await self.app(scope, receive, send)
        finally:
            request_place.reset(token)
            if not place.kept:  # a turn that outlives its request gives its place back itself
                place.release()

    async def _wait(self, place: AdmissionPlace, receive: Any) -> Any:
        """Wait for a place, watching the connection; the `receive` the app gets then, or None when the
        client left first (the turn then holds no place)."""
        # The body was read whole (RequestBodyLimits replays it): take it now, so that what the watcher
        # below receives can only be the client leaving, and hand it to the app afterwards.
        messages = [await receive()]
        while messages[-1]["type"] == "http.request" and messages[-1].get("more_body"):
            messages.append(await receive())
        if messages[-1]["type"] != "http.request":
            return None
        left = False
        place.enqueue()
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    nonlocal left
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    left = True
                    group.cancel_scope.cancel()  # cancels the wait below, which then holds no place

                group.start_soon(watch)
                await place.wait()
                group.cancel_scope.cancel()
        finally:
            if left or not place.held:
                place.release()  # the place came as the client left: it goes to the next turn
        if left or not place.held:
            return None

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        return replay

    async def _refuse(self, scope: dict, send: Any) -> None:
        retry_after = self.retry_after()
        error = ServerBusy(
            f"The server is busy: {self.running.borrowed_tokens} turns are running and {self.max_waiting} waiting, "
            f"as many as it takes; nothing was written. Retry after {retry_after} s."
        )
        body = answer_body(scope.get("path", ""), error)
        await send_error_answer(scope, send, http_status(error), body, headers=[(b"retry-after", str(retry_after).encode())])

    def _start_ticking(self) -> None:
        self._ticking = True
        self._loop = loop = asyncio.get_running_loop()
        due = loop.time() + LAG_TICK_S
        loop.call_at(due, self._tick, loop, due)

    def _tick(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        """Read how late the loop ran this timer and move the bound (module docstring); then the next tick."""
        if loop is not self._loop:
            return  # the ticks of a loop the middleware has left
        now = loop.time()
        running = self.running.borrowed_tokens
        if not running and not self.waiting:
            self._ticking = False
            self.running.total_tokens, self.lag = self.start_bound, 0.0
            return
        self.adjust(now - due, running, now)
        loop.call_at(now + LAG_TICK_S, self._tick, loop, now + LAG_TICK_S)

    def adjust(self, lag: float, running: int, now: float) -> None:
        """Move the bound of running turns for a loop that ran a timer `lag` seconds late, with `running`
        turns running, at `now` (the loop's clock, seconds)."""
        self.lag += LAG_WEIGHT * (lag - self.lag)
        bound = int(self.running.total_tokens)
        if self.lag > self.lag_target:
            if now >= self._hold_until:
                self.running.total_tokens = max(min(MIN_RUNNING_TURNS, self.max_running),
                                                int(min(bound, running) * BOUND_DECREASE))  # fmt: skip
                self._hold_until = now + min(HOLD_MAX_S, max(HOLD_MIN_S, self.mean_turn_seconds))
        elif self.lag < self.lag_target / 4 and self.waiting and running >= bound:
            self.running.total_tokens = min(self.max_running, bound + max(1, int(bound * BOUND_INCREASE)))

    def retry_after(self) -> int:
        """Seconds a refused turn is told to wait, from 1 to 60: about one turn length, the mean of the last turns;
        before any turn has ended, `COLD_TURN_SECONDS` or the oldest running turn's time so far, the longer
        (module docstring)."""
        seconds = self.mean_turn_seconds
        if not seconds:
            oldest = next(iter(self.holding), None)
            seconds = max(COLD_TURN_SECONDS, time.monotonic() - oldest.started if oldest is not None else 0.0)
        return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(seconds)))

    def record(self, seconds: float) -> None:
        """Count a turn that held its place `seconds` in the mean turn length."""
        if self.mean_turn_seconds == 0.0:
            self.mean_turn_seconds = seconds
        else:
            self.mean_turn_seconds += TURN_LENGTH_WEIGHT * (seconds - self.mean_turn_seconds)
