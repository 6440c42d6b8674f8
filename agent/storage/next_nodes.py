"""The nodes a checkpoint waits to run (`next_nodes`), as LangGraph's own `graph.get_state(...).next` names them.

The saver computes them once, when it writes a checkpoint, and stores them in
the checkpoint's summary (`summaries.summarize`). They come from LangGraph's
`prepare_next_tasks`, the function `get_state` builds `next` with, given the
checkpoint's channels: LangGraph's trigger rule is more than "a trigger
channel's version is newer than the one the node last saw". A join edge
(`add_edge(["a", "b"], "c")`) triggers `c` through a barrier channel
(`NamedBarrierValue`) that is available only once every named node wrote to
it, and whose version moves again when `c` consumes it; a `Send` schedules a
task through the tasks channel, not through a node's triggers. A rule of our
own that only compared versions listed `c` as waiting on every finished turn
and missed the tasks of `Send`s.

Cost, per checkpoint written: one channel object per state key built around
the stored value (`from_checkpoint` keeps it, it copies nothing) and each
node's triggers checked; a triggered node's task is described, not run
(`for_execution=False`). For the built-in graph that is six channels and
three nodes, about 15 microseconds. The module loads LangGraph's Pregel,
which a saver without a graph (the command line's reads) does not need:
`agent.graph.compile_graph` hands the saver `next_nodes` bound to its graph.

`prepare_next_tasks`, `LATEST_VERSION`, `MISSING` and `recast_checkpoint_ns`
live in LangGraph's private modules (`langgraph.pregel._algo`, `._checkpoint`,
`langgraph._internal`), where `Pregel.get_state` imports them from; a LangGraph
that moves them fails at import, and tests/operations/test_history.py compares
`next_nodes` with `get_state(...).next` for graphs with join edges and `Send`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph._internal._config import recast_checkpoint_ns
from langgraph._internal._typing import MISSING
from langgraph.channels.base import BaseChannel
from langgraph.checkpoint.base import Checkpoint, copy_checkpoint
from langgraph.pregel import Pregel
from langgraph.pregel._algo import prepare_next_tasks
from langgraph.pregel._checkpoint import LATEST_VERSION


#: The id the tasks are derived under (see `next_nodes`).
_ANY_ID = "00000000-0000-0000-0000-000000000000"


def next_nodes(graph: Pregel, checkpoint: Checkpoint, *, step: int, checkpoint_ns: str = "") -> list[str]:
    """The names of the tasks LangGraph would run next from `checkpoint` of `graph` (a compiled graph), in
    LangGraph's order (`Send` tasks first, a node once per `Send` to it): `StateSnapshot.next` of the
    checkpoint before any of its pending writes. `step` is the checkpoint's metadata `step`; `checkpoint_ns`
    the namespace it was written in (a subgraph's checkpoint is read with that subgraph).

    [] for a namespace whose subgraph `graph` does not hold as a `Pregel`, and for an empty checkpoint.
    Raises what LangGraph's own `get_state` would for the checkpoint (a TypeError for channel versions of
    kinds that do not compare).
    """
    graph = _graph_of(graph, checkpoint_ns)
    if graph is None:
        return []
    if checkpoint.get("v", LATEST_VERSION) < LATEST_VERSION:
        # LangGraph reads an older layout after migrating it (`Pregel._migrate_checkpoint`, which `get_state`
        # calls); on a copy, as the checkpoint is about to be stored as it is.
        checkpoint = copy_checkpoint(checkpoint)
        graph._migrate_checkpoint(checkpoint)
    channels, managed = _channels(graph.channels, checkpoint["channel_values"])
    tasks = prepare_next_tasks(
        # Under a stand-in id: LangGraph derives task ids from the checkpoint's id as hex (`binascii.unhexlify`),
        # which a saver must not require of the ids it is handed (a test's "1", an import's), and the names do
        # not depend on it.
        {**checkpoint, "id": _ANY_ID},
        [],
        graph.nodes,
        channels,
        managed,
        {"configurable": {"checkpoint_ns": checkpoint_ns}},
        step + 1,
        step + 2,
        for_execution=False,
    )
    return [task.name for task in tasks.values()]


def _channels(specs: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[dict[str, BaseChannel], dict[str, Any]]:
    # What `langgraph.pregel._checkpoint.channels_from_checkpoint` builds, but a `DeltaChannel` whose value
    # is not stored here stays empty instead of being replayed from its ancestors (which would read the
    # saver while it writes): its value is a task's input, and no node is triggered by a state key.
    channels: dict[str, BaseChannel] = {}
    managed: dict[str, Any] = {}
    for name, spec in specs.items():
        if isinstance(spec, BaseChannel):
            channels[name] = spec.from_checkpoint(values.get(name, MISSING))
        else:
            managed[name] = spec
    return channels, managed


def _graph_of(graph: Pregel, checkpoint_ns: str) -> Pregel | None:
    # The (sub)graph that wrote a checkpoint of `checkpoint_ns`, as `Pregel.get_state` finds it.
    if not checkpoint_ns:
        return graph
    subgraphs = graph.get_subgraphs(namespace=recast_checkpoint_ns(checkpoint_ns), recurse=True)
    found = next((subgraph for _, subgraph in subgraphs), None)
    return found if isinstance(found, Pregel) else None
