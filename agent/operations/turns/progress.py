"""What a running turn has produced: LangGraph's stream turned into the turn's events (`Progress`).

The graph streams in two modes: "updates" (each node's writes: whole new
messages, and the interrupts the run stopped at) and, when the caller streams
tokens, "messages" (the model's reply chunk by chunk). `Progress` turns both
into `TextDelta`s and `NewMessages` and keeps what it saw, because a turn that
a newer turn interrupts keeps what it produced so far (`commit.keep_interrupted`).
`until` ends the stream the moment a newer turn asks this one to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage

from agent.operations.turns.start import messages_of
from agent.storage import Turn
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
            if messages:
                for message in messages:
                    self.partial.pop(message.id, None)
                self.produced.extend(messages)
                yield NewMessages(messages)

    def stored_events(self, turn: Turn, start: str) -> Iterator[NewMessages]:
        """The new messages of the turn's last checkpoint that the stream gave in another form (a node's dict
        messages, which add_messages converted and gave ids): reported as stored, so the client gets their ids."""
        if not self.unconverted or not turn.puts:
            return
        known = {m.id for m in messages_of(turn, start)} | {m.id for m in self.produced}
        head = turn.puts[-1][1]["channel_values"].get("messages") or []
        missing = [m for m in head if isinstance(m, BaseMessage) and m.id not in known]
        if missing:
            self.produced.extend(missing)
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
