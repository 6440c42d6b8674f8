"""Steering (`multitask_strategy="steer"`): messages that join the turn running on their thread.

The protocol is the storage's (`agent.storage.turns`, "Steering"); this module
holds its two ends:

* **The steering request** (`offer`, `settle`): its messages have ids (every
  turn's do: `agent.messages.with_ids`), so that it can later find them in the thread; `offer` is what
  the claim stores for the running turn. Once the request holds the claim
  itself (the running turn has ended), `settle` deletes its offer and looks at
  the head: holding its messages, the request answers that it joined that
  turn (`steer: "joined"`, the joined turn's checkpoint and response id, and
  as output what followed its messages); else it runs them as a new turn.
* **The running turn** (`SteerInbox`, in the turn's `TurnContext`): before a
  model call (the safe point: the call that follows a tool result; the state
  is whole there, every tool call answered), the model step takes the offers
  made to this turn, oldest first, and appends their messages to the state,
  so the model sees them after the tool result and the node's update stores
  them before its reply. Only calls after the first read the database (one
  query per tool round): before the first call an offer can only have come in
  the instant since the claim, and then only an offer from this process (which
  flags the claim: `Claim.steer_offered`) is looked for. An offer the turn
  never took (it made no further model call) is run by its request next.

A steering request that finds turns already waiting for the thread does not offer: it
waits behind them like `enqueue` and runs its messages as a turn of its own. Joining
the running turn would put its messages before those of the waiting turns, which were
sent earlier, and a thread's messages keep the order they were sent in (steer's contract,
"appended to that turn ..., in order"; `tests/operations/test_steer.py`'s interleaving property test holds it).

Why in the model step and not a graph node of its own: a user's graph that calls
`agent.graph.call_model` gets steering with no change to its shape, and the
built-in graph keeps its `agent` / `tools` nodes (history and `next_nodes`
stay as they were). LangGraph's prebuilt agents take the same place for this
kind of work (`create_react_agent(pre_model_hook=...)`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.messages import BaseMessage

from agent.operations.turns.args import TurnArgs
from agent.operations.turns.parts import TurnParts
from agent.storage import Claim, ThreadStorage
from agent.types import TurnResult

logger = logging.getLogger(__name__)


def can_join(args: TurnArgs) -> bool:
    """Whether a turn's messages may join another turn: plain new messages on the head (not an edit, a
    regeneration, an answer to interrupts, a branch from a checkpoint, or a `store: false` turn). A `steer`
    turn that cannot join waits like `enqueue`."""
    return bool(
        args.messages
        and args.store
        and args.checkpoint_id is None
        and args.edit_message_id is None
        and not args.regenerate
        and args.resume is None
    )


def offer(parts: TurnParts, args: TurnArgs) -> tuple[str, bytes]:
    """`args.messages` as the claim stores them for the running turn (the saver's serializer: sealed like a
    checkpoint when the agent encrypts)."""
    return parts.storage.saver.serde.dumps_typed(list(args.messages))


def settle(parts: TurnParts, claim: Claim, args: TurnArgs) -> tuple[list[BaseMessage], TurnResult] | None:
    """After a steering request got its claim: delete its offer; when the head holds its messages (a turn
    took them), (what followed them, the answer that it joined that turn); else None (run them now).

    Raises:
        StorageUnavailable: the database failed.
    """
    parts.storage.drop_steer(claim)
    head = claim.start
    if head is None:
        return None
    messages = list(head.checkpoint["channel_values"].get("messages") or ())
    positions = {message.id: index for index, message in enumerate(messages)}
    if not all(message.id in positions for message in args.messages):
        return None
    after = messages[max(positions[message.id] for message in args.messages) + 1 :]
    parent = (head.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    return after, TurnResult(claim.thread_id, head.checkpoint["id"], parent, steer="joined")


class SteerInbox:
    """The offers made to one running turn (module docstring), taken once each, oldest first."""

    def __init__(
        self, storage: ThreadStorage, claim: Claim, in_io: Callable[..., Awaitable[Any]] | None = None
    ) -> None:
        self._storage = storage
        self._claim = claim
        self._in_io = in_io
        self._taken: set[str] = set()
        self._calls = 0

    def take(self) -> list[BaseMessage]:
        """The messages offered since the last call, to send before this model call (a blocking read)."""
        if not self._looks():
            return []
        return self._decode(self._read())

    async def atake(self) -> list[BaseMessage]:
        """`take` for an async model step: the read runs on the turn's storage thread pool."""
        if not self._looks():
            return []
        rows = await self._in_io(self._read) if self._in_io is not None else self._read()
        return self._decode(rows)

    def _looks(self) -> bool:
        self._calls += 1
        return self._calls > 1 or self._claim.steer_offered

    def _read(self) -> list[tuple[str, str, bytes]]:
        try:
            return self._storage.steered_messages(self._claim.thread_id, self._claim.token)
        except Exception:  # noqa: BLE001 - an offer not taken is run by its own request after this turn
            logger.warning("Could not read the messages offered to the turn on thread %r", self._claim.thread_id,
                           exc_info=True)  # fmt: skip
            return []

    def _decode(self, rows: list[tuple[str, str, bytes]]) -> list[BaseMessage]:
        messages: list[BaseMessage] = []
        for token, kind, payload in rows:
            if token in self._taken:
                continue
            self._taken.add(token)
            messages.extend(self._storage.saver.serde.loads_typed((kind, payload)))
        return messages
