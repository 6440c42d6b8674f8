"""The garbage collector of a server process: start-up objects frozen, full collections rarer.

CPython's cyclic garbage collector stops every thread while it runs, and a full
(generation 2) collection walks every tracked object of the process. A server
process holds about 600,000 of them once its imports are done (MLflow,
LangChain, pydantic, FastAPI), and a burst of streams adds hundreds per open
stream; with the default thresholds (700, 10, 10) a burst of 500 streamed turns
set off a full collection every two seconds or so, each stopping the event loop
for 0.4 to 1.6 s on a 2-CPU machine: `GET /health`'s p99 was 1.7 s and another
user's history read waited up to 5 s (measured with `gc.callbacks`, `bench.users`).
So, once per server process at start-up (`serving.app.with_lifespan`):

* `gc.freeze()` after a collection moves every object alive at start-up into
  the permanent generation: no later collection walks them (they live as long as
  the process anyway). This is the remedy the `gc` documentation gives for
  servers ("gc.freeze(): ... for workloads that would otherwise... avoid
  copy-on-write and collection pauses").
* The first generation's threshold goes from 700 to `GEN0_THRESHOLD`
  allocations, so the young collections, and the full ones they lead to, run
  that many times less often; each young collection still walks only the young
  objects, so none lasts longer. Reference counting frees everything that has no
  cycle at once, as before: only cyclic garbage waits longer, and a burst's worth
  of it is a few megabytes.

Nothing of the agent's own behaviour changes; the in-process API (`create_agent`)
leaves the caller's collector alone.
"""

from __future__ import annotations

import gc

#: `gc.set_threshold` of a server process; CPython's defaults are (700, 10, 10).
THRESHOLDS = (700, 10, 100)


def tune_for_serving() -> None:
    """Freeze the objects alive now and make collections rarer (module docstring). Call once, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
