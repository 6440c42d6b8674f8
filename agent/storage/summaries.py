"""The summary written into each checkpoint's metadata, so history listings never resolve messages.

`message_count`, `last_message` (the last message's text, at most
`LAST_MESSAGE_CHARS`), `last_user_message` (the text of the last user message,
at most `LAST_MESSAGE_CHARS`), `next_nodes` and `ts` are computed once, when
the checkpoint is written; `get_checkpoint_history` then costs one index range
scan, and one read of the listed checkpoints' own deltas for the previews (see
"Previews from the delta"), whatever the length of the thread.

**Previews from the delta.** The two previews quote the checkpoint's last
messages, which its stored `messages` delta (`deltas`) nearly always holds: a
turn's delta adds the user's message and the replies. So a checkpoint stores a
preview only when `previews` of the messages its delta adds would not give it
back (`stored_previews`: an edit that adds no user message, a removal that
adds nothing, a checkpoint whose `messages` did not change), and a reader
takes the others from the delta (`fill_previews`; `agent_rows` for a list: the
cached message list when there is one, else one query for the listed
checkpoints' blobs, `get_checkpoint_history(limit=10)` reading ten deltas and
resolving none). Why: the two previews were 215 of a turn's metadata bytes on
Postgres, the largest derivable part of a turn's fixed storage cost (issue
"pay only for what a turn says"). A preview read from the delta equals the one
computed from the whole list: the delta's added messages are the list's last
ones. Checkpoints written before store both previews, which are read as they
are; a row without a summary (LangGraph's own) gets them from its messages
too. `list_branches` reads the whole tree's rows but fills the leaves' only
(`ThreadStorage.list_checkpoints(previews=False)`, then `fill_previews`).

`kept_messages` is how many of the checkpoint's first messages are its parent's,
unchanged (the rest were written by this checkpoint: a turn's new messages, or
everything from the first message an edit replaced or removed). `kept_trailing`,
stored only when not 0, is how many of the rest, at the end, are the parent's
too: an in-place replacement (same length) leaves the messages after the
replaced one where they were. With them and
`message_count`, the tree of a thread's checkpoints tells where each message of
a checkpoint first appeared and which checkpoints are its alternatives
(`agent.operations.tree`) without reading a single message.

What the model was sent comes from the run's **turn report**: a dict under
`TURN_REPORT_KEY` in the run config's `configurable`, which the turn runner
creates and the agent node fills (`agent.context.window`). `model_input_summary`
turns it into `model_input_messages`, `model_input_tokens`, `summary_used`,
`usage` and `recalled_memories` (the ids of the long-term memories the model was
sent; only when there were some, so a turn without any pays nothing) for the checkpoint the turn writes, and adds `usage` to the parent's
`branch_usage` (every model call from the root to this checkpoint), so a
branch's total is one checkpoint's metadata and every branch counts only its
own calls. Why not a state channel: a new channel value each turn is a blob row
and an index entry, about 600 bytes per turn on Postgres, which took the
storage benchmark over its target (3.2 times the message bytes instead of 2.6);
metadata alone adds about 250.

**Layout: one key of our own.** The summary is stored under one metadata key,
`SUMMARY_KEY`, with short field names (`pack`), beside the caller's metadata,
which is kept whole: a LangGraph graph run directly on our saver may write any
key, `ts` and `message_count` included, and LangGraph's own savers keep every
key a caller wrote. The short names make a checkpoint's metadata smaller than
the flat layout it replaces (about 60 bytes less per checkpoint; the fixed cost
of a turn is what the storage benchmark watches). Checkpoints written before
this layout hold the same fields flat, beside LangGraph's keys; `unpack` reads
both, so no migration rewrites stored rows. The agent's own operations read a
checkpoint's metadata through `agent_view` (the caller's keys with the summary
fields flat, as before), so nothing above `agent.storage` sees the layout.

**As text on Postgres.** In a jsonb document every number costs a numeric
datum, its entry and alignment (about 12 bytes for `598`) and every key an
entry of its own, so the summary object took about 225 of a checkpoint row's
bytes; the same fields as one JSON text (`as_text`, a jsonb string) take about
115 (`ts` there as microseconds since the epoch, 16 digits instead of 32
characters). So the Postgres saver stores the summary as text, and turns it
back into the object when it loads a row (`TurnPostgresSaver`); `unpack` reads either,
and the SQL that reads summary fields parses the text (`sql.SUMMARY_FIELD`).
SQLite keeps a JSON value: its documents are JSON text already, where a
string would only add escapes (the positional array itself, below:
`as_positional`). Rows written before hold the object, and read as before.

**Positional on Postgres.** The text is a JSON array, not an object: the
fields every turn writes at fixed places (`POSITIONAL`: `[n, t, k, mi, mt, us,
bu]`, null where a field is absent), then, when there is any, an object of the
others (`REST_INDEX`). The values `next_nodes` `[]` and, beside
`model_input_messages`, `summary_used` `false`, which nearly every turn
writes, are left out of it and implied (an absent one is written as null
there). A turn's summary text went from about 105 characters to about 57: the
object spent its key names and quotes on every row. `as_text` writes the
shorter of the two texts (a summary of few fields is shorter as an object),
and the object when a field the array would hold is null (it could not tell it
from an absent one); `as_object` reads every layout; the SQL that reads fields
parses either (`sql.SUMMARY_FIELD`).

**Encrypted previews.** With encryption at rest (`agent.encryption`), the
fields that quote messages (`TEXT_FIELDS`) that a checkpoint stores are one
sealed value, `sealed_previews` (the JSON list `[last_message,
last_user_message]` when it stores both, else an object of the one it stores):
`pack` takes the keyring's `seal_text`, `agent_view` its `open_text`. One value
rather than two, because each sealed value costs its key id, nonce and tag
and base64 on top: sealed apart, the previews added 165 bytes to every
checkpoint, more than the storage benchmark's bound leaves room for. The
previews read from the delta need no seal of their own: the delta is a blob,
sealed by the saver's serializer. The other
fields stay plaintext, because SQL reads them (the tree, token usage) and they
hold no words. `unpack` and `with_fields` leave the sealed value as it is, so
a rewrite (retention, `delete_for_runs`) keeps it sealed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from agent.encryption import NO_KEYS
from agent.storage import deltas

if TYPE_CHECKING:  # imported on use: `agent.views` reads LAST_MESSAGE_CHARS without loading LangChain
    from langchain_core.messages import BaseMessage

#: Longest `last_message` / `last_user_message` kept in a checkpoint's summary, in characters.
LAST_MESSAGE_CHARS = 100

#: The `configurable` key of a run's turn report (a dict; see the module docstring). `tt_` keys are not metadata.
TURN_REPORT_KEY = "tt_turn_report"


#: The metadata key holding the summary (see "Layout" above). A caller's own value under it is replaced.
SUMMARY_KEY = "__tt__"

#: Summary field -> its short name under `SUMMARY_KEY`.
SHORT_NAMES = {
    "message_count": "n",
    "last_message": "m",
    "last_user_message": "u",
    "next_nodes": "x",
    "ts": "t",
    "kept_messages": "k",
    "kept_trailing": "kt",
    "model_input_messages": "mi",
    "model_input_tokens": "mt",
    "summary_used": "s",
    "usage": "us",
    "branch_usage": "bu",
    "sealed_previews": "p",
    "recalled_memories": "rm",
}
#: The summary fields, as the agent reads them (`agent_view`) and as the flat layout stored them.
SUMMARY_FIELDS = frozenset(SHORT_NAMES)
_LONG_NAMES = {short: name for name, short in SHORT_NAMES.items()}
#: Fields that quote a message: sealed when encryption is on (see "Encrypted previews" above).
TEXT_FIELDS = ("last_message", "last_user_message")
#: Fields holding a token usage `{"input_tokens", "output_tokens"}`, packed as `[input, output]`.
_USAGE_FIELDS = frozenset({"usage", "branch_usage"})


def pack(summary: Mapping[str, Any], seal: Callable[[str], str] | None = None) -> dict:
    """`{SUMMARY_KEY: …}`: the summary fields under their short names, usages as `[input, output]`; with
    `seal` (a keyring's `seal_text`), the `TEXT_FIELDS` it holds as one sealed `sealed_previews` value (a
    list of both when it holds both, else an object of the one; see "Encrypted previews" above)."""
    summary = dict(summary)
    if seal is not None and any(summary.get(name) for name in TEXT_FIELDS):
        held = {name: summary.pop(name) for name in TEXT_FIELDS if name in summary}
        previews: Any = list(held.values()) if len(held) == len(TEXT_FIELDS) else held
        summary["sealed_previews"] = seal(json.dumps(previews, ensure_ascii=False))
    packed = {}
    for name, value in summary.items():
        if name in _USAGE_FIELDS and isinstance(value, Mapping):
            value = [int(value.get("input_tokens", 0)), int(value.get("output_tokens", 0))]
        packed[SHORT_NAMES[name]] = value
    return {SUMMARY_KEY: packed}


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


#: The short names of the summary fields at fixed places of the positional text ("Positional on Postgres").
POSITIONAL = ("n", "t", "k", "mi", "mt", "us", "bu")
#: The place of the object of the other fields in the positional text.
REST_INDEX = len(POSITIONAL)
#: Values left out of the positional text's object, and implied when absent (`summary_used` only beside
#: `model_input_messages`, which every turn's model input has).
_IMPLIED = {SHORT_NAMES["next_nodes"]: [], SHORT_NAMES["summary_used"]: False}


def as_text(metadata: Mapping[str, Any]) -> dict:
    """`metadata` with its summary (`SUMMARY_KEY`) as one compact JSON text (see "As text on Postgres" and
    "Positional on Postgres"), its `ts` as microseconds since the epoch when that gives the same text back
    (`_ts_micros`); as it is when it holds no summary object."""
    packed = metadata.get(SUMMARY_KEY)
    if not isinstance(packed, Mapping):
        return dict(metadata)
    packed = _with_ts_micros(packed)
    texts = (json.dumps(value, ensure_ascii=False, separators=(",", ":")) for value in (_positional(packed), packed))
    return {**metadata, SUMMARY_KEY: min(texts, key=len)}


def _with_ts_micros(packed: Mapping[str, Any]) -> Mapping[str, Any]:
    # `packed` with `ts` as microseconds since the epoch, when that gives the same text back (`_ts_micros`).
    short = SHORT_NAMES["ts"]
    micros = _ts_micros(packed.get(short))
    return packed if micros is None else {**packed, short: micros}


def _positional(packed: Mapping[str, Any]) -> list | Mapping[str, Any]:
    # The array of "Positional on Postgres"; `packed` itself when a null would be ambiguous.
    if any(packed.get(short, 0) is None for short in (*POSITIONAL, *_IMPLIED)):
        return packed
    row: list[Any] = [packed.get(short) for short in POSITIONAL]
    rest = {short: value for short, value in packed.items() if short not in POSITIONAL and short not in _IMPLIED}
    for short, implied in _IMPLIED.items():
        applies = short != SHORT_NAMES["summary_used"] or "mi" in packed
        if short not in packed:
            if applies:
                rest[short] = None  # absent, where the value would be implied
        elif not applies or packed[short] != implied or type(packed[short]) is not type(implied):
            rest[short] = packed[short]
    return [*row, rest] if rest else row


def as_positional(metadata: Mapping[str, Any]) -> dict:
    """`metadata` with its summary object as the positional array itself, not as text (SQLite: its documents
    are JSON already), `ts` as microseconds as in `as_text`, when that is shorter; as it is otherwise."""
    packed = metadata.get(SUMMARY_KEY)
    if not isinstance(packed, Mapping):
        return dict(metadata)
    row = _positional(_with_ts_micros(packed))
    shorter = isinstance(row, list) and len(json.dumps(row, separators=(",", ":"))) < len(json.dumps(packed, separators=(",", ":")))
    return {**metadata, SUMMARY_KEY: row} if shorter else dict(metadata)


def as_object(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """`metadata` with a summary stored as text (`as_text`, either text) or as the positional array
    (`as_positional`) as the object again; as it is otherwise."""
    packed = metadata.get(SUMMARY_KEY) if metadata else None
    if not isinstance(packed, (str, list)):
        return metadata
    if isinstance(packed, str):
        packed = json.loads(packed)
    if isinstance(packed, list):
        packed = _from_positional(packed)
    short = SHORT_NAMES["ts"]
    if type(packed.get(short)) is int:  # not a bool; LangGraph's `ts` is a string, never a number
        packed[short] = (_EPOCH + timedelta(microseconds=packed[short])).isoformat()
    return {**metadata, SUMMARY_KEY: packed}


def _from_positional(row: list) -> dict:
    packed = {short: value for short, value in zip(POSITIONAL, row) if value is not None}
    rest = row[REST_INDEX] if len(row) > REST_INDEX else {}
    for short, implied in _IMPLIED.items():
        applies = short != SHORT_NAMES["summary_used"] or "mi" in packed
        if short not in rest and applies:
            packed[short] = list(implied) if isinstance(implied, list) else implied
    packed.update((short, value) for short, value in rest.items() if not (short in _IMPLIED and value is None))
    return packed


def _ts_micros(ts: Any) -> int | None:
    """A UTC timestamp as LangGraph writes one (`datetime.now(timezone.utc).isoformat()`, 32 characters) as
    microseconds since the epoch (16 digits), or None when that would not give exactly `ts` back."""
    if not isinstance(ts, str) or not ts.endswith("+00:00"):
        return None
    try:
        moment = datetime.fromisoformat(ts)
    except ValueError:
        return None
    delta = moment - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros if (_EPOCH + timedelta(microseconds=micros)).isoformat() == ts else None


def is_packed(metadata: Mapping[str, Any] | None) -> bool:
    """Whether `metadata` holds its summary under `SUMMARY_KEY`, as an object, as text or as the positional
    array (else it is the older flat layout, or none)."""
    return bool(metadata) and isinstance(metadata.get(SUMMARY_KEY), (Mapping, str, list))


def unpack(metadata: Mapping[str, Any] | None) -> dict:
    """The summary fields of a stored checkpoint's metadata, in either layout, under their long names.

    Only fields that are stored are returned (a checkpoint written by a LangGraph saver has none).
    """
    if not metadata:
        return {}
    if not is_packed(metadata):  # the flat layout of checkpoints written before SUMMARY_KEY
        return {name: metadata[name] for name in SUMMARY_FIELDS if name in metadata}
    out = {}
    for short, value in as_object(metadata)[SUMMARY_KEY].items():
        name = _LONG_NAMES.get(short)
        if name is None:
            continue
        if name in _USAGE_FIELDS and isinstance(value, list) and len(value) == 2:
            value = {"input_tokens": value[0], "output_tokens": value[1]}
        out[name] = value
    return out


def caller_metadata(metadata: Mapping[str, Any] | None) -> dict:
    """The metadata without the summary: what the caller (LangGraph, a graph's config) wrote.

    For the flat layout, the summary fields are removed too (only the agent wrote checkpoints then).
    """
    if not metadata:
        return {}
    if is_packed(metadata):
        return {key: value for key, value in metadata.items() if key != SUMMARY_KEY}
    return {key: value for key, value in metadata.items() if key not in SUMMARY_FIELDS}


def with_fields(metadata: Mapping[str, Any] | None, **fields: Any) -> dict:
    """Stored metadata with some summary fields set, in its own layout (a flat one stays flat)."""
    metadata = dict(metadata or {})
    if is_packed(metadata):
        return {**caller_metadata(metadata), **pack({**unpack(metadata), **fields})}
    if "message_count" in metadata and "next_nodes" in metadata:  # the flat layout
        return {**metadata, **fields}
    return {**metadata, **pack(fields)}


def agent_view(metadata: Mapping[str, Any] | None, open_text: Callable[..., Any] = NO_KEYS.open_text) -> dict:
    """The metadata as the agent's operations read it: the caller's keys, then the summary fields flat,
    the sealed previews opened with `open_text` (a keyring's).

    A preview the checkpoint does not store (see "Previews from the delta" above) is not in the view:
    `lacks_previews` tells, and `fill_previews` (or `agent_rows`, for many) sets it from the checkpoint's
    messages.

    A caller key named like a summary field is shadowed here (the agent's own graph writes none); the
    stored metadata and LangGraph's reads (`get_tuple`, `list`) keep it.

    Raises:
        EncryptionKeyError: the previews are sealed with a key `open_text`'s keyring lacks.
    """
    summary = unpack(metadata)
    sealed = summary.pop("sealed_previews", None)
    if sealed is not None:
        opened = json.loads(open_text(sealed, what="A checkpoint's message previews"))
        summary.update(zip(TEXT_FIELDS, opened, strict=True) if isinstance(opened, list) else opened)
    return {**caller_metadata(metadata), **summary}


def lacks_previews(view: Mapping[str, Any]) -> bool:
    """Whether `view` (an `agent_view`) misses a preview, which `fill_previews` then derives."""
    return any(name not in view for name in TEXT_FIELDS)


def fill_previews(view: dict, messages: Sequence[BaseMessage]) -> dict:
    """`view` with the previews it misses taken from `messages`: the checkpoint's whole message list,
    or the messages its stored delta adds (`deltas.added_messages`), which end the same. Returns `view`."""
    return set_missing(view, previews(messages))


def set_missing(view: dict, derived: Mapping[str, str]) -> dict:
    """`view` with the previews it misses set from `derived` (`previews` or `record_previews`). Returns `view`."""
    for name in TEXT_FIELDS:
        view.setdefault(name, derived[name])
    return view


def record_previews(stored: Any) -> dict[str, str] | None:
    """`previews` of what a stored `messages` value adds, read from its compact records (`deltas.to_record`)
    without LangChain, for the light reader of read-only commands (`sqlite.reads.SqliteReader`); None when
    the value holds a message stored as an object, or is of another layout (then `previews` of the decoded
    messages serves). No value (a checkpoint without messages) gives empty previews."""
    if stored is None:
        return {name: "" for name in TEXT_FIELDS}
    if not (isinstance(stored, Mapping) and deltas.COMPACT_KEY in stored):
        return None
    records = stored.get("a")
    if not isinstance(records, list) or not all(isinstance(r, list) and len(r) >= 3 for r in records):
        return None
    last_user = next((r for r in reversed(records) if r[0] == "human"), None)
    return {
        "last_message": _clip(_record_text(records[-1])) if records else "",
        "last_user_message": _clip(_record_text(last_user)) if last_user is not None else "",
    }


def _record_text(record: list) -> str:
    # `message_text` of the message a record stands for: LangChain's `BaseMessage.text` (a string content,
    # or its string and "text" blocks joined), else the tools an AI message calls.
    kind, content, _, *rest = record
    if isinstance(content, str):
        text = content
    else:
        text = "".join(
            block if isinstance(block, str) else block["text"]
            for block in content
            if isinstance(block, str)
            or (isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str))
        )
    calls = rest[0].get("tool_calls") if rest and isinstance(rest[0], Mapping) else None
    if not text and kind == "ai" and calls:
        text = "[tool call: " + ", ".join(call["name"] for call in calls) + "]"
    return text


def previews(messages: Sequence[BaseMessage]) -> dict[str, str]:
    """`last_message` and `last_user_message` of `messages` ("" when there is no such message), each at
    most `LAST_MESSAGE_CHARS`.

    For the last messages of a list (a delta's added ones) a value is the list's own whenever it is not
    "": the last message of the suffix is the list's, and so is the last user message when the suffix
    holds one. `stored_previews` keeps what this cannot give.
    """
    last_user = next((m for m in reversed(messages) if getattr(m, "type", None) == "human"), None)
    return {
        "last_message": _clip(message_text(messages[-1] if messages else None)),
        "last_user_message": _clip(message_text(last_user)),
    }


def stored_previews(summary: Mapping[str, Any], added: Sequence[BaseMessage]) -> dict:
    """`summary` without the previews that `previews(added)` gives back: what a checkpoint stores when
    `added` are the messages its stored `messages` value adds (see "Previews from the delta" above)."""
    derived = previews(added)
    return {name: value for name, value in summary.items() if name not in TEXT_FIELDS or derived[name] != value}


def agent_rows(
    rows: Sequence[Mapping[str, Any]],
    fetch_messages: Callable[[list[str]], Mapping[str, Any]],
    cached: Callable[[str], Sequence[BaseMessage] | None] = lambda checkpoint_id: None,
) -> list[dict]:
    """`rows` (dicts with `checkpoint_id` and a `metadata` view, `agent_view`) with the previews a view
    lacks filled in (`fill_previews`): from `cached(checkpoint_id)` (the whole message list, or None),
    else from the stored `messages` values that one call of `fetch_messages(checkpoint_ids)` returns
    (by checkpoint id; a delta, a whole list, or None). The views are changed in place."""
    lacking = {}
    for row in rows:
        view = row["metadata"]
        if lacks_previews(view):
            messages = cached(row["checkpoint_id"])
            if messages is not None:
                fill_previews(view, messages)
            else:
                lacking[row["checkpoint_id"]] = view
    if lacking:
        stored = fetch_messages(list(lacking))
        for checkpoint_id, view in lacking.items():
            value = stored.get(checkpoint_id)
            derived = record_previews(value)  # no LangChain message built, when the delta holds records
            set_missing(view, derived if derived is not None else previews(deltas.added_messages(value)))
    return list(rows)


def message_text(message: BaseMessage | None) -> str:
    """A one-line text for a message: its text, else the tools it calls."""
    from langchain_core.messages import AIMessage

    if message is None:
        return ""
    text = message.text
    if not text and isinstance(message, AIMessage) and message.tool_calls:
        text = "[tool call: " + ", ".join(call["name"] for call in message.tool_calls) + "]"
    return text


def summarize(
    messages: Sequence[BaseMessage],
    checkpoint: Mapping[str, Any],
    next_nodes: Sequence[str],
    *,
    kept_messages: int = 0,
    kept_trailing: int = 0,
) -> dict:
    """The summary stored in a checkpoint's metadata, read by history listings and the branch tree.

    `kept_messages`: how many leading messages the checkpoint shares with its parent; `kept_trailing`: how
    many of the rest, at the end, are its parent's too (an in-place replacement, `deltas.kept_trailing`),
    stored only when not 0, as nearly every checkpoint has none. `next_nodes`: the nodes the checkpoint
    waits to run, as LangGraph names them (`agent.storage.next_nodes`).
    """
    return {
        "message_count": len(messages),
        **previews(messages),
        "next_nodes": list(next_nodes),
        "ts": checkpoint.get("ts"),
        "kept_messages": kept_messages,
    } | ({"kept_trailing": kept_trailing} if kept_trailing else {})


#: What a root checkpoint keeps of the metadata it is written with: a kept head that a `keep_latest` sweep
#: made a root still holds its turn's model input and its branch's totals, which nothing can derive again
#: (its parents are gone), so an import or a copy of it hands them over as they are.
ROOT_CARRIED_FIELDS = (
    "model_input_messages",
    "model_input_tokens",
    "summary_used",
    "usage",
    "branch_usage",
    "recalled_memories",
)


def model_input_summary(
    report: Mapping[str, Any] | None, parent_id: str | None, parent_metadata: Mapping[str, Any] | None
) -> dict:
    """The metadata about model input and token usage of a checkpoint with parent `parent_id`.

    Args:
        report: the run's turn report, `{"start", "messages", "tokens", "summary_used", "usage"}` (and
            `"memories"`: recalled memory ids, when there were some) once the agent node called the model (`start`: the checkpoint the turn started from), or
            None / empty. It describes this checkpoint only when `start` is `parent_id`.
        parent_metadata: the parent checkpoint's metadata (None for a root checkpoint).

    Returns:
        `model_input_messages`, `model_input_tokens`, `summary_used` and `usage` (omitted when the
        model reported none) from the report, `recalled_memories` (memory ids; only when the turn recalled
        some), and `branch_usage`: the parent's plus `usage`, for every
        checkpoint that has a parent. Token counts are ints; usages are `{"input_tokens", "output_tokens"}`.
    """
    out: dict[str, Any] = {}
    if parent_id is None:
        return out
    branch = dict((parent_metadata or {}).get("branch_usage") or {"input_tokens": 0, "output_tokens": 0})
    if report and report.get("start") == parent_id:
        out["model_input_messages"] = report["messages"]
        out["model_input_tokens"] = report["tokens"]
        out["summary_used"] = bool(report["summary_used"])
        if report.get("memories"):
            out["recalled_memories"] = list(report["memories"])
        usage = report.get("usage")
        if usage is not None:
            out["usage"] = dict(usage)
            branch = {key: int(branch.get(key, 0)) + int(usage.get(key, 0)) for key in ("input_tokens", "output_tokens")}
    out["branch_usage"] = branch
    return out


def replayed_report(metadata: Mapping[str, Any], start: str) -> dict | None:
    """The turn report that makes the saver write `metadata`'s model input and usage again, for a copy
    of a checkpoint written as the child of `start` (`fork_thread`'s copies); None when the checkpoint
    recorded no model call (a root, a state update). Its `branch_usage` then follows from the copy's
    parent's plus this `usage`, as for the original turn."""
    if not all(key in metadata for key in ("model_input_messages", "model_input_tokens", "summary_used")):
        return None
    return {
        "start": start,
        "messages": metadata["model_input_messages"],
        "tokens": metadata["model_input_tokens"],
        "summary_used": metadata["summary_used"],
        "usage": metadata.get("usage"),
        "memories": metadata.get("recalled_memories"),
    }


def _clip(text: str) -> str:
    # Postgres jsonb refuses NUL, and LangGraph would strip it anyway.
    return text[:LAST_MESSAGE_CHARS].replace("\x00", "")
