"""The words the offline model recognises in its input and marks its output with: one leaf both sides import.

The offline model (`agent.models.offline`) answers what the rest of the agent
sends it by these marks: a summary request is known by its first message's id
(`SUMMARY_REQUEST_ID`, written by `agent.context.summaries.summary_request`),
a summary in the input by its message's id (`SUMMARY_MESSAGE_ID`), and a user
message's first words ask for a tool call (`CALCULATE_PREFIX`,
`USE_TOOL_PREFIX`, the memory prefixes). Its replies start with
`OFFLINE_MARKER` (a summary with `OFFLINE_SUMMARY_MARKER`), so nobody takes
them for a real model's. The marks live here, not in `agent.context`, so the
model does not import the pipeline that calls it.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage

#: First words of every offline reply, so nobody mistakes it for a real model.
OFFLINE_MARKER = "[offline model] "
#: First words of a summary the offline model writes.
OFFLINE_SUMMARY_MARKER = "[offline summary] "

#: The tool the offline model calls, and the prefix of a user message that asks for it.
CALCULATOR_TOOL = "calculator"
CALCULATE_PREFIX = "calculate "
#: A human message "use NAME {json}" makes the offline model call the bound tool NAME.
USE_TOOL_PREFIX = "use "

#: How a user message (lower-cased) starts to make the offline model call a memory tool.
REMEMBER_PREFIX = "remember that "
#: ... to change the first (most relevant) memory it was given: `save_memory` with that memory's id.
CHANGE_PREFIX = "remember instead that "
RECALL_PREFIX = "what do you remember"
FORGET_PREFIX = "forget "

#: The id of the system message that carries a branch's summary in the model input.
SUMMARY_MESSAGE_ID = "tt-context-summary"
#: The id of the first message of a request for a summary.
SUMMARY_REQUEST_ID = "tt-context-summary-request"
#: The id of the first message of a request for a branch's memories (`agent.memory.extraction`).
EXTRACTION_REQUEST_ID = "tt-memory-extraction-request"


def is_summary_message(message: BaseMessage) -> bool:
    """Whether `message` carries a branch's summary (`agent.context.summaries.summary_message`)."""
    return message.type == "system" and message.id == SUMMARY_MESSAGE_ID


def is_summary_request(messages: Sequence[BaseMessage]) -> bool:
    """Whether `messages` is a request for a summary (`agent.context.summaries.summary_request`)."""
    return bool(messages) and messages[0].type == "system" and messages[0].id == SUMMARY_REQUEST_ID


def is_extraction_request(messages: Sequence[BaseMessage]) -> bool:
    """Whether `messages` asks for a branch's memories (`agent.memory.extraction.extraction_request`)."""
    return bool(messages) and messages[0].type == "system" and messages[0].id == EXTRACTION_REQUEST_ID
