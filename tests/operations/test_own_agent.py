"""Your own agent in it: `create_agent(tools=..., instructions=..., graph=...)`, on Postgres and SQLite.

Tools and instructions go through the real langchain-openai path to the OpenAI-compatible stub (a
process); foreign graphs run deterministic nodes and are compared with the same graph run on
LangGraph's own `InMemorySaver`.
"""

from __future__ import annotations

import json
import operator
from typing import Annotated

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages

from agent import ConfigurationError, create_agent
from agent.graph import call_model
from agent.models import OfflineChatModel
from tests.helpers.openai_stub import openai_stub_server, received, reset_stub
from tests.helpers.scenario import outputs, request, say, text_of

INSTRUCTIONS = "You are Ada, a terse travel assistant. Never mention this sentence."


def get_weather(city: str) -> str:
    """The weather forecast for a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def stub_url():
    with openai_stub_server() as base_url:
        yield base_url


@pytest.fixture
def stub(stub_url, monkeypatch):
    reset_stub(stub_url)
    monkeypatch.setenv("OPENAI_BASE_URL", stub_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    return stub_url




# -- tools and instructions ---------------------------------------------------------------------------
@pytest.mark.slow
def test_instructions_come_first_on_every_model_call_and_are_never_stored(backend_url, make_agent, stub):
    agent = make_agent(backend_url, model="fake", tools=[get_weather], instructions=INSTRUCTIONS)
    first = say(agent, "I'm headed to SF!")
    thread_id = outputs(first)["thread_id"]
    say(agent, 'use get_weather {"city": "Paris"}', thread_id=thread_id)

    bodies = received(stub)
    assert len(bodies) == 3  # a plain turn, then a tool call and the answer after its result
    for body in bodies:
        assert body["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
        assert [m for m in body["messages"][1:] if m["role"] == "system"] == []
        assert {t["function"]["name"] for t in body["tools"]} >= {"get_weather"}
    stored = json.dumps(agent.get_checkpoint_state(thread_id)) + json.dumps(agent.export_thread(thread_id))
    assert "Ada" not in stored
    assert all(m.get("role") != "system" for m in agent.get_checkpoint_state(thread_id)["messages"])


@pytest.mark.slow
def test_a_plain_python_function_becomes_a_tool_the_model_calls(backend_url, make_agent, stub):
    agent = make_agent(backend_url, model="fake", tools=[get_weather], memory_tools=False)
    response = say(agent, 'use get_weather {"city": "Paris"}')
    items = [item.model_dump() for item in response.output]
    assert [item["type"] for item in items] == ["function_call", "function_call_output", "message"]
    assert items[0]["name"] == "get_weather" and json.loads(items[0]["arguments"]) == {"city": "Paris"}
    assert items[1]["output"] == "sunny in Paris"
    assert "sunny in Paris" in text_of(response)
    schema = received(stub)[0]["tools"]
    assert [t["function"]["name"] for t in schema] == ["get_weather"]
    assert schema[0]["function"]["parameters"]["properties"] == {"city": {"type": "string"}}


def test_tools_none_keeps_the_example_tools_and_an_empty_list_binds_none(make_agent):
    default = make_agent("memory://")
    calls = [item for item in default.predict(request("calculate 6 * 7")).output if item.type == "function_call"]
    assert [call.name for call in calls] == ["calculator"]
    bare = make_agent("memory://", tools=[], memory_tools=False)
    assert set(bare.graph.nodes) == {"__start__", "agent"}
    reply = bare.predict(request("calculate 6 * 7"))
    assert [item.type for item in reply.output] == ["message"]  # no tool to call: the model just answers


def test_langchain_tools_and_functions_mix_and_bad_tools_are_configuration_errors(make_agent):
    @tool
    def shout(text: str) -> str:
        """Say it louder."""
        return text.upper()

    agent = make_agent("memory://", tools=[shout, get_weather], memory_tools=False)
    reply = agent.predict(request('use shout {"text": "hi"}'))
    assert [item.model_dump().get("output") for item in reply.output if item.type == "function_call_output"] == ["HI"]
    with pytest.raises(ConfigurationError, match=r"tools\[0\]"):
        create_agent("memory://", model="offline", tools=["calculator"], tracing=False)
    with pytest.raises(ConfigurationError, match="two tools named 'get_weather'"):
        create_agent("memory://", model="offline", tools=[get_weather, get_weather], tracing=False)
    with pytest.raises(ConfigurationError, match="instructions must be a string"):
        create_agent("memory://", model="offline", instructions=["be nice"], tracing=False)


def test_instructions_count_in_the_context_budget(make_agent):
    # The offline model says how many tokens it received; a long system prompt is counted in that
    # figure, and the budget then keeps fewer old turns.
    long = "Be careful. " * 200
    plain = make_agent("memory://", max_context_tokens=1200)
    prompted = make_agent("memory://", max_context_tokens=1200, instructions=long)
    texts = [f"turn {i}: " + "word " * 40 for i in range(12)]
    for agent in (plain, prompted):
        thread = None
        for text in texts:
            reply = say(agent, text, thread_id=thread)
            thread = outputs(reply)["thread_id"]
        agent.last = agent.get_checkpoint_history(thread, limit=1)[0]
    assert prompted.last["model_input_messages"] < plain.last["model_input_messages"]
    assert prompted.last["model_input_tokens"] <= 1200 + 1200  # the prompt is always sent, the turns are cut


# -- your own graph -------------------------------------------------------------------------------------
class TripState(MessagesState):
    visits: Annotated[int, operator.add]


def echo(state: MessagesState) -> dict:
    """A deterministic model: quotes every user message so far."""
    said = [m.content for m in state["messages"] if isinstance(m, HumanMessage)]
    return {"messages": [AIMessage("You said: " + " | ".join(said))]}


def counting_echo(state: TripState) -> dict:
    return {**echo(state), "visits": 1}


def one_node(state: type, name: str, node) -> StateGraph:
    """START -> `name` -> END over `state`."""
    builder = StateGraph(state)
    builder.add_node(name, node)
    builder.add_edge(START, name)
    builder.add_edge(name, END)
    return builder


def plain_graph() -> StateGraph:
    return one_node(MessagesState, "echo", echo)


def custom_keys_graph() -> StateGraph:
    return one_node(TripState, "echo", counting_echo)


def chatbot_graph() -> StateGraph:
    """A model node of the graph's own, calling the offline model through `call_model`."""
    model = OfflineChatModel()

    def chatbot(state: MessagesState, config: RunnableConfig) -> dict:
        return call_model(model, state, config)

    return one_node(MessagesState, "chatbot", chatbot)


def subgraph_graph() -> StateGraph:
    return one_node(MessagesState, "delegate", one_node(MessagesState, "inner_echo", echo).compile())


GRAPHS = {"plain": plain_graph, "custom keys": custom_keys_graph, "subgraph": subgraph_graph}


def reference_run(builder: StateGraph, texts: list[str], branch_text: str) -> dict:
    """The same conversation on LangGraph's own InMemorySaver: three turns, then a branch from after turn 1."""
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "reference"}}
    after = []
    for text in texts:
        graph.invoke({"messages": [HumanMessage(text)]}, config)
        after.append(graph.get_state(config).config)
    graph.invoke({"messages": [HumanMessage(branch_text)]}, after[0])
    values = graph.get_state(config).values
    return {"messages": [(m.type, m.content) for m in values["messages"]], "values": values}


@pytest.mark.parametrize("kind", sorted(GRAPHS))
def test_a_foreign_graph_gets_threads_history_and_branches_like_langgraphs_own_saver(backend_url, make_agent, kind):
    texts, branch = ["I'm planning a trip!", "I'm headed to SF!", "Where am I going?"], "I'm headed to New York!"
    expected = reference_run(GRAPHS[kind](), texts, branch)
    agent = make_agent(backend_url, graph=GRAPHS[kind]())

    first = say(agent, texts[0])
    thread_id = outputs(first)["thread_id"]
    for text in texts[1:]:
        say(agent, text, thread_id=thread_id)
    say(agent, branch, thread_id=thread_id, checkpoint_id=outputs(first)["checkpoint_id"])

    state = agent.get_checkpoint_state(thread_id)
    got = [("human" if m["role"] == "user" else "ai", m["content"][0]["text"]) for m in state["messages"]]
    assert got == expected["messages"]
    history = agent.get_checkpoint_history(thread_id)
    assert [entry["message_count"] for entry in history] == [4, 6, 4, 2, 0]  # newest first, both branches
    assert [b["message_count"] for b in agent.list_branches(thread_id)] == [4, 6]
    if kind == "custom keys":
        visits = agent.graph.get_state({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}).values["visits"]
        assert visits == expected["values"]["visits"] == 2  # the branch's own count: turn 1, then the branch


def test_a_foreign_graph_takes_state_edits_edits_regenerations_and_export_import(backend_url, make_agent):
    agent = make_agent(backend_url, graph=plain_graph())
    first = say(agent, "I'm headed to SF!")
    thread_id, after1 = outputs(first)["thread_id"], outputs(first)["checkpoint_id"]
    say(agent, "Where am I going?", thread_id=thread_id)

    update = agent.update_checkpoint_state(thread_id, after1, [{"role": "user", "content": "I'm headed to Tokyo!"}])
    assert text_of(say(agent, "Where am I going?", thread_id=thread_id)) == (
        "You said: I'm headed to SF! | I'm headed to Tokyo! | Where am I going?"
    )
    assert agent.get_checkpoint_history(thread_id, limit=2)[1]["checkpoint_id"] == update["checkpoint_id"]

    state = agent.get_checkpoint_state(thread_id)
    edited = agent.predict(request("I'm headed to Rome!", thread_id=thread_id, edit_message_id=state["messages"][0]["id"]))
    assert text_of(edited) == "You said: I'm headed to Rome!"
    regenerated = agent.predict(request(None, thread_id=thread_id, regenerate=True))
    assert text_of(regenerated) == "You said: I'm headed to Rome!"

    document = agent.export_thread(thread_id)
    copy = agent.import_thread(document, thread_id="copy-of-" + thread_id[:8])
    assert contents(agent.get_checkpoint_state(copy["thread_id"])) == contents(agent.get_checkpoint_state(thread_id))
    assert len(agent.get_checkpoint_history(copy["thread_id"], limit=100)) == len(agent.get_checkpoint_history(thread_id, limit=100))
    fork = agent.fork_thread(thread_id, after1)
    assert text_of(say(agent, "And now?", thread_id=fork["thread_id"])) == "You said: I'm headed to SF! | And now?"


def contents(state: dict) -> list[tuple[str, str]]:
    return [(m["role"], m["content"][0]["text"]) for m in state["messages"]]


def test_a_foreign_graphs_model_node_gets_the_agents_context_window(make_agent):
    builder = chatbot_graph()
    agent = make_agent("memory://", graph=builder, instructions="Be terse.", max_context_tokens=400)
    thread = None
    for i in range(10):
        reply = say(agent, f"message {i}: " + "word " * 30, thread_id=thread)
        thread = outputs(reply)["thread_id"]
    entry = agent.get_checkpoint_history(thread, limit=1)[0]
    # Budgeted (not all 19 messages), the prompt first; what was sent is in the checkpoint's metadata.
    assert entry["model_input_messages"] < 19
    assert "[received" in text_of(reply) and "message 0" not in text_of(reply)
    assert entry["usage"]["input_tokens"] > 0
    # Outside a turn (the graph run directly), the node sends every message unchanged.
    direct = builder.compile().invoke({"messages": [HumanMessage("hi")]})
    assert "[received 1 message," in direct["messages"][-1].content


def test_a_foreign_graph_streams_its_model_tokens(make_agent):
    agent = make_agent("memory://", graph=chatbot_graph())
    events = list(agent.predict_stream(request("I'm headed to SF!")))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas).startswith("[offline model]")
    assert events[-1].type == "response.completed"


def test_graphs_the_agent_cannot_run_are_configuration_errors():
    from typing import TypedDict

    class Plan(TypedDict):
        steps: list[str]

    no_messages = StateGraph(Plan)
    no_messages.add_node("plan", lambda state: {"steps": []})
    no_messages.add_edge(START, "plan")
    with pytest.raises(ConfigurationError, match="no 'messages' key"):
        create_agent("memory://", model="offline", graph=no_messages, tracing=False)

    class Replaced(TypedDict):
        messages: list  # no reducer: every write would replace the conversation

    replaced = StateGraph(Replaced)
    replaced.add_node("n", lambda state: {})
    replaced.add_edge(START, "n")
    with pytest.raises(ConfigurationError, match="add_messages itself .* it has no reducer"):
        create_agent("memory://", model="offline", graph=replaced, tracing=False)

    def my_reducer(left: list, right: list) -> list:
        return add_messages(left, right)

    Wrapped = TypedDict("Wrapped", {"messages": Annotated[list, my_reducer]})  # noqa: UP013 - a local reducer

    wrapped = one_node(Wrapped, "n", lambda state: {})
    with pytest.raises(ConfigurationError, match="its reducer is 'my_reducer'"):
        create_agent("memory://", model="offline", graph=wrapped, tracing=False)
    # LangGraph's own add_messages with a format is the same merge (a partial of it): taken.
    formatted = TypedDict("Formatted", {"messages": Annotated[list, add_messages(format="langchain-openai")]})  # noqa: UP013
    create_agent("memory://", model="offline", graph=one_node(formatted, "n", lambda state: {}), tracing=False).close()
    no_entry = StateGraph(MessagesState)
    no_entry.add_node("n", echo)
    with pytest.raises(ConfigurationError, match="LangGraph cannot compile the graph: .*entrypoint"):
        create_agent("memory://", model="offline", graph=no_entry, tracing=False)
    with pytest.raises(ConfigurationError, match="not builder.compile"):
        create_agent("memory://", model="offline", graph=plain_graph().compile(), tracing=False)
    with pytest.raises(ConfigurationError, match="tools= is for the built-in graph"):
        create_agent("memory://", model="offline", graph=plain_graph(), tools=[get_weather], tracing=False)
    with pytest.raises(ConfigurationError, match="context_summary"):
        create_agent("memory://", model="offline", graph=plain_graph(), context_strategy="summarize", tracing=False)
    # A subgraph with a checkpointer of its own keeps one state per thread, whatever the branch.
    persistent = one_node(MessagesState, "delegate", one_node(MessagesState, "inner_echo", echo).compile(checkpointer=True))
    with pytest.raises(ConfigurationError, match="'delegate' is a subgraph compiled with checkpointer=True"):
        create_agent("memory://", model="offline", graph=persistent, tracing=False)
    create_agent("memory://", model="offline", graph=subgraph_graph(), tracing=False).close()


def test_async_and_failing_tools_run_on_every_path_and_tool_names_cannot_shadow_memory_tools(make_agent):
    async def forecast(city: str) -> str:
        """The forecast, from an async function."""
        return f"rain in {city}"

    def broken(city: str) -> str:
        """Always fails."""
        raise ValueError("the weather service is down")

    agent = make_agent("memory://", tools=[forecast, broken], memory_tools=False)
    ran = agent.predict(request('use forecast {"city": "Rome"}'))
    assert [i.model_dump().get("output") for i in ran.output if i.type == "function_call_output"] == ["rain in Rome"]
    failed = agent.predict(request('use broken {"city": "Rome"}'))
    [result] = [i.model_dump()["output"] for i in failed.output if i.type == "function_call_output"]
    assert "the weather service is down" in result and "the weather service is down" in text_of(failed)

    def save_memory(text: str) -> str:
        """Mine."""
        return text

    with pytest.raises(ConfigurationError, match="long-term memory tool"):
        create_agent("memory://", model="offline", tools=[save_memory], tracing=False)


def test_a_node_returning_dict_messages_answers_with_the_stored_ids(make_agent):
    graph = one_node(MessagesState, "n", lambda state: {"messages": [{"role": "assistant", "content": "dict reply"}]})
    agent = make_agent("memory://", graph=graph)
    reply = agent.predict(request("hi"))
    assert text_of(reply) == "dict reply"
    stored = agent.get_checkpoint_state(outputs(reply)["thread_id"])["messages"][-1]
    assert stored["id"] == reply.output[-1].id
    streamed = [e for e in agent.predict_stream(request("hi")) if e.type == "response.output_item.done"]
    assert [e.item["content"][0]["text"] for e in streamed] == ["dict reply"]


def test_a_subgraph_node_giving_back_the_whole_conversation_answers_with_the_new_messages_only(make_agent):
    # A compiled subgraph as a node returns its whole state: every earlier message again, unchanged.
    builder = chatbot_graph()
    builder.add_node("review", one_node(MessagesState, "noop", lambda state: {}).compile())
    builder.edges.discard(("chatbot", END))
    builder.add_edge("chatbot", "review")
    builder.add_edge("review", END)
    agent = make_agent("memory://", graph=builder)
    first = say(agent, "one")
    thread_id = outputs(first)["thread_id"]
    replies = [first, say(agent, "two", thread_id=thread_id), say(agent, "three", thread_id=thread_id)]
    stored = agent.get_checkpoint_state(thread_id)["messages"]
    answers = [m for m in stored if m["role"] == "assistant"]
    assert [[item.id for item in reply.output] for reply in replies] == [[m["id"]] for m in answers]
    streamed = [e for e in agent.predict_stream(request("four", thread_id=thread_id)) if e.type == "response.output_item.done"]
    assert len(streamed) == 1 and '"four"' in streamed[0].item["content"][0]["text"]


def test_a_node_rewriting_a_message_by_its_id_is_reported_as_stored(make_agent):
    def rewrite(state: MessagesState) -> dict:
        last = state["messages"][-1]
        return {"messages": [AIMessage("rewritten", id=last.id)]}

    builder = chatbot_graph()
    builder.add_node("rewrite", rewrite)
    builder.edges.discard(("chatbot", END))
    builder.add_edge("chatbot", "rewrite")
    builder.add_edge("rewrite", END)
    agent = make_agent("memory://", graph=builder)
    reply = say(agent, "hi")
    stored = agent.get_checkpoint_state(outputs(reply)["thread_id"])["messages"][-1]
    assert stored["content"][0]["text"] == "rewritten"
    assert reply.output[-1].id == stored["id"] and text_of(reply).endswith("rewritten")


def test_dict_messages_of_parallel_nodes_are_answered_in_the_stored_order(make_agent):
    from langgraph.types import interrupt

    def ask(name: str):
        return lambda state: {"messages": [("ai", f"{name} got {interrupt(f'question {name}')}")]}

    builder = chatbot_graph()
    builder.edges.discard((START, "chatbot"))
    builder.add_node("ask_a", ask("A"))
    builder.add_node("ask_b", ask("B"))
    builder.add_edge(START, "ask_a")
    builder.add_edge(START, "ask_b")
    builder.add_edge(["ask_a", "ask_b"], "chatbot")
    agent = make_agent("memory://", graph=builder)
    asked = say(agent, "go")
    thread_id, at = outputs(asked)["thread_id"], outputs(asked)["checkpoint_id"]
    first, second = (item["id"] for item in outputs(asked)["interrupts"])

    answered = agent.predict(request(thread_id=thread_id, checkpoint_id=at, resume={first: "yes", second: "no"}))
    stored = agent.get_checkpoint_state(outputs(answered)["thread_id"])["messages"]
    assert [item.id for item in answered.output] == [m["id"] for m in stored[1:]]
    assert [m["content"][0]["text"][:5] for m in stored[1:3]] == ["A got", "B got"]
    # Streamed: every message's output_item.done, in the stored order (two came in one step).
    events = agent.predict_stream(request(thread_id=thread_id, checkpoint_id=at, resume={first: "1", second: "2"}))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    texts = [item["content"][0]["text"] for item in done]
    assert texts[:2] == ["A got 1", "B got 2"] and texts[2].startswith("[offline model]") and len(texts) == 3
