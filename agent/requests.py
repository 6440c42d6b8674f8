"""Requests parsed once, at the edge, into one typed object.

`parse_request` turns a Responses API request (an MLflow `ResponsesAgentRequest`
or a plain dict) into a `ParsedRequest`: the `Action` it asks for (see
`agent.operations.ACTIONS`), the `Envelope` every action shares (thread, user,
checkpoint, policy, input messages) and the action's own arguments. Inner
layers never look at raw dicts again.

Envelope `custom_inputs` keys (all optional):

| key | type | meaning |
|---|---|---|
| `thread_id` | str | the thread; else `context.conversation_id`; else a new id |
| `checkpoint_id` | str | start the turn from this checkpoint (a branch) instead of the head |
| `user_id` | str | the caller; else `context.user_id` (both given: they must be equal) |
| `multitask_strategy` | `reject` / `enqueue` / `interrupt` / `rollback` | overrides the agent's policy |
| `idempotency_key` | str | a retry with the same key returns the first result instead of running again (turns and `update_checkpoint_state`; other actions ignore it) |
| `action` | str | one of `agent.operations.ACTIONS`; absent: a turn |

Each action adds its own keys (for example `limit` and `before` for
`get_checkpoint_history`). Any other key is refused, so a misspelt
`thread_id` cannot silently start a new conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from agent.config import AgentSettings
from agent.errors import InvalidRequest
from agent.messages import to_langchain
from agent.operations import ACTIONS, Action
from agent.operations.idempotency import request_fingerprint
from agent.validation import check_id, check_strategy, check_user_id, encoded_size

#: `custom_inputs` keys every action takes.
ENVELOPE_KEYS = frozenset({"thread_id", "checkpoint_id", "user_id", "multitask_strategy", "idempotency_key", "action"})


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


@dataclass(frozen=True)
class ParsedRequest:
    """One request: its action, the envelope, and the action's own arguments."""

    action: Action
    envelope: Envelope
    args: Any = None


def parse_request(
    request: Any, settings: AgentSettings, *, user_id: str | None = None, idempotency_key: str | None = None
) -> ParsedRequest:
    """Validate a Responses request and return what it asks for.

    Args:
        request: a `ResponsesAgentRequest` or a dict of the same shape.
        settings: the agent's limits (`max_request_bytes`, `max_input_items`, `require_user_id`).
        user_id: a user id the host already authenticated (a trusted header); it wins over
            the request's, which must then agree with it.
        idempotency_key: the `Idempotency-Key` HTTP header; `custom_inputs.idempotency_key`,
            if also given, must be equal.

    Raises:
        InvalidRequest: the request is larger than `max_request_bytes` (as UTF-8
            JSON) or has more than `max_input_items` items, holds text that is not
            valid Unicode, has ids that are not non-empty strings, unknown or
            mistyped `custom_inputs`, an unknown action, malformed input items,
            input where the action takes none (or none where it needs some),
            no user_id while one is required, or an idempotency key in the header and
            another in `custom_inputs`.
    """
    raw = request.model_dump(exclude_none=True) if hasattr(request, "model_dump") else request
    if not isinstance(raw, dict):
        raise InvalidRequest(f"The request must be an object, got {type(raw).__name__}")
    size = encoded_size("The request", raw)
    if size > settings.max_request_bytes:
        raise InvalidRequest(f"The request is {size} bytes; the limit is {settings.max_request_bytes} bytes")
    # `is None`, not `or`: an empty list or string is the wrong type, not "none given".
    custom = {} if raw.get("custom_inputs") is None else raw["custom_inputs"]
    context = {} if raw.get("context") is None else raw["context"]
    if not isinstance(custom, dict):
        raise InvalidRequest("custom_inputs must be an object")
    if not isinstance(context, dict):
        raise InvalidRequest("context must be an object")

    name = custom.get("action", "turn")
    if not isinstance(name, str) or name not in ACTIONS:
        raise InvalidRequest(f"Unknown action {name!r}; known: {sorted(ACTIONS)}")
    action = ACTIONS[name]
    unknown = sorted(set(custom) - ENVELOPE_KEYS - action.keys)
    if unknown:
        raise InvalidRequest(
            f"Unknown custom_inputs {unknown} for the {name} action; known: {sorted(ENVELOPE_KEYS | action.keys)}"
        )
    items = raw.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]  # the OpenAI client's `input="Hi"`
    if not isinstance(items, list):
        raise InvalidRequest("input must be a list of items or a string")
    if len(items) > settings.max_input_items:
        raise InvalidRequest(f"input has {len(items)} items; the limit is {settings.max_input_items}")
    messages = to_langchain(items)
    if action.input == "required" and not messages:
        raise InvalidRequest(f"input is empty: the {name} action needs at least one message")
    if action.input == "none" and messages:
        raise InvalidRequest(f"The {name} action takes no input items")

    thread_id = check_id("thread_id", custom.get("thread_id", context.get("conversation_id")))
    checkpoint_id = check_id("checkpoint_id", custom.get("checkpoint_id"))
    key = _idempotency_key(custom, idempotency_key)
    envelope = Envelope(
        thread_id=thread_id,
        user_id=check_user_id(_user_id(custom, context, user_id), require=settings.require_user_id),
        checkpoint_id=checkpoint_id,
        multitask_strategy=check_strategy(custom.get("multitask_strategy")),
        idempotency_key=key,
        messages=messages,
        request_hash=None
        if key is None
        else request_fingerprint(name, thread_id, checkpoint_id, messages, {k: custom[k] for k in action.keys if k in custom}),
    )
    if action.needs_thread and envelope.thread_id is None:
        raise InvalidRequest(f"The {name} action needs custom_inputs.thread_id")
    if action.needs_user and envelope.user_id is None:
        raise InvalidRequest(f"The {name} action needs a user_id")
    return ParsedRequest(action=action, envelope=envelope, args=action.parse(envelope, custom))


def _idempotency_key(custom: Mapping[str, Any], header: str | None) -> str | None:
    given = check_id("idempotency_key", custom.get("idempotency_key"))
    if header is None:
        return given
    header = check_id("the Idempotency-Key header", header)
    if given is not None and given != header:
        raise InvalidRequest("The Idempotency-Key header and custom_inputs.idempotency_key disagree; send one")
    return header


def _user_id(custom: Mapping[str, Any], context: Mapping[str, Any], trusted: str | None) -> Any:
    # A host that authenticates its callers puts the user in `context.user_id`
    # (or a trusted header); a client could still send `custom_inputs.user_id`.
    # When several are given they must agree, so a client cannot speak for another user.
    given = [("trusted header", trusted)] if trusted is not None else []
    given += [(f"{where}.user_id", source["user_id"]) for where, source in (("context", context), ("custom_inputs", custom)) if "user_id" in source]
    values = {repr(value) for _, value in given}
    if len(values) > 1:
        raise InvalidRequest(f"{' and '.join(where for where, _ in given)} disagree about the user_id; send one")
    return given[0][1] if given else None
