"""Import: a validated document written as a thread in one commit, idempotently (see `agent.operations.transfer`).

The checkpoints are written through the saver into a turn's buffer, parents
first, as `fork_thread` does, so the importing database re-encodes the
messages as its own deltas and derives the summaries again; the buffer, the
thread record and its head are then one commit of the thread's claim. A copy
under another thread id gets new checkpoint ids (`_renewed`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.errors import ThreadExists, ThreadNotFound, shown_id
from agent.operations.copied_writes import copied_writes, writes_by_task
from agent.operations.transfer.document import (
    DERIVED_METADATA,
    MESSAGE_TYPES,
    WRITE_MESSAGE_TYPES,
    ChannelValue,
    CheckpointDoc,
    Restored,
)
from agent.operations.transfer.export import ChannelEncoder, document_of
from agent.operations.transfer.parse import decode_value, load_messages, parse_document
from agent.storage import BranchRecord, ThreadRecord, ThreadStorage, Turn
from agent.storage.summaries import TURN_REPORT_KEY, model_input_summary
from agent.validation import check_id

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph


def import_thread(
    storage: ThreadStorage,
    document: Any,
    *,
    user_id: str | None,
    thread_id: str | None,
    graph: CompiledStateGraph | None = None,
) -> ThreadRecord:
    """Restore a document as a thread owned by `user_id`, under its own thread id or `thread_id`.

    Under the document's id, checkpoint ids, parents, timestamps, metadata and
    messages are kept; under another `thread_id` the checkpoint ids are renewed
    (see `agent.operations.transfer`). Title, metadata, `forked_from` and the head are
    restored. Written in one commit; an import that fails writes nothing. `graph`: the graph the thread runs,
    which names the tasks of a renewed checkpoint's pending writes (`copied_writes`: a question the document
    waits on can be answered by the id the copy lists); None keeps them as the document has them.

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
    renamed_from: dict[str, str] = {}  # a renewed checkpoint id -> the document's
    if target != restored.document.thread.thread_id:
        restored, renamed_from = _renewed(restored, target)
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
        try:
            _write(storage, claim, restored, user_id=user_id, graph=graph, renamed_from=renamed_from)
        except ThreadExists as exc:
            # The commit's: another thread holds one of the checkpoint ids (a primary key decides, even
            # for two imports racing; see `agent.storage.postgres.schema`, "Checkpoint ids").
            raise ThreadExists(
                "Another thread already holds checkpoints of this document; import it under another thread_id "
                "(a copy with new checkpoint ids). Nothing was written.",
                thread_id=target,
                checkpoint_id=exc.ids.get("checkpoint_id"),
            ) from None
    except BaseException:
        storage.release(claim)  # does nothing after a commit
        raise
    record = storage.get_thread(target)
    if record is None:  # pragma: no cover - deleted between the commit and this read
        raise ThreadNotFound(f"Thread {shown_id(target)} was not found.", thread_id=target)
    return record


def _write(
    storage: ThreadStorage,
    claim: Any,
    restored: Restored,
    *,
    user_id: str | None,
    graph: CompiledStateGraph | None,
    renamed_from: Mapping[str, str],
) -> None:
    from langgraph.checkpoint.base import CheckpointTuple  # here: importing this module must not load LangGraph

    saver = storage.saver
    thread = restored.document.thread
    turn = Turn(thread_id=claim.thread_id)
    branch_usage: dict[str, Any] = {}
    with saver.buffering(turn):
        for checkpoint in restored.order:
            configurable: dict[str, Any] = {"thread_id": turn.thread_id, "checkpoint_ns": ""}
            metadata = dict(checkpoint.metadata)
            parent = checkpoint.parent_checkpoint_id
            if parent is None:
                # A root keeps what it is handed (storage.summaries.ROOT_CARRIED_FIELDS): a trimmed thread's totals.
                branch_usage[checkpoint.checkpoint_id] = metadata.get("branch_usage")
            else:
                configurable["checkpoint_id"] = parent
                # The saver derives the model-input summary and branch totals from a turn report, as for a turn.
                configurable[TURN_REPORT_KEY] = report = _turn_report(checkpoint)
                # It adds the turn's usage to the parent's `branch_usage`, which it reads from the metadata a
                # buffered parent was handed: computed here the same way, since documents leave it out.
                derived = model_input_summary(report, parent, {"branch_usage": branch_usage.get(parent)})
                branch_usage[checkpoint.checkpoint_id] = metadata["branch_usage"] = derived["branch_usage"]
            values = dict(restored.values[checkpoint.checkpoint_id])
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
            saver.put({"configurable": configurable}, state, metadata, dict(checkpoint.channel_versions))
            address = {"configurable": {"thread_id": turn.thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint.checkpoint_id}}
            writes = [
                (write.task_id, write.channel, decode_value(write.value, "", WRITE_MESSAGE_TYPES, update=True))
                for write in checkpoint.pending_writes
            ]
            old_id = renamed_from.get(checkpoint.checkpoint_id)
            if old_id is not None and writes:
                original = CheckpointTuple(
                    {"configurable": {**address["configurable"], "checkpoint_id": old_id}}, {**state, "id": old_id}, metadata
                )
                copied = copied_writes(graph, original, state, writes)
            else:
                copied = [(*write, "") for write in writes]
            for (task_id, path), task_writes in writes_by_task(copied).items():
                saver.put_writes(address, task_writes, task_id, path)
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
        if restored.document.branches:
            tx.put_branch_records(claim.thread_id, [BranchRecord(**b.model_dump()) for b in restored.document.branches])

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
        "memories": metadata.get("recalled_memories"),
    }


def _renewed(restored: Restored, thread_id: str) -> tuple[Restored, dict[str, str]]:
    """The document as a copy under `thread_id`: every checkpoint id renewed (see `agent.operations.transfer`);
    and each new id's old one."""
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
    branches = [b.model_copy(update={"checkpoint_id": mapping[b.checkpoint_id]}) for b in document.branches]
    renewed = Restored(
        document.model_copy(update={"thread": thread, "checkpoints": checkpoints, "branches": branches}),
        tuple(renew(c) for c in restored.order),
        {mapping[old]: values for old, values in restored.values.items()},
        {mapping[old]: messages for old, messages in restored.messages.items()},
    )
    return renewed, {new: old for old, new in mapping.items()}


def _same_content(storage: ThreadStorage, record: ThreadRecord, restored: Restored) -> bool:
    """Whether the stored thread is what importing `restored` would write (see `agent.operations.transfer`)."""
    stored = parse_document(document_of(storage, record))
    return _comparable(stored) == _comparable(restored)


def _comparable(restored: Restored) -> tuple:
    """The record and every checkpoint as JSON text, independent of the document's version: values are
    compared as what each checkpoint changes in its parent (`ChannelEncoder`, as version 2 writes them),
    which is linear in the thread; equal changes from the same root are equal lists."""
    thread = restored.document.thread
    record = (thread.thread_id, thread.checkpoint_id, thread.title, thread.metadata, thread.forked_from)
    encoder = ChannelEncoder(restored.values)
    checkpoints = []
    for checkpoint in sorted(restored.order, key=lambda c: c.checkpoint_id):
        dumped = checkpoint.model_dump()
        dumped["metadata"] = {k: v for k, v in dumped["metadata"].items() if k not in DERIVED_METADATA and not k.startswith("tt_")}
        dumped["channel_values"] = encoder.channels(checkpoint.checkpoint_id, checkpoint.parent_checkpoint_id)
        dumped["pending_writes"] = [
            (w.task_id, w.channel, _normalized(w.value, WRITE_MESSAGE_TYPES, update=True))
            for w in checkpoint.pending_writes
        ]
        checkpoints.append(json.dumps(dumped, sort_keys=True, default=str))
    return record, checkpoints


def _normalized(value: ChannelValue, types: frozenset[str] = MESSAGE_TYPES, *, update: bool = False) -> Any:
    if value.type == "messages":
        from langchain_core.messages import messages_to_dict

        return messages_to_dict(load_messages(value.value, "", types, update=update))
    return value.value
