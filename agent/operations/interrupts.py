"""Human in the loop: the graph's pending `interrupt()`s, and how a turn answers them.

A node that calls LangGraph's `interrupt(value)` stops the run; the turn commits
the interrupted checkpoint (its pending writes hold the `Interrupt`s) and it
becomes the thread head, with `next_nodes` naming where it waits. The turn's
result lists the questions (`TurnResult.interrupts`; `custom_outputs.interrupts`
and an `mcp_approval_request` output item on the wire).

The next turn from that checkpoint either

* **resumes** (`custom_inputs.resume`): the graph runs on LangGraph's
  `Command(resume=value)`. One pending interrupt takes any JSON value but null
  and `{}` (LangGraph cannot tell them from no answer); several are answered by
  id, `{interrupt_id: value, ...}` (LangGraph's own form: a mapping whose keys
  are all interrupt ids), all of them in one request: answering some of the
  interrupts of one superstep makes LangGraph write no new checkpoint, only
  pending writes on the interrupted one, and stored checkpoints never change;
* or sends new messages with `custom_inputs.cancel_interrupts: true`: LangGraph
  drops a checkpoint's pending tasks when new input arrives there, so the
  questions stay unanswered on that checkpoint (which stays in the history, and
  can be resumed later by branching from it); the result names them in
  `cancelled_interrupts`.

A new message without either is refused (`InterruptPending`), so that nobody
answers an approval question by accident. Every refusal here happens before
the run, so nothing is written.

An edit or a regeneration that starts at a checkpoint with pending interrupts
replaces a user message that was already sent past them (with
`cancel_interrupts`): it leaves them unanswered again without being asked to,
as re-running that turn in LangGraph (new input at the checkpoint) drops the
pending tasks again, and names them in `cancelled_interrupts`
(`turns.start.answering`).

Time travel needs nothing special: a checkpoint before the interrupt has none
pending (a turn from there reruns to it), and an interrupted checkpoint can be
resumed again from the history, which makes a sibling branch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.errors import InterruptPending, InvalidRequest
from agent.types import PendingInterrupt

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple

    from agent.operations.turn_options import Resume

#: The pending-writes channel where LangGraph keeps a task's interrupts.
INTERRUPT_CHANNEL = "__interrupt__"
#: The channel of a task's answers so far (LangGraph's `RESUME`): written when its `interrupt()` takes one.
RESUME_CHANNEL = "__resume__"
#: What LangGraph takes for an interrupt id in a resume mapping (`pregel._utils.is_xxh3_128_hexdigest`).
_INTERRUPT_ID = re.compile(r"[0-9a-f]{32}")


def pending_interrupts(checkpoint: CheckpointTuple | None) -> list[PendingInterrupt]:
    """The interrupts a stored checkpoint waits on, in the order LangGraph wrote them (none for None)."""
    if checkpoint is None:
        return []
    found: list[PendingInterrupt] = []
    for _task_id, channel, value in checkpoint.pending_writes or ():
        if channel == INTERRUPT_CHANNEL:
            found.extend(PendingInterrupt(item.id, item.value) for item in as_list(value))
    return found


def stopped_at(interrupts: Iterable[Any], writes: Sequence[tuple]) -> list[PendingInterrupt]:
    """The interrupts a run stopped at (from its "updates" stream), each with the node that waits:
    read from the task path of the buffered write that holds it (`~__pregel_pull, <node>`)."""
    nodes: dict[str, str] = {}
    for _config, task_writes, _task_id, task_path in writes:
        node = _node_of(task_path)
        for channel, value in task_writes:
            if channel == INTERRUPT_CHANNEL and node is not None:
                nodes.update((item.id, node) for item in as_list(value))
    seen: set[str] = set()
    out: list[PendingInterrupt] = []
    for item in interrupts:
        if item.id not in seen:
            seen.add(item.id)
            out.append(PendingInterrupt(item.id, item.value, nodes.get(item.id)))
    return out


def answer(
    pending: Sequence[PendingInterrupt],
    resume: Resume | None,
    cancel: bool,
    thread_id: str | None,
    checkpoint_id: str | None,
) -> tuple[Resume | None, tuple[str, ...]]:
    """What a turn from a checkpoint with `pending` interrupts does: `(resume to run, ids left unanswered)`.

    Raises:
        InvalidRequest: `resume` with nothing pending; a resume mapping naming an id that is not pending;
            one plain value while several interrupts wait.
        InterruptPending: new messages while interrupts wait, without `cancel`.
    """
    ids = [interrupt.id for interrupt in pending]
    where = f"checkpoint {checkpoint_id!r} of thread {thread_id!r}"
    if resume is None:
        if not pending or cancel:
            return None, tuple(ids) if cancel else ()
        raise InterruptPending(
            f"The graph waits for an answer at {where} (interrupt ids {ids}): answer with "
            "custom_inputs.resume, or send the message with custom_inputs.cancel_interrupts: true to leave the "
            "question unanswered. Nothing was written.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    if not pending:
        raise InvalidRequest(
            f"resume answers a pending interrupt, and {where} has none; nothing was written.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    value = resume.value
    if value is None or (isinstance(value, Mapping) and not value):
        # LangGraph reads Command(resume=None) as no resume at all, and an empty mapping as answering no id.
        raise InvalidRequest(
            f"resume must be an answer: got {value!r}, which LangGraph cannot tell from no answer; send a value "
            "(for example true, \"yes\" or {\"approve\": false}). Nothing was written.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    if _is_by_id(value):
        unknown = sorted(set(value) - set(ids))
        if unknown:
            raise InvalidRequest(
                f"resume names interrupt {unknown[0]!r}, which is not pending at {where} (pending: {ids}); "
                "nothing was written.",
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
            )
        missing = [i for i in ids if i not in value]
        if missing:
            # A partial answer of interrupts in one superstep makes LangGraph write no checkpoint, only pending
            # writes on the interrupted one, which would change a stored checkpoint: answer them together.
            raise InvalidRequest(
                f"resume answers {len(value)} of the {len(ids)} interrupts waiting at {where}; answer all of them in "
                f"one resume (missing: {missing}). Nothing was written.",
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
            )
    elif len(pending) > 1:
        raise InvalidRequest(
            f"{len(pending)} interrupts wait at {where}: answer them by id, resume = {{interrupt_id: value}} "
            f"(pending: {ids}); nothing was written.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    return resume, ()


def _is_by_id(value: Any) -> bool:
    # LangGraph's own test (pregel._loop): a non-empty mapping whose keys all look like interrupt ids.
    return isinstance(value, Mapping) and bool(value) and all(isinstance(k, str) and _INTERRUPT_ID.fullmatch(k) for k in value)


def as_list(value: Any) -> list[Any]:
    """A write's value to the interrupt channel as a list of LangGraph `Interrupt`s (it holds one or a sequence)."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _node_of(task_path: Any) -> str | None:
    # LangGraph writes a pulled task's path as "~__pregel_pull, <node>" (`_algo.task_path_str`).
    parts = str(task_path or "").split(", ")
    return parts[1] if len(parts) == 2 and parts[0] == "~__pregel_pull" else None
