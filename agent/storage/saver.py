"""`TurnSaverMixin`: what the agent adds to LangGraph's savers (buffered turns, message deltas, summaries).

Mixed into `PostgresSaver` and `SqliteSaver` by the backends, which provide the
`_backend_*` hooks and `_fetch_thread_messages`:

* **Buffered turns.** While a turn runs (`buffering`), `put`/`put_writes` for
  its thread go to the turn's buffer and `get_tuple` answers from what the
  claim read, so the graph runs without touching the database; the storage's
  commit writes the buffer (`write_turn`) in one transaction. LangGraph itself
  would write a failed step and make it the latest checkpoint even with
  `durability="exit"`. The async methods (`aget_tuple`, `aput`, …) do the same
  without I/O, so `graph.astream` runs on the event loop.
* **Messages stored once** (`deltas.py`) and a **summary** in each checkpoint's
  metadata (`summaries.py`), with what the turn sent the model and the tokens it
  used (the run's turn report, `summaries.TURN_REPORT_KEY`).
* **Unsafe inherited operations refused.** `prune` and `delete_thread` of the
  LangGraph savers know neither `agent_threads` nor the delta encoding
  (keep_latest would delete the checkpoints a head's delta points to); the
  agent's own operations do both correctly, so these raise NotImplementedError.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple, copy_checkpoint

from agent.storage import deltas
from agent.storage.base import Turn
from agent.storage.summaries import TURN_REPORT_KEY, model_input_summary, summarize


class TurnSaverMixin:
    """Turn buffering, message deltas and summaries, mixed into a LangGraph saver."""

    def _init_turns(self, message_cache_size: int) -> None:
        self._turns: dict[str, Turn] = {}
        self._turns_lock = threading.Lock()
        self.message_cache = deltas.MessageCache(message_cache_size)
        #: Node name -> trigger channels; set by the graph once it is compiled.
        self.node_triggers: dict[str, list[str]] = {}

    # -- turns -------------------------------------------------------------
    @contextmanager
    def buffering(self, turn: Turn) -> Iterator[Turn]:
        """Route this thread's writes to `turn` (and its reads to what the turn loaded) until the block ends."""
        with self._turns_lock:
            if turn.thread_id in self._turns:
                # The thread's claim makes this unreachable; guard the invariant anyway.
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
        """Write a turn's buffered checkpoints and writes. The caller holds the write transaction."""
        for config, checkpoint, metadata, new_versions in turn.puts:
            self._write_checkpoint(config, checkpoint, metadata, new_versions, turn)
        for config, writes, task_id, task_path in turn.writes:
            self._backend_put_writes(config, writes, task_id, task_path)

    # -- BaseCheckpointSaver ------------------------------------------------
    def get_tuple(self, config):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is None or configurable.get("checkpoint_ns", ""):
            return self._backend_get_tuple(config)
        # Without a checkpoint_id LangGraph asks for the latest checkpoint (to
        # tell a branch from a continuation, `checkpoint_superseded`): while a
        # turn holds the thread that is its last buffered put, else the head.
        checkpoint_id = configurable.get("checkpoint_id") or turn.latest_id
        if checkpoint_id is None:
            return None
        if checkpoint_id not in turn.loaded:
            turn.loaded[checkpoint_id] = self._backend_get_tuple(
                {**config, "configurable": {**configurable, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}
            )
        return turn.loaded[checkpoint_id]

    async def aget_tuple(self, config):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is not None and not configurable.get("checkpoint_ns", ""):
            wanted = configurable.get("checkpoint_id") or turn.latest_id
            if wanted is None or wanted in turn.loaded:
                return self.get_tuple(config)  # answered from memory, no I/O
        return await asyncio.to_thread(self.get_tuple, config)

    def put(self, config, checkpoint, metadata, new_versions):
        configurable = config["configurable"]
        turn = self.active_turn(configurable["thread_id"])
        if turn is None:
            return self._write_checkpoint(config, checkpoint, metadata, new_versions, None)
        # Copies: LangGraph mutates the checkpoint it runs from (its channel versions), and a
        # buffered checkpoint is also what the rest of the turn reads back from `turn.loaded`.
        stored, loaded = copy_checkpoint(checkpoint), copy_checkpoint(checkpoint)
        turn.puts.append((config, stored, dict(metadata), dict(new_versions)))
        address = {
            "thread_id": configurable["thread_id"],
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": checkpoint["id"],
        }
        turn.loaded[checkpoint["id"]] = CheckpointTuple(
            config={"configurable": address},
            checkpoint=loaded,
            metadata=dict(metadata),
            parent_config={"configurable": {**address, "checkpoint_id": configurable["checkpoint_id"]}}
            if configurable.get("checkpoint_id")
            else None,
            pending_writes=[],
        )
        return {"configurable": address}

    async def aput(self, config, checkpoint, metadata, new_versions):
        if self.active_turn(config["configurable"]["thread_id"]) is not None:
            return self.put(config, checkpoint, metadata, new_versions)
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        turn = self.active_turn(config["configurable"]["thread_id"])
        if turn is None:
            return self._backend_put_writes(config, writes, task_id, task_path)
        turn.writes.append((config, list(writes), task_id, task_path))

    async def aput_writes(self, config, writes, task_id, task_path=""):
        if self.active_turn(config["configurable"]["thread_id"]) is not None:
            return self.put_writes(config, writes, task_id, task_path)
        return await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        for item in await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit))):
            yield item

    def prune(self, thread_ids, *, strategy: str = "keep_latest") -> None:
        raise NotImplementedError(
            "LangGraph's prune does not know the agent's message deltas or thread records; "
            "use the agent's retention (thread_ttl_seconds, sweep_expired_threads) instead."
        )

    def delete_thread(self, thread_id: str) -> None:
        raise NotImplementedError(
            "LangGraph's delete_thread does not know the agent's thread records; use agent.delete_thread(...) instead."
        )

    # -- shared write / read paths -----------------------------------------
    def _write_checkpoint(self, config, checkpoint, metadata, new_versions, turn: Turn | None):
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        values = dict(checkpoint["channel_values"])
        messages = values.get("messages")
        kept = 0
        if messages is not None and not deltas.is_delta(messages):
            base = self._parent_messages(thread_id, checkpoint_ns, parent_id, turn) if parent_id else ()
            values["messages"] = deltas.encode(messages, parent_id, base)
            kept = values["messages"]["keep"]
            self.message_cache.put(checkpoint["id"], messages)
        parent_metadata = self._parent_metadata(config, parent_id, turn) if parent_id else None
        summary = {
            **summarize(messages or [], checkpoint, self.node_triggers, kept_messages=kept),
            **model_input_summary(configurable.get(TURN_REPORT_KEY), parent_id, parent_metadata),
        }
        # The turn bookkeeping keys are not the user's metadata.
        clean = {k: v for k, v in metadata.items() if not k.startswith("tt_")}
        config = {**config, "configurable": {k: v for k, v in configurable.items() if not k.startswith("tt_")}}
        return self._backend_put(config, {**checkpoint, "channel_values": values}, {**clean, **summary}, new_versions)

    def _parent_metadata(self, config, parent_id: str, turn: Turn | None) -> Mapping[str, Any] | None:
        # A turn's parent is its start, which the claim read (or a root written in the same commit).
        if turn is not None and turn.loaded.get(parent_id) is not None:
            return turn.loaded[parent_id].metadata
        configurable = {**config["configurable"], "checkpoint_id": parent_id}
        parent = self._backend_get_tuple({**config, "configurable": configurable})
        return parent.metadata if parent is not None else None

    def _parent_messages(self, thread_id: str, checkpoint_ns: str, parent_id: str, turn: Turn | None):
        # A parent written earlier in the same commit (a thread's root) is not stored yet.
        if turn is not None and turn.loaded.get(parent_id) is not None:
            return turn.loaded[parent_id].checkpoint["channel_values"].get("messages") or ()
        return self.messages_of(thread_id, checkpoint_ns, parent_id)

    def messages_of(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> tuple:
        """The full message list of a stored checkpoint (cached; a miss reads the thread's deltas once)."""
        cached = self.message_cache.get(checkpoint_id)
        if cached is not None:
            return cached
        return deltas.resolve_stored(checkpoint_id, self._fetch_thread_messages(thread_id, checkpoint_ns), self.message_cache)

    def _resolve_tuple(self, tup: CheckpointTuple | None) -> CheckpointTuple | None:
        if tup is None:
            return None
        values = tup.checkpoint.get("channel_values") or {}
        stored = values.get("messages")
        if not deltas.is_delta(stored):
            return tup
        configurable = tup.config["configurable"]
        checkpoint_id = configurable["checkpoint_id"]
        resolved = self.message_cache.get_list(checkpoint_id)
        if resolved is None:
            resolved = deltas.MessageList(
                deltas.resolve(
                    stored,
                    self.message_cache,
                    lambda: self._fetch_thread_messages(configurable["thread_id"], configurable["checkpoint_ns"]),
                )
            )
            self.message_cache.put(checkpoint_id, resolved)
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
