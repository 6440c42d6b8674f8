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

`Retry-After` is the mean time the last turns held their place (an exponential
moving average), in whole seconds from 1 to 60: after about one turn length the
running turns have ended and as many waiting ones have started, so the queue has
room again. The `openai` client waits that long and retries by itself (twice, by default).

Runs inside `RequestBodyLimits` (`serving.limits`), which has read the body whole,
checked it and left its parsed object in the scope: a turn is told apart from an
action without parsing its body again, and waiting does not count against `body_timeout`.
"""

from __future__ import annotations

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
            self.admission.record(time.monotonic() - self.started)

    def _held(self) -> None:
        self.held, self.started = True, time.monotonic()

    def _unqueue(self) -> None:
        if self.queued:
            self.queued = False
            self.admission.waiting -= 1


class TurnAdmission:
    """ASGI middleware: at most `max_running` turns run at once, `max_waiting` more wait, others get 429."""

    def __init__(self, app: Any, *, max_running: int, max_waiting: int) -> None:
        self.app = app
        self.max_waiting = max_waiting
        self.running = anyio.CapacityLimiter(max_running)
        #: Turns waiting for a place now.
        self.waiting = 0
        #: Mean seconds a turn held its place (0 until one finished), for `Retry-After`.
        self.mean_turn_seconds = 0.0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body = scope.get(JSON_BODY_KEY) if scope["type"] == "http" and scope["method"] == "POST" else None
        if body is None or scope.get("path") not in TURN_PATHS or not asks_for_turn(body):
            await self.app(scope, receive, send)
            return
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
            f"The server is busy: {self.running.total_tokens:g} turns are running and {self.max_waiting} waiting, "
            f"as many as it takes; nothing was written. Retry after {retry_after} s."
        )
        body = answer_body(scope.get("path", ""), error)
        await send_error_answer(scope, send, http_status(error), body, headers=[(b"retry-after", str(retry_after).encode())])

    def retry_after(self) -> int:
        """Seconds a refused turn is told to wait: about one turn length (module docstring)."""
        return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(self.mean_turn_seconds)))

    def record(self, seconds: float) -> None:
        """Count a turn that held its place `seconds` in the mean turn length."""
        if self.mean_turn_seconds == 0.0:
            self.mean_turn_seconds = seconds
        else:
            self.mean_turn_seconds += TURN_LENGTH_WEIGHT * (seconds - self.mean_turn_seconds)
