"""Export and import: a thread's whole checkpoint tree as one versioned JSON document.

The document (`FORMAT`, `VERSION`)::

    {"format": "timetravel-agent.thread", "version": 1, "exported_at": "<ISO 8601 UTC>",
     "thread": {"thread_id", "title", "metadata", "checkpoint_id" (the head), "forked_from",
                "ttl_seconds", "message_count", "created_at", "updated_at"},
     "checkpoints": [{"checkpoint_id", "parent_checkpoint_id", "ts", "metadata", "v",
                      "channel_versions", "versions_seen", "updated_channels",
                      "channel_values": {channel: {"type": "messages" | "interrupts" | "json", "value": ...}},
                      "pending_writes": [{"task_id", "channel", "value": {"type", "value"}}]},
                     ...]}   # oldest first (by checkpoint id), the root included

Why this shape:

* **Whole checkpoints, not just messages.** Restoring exactly means every
  channel the graph reads: `messages`, and the branch's `context_summary`
  (`agent.state`), with the channel versions LangGraph uses to decide what
  runs next. Messages are LangChain's own dict form (`messages_to_dict`), which
  keeps ids, tool calls, `response_metadata` and usage; a graph's pending
  `interrupt()`s (in pending writes) are `{"id", "value"}` pairs; every other
  value must be plain JSON (the agent's state is; a user graph whose state holds
  other values cannot be exported, and `export_thread` says which channel). Nothing is pickled or loaded by class
  path: `messages_from_dict` only builds the four message classes a thread
  stores, so a document from a stranger cannot instantiate anything else.
* **Resolved messages.** The storage keeps messages as deltas against a parent
  (`agent.storage.deltas`); a document holds each checkpoint's full list, so it
  is independent of that encoding, and the importer re-encodes deltas in its
  own database by writing through the saver, as `fork_thread` does.
* **No owner.** `user_id` is not part of the document: the importer decides
  who owns the thread. `created_at`/`updated_at` and `ttl_seconds` are there
  for the reader; an imported thread's record is created now (the catalogue
  then lists it as fresh activity), and retention follows the importing
  deployment's policy.
* **Same checkpoint ids, unique across threads.** An import under the
  document's thread id keeps every checkpoint id, parent link and timestamp,
  so the history reads the same in the new database. Checkpoint ids must stay
  unique across the threads of a database (the message cache and response ids
  key by them), so an import whose checkpoint ids another thread holds is
  refused (`ThreadExists`). An import under another `thread_id` is a copy, like
  `fork_thread`: its checkpoint ids are renewed, deterministically (the
  same document under the same new id gives the same ids, so a repeat is still
  a no-op) and in the same order (each new id keeps its original's time part,
  which is what orders ids), so new turns still sort after it.
* **All or nothing, validated first.** The document is parsed into pydantic
  models and checked whole (format and version, types, ids, one root, every
  parent present, no cycle, the head among the checkpoints, messages that load)
  before anything is read from or written to the database; the write is one
  commit of the thread's claim (`storage.commit`), like a turn's.
* **Idempotent.** Importing into a thread that exists, with the same owner and
  the same content (records and checkpoints compared as documents, leaving out
  the summary fields the saver derives again), returns it and writes nothing;
  other content, or another owner, is `ThreadExists`.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent.errors import AgentError, InvalidRequest, ThreadExists, ThreadNotFound
from agent.operations.access import authorize
from agent.operations.catalogue import check_metadata, check_title, check_ttl
from agent.storage import ThreadRecord, ThreadStorage, Turn
from agent.storage.summaries import TURN_REPORT_KEY
from agent.validation import check_id, encoded_size

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from agent.operations import Threads
    from agent.requests import Envelope

#: The `format` of a thread document.
FORMAT = "timetravel-agent.thread"
#: The document version this code writes and reads.
VERSION = 1
#: The channel that holds the branch's messages (LangChain dicts in a document).
MESSAGES = "messages"
#: A NUL character in JSON text: the escape backslash-u0000 after an even number of backslashes
#: (`json.dumps` writes a backslash as two, so after an odd number it is a literal backslash and "u0000").
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: Message types a stored thread holds; `messages_from_dict` builds nothing else from a document.
MESSAGE_TYPES = frozenset({"human", "ai", "system", "tool"})
#: A pending write may also remove messages (`update_checkpoint_state` with `remove_message_ids`).
WRITE_MESSAGE_TYPES = MESSAGE_TYPES | {"remove"}
#: Metadata the saver derives again from the checkpoint when it writes it (`storage.summaries`).
DERIVED_METADATA = frozenset(
    {"message_count", "last_message", "last_user_message", "next_nodes", "ts", "kept_messages", "branch_usage"}
)

Version = str | int | float


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ChannelValue(_Model):
    """One channel's value: `messages` (a list of LangChain message dicts), `interrupts` (a graph's pending
    LangGraph `Interrupt`s: `[{"id", "value"}]`, the value plain JSON) or `json` (plain JSON)."""

    type: Literal["messages", "interrupts", "json"]
    value: Any


class PendingWrite(_Model):
    task_id: str
    channel: str
    value: ChannelValue


class CheckpointDoc(_Model):
    """One checkpoint of the document."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    ts: str
    metadata: dict[str, Any]
    v: int
    channel_versions: dict[str, Version]
    versions_seen: dict[str, dict[str, Version]]
    updated_channels: list[str] | None = None
    channel_values: dict[str, ChannelValue]
    pending_writes: list[PendingWrite] = Field(default_factory=list)

    @field_validator("ts")
    @classmethod
    def _iso_timestamp(cls, value: str) -> str:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not an ISO 8601 timestamp: {value!r}") from None
        return value


class ThreadDoc(_Model):
    """The thread record of the document (no owner: the importer decides)."""

    thread_id: str
    checkpoint_id: str
    title: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    forked_from: dict[str, str] | None = None
    ttl_seconds: float | None = None
    message_count: int | None = None
    created_at: str | None = None
    updated_at: str | None = None


class ThreadDocument(_Model):
    """A whole thread: see the module docstring."""

    format: Literal["timetravel-agent.thread"]
    version: Literal[1]
    exported_at: str | None = None
    thread: ThreadDoc
    checkpoints: list[CheckpointDoc] = Field(min_length=1)


@dataclass(frozen=True)
class Restored:
    """A document, validated and ready to write: its checkpoints parents first, messages loaded."""

    document: ThreadDocument
    order: tuple[CheckpointDoc, ...]
    messages: Mapping[str, list[BaseMessage]]
    """Each checkpoint's messages (checkpoint id -> list), for those whose state holds messages."""


# -- export ----------------------------------------------------------------------------------------
def export_thread(storage: ThreadStorage, thread_id: str, *, user_id: str | None) -> dict[str, Any]:
    """The thread as a document (see the module docstring): JSON-serializable, checkpoints oldest first.

    Reads the record, the tree's summaries and every checkpoint with its messages resolved.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        AgentError: a channel value that is not JSON (the agent's own state always is).
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    return _document(storage, record)


def export_user_threads(storage: ThreadStorage, user_id: str) -> Iterable[dict[str, Any]]:
    """One document per thread `user_id` owns, by thread id; read one at a time (a generator).

    A thread deleted while the export runs is left out.
    """
    for thread_id in storage.threads_of_user(user_id):
        try:
            yield export_thread(storage, thread_id, user_id=user_id)
        except ThreadNotFound:
            continue


def _document(storage: ThreadStorage, record: ThreadRecord) -> dict[str, Any]:
    thread_id = record.thread_id
    ids = [row["checkpoint_id"] for row in storage.list_checkpoints(thread_id, limit=None, before=None)]
    found = storage.get_checkpoints(thread_id, ids)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": datetime.now(UTC).isoformat(),
        "thread": {
            "thread_id": thread_id,
            "checkpoint_id": record.head_checkpoint_id,
            "title": record.title,
            "metadata": dict(record.metadata),
            "forked_from": dict(record.forked_from) if record.forked_from is not None else None,
            "ttl_seconds": record.ttl_seconds,
            "message_count": record.message_count,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
        },
        "checkpoints": [_checkpoint_doc(tup) for tup in sorted(found, key=lambda t: t.config["configurable"]["checkpoint_id"])],
    }


def _checkpoint_doc(tup: Any) -> dict[str, Any]:
    checkpoint = tup.checkpoint
    checkpoint_id = tup.config["configurable"]["checkpoint_id"]
    if checkpoint.get("pending_sends"):
        raise AgentError(f"Checkpoint {checkpoint_id!r} has pending sends, which a document cannot hold.")
    parent = (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    return {
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": parent,
        "ts": checkpoint["ts"],
        "metadata": _json(dict(tup.metadata), f"the metadata of checkpoint {checkpoint_id!r}"),
        "v": checkpoint["v"],
        "channel_versions": dict(checkpoint["channel_versions"]),
        "versions_seen": {node: dict(seen) for node, seen in checkpoint["versions_seen"].items()},
        "updated_channels": list(checkpoint["updated_channels"]) if checkpoint.get("updated_channels") is not None else None,
        "channel_values": {
            channel: _encode_value(channel, value, checkpoint_id) for channel, value in checkpoint["channel_values"].items()
        },
        "pending_writes": [
            {"task_id": task_id, "channel": channel, "value": _encode_value(channel, value, checkpoint_id)}
            for task_id, channel, value in tup.pending_writes or ()
        ],
    }


def _encode_value(channel: str, value: Any, checkpoint_id: str) -> dict[str, Any]:
    from langchain_core.messages import BaseMessage, messages_to_dict

    from langgraph.types import Interrupt

    if channel == MESSAGES or (isinstance(value, list) and value and all(isinstance(m, BaseMessage) for m in value)):
        return {"type": "messages", "value": messages_to_dict(list(value or ()))}
    items = value if isinstance(value, (list, tuple)) else [value]
    if items and all(isinstance(item, Interrupt) for item in items):
        where = f"an interrupt of checkpoint {checkpoint_id!r}"
        return {"type": "interrupts", "value": [{"id": i.id, "value": _json(i.value, where)} for i in items]}
    return {"type": "json", "value": _json(value, f"channel {channel!r} of checkpoint {checkpoint_id!r}")}


def _json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise AgentError(f"Cannot export {what}: it is not JSON ({exc}).") from None


# -- validation (nothing touches the database) ---------------------------------------------------
def parse_document(document: Any) -> Restored:
    """`document` validated whole, before anything is written (see the module docstring).

    Raises:
        InvalidRequest: what is wrong, naming the field; nothing was written.
    """
    if not isinstance(document, Mapping):
        raise InvalidRequest(f"A thread document must be a JSON object, got {type(document).__name__}")
    encoded_size("document", document)  # refuses lone surrogates and absurd nesting first
    try:
        parsed = ThreadDocument.model_validate(dict(document))
    except ValidationError as exc:
        raise InvalidRequest(f"Not a {FORMAT} version {VERSION} document: {_first_errors(exc)}; nothing was written.") from None
    thread = parsed.thread
    check_id("thread.thread_id", thread.thread_id)
    check_id("thread.checkpoint_id", thread.checkpoint_id)
    _storable_json("thread", thread.model_dump())
    try:  # the limits `update_thread` holds (OpenAI's for metadata), so an import cannot bring in more
        check_title(thread.title)
        check_metadata(thread.metadata, name="thread.metadata")
        check_ttl(thread.ttl_seconds)
    except InvalidRequest as exc:
        raise _invalid(f"thread: {exc.message}") from None
    by_id: dict[str, CheckpointDoc] = {}
    for index, checkpoint in enumerate(parsed.checkpoints):
        where = f"checkpoints[{index}]"
        _checkpoint_id(f"{where}.checkpoint_id", checkpoint.checkpoint_id)
        if checkpoint.parent_checkpoint_id is not None:
            _checkpoint_id(f"{where}.parent_checkpoint_id", checkpoint.parent_checkpoint_id)
        if checkpoint.checkpoint_id in by_id:
            raise _invalid(f"checkpoint {checkpoint.checkpoint_id!r} appears twice")
        by_id[checkpoint.checkpoint_id] = checkpoint
        _storable_json(f"{where}.metadata", checkpoint.metadata)
        unversioned = sorted(set(checkpoint.channel_values) - set(checkpoint.channel_versions))
        if unversioned:
            raise _invalid(f"{where}.channel_values has channels without a version: {unversioned}")
    order = _parents_first(by_id)
    if thread.checkpoint_id not in by_id:
        raise _invalid(f"the head {thread.checkpoint_id!r} (thread.checkpoint_id) is not among the checkpoints")
    messages: dict[str, list[BaseMessage]] = {}
    for checkpoint in order:
        for channel, value in checkpoint.channel_values.items():
            where = f"checkpoint {checkpoint.checkpoint_id!r}, channel {channel!r}"
            if channel == MESSAGES:
                if value.type != "messages":
                    raise _invalid(f"{where} must have type 'messages'")
                messages[checkpoint.checkpoint_id] = _load_messages(value.value, where)
            else:
                _decode_value(value, where)
        for write in checkpoint.pending_writes:
            _decode_value(write.value, f"a pending write of checkpoint {checkpoint.checkpoint_id!r}", WRITE_MESSAGE_TYPES)
    return Restored(parsed, tuple(order), messages)


def _parents_first(by_id: Mapping[str, CheckpointDoc]) -> list[CheckpointDoc]:
    """The checkpoints, each after its parent (siblings by id); refuses a missing parent, several roots, a cycle."""
    children: dict[str | None, list[str]] = {}
    for checkpoint in by_id.values():
        parent = checkpoint.parent_checkpoint_id
        if parent is not None and parent not in by_id:
            raise _invalid(f"the parent {parent!r} of checkpoint {checkpoint.checkpoint_id!r} is not in the document")
        children.setdefault(parent, []).append(checkpoint.checkpoint_id)
    roots = children.get(None, [])
    if len(roots) != 1:
        raise _invalid(f"a thread has exactly one root checkpoint (no parent), the document has {len(roots)}")
    order: list[CheckpointDoc] = []
    stack = [roots[0]]
    while stack:  # iterative: a long thread is a deep tree
        current = stack.pop()
        order.append(by_id[current])
        stack.extend(sorted(children.get(current, ()), reverse=True))
    if len(order) != len(by_id):  # what the root does not reach hangs in a cycle of parents
        unreached = sorted(set(by_id) - {c.checkpoint_id for c in order})
        raise _invalid(f"checkpoints {unreached[:3]} form a cycle of parents, unreachable from the root")
    return order


def _load_messages(value: Any, where: str, types: frozenset[str] = MESSAGE_TYPES) -> list[BaseMessage]:
    from langchain_core.messages import messages_from_dict

    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise _invalid(f"{where} must be a list of message objects")
    for index, message in enumerate(value):
        if message.get("type") not in types or not isinstance(message.get("data"), dict):
            raise _invalid(f"{where}[{index}] must be {{'type': one of {sorted(types)}, 'data': {{...}}}}")
    try:
        loaded = messages_from_dict(value)
    except (TypeError, ValueError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        raise _invalid(f"{where} holds a message LangChain cannot load: {' '.join(str(exc).split())[:300]}") from None
    ids = [m.id for m in loaded]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        raise _invalid(f"{where}: every message needs its own id (a non-empty string)")
    return loaded


def _decode_value(value: ChannelValue, where: str, types: frozenset[str] = MESSAGE_TYPES) -> Any:
    if value.type == "messages":
        return _load_messages(value.value, where, types)
    if value.type == "interrupts":
        return _load_interrupts(value.value, where)
    try:
        json.dumps(value.value, allow_nan=False)
    except (TypeError, ValueError):
        raise _invalid(f"{where} must be plain JSON") from None
    return value.value


def _load_interrupts(value: Any, where: str) -> list[Any]:
    from langgraph.types import Interrupt

    if not isinstance(value, list) or not all(
        isinstance(item, Mapping) and set(item) == {"id", "value"} and isinstance(item["id"], str) and item["id"]
        for item in value
    ):
        raise _invalid(f"{where} must be a list of {{\"id\", \"value\"}} interrupts")
    try:
        json.dumps([item["value"] for item in value], allow_nan=False)
    except (TypeError, ValueError):
        raise _invalid(f"{where}: an interrupt's value must be plain JSON") from None
    return [Interrupt(value=item["value"], id=item["id"]) for item in value]


def _checkpoint_id(name: str, value: str) -> None:
    check_id(name, value)
    try:
        canonical = str(uuid.UUID(value))
    except ValueError:
        canonical = None
    if canonical != value:
        raise _invalid(f"{name} must be a UUID in canonical form (as LangGraph writes them), got {value!r}")


def _storable_json(name: str, value: Any) -> None:
    """Refuse what Postgres text and jsonb cannot hold, so the backends behave alike: a NUL character
    in any string or key (a literal backslash-u0000 is text, not a NUL), or NaN and Infinity."""
    try:
        dumped = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise _invalid(f"{name} must be plain JSON (no NaN or Infinity)") from None
    if NUL_ESCAPE.search(dumped):
        raise _invalid(f"{name} holds a NUL character")


def _invalid(reason: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid thread document: {reason}; nothing was written.")


def _first_errors(exc: ValidationError, limit: int = 3) -> str:
    parts = []
    for error in exc.errors()[:limit]:
        location = ".".join(str(p) for p in error["loc"]) or "(document)"
        parts.append(f"{location}: {error['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


# -- import ----------------------------------------------------------------------------------------
def import_thread(
    storage: ThreadStorage, document: Any, *, user_id: str | None, thread_id: str | None
) -> ThreadRecord:
    """Restore a document as a thread owned by `user_id`, under its own thread id or `thread_id`.

    Under the document's id, checkpoint ids, parents, timestamps, metadata and
    messages are kept; under another `thread_id` the checkpoint ids are renewed
    (see the module docstring). Title, metadata, `forked_from` and the head are
    restored. Written in one commit; an import that fails writes nothing.

    Returns:
        The thread's record (the existing one when the same content was imported before).

    Raises:
        InvalidRequest: a malformed document (nothing was read from or written to the database).
        ThreadExists: the thread id is in use with other content or by another user, or another
            thread holds one of the checkpoint ids.
        ThreadBusy: a turn holds the thread.
    """
    restored = parse_document(document)
    target = check_id("thread_id", thread_id) or restored.document.thread.thread_id
    if target != restored.document.thread.thread_id:
        restored = _renewed(restored, target)
    ids = [c.checkpoint_id for c in restored.order]
    others = [t for t in storage.threads_with_checkpoints(ids) if t != target]
    if others:
        raise ThreadExists(
            "Another thread already holds checkpoints of this document; import it under another thread_id "
            "(a copy with new checkpoint ids). Nothing was written.",
            thread_id=target,
        )
    in_use = ThreadExists(
        f"Thread {target!r} already exists with other content (or belongs to another user); import under another "
        "thread_id. Nothing was written.",
        thread_id=target,
    )
    try:
        claim = storage.claim(target, user_id=user_id, checkpoint_id=None, strategy="reject", timeout=0)
    except ThreadNotFound:  # another user's thread: the id is taken
        raise in_use from None
    try:
        if claim.record is not None:
            if _same_content(storage, claim.record, restored):
                storage.release(claim)
                return claim.record
            raise in_use
        _write(storage, claim, restored, user_id=user_id)
    except BaseException:
        storage.release(claim)  # does nothing after a commit
        raise
    record = storage.get_thread(target)
    if record is None:  # pragma: no cover - deleted between the commit and this read
        raise ThreadNotFound(f"Thread {target!r} was not found.", thread_id=target)
    return record


def _write(storage: ThreadStorage, claim: Any, restored: Restored, *, user_id: str | None) -> None:
    saver = storage.saver
    thread = restored.document.thread
    turn = Turn(thread_id=claim.thread_id)
    with saver.buffering(turn):
        for checkpoint in restored.order:
            configurable: dict[str, Any] = {"thread_id": turn.thread_id, "checkpoint_ns": ""}
            if checkpoint.parent_checkpoint_id is not None:
                configurable["checkpoint_id"] = checkpoint.parent_checkpoint_id
                # The saver derives the model-input summary and branch totals from a turn report, as for a turn.
                configurable[TURN_REPORT_KEY] = _turn_report(checkpoint)
            values = {
                channel: restored.messages[checkpoint.checkpoint_id] if channel == MESSAGES else _decode_value(value, "")
                for channel, value in checkpoint.channel_values.items()
            }
            state = {
                "v": checkpoint.v,
                "id": checkpoint.checkpoint_id,
                "ts": checkpoint.ts,
                "channel_values": values,
                "channel_versions": dict(checkpoint.channel_versions),
                "versions_seen": {node: dict(seen) for node, seen in checkpoint.versions_seen.items()},
                "pending_sends": [],
                "updated_channels": list(checkpoint.updated_channels) if checkpoint.updated_channels is not None else None,
            }
            # Every channel's value is written anew, as fork_thread does: the new thread has no blobs to point at.
            saver.put({"configurable": configurable}, state, dict(checkpoint.metadata), dict(checkpoint.channel_versions))
            address = {"configurable": {"thread_id": turn.thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint.checkpoint_id}}
            by_task: dict[str, list[tuple[str, Any]]] = {}
            for write in checkpoint.pending_writes:
                by_task.setdefault(write.task_id, []).append((write.channel, _decode_value(write.value, "", WRITE_MESSAGE_TYPES)))
            for task_id, writes in by_task.items():
                saver.put_writes(address, writes, task_id)
    head_count = len(restored.messages.get(thread.checkpoint_id, ()))

    def apply(tx) -> None:
        tx.write_turn(turn)
        tx.insert_thread(
            claim.thread_id,
            user_id=user_id,
            head_checkpoint_id=thread.checkpoint_id,
            message_count=head_count,
            title=thread.title,
            metadata=thread.metadata,
            forked_from=thread.forked_from,
        )

    storage.commit(claim, apply)


def _turn_report(checkpoint: CheckpointDoc) -> dict[str, Any] | None:
    metadata = checkpoint.metadata
    if not all(key in metadata for key in ("model_input_messages", "model_input_tokens", "summary_used")):
        return None
    return {
        "start": checkpoint.parent_checkpoint_id,
        "messages": metadata["model_input_messages"],
        "tokens": metadata["model_input_tokens"],
        "summary_used": metadata["summary_used"],
        "usage": metadata.get("usage"),
    }


def _renewed(restored: Restored, thread_id: str) -> Restored:
    """The document as a copy under `thread_id`: every checkpoint id renewed (see the module docstring)."""
    mapping: dict[str, str] = {}
    previous = -1
    for old in sorted(c.checkpoint_id for c in restored.order):
        high = max(uuid.UUID(old).int >> 64, previous + 1)  # the time part; kept strictly increasing
        digest = int.from_bytes(hashlib.sha256(f"{thread_id}\x00{old}".encode()).digest()[:8], "big")
        low = (digest & ~(0b11 << 62)) | (0b10 << 62)  # the RFC 4122 variant, like LangGraph's uuid6
        mapping[old] = str(uuid.UUID(int=(high << 64) | low))
        previous = high

    def renew(checkpoint: CheckpointDoc) -> CheckpointDoc:
        parent = checkpoint.parent_checkpoint_id
        return checkpoint.model_copy(
            update={"checkpoint_id": mapping[checkpoint.checkpoint_id], "parent_checkpoint_id": mapping.get(parent)}
        )

    document = restored.document
    thread = document.thread.model_copy(update={"thread_id": thread_id, "checkpoint_id": mapping[document.thread.checkpoint_id]})
    checkpoints = [renew(c) for c in document.checkpoints]
    return Restored(
        document.model_copy(update={"thread": thread, "checkpoints": checkpoints}),
        tuple(renew(c) for c in restored.order),
        {mapping[old]: messages for old, messages in restored.messages.items()},
    )


def _same_content(storage: ThreadStorage, record: ThreadRecord, restored: Restored) -> bool:
    """Whether the stored thread is what importing `restored` would write (see the module docstring)."""
    stored = parse_document(_document(storage, record))
    return _comparable(stored) == _comparable(restored)


def _comparable(restored: Restored) -> tuple:
    thread = restored.document.thread
    record = (thread.thread_id, thread.checkpoint_id, thread.title, thread.metadata, thread.forked_from)
    checkpoints = []
    for checkpoint in sorted(restored.order, key=lambda c: c.checkpoint_id):
        dumped = checkpoint.model_dump()
        dumped["metadata"] = {k: v for k, v in dumped["metadata"].items() if k not in DERIVED_METADATA and not k.startswith("tt_")}
        dumped["channel_values"] = {
            channel: _normalized(value) for channel, value in checkpoint.channel_values.items()
        }
        dumped["pending_writes"] = [
            (w.task_id, w.channel, _normalized(w.value, WRITE_MESSAGE_TYPES)) for w in checkpoint.pending_writes
        ]
        checkpoints.append(json.dumps(dumped, sort_keys=True, default=str))
    return record, checkpoints


def _normalized(value: ChannelValue, types: frozenset[str] = MESSAGE_TYPES) -> Any:
    if value.type == "messages":
        from langchain_core.messages import messages_to_dict

        return messages_to_dict(_load_messages(value.value, "", types))
    return value.value


# -- the actions (see agent.operations.ACTIONS) ------------------------------------------------------
@dataclass(frozen=True)
class ImportArgs:
    document: Mapping[str, Any]


def parse_import(envelope: Envelope, custom: Mapping[str, Any]) -> ImportArgs:
    document = custom.get("document")
    if not isinstance(document, dict):
        raise InvalidRequest("The import_thread action needs custom_inputs.document (a thread document object)")
    return ImportArgs(document)


def run_export(threads: Threads, envelope: Envelope, args: None) -> dict[str, Any]:
    return {"thread_id": envelope.thread_id, "document": threads.export_thread(envelope.thread_id, user_id=envelope.user_id)}


def run_import(threads: Threads, envelope: Envelope, args: ImportArgs) -> dict[str, Any]:
    return {"thread": threads.import_thread(args.document, user_id=envelope.user_id, thread_id=envelope.thread_id)}


__all__ = [
    "FORMAT",
    "VERSION",
    "ThreadDocument",
    "export_thread",
    "export_user_threads",
    "import_thread",
    "parse_document",
]
