"""The Responses API objects of runs (`agent.runs`): `GET /responses/{id}`, its cancel and its delete.

`retrieve` answers from the run while there is one that is not completed (queued, in progress, failed,
cancelled: the turn wrote no checkpoint), and from the checkpoint once the turn committed (a background
run's response keeps the run's id; `custom_outputs.response_id` names its checkpoint). A response that
never was a run (an unstreamed turn) is its checkpoint's, as before.

**What DELETE removes.** A response here is a checkpoint, and a checkpoint is part of its thread's tree:
later turns and sibling branches start from it, and its descendants hold its messages. Deleting it alone
would cut the branch under it, so `DELETE /responses/{id}` never deletes a checkpoint. It deletes the
response's stored *run record* (its status and stored stream events), and says so:
`{"id", "object": "response.deleted", "deleted": true, "removed": ["run", "events"], "kept": {...}}`, where
`kept` names the checkpoint and thread still stored (delete a thread with `DELETE /conversations/{id}` or
`delete_thread`). A response with no run record (an unstreamed turn, or one whose record was swept) is a
400 saying the same, nothing deleted. A run still queued or running is a 409 (cancel it first).
"""

from __future__ import annotations

from typing import Any

from agent.errors import InvalidRequest, ResponseNotFound, ThreadBusy, shown_id
from agent.operations import conversations as ops
from agent.response_events import created_at, response_object
from agent.runs import Run


def retrieve(agent: Any, response_id: str, user_id: str | None) -> dict[str, Any]:
    """The response object of `response_id` (module docstring).

    Raises:
        ResponseNotFound: unknown, or another user's.
    """
    run = agent.runs.get(response_id, user_id)
    if run is None or (run.status == "completed" and not run.background):
        return ops.response_object(agent.storage, response_id, user_id=user_id, model=agent.settings.model)
    if run.status in ("completed", "incomplete") and run.checkpoint_id:
        whole = ops.response_object(agent.storage, f"resp_{run.checkpoint_id}", user_id=user_id, model=agent.settings.model)
        # What the turn answered (`steer`, `status`, ...), as a request that waited for it got it.
        custom = {**whole["custom_outputs"], **(agent.runs.answered_outputs(run) or {}), "background": True}
        return {**whole, "id": run.response_id, "created_at": created_at(run.response_id), "custom_outputs": custom}
    return status_object(agent, run)


def status_object(agent: Any, run: Run) -> dict[str, Any]:
    """A run that has no checkpoint (yet) as a Responses API object: `output` empty, `status` the run's, `error`
    for a failed one (OpenAI's `server_error` code, the reason as message), `custom_outputs` with `response_id`,
    `background` and `thread_id` (null: a new thread, not written), and for a failed or cancelled one the run's own
    `code` and `reason`, `checkpoint_id: null` and `written: false` (nothing of the turn is stored)."""
    fields = response_object([], run.response_id, run.status, parsed=None, model=agent.settings.model)
    fields.update({key: value for key, value in run.request.items()})
    if run.status == "failed":
        # OpenAI's Response allows only its own error codes here (an OpenAI client's model refuses another);
        # the run's own code (`not_found`, `unavailable`, `lease_expired`...) is `custom_outputs.code`.
        fields["error"] = {"code": "server_error", "message": run.reason or "The turn failed."}
    custom: dict[str, Any] = {"response_id": run.response_id, "background": run.background, "thread_id": run.thread_id}
    if run.status in ("failed", "cancelled"):
        custom.update({"checkpoint_id": None, "code": run.code, "reason": run.reason, "written": False})
    fields["custom_outputs"] = custom
    return fields


def cancel(agent: Any, response_id: str, user_id: str | None) -> dict[str, Any]:
    """Cancel the run `response_id` (`Runs.cancel`); its response object, `status: "cancelled"`.

    Raises:
        ResponseNotFound: unknown, or another user's.
        InvalidRequest: it had already ended (completed, failed), or it is a checkpoint that was never a run.
    """
    try:
        return status_object(agent, agent.runs.cancel(response_id, user_id))
    except ResponseNotFound:
        kept = _kept(agent, None, response_id, user_id)
        if kept is None:
            raise
        raise InvalidRequest(f"Cannot cancel response {response_id!r}: it is completed (checkpoint {kept['checkpoint_id']!r}); "
                             "nothing was cancelled.") from None  # fmt: skip


def delete(agent: Any, response_id: str, user_id: str | None) -> dict[str, Any]:
    """Delete the run record of `response_id` (module docstring).

    Raises:
        ResponseNotFound: unknown, or another user's.
        ThreadBusy: the run is still queued or running.
        InvalidRequest: the response has no run record (only its checkpoint, which is never deleted here).
    """
    run = agent.runs.get(response_id, user_id)
    kept = _kept(agent, run, response_id, user_id)
    if run is None:
        if kept is None:
            raise ResponseNotFound(f"Response {shown_id(response_id)} was not found.", response_id=response_id)
        raise InvalidRequest(
            f"Response {response_id!r} is checkpoint {kept['checkpoint_id']!r} of thread {kept['thread_id']!r} and has no "
            "stored run record; a checkpoint is part of its thread's history and is never deleted alone (delete the "
            "thread with DELETE /conversations/{id}). Nothing was deleted."
        )
    if not run.final:
        raise ThreadBusy(f"Response {response_id!r} is {run.status}; cancel it first (POST /responses/{{id}}/cancel). "
                         "Nothing was deleted.")  # fmt: skip
    agent.runs.store.delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True, "removed": ["run", "events"], "kept": kept}


def _kept(agent: Any, run: Run | None, response_id: str, user_id: str | None) -> dict[str, str] | None:
    """The checkpoint (and thread) the response names, which DELETE keeps; None when there is none."""
    checkpoint_id = run.checkpoint_id if run is not None and run.checkpoint_id else response_id.removeprefix("resp_")
    try:
        record = ops.thread_of_response(agent.storage, checkpoint_id, user_id=user_id)
    except ResponseNotFound:
        return None
    return {"checkpoint_id": checkpoint_id, "thread_id": record.thread_id}
