"""The domain of every value a thread document holds, checked before anything is written.

A document's values are written by one code path (the saver) and then read by
many: LangGraph's loop on the next turn, the history and branch views, the
usage sums in SQL, the export. Each of those assumes what the agent itself
writes. A value a later step cannot handle is refused here, naming the field,
rather than stored and failing every later operation on the thread. The bounds,
and why each is what it is:

* **Numbers** anywhere in the document are finite (no NaN or Infinity: JSON has
  neither, Postgres jsonb refuses them) and integers fit in 64 bits
  (`|n| <= MAX_INTEGER`): msgpack (the blob encoding), SQLite's INTEGER and a
  Postgres `bigint` cast hold no more. **Nesting** is at most `MAX_DEPTH` (100)
  levels, the document's own included: msgpack stops at 255, and a message's
  blob adds its own levels.
* **Checkpoint format** `v`: 1 to `MAX_CHECKPOINT_V`, the versions LangGraph's
  loop knows (`langgraph.pregel._checkpoint.LATEST_VERSION`).
* **Timestamps** (`ts`, and the thread's `created_at`, `updated_at`,
  `exported_at` when given): ISO 8601 date and time with a UTC offset, the form
  `datetime.isoformat()` writes for an aware datetime (LangGraph's `ts`, the
  storage's record times). A date alone, or a week date (`2024-W01-1`, which
  `datetime.fromisoformat` reads and Postgres's `timestamptz` does not), is refused.
* **Channel versions** (`channel_versions` and `versions_seen`): the strings
  LangGraph's Postgres and SQLite savers write (`get_next_version`: 32 digits,
  a dot, and the text of a random number), or the agent's short ones (10
  digits, a dot, hex digits, as it wrote them before; or its compact ones: a
  letter giving the counter's length, the counter in base 36, a dot, base-36
  digits: `agent.storage.saver`). LangGraph compares versions with `max()` and
  `>`, and the saver increments the counter; a number, or a string of another
  shape, breaks the next turn (comparing str with int, or a Postgres function
  given the wrong type).
* **Names** (channels, nodes, task ids, `updated_channels`): ids
  (`agent.validation.check_id`: 1 to 256 printable characters).
* **Usage numbers** in a checkpoint's metadata, the turn report the saver
  derives the summary from: `model_input_messages` and `model_input_tokens`
  are integers from 0 to `MAX_TOKENS`, `summary_used` a boolean, `usage`
  `{"input_tokens", "output_tokens"}` integers from 0 to `MAX_TOKENS` (a
  trillion: no model call comes near it, and `get_usage`'s sum over a thread
  stays inside 64 bits, which SQLite's `sum()` needs, up to 9 million
  checkpoints at the bound); `branch_usage` (derived again on import) the same shape;
  `recalled_memories` a list of at most `MAX_RECALLED` memory ids.
* **LangGraph's own metadata**: `step` (required) an integer from -1 to
  `MAX_TOKENS` (the loop adds one to it), `source` a string, `parents` an
  object of strings, `counters_since_delta_snapshot` an object of `[n, n]`.
* **The thread record**: `title`, `metadata` and `ttl_seconds` as
  `update_thread` takes them (`operations.thread_values`); `forked_from` None
  or `{"thread_id", "checkpoint_id"}` ids; `message_count` an integer from 0.

Apart from `parse` so that every document format calls the same checks with
plain values (the callers pass fields, not models). Imports no LangChain.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agent.errors import InvalidRequest
from agent.operations.thread_values import check_metadata, check_title, check_ttl
from agent.validation import check_id

#: Largest integer magnitude anywhere in a document (64-bit signed).
MAX_INTEGER = 2**63 - 1
#: Deepest nesting of objects and lists in a document, the document itself being level 1.
MAX_DEPTH = 100
#: Largest token or message count in a checkpoint's usage metadata, and largest `step`.
MAX_TOKENS = 10**12
#: Most memory ids in a checkpoint's `recalled_memories` (the memories one turn was sent).
MAX_RECALLED = 1000
#: Checkpoint formats (`v`) LangGraph's loop reads.
MAX_CHECKPOINT_V = 4
#: A channel version as LangGraph's Postgres and SQLite savers write it (`f"{n:032}.{random():016}"`), or
#: as the agent's savers do (`f"{n:010}.{hex}"` before, now `agent.storage.saver.compact_version`, whose
#: first letter gives the counter's length: checked apart, `_version`).
VERSION_PATTERN = re.compile(r"([0-9]{32}|[0-9]{10})\.[0-9A-Za-z.+-]{1,32}|[a-z][0-9a-z]{1,26}\.[0-9a-z]{1,32}")
#: An ISO 8601 date and time with a UTC offset, as `datetime.isoformat()` writes it (`Z` also read).
TIMESTAMP_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?([+-][0-9]{2}:[0-9]{2}|Z)")

_USAGE_KEYS = frozenset({"input_tokens", "output_tokens"})


def invalid(reason: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid thread document: {reason}; nothing was written.")


# -- the whole document ------------------------------------------------------------------------------
def check_json(name: str, value: Any) -> None:
    """Refuse a NaN or infinite float, an integer beyond 64 bits, or nesting deeper than `MAX_DEPTH`
    anywhere in `value` (walked iteratively), naming its path below `name` ("" for a whole document).
    Booleans are not numbers here."""
    stack: list[tuple[str, Any, int]] = [(name, value, 0)]
    while stack:
        where, item, depth = stack.pop()
        if isinstance(item, bool) or item is None or isinstance(item, str):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise invalid(f"{where} is {item!r}; numbers must be finite")
        elif isinstance(item, int):
            if not -MAX_INTEGER <= item <= MAX_INTEGER:
                raise invalid(f"{where} is an integer beyond 64 bits (at most {MAX_INTEGER} in magnitude)")
        elif depth >= MAX_DEPTH:
            raise invalid(f"{where} is nested deeper than {MAX_DEPTH} levels")
        elif isinstance(item, Mapping):
            stack.extend((f"{where}.{key}" if where else str(key), child, depth + 1) for key, child in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{where}[{index}]", child, depth + 1) for index, child in enumerate(item))


def check_timestamp(name: str, value: Any, *, required: bool = True) -> None:
    """An ISO 8601 date and time with a UTC offset (see the module docstring); None only if not `required`."""
    if value is None and not required:
        return
    ok = isinstance(value, str) and TIMESTAMP_PATTERN.fullmatch(value) is not None
    if ok:
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:  # e.g. month 13
            ok = False
    if not ok:
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise invalid(f"{name} must be an ISO 8601 date and time with a UTC offset (2024-05-01T12:00:00.000000+00:00), got {shown!r}")


# -- the thread record ---------------------------------------------------------------------------------
def check_thread(
    *,
    title: Any,
    metadata: Any,
    ttl_seconds: Any,
    forked_from: Any,
    message_count: Any,
    created_at: Any,
    updated_at: Any,
) -> None:
    """The thread record's fields: the limits `update_thread` holds (OpenAI's for metadata), so an import
    cannot bring in more, and the reader's fields in their shapes."""
    try:
        check_title(title)
        check_metadata(metadata, name="thread.metadata")
        check_ttl(ttl_seconds)
    except InvalidRequest as exc:
        raise invalid(f"thread: {exc.message}") from None
    if forked_from is not None:
        if not isinstance(forked_from, Mapping) or set(forked_from) != {"thread_id", "checkpoint_id"}:
            raise invalid('thread.forked_from must be null or {"thread_id", "checkpoint_id"}')
        _name("thread.forked_from.thread_id", forked_from["thread_id"])
        _name("thread.forked_from.checkpoint_id", forked_from["checkpoint_id"])
    if message_count is not None:
        _integer("thread.message_count", message_count, 0, MAX_INTEGER)
    check_timestamp("thread.created_at", created_at, required=False)
    check_timestamp("thread.updated_at", updated_at, required=False)


# -- one checkpoint --------------------------------------------------------------------------------------
def check_checkpoint(
    where: str,
    *,
    v: Any,
    ts: Any,
    metadata: Mapping[str, Any],
    channel_versions: Mapping[str, Any],
    versions_seen: Mapping[str, Mapping[str, Any]],
    updated_channels: Any,
    channels: Any = (),
    pending_writes: Any = (),
) -> None:
    """One checkpoint's fields (see the module docstring); `channels`: the names of its channel values,
    `pending_writes`: `(task_id, channel)` pairs.

    Raises:
        InvalidRequest: the first value outside its domain, named `{where}.<field>`.
    """
    _integer(f"{where}.v", v, 1, MAX_CHECKPOINT_V)
    check_timestamp(f"{where}.ts", ts)
    for channel, version in channel_versions.items():
        _name(f"{where}.channel_versions key", channel)
        _version(f"{where}.channel_versions[{channel!r}]", version)
    for node, seen in versions_seen.items():
        _name(f"{where}.versions_seen key", node)
        for channel, version in seen.items():
            _name(f"{where}.versions_seen[{node!r}] key", channel)
            _version(f"{where}.versions_seen[{node!r}][{channel!r}]", version)
    for index, channel in enumerate(updated_channels or ()):
        _name(f"{where}.updated_channels[{index}]", channel)
    for channel in channels:
        _name(f"{where}.channel_values key", channel)
    for index, (task_id, channel) in enumerate(pending_writes):
        _name(f"{where}.pending_writes[{index}].task_id", task_id)
        _name(f"{where}.pending_writes[{index}].channel", channel)
    check_checkpoint_metadata(f"{where}.metadata", metadata)


def check_checkpoint_metadata(where: str, metadata: Mapping[str, Any]) -> None:
    """LangGraph's keys and the usage the saver derives summaries from (see the module docstring)."""
    if "step" not in metadata:
        raise invalid(f"{where}.step is missing (LangGraph's loop continues from it)")
    _integer(f"{where}.step", metadata["step"], -1, MAX_TOKENS)
    counters = metadata.get("counters_since_delta_snapshot")
    if counters is not None and not (
        isinstance(counters, Mapping)
        and all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)
            for pair in counters.values()
        )
    ):
        raise invalid(f"{where}.counters_since_delta_snapshot must be an object of [n, n] pairs")
    if "source" in metadata and not isinstance(metadata["source"], str):
        raise invalid(f"{where}.source must be a string")
    parents = metadata.get("parents")
    if parents is not None and not (
        isinstance(parents, Mapping) and all(isinstance(value, str) for value in parents.values())
    ):
        raise invalid(f"{where}.parents must be an object of strings")
    for key in ("model_input_messages", "model_input_tokens"):
        if key in metadata:
            _integer(f"{where}.{key}", metadata[key], 0, MAX_TOKENS)
    if "summary_used" in metadata and not isinstance(metadata["summary_used"], bool):
        raise invalid(f"{where}.summary_used must be true or false")
    recalled = metadata.get("recalled_memories")
    if recalled is not None and not (
        isinstance(recalled, list) and len(recalled) <= MAX_RECALLED and all(isinstance(i, str) and 0 < len(i) <= 256 for i in recalled)
    ):
        raise invalid(f"{where}.recalled_memories must be a list of at most {MAX_RECALLED} memory ids")
    for key, most in (("usage", MAX_TOKENS), ("branch_usage", MAX_INTEGER)):
        usage = metadata.get(key)
        if usage is None:
            continue
        if not isinstance(usage, Mapping) or set(usage) != _USAGE_KEYS:
            raise invalid(f'{where}.{key} must be null or {{"input_tokens": n, "output_tokens": n}}')
        for field, count in usage.items():
            _integer(f"{where}.{key}.{field}", count, 0, most)


# -- single values -----------------------------------------------------------------------------------------
def _integer(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = value if isinstance(value, (int, float)) and abs(value) < 10**20 else type(value).__name__
        raise invalid(f"{name} must be an integer from {low} to {high}, got {shown!r}")


def _version(name: str, value: Any) -> None:
    ok = isinstance(value, str) and VERSION_PATTERN.fullmatch(value) is not None
    if ok and not value[0].isdigit():  # compact: the letter gives the counter's length (`a` for one digit)
        ok = len(value.split(".")[0]) == ord(value[0]) - ord("a") + 2
    if not ok:
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise invalid(
            f"{name} must be a channel version as LangGraph's savers write it (32 or 10 digits, a dot, digits; "
            f"or a letter, base-36 digits, a dot, base-36 digits), got {shown!r}"
        )


def _name(name: str, value: Any) -> None:
    try:
        check_id(name, value)
    except InvalidRequest as exc:
        raise invalid(exc.message) from None
