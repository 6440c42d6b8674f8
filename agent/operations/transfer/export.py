"""Export: a thread's record and whole checkpoint tree as one document (see `agent.operations.transfer`).

Every checkpoint is read with its messages resolved (the storage keeps them as
deltas), and written as what it changes in its parent (version 2): each
channel is `unchanged`, `message_changes` to the parent's message list
(`transfer.changes`), or the whole value in a form the document can hold:
messages as LangChain dicts, a graph's pending interrupts as `{"id", "value"}`
pairs, a set (a join edge's barrier channel) as its sorted items, anything else
as plain JSON, or the export fails naming the channel.
The summary fields the saver derives again on import (`DERIVED_METADATA`) are
left out of the metadata, as are empty `pending_writes` and a null
`updated_channels` (their defaults). LangChain and LangGraph are imported
where a value is encoded, so importing `agent.operations` stays light.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agent.errors import AgentError
from agent.operations.access import authorize
from agent.operations.transfer.changes import changes_between, same_messages
from agent.operations.transfer.document import DERIVED_METADATA, FORMAT, MESSAGES, VERSION
from agent.storage import ThreadRecord, ThreadStorage
from agent.storage.deltas import is_message_list


def export_thread(storage: ThreadStorage, thread_id: str, *, user_id: str | None) -> dict[str, Any]:
    """The thread as a document (see `agent.operations.transfer`): JSON-serializable, checkpoints oldest first.

    Reads the record, the tree's summaries and every checkpoint with its messages resolved.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
        AgentError: a channel value that is not JSON (the agent's own state always is).
    """
    record = authorize(storage.get_thread(thread_id), thread_id, user_id)
    return document_of(storage, record)


def document_of(storage: ThreadStorage, record: ThreadRecord) -> dict[str, Any]:
    thread_id = record.thread_id
    ids = [row["checkpoint_id"] for row in storage.list_checkpoints(thread_id, limit=None, before=None, previews=False)]
    found = sorted(storage.get_checkpoints(thread_id, ids), key=_id_of)
    encoder = ChannelEncoder({_id_of(tup): tup.checkpoint["channel_values"] for tup in found})
    records = storage.branch_records(thread_id)
    branches = [
        {"checkpoint_id": r.checkpoint_id, "label": r.label, "pinned": r.pinned, "archived": r.archived}
        for _, r in sorted(records.items())
    ]
    document = {
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
        "checkpoints": [_checkpoint_doc(tup, encoder) for tup in found],
    }
    if branches:  # only then: a thread without records exports as before
        document["branches"] = branches
    return document


def _id_of(tup: Any) -> str:
    return tup.config["configurable"]["checkpoint_id"]


def _checkpoint_doc(tup: Any, encoder: ChannelEncoder) -> dict[str, Any]:
    checkpoint = tup.checkpoint
    checkpoint_id = _id_of(tup)
    if checkpoint.get("pending_sends"):
        raise AgentError(f"Checkpoint {checkpoint_id!r} has pending sends, which a document cannot hold.")
    parent = (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    # A root's branch total is not derivable when retention made a kept head the root (its parents are gone).
    derived = DERIVED_METADATA - {"branch_usage"} if parent is None else DERIVED_METADATA
    metadata = {key: value for key, value in tup.metadata.items() if key not in derived}
    doc: dict[str, Any] = {
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": parent,
        "ts": checkpoint["ts"],
        "metadata": _json(metadata, f"the metadata of checkpoint {checkpoint_id!r}"),
        "v": checkpoint["v"],
        "channel_versions": dict(checkpoint["channel_versions"]),
        "versions_seen": {node: dict(seen) for node, seen in checkpoint["versions_seen"].items()},
    }
    if checkpoint.get("updated_channels") is not None:
        doc["updated_channels"] = list(checkpoint["updated_channels"])
    doc["channel_values"] = encoder.channels(checkpoint_id, parent)
    if tup.pending_writes:
        doc["pending_writes"] = [
            {"task_id": task_id, "channel": channel, "value": encode_value(channel, value, checkpoint_id)}
            for task_id, channel, value in tup.pending_writes
        ]
    return doc


class ChannelEncoder:
    """Each checkpoint's channel values as what it changes in its parent's (see the module docstring).

    Built on every checkpoint's whole values (checkpoint id -> channel -> value, as the saver
    resolves them); a value's JSON form is computed once, however many children compare with it.
    """

    def __init__(self, values: Mapping[str, Mapping[str, Any]]) -> None:
        self._values = values
        self._encoded: dict[tuple[str, str], tuple[dict[str, Any], str | None]] = {}

    def channels(self, checkpoint_id: str, parent_id: str | None) -> dict[str, dict[str, Any]]:
        """The `channel_values` of checkpoint `checkpoint_id` in a document.

        Raises:
            AgentError: a value that is not JSON (naming the channel and the checkpoint).
        """
        parent = self._values.get(parent_id) if parent_id is not None else None
        return {
            channel: self._encode(checkpoint_id, channel, value, parent_id, parent)
            for channel, value in self._values[checkpoint_id].items()
        }

    def _encode(self, checkpoint_id: str, channel: str, value: Any, parent_id: str | None, parent: Any) -> dict[str, Any]:
        if parent is None or channel not in parent:
            return self._whole(checkpoint_id, channel, value)[0]
        before = parent[channel]
        if is_message_list(before) and is_message_list(value):
            if same_messages(before, value):
                return {"type": "unchanged"}
            found = changes_between(before, value)
            if found is None:  # not an add_messages change: the whole list
                return self._whole(checkpoint_id, channel, value)[0]
            from langchain_core.messages import messages_to_dict

            remove, add = found
            changes = {"remove": remove, "add": messages_to_dict(add)} if remove else {"add": messages_to_dict(add)}
            return {"type": "message_changes", "value": changes}
        encoded, text = self._whole(checkpoint_id, channel, value)
        if text is not None and text == self._whole(parent_id, channel, before)[1]:
            return {"type": "unchanged"}
        return encoded

    def _whole(self, checkpoint_id: str, channel: str, value: Any) -> tuple[dict[str, Any], str | None]:
        """The value's whole form, and its JSON text (None for messages, which are compared as messages)."""
        key = (checkpoint_id, channel)
        if key in self._encoded:
            return self._encoded[key]
        encoded = encode_value(channel, value, checkpoint_id)
        if encoded["type"] == "messages":  # not kept: a message list is encoded whole once at most
            return encoded, None
        self._encoded[key] = (encoded, json.dumps(encoded))
        return self._encoded[key]


def encode_value(channel: str, value: Any, checkpoint_id: str) -> dict[str, Any]:
    from langchain_core.messages import BaseMessage, messages_to_dict

    from langgraph.types import Interrupt

    if channel == MESSAGES or (isinstance(value, list) and value and all(isinstance(m, BaseMessage) for m in value)):
        return {"type": "messages", "value": messages_to_dict(list(value or ()))}
    items = value if isinstance(value, (list, tuple)) else [value]
    if items and all(isinstance(item, Interrupt) for item in items):
        where = f"an interrupt of checkpoint {checkpoint_id!r}"
        return {"type": "interrupts", "value": [{"id": i.id, "value": _json(i.value, where)} for i in items]}
    where = f"channel {channel!r} of checkpoint {checkpoint_id!r}"
    if type(value) is set:  # exactly: a subclass (or a frozenset) would not come back as what was stored
        return {"type": "set", "value": _set_items(value, where)}
    return {"type": "json", "value": _json(value, where)}


def _set_items(value: set[Any], what: str) -> list[Any]:
    """A set's items as a sorted list (sets have no order, and the string hash changes with every
    process: sorted, equal sets export as equal text, which `ChannelEncoder` and a repeated import
    compare). LangGraph's barrier channel (`NamedBarrierValue`, a join edge) holds node names."""
    if not all(item is None or isinstance(item, (str, int, float)) for item in value):
        shown = sorted({type(item).__name__ for item in value if item is not None and not isinstance(item, (str, int, float))})
        raise AgentError(
            f"Cannot export {what}: a set is exported when its items are strings, numbers, booleans or null, "
            f"and it holds {', '.join(shown)}."
        )
    return sorted(_json(list(value), what), key=lambda item: json.dumps(item))


def _json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise AgentError(f"Cannot export {what}: it is not JSON ({exc}).") from None
