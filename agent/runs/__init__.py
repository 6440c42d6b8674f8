"""Turns that outlive their connection: background runs, resumable streams, cancel (OpenAI's Responses API).

* A **run** is a streamed or background turn as other requests see it: its status (`queued`,
  `in_progress`, `completed`, `failed`, `cancelled`, `incomplete`) and its event log, kept in the
  database every replica reads (`store`), so `GET /responses/{id}?stream=true&starting_after=N` resumes a
  stream on any replica (`service.Runs.follow`), and `POST /responses/{id}/cancel` stops it from any replica.
* The log holds the turn's own events, compactly, and the stream is made again from them (`log`): stored
  bytes stay within the turn's text plus a few bytes per delta.
* A **background** run (`background: true`) answers at once with its id and `queued`, then runs on the
  process that took it, under the same claim, lease and fencing as every turn; that process renews the
  run's own lease, so a run whose process died reads `failed` (lease expired), never `in_progress` forever.
  Its response id is made when it is asked for, before the turn holds its thread, so it is not its
  checkpoint's id (a checkpoint id is made after the claim, to sort after the turn's start): once
  completed, `custom_outputs.checkpoint_id` / `response_id` name the checkpoint, which is what later turns
  continue from (`previous_response_id` takes either id while the run is kept).

Modules: `store` (tables and statements per backend), `log` (the compact log and its replay), `service`
(`Runs`: recording, following, leases, cancel).
"""

from agent.runs.service import Recorder, RunCancelled, Runs, run_cancelled
from agent.runs.store import Run

__all__ = ["Recorder", "Run", "RunCancelled", "Runs", "run_cancelled"]
