"""What a turn yields: `TurnStarted` once it holds its thread, text deltas and new messages while it runs, then its `TurnResult` (or, for a
retry, the `StoredResponse` of the first request), and the `PendingInterrupt`s it stopped at.

Plain dataclasses (a leaf: no LangChain at import), shared by the turn runner, the
Responses adapter and the servers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

TurnStatus = Literal["completed", "interrupted"]


@dataclass(frozen=True)
class PendingInterrupt:
    """A question the graph asked with LangGraph's `interrupt(value)`, waiting for an answer.

    `id` is LangGraph's interrupt id (answer it with `custom_inputs.resume`, by id when several
    wait), `value` the JSON value the graph passed to `interrupt`, `node` the node that waits
    (None when it is not known).
    """

    id: str
    value: Any
    node: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "value": self.value, "node": self.node}

    def as_item(self) -> dict[str, Any]:
        """The Responses output item a client renders: an `mcp_approval_request` (the Responses API's item for
        a question to the user), its `id` the interrupt id and its `arguments` the value as JSON."""
        import json

        return {
            "type": "mcp_approval_request",
            "id": self.id,
            "name": self.node or "interrupt",
            "arguments": json.dumps(self.value, ensure_ascii=False, default=str),
            "server_label": "interrupt",
        }


@dataclass(frozen=True)
class TurnResult:
    """Where a turn (or state update) left the thread."""

    thread_id: str | None
    """None only for a `store: false` turn that would have started a new thread."""
    checkpoint_id: str | None
    """The thread head after the turn (None: `store: false`, nothing written)."""
    parent_checkpoint_id: str | None
    """The checkpoint the turn started from: the requested one when branching, else the previous head
    (a new thread's empty root checkpoint on its first turn)."""
    status: TurnStatus = "completed"
    """`interrupted` when a newer turn stopped this one (`multitask_strategy="interrupt"`) and what it
    had produced was kept as its checkpoint."""
    unstored_response_id: str | None = None
    """Set only for a turn run with `store: false` (it wrote nothing, so `checkpoint_id` is None):
    a fresh response id that names nothing, as OpenAI gives an unstored response."""
    interrupts: tuple[PendingInterrupt, ...] = ()
    """The graph's questions this turn stopped at (LangGraph `interrupt()`), oldest first: the head is the
    interrupted checkpoint, and the next request answers them with `custom_inputs.resume`."""
    cancelled_interrupts: tuple[str, ...] = ()
    """Ids of the interrupts that waited at the start and that this turn left unanswered
    (`custom_inputs.cancel_interrupts`)."""
    state: Mapping[str, Any] | None = None
    """What a client re-renders, as `get_checkpoint_state` gives it (`include: ["state"]`,
    `agent.operations.render`); None: not asked for."""
    steer: Literal["joined", "new_turn"] | None = None
    """A `steer` request's outcome: `joined` (its messages joined the turn that was running: `checkpoint_id`
    and `response_id` are that turn's), or `new_turn` (it ran them as a turn of its own). None: not `steer`."""

    @property
    def response_id(self) -> str | None:
        """The OpenAI-dialect id of this result: `resp_<checkpoint_id>` (the unstored id for `store: false`)."""
        if self.unstored_response_id is not None:
            return self.unstored_response_id
        return None if self.checkpoint_id is None else f"resp_{self.checkpoint_id}"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint_id,
            "response_id": self.response_id,
        }
        if self.status != "completed":
            out["status"] = self.status
        if self.steer is not None:
            out["steer"] = self.steer
        if self.unstored_response_id is not None:
            out["stored"] = False
        if self.interrupts:
            out["interrupts"] = [interrupt.as_dict() for interrupt in self.interrupts]
        if self.cancelled_interrupts:
            out["cancelled_interrupts"] = list(self.cancelled_interrupts)
        if self.state is not None:
            out["state"] = dict(self.state)
        return out


@dataclass(frozen=True)
class TurnStarted:
    """The turn holds its thread and runs; `response_id` is the id its response will have
    (`resp_<checkpoint_id>` of the checkpoint it will write, or the unstored id of a `store: false` turn)."""

    response_id: str


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
class StoredResponse:
    """The response of an earlier request with the same idempotency key, as it was returned then."""

    output: list[dict[str, Any]]
    """Responses output items (`message`, `function_call`, `function_call_output`), in order."""
    custom_outputs: dict[str, Any]
    """As the first request got them: `thread_id`, `checkpoint_id`, `parent_checkpoint_id` (and `status`)."""

    def as_dict(self) -> dict[str, Any]:
        return {"output": list(self.output), "custom_outputs": dict(self.custom_outputs)}
