"""`Envelope`: what every request carries, parsed once at the edge (`agent.requests.parse_request`).

It belongs to the operations (their arguments read from it, `operation.from_request`),
not to the request parser, so that nothing below `agent.requests` imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage


@dataclass(frozen=True)
class Envelope:
    """What every request carries, validated. `thread_id` is None only for a turn that starts a new thread."""

    thread_id: str | None = None
    user_id: str | None = None
    checkpoint_id: str | None = None
    multitask_strategy: str | None = None
    idempotency_key: str | None = None
    messages: list[BaseMessage] = field(default_factory=list)
    request_hash: str | None = None
    """What the request asks for, hashed (`idempotency.request_fingerprint`); set when `idempotency_key` is."""
    thread_of_checkpoint: bool = False
    """`previous_response_id` named `checkpoint_id` and no thread: the caller finds its thread
    (`LangGraphResponsesAgent` asks storage) before the turn runs."""
    existing_thread: bool = False
    """The thread was named as a `conversation`: it must exist (a turn would otherwise create it)."""
    instructions: str | None = None
    """A system message for this turn only (not stored)."""
    store: bool = True
    """False: the turn writes nothing (OpenAI's `store: false`)."""
    background: bool = False
    """True: answer at once (`queued`) and run the turn without the client (`agent.runs`)."""
