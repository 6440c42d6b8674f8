"""The LangGraph graph: the built-in one (a chat model that can call tools), or the user's own.

    START -> agent -(tool calls?)-> tools -> agent ... -> END

The built-in graph (`agent_graph`) is one graph among others: `create_agent(...,
graph=builder)` takes a user's uncompiled `StateGraph` instead, and both are
compiled by `compile_graph`, which checks the one thing the agent relies on (a
`messages` channel merged like `add_messages`) and tells the saver which
channels trigger which node. Compiled once per agent, with the storage's saver as checkpointer.
Turns run with `durability="exit"`, so one turn writes one checkpoint: the
history has one entry per turn (or state update), and the checkpoint after a
finished turn has no next nodes.

The agent node has a synchronous and an async body (a `RunnableLambda` with
both), so `graph.stream` (in-process `predict`) and `graph.astream` (the HTTP
server) each call the model the natural way: the async path awaits the HTTP
request instead of holding an OS thread while the model thinks. Each body
asks the `ContextWindow` for the model input (`agent.context`), calls the
model, and has the window record what it was sent (the state is
`agent.state.AgentState`). Before the model call, the step appends the messages
that `steer` requests offered to the turn (`agent.operations.turns.steer`).
Each model call is traced as one span
(`agent.tracing.model_call_span`). The same step is public as `call_model` /
`acall_model`, so that a user's graph gets the same context window in its own
model node (the window reaches it in the turn's `TurnContext`); a foreign graph
that calls its model directly gets its messages unbudgeted, which is the
graph's choice.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agent.context import turn_context
from agent.context.tokens import approximate_counter
from agent.context.window import ContextWindow
from agent.errors import ConfigurationError, ModelError
from agent.state import CONTEXT_SUMMARY_CHANNEL, AgentState, append_messages
from agent.storage.next_nodes import next_nodes
from agent.tools import TOOLS
from agent.tracing import model_call_span

#: The built-in graph's node that calls the model.
AGENT_NODE = "agent"
#: The state channel every graph the agent runs must have.
MESSAGES_CHANNEL = "messages"
#: The reducers the agent accepts for it: both merge by message id (append, replace, `RemoveMessage`).
_MESSAGE_REDUCERS = (add_messages, append_messages)


def build_graph(
    model: BaseChatModel, saver, window: ContextWindow | None = None, tools: Sequence[BaseTool] = TOOLS
) -> CompiledStateGraph:
    """The built-in graph (`agent_graph`) compiled with `saver` as its checkpointer (`compile_graph`)."""
    return compile_graph(agent_graph(model, window, tools), saver)


def compile_graph(builder: StateGraph, saver) -> CompiledStateGraph:
    """Compile `builder` (an uncompiled `StateGraph`) with `saver` (a `TurnSaverMixin` saver) as its checkpointer.

    The state must have a `messages` channel reduced by LangGraph's `add_messages` (or
    `agent.state.append_messages`, the same merge): the agent reads and writes a thread's
    conversation there. Other state keys are the graph's own, stored and branched like any channel.

    Raises:
        ConfigurationError: `builder` is not a `StateGraph` (a compiled graph: pass the builder, the
            agent compiles it with its own checkpointer), or its state has no `messages` channel, or
            that channel has another reducer, or LangGraph refuses to compile it (no edge from START, an
            edge to a node that does not exist), or a node is a subgraph compiled with `checkpointer=True`
            (its state would not branch with the thread's checkpoints).
    """
    if not isinstance(builder, StateGraph):
        hint = " (pass the StateGraph builder, not builder.compile(...))" if isinstance(builder, CompiledStateGraph) else ""
        raise ConfigurationError(f"graph must be an uncompiled langgraph StateGraph{hint}, got {type(builder).__name__}")
    channel = builder.channels.get(MESSAGES_CHANNEL)
    if channel is None:
        raise ConfigurationError(
            f"The graph's state has no {MESSAGES_CHANNEL!r} key (it has {sorted(builder.channels)}); the agent keeps "
            f"the conversation there: add `{MESSAGES_CHANNEL}: Annotated[list[AnyMessage], add_messages]` "
            "(or use langgraph.graph.MessagesState)."
        )
    operator = getattr(channel, "operator", None)
    # add_messages(format="langchain-openai") is a partial of it: the same merge, the content converted.
    merge = operator.func if isinstance(operator, functools.partial) else operator
    if not (isinstance(channel, BinaryOperatorAggregate) and _merges_by_id(merge)):
        reducer = getattr(merge, "__name__", None) or repr(merge)
        has = (
            f"its reducer is {reducer!r}"
            if operator is not None
            else "it has no reducer (each write would replace the list)"
        )
        raise ConfigurationError(
            f"The graph's {MESSAGES_CHANNEL!r} state key must be reduced by langgraph's add_messages itself "
            f"(Annotated[list[AnyMessage], add_messages]), which the agent's edits and branches rely on; {has}."
        )
    try:
        graph = builder.compile(checkpointer=saver)
    except ValueError as exc:  # LangGraph's own checks of the graph's shape (no entry point, an unknown node)
        raise ConfigurationError(f"LangGraph cannot compile the graph: {exc}") from exc
    for name, subgraph in graph.get_subgraphs(recurse=True):
        if subgraph.checkpointer is True:
            raise ConfigurationError(
                f"The graph's node {name!r} is a subgraph compiled with checkpointer=True: LangGraph keeps such a "
                "subgraph's state per thread, across calls and branches (its own namespace without a task id), so "
                "a turn from an earlier checkpoint would continue the subgraph where another branch left it. "
                "Compile it without a checkpointer (its state then lives in each of the parent's checkpoints)."
            )
    # The saver summarizes `next_nodes` when it writes a checkpoint, with LangGraph's own rule over the
    # graph's nodes and channels.
    saver.next_nodes = functools.partial(next_nodes, graph)
    return graph


def _merges_by_id(reducer: Any) -> bool:
    """Whether `reducer` is one of `_MESSAGE_REDUCERS`, or the function LangGraph's `add_messages(format=...)`
    wraps in a partial (its undecorated `add_messages`)."""
    if reducer in _MESSAGE_REDUCERS:
        return True
    module, name = getattr(reducer, "__module__", None), getattr(reducer, "__name__", None)
    return module == add_messages.__module__ and name == "add_messages"


def has_context_summary(graph: CompiledStateGraph) -> bool:
    """Whether the graph's state keeps a branch summary (`context_summary`, as `AgentState` does)."""
    return CONTEXT_SUMMARY_CHANNEL in graph.channels


def agent_graph(model: BaseChatModel, window: ContextWindow | None = None, tools: Sequence[BaseTool] = TOOLS) -> StateGraph:
    """The built-in graph over `model`, uncompiled: an `agent` node that calls the model with `tools` bound,
    and a `tools` node (LangGraph's `ToolNode`) that runs them (no `tools` node when `tools` is empty).

    `window` is the context budget, strategy, token counter and system prompt (default:
    `ContextWindow.for_model(model)`). A model that cannot bind tools (`bind_tools`
    raises NotImplementedError) is used without them.
    """
    all_tools = list(tools)
    try:
        bound, tools = (model.bind_tools(all_tools), all_tools) if all_tools else (model, [])
    except NotImplementedError:
        bound, tools = model, []
    window = (window or ContextWindow.for_model(model)).bind(model, tools)
    def agent(state: AgentState, config: RunnableConfig) -> dict:
        return _model_step(bound, window, state, config)

    async def aagent(state: AgentState, config: RunnableConfig) -> dict:
        return await _amodel_step(bound, window, state, config)

    builder = StateGraph(AgentState)
    builder.add_node(AGENT_NODE, RunnableLambda(agent, afunc=aagent, name=AGENT_NODE))
    builder.add_edge(START, AGENT_NODE)
    if tools:
        # A tool that raises answers the model with the error (LangGraph's ToolNode), instead of failing the turn.
        builder.add_node("tools", ToolNode(tools, handle_tool_errors=True))
        builder.add_conditional_edges(AGENT_NODE, tools_condition, ["tools", END])
        builder.add_edge("tools", AGENT_NODE)
    else:
        builder.add_edge(AGENT_NODE, END)
    return builder


def call_model(model: Runnable, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
    """The agent's model step, for a node of your own graph: call `model` with what the agent's context
    window sends for `state`, and return the state update.

    What is sent is what the built-in graph sends (`agent.context`): the agent's `instructions`, the
    turn's instructions and recalled long-term memories, then the branch's newest whole turns within
    `max_context_tokens`, every tool call paired with its result (and the branch's summary under
    `context_strategy="summarize"`). The call is traced, and what it was sent and the tokens it used
    go into the checkpoint's metadata (`get_usage`, `get_checkpoint_state`).

    Args:
        model: a chat model, usually with your tools bound (`llm.bind_tools(tools)`).
        state: the node's state; its `messages` are the branch's messages, oldest first.
        config: the node's `RunnableConfig` (declare it as the node's second parameter).

    Returns:
        `{"messages": [reply]}`, plus `context_summary` when a summary was made (only when the graph's
        state has that key, which `context_strategy="summarize"` requires). Outside an agent's turn (the
        graph invoked directly) the state's messages are sent unchanged.

    Raises:
        ModelError: the model call failed (nothing of the turn is written).

    Example::

        def chatbot(state: MessagesState, config: RunnableConfig) -> dict:
            return call_model(llm_with_tools, state, config)
    """
    return _model_step(model, _window_of(config), state, config)


async def acall_model(model: Runnable, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
    """`call_model` for an async node: the same input, update and errors, with the model's `ainvoke`."""
    return await _amodel_step(model, _window_of(config), state, config)


def _window_of(config: RunnableConfig) -> ContextWindow:
    context = turn_context(config)
    window = context.window if context is not None else None
    return window if window is not None else _UNBOUNDED


#: Outside an agent's turn: every message, no summary (a window never asked to summarize).
_UNBOUNDED = ContextWindow(max_context_tokens=sys.maxsize, strategy="trim", counter=approximate_counter())


def _model_step(model: Runnable, window: ContextWindow, state: Mapping[str, Any], config: RunnableConfig) -> dict:
    context = turn_context(config)
    steered = context.inbox.take() if context is not None and context.inbox is not None else []
    state = _with_steered(state, steered)
    try:
        prepared = window.prepare(state, context)
        with model_call_span(prepared.input.messages, name=_span_name(model)) as span:
            reply = model.invoke(prepared.input.messages)
            span.reply(reply)
    except Exception as exc:
        raise _model_error(exc) from exc
    return {"messages": [*steered, reply], **window.record(prepared, reply, context)}


async def _amodel_step(model: Runnable, window: ContextWindow, state: Mapping[str, Any], config: RunnableConfig) -> dict:
    context = turn_context(config)
    steered = await context.inbox.atake() if context is not None and context.inbox is not None else []
    state = _with_steered(state, steered)
    try:
        prepared = await window.aprepare(state, context)
        with model_call_span(prepared.input.messages, name=_span_name(model)) as span:
            reply = await model.ainvoke(prepared.input.messages)
            span.reply(reply)
    except Exception as exc:
        raise _model_error(exc) from exc
    return {"messages": [*steered, reply], **window.record(prepared, reply, context)}


def _with_steered(state: Mapping[str, Any], steered: list) -> Mapping[str, Any]:
    """`state` with the messages steered into the turn appended (`agent.operations.turns.steer`): the model
    sees them after what the state ends with (a tool result), and the node's update stores them before the reply."""
    if not steered:
        return state
    return {**state, MESSAGES_CHANNEL: [*state.get(MESSAGES_CHANNEL, ()), *steered]}


def _span_name(model: Runnable) -> str:
    # A model with tools bound is a RunnableBinding: name the chat model inside it.
    return type(getattr(model, "bound", model)).__name__


def _model_error(exc: Exception) -> ModelError:
    return ModelError(f"The chat model failed: {type(exc).__name__}: {exc}; nothing was written.")
