"""`OperationContext`: what an operation's handler works on (one per agent).

It holds the agent's storage, compiled graph, settings, long-term memories and
turn runner, and nothing else: handlers take it, and the agent, the request
path and the command line hand it in. The command line's read-only commands
build one over `agent.storage.open_reader` with no graph (`reads`), so that
they load no LangGraph and still go through the same door as the agent.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph

    from agent.config import AgentSettings
    from agent.memory.service import Memories
    from agent.operations.turns import TurnRunner
    from agent.storage import ThreadStorage


@dataclass
class OperationContext:
    """The storage, graph, settings, memories and turns of one agent.

    `graph` and `turns` are None only in a read-only context (`reads`): an operation declared
    `reads_only` never touches them.
    """

    storage: ThreadStorage
    settings: AgentSettings
    graph: CompiledStateGraph | None = None
    turns: TurnRunner | None = None
    memories: Memories | None = None
    """The users' long-term memories (`agent.memory`); None: the agent keeps none."""

    @classmethod
    def reads(cls, storage: Any, settings: AgentSettings) -> OperationContext:
        """A context for `reads_only` operations over a storage's reads (`agent.storage.ThreadReads`)."""
        return cls(storage=storage, settings=settings)

    async def in_io(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the storage thread pool, awaited (see `TurnRunner.in_io`), in a copy of
        the caller's context (as `asyncio.to_thread` does), so that it tags the caller's trace."""
        assert self.turns is not None, "a read-only context runs nothing on the event loop"
        return await self.turns.in_io(contextvars.copy_context().run, function, *args)

    async def in_update(self, function: Callable[..., Any], *args: Any) -> Any:
        """`in_io` for an action that writes, which may wait for its thread's claim: on the turn runner's
        updates' pool (`TurnRunner.in_update`), so that waiting never holds the storage pool."""
        assert self.turns is not None, "a read-only context runs nothing on the event loop"
        return await self.turns.in_update(contextvars.copy_context().run, function, *args)

    def close(self) -> None:
        """Release the turn runner's threads, the memories and the storage's connections."""
        if self.turns is not None:
            self.turns.close()
        if self.memories is not None:
            self.memories.close()
        self.storage.close()
