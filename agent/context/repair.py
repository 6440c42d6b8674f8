"""The repair that makes a history obey the tool-call pairing rule, for what the model is sent.

The rule is `agent.models.pairing` (every tool call answered by a tool message
right after it, every tool message answering such a call; re-exported here);
`close_unanswered_tool_calls` repairs a history's breaches for the model
input, and `agent.context.budget` cuts a history only where the rule holds.

Branching or editing state at a checkpoint where the assistant had asked for a
tool leaves a tool call without its result, and `update_checkpoint_state` can
store a tool result for a call nobody made; a chat API rejects either history
with HTTP 400, so every later turn of the thread would fail. The stored state is
never changed: only what the model is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage, ToolMessage

from agent.models.pairing import Step, ToolCallPairing, pairing_walk, tool_call_pairing

__all__ = [
    "UNANSWERED_TOOL_CALL",
    "Step",
    "ToolCallPairing",
    "close_unanswered_tool_calls",
    "pairing_walk",
    "tool_call_pairing",
]

#: What the model reads in place of a tool result that never arrived.
UNANSWERED_TOOL_CALL = "Not run: the conversation branched or was edited before this tool call finished."


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
