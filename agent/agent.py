"""`Agent`: the Python API, one method per registered operation, and no MLflow.

Every public method but `info` and `close` is made from its `Operation`
(`agent.operations.registry`) by `operation.python_method`: the signature and
docstring are the operation's, and the body is the one door, `run_operation`,
which checks the arguments with the operation's checkers and runs its handler on
this agent's `OperationContext`. So a method never restates a check or a
docstring, and a new operation needs no edit here.

`LangGraphResponsesAgent` (`agent.responses`) is this class plus MLflow's
`ResponsesAgent` interface (`predict` and `predict_stream`, and their async
twins); `create_agent` builds that one. `Agent` itself is what a caller without
MLflow, such as the command line, holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agent.errors import AgentError
from agent.operations.operation import Operation, arguments, python_method
from agent.operations.registry import OPERATIONS
from agent.types import AgentInfo

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph

    from agent.config import AgentSettings
    from agent.operations.context import OperationContext
    from agent.storage import ThreadStorage

logger = logging.getLogger(__name__)


def _with_operation_methods(cls: type) -> type:
    """`cls` with a method per registered operation (`python_method`), unless it defines one itself."""
    for operation in OPERATIONS:
        if operation.name not in cls.__dict__:
            setattr(cls, operation.name, python_method(operation))
    return cls


@_with_operation_methods
class Agent:
    """A conversational agent with checkpoint memory you can branch from.

    Build one with `agent.create_agent(...)`. Close it with `close()` or use it
    as a context manager; it owns a connection pool. Its time-travel methods
    (`get_checkpoint_history`, `set_head`, `fork_thread`, …) are listed in the
    reference, one per operation.
    """

    def __init__(self, context: OperationContext) -> None:
        #: The storage, graph, settings, memories and turns the operations run on.
        self.operation_context = context

    @property
    def settings(self) -> AgentSettings:
        """The agent's settings (`agent.config.AgentSettings`)."""
        return self.operation_context.settings

    @property
    def storage(self) -> ThreadStorage:
        """The `agent.storage.ThreadStorage` this agent keeps its threads in."""
        return self.operation_context.storage

    @property
    def graph(self) -> CompiledStateGraph:
        """The compiled LangGraph graph (for drawing it; read state with `get_checkpoint_state`: LangGraph's
        latest checkpoint is not the head after `set_head`)."""
        return self.operation_context.graph

    def info(self) -> AgentInfo:
        """What is running: name, version, the database (`store`: an absolute SQLite path or a masked
        Postgres URL; `store_kind`), the model's name, and whether tracing is on."""
        from agent.config import store_kind, store_label
        from agent.version import __version__

        url = self.settings.database_url
        return AgentInfo(
            name="timetravel-agent",
            version=__version__,
            store=store_label(url),
            store_kind=store_kind(url),
            model=self.settings.model,
            tracing=bool(self.settings.tracing),
        )

    def run_operation(self, operation: Operation, values: Mapping[str, Any]) -> Any:
        """Run `operation` with the raw argument `values` (by parameter name) and return what its
        Python method returns. Every method of the operations comes here.

        Raises: the operation's errors (`AgentError`s); anything unexpected as an `AgentError`
        without its traceback (logged here).
        """
        with agent_errors():
            args = arguments(operation, values, self.settings)
            return operation.as_python(operation.call(self.operation_context, args))

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Release the connection pool. The agent is unusable afterwards."""
        self.operation_context.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextmanager
def agent_errors() -> Iterator[None]:
    """Let an `AgentError` through; turn anything else into an `AgentError` without a traceback for
    the caller, logging it here."""
    try:
        yield
    except AgentError:
        raise
    except Exception as exc:
        logger.exception("Unexpected error in the agent")
        raise AgentError(f"Internal error ({type(exc).__name__}); see the server log.") from exc
