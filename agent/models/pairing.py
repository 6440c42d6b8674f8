"""The tool-call pairing rule a chat API holds a history to, in one place.

The rule (OpenAI's and Anthropic's; LangGraph calls a breach INVALID_CHAT_HISTORY):
every tool call of an assistant message is answered by a tool message among the
tool messages right after it, and every tool message answers such a call.
`pairing_walk` is the rule; `tool_call_pairing` reports a history's breaches
(the offline model refuses them, `agent.models.offline.check_tool_calls_answered`),
and `agent.context.repair` repairs them for the model input. The rule is the
model's (what a chat API accepts), so it lives with the models, which the
model-input pipeline builds on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from langchain_core.messages import BaseMessage

__all__ = ["Step", "ToolCallPairing", "pairing_walk", "tool_call_pairing"]

Step = tuple[Literal["message"], BaseMessage] | tuple[Literal["stray"], BaseMessage] | tuple[Literal["unanswered"], str]


def pairing_walk(messages: Sequence[BaseMessage]) -> Iterator[Step]:
    """The pairing rule, as a walk over `messages` in order.

    Yields `("message", m)` for a message the rule allows where it is,
    `("stray", m)` for a tool message that answers no open tool call, and
    `("unanswered", call_id)` for each tool call left without a result, at the
    point where the call is closed (before the next message that is not a tool
    message, or at the end).
    """
    pending: list[str] = []  # calls of the last assistant message not answered yet, in order
    for message in messages:
        # The `type` field, not isinstance: pydantic message classes go through ABCMeta, several times slower.
        kind = message.type
        if kind == "tool":
            if message.tool_call_id in pending:
                pending.remove(message.tool_call_id)
                yield ("message", message)
            else:
                yield ("stray", message)
            continue
        for call_id in pending:
            yield ("unanswered", call_id)
        pending = [call["id"] for call in message.tool_calls] if kind == "ai" and message.tool_calls else []
        yield ("message", message)
    for call_id in pending:
        yield ("unanswered", call_id)


@dataclass(frozen=True)
class ToolCallPairing:
    """A history's breaches of the pairing rule (ids, in order of appearance)."""

    unanswered: tuple[str, ...] = ()
    """Tool call ids without a tool message right after their assistant message."""
    stray: tuple[str, ...] = ()
    """`tool_call_id`s of tool messages that answer no preceding open tool call."""

    @property
    def well_formed(self) -> bool:
        return not self.unanswered and not self.stray


def tool_call_pairing(messages: Sequence[BaseMessage]) -> ToolCallPairing:
    """The breaches of the pairing rule in `messages` (see `pairing_walk`)."""
    unanswered: list[str] = []
    stray: list[str] = []
    for kind, item in pairing_walk(messages):
        if kind == "unanswered":
            unanswered.append(item)
        elif kind == "stray":
            stray.append(item.tool_call_id)
    return ToolCallPairing(tuple(unanswered), tuple(stray))
