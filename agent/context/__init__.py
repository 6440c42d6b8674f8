"""What the model is sent: the one pipeline between a branch's stored messages and the model call.

The stored state is never changed here; only the model's input is built, by a
sequence of small pure functions (`prepare_model_input`):

1. `turn_system_messages`: the system messages sent first and never stored:
   the agent's own `instructions` (its system prompt, `create_agent(...,
   instructions=...)`), then the turn's `instructions` (OpenAI's rule: for this
   turn only), then the user's long-term memories recalled for this turn
   (`agent.memory`; retrieved before the graph runs), so all of them are always
   kept and counted in the budget.
2. `budget.fit`: the branch's newest whole turns within the token budget, with
   every system message, the branch's summary if one applies (strategy
   `summarize`), and each kept turn repaired so that every tool call has its
   result (`repair`, the one owner of the pairing rule).

When the branch's summary must grow first, `fit` says which turns to fold in;
the model call that writes the summary, the token counter chosen for the model
and the report of what each call was sent are `window.ContextWindow`, which the
agent node in `agent.graph` calls, so that the node stays wiring. A turn's own
settings reach the node as a `TurnContext` in the graph config (`turn_context(config)`).

Modules: `repair` (tool-call pairing), `tokens` (counters, default budgets),
`budget` (fitting), `summaries` (the branch's summary), `window` (per-agent
settings, summarization calls, the turn report).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

from agent.context.budget import Budget, ModelInput, fit
from agent.context.summaries import ContextSummary
from agent.context.tokens import approximate_counter
from agent.memory.retrieval import memory_message
from agent.types import Memory

__all__ = [
    "TURN_CONTEXT_KEY",
    "Budget",
    "ModelInput",
    "TurnContext",
    "prepare_model_input",
    "turn_context",
    "turn_system_messages",
]

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
    window: Any = field(default=None, compare=False)
    """The agent's `window.ContextWindow` (budget, strategy, counter, system prompt), for a graph's own model
    node (`agent.graph.call_model`); None outside an agent's turn."""
    report: dict[str, Any] = field(default_factory=dict, compare=False)
    """Filled by the agent node with what the model was sent and the tokens it used; the saver copies it
    into the metadata of the checkpoint the turn writes (`agent.storage.summaries.TURN_REPORT_KEY`)."""
    inbox: Any = field(default=None, compare=False)
    """The messages other requests steer into this turn (`agent.operations.turns.steer.SteerInbox`), taken by
    the model step before each model call; None outside an agent's turn."""


def turn_context(config: Mapping[str, Any] | None) -> TurnContext | None:
    """The `TurnContext` a graph run was given, if any."""
    return ((config or {}).get("configurable") or {}).get(TURN_CONTEXT_KEY)


def turn_system_messages(context: TurnContext | None, instructions: str | None = None) -> list[BaseMessage]:
    """The system messages sent before the branch's messages and never stored: the agent's `instructions`,
    then this turn's own (its `instructions`, its recalled memories), in that order."""
    own: list[BaseMessage] = [SystemMessage(instructions)] if instructions else []
    if context is None:
        return own
    if context.instructions:
        own.append(SystemMessage(context.instructions))
    remembered = memory_message(context.memories)
    if remembered is not None:
        own.append(remembered)
    return own


def prepare_model_input(
    messages: Sequence[BaseMessage],
    context: TurnContext | None,
    *,
    budget: Budget | None = None,
    summary: ContextSummary | None = None,
    allow_fold: bool = True,
    instructions: str | None = None,
) -> ModelInput:
    """The model input for a branch holding `messages` (see the module docstring).

    Args:
        messages: the branch's stored messages, oldest first.
        context: the turn's settings (None outside a turn).
        budget: the token budget; None sends every message (counted approximately).
        summary: the branch's summary from its state (used by the `summarize` strategy while it applies).
        allow_fold: False builds an input even when the summary should first grow.
        instructions: the agent's system prompt, sent first on every call (None: none).

    Returns:
        A `ModelInput`: the messages, their token count and whether a summary is among them;
        or, under `summarize`, a `fold` of the turns to summarize first.
    """
    if budget is None:
        budget = Budget(max_tokens=sys.maxsize, strategy="trim", counter=approximate_counter())
    return fit(turn_system_messages(context, instructions), messages, budget, summary, allow_fold=allow_fold)
