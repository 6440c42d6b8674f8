"""Typed results that cross layers; dicts exist only at the wire (`as_dict()`).

* What a turn yields (`TurnStarted`, `TurnResult`, `TextDelta`, `NewMessages`, `StoredResponse`, `PendingInterrupt`):
  `agent.turn_events`, re-exported here.
* `CheckpointSummary`: one history entry (`get_checkpoint_history`).
* `CheckpointState` (`get_checkpoint_state`, its messages placed by `MessagePlace` with their
  `Alternatives`), `BranchSummary` (`list_branches`), `HeadMove`
  (`set_head`), `ForkResult` (`fork_thread`), `CheckpointDiff` (`compare_checkpoints`): the
  branch operations. Their messages stay LangChain messages until `as_dict()` turns them into
  Responses items (`agent.items.to_state_items`, imported there so this module stays light).
* `AgentInfo`: what is running (`LangGraphResponsesAgent.info()`, `GET /agent/info`).
* `Memory`: one version of a long-term memory of a user (`list_memories`, the memories given to the model);
  `MemoryExtraction` and its `MemoryProposal`s (`extract_memories`).
* `TokenUsage`: a thread's and a branch's token totals (`get_usage`).
* `SweepResult`, `TrimmedThread`: what a retention sweep removed (`sweep_expired_threads`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.turn_events import (
    NewMessages,
    PendingInterrupt,
    StoredResponse,
    TextDelta,
    TurnResult,
    TurnStarted,
    TurnStatus,
)

if TYPE_CHECKING:  # `tt-agent history` uses CheckpointSummary without loading LangChain
    from langchain_core.messages import BaseMessage

__all__ = ["NewMessages", "PendingInterrupt", "StoredResponse", "TextDelta", "TurnResult", "TurnStarted", "TurnStatus"]

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
    EXTRA_KEYS = (
        "model_input_messages", "model_input_tokens", "summary_used", "usage", "branch_usage", "recalled_memories",
        "interrupted", "merged_from",
    )  # fmt: skip

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
class Alternative:
    """One version of a message that a "< i/n >" switcher offers: an edit of a user message, or a
    regeneration of an answer."""

    checkpoint_id: str
    """The checkpoint where this version first appeared (an edit's versions that differ only in their
    answers, such as the original and its regenerations, are one version: the oldest of them)."""
    latest_checkpoint_id: str
    """The newest checkpoint after it (of all its checkpoints, for a version with several): where to
    `set_head` to show it with everything written after it."""
    preview: str
    """Its text (an answer's: its last message, or the tools it calls), at most `LAST_MESSAGE_CHARS`."""

    def as_dict(self) -> dict[str, str]:
        return {"checkpoint_id": self.checkpoint_id, "latest_checkpoint_id": self.latest_checkpoint_id, "preview": self.preview}


@dataclass(frozen=True)
class Alternatives:
    """A message's versions, oldest first (`agent.operations.alternatives`): for a user message its edits
    (the user messages at the same place), for an answer its regenerations (the answers to the same user
    message)."""

    kind: str
    """`"edits"` (a user message) or `"regenerations"` (an answer: an assistant message, tool call or result)."""
    index: int
    """This message's version in `options` (a UI shows `index + 1` / `count`)."""
    options: tuple[Alternative, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "count": len(self.options),
            "options": [option.as_dict() for option in self.options],
        }


@dataclass(frozen=True)
class MessagePlace:
    """Where one message of a checkpoint sits in its thread's tree (LangGraph `useStream`'s message metadata:
    `firstSeenState`, `branch`, `branchOptions`)."""

    checkpoint_id: str
    """The checkpoint where the message first appeared on this branch."""
    branch_checkpoint_id: str | None
    """The checkpoint just before it (the thread's root for the first message): the parent of its
    alternatives. A turn that edits or regenerates it names the message (`edit_message_id`,
    `regenerate_message_id`), not this checkpoint."""
    sibling_checkpoint_ids: tuple[str, ...]
    """Every alternative at this position, this one included, each named by the checkpoint where it first
    appeared: the children of `branch_checkpoint_id`, oldest first."""
    sibling_latest_checkpoint_ids: tuple[str, ...] = ()
    """For each alternative, the newest checkpoint that descends from it (its newest leaf): where to
    `set_head` to show that alternative with everything written after it."""
    alternatives: Alternatives | None = None
    """This message's own versions, edits and regenerations apart (`get_checkpoint_state` sets them; the
    siblings above are every child of `branch_checkpoint_id`, for the user message and its answer alike)."""

    @property
    def sibling_index(self) -> int:
        """This message's 0-based position in `sibling_checkpoint_ids` (a UI shows `index + 1 / count`)."""
        return self.sibling_checkpoint_ids.index(self.checkpoint_id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "branch_checkpoint_id": self.branch_checkpoint_id,
            "siblings": {
                "index": self.sibling_index,
                "count": len(self.sibling_checkpoint_ids),
                "checkpoint_ids": list(self.sibling_checkpoint_ids),
                "latest_checkpoint_ids": list(self.sibling_latest_checkpoint_ids),
            },
            **({} if self.alternatives is None else {"alternatives": self.alternatives.as_dict()}),
        }


def _placed_items(messages: Sequence[BaseMessage], places: Sequence[MessagePlace]) -> list[dict[str, Any]]:
    """Responses items of `messages`, each carrying its message's place."""
    from agent.items import to_state_items

    return [
        {**item, **place.as_dict()}
        for message, place in zip(messages, places, strict=True)
        for item in to_state_items(message)
    ]


@dataclass(frozen=True)
class CheckpointState:
    """One checkpoint with its messages (`get_checkpoint_state`)."""

    summary: CheckpointSummary
    messages: tuple[BaseMessage, ...]
    """The checkpoint's messages from `message_offset` on (all of them unless a client asked for the rest of
    what it shows: `after_message_id`, or a write's `include: ["state"]`)."""
    places: tuple[MessagePlace, ...]
    """One per message, in order."""
    interrupts: tuple[PendingInterrupt, ...] = ()
    """The graph's questions this checkpoint waits on (LangGraph `interrupt()`), answered with `resume`."""
    message_offset: int = 0
    """How many items of the checkpoint's whole `messages` list (Responses items: an assistant message
    with tool calls is several) come before the first of these: a client keeps its first
    `message_offset` items and puts these after them."""
    head_checkpoint_id: str | None = None
    """The thread's head (the summary's `is_head` says whether it is this checkpoint)."""
    branch: Mapping[str, Any] | None = None
    """What the checkpoint's branch records say, when the thread has any (`branch_view.record_of_chain`):
    `label`, `pinned`, `archived`."""
    context_summary: str | None = None
    """The text of the summary the model was sent for this checkpoint's answer (`summary_used`), else None:
    the branch's summary as this checkpoint's state holds it (`agent.context.summaries`), not stored again."""

    def as_dict(self) -> dict[str, Any]:
        """The history entry's fields, `message_offset`, `head_checkpoint_id`, `messages` (Responses items,
        each with its id and place), only when the checkpoint waits on a question, `interrupts`
        (`[{"id", "value", "node"}]`), and only when the model was sent a summary for this checkpoint's
        answer, `context_summary` (its text)."""
        out = {
            **self.summary.as_dict(),
            "head_checkpoint_id": self.head_checkpoint_id,
            "message_offset": self.message_offset,
            "messages": _placed_items(self.messages, self.places),
        }
        if self.branch is not None:
            out["branch"] = dict(self.branch)
        if self.interrupts:
            out["interrupts"] = [interrupt.as_dict() for interrupt in self.interrupts]
        if self.context_summary is not None:
            out["context_summary"] = self.context_summary
        return out


@dataclass(frozen=True)
class BranchSummary:
    """One branch of a thread (`list_branches`): a leaf of the checkpoint tree."""

    leaf: CheckpointSummary
    fork_checkpoint_id: str | None
    """Where the branch leaves its nearest other branch: its newest ancestor with several children
    (None when the thread has no other branch)."""
    label: str | None = None
    """The label of the newest labelled checkpoint of the branch's own part (`label_branch`)."""
    pinned: bool = False
    """The thread's main branch (`pin_branch`)."""
    archived: bool = False
    """Hidden unless asked for (`archive_branch`)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.leaf.as_dict(),
            "fork_checkpoint_id": self.fork_checkpoint_id,
            "updated_at": self.leaf.timestamp,
            "label": self.label,
            "pinned": self.pinned,
            "archived": self.archived,
        }


@dataclass(frozen=True)
class HeadMove:
    """A `set_head`: the thread now continues from `checkpoint_id`."""

    thread_id: str
    checkpoint_id: str
    previous_checkpoint_id: str
    state: CheckpointState | None = None
    """What a client re-renders (`include: ["state"]`, `agent.operations.render`)."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "previous_checkpoint_id": self.previous_checkpoint_id,
        }
        if self.state is not None:
            out["state"] = self.state.as_dict()
        return out


@dataclass(frozen=True)
class ForkResult:
    """A new thread made by `fork_thread`: its id and head, and where it came from."""

    thread_id: str
    checkpoint_id: str
    """The new thread's head (a copy of the source checkpoint, with a new id)."""
    forked_from_thread_id: str
    forked_from_checkpoint_id: str
    state: CheckpointState | None = None
    """The new thread's head, every message placed (`include: ["state"]`, `agent.operations.render`)."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "forked_from": {"thread_id": self.forked_from_thread_id, "checkpoint_id": self.forked_from_checkpoint_id},
        }
        if self.state is not None:
            out["state"] = self.state.as_dict()
        return out


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


@dataclass(frozen=True)
class CheckpointDiff:
    """Two checkpoints of one thread side by side (`compare_checkpoints`)."""

    thread_id: str
    checkpoint_a: str
    checkpoint_b: str
    common_ancestor_checkpoint_id: str | None
    """The newest checkpoint both descend from (itself when one is an ancestor of the other)."""
    only_a: tuple[BaseMessage, ...]
    """`checkpoint_a`'s messages after the longest run of leading messages both share."""
    only_b: tuple[BaseMessage, ...]
    places_a: tuple[MessagePlace, ...]
    places_b: tuple[MessagePlace, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "checkpoint_a": self.checkpoint_a,
            "checkpoint_b": self.checkpoint_b,
            "common_ancestor_checkpoint_id": self.common_ancestor_checkpoint_id,
            "only_a": _placed_items(self.only_a, self.places_a),
            "only_b": _placed_items(self.only_b, self.places_b),
        }


@dataclass(frozen=True)
class AgentInfo:
    """What is running: the agent, where it keeps its threads, and its model."""

    name: str
    version: str
    store: str
    """Where threads are kept, for people: a SQLite file's absolute path, a Postgres URL with its
    password masked, or `memory:// (this process only)` (`agent.config.store_label`)."""
    store_kind: str
    """`postgres`, `sqlite` or `memory`."""
    model: str
    """The chat model's name (`offline`, an OpenAI-compatible name, or a LangChain model's name)."""
    tracing: bool

    def public_dict(self) -> dict[str, str]:
        """What a server tells its clients (`GET /agent/info`): no path or URL of the store, only its kind."""
        return {"name": self.name, "version": self.version, "store": self.store_kind, "model": self.model}


@dataclass(frozen=True)
class Memory:
    """One version of a long-term memory of a user, with the checkpoint that wrote it (see `agent.memory`).

    A memory that is changed keeps its `memory_id`; each change is a new version (`version_id`) that
    supersedes the one it changed (`supersedes`), so what the agent knew at a checkpoint can be shown.
    """

    memory_id: str
    content: str
    thread_id: str
    """The thread whose turn (or extraction) saved this version."""
    checkpoint_id: str
    """The checkpoint that turn committed, or that extraction read (the version's place in the thread's branches)."""
    created_at: str | None
    """ISO 8601, UTC."""
    score: float | None = None
    """How well it matched a search: shared words (keyword search) or cosine similarity (semantic); None when listed."""
    version_id: str | None = None
    """The version's own id (the first version's is the `memory_id`); None: the same as `memory_id`."""
    supersedes: str | None = None
    """The `version_id` this version changed; None for a memory's first version."""
    source_message_id: str | None = None
    """For an extracted version: the last message of the checkpoint it was read from (the branch rule's anchor)."""

    @property
    def version(self) -> str:
        return self.version_id or self.memory_id

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "content": self.content,
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "created_at": self.created_at,
            "version_id": self.version,
            "supersedes": self.supersedes,
        }


@dataclass(frozen=True)
class MemoryProposal:
    """A memory `extract_memories` proposes: `new`, or an `update` of a memory the branch knows (which it supersedes)."""

    kind: str
    """`new` or `update`."""
    content: str
    memory_id: str | None = None
    """For an update: the memory it changes; for a new one: its id once written (None in a dry run)."""
    supersedes: str | None = None
    """For an update: the version it supersedes (with its `superseded_content`)."""
    superseded_content: str | None = None
    version_id: str | None = None
    """The version written (None in a dry run)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "content": self.content,
            "memory_id": self.memory_id,
            "supersedes": self.supersedes,
            "superseded_content": self.superseded_content,
            "version_id": self.version_id,
        }


@dataclass(frozen=True)
class MemoryExtraction:
    """What `extract_memories` proposed from a branch (and, unless `dry_run`, wrote)."""

    thread_id: str
    checkpoint_id: str
    """The checkpoint whose branch was read: every written version's provenance."""
    dry_run: bool
    proposals: tuple[MemoryProposal, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "dry_run": self.dry_run,
            "written": not self.dry_run and bool(self.proposals),
            "proposals": [proposal.as_dict() for proposal in self.proposals],
        }


@dataclass(frozen=True)
class TrimmedThread:
    """A thread whose checkpoints but the head a `keep_latest` sweep deleted."""

    thread_id: str
    removed_checkpoints: int


@dataclass(frozen=True)
class SweepResult:
    """What one retention sweep removed; each thread appears once, in the order it was swept
    (oldest activity first)."""

    deleted_thread_ids: tuple[str, ...] = ()
    """Threads deleted whole (`thread_ttl_strategy="delete"`)."""
    trimmed: tuple[TrimmedThread, ...] = ()
    """Threads cut down to their head (`thread_ttl_strategy="keep_latest"`)."""
    failed_thread_ids: tuple[str, ...] = ()
    """Expired threads the sweep could not handle: skipped (nothing of them changed), logged, tried again next sweep."""

    def __bool__(self) -> bool:
        """Whether the sweep removed anything."""
        return bool(self.deleted_thread_ids or self.trimmed)

    def as_dict(self) -> dict[str, Any]:
        """`{"deleted_thread_ids": [str], "trimmed": [{"thread_id", "removed_checkpoints"}], "failed_thread_ids": [str]}`."""
        return {
            "deleted_thread_ids": list(self.deleted_thread_ids),
            "trimmed": [{"thread_id": t.thread_id, "removed_checkpoints": t.removed_checkpoints} for t in self.trimmed],
            "failed_thread_ids": list(self.failed_thread_ids),
        }
