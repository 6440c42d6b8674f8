"""What describes a thread: its title, metadata and time to live, their limits and checks, and the default title.

Metadata follows OpenAI's rule for `metadata` objects (at most 16 pairs, string
keys of at most 64 characters and string values of at most 512); the default
title is the first user message of the turn that created the thread, whitespace
collapsed, cut to at most 60 characters on a word boundary (with `…`). Apart
from the catalogue because turns, imports and the OpenAI routes check the same
values. Imports no LangChain (messages are only read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest
from agent.validation import check_unicode

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

#: OpenAI's limits on a `metadata` object.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
#: Longest default title (the first user message, shortened), in characters, "…" included.
DEFAULT_TITLE_CHARS = 60
#: Longest time to live (100 years), in seconds: a thread's `ttl_seconds` and the `thread_ttl_seconds` setting.
MAX_TTL_SECONDS = 100 * 365 * 24 * 3600
#: Longest title `update_thread` accepts.
MAX_TITLE_CHARS = 256


def check_metadata(value: Any, *, name: str = "metadata") -> dict[str, str] | None:
    """None, or a copy of `value` if it is an object of string keys and values within OpenAI's limits.

    Raises:
        InvalidRequest: anything else, saying which limit.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidRequest(f"{name} must be an object of string keys and string values")
    if len(value) > MAX_METADATA_PAIRS:
        raise InvalidRequest(f"{name} has {len(value)} pairs; at most {MAX_METADATA_PAIRS} are allowed")
    for key, item in value.items():
        if not key or len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidRequest(f"{name} keys must be 1 to {MAX_METADATA_KEY_CHARS} characters long: {key[:80]!r}")
        if len(item) > MAX_METADATA_VALUE_CHARS:
            raise InvalidRequest(f"{name}[{key!r}] is {len(item)} characters long; the limit is {MAX_METADATA_VALUE_CHARS}")
        if "\x00" in key or "\x00" in item:  # Postgres JSON cannot hold \u0000
            raise InvalidRequest(f"{name} must not contain NUL characters (key {key[:80]!r})")
        check_unicode(f"{name} key {key[:80]!r}", key)
        check_unicode(f"{name}[{key!r}]", item)
    return dict(value)


def check_title(value: Any) -> str | None:
    """None, or the title with surrounding whitespace removed: 1 to 256 characters, no control characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"title must be a string, got {type(value).__name__}")
    title = value.strip()
    if not title or len(title) > MAX_TITLE_CHARS:
        raise InvalidRequest(f"title must be 1 to {MAX_TITLE_CHARS} characters long (surrounding spaces removed)")
    if not title.isprintable():
        raise InvalidRequest(f"title must not contain control characters: {title[:80]!r}")
    check_unicode("title", title)
    return title


def check_ttl(value: Any) -> float | None:
    """None, or a positive number of seconds up to `MAX_TTL_SECONDS`, as a float (an int, or a float;
    not a boolean, NaN or infinity).

    The bound keeps `updated_at + ttl_seconds` a timestamp Postgres can compute: a larger interval
    overflows (`DatetimeFieldOverflow`) in the retention sweep's query, which would then fail for
    every thread of the database.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= 0:  # NaN != NaN
        raise InvalidRequest(f"ttl_seconds must be a positive number of seconds, got {value!r:.40}")
    if value > MAX_TTL_SECONDS:  # before float(): an int of 400 digits has no float (OverflowError)
        raise InvalidRequest(f"ttl_seconds must be at most {MAX_TTL_SECONDS} (100 years), got {value!r:.40}")
    return float(value)


def default_title(messages: Sequence[BaseMessage]) -> str | None:
    """The title of a thread created by a turn sending `messages`: its first user message's text,
    whitespace collapsed, at most 60 characters, cut on a word boundary with "…" (None: no user text)."""
    for message in messages:
        if message.type == "human":
            return shorten(_text(message.content))
    return None


def shorten(text: str, limit: int = DEFAULT_TITLE_CHARS) -> str | None:
    """`text` on one line; when longer than `limit`, cut at the last word boundary before it, plus "…"."""
    # Control characters (a NUL, which Postgres text cannot hold) become spaces like any other break.
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    if not text:
        return None
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:  # a very long first word is cut inside it rather than leaving a stub
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content if isinstance(part, (str, dict)))
    return ""
