"""One run of an operation from the command line, through the operations' door.

The values are checked by the operation's checkers (`agent.operations.operation.arguments`)
and the handler runs on an `OperationContext` (`operation.call`), as for the
agent's methods. An operation declared `reads_only` runs over the store's reads
(`open_reads`: on SQLite no LangGraph is loaded); the others on a whole agent
opened on an existing store. A checkpoint argument may be a short id (the end of
one), resolved against the thread's history, read through the same door.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
    existing store (never created)."""
    if operation.reads_only:
        with open_reads(database_url) as context:
            yield context
        return
    with open_agent(database_url, "offline", False, read_only=True) as agent:
        yield agent.operation_context


class Run:
    """One run of an operation from the command line: its checked arguments and its result.

    Constructing it runs the operation. Short checkpoint ids among `values` are resolved first.

    Raises: the operation's `AgentError`s.
    """

    def __init__(
        self, operation: Operation, context: OperationContext, values: dict[str, Any], flags: dict[str, bool], spec: Mapping[str, Any]
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

    def _full_id(self, ref: str) -> str:
        from agent.operations.history import resolve_checkpoint_ref

        return resolve_checkpoint_ref(self.history(), self._values.get("thread_id"), ref)
