"""The `export_thread` and `import_thread` actions (see `agent.operations.ACTIONS`): their arguments and handlers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest

if TYPE_CHECKING:
    from agent.operations import Threads
    from agent.requests import Envelope


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
