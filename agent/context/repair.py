"""The tool-call pairing rule, in one place, and the repair that makes a history obey it.

The rule (OpenAI's and Anthropic's; LangGraph calls a breach INVALID_CHAT_HISTORY):
every tool call of an assistant message is answered by a tool message among the
tool messages right after it, and every tool message answers such a call.
`pairing_walk` is the rule; `tool_call_pairing` reports a history's breaches
(the offline model refuses them, `agent.models.check_tool_calls_answered`),
`close_unanswered_tool_calls` repairs them for the model input, and
`agent.context.budget` cuts a history only where the rule holds.

Branching or editing state at a checkpoint where the assistant had asked for a
tool leaves a tool call without its result, and `update_checkpoint_state` can
store a tool result for a call nobody made; a chat API rejects either history
with HTTP 400, so every later turn of the thread would fail. The stored state is
never changed: only what the model is sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from langchain_core.messages import BaseMessage, ToolMessage

#: What the model reads in place of a tool result that never arrived.
UNANSWERED_TOOL_CALL = "Not run: the conversation branched or was edited before this tool call finished."

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


def close_unanswered_tool_calls(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """`messages` as a chat API accepts them: a tool message saying `UNANSWERED_TOOL_CALL` is inserted
    for every tool call left without a result, and a tool message that answers no open call is left out."""
    repaired: list[BaseMessage] = []
    for kind, item in pairing_walk(messages):
        if kind == "message":
            repaired.append(item)
        elif kind == "unanswered":
            repaired.append(ToolMessage(UNANSWERED_TOOL_CALL, tool_call_id=item))
    return repaired
