"""Human in the loop: a graph's `interrupt()` over `predict`, `predict_stream` and their async twins, on
Postgres and SQLite: the question, the answer (`custom_inputs.resume`), the refusals (nothing written),
and time travel through interrupted checkpoints."""

from __future__ import annotations

import asyncio
import json
import operator
import threading
import time
from typing import Annotated

import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from agent import InterruptPending, InvalidRequest, ThreadNotFound
from agent.errors import TurnCancelled
from agent.graph import call_model
from agent.models import OfflineChatModel
from agent.operations.conversations import response_object
from tests.helpers.scenario import outputs, request, text_of

BOOK = 'use book_trip {"destination": "Tokyo"}'


@tool
def book_trip(destination: str) -> str:
    """Book a trip; the user approves it first."""
    answer = interrupt({"question": f"Book {destination}?"})
    return f"booked {destination}" if answer == "yes" else f"not booked: {answer}"


def approval_graph() -> StateGraph:
    model = OfflineChatModel().bind_tools([book_trip])

    def agent_node(state: MessagesState, config: RunnableConfig) -> dict:
        return call_model(model, state, config)

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent_node)
    builder.add_node("tools", ToolNode([book_trip]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def asker(name: str):
    """A node that asks `<name>?` and answers with what it was told (message id `answer-<name>`)."""

    def node(state: MessagesState) -> dict:
        return {"messages": [AIMessage(f"{name}: {interrupt(name + '?')}", id=f"answer-{name}")]}

    return node


def in_a_subgraph(sub: StateGraph) -> StateGraph:
    """A graph whose one node is `sub`, compiled."""
    builder = StateGraph(MessagesState)
    builder.add_node("sub", sub.compile())
    builder.add_edge(START, "sub")
    builder.add_edge("sub", END)
    return builder


def two_questions_graph() -> StateGraph:
    """Two nodes in one superstep, each asking its own question."""
    builder = StateGraph(MessagesState)
    builder.add_node("hotel", asker("hotel"))
    builder.add_node("flight", asker("flight"))
    builder.add_edge(START, "hotel")
    builder.add_edge(START, "flight")
    builder.add_edge("hotel", END)
    builder.add_edge("flight", END)
    return builder


@pytest.fixture
def approvals(backend_url, make_agent):
    return make_agent(backend_url, graph=approval_graph())


def head_and_count(agent, thread_id: str, user_id: str | None = None) -> tuple[str, int]:
    history = agent.get_checkpoint_history(thread_id, limit=100, user_id=user_id)
    return next(e["checkpoint_id"] for e in history if e["is_head"]), len(history)


def test_a_turn_stops_at_the_interrupt_and_resume_runs_the_tool(approvals):
    asked = approvals.predict(request(BOOK))
    custom = outputs(asked)
    items = [item.model_dump() for item in asked.output]
    assert [item["type"] for item in items] == ["function_call", "mcp_approval_request"]
    [pending] = custom["interrupts"]
    assert pending["value"] == {"question": "Book Tokyo?"} and pending["node"] == "tools"
    assert items[1]["id"] == pending["id"] and json.loads(items[1]["arguments"]) == pending["value"]
    thread_id = custom["thread_id"]
    head = approvals.get_checkpoint_history(thread_id, limit=1)[0]
    assert head["checkpoint_id"] == custom["checkpoint_id"] and head["next_nodes"] == ["tools"]

    done = approvals.predict(request(None, thread_id=thread_id, resume="yes"))
    assert [item.type for item in done.output] == ["function_call_output", "message"]
    assert done.output[0].model_dump()["output"] == "booked Tokyo"
    assert "booked Tokyo" in text_of(done)
    assert "interrupts" not in outputs(done) and outputs(done)["parent_checkpoint_id"] == custom["checkpoint_id"]
    assert approvals.get_checkpoint_history(thread_id, limit=1)[0]["next_nodes"] == []


def test_streamed_and_async_turns_carry_the_question_and_take_the_answer(approvals):
    events = list(approvals.predict_stream(request(BOOK)))
    done_items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item["type"] for item in done_items] == ["function_call", "mcp_approval_request"]
    last_done = [e for e in events if e.type == "response.output_item.done"][-1]
    custom = last_done.custom_outputs
    assert custom["interrupts"][0]["id"] == done_items[-1]["id"]
    assert events[-1].type == "response.completed"
    assert [item["type"] for item in events[-1].response["output"]] == ["function_call", "mcp_approval_request"]

    async def resume() -> list:
        return [event async for event in approvals.apredict_stream(request(None, thread_id=custom["thread_id"], resume="no"))]

    resumed = asyncio.run(resume())
    outputs_seen = [e.item.get("output") for e in resumed if e.type == "response.output_item.done"]
    assert "not booked: no" in outputs_seen

    again = asyncio.run(approvals.apredict(request(BOOK, thread_id=custom["thread_id"])))
    assert outputs(again)["interrupts"][0]["value"] == {"question": "Book Tokyo?"}


def test_refusals_write_nothing(approvals, backend_url, make_agent):
    asked = approvals.predict(request(BOOK, user_id="alice"))
    thread_id = outputs(asked)["thread_id"]
    before = head_and_count(approvals, thread_id, 'alice')

    with pytest.raises(InterruptPending, match="cancel_interrupts"):
        approvals.predict(request("never mind", thread_id=thread_id, user_id="alice"))
    with pytest.raises(InvalidRequest, match="not pending"):
        approvals.predict(request(None, thread_id=thread_id, user_id="alice", resume={"0" * 32: "yes"}))
    with pytest.raises(ThreadNotFound):
        approvals.predict(request(None, thread_id=thread_id, user_id="mallory", resume="yes"))
    with pytest.raises(InvalidRequest, match="empty input"):
        approvals.predict(request("yes", thread_id=thread_id, user_id="alice", resume="yes"))
    with pytest.raises(InvalidRequest, match="thread_id"):
        approvals.predict(request(None, user_id="alice", resume="yes"))
    assert head_and_count(approvals, thread_id, 'alice') == before

    root = outputs(asked)["parent_checkpoint_id"]
    with pytest.raises(InvalidRequest, match="has none"):
        approvals.predict(request(None, thread_id=thread_id, checkpoint_id=root, user_id="alice", resume="yes"))
    assert head_and_count(approvals, thread_id, 'alice') == before


def test_cancel_interrupts_sends_the_message_and_names_what_it_left(approvals):
    asked = approvals.predict(request(BOOK))
    custom = outputs(asked)
    moved_on = approvals.predict(request("Actually, no trip.", thread_id=custom["thread_id"], cancel_interrupts=True))
    assert outputs(moved_on)["cancelled_interrupts"] == [custom["interrupts"][0]["id"]]
    assert "Actually, no trip." in text_of(moved_on)
    # The open tool call is answered for the model (the pairing repair), never left dangling.
    assert approvals.get_checkpoint_history(custom["thread_id"], limit=1)[0]["next_nodes"] == []


def test_a_regenerate_or_edit_of_a_message_sent_past_a_question_leaves_it_unanswered_again(approvals):
    # A new-user trial's regenerate after a cancel_interrupts turn got InterruptPending, telling it to "send the
    # message with cancel_interrupts": a regenerate sends no message, and the message it reruns was sent so.
    asked = approvals.predict(request(BOOK))
    custom = outputs(asked)
    thread_id, waiting, [question] = custom["thread_id"], custom["checkpoint_id"], custom["interrupts"]
    moved_on = outputs(approvals.predict(request("Actually, no trip.", thread_id=thread_id, cancel_interrupts=True)))

    again = approvals.predict(request(None, thread_id=thread_id, regenerate=True))
    assert outputs(again)["parent_checkpoint_id"] == moved_on["parent_checkpoint_id"] == waiting  # a sibling answer
    assert outputs(again)["cancelled_interrupts"] == [question["id"]] and "Actually, no trip." in text_of(again)
    sent = next(m for m in approvals.get_checkpoint_state(thread_id)["messages"] if m.get("role") == "user"
                and "no trip" in json.dumps(m["content"]))  # fmt: skip
    edited = approvals.predict(request("No trip at all.", thread_id=thread_id, edit_message_id=sent["id"]))
    assert outputs(edited)["parent_checkpoint_id"] == waiting and outputs(edited)["cancelled_interrupts"] == [question["id"]]
    # The question still waits at its checkpoint; a new message there still has to say what to do about it.
    with pytest.raises(InterruptPending, match="cancel_interrupts"):
        approvals.predict(request("hello", thread_id=thread_id, checkpoint_id=waiting))
    assert "booked Tokyo" in text_of(approvals.predict(request(None, thread_id=thread_id, checkpoint_id=waiting, resume="yes")))


def test_time_travel_through_an_interrupt(approvals):
    asked = approvals.predict(request(BOOK))
    custom = outputs(asked)
    thread_id, waiting, root = custom["thread_id"], custom["checkpoint_id"], custom["parent_checkpoint_id"]
    yes = approvals.predict(request(None, thread_id=thread_id, resume="yes"))
    # Resume the same interrupted checkpoint again with another answer: a sibling branch.
    no = approvals.predict(request(None, thread_id=thread_id, checkpoint_id=waiting, resume="later"))
    assert outputs(no)["parent_checkpoint_id"] == outputs(yes)["parent_checkpoint_id"] == waiting
    assert "not booked: later" in text_of(no) and "booked Tokyo" in text_of(yes)
    assert sorted(b["checkpoint_id"] for b in approvals.list_branches(thread_id)) == sorted(
        [outputs(yes)["checkpoint_id"], outputs(no)["checkpoint_id"]]
    )
    # Branching from before the interrupt reruns to it: a new question at a new checkpoint.
    rerun = approvals.predict(request(BOOK, thread_id=thread_id, checkpoint_id=root))
    assert outputs(rerun)["interrupts"] and outputs(rerun)["checkpoint_id"] not in (waiting,)
    # Editing the user message across it behaves as on any checkpoint: the edit reruns to the question.
    first = approvals.get_checkpoint_state(thread_id, outputs(yes)["checkpoint_id"])["messages"][0]
    edited = approvals.predict(
        request(
            'use book_trip {"destination": "Oslo"}',
            thread_id=thread_id,
            checkpoint_id=outputs(yes)["checkpoint_id"],
            edit_message_id=first["id"],
        )
    )
    assert outputs(edited)["interrupts"][0]["value"] == {"question": "Book Oslo?"}


def test_several_pending_interrupts_are_answered_by_id(backend_url, make_agent):
    agent = make_agent(backend_url, graph=two_questions_graph())
    asked = agent.predict(request("plan it"))
    custom = outputs(asked)
    by_value = {pending["value"]: pending["id"] for pending in custom["interrupts"]}
    assert set(by_value) == {"hotel?", "flight?"}
    with pytest.raises(InvalidRequest, match="answer them by id"):
        agent.predict(request(None, thread_id=custom["thread_id"], resume="yes"))
    done = agent.predict(
        request(None, thread_id=custom["thread_id"], resume={by_value["hotel?"]: "Ritz", by_value["flight?"]: "LH 400"})
    )
    texts = sorted(m["content"][0]["text"] for m in agent.get_checkpoint_state(custom["thread_id"])["messages"][1:])
    assert texts == ["flight: LH 400", "hotel: Ritz"]


def test_the_checkpoint_state_and_the_fetched_response_name_the_node_of_each_of_several_questions(backend_url, make_agent):
    agent = make_agent(backend_url, graph=two_questions_graph())
    asked = agent.predict(request("plan it"))
    custom = outputs(asked)
    assert sorted((q["value"], q["node"]) for q in custom["interrupts"]) == [("flight?", "flight"), ("hotel?", "hotel")]
    # A client that reloads sees each question with its node, as the turn's answer gave it.
    assert agent.get_checkpoint_state(custom["thread_id"])["interrupts"] == custom["interrupts"]
    fetched = response_object(agent.storage, asked.id, user_id=None, model="offline")
    assert fetched["output"] == [item.model_dump(exclude_none=True) for item in asked.output]
    assert [(item["type"], item["name"]) for item in fetched["output"]] == [
        ("mcp_approval_request", q["node"]) for q in custom["interrupts"]
    ]


def test_a_resume_with_an_idempotency_key_is_answered_once(approvals):
    asked = approvals.predict(request(BOOK))
    thread_id = outputs(asked)["thread_id"]
    first = approvals.predict(request(None, thread_id=thread_id, resume="yes", idempotency_key="resume-1"))
    again = approvals.predict(request(None, thread_id=thread_id, resume="yes", idempotency_key="resume-1"))
    assert outputs(again)["checkpoint_id"] == outputs(first)["checkpoint_id"]
    assert len(approvals.get_checkpoint_history(thread_id, limit=100)) == 3  # root, question, answer: once


def test_resume_by_previous_response_id_and_export_import_keep_the_question(approvals):
    asked = approvals.predict(request(BOOK))
    custom = outputs(asked)
    document = approvals.export_thread(custom["thread_id"])
    writes = [w for c in document["checkpoints"] for w in c.get("pending_writes", []) if w["channel"] == "__interrupt__"]
    assert writes and writes[0]["value"] == {"type": "interrupts", "value": [{"id": custom["interrupts"][0]["id"], "value": {"question": "Book Tokyo?"}}]}
    copy = approvals.import_thread(document, thread_id="imported-" + custom["thread_id"][:8])
    resumed_copy = approvals.predict(request(None, thread_id=copy["thread_id"], resume="yes"))
    assert "booked Tokyo" in text_of(resumed_copy)
    # The OpenAI way: previous_response_id names the interrupted checkpoint.
    resumed = approvals.predict({"input": [], "previous_response_id": asked.id, "custom_inputs": {"resume": "no"}})
    assert "not booked: no" in text_of(resumed) and outputs(resumed)["thread_id"] == custom["thread_id"]


def test_the_checkpoint_state_shows_the_pending_question_to_a_client_that_reloads(approvals):
    asked = approvals.predict(request(BOOK))
    custom = outputs(asked)
    state = approvals.get_checkpoint_state(custom["thread_id"])
    assert state["interrupts"] == custom["interrupts"]
    done = approvals.predict(request(None, thread_id=custom["thread_id"], resume="yes"))
    assert "interrupts" not in approvals.get_checkpoint_state(custom["thread_id"])
    assert approvals.get_checkpoint_state(custom["thread_id"], custom["checkpoint_id"])["interrupts"] == custom["interrupts"]
    assert outputs(done)["checkpoint_id"] != custom["checkpoint_id"]


def test_openai_mcp_approval_response_items_answer_the_question(approvals):
    asked = approvals.predict(request(BOOK))
    custom = outputs(asked)
    answer = {"type": "mcp_approval_response", "approval_request_id": custom["interrupts"][0]["id"], "approve": False, "reason": "too far"}
    declined = approvals.predict({"input": [answer], "custom_inputs": {"thread_id": custom["thread_id"]}})
    assert "not booked: {'approve': False, 'reason': 'too far'}" in text_of(declined)
    before = head_and_count(approvals, custom["thread_id"])
    wrong = {**answer, "approval_request_id": "f" * 32}
    with pytest.raises(InvalidRequest, match="not pending|has none"):
        approvals.predict({"input": [wrong], "custom_inputs": {"thread_id": custom["thread_id"], "checkpoint_id": custom["checkpoint_id"]}})
    with pytest.raises(InvalidRequest, match="approval_request_id"):
        approvals.predict({"input": [{**answer, "approval_request_id": "nope"}], "custom_inputs": {"thread_id": custom["thread_id"]}})
    assert head_and_count(approvals, custom["thread_id"]) == before


def test_null_empty_and_partial_answers_are_refused_with_nothing_written(backend_url, make_agent, approvals):
    asked = approvals.predict(request(BOOK))
    thread_id = outputs(asked)["thread_id"]
    before = head_and_count(approvals, thread_id)
    for empty in (None, {}):
        with pytest.raises(InvalidRequest, match="resume must be an answer"):
            approvals.predict({"input": [], "custom_inputs": {"thread_id": thread_id, "resume": empty}})
    assert head_and_count(approvals, thread_id) == before

    two = make_agent(backend_url, graph=two_questions_graph())
    custom = outputs(two.predict(request("plan it")))
    first = custom["interrupts"][0]["id"]
    with pytest.raises(InvalidRequest, match="answer all of them in one resume"):
        two.predict(request(None, thread_id=custom["thread_id"], resume={first: "Ritz"}))
    assert head_and_count(two, custom["thread_id"]) == (custom["checkpoint_id"], 2)


def two_questions_in_one_node_graph() -> StateGraph:
    """One node that asks twice (LangGraph's "multiple interrupts in a single node")."""

    def plan(state: MessagesState) -> dict:
        city, day = interrupt("city?"), interrupt("day?")
        return {"messages": [AIMessage(f"plan: {city} on {day}", id=f"plan-{city}-{day}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("plan", plan)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", END)
    return builder


def question_ids(agent, thread_id: str) -> list[str]:
    return [q["id"] for q in agent.get_checkpoint_state(thread_id).get("interrupts", ())]


def test_a_fork_or_a_copy_waiting_at_a_question_takes_the_answer_by_the_id_it_lists(approvals):
    # The copies' checkpoints have new ids, from which LangGraph derives its tasks' and questions' ids: copied
    # as they were, their writes named tasks the graph never runs, and a resume by the listed id was asked
    # again under a new id, with nothing written (a success without a checkpoint_id).
    asked = outputs(approvals.predict(request(BOOK)))
    fork = approvals.fork_thread(asked["thread_id"], asked["checkpoint_id"])["thread_id"]
    copy = approvals.import_thread(approvals.export_thread(asked["thread_id"]), thread_id="copy-of-asked")["thread_id"]
    for thread_id in (fork, copy):
        [question] = question_ids(approvals, thread_id)
        # LangGraph itself sees the question the copy lists, as it does on the original thread.
        state = approvals.graph.get_state({"configurable": {"thread_id": thread_id}})
        assert [i.id for i in state.interrupts] == [question]
        done = outputs(approvals.predict(request(None, thread_id=thread_id, resume={question: "yes"})))
        assert done["checkpoint_id"] is not None and not done.get("interrupts")
        assert "booked Tokyo" in json.dumps(approvals.get_checkpoint_state(thread_id)["messages"])
    # The original still waits, with its own id.
    assert question_ids(approvals, asked["thread_id"]) == [asked["interrupts"][0]["id"]]


def test_a_node_that_asks_twice_keeps_the_first_answer_and_the_first_question_can_be_answered_again(
    backend_url, make_agent
):
    agent = make_agent(backend_url, graph=two_questions_in_one_node_graph())
    first = outputs(agent.predict(request("plan my day")))
    thread_id, waiting_city = first["thread_id"], first["checkpoint_id"]
    # The answer to the first question, and the second question, are a new checkpoint (before: nothing was
    # written, and the second question could not be answered).
    second = outputs(agent.predict(request(None, thread_id=thread_id, resume="Lisbon")))
    assert second["checkpoint_id"] not in (None, waiting_city) and second["parent_checkpoint_id"] == waiting_city
    [day] = second["interrupts"]
    assert day["value"] == "day?" and day["node"] == "plan"
    assert question_ids(agent, thread_id) == [day["id"]]
    assert [i.id for i in agent.graph.get_state({"configurable": {"thread_id": thread_id}}).interrupts] == [day["id"]]
    done = outputs(agent.predict(request(None, thread_id=thread_id, resume={day["id"]: "Sunday"})))
    assert "plan: Lisbon on Sunday" in json.dumps(agent.get_checkpoint_state(thread_id)["messages"][-1])
    assert done["parent_checkpoint_id"] == second["checkpoint_id"]
    # The checkpoint that asked for the city is as it was: answered again, it is a sibling branch.
    assert question_ids(agent, thread_id) == []
    again = outputs(agent.predict(request(None, thread_id=thread_id, checkpoint_id=waiting_city, resume="Porto")))
    assert again["parent_checkpoint_id"] == waiting_city and again["interrupts"][0]["value"] == "day?"
    outputs(agent.predict(request(None, thread_id=thread_id, resume="Monday")))
    assert "plan: Porto on Monday" in json.dumps(agent.get_checkpoint_state(thread_id)["messages"][-1])


def test_an_answer_no_task_takes_is_refused_with_nothing_written(approvals):
    # Writes copied without their graph (as a fork made them before) name tasks the graph never runs: the
    # answer is refused instead of being dropped under a success.
    from agent.operations.forks import fork_thread

    asked = outputs(approvals.predict(request(BOOK)))
    fork = fork_thread(approvals.storage, asked["thread_id"], asked["checkpoint_id"], new_thread_id=None, user_id=None)
    [question] = question_ids(approvals, fork.thread_id)
    history = approvals.get_checkpoint_history(fork.thread_id)
    with pytest.raises(InvalidRequest, match="did not take the answer"):
        approvals.predict(request(None, thread_id=fork.thread_id, resume={question: "yes"}))
    assert approvals.get_checkpoint_history(fork.thread_id) == history


def test_a_fork_of_two_waiting_nodes_names_each_and_takes_both_answers_by_its_ids(backend_url, make_agent):
    agent = make_agent(backend_url, graph=two_questions_graph())
    thread_id = outputs(agent.predict(request("go")))["thread_id"]
    fork = agent.fork_thread(thread_id)["thread_id"]
    questions = agent.get_checkpoint_state(fork)["interrupts"]
    assert sorted(q["node"] for q in questions) == ["flight", "hotel"]  # the copies' writes keep their task paths
    assert not {q["id"] for q in questions} & set(question_ids(agent, thread_id))  # ids of the fork's own tasks
    done = outputs(agent.predict(request(None, thread_id=fork, resume={q["id"]: f"{q['node']} ok" for q in questions})))
    assert done["checkpoint_id"] is not None and not done.get("interrupts")
    texts = json.dumps(agent.get_checkpoint_state(fork)["messages"])
    assert "hotel: hotel ok" in texts and "flight: flight ok" in texts


@pytest.mark.parametrize("answer", [{"yes"}, b"yes", float("nan"), {1: "yes"}, [{"ok": float("inf")}]])
def test_an_answer_that_is_not_a_json_value_is_refused_with_nothing_written(approvals, answer):
    # Over HTTP it cannot be anything else; from Python it reached the graph and was stored (and then could
    # not be exported).
    asked = outputs(approvals.predict(request(BOOK)))
    before = head_and_count(approvals, asked["thread_id"])
    with pytest.raises(InvalidRequest, match="resume must be a JSON value"):
        approvals.predict(request(None, thread_id=asked["thread_id"], resume=answer))
    assert head_and_count(approvals, asked["thread_id"]) == before


class Planned(MessagesState):
    log: Annotated[list, operator.add]


def parallel_askers_graph(asks: dict[str, int]) -> StateGraph:
    """Parallel nodes, each asking its number of questions in turn, with a reducer key of the graph's own."""

    def asker(name: str, count: int):
        def node(state: Planned) -> dict:
            got = [interrupt(f"{name}{n}?") for n in range(count)]
            return {"messages": [AIMessage(f"{name}: {got}", id=f"m-{name}")], "log": [name]}

        return node

    builder = StateGraph(Planned)
    for name, count in asks.items():
        builder.add_node(name, asker(name, count))
        builder.add_edge(START, name)
        builder.add_edge(name, END)
    return builder


def test_parallel_nodes_that_ask_different_numbers_of_questions_end_as_langgraph_ends_them(backend_url, make_agent):
    # A review found the copy of the start made from the checkpoint the run had advanced in place (a turn that
    # never returned, with a reducer key), and a finished node's answered question listed again (a thread stuck).
    agent = make_agent(backend_url, graph=parallel_askers_graph({"a": 3, "b": 1}))
    asked = outputs(agent.predict(request("hi")))
    thread_id, values = asked["thread_id"], []
    while asked.get("interrupts"):
        values.append(sorted(q["value"] for q in asked["interrupts"]))
        assert sorted(q["value"] for q in agent.get_checkpoint_state(thread_id).get("interrupts", ())) == values[-1]
        answers = {q["id"]: q["value"].upper() for q in asked["interrupts"]}
        asked = outputs(agent.predict(request(None, thread_id=thread_id, resume=answers)))
    assert values == [["a0?", "b0?"], ["a1?"], ["a2?"]]
    state = agent.graph.get_state({"configurable": {"thread_id": thread_id}}).values
    assert sorted(state["log"]) == ["a", "b"]
    assert sorted(m.content for m in state["messages"][1:]) == ["a: ['A0?', 'A1?', 'A2?']", "b: ['B0?']"]


def test_a_subgraph_that_asks_again_after_an_answer_is_refused_with_nothing_written(approvals, backend_url, make_agent):
    # Not supported yet: its own checkpoints live in a namespace named by its task, which a copy renames.
    def inner(state: MessagesState) -> dict:
        return {"messages": [AIMessage(f"s: {[interrupt('s0?'), interrupt('s1?')]}", id="m-s")]}

    sub = StateGraph(MessagesState)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    agent = make_agent(backend_url, graph=in_a_subgraph(sub))
    thread_id = outputs(agent.predict(request("hi")))["thread_id"]
    before = head_and_count(agent, thread_id)
    with pytest.raises(InvalidRequest, match="subgraph that asks again within one turn"):
        agent.predict(request(None, thread_id=thread_id, resume="S0"))
    assert head_and_count(agent, thread_id) == before


def test_a_fork_waiting_inside_a_subgraph_refuses_an_answer_by_id_and_takes_a_plain_one(backend_url, make_agent):
    # A copy holds the parent's checkpoints, not the subgraph's own (its namespace): answered, the subgraph starts
    # again and asks under a new id, so an answer by the listed id is taken by no task.
    sub = StateGraph(MessagesState)
    sub.add_node("s1", asker("s1"))
    sub.add_edge(START, "s1")
    sub.add_edge("s1", END)
    agent = make_agent(backend_url, graph=in_a_subgraph(sub))
    asked = outputs(agent.predict(request("hi")))
    fork = agent.fork_thread(asked["thread_id"])["thread_id"]
    [listed] = question_ids(agent, fork)
    before = head_and_count(agent, fork)
    with pytest.raises(InvalidRequest, match="a copy does not carry the subgraph's own checkpoints"):
        agent.predict(request(None, thread_id=fork, resume={listed: "S1"}))
    assert head_and_count(agent, fork) == before
    answered = agent.predict(request(None, thread_id=fork, resume="S1"))
    assert text_of(answered) == "s1: S1" and not outputs(answered).get("interrupts")


def test_a_subgraph_that_asks_in_a_later_step_of_its_own_is_refused_and_its_start_stays_as_it_was(backend_url, make_agent):
    # The subgraph writes a checkpoint of its own namespace between its two questions: that checkpoint became the
    # thread's head (which no read then found) and the start's question was replaced in place.
    sub = StateGraph(MessagesState)
    sub.add_node("s1", asker("s1"))
    sub.add_node("s2", asker("s2"))
    sub.add_edge(START, "s1")
    sub.add_edge("s1", "s2")
    sub.add_edge("s2", END)
    agent = make_agent(backend_url, graph=in_a_subgraph(sub))
    asked = outputs(agent.predict(request("hi")))
    before = (head_and_count(agent, asked["thread_id"]), question_ids(agent, asked["thread_id"]))
    with pytest.raises(InvalidRequest, match="subgraph that asks again within one turn"):
        agent.predict(request(None, thread_id=asked["thread_id"], resume="S1"))
    assert (head_and_count(agent, asked["thread_id"]), question_ids(agent, asked["thread_id"])) == before


def test_answering_an_earlier_question_again_does_not_apply_a_finished_nodes_output_twice(backend_url, make_agent):
    # From a checkpoint that is not the thread's latest, LangGraph runs the tasks that had finished again instead
    # of replaying their writes; the copy kept their first writes beside the new ones ("b" twice in `log`).
    agent = make_agent(backend_url, graph=parallel_askers_graph({"a": 2, "b": 0}))
    first = outputs(agent.predict(request("hi")))
    thread_id = first["thread_id"]
    second = outputs(agent.predict(request(None, thread_id=thread_id, resume="A0")))
    outputs(agent.predict(request(None, thread_id=thread_id, resume="A1")))
    again = outputs(agent.predict(request(None, thread_id=thread_id, checkpoint_id=first["checkpoint_id"], resume="B0")))
    assert again["parent_checkpoint_id"] == first["checkpoint_id"] and again["checkpoint_id"] != second["checkpoint_id"]
    outputs(agent.predict(request(None, thread_id=thread_id, resume="B1")))
    state = agent.graph.get_state({"configurable": {"thread_id": thread_id}}).values
    assert sorted(state["log"]) == ["a", "b"]
    assert sorted(m.content for m in state["messages"][1:]) == ["a: ['B0', 'B1']", "b: []"]


def test_a_resume_that_a_newer_turn_interrupts_keeps_nothing_and_the_question_still_waits(backend_url, make_agent):
    entered, gate = threading.Event(), threading.Event()

    def ask(state: MessagesState) -> dict:
        answer = interrupt("go?")
        entered.set()
        gate.wait(30)
        return {"messages": [AIMessage(f"got {answer}", id=f"m-{answer}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    agent = make_agent(backend_url, graph=builder)
    thread_id = outputs(agent.predict(request("hi")))["thread_id"]
    results: dict[str, object] = {}

    def resume(name: str, answer: str) -> None:
        try:
            results[name] = outputs(agent.predict(request(None, thread_id=thread_id, resume=answer, multitask_strategy="interrupt")))
        except Exception as exc:  # noqa: BLE001 - the result under test
            results[name] = exc

    first = threading.Thread(target=resume, args=("first", "yes"))
    first.start()
    assert entered.wait(20)
    second = threading.Thread(target=resume, args=("second", "yes, again"))
    second.start()
    claim = agent.storage.keeper.local(thread_id)
    deadline = time.monotonic() + 20
    while claim is not None and claim.cancel != "interrupt" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert claim is not None and claim.cancel == "interrupt"
    gate.set()
    first.join(30)
    second.join(30)
    assert isinstance(results["first"], TurnCancelled), results["first"]
    assert results["second"]["checkpoint_id"] is not None and not results["second"].get("interrupts")
    assert "got yes, again" in json.dumps(agent.get_checkpoint_state(thread_id)["messages"])
