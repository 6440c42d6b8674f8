"""agent.tools: the calculator computes plain arithmetic and refuses everything else; the clock tells UTC time."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from agent.tools import MAX_EXPRESSION_CHARS, TOOLS, calculator, clock


def calculate(expression: str) -> str:
    return calculator.invoke({"expression": expression})


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-2 ** 2", "-4"),
        ("-(3 - 5)", "2"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("1.5 * 4", "6.0"),
        ("10 ** 100", str(10**100)),
        ("  42  ", "42"),
    ],
)
def test_calculator_computes_arithmetic(expression, result):
    assert calculate(expression) == result


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "x + 1",
        "abs(-1)",
        "'a' * 3",
        "[1, 2]",
        "True + 1",
        "2 ^ 3",
        "1 < 2",
        "1 if 1 else 0",
        "(lambda: 1)()",
        "().__class__",
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expression):
    assert calculate(expression) == "error: unsupported expression"


@pytest.mark.parametrize("expression", ["9 ** 9 ** 9", "2 ** 1000000", "(10 ** 100) ** 50", "(2 ** 100) ** 100"])
def test_calculator_refuses_huge_powers_without_computing_them(expression):
    started = time.monotonic()
    assert calculate(expression).startswith("error: ")
    assert time.monotonic() - started < 1


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("1 / 0", "error: division by zero"),
        ("5 % 0", "error: division by zero"),
        ("1e308 * 10", "error: result too large"),
        ("10.0 ** 100 ** 2", "error: exponent too large (at most 100)"),
        ("(-8) ** 0.5", "error: the result is not a real number"),
        ("2 +", "error: invalid syntax"),
        ("", "error: invalid syntax"),
        ("1" * (MAX_EXPRESSION_CHARS + 1), f"error: expression too long (at most {MAX_EXPRESSION_CHARS} characters)"),
    ],
)
def test_calculator_explains_what_went_wrong(expression, error):
    assert calculate(expression) == error


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=MAX_EXPRESSION_CHARS + 20))
def test_calculator_never_raises_on_any_text(expression):
    result = calculate(expression)
    assert isinstance(result, str)
    if not result.startswith("error: "):
        float(result)  # Anything that is not an error is a number.


def test_clock_tells_the_current_utc_time_in_iso_8601():
    told = datetime.fromisoformat(clock.invoke({}))
    assert told.utcoffset() == timedelta(0)
    assert abs(datetime.now(timezone.utc) - told) < timedelta(seconds=5)


def test_tools_run_in_a_tool_node_by_name():
    assert [t.name for t in TOOLS] == ["calculator", "clock"]
    call = {"name": "calculator", "args": {"expression": "6 * 7"}, "id": "call_1", "type": "tool_call"}
    # ToolNode needs a graph runtime in langgraph 1.x, so it runs in a one-node graph.
    graph = StateGraph(MessagesState).add_node("tools", ToolNode(TOOLS))
    graph = graph.add_edge(START, "tools").add_edge("tools", END).compile()
    result = graph.invoke({"messages": [AIMessage(content="", tool_calls=[call])]})
    message = result["messages"][-1]
    assert (message.content, message.tool_call_id, message.name) == ("42", "call_1", "calculator")
