"""A LangGraph graph of your own with a human in the loop: `book_trip` asks for approval before it runs.

    START -> agent -(tool calls?)-> tools -> agent ... -> END

The `agent` node calls the chat model through `agent.graph.call_model`, so it gets the agent's
context window (instructions, recalled memories, the token budget). The `tools` node is
LangGraph's `ToolNode`; `book_trip` calls LangGraph's `interrupt()`, which stops the turn:

* the response carries the question in `custom_outputs.interrupts` (and, on `/responses`, an
  `mcp_approval_request` output item), and the thread head waits at the `tools` node;
* the next request answers it with `custom_inputs.resume` (`"yes"`, `true` or
  `{"approve": true}` approve; anything else declines), and the turn goes on from there.

With the offline model, the message `use book_trip {"destination": "Tokyo"}` makes the model call
the tool. Run it with `tt-agent chat --agent examples/approval_agent.py` (answer the question with
`/resume yes`), or serve it like examples/my_agent.py.
"""

import zlib
from typing import Any

import mlflow
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from agent import create_agent
from agent.graph import acall_model, call_model
from agent.models import make_chat_model


def approved(answer: Any) -> bool:
    """Whether a resume value says yes: `True`, `"yes"`/`"y"`/`"approve"`, or `{"approve": true}`."""
    if isinstance(answer, dict):
        answer = answer.get("approve")
    if isinstance(answer, str):
        return answer.strip().lower() in {"yes", "y", "approve", "approved", "ok"}
    return answer is True


@tool
def book_trip(destination: str) -> str:
    """Book a trip to a destination. The user is asked to approve it first."""
    answer = interrupt({"question": f"Book a trip to {destination}?", "tool": "book_trip", "destination": destination})
    if not approved(answer):
        return f"Not booked: the user declined the trip to {destination}."
    return f"Booked: a trip to {destination}, confirmation TT-{zlib.crc32(destination.encode()) % 10000:04d}."


TOOLS = [book_trip]
# The model comes from the environment (AGENT_MODEL; the offline model when nothing is set).
llm = make_chat_model().bind_tools(TOOLS)


def agent_node(state: MessagesState, config: RunnableConfig) -> dict:
    return call_model(llm, state, config)


async def aagent_node(state: MessagesState, config: RunnableConfig) -> dict:
    return await acall_model(llm, state, config)


def build_graph() -> StateGraph:
    """The graph, uncompiled: `create_agent` compiles it with its own checkpointer."""
    from langchain_core.runnables import RunnableLambda

    builder = StateGraph(MessagesState)
    builder.add_node("agent", RunnableLambda(agent_node, afunc=aagent_node, name="agent"))
    # handle_tool_errors: a tool that raises answers the model with the error; LangGraph's default
    # re-raises it, which fails the whole turn (an interrupt() still stops the turn either way).
    builder.add_node("tools", ToolNode(TOOLS, handle_tool_errors=True))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


agent = create_agent(graph=build_graph(), instructions="You book trips. Always ask before booking.", connect=False)
mlflow.models.set_model(agent)
