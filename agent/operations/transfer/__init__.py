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
  refused (`ThreadExists`) by the commit itself: the storage's primary key on
  the checkpoint id decides, not a read before the write, so of two imports
  racing with the same ids into two new threads one commits and the other
  writes nothing. An import under another `thread_id` is a copy, like
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

Modules: `document` (the schema: constants and pydantic models), `export`
(a thread as a document), `parse` (a document validated whole), `restore`
(a validated document written as a thread); the `export_thread` and `import_thread`
operations are `agent.operations.documents`.
"""

from agent.operations.transfer.document import FORMAT, VERSION, ThreadDocument
from agent.operations.transfer.export import export_thread
from agent.operations.transfer.parse import parse_document
from agent.operations.transfer.restore import import_thread

__all__ = [
    "FORMAT",
    "VERSION",
    "ThreadDocument",
    "export_thread",
    "import_thread",
    "parse_document",
]
