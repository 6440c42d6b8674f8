"""Operations on threads: run a turn from the head or from a checkpoint (a branch), list
checkpoints, update state, delete. The ownership rule and the choice of a turn's starting
checkpoint live here, once.

Every operation that reads a thread first authorizes the caller with
`authorize()`: a thread owned by another user, or by nobody while the caller
has a user_id (and the other way round), is answered exactly like a thread that
does not exist, so nothing leaks about whether it exists.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessageChunk, BaseMessage
from langgraph.graph.state import CompiledStateGraph

from agent.config import AgentSettings
from agent.errors import CheckpointNotFound, ThreadBusy, ThreadNotFound
from agent.storage import Store, ThreadRecord, Turn


@dataclass(frozen=True)
class TurnIds:
    """Where a turn or state update left the thread."""

    thread_id: str
    checkpoint_id: str | None
    """The thread head after the turn."""
    parent_checkpoint_id: str | None
    """The checkpoint the turn started from: the requested one when branching, else the previous head; None on a new thread."""

    def as_dict(self) -> dict[str, str | None]:
        return {
            "thread_id": self.thread_id,
            "checkpoint_id": self.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint_id,
        }


@dataclass(frozen=True)
class TextDelta:
    """A piece of the assistant's text as the model produced it."""

    item_id: str
    text: str


@dataclass(frozen=True)
class NewMessages:
    """Messages a graph node added (assistant replies, tool results), in order."""

    messages: list[BaseMessage]


def authorize(record: ThreadRecord | None, thread_id: str, user_id: str | None) -> ThreadRecord:
    """The record, if `user_id` may use the thread.

    Raises:
        ThreadNotFound: the thread does not exist, or its owner is not `user_id`
            (threads written without a user_id are open to anonymous callers only).
    """
    if record is None or record.user_id != user_id:
        raise ThreadNotFound(f"Thread {thread_id!r} was not found.", thread_id=thread_id)
    return record


class Threads:
    """The thread operations of one agent, over its store and compiled graph."""

    def __init__(self, store: Store, graph: CompiledStateGraph, settings: AgentSettings) -> None:
        self.store = store
        self.graph = graph
        self.settings = settings

    def run_turn(
        self,
        messages: Sequence[BaseMessage],
        *,
        thread_id: str | None,
        user_id: str | None,
        checkpoint_id: str | None,
        strategy: str | None,
        stream_tokens: bool,
    ) -> Iterator[TextDelta | NewMessages | TurnIds]:
        """Run one turn; yields text deltas (if `stream_tokens`), new messages, and finally `TurnIds`.

        The turn starts from `checkpoint_id` (a branch) or, without it, from the
        thread head; a missing `thread_id` starts a new thread with a new id.
        Nothing is written unless the turn finishes: `TurnIds` comes after the commit.

        Raises:
            ThreadNotFound: the thread belongs to someone else, or has no
                checkpoints while `checkpoint_id` is given.
            CheckpointNotFound: `checkpoint_id` is not a checkpoint of this thread.
            ThreadBusy: another turn holds the thread (see `multitask_strategy`).
            ModelError, StorageUnavailable: the model or the database failed.
        """
        thread_id = thread_id or str(uuid.uuid4())
        with self._turn(thread_id, user_id, strategy, checkpoint_id) as turn:
            start = self._starting_checkpoint(turn, user_id, checkpoint_id)
            config = _config(thread_id, start)
            modes = ["messages", "updates"] if stream_tokens else ["updates"]
            for mode, chunk in self.graph.stream({"messages": list(messages)}, config, stream_mode=modes, durability="exit"):
                if mode == "messages":
                    token, meta = chunk
                    if isinstance(token, AIMessageChunk) and token.text and meta.get("langgraph_node") == "agent":
                        yield TextDelta(item_id=token.id, text=token.text)
                else:
                    for update in chunk.values():
                        if update and update.get("messages"):
                            yield NewMessages(list(update["messages"]))
        yield TurnIds(thread_id, turn.new_head or start, start)

    def update_state(
        self,
        thread_id: str,
        checkpoint_id: str | None,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None,
        strategy: str | None = None,
    ) -> TurnIds:
        """Write a new checkpoint whose parent is `checkpoint_id` (default: the head), with `messages` applied.

        It becomes the thread head. Messages are applied with `add_messages`
        (appended; a message with an existing id replaces that message).

        Raises:
            ThreadNotFound, CheckpointNotFound, ThreadBusy, StorageUnavailable: as for `run_turn`.
        """
        with self._turn(thread_id, user_id, strategy, checkpoint_id) as turn:
            record = authorize(turn.record, thread_id, user_id)
            start = checkpoint_id or record.head_checkpoint_id
            if turn.loaded.get(start) is None:
                raise _checkpoint_not_found(thread_id, start)
            # As the agent node: the new checkpoint's next step then follows the
            # usual edge (tools if the last message asks for one, else the end).
            self.graph.update_state(_config(thread_id, start), {"messages": list(messages)}, as_node="agent")
        return TurnIds(thread_id, turn.new_head, start)

    def history(self, thread_id: str, *, user_id: str | None, limit: int, before: str | None) -> list[dict[str, Any]]:
        """Up to `limit` checkpoints of the thread, newest first, all branches interleaved.

        Each entry: `checkpoint_id`, `parent_checkpoint_id`, `thread_id`,
        `timestamp` (ISO 8601, UTC), `next_nodes` (list of node names),
        `message_count`, `last_message` (at most 100 characters), `source`
        (`loop` for a turn, `update` for a state update) and `step`. `before`
        (a checkpoint_id) pages backwards. Reads summaries only, never messages,
        so it costs the same on a thread of any length.

        Raises:
            ThreadNotFound: unknown thread, or not the caller's.
            CheckpointNotFound: `before` is not a checkpoint of this thread.
        """
        authorize(self.store.get_thread(thread_id), thread_id, user_id)
        if before is not None and not self.store.checkpoint_in_thread(thread_id, before):
            raise _checkpoint_not_found(thread_id, before)
        rows = self.store.list_checkpoints(thread_id, limit=limit, before=before)
        return [_history_entry(thread_id, row) for row in rows]

    def delete_thread(self, thread_id: str, *, user_id: str | None) -> None:
        """Delete every checkpoint, write and the ownership record of a thread.

        Raises:
            ThreadNotFound: unknown thread, or not the caller's.
        """
        with self._busy_is_not_found(thread_id, user_id):
            self.store.delete_thread(thread_id, check=lambda record: authorize(record, thread_id, user_id))

    def delete_user_data(self, user_id: str) -> list[str]:
        """Delete every thread `user_id` owns; returns their ids (sorted).

        Each thread is deleted in its own transaction, after checking under its
        lock that `user_id` still owns it.
        """
        deleted = []
        for thread_id in self.store.threads_of_user(user_id):
            try:
                self.store.delete_thread(thread_id, check=lambda record, t=thread_id: authorize(record, t, user_id))
            except ThreadNotFound:
                continue  # deleted meanwhile
            deleted.append(thread_id)
        return deleted

    # -- helpers -----------------------------------------------------------------
    @contextmanager
    def _turn(
        self, thread_id: str, user_id: str | None, strategy: str | None, checkpoint_id: str | None = None
    ) -> Iterator[Turn]:
        with self._busy_is_not_found(thread_id, user_id), self.store.turn(
            thread_id,
            user_id=user_id,
            strategy=strategy or self.settings.multitask_strategy,
            timeout=self.settings.enqueue_timeout,
            checkpoint_id=checkpoint_id,
        ) as turn:
            yield turn

    @contextmanager
    def _busy_is_not_found(self, thread_id: str, user_id: str | None) -> Iterator[None]:
        """Turn ThreadBusy into ThreadNotFound for a caller who may not use the thread.

        "Busy" would tell them the thread exists (issue 5).
        """
        try:
            yield
        except ThreadBusy:
            record = self.store.get_thread(thread_id)
            if record is not None:
                authorize(record, thread_id, user_id)
            raise

    def _starting_checkpoint(self, turn: Turn, user_id: str | None, checkpoint_id: str | None) -> str | None:
        """The checkpoint a turn starts from; the one owner of the "head unless branching" rule."""
        record, thread_id = turn.record, turn.thread_id
        if record is None and checkpoint_id is None:
            return None  # a new thread
        # Also for a thread without checkpoints: worded as for someone else's thread (issue 5).
        authorize(record, thread_id, user_id)
        if checkpoint_id is None:
            return record.head_checkpoint_id
        if turn.loaded.get(checkpoint_id) is None:
            raise _checkpoint_not_found(thread_id, checkpoint_id)
        return checkpoint_id


def _checkpoint_not_found(thread_id: str, checkpoint_id: str) -> CheckpointNotFound:
    return CheckpointNotFound(
        f"Checkpoint {checkpoint_id!r} was not found in thread {thread_id!r}.",
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
    )


def _config(thread_id: str, checkpoint_id: str | None) -> dict:
    # checkpoint_ns is explicit: SqliteSaver.put_writes needs it (KeyError otherwise).
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _history_entry(thread_id: str, row: dict) -> dict[str, Any]:
    meta = row["metadata"] or {}
    return {
        "checkpoint_id": row["checkpoint_id"],
        "parent_checkpoint_id": row["parent_checkpoint_id"],
        "thread_id": thread_id,
        "timestamp": meta.get("ts"),
        "next_nodes": list(meta.get("next_nodes") or []),
        "message_count": meta.get("message_count", 0),
        "last_message": meta.get("last_message", ""),
        "source": meta.get("source"),
        "step": meta.get("step"),
    }
