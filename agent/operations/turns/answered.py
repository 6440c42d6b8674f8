"""A resumed turn whose task took the answer and asked again in the same step: its writes go on a copy of its start.

LangGraph puts such a turn's writes (the answers, the new questions, the outputs
of tasks of the step that finished) on the checkpoint the turn started from, and
writes no checkpoint (a node with two `interrupt()` calls, LangGraph's "multiple
interrupts in a single node"). Written there, as LangGraph's own savers do, the
start would change, and its question could no longer be answered again as a
sibling branch; dropped, as they were before, the answer was lost. So they go on a
copy of the start: its child and the new head, keyed by the copy's own tasks
(`agent.operations.copied_writes`). Two reviews shaped it (stop 38): the copy is
made from the start as stored, not as the run left it, and every stored write of
a task that wrote again is replaced.
"""

from __future__ import annotations

from datetime import datetime, timezone

from langgraph.checkpoint.base.id import uuid6

from agent.errors import InvalidRequest
from agent.operations.copied_writes import copied_writes, writes_by_task
from agent.operations.interrupts import INTERRUPT_CHANNEL, RESUME_CHANNEL, as_list
from agent.operations.turns.parts import TurnParts
from agent.storage import Turn


def answered_in_place(parts: TurnParts, turn: Turn, start: str) -> dict[str, str]:
    """A resumed turn that wrote no checkpoint: its task took the answer and asked its next question in the same
    step (a node with two `interrupt()` calls), and LangGraph put its writes (the answers, the new questions, the
    outputs of tasks of the step that finished) on the start checkpoint. They go on a copy of the start instead,
    its child and the new head, so the start stays as it was (its question can be answered again, as a sibling
    branch; written on it, they were lost: a turn with no checkpoint wrote nothing). The copy's writes are
    keyed by its own tasks (`copied_writes`). Returns each question's id at the start -> its id at the copy.

    The start is read again from storage: the one the run loaded, LangGraph advanced in place (its channel
    versions), and a copy of that named channel versions no value was stored under.

    Raises:
        InvalidRequest: no task took the answer (LangGraph asked the same question again), or a subgraph asked
            again within the turn (its own checkpoints live in a namespace named by its task, which a copy
            renames: not supported), or a copy's subgraph question was answered by id (the copy has no
            checkpoints of the subgraph, which starts again and asks under a new id): nothing is written.
    """
    if turn.puts or any(config["configurable"].get("checkpoint_ns", "") for config, *_ in turn.writes):
        raise InvalidRequest(
            f"A subgraph asked a question again at checkpoint {start!r} of thread {turn.thread_id!r}: a subgraph "
            "that asks again within one turn, after taking the answer, is not supported yet; or the question was asked "
            "inside a subgraph before this thread was copied (fork_thread, import_thread): a copy does not carry the "
            "subgraph's own checkpoints, so its subgraph starts again and asks under a new id, and a plain resume "
            "value answers it. Nothing was written.",
            thread_id=turn.thread_id,
            checkpoint_id=start,
        )
    writes = [(task_id, channel, value) for _config, task_writes, task_id, _path in turn.writes for channel, value in task_writes]
    if not any(channel == RESUME_CHANNEL for _task, channel, _value in writes):
        raise InvalidRequest(
            f"The graph did not take the answer (custom_inputs.resume) at checkpoint {start!r} of thread "
            f"{turn.thread_id!r}: no task waiting there asked that question. Nothing was written.",
            thread_id=turn.thread_id,
            checkpoint_id=start,
        )
    address = {"thread_id": turn.thread_id, "checkpoint_ns": ""}
    source = parts.storage.saver.get_tuple({"configurable": {**address, "checkpoint_id": start}})
    merged = [w for w in source.pending_writes or () if not _superseded(w, writes)] + writes
    copy = {**source.checkpoint, "id": turn.head_id or str(uuid6(clock_seq=source.metadata.get("step", -1))),
            "ts": datetime.now(timezone.utc).isoformat()}  # fmt: skip
    carried = copied_writes(parts.graph, source._replace(pending_writes=merged), copy)
    renamed = {}
    for (_, channel, before), (_, _, after, _) in zip(merged, carried, strict=True):
        if channel == INTERRUPT_CHANNEL:
            renamed.update((a.id, b.id) for a, b in zip(as_list(before), as_list(after), strict=True))
    turn.writes = []
    saver = parts.storage.saver
    with saver.buffering(turn):
        saver.put({"configurable": {**address, "checkpoint_id": start}}, copy, dict(source.metadata), {})
        for (task_id, path), task_writes in writes_by_task(carried).items():
            saver.put_writes({"configurable": {**address, "checkpoint_id": copy["id"]}}, task_writes, task_id, path)
    return renamed


def _superseded(stored: tuple, new: list[tuple]) -> bool:
    """Whether the turn's `new` writes replace `stored`, a write of the start: every write of a task that wrote
    this turn. It asked its question again (a new one) or finished, and its answers so far are written again
    whole; a task that had finished before and ran again (LangGraph runs them again from a checkpoint that is
    not the thread's latest, instead of replaying their writes) wrote its outputs again. Other writes stay."""
    return any(write[0] == stored[0] for write in new)


def wrote_root_checkpoint(turn: Turn) -> bool:
    """Whether `turn` buffered a checkpoint of the graph itself, not only of a subgraph (its own namespace)."""
    return any(not config["configurable"].get("checkpoint_ns", "") for config, *_ in turn.puts)
