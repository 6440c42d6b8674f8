"""Typed results that cross layers; dicts exist only at the wire (`as_dict()`).

* `TurnResult`: where a turn or state update left the thread (`custom_outputs`).
* `CheckpointSummary`: one history entry (`get_checkpoint_history`).
* `TextDelta`, `NewMessages`: what a running turn streams before its `TurnResult`.
* `TokenUsage`: a thread's and a branch's token totals (`get_usage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import BaseMessage

TurnStatus = Literal["completed", "interrupted"]


@dataclass(frozen=True)
class TurnResult:
    """Where a turn (or state update) left the thread."""

    thread_id: str
    checkpoint_id: str | None
    """The thread head after the turn."""
    parent_checkpoint_id: str | None
    """The checkpoint the turn started from: the requested one when branching, else the previous head
    (a new thread's empty root checkpoint on its first turn)."""
    status: TurnStatus = "completed"
    """`interrupted` when a newer turn stopped this one (`multitask_strategy="interrupt"`) and what it
    had produced was kept as its checkpoint."""

    def as_dict(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint_id,
        }
        if self.status != "completed":
            out["status"] = self.status
        return out


@dataclass(frozen=True)
class TextDelta:
    """A piece of the assistant's text as the model produced it."""

    item_id: str
    text: str


@dataclass(frozen=True)
class NewMessages:
    """Messages a graph node added (assistant replies, tool results), in order."""

    messages: list[BaseMessage]


@dataclass(frozen=True)
class CheckpointSummary:
    """One checkpoint as history lists it; read from checkpoint metadata, never from messages."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    thread_id: str
    timestamp: str | None
    """ISO 8601, UTC."""
    next_nodes: list[str]
    message_count: int
    last_message: str
    """The last message's text, at most 100 characters."""
    last_user_message: str
    """The last user message's text, at most 100 characters."""
    source: str | None
    """`root` (the empty checkpoint a thread starts from), `loop` (a turn) or `update` (a state update)."""
    step: int | None
    is_head: bool
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further metadata the turn recorded (e.g. what the model was sent), passed through as is."""

    #: Metadata keys passed through to `extra` when a checkpoint has them.
    EXTRA_KEYS = ("model_input_messages", "model_input_tokens", "summary_used", "usage", "branch_usage")

    @classmethod
    def from_row(cls, thread_id: str, row: Mapping[str, Any], *, head_checkpoint_id: str | None) -> CheckpointSummary:
        """A summary from a `list_checkpoints` row (`checkpoint_id`, `parent_checkpoint_id`, `metadata`)."""
        meta = row["metadata"] or {}
        return cls(
            checkpoint_id=row["checkpoint_id"],
            parent_checkpoint_id=row["parent_checkpoint_id"],
            thread_id=thread_id,
            timestamp=meta.get("ts"),
            next_nodes=list(meta.get("next_nodes") or []),
            message_count=meta.get("message_count", 0),
            last_message=meta.get("last_message", ""),
            last_user_message=meta.get("last_user_message", ""),
            source=meta.get("source"),
            step=meta.get("step"),
            is_head=row["checkpoint_id"] == head_checkpoint_id,
            extra={key: meta[key] for key in cls.EXTRA_KEYS if key in meta},
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint_id,
            "thread_id": self.thread_id,
            "timestamp": self.timestamp,
            "next_nodes": list(self.next_nodes),
            "message_count": self.message_count,
            "last_message": self.last_message,
            "last_user_message": self.last_user_message,
            "source": self.source,
            "step": self.step,
            "is_head": self.is_head,
            **self.extra,
        }


@dataclass(frozen=True)
class TokenUsage:
    """Tokens the model used on a thread, as it reported them: `{"input_tokens", "output_tokens"}` each."""

    thread_id: str
    checkpoint_id: str
    """The checkpoint whose branch `branch_usage` counts (the head unless one was asked for)."""
    thread_usage: Mapping[str, int]
    """Every recorded model call of every branch of the thread, once."""
    branch_usage: Mapping[str, int]
    """The model calls on the path from the thread's root to `checkpoint_id`."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "thread_usage": dict(self.thread_usage),
            "branch_usage": dict(self.branch_usage),
        }

