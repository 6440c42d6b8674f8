"""What the offline model answers, computed independently of it: the one helper for tests that compare
exact replies (`agent.models.OfflineChatModel`); and the offline model recording what it was sent.

The count in the reply's note is `count_tokens_approximately` over the messages
it received and the bound tools' schemas; the quote and the note use the
model's public formatting functions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from agent.context.summaries import is_summary_request
from agent.memory.tools import memory_tools
from agent.models import OFFLINE_MARKER, OfflineChatModel, model_input_note, quote_user_messages
from agent.tools import TOOLS

#: The tools an agent binds to its model (the built-in tools and the memory tools, `agent.factory`),
#: as the offline model sees them (OpenAI function format). The schemas do not depend on the memories.
AGENT_TOOL_SCHEMAS: tuple[dict[str, Any], ...] = tuple(
    convert_to_openai_tool(tool) for tool in [*TOOLS, *memory_tools(None)]
)


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


#: The note that ends an offline reply (`agent.models.model_input_note`).
INPUT_NOTE = re.compile(r" \[received \d+ messages?, \d+ tokens, (?:no|with a) summary\]$")


def without_input_note(reply: str) -> str:
    """An offline reply without the note of what the model received, which ends it."""
    return INPUT_NOTE.sub("", reply)


def as_messages(pairs: Sequence[tuple[str, str]]) -> list[BaseMessage]:
    """LangChain messages for (role, text) pairs of roles `user` and `assistant`."""
    return [HumanMessage(text) if role == "user" else AIMessage(text) for role, text in pairs]


class RecordingOfflineModel(OfflineChatModel):
    """The offline model, keeping every message list it is called with in `calls` (oldest first).

    Copies made by `bind_tools` share the list, so the calls of an agent's bound model and of its
    summarizer all land in the instance given to `create_agent`.
    """

    calls: list = Field(default_factory=list)

    def _generate(self, messages, *args, **kwargs):
        self.calls.append(list(messages))
        return super()._generate(messages, *args, **kwargs)

    async def _agenerate(self, messages, *args, **kwargs):
        self.calls.append(list(messages))
        return await super()._agenerate(messages, *args, **kwargs)

    def _stream(self, messages, *args, **kwargs):
        self.calls.append(list(messages))
        yield from super()._stream(messages, *args, **kwargs)

    async def _astream(self, messages, *args, **kwargs):
        self.calls.append(list(messages))
        async for chunk in super()._astream(messages, *args, **kwargs):
            yield chunk

    def turn_calls(self) -> list[list[BaseMessage]]:
        """The calls that answered a turn (not summary requests)."""
        return [call for call in self.calls if not is_summary_request(call)]
