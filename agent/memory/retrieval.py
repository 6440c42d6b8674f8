"""How memories reach the model: the query a turn searches with, and the system message that lists them.

This module is light (LangChain messages only): `agent.context` builds the
message with it, and the offline model reads the message back (`memories_in`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import BaseMessage, SystemMessage

#: The first line of the system message that gives the model a user's memories.
MEMORY_HEADER = "Long-term memories of this user, saved in earlier turns (most relevant first; [memory_id] content):"

#: Characters of the new messages a turn searches its memories with (the end is kept).
MAX_QUERY_CHARS = 2000

_LINE = re.compile(r"^- \[(?P<memory_id>[^\]\s]+)\] (?P<content>.*)$")


def recall_query(new_messages: Sequence[BaseMessage], history: Sequence[BaseMessage]) -> str:
    """The text a turn's memories are searched with: its new user messages, else (a regenerated reply)
    the last user message of `history`; at most `MAX_QUERY_CHARS` characters, the latest kept."""
    texts = [message.text for message in new_messages if message.type == "human"]
    if not texts:
        texts = [message.text for message in reversed(history) if message.type == "human"][:1]
    return " ".join(texts)[-MAX_QUERY_CHARS:]


def memory_message(memories: Sequence) -> SystemMessage | None:
    """The system message that lists `memories` (`agent.types.Memory`, best first) for the model; None for none."""
    if not memories:
        return None
    lines = [f"- [{memory.memory_id}] {' '.join(memory.content.split())}" for memory in memories]
    return SystemMessage("\n".join([MEMORY_HEADER, *lines]))


def memories_in(messages: Sequence[BaseMessage]) -> list[tuple[str, str]]:
    """The `(memory_id, content)` pairs a model input's memory message lists, best first; [] without one."""
    for message in messages:
        if message.type == "system" and isinstance(message.content, str) and message.content.startswith(MEMORY_HEADER):
            return [
                (match["memory_id"], match["content"])
                for match in map(_LINE.match, message.content.splitlines()[1:])
                if match is not None
            ]
    return []
