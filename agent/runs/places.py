"""A turn's place under the server's admission bound, kept by a turn that outlives its HTTP request.

`tt-agent serve` bounds the turns one process runs at once (`serving.admission`): a turn takes a
place when its request comes in and gives it back when the request ends. Two kinds of turn outlive
their request, and would run beyond the bound if the place went with the request:

* a **background run** (`background: true`): the request answers `queued` at once and the turn runs in
  a task of its own;
* a stream whose client left, under `finish_left_streams`: the turn runs on to its end.

So the admission hands the request its `Place` (`request_place`, a context variable: set by the
middleware, read by the code that starts the outliving task, which inherits it), and that code calls
`keep_request_place()`: from then on the request's end no longer gives the place back; the task does,
with `Place.release()`, when the turn ends. A background request that finds every place taken does not
wait in the request (it must answer at once): its place is a *waiting* one, counted in the bounded
queue, and the run waits for it (`Place.wait`) while it reads `queued`; with the queue full, the request
is refused with 429 and `Retry-After` at the door, like any turn.

This module is the contract between the two layers (the agent starts the tasks, the server admits):
the agent never imports the server. Outside `tt-agent serve` (the in-process API, `mlflow models
serve`) there is no admission and `request_place` is None.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol


class Place(Protocol):
    """A turn's place among the running turns of the process (`serving.admission.AdmissionPlace`)."""

    def keep(self) -> None:
        """The turn outlives its request: the request's end no longer releases the place."""

    async def wait(self) -> None:
        """Return once the place is held (at once if it is); a waiting place waits first come, first served."""

    def release(self) -> None:
        """Give the place back (or leave the queue); idempotent."""


#: The current request's place (None: no admission, or the request is not a turn).
request_place: ContextVar[Place | None] = ContextVar("request_place", default=None)


def keep_request_place() -> Place | None:
    """Keep the current request's place for a task that outlives the request (module docstring); the task must
    `release()` it when its turn ends. None when there is no admission."""
    place = request_place.get()
    if place is not None:
        place.keep()
    return place
