"""What the offline model answers, computed independently of it: the one helper for tests that compare
exact replies (`agent.models.OfflineChatModel`).

The count in the reply's note is `count_tokens_approximately` over the messages
it received and the bound tools' schemas; the quote and the note use the
model's public formatting functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.utils.function_calling import convert_to_openai_tool

from agent.models import OFFLINE_MARKER, model_input_note, quote_user_messages
from agent.tools import TOOLS

#: The tools an agent binds to its model, as the offline model sees them (OpenAI function format).
AGENT_TOOL_SCHEMAS: tuple[dict[str, Any], ...] = tuple(convert_to_openai_tool(tool) for tool in TOOLS)


def received_tokens(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] = AGENT_TOOL_SCHEMAS) -> int:
    """The tokens the offline model (and the OpenAI stub) count for `messages` sent with `tools`."""
    return count_tokens_approximately(messages, tools=list(tools) or None)


def offline_reply(
    messages: Sequence[BaseMessage],
    *,
    tools: Sequence[dict[str, Any]] = AGENT_TOOL_SCHEMAS,
    summary: bool = False,
    prefix: str = "",
) -> str:
    """The offline model's text reply to `messages` (no tool call), with `prefix` (tool results) after its marker."""
    quote = quote_user_messages([m.text for m in messages if m.type == "human"])
    note = model_input_note(len(messages), received_tokens(messages, tools), summary=summary)
    return f"{OFFLINE_MARKER}{prefix}{quote} {note}"


def as_messages(pairs: Sequence[tuple[str, str]]) -> list[BaseMessage]:
    """LangChain messages for (role, text) pairs of roles `user` and `assistant`."""
    return [HumanMessage(text) if role == "user" else AIMessage(text) for role, text in pairs]
