"""`TurnParts`: the parts of one agent that every step of a turn works with.

The steps (`start`, `commit`, `updates`) are functions over these parts rather
than methods of the runner, so that each lives in a module of its own and none
of them imports the runner (which imports them all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from langgraph.graph.state import CompiledStateGraph

from agent.config import AgentSettings
from agent.operations.idempotency import Idempotency
from agent.storage import ThreadStorage

if TYPE_CHECKING:
    from agent.context.window import ContextWindow
    from agent.memory.service import Memories


@dataclass(frozen=True)
class TurnParts:
    """One agent's storage, compiled graph and settings, and what its turns add to them."""

    storage: ThreadStorage
    graph: CompiledStateGraph
    settings: AgentSettings
    idempotency: Idempotency
    memories: Memories | None = None
    """The users' long-term memories (`agent.memory`); None: the agent keeps none."""
    window: ContextWindow | None = None
    """The agent's context window, handed to a user graph's own model node in each TurnContext."""
    answer_node: str | None = None
    """The node a state update is written as (the built-in graph's "agent"); None: LangGraph infers it."""
