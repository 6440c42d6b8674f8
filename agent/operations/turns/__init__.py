"""Turns: claim the thread, run the graph with its writes buffered, commit. One async body, a sync bridge.

A turn (see `agent.storage.base` for why it is built this way):

1. **Claim** the thread (one short round trip, which also reads the thread
   record and the start checkpoint). A stranger's thread answers ThreadNotFound.
2. **Prepare**: authorize; pick the start ("head unless branching", the one
   owner of that rule is `start.start_of`); a new thread gets its empty **root**
   checkpoint first, so that its first message can be edited like any other.
   The user's long-term memories for the turn are read (`start.recall`) and
   handed to the model-input pipeline in the turn's `TurnContext`; those
   reads (the memory listing, the query's embedding) start before the claim,
   on other threads, so their round trips overlap the claim's
   (`TurnRunner._prime_recall`).
3. **Run** the graph (`graph.astream`) with every checkpoint and write
   buffered in memory. No connection is held. The claim is renewed
   meanwhile; if a newer turn asks this one to stop (`interrupt` /
   `rollback`, or a claim found lost sets `claim.stop`), the pending step is
   cancelled at once, model request included (`progress.until`).
4. **Commit** (one short transaction) or **release** (nothing written). The commit also
   applies the long-term memory operations among the turn's new messages (`agent.memory`).

An edit (`edit_message_id`) or a regeneration starts elsewhere, with other
messages: `agent.operations.edits` decides where and what, reading only the
thread's tree of checkpoint summaries and the start checkpoint (done with
the claim). A turn with an idempotency key first looks it up, and its commit
stores its result under the key (`agent.operations.idempotency`): a retry gets
that result as a `StoredResponse` instead of a run.

**One body.** The turn is written once, async (`TurnRunner.arun`: the HTTP
server awaits the model's HTTP request, and a client that leaves cancels the
task); the sync `TurnRunner.run` (`predict`, the CLI, notebooks) drives that
same generator on a loop thread of its own, as langgraph's
`checkpoint/postgres/aio.py` bridges sync calls to async ones with
`asyncio.run_coroutine_threadsafe(...).result()` and psycopg_pool generates its
sync pool from the async one. See `bridge` for how, and why a loop per turn.

Modules: `args` (what a turn is asked, where it starts, what it yields),
`parts` (the agent's parts every step works with), `start` (claim, plan,
prepare, recall), `progress` (the graph's stream as the turn's events),
`commit` (finish, commit or keep an interrupted turn), `updates` (state
updates: a checkpoint written without a run), `bridge` (sync calls into the
async body), `runner` (`TurnRunner`, the entry points).
"""

from agent.operations.turns.args import TurnArgs, TurnEvent
from agent.operations.turns.progress import INTERRUPT
from agent.operations.turns.runner import TurnRunner
from agent.operations.turns.start import ROOT_SOURCE

__all__ = ["INTERRUPT", "ROOT_SOURCE", "TurnArgs", "TurnEvent", "TurnRunner"]
