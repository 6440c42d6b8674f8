"""What every backend provides: a LangGraph saver that commits a turn atomically, and the thread records.

The pieces, and why:

* A **turn** is one run of the graph, or one state update, on one thread. The
  saver does not write while a turn runs: `put`/`put_writes` go to the turn's
  buffer, and `Store.turn()` writes them, the thread's head and (on the first
  write) its owner, in one transaction when the turn ends well. A turn that
  fails half-way (database gone, chat model raising) therefore writes nothing,
  and a retry cannot duplicate the user message (issue 5). LangGraph itself
  would write the failed step and make it the latest checkpoint even with
  `durability="exit"`.
* The **thread head** is a column of the thread record, moved only by a
  committed turn. LangGraph's "latest checkpoint id" is not used as the head.
* The **owner** (`user_id`) is written with the thread's first checkpoint, in
  the same transaction, under the thread's lock, so two racing first writes
  cannot both win.
* **Messages** are stored as deltas (see `deltas.py`), and each checkpoint's
  metadata gets a summary (`message_count`, `last_message`, `next_nodes`,
  `ts`) when it is written, so listing history never deserializes messages.

Backends subclass `Store` and mix `TurnSaverMixin` into LangGraph's own saver
for their database (`PostgresSaver`, `SqliteSaver`), overriding only the
`_backend_*` hooks.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.base import CheckpointTuple

from agent.storage import deltas

#: Longest `last_message` kept in a checkpoint's summary, in characters.
LAST_MESSAGE_CHARS = 100


@dataclass(frozen=True)
class ThreadRecord:
    """A thread as the agent knows it: its owner (None for anonymous) and its head checkpoint."""

    thread_id: str
    user_id: str | None
    head_checkpoint_id: str


@dataclass
class Turn:
    """The writes of one turn, held until `Store.turn()` commits them."""

    thread_id: str
    user_id: str | None
    #: The thread's record as read under the lock; None for a new thread.
    record: ThreadRecord | None = None
    puts: list[tuple] = field(default_factory=list)
    writes: list[tuple] = field(default_factory=list)
    #: Checkpoints this turn has read, by id (LangGraph reads its start twice).
    loaded: dict[str, Any] = field(default_factory=dict)
    #: Set by the backend while the turn holds the thread's lock.
    lock: Any = None
    #: The OS thread that opened the turn. A database connection in `lock` is
    #: the turn's alone: reads from other OS threads (another request on the
    #: same thread) must not use it, or they run inside the turn's transaction.
    os_thread: int = field(default_factory=threading.get_ident)

    def opened_here(self) -> bool:
        """Whether the calling OS thread opened this turn."""
        return self.os_thread == threading.get_ident()

    @property
    def new_head(self) -> str | None:
        """The checkpoint this turn will leave as the thread head: its last one."""
        return self.puts[-1][1]["id"] if self.puts else None


def message_text(message: BaseMessage | None) -> str:
    """A one-line text for a message: its text, else the tools it calls."""
    if message is None:
        return ""
    text = message.text
    if not text and isinstance(message, AIMessage) and message.tool_calls:
        text = "[tool call: " + ", ".join(call["name"] for call in message.tool_calls) + "]"
    return text


def summarize(messages: Sequence[BaseMessage], checkpoint: Mapping[str, Any], node_triggers: Mapping[str, Sequence[str]]) -> dict:
    """The summary stored in a checkpoint's metadata, read by history listings.

    `next_nodes` applies LangGraph's trigger rule to the checkpoint alone: a
    node runs next when one of its trigger channels holds a value whose version
    is newer than the one the node last saw.
    """
    last = message_text(messages[-1] if messages else None)
    values = checkpoint.get("channel_values", {})
    versions = checkpoint.get("channel_versions", {})
    seen = checkpoint.get("versions_seen", {})
    next_nodes = [
        node
        for node, triggers in node_triggers.items()
        if any(
            channel in values and _newer(versions.get(channel), seen.get(node, {}).get(channel))
            for channel in triggers
        )
    ]
    return {
        "message_count": len(messages),
        # Postgres jsonb refuses NUL, and LangGraph would strip it anyway.
        "last_message": last[:LAST_MESSAGE_CHARS].replace("\x00", ""),
        "next_nodes": next_nodes,
        "ts": checkpoint.get("ts"),
    }


def _newer(version: Any, seen: Any) -> bool:
    if version is None:
        return False
    if seen is None:
        return True
    # Versions are zero-padded strings (or ints), so both compare in order.
    return version > seen


class TurnSaverMixin:
    """Turn buffering, message deltas and summaries, mixed into a LangGraph saver.

    The backend saver provides `_backend_put`, `_backend_put_writes` and
    `_fetch_thread_messages`; everything else here is shared.
    """

    def _init_turns(self, message_cache_size: int) -> None:
        self._turns: dict[str, Turn] = {}
        self._turns_lock = threading.Lock()
        self.message_cache = deltas.MessageCache(message_cache_size)
        #: Node name -> trigger channels; set by the graph once it is compiled.
        self.node_triggers: dict[str, list[str]] = {}

    # -- turns -------------------------------------------------------------
    @contextmanager
    def buffering(self, turn: Turn) -> Iterator[Turn]:
        """Route this thread's writes to `turn` until the block ends."""
        with self._turns_lock:
            if turn.thread_id in self._turns:
                # The thread lock makes this unreachable; guard the invariant anyway.
                raise RuntimeError(f"thread {turn.thread_id!r} already has a turn in this process")
            self._turns[turn.thread_id] = turn
        try:
            yield turn
        finally:
            with self._turns_lock:
                self._turns.pop(turn.thread_id, None)

    def active_turn(self, thread_id: str) -> Turn | None:
        return self._turns.get(thread_id)

    def write_turn(self, turn: Turn) -> None:
        """Write a turn's buffered checkpoints and writes. The caller holds the transaction."""
        for config, checkpoint, metadata, new_versions in turn.puts:
            self._write_checkpoint(config, checkpoint, metadata, new_versions)
        for config, writes, task_id, task_path in turn.writes:
            self._backend_put_writes(config, writes, task_id, task_path)

    # -- BaseCheckpointSaver ------------------------------------------------
    def get_tuple(self, config):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is None or configurable.get("checkpoint_ns", ""):
            return self._backend_get_tuple(config)
        checkpoint_id = configurable.get("checkpoint_id")
        if not checkpoint_id:
            # LangGraph asks for the latest checkpoint to tell a branch from a
            # continuation (`checkpoint_superseded`). Under the thread lock the
            # head is the latest: every committed write makes a new, larger id
            # the head. A new thread has none, whatever else the table holds.
            if turn.record is None:
                return None
            checkpoint_id = turn.record.head_checkpoint_id
        if checkpoint_id not in turn.loaded:
            found = self._backend_get_tuple(
                {**config, "configurable": {**configurable, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
            )
            turn.loaded[checkpoint_id] = found
        return turn.loaded[checkpoint_id]

    def put(self, config, checkpoint, metadata, new_versions):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is None:
            return self._write_checkpoint(config, checkpoint, metadata, new_versions)
        checkpoint = {**checkpoint, "channel_values": dict(checkpoint["channel_values"])}
        turn.puts.append((config, checkpoint, dict(metadata), dict(new_versions)))
        return {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(self, config, writes, task_id, task_path=""):
        turn = self.active_turn(config["configurable"]["thread_id"])
        if turn is None:
            return self._backend_put_writes(config, writes, task_id, task_path)
        turn.writes.append((config, list(writes), task_id, task_path))

    # -- shared write / read paths -----------------------------------------
    def _write_checkpoint(self, config, checkpoint, metadata, new_versions):
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        values = dict(checkpoint["channel_values"])
        messages = values.get("messages")
        if messages is not None and not deltas.is_delta(messages):
            base = self.messages_of(thread_id, checkpoint_ns, parent_id) if parent_id else ()
            values["messages"] = deltas.encode(messages, parent_id, base)
            self.message_cache.put(checkpoint["id"], messages)
        summary = summarize(messages or [], checkpoint, self.node_triggers)
        # The turn bookkeeping keys are not the user's metadata.
        clean = {k: v for k, v in metadata.items() if not k.startswith("tt_")}
        config = {**config, "configurable": {k: v for k, v in configurable.items() if not k.startswith("tt_")}}
        return self._backend_put(config, {**checkpoint, "channel_values": values}, {**clean, **summary}, new_versions)

    def messages_of(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> tuple:
        """The full message list of a stored checkpoint (cached; a miss reads the thread's deltas once)."""
        cached = self.message_cache.get(checkpoint_id)
        if cached is not None:
            return cached
        stored = self._fetch_thread_messages(thread_id, checkpoint_ns)
        return deltas._resolve_chain(checkpoint_id, stored, self.message_cache)

    def _resolve_tuple(self, tup: CheckpointTuple | None) -> CheckpointTuple | None:
        if tup is None:
            return None
        values = tup.checkpoint.get("channel_values") or {}
        stored = values.get("messages")
        if not deltas.is_delta(stored):
            return tup
        configurable = tup.config["configurable"]
        checkpoint_id = configurable["checkpoint_id"]
        cached = self.message_cache.get(checkpoint_id)
        if cached is None:
            resolved = deltas.resolve(
                stored,
                self.message_cache,
                lambda: self._fetch_thread_messages(configurable["thread_id"], configurable["checkpoint_ns"]),
            )
            self.message_cache.put(checkpoint_id, resolved)
        else:
            resolved = list(cached)
        checkpoint = {**tup.checkpoint, "channel_values": {**values, "messages": resolved}}
        return tup._replace(checkpoint=checkpoint)

    # -- backend hooks -------------------------------------------------------
    def _backend_get_tuple(self, config):  # pragma: no cover - abstract
        raise NotImplementedError

    def _backend_put(self, config, checkpoint, metadata, new_versions):  # pragma: no cover - abstract
        raise NotImplementedError

    def _backend_put_writes(self, config, writes, task_id, task_path):  # pragma: no cover - abstract
        raise NotImplementedError

    def _fetch_thread_messages(self, thread_id: str, checkpoint_ns: str) -> Mapping[str, Any]:  # pragma: no cover
        """Every stored `messages` value of a thread, keyed by checkpoint id."""
        raise NotImplementedError


class Store(ABC):
    """One database: the LangGraph saver the graph is compiled with, plus thread records.

    Implementations: `PostgresStore` (`postgresql://`), `SqliteStore`
    (`sqlite:///path`, and `memory://` as an in-process SQLite database).
    Every method that reads or writes raises `StorageUnavailable` when the
    database cannot be reached.
    """

    saver: TurnSaverMixin

    @abstractmethod
    def setup(self) -> None:
        """Create or migrate the tables. Idempotent, and safe to run from several processes at once."""

    @abstractmethod
    def turn(self, thread_id: str, *, user_id: str | None, strategy: str, timeout: float, checkpoint_id: str | None = None):
        """A context manager that holds the thread's lock for one turn and yields a `Turn`.

        Under the lock it reads the thread record (`Turn.record`) and the turn's
        start, `checkpoint_id` or else the head, into `Turn.loaded` (absent when
        that checkpoint is not in the thread), so the turn needs no other read.

        On a normal exit it commits the turn's checkpoints, writes, the new head
        and (for a new thread) the owner, atomically; on an exception it writes
        nothing. Raises `ThreadBusy` when the lock is not had (at once under
        `reject`, after `timeout` seconds under `enqueue`).
        """

    @abstractmethod
    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        """The thread's record, or None when the agent never committed a turn on it."""

    @abstractmethod
    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        """Whether `checkpoint_id` is a checkpoint of `thread_id` (root namespace)."""

    @abstractmethod
    def list_checkpoints(self, thread_id: str, *, limit: int, before: str | None) -> list[dict]:
        """Up to `limit` checkpoints of the thread, newest first, older than `before` if given.

        Each row: `checkpoint_id`, `parent_checkpoint_id`, `metadata` (dict, with
        the summary written by `summarize`). Reads no message.
        """

    @abstractmethod
    def threads_of_user(self, user_id: str) -> list[str]:
        """The ids of the threads `user_id` owns."""

    @abstractmethod
    def delete_thread(self, thread_id: str, *, check: Callable[[ThreadRecord | None], object]) -> None:
        """Delete every checkpoint, write, blob and the record of a thread, in one transaction.

        `check` is called with the thread's record under the thread's lock,
        before anything is deleted; it raises to refuse (ownership is decided
        on the same record the deletion acts on).
        """

    @abstractmethod
    def close(self) -> None:
        """Release connections. The store is unusable afterwards."""
