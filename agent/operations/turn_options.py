"""A turn's own `custom_inputs`: edit, regenerate, resume, metadata and budget (the action `turn`).

A turn is the one action that streams, so it is not an `Operation`: `agent.requests`
parses these options with the envelope, and `TurnRunner` runs the turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest
from agent.operations import checks
from agent.operations.thread_values import check_metadata
from agent.validation import check_id

if TYPE_CHECKING:
    from agent.operations.envelope import Envelope

#: The `custom_inputs` keys of a turn, besides the envelope's.
TURN_KEYS = frozenset(
    {
        "edit_message_id",
        "regenerate",
        "regenerate_message_id",
        "metadata",
        "max_context_tokens",
        "resume",
        "cancel_interrupts",
        "include",
    }
)

#: What the action table says of a turn.
TURN_SUMMARY = "Run the model on the input from the head (or from checkpoint_id: a branch); the default."


@dataclass(frozen=True)
class TurnOptions:
    """A turn's own `custom_inputs`, beyond the envelope."""

    edit_message_id: str | None = None
    """Branch from the checkpoint before this message and send the input in its place (`operations.edits`)."""
    regenerate: bool = False
    """Rerun the model on the last user message (input empty; `operations.edits`)."""
    regenerate_message_id: str | None = None
    """The answer to regenerate: rerun the model on the user message it answers (input empty; implies
    `regenerate`). None with `regenerate`: the last answer."""
    metadata: Mapping[str, str] | None = None
    """Stored with the thread when this turn creates it."""
    max_context_tokens: int | None = None
    """This turn's token budget for the model's input (bounded by the agent's setting)."""
    resume: Resume | None = None
    """Answer the interrupts the start checkpoint waits on (LangGraph `Command(resume=...)`; input empty)."""
    cancel_interrupts: bool = False
    """Send the input although interrupts wait at the start: they stay unanswered on that checkpoint."""
    include: tuple[str, ...] = ()
    """`("state",)`: the result carries what a client re-renders (`agent.operations.render`)."""


@dataclass(frozen=True)
class Resume:
    """The answer to a graph's pending `interrupt()`s: any JSON value when one waits, or
    `{interrupt_id: value}` (LangGraph's form) to answer several, or one of several, by id."""

    value: Any


def parse_turn_options(envelope: Envelope, custom: Mapping[str, Any]) -> TurnOptions:
    """A turn's own `custom_inputs` (`TURN_KEYS`), checked against the envelope. Raises InvalidRequest."""
    regenerate = custom.get("regenerate", False)
    if not isinstance(regenerate, bool):
        raise InvalidRequest(f"regenerate must be true or false, got {regenerate!r}")
    include = checks.include("include", custom.get("include"))
    cancel_interrupts = custom.get("cancel_interrupts", False)
    if not isinstance(cancel_interrupts, bool):
        raise InvalidRequest(f"cancel_interrupts must be true or false, got {cancel_interrupts!r}")
    if "resume" in custom:
        if (
            envelope.messages
            or regenerate
            or custom.get("edit_message_id") is not None
            or custom.get("regenerate_message_id") is not None
            or cancel_interrupts
        ):
            raise InvalidRequest(
                "resume answers the thread's pending interrupts and takes an empty input "
                "(no messages, regenerate, regenerate_message_id, edit_message_id or cancel_interrupts); "
                "nothing was written"
            )
        if envelope.thread_id is None and not envelope.thread_of_checkpoint:
            raise InvalidRequest(
                "resume needs the thread whose interrupt it answers: custom_inputs.thread_id, conversation, "
                "or previous_response_id"
            )
        _check_json_answer(custom["resume"])
        return TurnOptions(resume=Resume(custom["resume"]), max_context_tokens=_budget(custom), include=include)
    edit_message_id = check_id("edit_message_id", custom.get("edit_message_id"))
    regenerate_message_id = check_id("regenerate_message_id", custom.get("regenerate_message_id"))
    if regenerate_message_id is not None:
        if custom.get("regenerate", True) is not True:
            raise InvalidRequest("regenerate_message_id regenerates an answer: leave out regenerate, or send it true")
        regenerate = True
    if regenerate and edit_message_id is not None:
        raise InvalidRequest(
            "A turn either edits a message (edit_message_id) or regenerates an answer (regenerate, "
            "regenerate_message_id), not both"
        )
    if regenerate and envelope.messages:
        raise InvalidRequest(
            "regenerate and regenerate_message_id take an empty input: they answer a user message of the thread again"
        )
    if not regenerate and not envelope.messages:
        raise InvalidRequest(
            "input is empty: the turn action needs at least one message (or regenerate: true, or resume)"
        )
    if (regenerate or edit_message_id is not None) and envelope.thread_id is None and not envelope.thread_of_checkpoint:
        raise InvalidRequest(
            "edit_message_id, regenerate and regenerate_message_id need custom_inputs.thread_id (the thread to change)"
        )
    metadata = check_metadata(custom.get("metadata"))
    return TurnOptions(
        edit_message_id=edit_message_id,
        regenerate=regenerate,
        regenerate_message_id=regenerate_message_id,
        metadata=metadata,
        max_context_tokens=_budget(custom),
        cancel_interrupts=cancel_interrupts,
        include=include,
    )


def _budget(custom: Mapping[str, Any]) -> int | None:
    budget = custom.get("max_context_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise InvalidRequest(f"max_context_tokens must be a positive integer, got {budget!r}")
    return budget


def _check_json_answer(value: Any) -> None:
    """Refuse a `resume` that is not a JSON value (a set, bytes, NaN, an object with keys that are not strings):
    over HTTP it cannot be anything else, and an answer is stored with its checkpoint and exported with it."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"resume must be a JSON value ({exc}); nothing was written") from None
    if _non_string_keys(value):
        raise InvalidRequest("resume must be a JSON value: an object's keys are strings; nothing was written")


def _non_string_keys(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if any(not isinstance(key, str) for key in item):
                return True
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False
