"""The pending writes of a checkpoint copied under a new id, keyed by the tasks LangGraph derives for that id.

A checkpoint is copied under a new id when a thread is forked (`forks`), imported
under another thread id (`transfer.restore`), and when a resumed turn stops at
another question of the same task (`turns.commit`: the start checkpoint stays as
it was, so its question can still be answered again as a sibling branch).

**Why the writes must be renamed.** LangGraph keys a pending write by its task's
id, which it derives from the checkpoint's id (`pregel._algo.prepare_single_task`),
and an interrupt's id from its task's namespace, `<node>:<task id>`, and how
many answers that task already has (`types._interrupt_id`). Copied as they were,
a copy's writes named tasks its graph never runs: LangGraph's `get_state` of a
fork showed no question while `get_checkpoint_state` listed the original's id;
a resume by that id was not taken (LangGraph asked the question again under a
new id, and nothing was written), and a task that had finished beside an
interrupted one would have run again.

**How.** LangGraph's own `get_state` computes the tasks of the original and of
the copy (a saver that holds just that checkpoint, handed in through the config
as LangGraph lends a saver to a subgraph), and a task of the copy is the one at
the same task path (`PregelTask.path`). A write whose task is not found (a
document made by another graph, a write LangGraph keys by no task such as
`NULL_TASK_ID`'s) keeps its task id, as before; an interrupt id that is not the
hash of its task's namespace keeps its id too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent.operations.interrupts import INTERRUPT_CHANNEL

if TYPE_CHECKING:
    from langgraph.checkpoint.base import Checkpoint, CheckpointTuple
    from langgraph.graph.state import CompiledStateGraph

#: A write: (task id, channel, value), as `CheckpointTuple.pending_writes` holds them.
Write = tuple[str, str, Any]
#: A write of a copy: (task id, channel, value, task path), the path as LangGraph stores it beside a write
#: (`put_writes`' `task_path`, `pregel._algo.task_path_str`; "" when its task is not known), which tells
#: the node that waits on a question when several do (`interrupts.stopped_at`).
CopiedWrite = tuple[str, str, Any, str]

#: Answers a task may hold before its next question; more than any graph asks in one task.
MAX_ANSWERS = 256


def copied_writes(
    graph: CompiledStateGraph | None, source: CheckpointTuple, checkpoint: Checkpoint, pending: Sequence[Write] | None = None
) -> list[CopiedWrite]:
    """`pending` (default: `source.pending_writes`), the writes of checkpoint `source`, as the writes of its copy
    `checkpoint` (the same content under a new `id`): each task id replaced by that of the copy's task at the
    same task path, and each interrupt's id by the id LangGraph gives it there (module docstring).

    `graph`: the graph the thread runs (None: the writes are returned as they are, with no task path).
    Order is kept.
    Raises nothing of its own: a graph that cannot compute the tasks (nodes it does not have) leaves them as they are.
    """
    writes = list(source.pending_writes or () if pending is None else pending)
    if graph is None or not writes:
        return [(*write, "") for write in writes]
    copy = source._replace(
        config={"configurable": {**source.config["configurable"], "checkpoint_id": checkpoint["id"]}},
        checkpoint=checkpoint,
        parent_config=None,
        pending_writes=[],
    )
    try:
        before, after = _tasks(graph, source._replace(pending_writes=[])), _tasks(graph, copy)
    except Exception:  # noqa: BLE001 - a document of another graph: its writes stay as they were
        return [(*write, "") for write in writes]
    from langgraph.pregel._algo import task_path_str

    at_path = {task.path: task for task in after}
    renamed = {}
    for task in before:
        twin = at_path.get(task.path)
        if twin is not None and twin.name == task.name:
            renamed[task.id] = (f"{task.name}:{task.id}", twin.id, f"{twin.name}:{twin.id}", task_path_str(twin.path))
    out: list[CopiedWrite] = []
    for task_id, channel, value in writes:
        if task_id not in renamed:
            out.append((task_id, channel, value, ""))
            continue
        old_ns, new_id, new_ns, path = renamed[task_id]
        if channel == INTERRUPT_CHANNEL and isinstance(value, Sequence):
            value = [_renamed_interrupt(item, old_ns, new_ns) for item in value]
        out.append((new_id, channel, value, path))
    return out


def writes_by_task(writes: Sequence[CopiedWrite]) -> dict[tuple[str, str], list[tuple[str, Any]]]:
    """`writes` grouped for `put_writes`: (task id, task path) -> [(channel, value)], in order."""
    grouped: dict[tuple[str, str], list[tuple[str, Any]]] = {}
    for task_id, channel, value, path in writes:
        grouped.setdefault((task_id, path), []).append((channel, value))
    return grouped


def _tasks(graph: CompiledStateGraph, tup: CheckpointTuple) -> Sequence[Any]:
    """The tasks LangGraph runs next from `tup` (`StateSnapshot.tasks`), computed by its own `get_state`."""
    from langgraph._internal._constants import CONFIG_KEY_CHECKPOINTER

    # Without a parent: `get_state` may walk ancestors (a delta channel's history), which this saver has none of.
    tup = tup._replace(parent_config=None)
    config = {"configurable": {**tup.config["configurable"], CONFIG_KEY_CHECKPOINTER: _holding()(tup)}}
    return graph.get_state(config).tasks


def _renamed_interrupt(item: Any, old_ns: str, new_ns: str) -> Any:
    """`item` (a LangGraph `Interrupt`) with the id it gets in namespace `new_ns`, when its id is that of `old_ns`."""
    from langgraph.types import _interrupt_id

    if not dataclasses.is_dataclass(item) or not hasattr(item, "id"):
        return item
    for answered in range(MAX_ANSWERS):
        if _interrupt_id(old_ns, answered) == item.id:
            return dataclasses.replace(item, id=_interrupt_id(new_ns, answered))
    return item


@functools.cache
def _holding() -> type:
    # Built on first use: importing this module must not load LangGraph (the command line's reads).
    from langgraph.checkpoint.base import BaseCheckpointSaver

    class Holding(BaseCheckpointSaver):
        """A saver that holds one checkpoint tuple, for `get_state` to compute its tasks."""

        def __init__(self, tup: CheckpointTuple) -> None:
            super().__init__()
            self.tup = tup

        def get_tuple(self, config: Any) -> CheckpointTuple | None:
            wanted = config["configurable"].get("checkpoint_id")
            return self.tup if wanted in (None, self.tup.config["configurable"]["checkpoint_id"]) else None

    return Holding
