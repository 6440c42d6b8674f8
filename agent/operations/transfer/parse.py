"""Validation of a document, whole, before anything is read from or written to the database.

`parse_document` checks what pydantic cannot say in a model: canonical ids,
one root, every parent present and no cycle, the head among the checkpoints,
messages LangChain can load (and only the four message classes a thread
stores: nothing is built from a class path), each with an id, and no id twice
in a checkpoint's messages (refused as a "duplicate id"; a pending write may
repeat one: `load_messages`), and values Postgres text and
jsonb can hold (no NUL, no NaN), so that both backends refuse the same documents.
Every value's domain (numbers, nesting, timestamps, channel versions, usage, the
thread record's fields) is `values`, which both document versions go through.

It also resolves every checkpoint's values, parents first: a version 2
checkpoint's `unchanged` and `message_changes` values apply to its parent's
(`transfer.changes`), so a change that names a message the parent lacks, or a
parent without the channel, is refused here like any other fault. Each message
of the document is loaded once: a message a checkpoint keeps is its parent's
object, so the saver re-encodes the messages as deltas by identity, as it does
for a turn, and a long thread is not loaded once per checkpoint.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agent.errors import InvalidRequest, shown_id
from agent.operations.transfer.changes import apply_changes
from agent.operations.transfer.document import (
    CHANGE_TYPES,
    FORMAT,
    MESSAGE_TYPES,
    MESSAGES,
    NUL_ESCAPE,
    READ_VERSIONS,
    WRITE_MESSAGE_TYPES,
    ChannelValue,
    CheckpointDoc,
    MessageChanges,
    Restored,
    ThreadDocument,
)
from agent.operations.transfer.values import check_checkpoint, check_json, check_thread, check_timestamp
from agent.storage.deltas import is_message_list
from agent.validation import check_id, encoded_size

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage


def parse_document(document: Any) -> Restored:
    """`document` validated whole, before anything is written (see `agent.operations.transfer`).

    Raises:
        InvalidRequest: what is wrong, naming the field; nothing was written.
    """
    if not isinstance(document, Mapping):
        raise InvalidRequest(f"A thread document must be a JSON object, got {type(document).__name__}")
    encoded_size("document", document)  # refuses lone surrogates and absurd nesting first
    check_json("", document)
    try:
        parsed = ThreadDocument.model_validate(dict(document))
    except ValidationError as exc:
        versions = " or ".join(str(v) for v in READ_VERSIONS)
        raise InvalidRequest(f"Not a {FORMAT} version {versions} document: {_first_errors(exc)}; nothing was written.") from None
    thread = parsed.thread
    check_id("thread.thread_id", thread.thread_id)
    check_id("thread.checkpoint_id", thread.checkpoint_id)
    _storable_json("thread", thread.model_dump())
    check_thread(
        title=thread.title,
        metadata=thread.metadata,
        ttl_seconds=thread.ttl_seconds,
        forked_from=thread.forked_from,
        message_count=thread.message_count,
        created_at=thread.created_at,
        updated_at=thread.updated_at,
    )
    check_timestamp("exported_at", parsed.exported_at, required=False)
    by_id: dict[str, CheckpointDoc] = {}
    for index, checkpoint in enumerate(parsed.checkpoints):
        where = f"checkpoints[{index}]"
        _checkpoint_id(f"{where}.checkpoint_id", checkpoint.checkpoint_id)
        if checkpoint.parent_checkpoint_id is not None:
            _checkpoint_id(f"{where}.parent_checkpoint_id", checkpoint.parent_checkpoint_id)
        if checkpoint.checkpoint_id in by_id:
            raise invalid(f"checkpoint {checkpoint.checkpoint_id!r} appears twice")
        by_id[checkpoint.checkpoint_id] = checkpoint
        _storable_json(f"{where}.metadata", checkpoint.metadata)
        check_checkpoint(
            where,
            v=checkpoint.v,
            ts=checkpoint.ts,
            metadata=checkpoint.metadata,
            channel_versions=checkpoint.channel_versions,
            versions_seen=checkpoint.versions_seen,
            updated_channels=checkpoint.updated_channels,
            channels=checkpoint.channel_values.keys(),
            pending_writes=[(w.task_id, w.channel) for w in checkpoint.pending_writes],
        )
        unversioned = sorted(set(checkpoint.channel_values) - set(checkpoint.channel_versions))
        if unversioned:
            raise invalid(f"{where}.channel_values has channels without a version: {unversioned}")
    order = _parents_first(by_id)
    if thread.checkpoint_id not in by_id:
        raise invalid(f"the head {thread.checkpoint_id!r} (thread.checkpoint_id) is not among the checkpoints")
    values: dict[str, dict[str, Any]] = {}
    for checkpoint in order:
        parent = values[checkpoint.parent_checkpoint_id] if checkpoint.parent_checkpoint_id is not None else None
        values[checkpoint.checkpoint_id] = _resolved(checkpoint, parent, parsed.version)
        for write in checkpoint.pending_writes:
            where = f"a pending write of checkpoint {checkpoint.checkpoint_id!r}"
            decode_value(write.value, where, WRITE_MESSAGE_TYPES, update=True)
    messages = {checkpoint_id: found[MESSAGES] for checkpoint_id, found in values.items() if MESSAGES in found}
    return Restored(parsed, tuple(order), values, messages)


def _resolved(checkpoint: CheckpointDoc, parent: dict[str, Any] | None, version: int) -> dict[str, Any]:
    """The checkpoint's whole channel values, from its own and (version 2) its parent's resolved ones."""
    out: dict[str, Any] = {}
    for channel, value in checkpoint.channel_values.items():
        where = f"checkpoint {checkpoint.checkpoint_id!r}, channel {channel!r}"
        if value.type in CHANGE_TYPES:
            if version < 2:
                raise invalid(f"{where} has type {value.type!r}, which version {version} documents do not have")
            if parent is None or channel not in parent:
                raise invalid(f"{where} has type {value.type!r}, but its parent checkpoint has no value for the channel")
            before = parent[channel]
            if value.type == "unchanged":  # the parent's value; a list or set is copied, so no two checkpoints share one
                out[channel] = list(before) if isinstance(before, list) else set(before) if isinstance(before, set) else before
            else:
                out[channel] = _changed_messages(before, value.value, where)
        elif channel == MESSAGES and value.type != "messages":
            raise invalid(f"{where} must have type 'messages', 'message_changes' or 'unchanged'")
        else:
            out[channel] = decode_value(value, where)
    return out


def _changed_messages(before: Any, changes: Any, where: str) -> list[BaseMessage]:
    if not is_message_list(before):
        raise invalid(f"{where} has type 'message_changes', but its parent's value of the channel is not a message list")
    try:
        parsed = MessageChanges.model_validate(changes)
    except ValidationError as exc:
        raise invalid(f"{where}: {_first_errors(exc)}") from None
    try:
        return apply_changes(before, parsed.remove, load_messages(parsed.add, f"{where}, add"))
    except ValueError as exc:
        raise invalid(f"{where}: {exc}") from None


def _parents_first(by_id: Mapping[str, CheckpointDoc]) -> list[CheckpointDoc]:
    """The checkpoints, each after its parent (siblings by id); refuses a missing parent, several roots, a cycle."""
    children: dict[str | None, list[str]] = {}
    for checkpoint in by_id.values():
        parent = checkpoint.parent_checkpoint_id
        if parent is not None and parent not in by_id:
            raise invalid(f"the parent {parent!r} of checkpoint {checkpoint.checkpoint_id!r} is not in the document")
        children.setdefault(parent, []).append(checkpoint.checkpoint_id)
    roots = children.get(None, [])
    if len(roots) != 1:
        raise invalid(f"a thread has exactly one root checkpoint (no parent), the document has {len(roots)}")
    order: list[CheckpointDoc] = []
    stack = [roots[0]]
    while stack:  # iterative: a long thread is a deep tree
        current = stack.pop()
        order.append(by_id[current])
        stack.extend(sorted(children.get(current, ()), reverse=True))
    if len(order) != len(by_id):  # what the root does not reach hangs in a cycle of parents
        unreached = sorted(set(by_id) - {c.checkpoint_id for c in order})
        raise invalid(f"checkpoints {unreached[:3]} form a cycle of parents, unreachable from the root")
    return order


def load_messages(
    value: Any, where: str, types: frozenset[str] = MESSAGE_TYPES, *, update: bool = False
) -> list[BaseMessage]:
    """The messages of a document's message list, each with an id (a non-empty string), and no id twice in a
    list of messages (a state, or what a checkpoint adds).

    `update`: the list is a pending write, which LangGraph applies with `add_messages` (a state update's, kept
    on its parent checkpoint), where an id may recur: a later message with an id replaces the earlier one,
    and a `remove` followed by a message with its id is that message's replacement. Earlier releases wrote
    both (`update_checkpoint_state` with two items of one id, or removing a message and sending its
    replacement), and their threads' exports import.
    """
    from langchain_core.messages import messages_from_dict

    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise invalid(f"{where} must be a list of message objects")
    for index, message in enumerate(value):
        if not isinstance(message.get("type"), str) or message["type"] not in types or not isinstance(message.get("data"), dict):
            raise invalid(f"{where}[{index}] must be {{'type': one of {sorted(types)}, 'data': {{...}}}}")
    try:
        loaded = messages_from_dict(value)
    except Exception as exc:  # noqa: BLE001 - LangChain's constructors raise what they meet (ValidationError,
        # TypeError, AttributeError on a tool call that is not an object, ...): all mean "not a message"
        raise invalid(f"{where} holds a message LangChain cannot load: {' '.join(str(exc).split())[:300]}") from None
    ids = [m.id for m in loaded]
    if not all(isinstance(i, str) and i for i in ids):
        raise invalid(f"{where}: every message needs an id (a non-empty string)")
    if not update:
        seen: set[str] = set()
        for message_id in ids:
            if message_id in seen:
                raise invalid(f"{where}: two messages have the id {shown_id(message_id)} (a duplicate id)")
            seen.add(message_id)
    return loaded


def decode_value(
    value: ChannelValue, where: str, types: frozenset[str] = MESSAGE_TYPES, *, update: bool = False
) -> Any:
    """A whole value (`messages`, `interrupts`, `set`, `json`) decoded; a change type (`_resolved` applies
    those) is refused here, so a pending write is always a whole value. `update`: a pending write's
    (`load_messages`)."""
    if value.type in CHANGE_TYPES:
        raise invalid(f"{where} has type {value.type!r}, which only a checkpoint's channel values may have")
    if value.type == "messages":
        return load_messages(value.value, where, types, update=update)
    if value.type == "interrupts":
        return _load_interrupts(value.value, where)
    if value.type == "set":
        return _load_set(value.value, where)
    try:
        json.dumps(value.value, allow_nan=False)
    except (TypeError, ValueError):
        raise invalid(f"{where} must be plain JSON") from None
    return value.value


def _load_interrupts(value: Any, where: str) -> list[Any]:
    from langgraph.types import Interrupt

    if not isinstance(value, list) or not all(
        isinstance(item, Mapping) and set(item) == {"id", "value"} and isinstance(item["id"], str) and item["id"]
        for item in value
    ):
        raise invalid(f"{where} must be a list of {{\"id\", \"value\"}} interrupts")
    try:
        json.dumps([item["value"] for item in value], allow_nan=False)
    except (TypeError, ValueError):
        raise invalid(f"{where}: an interrupt's value must be plain JSON") from None
    return [Interrupt(value=item["value"], id=item["id"]) for item in value]


def _load_set(value: Any, where: str) -> set[Any]:
    """A `set` value as the Python set it was (a join edge's barrier channel needs one: LangGraph adds to
    it); its items JSON scalars, none twice (as Python compares them: 1, 1.0 and true are one item)."""
    if not isinstance(value, list) or not all(item is None or isinstance(item, (str, int, float)) for item in value):
        raise invalid(f"{where} must be a list of strings, numbers, booleans or null (the items of a set)")
    items = set(value)
    if len(items) != len(value):
        raise invalid(f"{where}: a set holds each item once, and the list has an item twice")
    return items


def _checkpoint_id(name: str, value: str) -> None:
    check_id(name, value)
    try:
        canonical = str(uuid.UUID(value))
    except ValueError:
        canonical = None
    if canonical != value:
        raise invalid(f"{name} must be a UUID in canonical form (as LangGraph writes them), got {value!r}")


def _storable_json(name: str, value: Any) -> None:
    """Refuse what Postgres text and jsonb cannot hold, so the backends behave alike: a NUL character
    in any string or key (a literal backslash-u0000 is text, not a NUL), or NaN and Infinity."""
    try:
        dumped = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise invalid(f"{name} must be plain JSON (no NaN or Infinity)") from None
    if NUL_ESCAPE.search(dumped):
        raise invalid(f"{name} holds a NUL character")


def invalid(reason: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid thread document: {reason}; nothing was written.")


def _first_errors(exc: ValidationError, limit: int = 3) -> str:
    parts = []
    for error in exc.errors()[:limit]:
        location = ".".join(str(p) for p in error["loc"]) or "(document)"
        parts.append(f"{location}: {error['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
