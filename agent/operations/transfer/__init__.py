"""Export and import: a thread's whole checkpoint tree as one versioned JSON document.

The document (`FORMAT`, `VERSION` 2)::

    {"format": "timetravel-agent.thread", "version": 2, "exported_at": "<ISO 8601 UTC>",
     "thread": {"thread_id", "title", "metadata", "checkpoint_id" (the head), "forked_from",
                "ttl_seconds", "message_count", "created_at", "updated_at"},
     "checkpoints": [{"checkpoint_id", "parent_checkpoint_id", "ts", "metadata", "v",
                      "channel_versions", "versions_seen", "updated_channels" (if not null),
                      "channel_values": {channel: {"type": ..., "value": ...}},
                      "pending_writes" (if any): [{"task_id", "channel", "value": {"type", "value"}}]},
                     ...]}   # oldest first (by checkpoint id), the root included

A channel value is one of:

* `{"type": "unchanged"}`: the parent checkpoint's value of the channel, as it is;
* `{"type": "message_changes", "value": {"remove": [message ids], "add": [messages]}}`: the
  parent's message list changed as LangGraph's `add_messages` changes it (`transfer.changes`):
  the parent's messages in order, without those in `remove` (omitted when empty), each replaced
  by the message of `add` with its id; then the other messages of `add`;
* `{"type": "messages", "value": [messages]}`: a whole list (the first one of a branch, or a
  list the rule above cannot express);
* `{"type": "interrupts", "value": [{"id", "value"}]}`, `{"type": "set", "value": [items]}` or
  `{"type": "json", "value": ...}`: a whole value. A `set` is a Python set of JSON scalars
  (strings, numbers, booleans, null), listed sorted (by their JSON text) with no item twice, and
  read back as a `set`: the barrier channel of a join edge (`add_edge(["a", "b"], "c")`,
  LangGraph's `NamedBarrierValue`) stores the names of the nodes it has seen as one, and adds to
  it on the next step, so a list in its place would break the thread's next turn.

Version 1 (still read, no longer written) has the same fields, with every value whole (no
`unchanged` or `message_changes`), `updated_channels` and `pending_writes` always present, and
the derived summary fields in each checkpoint's metadata.

`set` was added to version 2 without a new version number: a document without a set is what it
was, byte for byte, and every reader of version 2 still reads it; only a thread holding a set (a
graph with a join edge) has one, and such a thread could not be exported before. A reader from
before the addition refuses such a document whole, with nothing written, naming the value
(`checkpoints.N.channel_values.<channel>.type: Input should be 'messages', ... or 'json'`):
the models are closed, so it never reads a set as something else. Bumping the version would have
made every new export unreadable to those readers for the sake of threads they cannot hold
anyway. Readers accept `set` in version 1 documents too (it is a whole value; no version 1
writer wrote one).

Why this shape:

* **Whole checkpoints, not just messages.** Restoring exactly means every
  channel the graph reads: `messages`, and the branch's `context_summary`
  (`agent.state`), with the channel versions LangGraph uses to decide what
  runs next. Messages are LangChain's own dict form (`messages_to_dict`), which
  keeps ids, tool calls, `response_metadata` and usage; a graph's pending
  `interrupt()`s (in pending writes) are `{"id", "value"}` pairs; a set of
  JSON scalars (a join edge's barrier) is a `set`; every other value must be
  plain JSON (the agent's state is; a user graph whose state holds other values,
  such as a frozenset, a set of tuples, or the `(set, bool)` pair of a join into
  a `defer=True` node, cannot be exported, and `export_thread` says which channel). Nothing is pickled or loaded by class
  path: `messages_from_dict` only builds the four message classes a thread
  stores, so a document from a stranger cannot instantiate anything else.
* **Linear in the thread.** Version 1 held each checkpoint's whole message list,
  so a thread of N turns was O(N²) bytes (61 turns of 2 kB messages: 6.3 MB,
  more than the `import_thread` action accepts). Version 2 holds what each
  checkpoint adds, so each message is in the document once per change, plus
  about 920 bytes per checkpoint of ids, metadata and LangGraph's channel
  versions (`bench.export`: a 200-turn thread with 20 branches and 500-byte user
  messages is 1.48 times the JSON of its distinct messages). It is its own encoding, not the storage's
  (`agent.storage.deltas` keeps prefixes and backend rows): the importer
  resolves every checkpoint's whole values and re-encodes them in its own
  database by writing through the saver, as `fork_thread` does. Metadata the
  saver derives again (`DERIVED_METADATA`: the history's summary fields) is
  left out.
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
  parent present, no cycle, the head among the checkpoints, messages that load,
  every change applying to its parent) before anything is read from or written
  to the database; the write is one
  commit of the thread's claim (`storage.commit`), like a turn's.
* **Idempotent.** Importing into a thread that exists, with the same owner and
  the same content (records and checkpoints compared as documents, leaving out
  the summary fields the saver derives again), returns it and writes nothing;
  other content, or another owner, is `ThreadExists`.

Modules: `document` (the schema: constants and pydantic models), `changes`
(the message-list rule of version 2), `export` (a thread as a document),
`parse` (a document validated whole, its values resolved), `restore` (a
validated document written as a thread); the `export_thread` and `import_thread`
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
