"""Export: a thread's record and whole checkpoint tree as one document (see `agent.operations.transfer`).

Every checkpoint is read with its messages resolved (the storage keeps them as
deltas), and every channel value is written in a form the document can hold:
messages as LangChain dicts, a graph's pending interrupts as `{"id", "value"}`
pairs, anything else as plain JSON, or the export fails naming the channel.
LangChain and LangGraph are imported where a value is encoded, so importing
`agent.operations` stays light.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from agent.errors import AgentError
from agent.operations.access import authorize
from agent.operations.transfer.document import FORMAT, MESSAGES, VERSION
from agent.storage import ThreadRecord, ThreadStorage


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
