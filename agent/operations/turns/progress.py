"""What a running turn has produced: LangGraph's stream turned into the turn's events (`Progress`).

The graph streams in two modes: "updates" (each node's writes: whole new
messages, and the interrupts the run stopped at) and, when the caller streams
tokens, "messages" (the model's reply chunk by chunk). `Progress` turns both
into `TextDelta`s and `NewMessages` and keeps what it saw, because a turn that
a newer turn interrupts keeps what it produced so far (`commit.keep_interrupted`).

A node's update is what it returned, not what changed: a compiled subgraph
used as a node returns its whole state, every earlier message included, and
`add_messages` merges them by id into the same list. So a message that equals
one the turn started with, sent, or already produced (same id, same fields) is
not new, and is left out of the turn's events; one with a known id and other
fields (a node that rewrites a message) is reported, as LangGraph stores it.
`until` ends the stream the moment a newer turn asks this one to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage

from agent.operations.turns.start import messages_of
from agent.storage import Turn
from agent.storage.deltas import MessageList
from agent.types import NewMessages, TextDelta

#: The key under which LangGraph's "updates" stream reports a run's pending interrupts.
INTERRUPT = "__interrupt__"


@dataclass
class Progress:
    """What a running turn has produced so far (kept if it is interrupted)."""

    produced: list[BaseMessage] = field(default_factory=list)
    partial: dict[str, str] = field(default_factory=dict)  # streamed text of messages not finished yet, by id
    interrupts: list[Any] = field(default_factory=list)  # LangGraph `Interrupt`s the run stopped at
    unconverted: bool = False  # a node returned messages as dicts or tuples (add_messages converts them)
    start: Sequence[BaseMessage] = ()
    """The start checkpoint's messages (a `MessageList` that knows its ids is read only for an id it holds)."""
    sent: Sequence[BaseMessage] = ()
    """The messages the turn sends, with their ids."""
    _known: dict[str, BaseMessage] | None = field(default=None, repr=False)  # sent and produced, by id
    _start_by_id: dict[str, BaseMessage] | None = field(default=None, repr=False)
    _reported: set[str] = field(default_factory=set, repr=False)  # ids of the messages given as `NewMessages`

    def events(self, mode: str, chunk: Any, stream_tokens: bool) -> Iterator[TextDelta | NewMessages]:
        """The turn's events for one item of the graph's stream (`mode`, `chunk`), as `modes` asked for."""
        if mode == "messages":
            token, meta = chunk
            # From any node of the graph (a user's graph names its own); LangGraph leaves out calls tagged "nostream".
            if isinstance(token, AIMessageChunk) and token.text:
                self.partial[token.id] = self.partial.get(token.id, "") + token.text
                if stream_tokens:
                    yield TextDelta(item_id=token.id, text=token.text)
            return
        for node, update in chunk.items():
            if node == INTERRUPT:
                self.interrupts.extend(update)
                continue
            if not isinstance(update, Mapping) or not update.get("messages"):
                continue
            messages = update["messages"]
            # A node may return one message rather than a list, and dicts (add_messages takes all of them).
            given = messages if isinstance(messages, list) else [messages]
            messages = [m for m in given if isinstance(m, BaseMessage)]
            self.unconverted = self.unconverted or len(messages) < len(given)
            messages = self._new(messages)
            if messages:
                for message in messages:
                    self.partial.pop(message.id, None)
                self.produced.extend(messages)
                if not self.unconverted:  # after a node's dicts, the rest waits for `stored_events`, in stored order
                    self._reported.update(m.id for m in messages)
                    yield NewMessages(messages)

    def _new(self, messages: list[BaseMessage]) -> list[BaseMessage]:
        """`messages` less those equal to a message known by its id (see the module docstring); remembers the rest.

        In O(len(messages)) unless an update names an id of the start checkpoint (a subgraph's whole state):
        the start's messages are then read once, by id."""
        if self._known is None:
            self._known = {m.id: m for m in (*self.sent, *self.produced) if m.id is not None}
        unknown = frozenset(m.id for m in messages if m.id is not None and m.id not in self._known)
        if unknown and self._start_by_id is None:
            ids = self.start.ids if isinstance(self.start, MessageList) else None
            if ids is None or not ids.isdisjoint(unknown):
                self._start_by_id = {m.id: m for m in self.start if m.id is not None}
        new = []
        for message in messages:
            twin = None if message.id is None else self._known.get(message.id)
            if twin is None and message.id is not None and self._start_by_id is not None:
                twin = self._start_by_id.get(message.id)
            if twin is None or twin != message:
                new.append(message)
                if message.id is not None:
                    self._known[message.id] = message
        return new

    def stored_events(self, turn: Turn, start: str) -> Iterator[NewMessages]:
        """After the run: once a node returned messages as dicts or tuples (which `add_messages` converts and
        gives ids only as it stores them), the new messages not reported yet, as stored (so the client gets
        their ids) and in the stored order (a node's dicts stay before what later nodes returned); then those
        produced that the last checkpoint does not hold (a run a newer turn stopped before its checkpoint)."""
        if not self.unconverted:
            return
        known = {m.id for m in messages_of(turn, start)} | self._reported
        head = turn.puts[-1][1]["channel_values"].get("messages") or [] if turn.puts else []
        missing = [m for m in head if isinstance(m, BaseMessage) and m.id not in known]
        held = {m.id for m in missing}
        missing += [m for m in self.produced if m.id not in known and m.id not in held]
        if missing:
            produced = {m.id for m in self.produced}
            self.produced.extend(m for m in missing if m.id not in produced)
            self._reported.update(m.id for m in missing)
            yield NewMessages(missing)

    def kept(self) -> list[BaseMessage]:
        """The finished messages, and the unfinished reply's text so far as a message marked interrupted."""
        kept = list(self.produced)
        for item_id, text in self.partial.items():
            kept.append(AIMessage(content=text, id=item_id, response_metadata={"interrupted": True}))
        return kept


def modes(stream_tokens: bool) -> list[str]:
    """The graph's stream modes for a turn that does (or does not) stream tokens."""
    # "messages" makes LangGraph stream the model's reply token by token; without it
    # the model is called once for the whole reply (a JSON request, not SSE).
    return ["messages", "updates"] if stream_tokens else ["updates"]


async def until(stream: AsyncIterator[Any], stop: asyncio.Event) -> AsyncIterator[Any]:
    """The items of `stream` until it ends or `stop` is set (then the pending step is cancelled)."""
    iterator = stream.__aiter__()
    stopped = asyncio.ensure_future(stop.wait())
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(iterator.__anext__())
            await asyncio.wait({step, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                try:
                    await step
                except (asyncio.CancelledError, StopAsyncIteration):
                    pass
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        stopped.cancel()
        if step is not None and not step.done():
            # The caller was cancelled (a client that left) while a step ran: stop the step too, or it
            # would finish the graph on its own after the turn released its thread, writing unclaimed.
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await step
