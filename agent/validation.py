"""Checks of single request values, shared by request parsing and the Python API.

Each returns the value if it is acceptable and raises `InvalidRequest`, naming
the field, if not. How pydantic's complaints are worded for people
(`validation_problems`) lives with the errors (`agent.errors`), so that the
settings can word theirs without importing this module, which reads the
settings' choices.
"""

from __future__ import annotations

import json
from typing import Any

from agent.config import MULTITASK_STRATEGIES
from agent.errors import InvalidRequest, shown_id, validation_problems

#: Longest id (thread_id, checkpoint_id, user_id, …), in characters.
MAX_ID_CHARS = 256
#: Largest history page.
MAX_HISTORY_LIMIT = 1000

__all__ = [
    "MAX_HISTORY_LIMIT",
    "MAX_ID_CHARS",
    "check_id",
    "check_limit",
    "check_strategy",
    "check_unicode",
    "check_user_id",
    "encoded_size",
    "required_id",
    "validation_problems",
]


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
        raise InvalidRequest(f"{name} must not contain control characters: {shown_id(value)}")
    check_unicode(name, value)
    return value


def required_id(name: str, value: Any) -> str:
    """`check_id`, and the value must be given."""
    checked = check_id(name, value)
    if checked is None:
        raise InvalidRequest(f"{name} is required")
    return checked


def check_user_id(value: Any, *, require: bool) -> str | None:
    """A valid user id, or None when absent and not required."""
    user_id = check_id("user_id", value)
    if user_id is None and require:
        raise InvalidRequest("This agent requires a user_id (custom_inputs.user_id or context.user_id)")
    return user_id


def check_limit(value: Any, *, name: str = "limit", maximum: int = MAX_HISTORY_LIMIT) -> int:
    """An integer page size from 1 to `maximum`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidRequest(f"{name} must be an integer from 1 to {maximum}, got {value!r}")
    return value


def check_strategy(value: Any) -> str | None:
    """None, or one of the multitask strategies."""
    if value is not None and value not in MULTITASK_STRATEGIES:
        raise InvalidRequest(f"multitask_strategy must be one of {list(MULTITASK_STRATEGIES)}, got {value!r}")
    return value


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


def check_unicode(name: str, value: str) -> None:
    """Refuse text that cannot be encoded as UTF-8 (a lone UTF-16 surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{name} is not valid Unicode ({exc.reason})") from None
