"""The summary written into each checkpoint's metadata, so history listings never read messages.

`message_count`, `last_message` (the last message's text, at most
`LAST_MESSAGE_CHARS`), `last_user_message` (the text of the last user message,
at most `LAST_MESSAGE_CHARS`), `next_nodes` and `ts` are computed once, when
the checkpoint is written; `get_checkpoint_history` then costs one index range
scan whatever the length of the thread.

`kept_messages` is how many of the checkpoint's first messages are its parent's,
unchanged (the rest were written by this checkpoint: a turn's new messages, or
everything from the first message an edit replaced or removed). With it and
`message_count`, the tree of a thread's checkpoints tells where each message of
a checkpoint first appeared and which checkpoints are its alternatives
(`agent.operations.tree`) without reading a single message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on use: `agent.views` reads LAST_MESSAGE_CHARS without loading LangChain
    from langchain_core.messages import BaseMessage

#: Longest `last_message` / `last_user_message` kept in a checkpoint's summary, in characters.
LAST_MESSAGE_CHARS = 100


def message_text(message: BaseMessage | None) -> str:
    """A one-line text for a message: its text, else the tools it calls."""
    from langchain_core.messages import AIMessage

    if message is None:
        return ""
    text = message.text
    if not text and isinstance(message, AIMessage) and message.tool_calls:
        text = "[tool call: " + ", ".join(call["name"] for call in message.tool_calls) + "]"
    return text


def summarize(
    messages: Sequence[BaseMessage],
    checkpoint: Mapping[str, Any],
    node_triggers: Mapping[str, Sequence[str]],
    *,
    kept_messages: int = 0,
) -> dict:
    """The summary stored in a checkpoint's metadata, read by history listings and the branch tree.

    `kept_messages`: how many leading messages the checkpoint shares with its parent.

    `next_nodes` applies LangGraph's trigger rule to the checkpoint alone: a
    node runs next when one of its trigger channels holds a value whose version
    is newer than the one the node last saw.
    """
    values = checkpoint.get("channel_values", {})
    versions = checkpoint.get("channel_versions", {})
    seen = checkpoint.get("versions_seen", {})
    next_nodes = [
        node
        for node, triggers in node_triggers.items()
        if any(
            channel in values and _newer(versions.get(channel), seen.get(node, {}).get(channel))
            for channel in triggers
        )
    ]
    last_user = next((m for m in reversed(messages) if m.type == "human"), None)
    return {
        "message_count": len(messages),
        "last_message": _clip(message_text(messages[-1] if messages else None)),
        "last_user_message": _clip(message_text(last_user)),
        "next_nodes": next_nodes,
        "ts": checkpoint.get("ts"),
        "kept_messages": kept_messages,
    }


def _clip(text: str) -> str:
    # Postgres jsonb refuses NUL, and LangGraph would strip it anyway.
    return text[:LAST_MESSAGE_CHARS].replace("\x00", "")


def _newer(version: Any, seen: Any) -> bool:
    if version is None:
        return False
    if seen is None:
        return True
    # Versions are zero-padded strings (or ints), so both compare in order.
    return version > seen
