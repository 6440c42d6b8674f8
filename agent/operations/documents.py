"""The export and import operations: a thread as a versioned JSON document and back (`agent.operations.transfer`).

With encryption at rest on (`agent.encryption`), an export is sealed whole with the agent's newest key unless
the caller asks for plaintext, and an import opens a sealed document first (`transfer.sealed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.operations import catalogue, checks, transfer
from agent.operations.operation import Operation, param
from agent.operations.transfer.sealed import is_sealed_document, open_document, seal_document

if TYPE_CHECKING:
    from agent.operations.context import OperationContext


@dataclass(frozen=True, kw_only=True)
class ExportArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    user_id: str | None = param(None, source="user")
    plaintext: bool = param(False, check=checks.flag)


def export_thread(context: OperationContext, args: ExportArgs) -> dict[str, Any]:
    """The whole thread as a versioned, JSON-serializable document (`agent.operations.transfer`).

    Out: `{"format": "timetravel-agent.thread", "version": 2, "exported_at", "thread": {thread_id,
    title, metadata, checkpoint_id (the head), forked_from, ttl_seconds, message_count, created_at,
    updated_at}, "checkpoints": [...]}`: every checkpoint, the root included, oldest first, with
    `checkpoint_id`, `parent_checkpoint_id`, `ts`, `metadata` and what it changes in its parent's
    channel values (`message_changes`: the messages it removes, replaces or adds, as LangChain
    message dicts; `unchanged`; or a whole value), so the document grows linearly with the thread.
    The owner is not in it.

    With encryption at rest on (`encryption_key`) and `plaintext` False (the default), the document is sealed
    whole: `{"format": "timetravel-agent.sealed-thread", "version": 1, "thread_id", "sealed"}`, which only
    an agent holding that key imports (`transfer.sealed`). `plaintext=True` gives the document itself.
    Without a key, the document itself.

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound` (unknown, or not the caller's), `EncryptionKeyError`
    (the thread is encrypted with a key the agent lacks).
    """
    document = transfer.export_thread(context.storage, args.thread_id, user_id=args.user_id)
    keyring = context.storage.keyring
    return seal_document(document, keyring) if keyring.enabled and not args.plaintext else document


@dataclass(frozen=True, kw_only=True)
class ImportArgs:
    document: dict[str, Any] = param(check=checks.document)
    user_id: str | None = param(None, source="user")
    thread_id: str | None = param(None, source="thread", check=checks.check_id)


def import_thread(context: OperationContext, args: ImportArgs) -> dict[str, Any]:
    """Restore a document from `export_thread` (from any backend; version 2, or 1 from before) as a
    thread owned by `user_id`.

    Under the document's thread id: the same checkpoint ids, parents, timestamps and messages, the
    same head, title, metadata and `forked_from`. Under `thread_id`: a copy with new checkpoint ids
    (in the same order). Returns the thread: `thread_id`, `user_id`, `title`, `created_at`,
    `updated_at`, `checkpoint_id` (the head), `message_count`, `metadata`, `forked_from`,
    `ttl_seconds`. Importing the same document again returns the thread and writes nothing. A sealed
    document (an export of an agent with encryption at rest) is opened with this agent's keys first.

    As an action the document travels in the request, so it is limited by `max_request_bytes`
    (1,000,000 bytes by default); `tt-agent import` has no such limit.

    Raises: `InvalidRequest` (a malformed document, or a sealed one this agent's keys cannot open:
    nothing written), `ThreadExists` (the thread id
    is in use with other content or by another user, or another thread holds its checkpoint ids),
    `ThreadBusy`.
    """
    document = args.document
    if is_sealed_document(document):
        document = checks.document("document", open_document(document, context.storage.keyring))
    record = transfer.import_thread(
        context.storage, document, user_id=args.user_id, thread_id=args.thread_id, graph=context.graph
    )
    return catalogue.thread_dict(record)


EXPORT_THREAD = Operation(
    name="export_thread",
    summary="The whole thread (every checkpoint, its messages and the record) as a versioned JSON document, "
    "in custom_outputs.document; sealed with the agent's key when encryption at rest is on, unless plaintext.",
    args=ExportArgs,
    run=export_thread,
    outputs=lambda document, args: {"thread_id": args.thread_id, "document": document},
)
IMPORT_THREAD = Operation(
    name="import_thread",
    summary="Restore custom_inputs.document as a thread of the caller (under custom_inputs.thread_id if given: "
    "a copy with new checkpoint ids); the same document again is a no-op.",
    args=ImportArgs,
    run=import_thread,
    outputs=lambda thread, args: {"thread": thread},
    writes=True,
)
