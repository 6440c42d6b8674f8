"""Requests parsed once, at the edge, into one typed object.

`parse_request` turns a Responses API request (an MLflow `ResponsesAgentRequest`
or a plain dict) into a `ParsedRequest`: which action, which thread, user and
checkpoint, which concurrency policy, and the input as LangChain messages.
Inner layers never look at raw dicts again.

`custom_inputs` keys (all optional):

| key | type | meaning |
|---|---|---|
| `thread_id` | str | the thread; else `context.conversation_id`; else a new id |
| `checkpoint_id` | str | start the turn from this checkpoint (a branch) instead of the head |
| `user_id` | str | the caller; else `context.user_id` |
| `multitask_strategy` | `"reject"` / `"enqueue"` | overrides the agent's policy for this request |
| `action` | str | `get_checkpoint_history`, `update_checkpoint_state`, `delete_thread`, `delete_user_data`; absent: a turn |
| `limit` | int, 1-1000 | history page size (default 10) |
| `before` | str | history: only checkpoints older than this checkpoint_id |

Any other key is refused, so a misspelt `thread_id` cannot silently start a
new conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import BaseMessage

from agent.errors import InvalidRequest
from agent.messages import to_langchain

Action = Literal["turn", "get_checkpoint_history", "update_checkpoint_state", "delete_thread", "delete_user_data"]
ACTIONS = ("get_checkpoint_history", "update_checkpoint_state", "delete_thread", "delete_user_data")
CUSTOM_INPUT_KEYS = {"thread_id", "checkpoint_id", "user_id", "multitask_strategy", "action", "limit", "before"}
STRATEGIES = ("reject", "enqueue")
MAX_ID_CHARS = 256
MAX_HISTORY_LIMIT = 1000


@dataclass(frozen=True)
class ParsedRequest:
    """One request, validated. `thread_id` is None only for a turn that starts a new thread."""

    action: Action
    thread_id: str | None = None
    user_id: str | None = None
    checkpoint_id: str | None = None
    multitask_strategy: str | None = None
    limit: int = 10
    before: str | None = None
    messages: list[BaseMessage] = field(default_factory=list)


def parse_request(request: Any, *, max_request_bytes: int, require_user_id: bool) -> ParsedRequest:
    """Validate a Responses request and return what it asks for.

    Raises:
        InvalidRequest: the request is larger than `max_request_bytes` (as
            UTF-8 JSON), holds text that is not valid Unicode, has ids that are
            not non-empty strings, unknown or mistyped `custom_inputs`, an
            unknown action, malformed input items, empty input for a turn, or
            no user_id while one is required.
    """
    raw = request.model_dump(exclude_none=True) if hasattr(request, "model_dump") else request
    if not isinstance(raw, dict):
        raise InvalidRequest(f"The request must be an object, got {type(raw).__name__}")
    _check_size(raw, max_request_bytes)
    # `is None`, not `or`: an empty list or string is the wrong type, not "none given".
    custom = {} if raw.get("custom_inputs") is None else raw["custom_inputs"]
    context = {} if raw.get("context") is None else raw["context"]
    if not isinstance(custom, dict):
        raise InvalidRequest("custom_inputs must be an object")
    if not isinstance(context, dict):
        raise InvalidRequest("context must be an object")
    unknown = sorted(set(custom) - CUSTOM_INPUT_KEYS)
    if unknown:
        raise InvalidRequest(f"Unknown custom_inputs {unknown}; known: {sorted(CUSTOM_INPUT_KEYS)}")

    action = custom.get("action", "turn")
    if action != "turn" and action not in ACTIONS:
        raise InvalidRequest(f"Unknown action {action!r}; known: {list(ACTIONS)}")
    thread_id = check_id("thread_id", custom.get("thread_id", context.get("conversation_id")))
    user_id = check_user_id(_user_id(custom, context), require=require_user_id)
    strategy = custom.get("multitask_strategy")
    if strategy is not None and strategy not in STRATEGIES:
        raise InvalidRequest(f"multitask_strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    items = raw.get("input")
    if not isinstance(items, list):
        raise InvalidRequest("input must be a list of items")
    messages = to_langchain(items)

    if action == "turn" and not messages:
        raise InvalidRequest("input is empty: a turn needs at least one message")
    if action in ("get_checkpoint_history", "delete_thread", "delete_user_data") and messages:
        raise InvalidRequest(f"The {action} action takes no input items")
    if action in ("get_checkpoint_history", "update_checkpoint_state", "delete_thread") and thread_id is None:
        raise InvalidRequest(f"The {action} action needs custom_inputs.thread_id")
    if action == "delete_user_data" and user_id is None:
        raise InvalidRequest("The delete_user_data action needs a user_id")
    return ParsedRequest(
        action=action,
        thread_id=thread_id,
        user_id=user_id,
        checkpoint_id=check_id("checkpoint_id", custom.get("checkpoint_id")),
        multitask_strategy=strategy,
        limit=check_limit(custom.get("limit", 10)),
        before=check_id("before", custom.get("before")),
        messages=messages,
    )


def _user_id(custom: dict, context: dict) -> Any:
    # A host that authenticates its callers puts the user in `context.user_id`;
    # a client could still send `custom_inputs.user_id`. When both are given
    # they must agree, so a client cannot speak for another user.
    if "user_id" in custom and "user_id" in context and custom["user_id"] != context["user_id"]:
        raise InvalidRequest("custom_inputs.user_id and context.user_id disagree; send one, or the same in both")
    return custom.get("user_id", context.get("user_id"))


def check_id(name: str, value: Any) -> str | None:
    """`value` if it is None or a usable id: a non-empty string of printable characters, at most 256 long.

    Raises:
        InvalidRequest: anything else, naming the field.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string, got {type(value).__name__}")
    if not value or len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"{name} must be 1 to {MAX_ID_CHARS} characters long")
    if not value.isprintable():
        raise InvalidRequest(f"{name} must not contain control characters: {value!r}")
    _check_unicode(name, value)
    return value


def check_user_id(value: Any, *, require: bool) -> str | None:
    """A valid user id, or None when absent and not required."""
    user_id = check_id("user_id", value)
    if user_id is None and require:
        raise InvalidRequest("This agent requires a user_id (custom_inputs.user_id or context.user_id)")
    return user_id


def check_limit(value: Any) -> int:
    """A history page size between 1 and 1000."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HISTORY_LIMIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_HISTORY_LIMIT}, got {value!r}")
    return value


def _check_size(raw: dict, limit: int) -> None:
    size = encoded_size("The request", raw)
    if size > limit:
        raise InvalidRequest(f"The request is {size} bytes; the limit is {limit} bytes")


def encoded_size(name: str, value: Any) -> int:
    """The size of `value` as UTF-8 JSON, in bytes.

    Raises:
        InvalidRequest: `value` holds text that is not valid Unicode (a lone
            surrogate), or is nested too deeply (or circularly) to encode.
    """
    try:
        return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{name} holds text that is not valid Unicode ({exc.reason})") from None
    except (RecursionError, ValueError) as exc:  # ValueError: a circular reference
        raise InvalidRequest(f"{name} is nested too deeply to read ({type(exc).__name__})") from None


def _check_unicode(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{name} is not valid Unicode ({exc.reason})") from None
