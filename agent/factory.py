"""`create_agent`: settings, storage, chat model and graph, built once.

A user's own agent enters here, as `tools` and `instructions` for the built-in
graph or as a whole `graph` (an uncompiled `StateGraph`): either way the graph
is compiled once with the storage's saver (`agent.graph.compile_graph`), so
every operation of the agent (threads, branches, the catalogue, export, …)
works on it unchanged. The chat `model` is then what summaries are written
with; the graph's own nodes call whatever model they like.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agent.config import load_settings
from agent.errors import ConfigurationError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.graph import StateGraph

    from agent.agent import Agent
    from agent.responses import LangGraphResponsesAgent

AgentT = TypeVar("AgentT", bound="Agent")


def create_agent(
    database_url: str | None = None,
    model: str | BaseChatModel | None = None,
    *,
    tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
    instructions: str | None = None,
    graph: StateGraph | None = None,
    connect: bool = True,
    **settings: Any,
) -> LangGraphResponsesAgent:
    """Build an agent: its storage, chat model and compiled graph, once.

    Args:
        database_url: `postgresql://…` (or a libpq `key=value` string), `sqlite:///path`
            or `memory://`. Unset: `AGENT_DATABASE_URL`, else the embedded
            `sqlite:///.agent/checkpoints.sqlite` in the current directory. A SQLite
            path is made absolute now (`agent.info().store` names it).
        model: a LangChain chat model, an OpenAI-compatible model name, or
            `"offline"`. Unset: `AGENT_MODEL`, else `"offline"` unless
            `OPENAI_API_KEY` or `OPENAI_BASE_URL` is set.
        tools: the tools the built-in graph's model may call: LangChain tools, or plain typed Python
            functions with a docstring (made into tools by LangChain's `tool`). None: the example
            tools (`agent.tools.TOOLS`: a calculator and a clock); `[]`: none. The long-term
            memory tools are added unless the setting `memory_tools` is False. Not with `graph`
            (your graph binds its own tools).
        instructions: the agent's system prompt: sent first on every model call (before a turn's
            own `instructions` and recalled memories), counted in `max_context_tokens`, never stored
            as a message. With `graph`, your model node gets it through `agent.graph.call_model`.
        graph: your own LangGraph graph, uncompiled (a `StateGraph` builder): its state must have a
            `messages` key reduced by `add_messages` (other keys are the graph's own). It is compiled
            once with the agent's checkpointer and runs every turn; see docs/guides/own-agent.md.
        connect: connect and set up the tables now (default), so a wrong URL
            fails here. `False` defers it to the first request (used when
            MLflow logs the model on a machine without the database).
        **settings: any field of `agent.config.AgentSettings` (pool sizes,
            `multitask_strategy`, `require_user_id`, `credential_provider`, …).

    Returns:
        A `LangGraphResponsesAgent`; call `close()` or use `with` to release its pool. When MLflow
        is not imported yet, it imports MLflow only when MLflow's side of it is first used
        (`predict`, `apredict`, …); until then its type is `agent.deferred.DeferredResponsesAgent`,
        an `agent.Agent` that `isinstance` and `set_model` take for a `LangGraphResponsesAgent`,
        which saves about 2 s of CPU at start-up. Tracing (`tracing=`) is switched then too.

    Raises:
        ConfigurationError: an unknown setting, a bad value, an unknown URL scheme,
            a malformed connection string; `tools` or `instructions` of the wrong type, or `tools`
            with `graph`; a `graph` that is compiled or has no `messages` key (the message names
            it), or `context_strategy="summarize"` with a graph whose state has no `context_summary`.
        StorageUnavailable: `connect=True` and the database cannot be reached
            within `connect_timeout` (the message shows the URL with its password masked).
    """
    if "mlflow" in sys.modules:  # importing the adapter costs little more
        from agent.responses import LangGraphResponsesAgent as agent_class
    else:
        from agent.deferred import DeferredResponsesAgent as agent_class  # becomes one on first use

    return build_agent(  # type: ignore[return-value]
        agent_class,
        database_url,
        model,
        tools=tools,
        instructions=instructions,
        graph=graph,
        connect=connect,
        **settings,
    )


def build_agent(
    agent_class: type[AgentT],
    database_url: str | None = None,
    model: str | BaseChatModel | None = None,
    *,
    tools: Sequence[BaseTool | Callable[..., Any]] | None = None,
    instructions: str | None = None,
    graph: StateGraph | None = None,
    connect: bool = True,
    **settings: Any,
) -> AgentT:
    """`create_agent`, building an `agent_class` (`agent.Agent` or a subclass) on the same parts.

    `create_agent` builds a `LangGraphResponsesAgent`, which is an MLflow `ResponsesAgent` and so
    imports MLflow (about 2 s of CPU here: `mlflow/__init__` loads its tracking client, pandas and
    `mlflow.genai`). A caller that never calls `predict`, such as the command line's commands on
    existing threads, builds the plain `agent.Agent` and pays none of it. Arguments, result and
    errors are `create_agent`'s.
    """
    from langchain_core.language_models import BaseChatModel

    from agent.context.window import ContextWindow
    from agent.graph import AGENT_NODE, agent_graph, compile_graph, has_context_summary
    from agent.memory.service import Memories
    from agent.memory.tools import memory_tools
    from agent.models import make_chat_model, model_name_of
    from agent.operations.context import OperationContext
    from agent.operations.turns import TurnRunner
    from agent.storage import open_storage
    from agent.tracing import configure_tracing

    own_tools = _tools(tools, graph)
    if instructions is not None and not isinstance(instructions, str):
        raise ConfigurationError(f"instructions must be a string, got {type(instructions).__name__}")
    chat_model = model if isinstance(model, BaseChatModel) else None
    config = load_settings(database_url=database_url, model=None if chat_model else model, **settings)
    if chat_model is None:
        chat_model = make_chat_model(config.model)
    else:
        config.model = model_name_of(chat_model)  # what runs, for banners and /agent/info
    storage = open_storage(config.database_url, config)
    memories = None
    try:
        memories = Memories(storage, config, model=chat_model)
        if connect:
            memories.setup()  # the storage's setup, then the store's (pgvector)
        window = ContextWindow.for_model(
            chat_model,
            max_context_tokens=config.max_context_tokens,
            strategy=config.context_strategy,
            instructions=instructions,
        )
        # The settings hold the budget in use (the default depends on the chat model, known only here),
        # so a turn's custom_inputs.max_context_tokens can be checked against it.
        config.max_context_tokens = window.max_context_tokens
        if graph is None:
            remembering = memory_tools(memories) if config.memory_tools else []
            taken = sorted({t.name for t in remembering} & {t.name for t in own_tools})
            if taken:
                raise ConfigurationError(
                    f"tools has a tool named {taken[0]!r}, the name of a long-term memory tool; rename it, "
                    "or set memory_tools=False."
                )
            compiled = compile_graph(agent_graph(chat_model, window, [*own_tools, *remembering]), storage.saver)
        else:
            compiled = compile_graph(graph, storage.saver)
            if config.context_strategy == "summarize" and not has_context_summary(compiled):
                raise ConfigurationError(
                    "context_strategy='summarize' keeps the branch's summary in a 'context_summary' state key, "
                    "which the graph's state lacks: add `context_summary: NotRequired[dict | None]` "
                    "(as agent.state.AgentState has) or use context_strategy='trim'."
                )
        # A user graph's model node reads the window from each turn (`agent.graph.call_model`).
        window = window.bind(chat_model, [])
    except BaseException:
        if memories is not None:
            memories.close()
        storage.close()
        raise
    configure_tracing(config)
    # State updates (edits, update_checkpoint_state) are written as the built-in graph's answering node;
    # on a user's graph, as the node LangGraph infers.
    answer_node = AGENT_NODE if graph is None else None
    turns = TurnRunner(storage, compiled, config, memories, window, answer_node)
    context = OperationContext(storage=storage, settings=config, graph=compiled, turns=turns, memories=memories)
    return agent_class(context)


def _with_sync_body(made: BaseTool, function: Callable[..., Any]) -> BaseTool:
    """An async function's tool, also runnable on the sync path (`predict`, `mlflow models serve`): LangChain's
    tool of a coroutine function has no sync body, so its sync call runs the coroutine on a loop of its own
    (LangGraph's sync ToolNode calls tools on worker threads, where no loop runs)."""
    import asyncio
    import functools
    import inspect

    if not inspect.iscoroutinefunction(function) or getattr(made, "func", True) is not None:
        return made

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(function(*args, **kwargs))

    made.func = run
    return made


def _tools(tools: Sequence[Any] | None, graph: Any) -> list[BaseTool]:
    """The built-in graph's own tools: `tools` as LangChain tools (the example tools when None)."""
    from langchain_core.tools import BaseTool, tool

    from agent.tools import TOOLS

    if tools is None:
        return [] if graph is not None else list(TOOLS)
    if graph is not None:
        raise ConfigurationError(
            "tools= is for the built-in graph; with graph=, bind your tools in your own graph (a ToolNode)."
        )
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise ConfigurationError(f"tools must be a list of LangChain tools or functions, got {type(tools).__name__}")
    made: list[BaseTool] = []
    for i, item in enumerate(tools):
        if isinstance(item, BaseTool):
            made.append(item)
        elif callable(item):
            try:
                made.append(_with_sync_body(tool(item), item))
            except Exception as exc:  # LangChain says why (no docstring, untyped arguments, ...)
                raise ConfigurationError(f"tools[{i}] ({getattr(item, '__name__', item)!r}) is not a tool: {exc}") from exc
        else:
            raise ConfigurationError(f"tools[{i}] must be a LangChain tool or a function, got {type(item).__name__}")
    names = [t.name for t in made]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigurationError(f"tools has two tools named {duplicates[0]!r}; tool names must be unique")
    return made
