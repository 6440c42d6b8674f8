"""Argument checkers for `param(check=...)`: each is `check(name, value) -> value`, raising InvalidRequest.

The checks themselves live with what they check (`agent.validation` for ids and
limits, `catalogue` for titles and metadata, `memories` for queries); these adapt
them to the one form the operation door calls, so the same words refuse a bad
value from Python, a request and the command line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.errors import InvalidRequest
from agent.validation import MAX_HISTORY_LIMIT, check_id, check_limit, encoded_size, required_id

Check = Callable[[str, Any], Any]

__all__ = ["Check", "check_id", "include", "limit", "messages", "document", "flag", "id_list", "named", "required_id", "value_only"]


def limit(maximum: int = MAX_HISTORY_LIMIT) -> Check:
    """An integer page size from 1 to `maximum`; the check's `bounds` say so to the command line's help."""

    def check(name: str, value: Any) -> int:
        return check_limit(value, name=name, maximum=maximum)

    check.bounds = (1, maximum)  # type: ignore[attr-defined]
    return check


def named(function: Callable[..., Any]) -> Check:
    """`function(value, name=name)`: a check that takes the field's name as a keyword."""
    return lambda name, value: function(value, name=name)


def value_only(function: Callable[[Any], Any]) -> Check:
    """`function(value)`: a check that names its field itself."""
    return lambda name, value: function(value)


def flag(name: str, value: Any) -> bool:
    """True or false (not 1, 0 or a string)."""
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {value!r:.40}")
    return value


#: `include: ["state"]`: a write's answer carries what a client re-renders (`agent.operations.render`).
STATE = "state"

#: What a write's `include` may name.
INCLUDES = (STATE,)


def include(name: str, value: Any) -> tuple[str, ...]:
    """None or a list of names from `INCLUDES`, as a tuple without repeats."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest(f"{name} must be a list of strings from {list(INCLUDES)}, got {value!r:.60}")
    unknown = [v for v in value if v not in INCLUDES]
    if unknown:
        raise InvalidRequest(f"{name} takes {list(INCLUDES)}, got {unknown[0]!r:.60}")
    return tuple(dict.fromkeys(value))


def id_list(name: str, value: Any) -> tuple[str, ...]:
    """None or a list of ids, as a tuple."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest(f"{name} must be a list of message ids")
    return tuple(required_id(f"{name}[{i}]", item) for i, item in enumerate(value))


def messages(name: str, value: Any) -> list[Any]:
    """Input messages: LangChain messages as parsed from a request, or Responses-style item dicts
    (a Python caller's `[{"role": "user", "content": "..."}]`), as LangChain messages."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest(f"{name} must be a list of Responses message items")
    if all(hasattr(item, "type") and hasattr(item, "content") for item in value):
        return list(value)
    from agent.messages import to_langchain

    encoded_size(name, value)  # refuses lone surrogates, as requests do
    return to_langchain(list(value))


def document(name: str, value: Any) -> dict[str, Any]:
    """A thread document (an object, from `export_thread`); its content is checked on import."""
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be a thread document object (from export_thread), got {type(value).__name__}")
    return value
