"""What a turn is asked to do (`TurnArgs`), where it starts (`Start`), and what it yields (`TurnEvent`).

Apart from the steps that use them, so that every module of the package (and
`agent.operations`, which builds `TurnArgs` from a request) imports them
without importing the runner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.types import Command

from agent.config import MultitaskStrategy
from agent.types import NewMessages, StoredResponse, TextDelta, TurnResult, TurnStarted

if TYPE_CHECKING:
    from agent.operations.turn_options import Resume

#: What a turn yields: that it started (with its response id), text deltas (when streaming tokens), new
#: messages, and last its result; or only a stored one (an idempotent retry).
TurnEvent = TurnStarted | TextDelta | NewMessages | TurnResult | StoredResponse


@dataclass(frozen=True)
class TurnArgs:
    """What one turn needs: the new messages, and where and how to run them."""

    messages: Sequence[BaseMessage]
    thread_id: str | None
    """None starts a new thread with a new id."""
    user_id: str | None
    checkpoint_id: str | None = None
    """Start from this checkpoint (a branch) instead of the head."""
    strategy: MultitaskStrategy | None = None
    """None: the agent's `multitask_strategy`."""
    idempotency_key: str | None = None
    """A retry with the same key (and `request_hash`) gets the first result (`agent.operations.idempotency`)."""
    request_hash: str | None = None
    """The request's fingerprint (`idempotency.request_fingerprint`); set whenever `idempotency_key` is."""
    instructions: str | None = None
    """A system message for this turn only (not stored)."""
    store: bool = True
    """False: run from the requested state and write nothing (OpenAI's `store: false`); the claim is released."""
    max_context_tokens: int | None = None
    """This turn's token budget for the model's input (None: the agent's setting)."""
    edit_message_id: str | None = None
    """Put `messages` in place of this message of the start checkpoint (a sibling branch; see `edits`)."""
    regenerate: bool = False
    """Answer the start checkpoint's last user message again (`messages` empty; see `edits`)."""
    regenerate_message_id: str | None = None
    """With `regenerate`: answer again the user message that this answer of the start checkpoint answers."""
    metadata: Mapping[str, str] | None = None
    """Stored with the thread when this turn creates it (`catalogue`); ignored on an existing thread."""
    resume: Resume | None = None
    """Answer the start checkpoint's pending interrupts instead of sending messages (`interrupts`)."""
    cancel_interrupts: bool = False
    """Send `messages` although interrupts wait at the start (they stay unanswered there)."""


@dataclass(frozen=True)
class Start:
    """Where a turn starts (None: a new thread, from its root) and the messages it sends."""

    checkpoint_id: str | None
    messages: list[BaseMessage]
    loaded: CheckpointTuple | None = None
    """The start checkpoint, as read with the claim (so the run reads nothing)."""
    resume: Resume | None = None
    """Answer the start's pending interrupts (`messages` is then empty)."""
    cancelled: tuple[str, ...] = ()
    """The start's pending interrupts this turn leaves unanswered."""

    def graph_input(self) -> Any:
        """What the graph runs on: LangGraph's `Command(resume=...)`, or the new messages."""
        if self.resume is not None:
            return Command(resume=self.resume.value)
        return {"messages": list(self.messages)}
