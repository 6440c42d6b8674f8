"""What you can do to a thread (the domain), and the table of `custom_inputs.action`s.

Modules: `access` (the ownership rule), `turns` (claim, run, commit; sync and
async), `history` (checkpoint pages, the head), `lifecycle` (deletion),
`retention` (expired threads deleted or trimmed to their head),
`tree` (a thread's checkpoint tree from summaries, and where each message sits
in it), `edits` (where an edit or regeneration starts; removals), `branches`
(checkpoint state, branches, head switch, fork, compare), `catalogue` (listing
threads, titles, metadata). `tree` and `edits`
stand apart from `branches` because turns use them too: an edit and a
regeneration are turns (they stream, and follow the multitask strategy), so
only their planning lives outside `turns`. `memories`: a user's long-term memories. `usage`: token totals.
`transfer`: export and import of whole threads as versioned JSON documents.

`Threads` is the façade the ResponsesAgent adapter calls. `ACTIONS` maps each
`custom_inputs.action` to one `Action`: which `custom_inputs` keys it takes,
whether it takes input items, how its arguments are parsed, and its handler,
so that adding an operation means adding one entry (and its Python method on
the agent), not editing a switch in several places. A turn is the action
`turn` (the default when `action` is absent); it is the only one that streams.

Importing this package loads neither LangGraph, LangChain nor MLflow (they
are imported where a turn runs): `tt-agent history` reads a thread through
`history` without them (tests/test_startup.py holds it). Modules imported
here import those libraries inside functions or under `TYPE_CHECKING`.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from agent.config import AgentSettings, MultitaskStrategy
from agent.errors import InvalidRequest
from agent.operations import branches, catalogue
from agent.operations import history as history_ops
from agent.operations import lifecycle
from agent.operations import memories as memory_ops
from agent.operations import retention, transfer
from agent.operations import usage as usage_ops
from agent.storage import ThreadStorage
from agent.types import (
    BranchSummary,
    CheckpointDiff,
    CheckpointState,
    CheckpointSummary,
    ForkResult,
    HeadMove,
    Memory,
    SweepResult,
    TokenUsage,
    TurnResult,
)
from agent.validation import check_id, check_limit, required_id

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage
    from langgraph.graph.state import CompiledStateGraph

    from agent.context.window import ContextWindow
    from agent.memory.service import Memories
    from agent.operations.turns import TurnArgs, TurnEvent
    from agent.requests import Envelope

__all__ = ["ACTIONS", "Action", "Threads", "TurnArgs", "TurnOptions"]


def __getattr__(name: str) -> Any:
    # `TurnArgs` lives with the turn machinery, which loads LangGraph; imported on first use (PEP 562).
    if name == "TurnArgs":
        from agent.operations.turns import TurnArgs

        return TurnArgs
    raise AttributeError(f"module 'agent.operations' has no attribute {name!r}")


class Threads:
    """The thread operations of one agent, over its storage and compiled graph."""

    def __init__(
        self,
        storage: ThreadStorage,
        graph: CompiledStateGraph,
        settings: AgentSettings,
        memories: Memories | None = None,
        window: ContextWindow | None = None,
        answer_node: str | None = None,
    ) -> None:
        self.storage = storage
        self.graph = graph
        self.settings = settings
        from agent.operations.turns import TurnRunner

        #: The users' long-term memories (`agent.memory`); None: the agent keeps none.
        self.memories = memories
        self.turns = TurnRunner(storage, graph, settings, memories, window, answer_node)

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
        idempotency_key: str | None = None,
        request_hash: str | None = None,
        remove_message_ids: Sequence[str] = (),
        edit_message_id: str | None = None,
        new_thread: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> TurnResult:
        """See `TurnRunner.update_state`."""
        return self.turns.update_state(
            thread_id,
            checkpoint_id,
            messages,
            user_id=user_id,
            strategy=strategy,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            remove_message_ids=remove_message_ids,
            edit_message_id=edit_message_id,
            new_thread=new_thread,
            metadata=metadata,
        )

    def history(self, thread_id: str, *, user_id: str | None, limit: int, before: str | None) -> list[CheckpointSummary]:
        """See `history.history`."""
        return history_ops.history(self.storage, thread_id, user_id=user_id, limit=limit, before=before)

    def get_checkpoint_state(self, thread_id: str, checkpoint_id: str | None, *, user_id: str | None) -> CheckpointState:
        """See `branches.get_checkpoint_state`."""
        return branches.get_checkpoint_state(self.storage, thread_id, checkpoint_id, user_id=user_id)

    def list_branches(self, thread_id: str, *, user_id: str | None) -> list[BranchSummary]:
        """See `branches.list_branches`."""
        return branches.list_branches(self.storage, thread_id, user_id=user_id)

    def set_head(self, thread_id: str, checkpoint_id: str, *, user_id: str | None) -> HeadMove:
        """See `branches.set_head`."""
        return branches.set_head(self.storage, thread_id, checkpoint_id, user_id=user_id)

    def fork_thread(
        self, thread_id: str, checkpoint_id: str | None, *, new_thread_id: str | None, user_id: str | None
    ) -> ForkResult:
        """See `branches.fork_thread`."""
        return branches.fork_thread(self.storage, thread_id, checkpoint_id, new_thread_id=new_thread_id, user_id=user_id)

    def compare_checkpoints(
        self, thread_id: str, checkpoint_a: str, checkpoint_b: str, *, user_id: str | None
    ) -> CheckpointDiff:
        """See `branches.compare_checkpoints`."""
        return branches.compare_checkpoints(self.storage, thread_id, checkpoint_a, checkpoint_b, user_id=user_id)

    def token_usage(self, thread_id: str, *, user_id: str | None, checkpoint_id: str | None = None) -> TokenUsage:
        """See `usage.token_usage`."""
        return usage_ops.token_usage(self.storage, thread_id, user_id=user_id, checkpoint_id=checkpoint_id)

    def thread_of_response(self, checkpoint_id: str, *, user_id: str | None) -> str:
        """The thread of the response (checkpoint) `checkpoint_id`; see `conversations.thread_of_response`."""
        from agent.operations.conversations import thread_of_response

        return thread_of_response(self.storage, checkpoint_id, user_id=user_id).thread_id

    def head(self, thread_id: str, *, user_id: str | None) -> str:
        """See `history.head`."""
        return history_ops.head(self.storage, thread_id, user_id=user_id)

    def list_threads(
        self, *, user_id: str | None, limit: int, before: str | None, metadata: Mapping[str, str] | None
    ) -> list[dict[str, Any]]:
        """See `catalogue.list_threads`."""
        return catalogue.list_threads(self.storage, user_id=user_id, limit=limit, before=before, metadata=metadata)

    def get_thread(self, thread_id: str, *, user_id: str | None) -> dict[str, Any]:
        """See `catalogue.get_thread`."""
        return catalogue.get_thread(self.storage, thread_id, user_id=user_id)

    def update_thread(
        self,
        thread_id: str,
        *,
        user_id: str | None,
        title: str | None = None,
        metadata: Mapping[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> dict[str, Any]:
        """See `catalogue.update_thread`."""
        return catalogue.update_thread(
            self.storage, thread_id, user_id=user_id, title=title, metadata=metadata, ttl_seconds=ttl_seconds
        )

    def delete_thread(self, thread_id: str, *, user_id: str | None) -> None:
        """See `lifecycle.delete_thread`."""
        lifecycle.delete_thread(self.storage, thread_id, user_id=user_id, memories=self.memories)

    def delete_user_data(self, user_id: str) -> list[str]:
        """See `lifecycle.delete_user_data`."""
        return lifecycle.delete_user_data(self.storage, user_id, memories=self.memories)

    def export_thread(self, thread_id: str, *, user_id: str | None) -> dict[str, Any]:
        """See `transfer.export_thread`."""
        return transfer.export_thread(self.storage, thread_id, user_id=user_id)

    def import_thread(self, document: Any, *, user_id: str | None, thread_id: str | None) -> dict[str, Any]:
        """See `transfer.import_thread`; the imported thread as a dict (`catalogue.thread_dict`)."""
        record = transfer.import_thread(self.storage, document, user_id=user_id, thread_id=thread_id)
        return catalogue.thread_dict(record)

    def sweep_expired_threads(self, *, now: datetime | None = None, stop: threading.Event | None = None) -> SweepResult:
        """See `retention.sweep_expired_threads`."""
        return retention.sweep_expired_threads(self.storage, self.settings, now=now, memories=self.memories, stop=stop)

    def list_memories(self, user_id: str, query: str | None, limit: int) -> list[Memory]:
        """See `memories.list_memories`."""
        return memory_ops.list_memories(self.memories, user_id, query=query, limit=limit)

    def delete_memory(self, user_id: str, memory_id: str) -> None:
        """See `memories.delete_memory`."""
        memory_ops.delete_memory(self.memories, user_id, memory_id)

    async def in_io(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` on the storage thread pool, awaited (for blocking storage work on the async path)."""
        return await self.turns.in_io(function, *args)

    def close(self) -> None:
        self.turns.close()
        if self.memories is not None:
            self.memories.close()
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


@dataclass(frozen=True)
class UpdateArgs:
    remove_message_ids: tuple[str, ...] = ()
    edit_message_id: str | None = None


def _parse_update(envelope: Envelope, custom: Mapping[str, Any]) -> UpdateArgs:
    ids = custom.get("remove_message_ids", [])
    if not isinstance(ids, list):
        raise InvalidRequest("remove_message_ids must be a list of message ids")
    edit_message_id = check_id("edit_message_id", custom.get("edit_message_id"))
    if edit_message_id is not None and len(envelope.messages) != 1:
        raise InvalidRequest("With edit_message_id, update_checkpoint_state takes exactly one input message")
    return UpdateArgs(tuple(required_id(f"remove_message_ids[{i}]", value) for i, value in enumerate(ids)), edit_message_id)


def _run_update(threads: Threads, envelope: Envelope, args: UpdateArgs) -> dict[str, Any]:
    result = threads.update_state(
        envelope.thread_id,
        envelope.checkpoint_id,
        envelope.messages,
        user_id=envelope.user_id,
        strategy=envelope.multitask_strategy,
        idempotency_key=envelope.idempotency_key,
        request_hash=envelope.request_hash,
        remove_message_ids=args.remove_message_ids,
        edit_message_id=args.edit_message_id,
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
    """Branch from the checkpoint before this message and send the input in its place (`operations.edits`)."""
    regenerate: bool = False
    """Rerun the model on the last user message (input empty; `operations.edits`)."""
    metadata: Mapping[str, str] | None = None
    """Stored with the thread when this turn creates it."""
    max_context_tokens: int | None = None
    """This turn's token budget for the model's input (bounded by the agent's setting)."""
    resume: Resume | None = None
    """Answer the interrupts the start checkpoint waits on (LangGraph `Command(resume=...)`; input empty)."""
    cancel_interrupts: bool = False
    """Send the input although interrupts wait at the start: they stay unanswered on that checkpoint."""


@dataclass(frozen=True)
class Resume:
    """The answer to a graph's pending `interrupt()`s: any JSON value when one waits, or
    `{interrupt_id: value}` (LangGraph's form) to answer several, or one of several, by id."""

    value: Any


def _parse_turn(envelope: Envelope, custom: Mapping[str, Any]) -> TurnOptions:
    regenerate = custom.get("regenerate", False)
    if not isinstance(regenerate, bool):
        raise InvalidRequest(f"regenerate must be true or false, got {regenerate!r}")
    cancel_interrupts = custom.get("cancel_interrupts", False)
    if not isinstance(cancel_interrupts, bool):
        raise InvalidRequest(f"cancel_interrupts must be true or false, got {cancel_interrupts!r}")
    if "resume" in custom:
        if envelope.messages or regenerate or custom.get("edit_message_id") is not None or cancel_interrupts:
            raise InvalidRequest(
                "resume answers the thread's pending interrupts and takes an empty input "
                "(no messages, regenerate, edit_message_id or cancel_interrupts); nothing was written"
            )
        # previous_response_id names the interrupted checkpoint; its thread is resolved before the turn.
        if envelope.thread_id is None and not envelope.thread_of_checkpoint:
            raise InvalidRequest(
                "resume needs custom_inputs.thread_id or previous_response_id (the thread whose interrupt it answers)"
            )
        return TurnOptions(resume=Resume(custom["resume"]), max_context_tokens=_budget(custom))
    edit_message_id = check_id("edit_message_id", custom.get("edit_message_id"))
    if regenerate and edit_message_id is not None:
        raise InvalidRequest("A turn either edits a message (edit_message_id) or regenerates an answer, not both")
    if regenerate and envelope.messages:
        raise InvalidRequest("regenerate takes an empty input: it answers the last user message again")
    if not regenerate and not envelope.messages:
        raise InvalidRequest(
            "input is empty: the turn action needs at least one message (or regenerate: true, or resume)"
        )
    if (regenerate or edit_message_id is not None) and envelope.thread_id is None:
        raise InvalidRequest("edit_message_id and regenerate need custom_inputs.thread_id (the thread to change)")
    metadata = catalogue.check_metadata(custom.get("metadata"))
    return TurnOptions(
        edit_message_id=edit_message_id,
        regenerate=regenerate,
        metadata=metadata,
        max_context_tokens=_budget(custom),
        cancel_interrupts=cancel_interrupts,
    )


def _budget(custom: Mapping[str, Any]) -> int | None:
    budget = custom.get("max_context_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise InvalidRequest(f"max_context_tokens must be a positive integer, got {budget!r}")
    return budget


TURN = Action(
    name="turn",
    summary="Run the model on the input from the head (or from checkpoint_id: a branch); the default.",
    keys=frozenset({"edit_message_id", "regenerate", "metadata", "max_context_tokens", "resume", "cancel_interrupts"}),
    input="optional",  # required unless regenerate or resume (checked by _parse_turn)
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
            summary="A new checkpoint on checkpoint_id (default: the head) with the input messages applied "
            "(an item whose id names a message replaces it) and remove_message_ids removed.",
            keys=frozenset({"remove_message_ids", "edit_message_id"}),
            input="optional",
            parse=_parse_update,
            run=_run_update,
        ),
        Action(
            name="get_checkpoint_state",
            summary="The head (or checkpoint_id): its history entry and its messages, each placed in the tree.",
            run=branches.run_get_state,
        ),
        Action(
            name="list_branches",
            summary="One entry per leaf of the thread's checkpoint tree, newest first.",
            run=branches.run_list_branches,
        ),
        Action(
            name="set_head",
            summary="Switch the thread to checkpoint_id without writing a checkpoint.",
            parse=branches.parse_set_head,
            run=branches.run_set_head,
        ),
        Action(
            name="fork_thread",
            summary="A new thread whose history is the ancestor chain of checkpoint_id (default: the head).",
            keys=frozenset({"new_thread_id"}),
            parse=branches.parse_fork,
            run=branches.run_fork,
        ),
        Action(
            name="compare_checkpoints",
            summary="The common ancestor of checkpoint_a and checkpoint_b and the messages only each has.",
            keys=frozenset({"checkpoint_a", "checkpoint_b"}),
            parse=branches.parse_compare,
            run=branches.run_compare,
        ),
        Action(
            name="get_usage",
            summary="Tokens the model used: the thread's total and the branch's up to checkpoint_id (default: the head).",
            run=_run_get_usage,
        ),
        Action(name="delete_thread", summary="Delete the thread and all its checkpoints.", run=_run_delete_thread),
        Action(
            name="delete_user_data",
            summary="Delete every thread of the user, and all the user's long-term memories.",
            needs_thread=False,
            needs_user=True,
            run=_run_delete_user_data,
        ),
        Action(
            name="list_memories",
            summary="The user's long-term memories: newest first, or best first for `query` (`memories`).",
            keys=frozenset({"query", "limit"}),
            needs_thread=False,
            needs_user=True,
            parse=memory_ops.parse_list,
            run=memory_ops.run_list,
        ),
        Action(
            name="delete_memory",
            summary="Delete one of the user's long-term memories (`memory_id`).",
            keys=frozenset({"memory_id"}),
            needs_thread=False,
            needs_user=True,
            parse=memory_ops.parse_delete,
            run=memory_ops.run_delete,
        ),
        # -- export / import (`transfer`) --
        Action(
            name="export_thread",
            summary="The whole thread (every checkpoint, its messages and the record) as a versioned JSON "
            "document, in custom_outputs.document.",
            run=transfer.run_export,
        ),
        Action(
            name="import_thread",
            summary="Restore custom_inputs.document as a thread of the caller (under custom_inputs.thread_id if "
            "given: a copy with new checkpoint ids); the same document again is a no-op.",
            keys=frozenset({"document"}),
            needs_thread=False,
            parse=transfer.parse_import,
            run=transfer.run_import,
        ),
        # -- the thread catalogue (`catalogue`) --
        Action(
            name="list_threads",
            summary="The user's threads, newest activity first; `before`: the previous page's `next_before`.",
            keys=frozenset({"limit", "before", "metadata"}),
            needs_thread=False,
            parse=catalogue.parse_list,
            run=catalogue.run_list,
        ),
        Action(
            name="get_thread",
            summary="The thread: title, metadata, head checkpoint_id, message_count, timestamps.",
            run=catalogue.run_get,
        ),
        Action(
            name="update_thread",
            summary="Set the thread's title, metadata (replaced) and/or ttl_seconds.",
            keys=frozenset({"title", "metadata", "ttl_seconds"}),
            parse=catalogue.parse_update,
            run=catalogue.run_update,
        ),
    )
}
