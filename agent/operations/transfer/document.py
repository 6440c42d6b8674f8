"""The thread document's schema: its constants and the pydantic models a document is parsed into.

Apart from the code that writes (`export`) and reads (`parse`, `restore`)
documents, so that the format is read top to bottom in one place. The
models are strict and closed (`extra="forbid"`): a document with a field this
version does not know is refused rather than half-understood.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage


#: The `format` of a thread document.
FORMAT = "timetravel-agent.thread"
#: The document version this code writes.
VERSION = 2
#: The versions it reads: 1 (every checkpoint with its whole message list) and 2 (what each checkpoint adds).
READ_VERSIONS = (1, 2)
#: Channel value types that only version 2 writes: what a checkpoint changes in its parent's value.
CHANGE_TYPES = frozenset({"message_changes", "unchanged"})
#: The channel that holds the branch's messages (LangChain dicts in a document).
MESSAGES = "messages"
#: A NUL character in JSON text: the escape backslash-u0000 after an even number of backslashes
#: (`json.dumps` writes a backslash as two, so after an odd number it is a literal backslash and "u0000").
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: Message types a stored thread holds; `messages_from_dict` builds nothing else from a document.
MESSAGE_TYPES = frozenset({"human", "ai", "system", "tool"})
#: A pending write may also remove messages (`update_checkpoint_state` with `remove_message_ids`).
WRITE_MESSAGE_TYPES = MESSAGE_TYPES | {"remove"}
#: Metadata the saver derives again from the checkpoint when it writes it (`storage.summaries`).
DERIVED_METADATA = frozenset(
    {"message_count", "last_message", "last_user_message", "next_nodes", "ts", "kept_messages", "kept_trailing", "branch_usage"}
)

Version = str | int | float


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ChannelValue(_Model):
    """One channel's value: `messages` (a list of LangChain message dicts), `interrupts` (a graph's pending
    LangGraph `Interrupt`s: `[{"id", "value"}]`, the value plain JSON), `set` (a Python set of JSON
    scalars, such as the node names a join edge's barrier channel has seen: a list, sorted, no item twice)
    or `json` (plain JSON); in version 2 also `message_changes` (a `MessageChanges` to the parent's
    message list) or `unchanged` (the parent's value of the channel, as it is; no `value`). See
    `agent.operations.transfer`."""

    type: Literal["messages", "message_changes", "unchanged", "interrupts", "set", "json"]
    value: Any = None

    @model_validator(mode="after")
    def _value_unless_unchanged(self) -> ChannelValue:
        if (self.type == "unchanged") == ("value" in self.model_fields_set):
            raise ValueError("a channel value has a 'value' unless its type is 'unchanged'")
        return self


class MessageChanges(_Model):
    """What a checkpoint changes in its parent's message list (the `value` of a `message_changes`).

    The checkpoint's messages are the parent's, in order, without those whose id is in `remove`,
    each replaced by the message of `add` with the same id if there is one; then the other
    messages of `add`, in order. This is LangGraph's `add_messages` with `RemoveMessage`s, which
    is how a turn, an edit and `update_checkpoint_state` change a branch's messages.
    """

    remove: list[str] = Field(default_factory=list)
    add: list[dict[str, Any]] = Field(default_factory=list)


class PendingWrite(_Model):
    task_id: str
    channel: str
    value: ChannelValue


class CheckpointDoc(_Model):
    """One checkpoint of the document."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    ts: str
    metadata: dict[str, Any]
    v: int
    channel_versions: dict[str, Version]
    versions_seen: dict[str, dict[str, Version]]
    updated_channels: list[str] | None = None
    channel_values: dict[str, ChannelValue]
    pending_writes: list[PendingWrite] = Field(default_factory=list)

    @field_validator("ts")
    @classmethod
    def _iso_timestamp(cls, value: str) -> str:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not an ISO 8601 timestamp: {value!r}") from None
        return value


class ThreadDoc(_Model):
    """The thread record of the document (no owner: the importer decides)."""

    thread_id: str
    checkpoint_id: str
    title: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    forked_from: dict[str, str] | None = None
    ttl_seconds: float | None = None
    message_count: int | None = None
    created_at: str | None = None
    updated_at: str | None = None


class BranchDoc(_Model):
    """A branch record (`label_branch`, `pin_branch`, `archive_branch`) of one checkpoint of the document."""

    checkpoint_id: str
    label: str | None = None
    pinned: bool = False
    archived: bool = False


class ThreadDocument(_Model):
    """A whole thread: see `agent.operations.transfer`."""

    format: Literal["timetravel-agent.thread"]
    version: Literal[1, 2]
    exported_at: str | None = None
    thread: ThreadDoc
    checkpoints: list[CheckpointDoc] = Field(min_length=1)
    branches: list[BranchDoc] = Field(default_factory=list)
    """Present only when the thread has branch records."""

    @model_validator(mode="after")
    def _branches_of_checkpoints(self) -> ThreadDocument:
        ids = {c.checkpoint_id for c in self.checkpoints}
        unknown = [b.checkpoint_id for b in self.branches if b.checkpoint_id not in ids]
        if unknown:
            raise ValueError(f"branch record of checkpoint {unknown[0]!r}, which is not in the document")
        if sum(b.pinned for b in self.branches) > 1:
            raise ValueError("more than one pinned branch")
        return self


@dataclass(frozen=True)
class Restored:
    """A document, validated and ready to write: its checkpoints parents first, their values resolved."""

    document: ThreadDocument
    order: tuple[CheckpointDoc, ...]
    values: Mapping[str, Mapping[str, Any]]
    """Each checkpoint's channel values (checkpoint id -> channel -> value), whole and decoded: message
    lists as LangChain messages (a message a checkpoint keeps from its parent is the parent's object),
    interrupts as LangGraph `Interrupt`s, the rest plain JSON."""
    messages: Mapping[str, list[BaseMessage]]
    """Each checkpoint's messages (checkpoint id -> list), for those whose state holds messages."""
