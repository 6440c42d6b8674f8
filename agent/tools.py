"""The tools the model can call, run by LangGraph's `ToolNode`.

A tool never raises on bad input: it returns a string starting with `error: `,
so the model can read what went wrong and answer the user.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import datetime, timezone

from langchain_core.tools import tool

#: Longest expression `calculator` accepts, in characters.
MAX_EXPRESSION_CHARS = 200

#: Largest exponent `calculator` accepts, and the largest integer result, in bits.
MAX_EXPONENT = 100
MAX_INTEGER_BITS = 4096

_BINARY_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPERATORS: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class _Refused(Exception):
    """The expression is not plain arithmetic, or its result would be too large."""


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, such as "(2 + 3) * 4" or "2 ** 10 / 3".

    Supports numbers, parentheses, unary minus and + - * / // % **
    (exponents up to 100). Returns the result, or a message starting with
    "error: " when the expression is not plain arithmetic or cannot be computed.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: expression too long (at most {MAX_EXPRESSION_CHARS} characters)"
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):  # ValueError: a NUL character in the text.
        return "error: invalid syntax"
    try:
        result = _evaluate(tree.body)
    except _Refused as exc:
        return f"error: {exc}"
    except ZeroDivisionError:
        return "error: division by zero"
    except OverflowError:
        return "error: result too large"
    except RecursionError:
        return "error: expression too deeply nested"
    if isinstance(result, complex):
        return "error: the result is not a real number"
    if isinstance(result, float) and not math.isfinite(result):
        return "error: result too large"
    return str(result)


@tool
def clock() -> str:
    """The current date and time in UTC, in ISO 8601 (for example 2025-01-31T09:30:00+00:00)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _evaluate(node: ast.expr) -> int | float:
    """The value of `node`. Raises `_Refused` for anything but numbers and the operators above."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPERATORS:
        return _UNARY_OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        result = _BINARY_OPERATORS[type(node.op)](left, right)
        if isinstance(result, int) and result.bit_length() > MAX_INTEGER_BITS:
            raise _Refused("result too large")
        return result
    raise _Refused("unsupported expression")


def _check_power(base: int | float, exponent: int | float) -> None:
    # Checked before computing: 9 ** 9 ** 9 would take minutes and gigabytes.
    if abs(exponent) > MAX_EXPONENT:
        raise _Refused(f"exponent too large (at most {MAX_EXPONENT})")
    if isinstance(base, int) and isinstance(exponent, int) and base.bit_length() * exponent > MAX_INTEGER_BITS:
        raise _Refused("result too large")


#: Every tool the agent binds to its model.
TOOLS = [calculator, clock]
