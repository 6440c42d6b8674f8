"""What the model is sent: the one pipeline between a thread's stored messages and the model call.

The stored state is never changed here; only the model's input is built:

1. `close_unanswered_tool_calls` (`agent.messages`): a history a chat API accepts.
2. The turn's `instructions`, if any, as a system message first (OpenAI's rule: for this turn
   only, never stored).
3. The user's long-term memories retrieved for this turn, if any, as one system message before
   the conversation (`with_memories`; retrieved before the graph runs, see `agent.memory`).

Later steps (a token budget, long-term memories) belong here too, so that the agent node
in `agent.graph` stays wiring. A turn's own settings reach the node as a `TurnContext` in the
graph config (`turn_context(config)`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

from agent.memory.retrieval import memory_message
from agent.messages import close_unanswered_tool_calls
from agent.types import Memory

#: The key of the `TurnContext` in a graph config's `configurable` (`tt_` keys are never stored as metadata).
TURN_CONTEXT_KEY = "tt_turn_context"


@dataclass(frozen=True)
class TurnContext:
    """What one turn tells the model-input pipeline, beyond the thread's messages."""

    thread_id: str
    user_id: str | None = None
    start_checkpoint_id: str | None = None
    """The checkpoint the turn started from."""
    instructions: str | None = None
    """A system message for this turn only (not stored)."""
    max_context_tokens: int | None = None
    """This turn's token budget for the model's input (None: the agent's setting)."""
    memories: tuple[Memory, ...] = ()
    """The user's long-term memories retrieved for this turn, most relevant first."""


def turn_context(config: Mapping[str, Any] | None) -> TurnContext | None:
    """The `TurnContext` a graph run was given, if any."""
    return ((config or {}).get("configurable") or {}).get(TURN_CONTEXT_KEY)


def prepare_model_input(messages: Sequence[BaseMessage], context: TurnContext | None) -> list[BaseMessage]:
    """The messages to send to the model for a state holding `messages` (see the module docstring)."""
    prepared = close_unanswered_tool_calls(messages)
    if context is not None and context.instructions:
        prepared = [SystemMessage(context.instructions), *prepared]
    prepared = with_memories(prepared, context)
    return prepared


def with_memories(messages: list[BaseMessage], context: TurnContext | None) -> list[BaseMessage]:
    """`messages` with the turn's memories as a system message after the leading system messages."""
    message = memory_message(context.memories) if context is not None else None
    if message is None:
        return messages
    position = next((i for i, m in enumerate(messages) if m.type != "system"), len(messages))
    return [*messages[:position], message, *messages[position:]]
