"""One run of an operation from the command line, through the operations' door.

The values are checked by the operation's checkers (`agent.operations.operation.arguments`)
and the handler runs on an `OperationContext` (`operation.call`), as for the
agent's methods. An operation declared `reads_only` runs over the store's reads
(`open_reads`: on SQLite no LangGraph is loaded); the others on a whole agent
opened on an existing store. A checkpoint argument may be a short id (the end of
one), resolved against the thread's history, read through the same door.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from agent.cli.app import MAX_LISTED
from agent.cli.stores import open_agent, open_reads

if TYPE_CHECKING:
    from agent.operations.context import OperationContext
    from agent.operations.operation import Operation

#: Characters of a whole checkpoint id (a UUID); shorter ones are short ids.
FULL_ID_CHARS = 36


def registered(name: str) -> Operation:
    """The registered operation `name` (importing the registry: the operations' modules)."""
    from agent.operations.registry import OPERATIONS

    return next(operation for operation in OPERATIONS if operation.name == name)


@contextmanager
def operation_context(operation: Operation, database_url: str | None) -> Iterator[OperationContext]:
    """The context `operation` runs on: a store's reads for a `reads_only` one, else an agent's, on an
    existing store (never created). The agent's model is the offline one, except for an operation that
    is a turn (`Operation.stream`: `merge_branch` summarizes with it), which gets the configured model
    (`AGENT_MODEL`, else offline unless an OpenAI key or base URL is set), as `tt-agent chat` does."""
    if operation.reads_only:
        with open_reads(database_url) as context:
            yield context
        return
    model = None if operation.stream is not None else "offline"
    with open_agent(database_url, model, False, read_only=True) as agent:
        yield agent.operation_context


class Run:
    """One run of an operation from the command line: its checked arguments and its result.

    Constructing it runs the operation. Short checkpoint ids among `values` are resolved first.
    `stream_to`: for an operation that is a turn (`Operation.stream`), called with each of its events as it
    happens (the summary's text deltas while the model writes it), through the same body the agent's method
    drives; None: the operation runs whole.

    Raises: the operation's `AgentError`s.
    """

    def __init__(
        self,
        operation: Operation,
        context: OperationContext,
        values: dict[str, Any],
        flags: dict[str, bool],
        spec: Mapping[str, Any],
        *,
        stream_to: Callable[[Any], None] | None = None,
    ) -> None:
        from agent.operations.operation import arguments

        self.operation, self.context, self.flags = operation, context, flags
        self._values = values
        self._history: list[dict[str, Any]] | None = None
        for param in spec["params"]:
            ref = values.get(param["name"])
            if param.get("checkpoint") and isinstance(ref, str) and len(ref.strip().lstrip("…")) < FULL_ID_CHARS:
                values[param["name"]] = self._full_id(ref)
        self.args = arguments(operation, values, context.settings)
        if stream_to is not None and operation.stream is not None:
            self.result = _streamed(operation, context, self.args, stream_to)
        else:
            self.result = operation.call(context, self.args)

    @cached_property
    def python(self) -> Any:
        """The result as the agent's method returns it (dicts)."""
        return self.operation.as_python(self.result)

    @cached_property
    def outputs(self) -> dict[str, Any]:
        """The result as the operation's `custom_outputs`."""
        return self.operation.as_outputs(self.result, self.args)

    def history(self) -> list[dict[str, Any]]:
        """The thread's checkpoints (the newest `MAX_LISTED`), read through the door like any operation."""
        if self._history is None:
            from agent.operations.operation import arguments

            history = registered("get_checkpoint_history")
            values = {"thread_id": self._values.get("thread_id"), "user_id": self._values.get("user_id"), "limit": MAX_LISTED}
            args = arguments(history, values, self.context.settings)
            self._history = history.as_python(history.call(self.context, args))
        return self._history

    def branches(self) -> list[dict[str, Any]]:
        """The thread's branches, archived ones too (`list_branches`), read through the door like any operation."""
        from agent.operations.operation import arguments

        listing = registered("list_branches")
        values = {"thread_id": self._values.get("thread_id"), "user_id": self._values.get("user_id"), "include_archived": True}
        return listing.as_python(listing.call(self.context, arguments(listing, values, self.context.settings)))

    def _full_id(self, ref: str) -> str:
        from agent.operations.history import resolve_checkpoint_ref

        return resolve_checkpoint_ref(self.history(), self._values.get("thread_id"), ref)


def _streamed(operation: Operation, context: OperationContext, args: Any, stream_to: Callable[[Any], None]) -> Any:
    """Drive the turn body of `operation` (`Operation.stream`) to its end on the turn runner's loop threads,
    handing each event to `stream_to`; its `TurnResult` (an idempotent retry's stored one as a `TurnResult`)."""
    from agent.operations.turns.commit import result_of
    from agent.types import StoredResponse

    last: Any = None
    for event in context.turns.bridge.iterate(operation.stream(context, args, stream_tokens=True)):
        stream_to(event)
        last = event
    return result_of(last) if isinstance(last, StoredResponse) else last
