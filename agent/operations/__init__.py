"""What you can do to a thread (the domain), and the table of `custom_inputs.action`s.

Modules: `access` (the ownership rule), `turns` (claim, run, commit; sync and
async), `history` (checkpoint pages, the head), `lifecycle` (deletion),
`usage` (token totals).

`Threads` is the façade the ResponsesAgent adapter calls. `ACTIONS` maps each
`custom_inputs.action` to one `Action`: which `custom_inputs` keys it takes,
whether it takes input items, how its arguments are parsed, and its handler,
so that adding an operation means adding one entry (and its Python method on
the agent), not editing a switch in several places. A turn is the action
`turn` (the default when `action` is absent); it is the only one that streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import BaseMessage
from langgraph.graph.state import CompiledStateGraph

from agent.config import AgentSettings, MultitaskStrategy
from agent.errors import InvalidRequest
from agent.operations import history as history_ops
from agent.operations import lifecycle
from agent.operations import usage as usage_ops
from agent.operations.turns import TurnArgs, TurnEvent, TurnRunner
from agent.storage import ThreadStorage
from agent.types import CheckpointSummary, TokenUsage, TurnResult
from agent.validation import check_id, check_limit

if TYPE_CHECKING:
    from agent.requests import Envelope

__all__ = ["ACTIONS", "Action", "Threads", "TurnArgs", "TurnOptions"]


class Threads:
    """The thread operations of one agent, over its storage and compiled graph."""

    def __init__(self, storage: ThreadStorage, graph: CompiledStateGraph, settings: AgentSettings) -> None:
        self.storage = storage
        self.graph = graph
        self.settings = settings
        self.turns = TurnRunner(storage, graph, settings)

    def run_turn(self, args: TurnArgs, *, stream_tokens: bool) -> Iterator[TurnEvent]:
        """See `TurnRunner.run`."""
        return self.turns.run(args, stream_tokens=stream_tokens)

    def arun_turn(self, args: TurnArgs, *, stream_tokens: bool) -> AsyncIterator[TurnEvent]:
        """See `TurnRunner.arun`."""
        return self.turns.arun(args, stream_tokens=stream_tokens)

    def update_state(
        self,
        thread_id: str,
        checkpoint_id: str | None,
        messages: Sequence[BaseMessage],
        *,
        user_id: str | None,
        strategy: MultitaskStrategy | None = None,
    ) -> TurnResult:
        """See `TurnRunner.update_state`."""
        return self.turns.update_state(thread_id, checkpoint_id, messages, user_id=user_id, strategy=strategy)

    def history(self, thread_id: str, *, user_id: str | None, limit: int, before: str | None) -> list[CheckpointSummary]:
        """See `history.history`."""
        return history_ops.history(self.storage, thread_id, user_id=user_id, limit=limit, before=before)

    def token_usage(self, thread_id: str, *, user_id: str | None, checkpoint_id: str | None = None) -> TokenUsage:
        """See `usage.token_usage`."""
        return usage_ops.token_usage(self.storage, thread_id, user_id=user_id, checkpoint_id=checkpoint_id)

    def delete_thread(self, thread_id: str, *, user_id: str | None) -> None:
        """See `lifecycle.delete_thread`."""
        lifecycle.delete_thread(self.storage, thread_id, user_id=user_id)

    def delete_user_data(self, user_id: str) -> list[str]:
        """See `lifecycle.delete_user_data`."""
        return lifecycle.delete_user_data(self.storage, user_id)

    async def in_io(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the storage thread pool, awaited (for blocking storage work on the async path)."""
        return await self.turns.in_io(function, *args)

    def close(self) -> None:
        self.turns.close()
        self.storage.close()


# -- the actions table --------------------------------------------------------------------------
InputRule = Literal["none", "optional", "required"]


@dataclass(frozen=True)
class Action:
    """One `custom_inputs.action`.

    `parse(envelope, custom_inputs)` returns the handler's arguments (raising
    InvalidRequest); `run(threads, envelope, args)` returns `custom_outputs`.
    """

    name: str
    summary: str
    keys: frozenset[str] = frozenset()
    """`custom_inputs` keys it takes besides the envelope's (`thread_id`, `checkpoint_id`, `user_id`, …)."""
    input: InputRule = "none"
    needs_thread: bool = True
    needs_user: bool = False
    parse: Callable[[Envelope, Mapping[str, Any]], Any] = lambda envelope, custom: None
    run: Callable[[Threads, Envelope, Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class HistoryArgs:
    limit: int
    before: str | None


def _parse_history(envelope: Envelope, custom: Mapping[str, Any]) -> HistoryArgs:
    return HistoryArgs(limit=check_limit(custom.get("limit", 10)), before=check_id("before", custom.get("before")))


def _run_history(threads: Threads, envelope: Envelope, args: HistoryArgs) -> dict[str, Any]:
    entries = threads.history(envelope.thread_id, user_id=envelope.user_id, limit=args.limit, before=args.before)
    return {"thread_id": envelope.thread_id, "history": [entry.as_dict() for entry in entries]}


def _run_update(threads: Threads, envelope: Envelope, args: None) -> dict[str, Any]:
    result = threads.update_state(
        envelope.thread_id,
        envelope.checkpoint_id,
        envelope.messages,
        user_id=envelope.user_id,
        strategy=envelope.multitask_strategy,
    )
    return result.as_dict()


def _run_get_usage(threads: Threads, envelope: Envelope, args: None) -> dict[str, Any]:
    usage = threads.token_usage(envelope.thread_id, user_id=envelope.user_id, checkpoint_id=envelope.checkpoint_id)
    return usage.as_dict()


def _run_delete_thread(threads: Threads, envelope: Envelope, args: None) -> dict[str, Any]:
    threads.delete_thread(envelope.thread_id, user_id=envelope.user_id)
    return {"thread_id": envelope.thread_id, "deleted": True}


def _run_delete_user_data(threads: Threads, envelope: Envelope, args: None) -> dict[str, Any]:
    return {"user_id": envelope.user_id, "deleted_thread_ids": threads.delete_user_data(envelope.user_id)}


@dataclass(frozen=True)
class TurnOptions:
    """A turn's own `custom_inputs`, beyond the envelope."""

    edit_message_id: str | None = None
    """Branch from the checkpoint before this message and send the input in its place."""
    regenerate: bool = False
    """Rerun the model on the last user message (input empty)."""
    metadata: Mapping[str, str] | None = None
    """Stored with the thread when this turn creates it."""
    max_context_tokens: int | None = None
    """This turn's token budget for the model's input (bounded by the agent's setting)."""


def _parse_turn(envelope: Envelope, custom: Mapping[str, Any]) -> TurnOptions:
    regenerate = custom.get("regenerate", False)
    if not isinstance(regenerate, bool):
        raise InvalidRequest(f"regenerate must be true or false, got {regenerate!r}")
    metadata = custom.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise InvalidRequest("metadata must be an object of string keys and string values")
    budget = custom.get("max_context_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise InvalidRequest(f"max_context_tokens must be a positive integer, got {budget!r}")
    return TurnOptions(
        edit_message_id=check_id("edit_message_id", custom.get("edit_message_id")),
        regenerate=regenerate,
        metadata=metadata,
        max_context_tokens=budget,
    )


TURN = Action(
    name="turn",
    summary="Run the model on the input from the head (or from checkpoint_id: a branch); the default.",
    keys=frozenset({"edit_message_id", "regenerate", "metadata", "max_context_tokens"}),
    input="required",
    needs_thread=False,
    parse=_parse_turn,
)

ACTIONS: dict[str, Action] = {
    action.name: action
    for action in (
        TURN,
        Action(
            name="get_checkpoint_history",
            summary="The thread's checkpoints, newest first (`history`).",
            keys=frozenset({"limit", "before"}),
            parse=_parse_history,
            run=_run_history,
        ),
        Action(
            name="update_checkpoint_state",
            summary="A new checkpoint on checkpoint_id (default: the head) with the input messages applied.",
            input="optional",
            run=_run_update,
        ),
        Action(
            name="get_usage",
            summary="Tokens the model used: the thread's total and the branch's up to checkpoint_id (default: the head).",
            run=_run_get_usage,
        ),
        Action(name="delete_thread", summary="Delete the thread and all its checkpoints.", run=_run_delete_thread),
        Action(
            name="delete_user_data",
            summary="Delete every thread of the user.",
            needs_thread=False,
            needs_user=True,
            run=_run_delete_user_data,
        ),
    )
}
