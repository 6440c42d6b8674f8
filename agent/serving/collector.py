"""The garbage collector of a server process: start-up objects frozen, full collections rarer.

CPython's cyclic garbage collector stops every thread of the process while it runs,
and a full (generation 2) collection walks every tracked object. A server process
holds about 480,000 of them once it has started (MLflow, LangChain, pydantic,
FastAPI and the agent), and a burst of streams adds hundreds per open stream. With
the default thresholds (700, 10, 10), a burst of 500 streamed turns set off a full
collection every two seconds or so, each stopping the event loop for 0.4 to 1.6 s
on a 2-CPU machine under load (seen with `gc.callbacks`): `GET /health`'s p99 was
1.7 s. So, once per server process, at start-up (`serving.app.with_lifespan`, in a worker thread once the
server answers, after the tracer is built):

* `gc.freeze()`, after a collection, moves every object alive at start-up into
  the permanent generation, which no collection walks: they live as long as the
  process anyway.
* The oldest generation's threshold goes from 10 to 100 (`THRESHOLDS`): a full
  collection runs after 100 collections of the middle generation instead of 10
  (and, as CPython requires, only when the objects that reached the oldest
  generation since the last one are a quarter of it). The young collections are
  unchanged, so none of them lasts longer, and objects without reference cycles
  are freed at once as before: only cyclic garbage that survived two young
  collections waits longer to be freed.

Nothing of the agent's behaviour changes; the in-process API (`create_agent`) leaves
the caller's collector alone.
"""

from __future__ import annotations

import gc

#: `gc.set_threshold` of a server process; CPython's defaults are (700, 10, 10).
THRESHOLDS = (700, 10, 100)


def tune_for_serving() -> None:
    """Freeze the objects alive now and make full collections rarer (module docstring). Call once, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
