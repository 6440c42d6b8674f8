"""The LangGraph graph: a chat model that can call tools, over `add_messages` state.

    START -> agent -(tool calls?)-> tools -> agent ... -> END

Built and compiled once per agent, with the storage's saver as checkpointer.
Turns run with `durability="exit"`, so one turn writes one checkpoint: the
history has one entry per turn (or state update), and the checkpoint after a
finished turn has no next nodes.

The agent node has a synchronous and an async body (a `RunnableLambda` with
both), so `graph.stream` (in-process `predict`) and `graph.astream` (the HTTP
server) each call the model the natural way: the async path awaits the HTTP
request instead of holding an OS thread while the model thinks. Each body
asks the `ContextWindow` for the model input (`agent.context`), calls the
model, and has the window record what it was sent (the state is
`agent.state.AgentState`). Each model call is traced as one span
(`agent.tracing.model_call_span`).
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agent.context import turn_context
from agent.context.window import ContextWindow
from agent.errors import ModelError
from agent.state import AgentState
from agent.tools import TOOLS
from agent.tracing import model_call_span


def build_graph(
    model: BaseChatModel, saver, window: ContextWindow | None = None, extra_tools: Sequence[BaseTool] = ()
) -> CompiledStateGraph:
    """Compile the agent graph over `model` with `saver` (a `TurnSaverMixin` saver) as its checkpointer,
    and `TOOLS` plus `extra_tools` (the memory tools, `agent.memory.tools`).

    `window` is the context budget, strategy and token counter (default:
    `ContextWindow.for_model(model)`). A model that cannot bind tools
    (`bind_tools` raises NotImplementedError) is used without them.
    """
    all_tools = [*TOOLS, *extra_tools]
    try:
        bound, tools = model.bind_tools(all_tools), all_tools
    except NotImplementedError:
        bound, tools = model, []
    window = (window or ContextWindow.for_model(model)).bind(model, tools)
    span_name = type(model).__name__

    def agent(state: AgentState, config: RunnableConfig) -> dict:
        context = turn_context(config)
        try:
            prepared = window.prepare(state, context)
            with model_call_span(prepared.input.messages, name=span_name) as span:
                reply = bound.invoke(prepared.input.messages)
                span.reply(reply)
        except Exception as exc:
            raise _model_error(exc) from exc
        return {"messages": [reply], **window.record(prepared, reply, context)}

    async def aagent(state: AgentState, config: RunnableConfig) -> dict:
        context = turn_context(config)
        try:
            prepared = await window.aprepare(state, context)
            with model_call_span(prepared.input.messages, name=span_name) as span:
                reply = await bound.ainvoke(prepared.input.messages)
                span.reply(reply)
        except Exception as exc:
            raise _model_error(exc) from exc
        return {"messages": [reply], **window.record(prepared, reply, context)}

    builder = StateGraph(AgentState)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent, name="agent"))
    builder.add_node("tools", ToolNode(all_tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver)
    # The saver summarizes `next_nodes` when it writes a checkpoint; it needs
    # to know which channels trigger which node.
    saver.node_triggers = {name: list(node.triggers) for name, node in graph.nodes.items()}
    return graph


def _model_error(exc: Exception) -> ModelError:
    return ModelError(f"The chat model failed: {type(exc).__name__}: {exc}; nothing was written.")
