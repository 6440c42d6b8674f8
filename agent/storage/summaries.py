"""The summary written into each checkpoint's metadata, so history listings never read messages.

`message_count`, `last_message` (the last message's text, at most
`LAST_MESSAGE_CHARS`), `last_user_message` (the text of the last user message,
at most `LAST_MESSAGE_CHARS`), `next_nodes` and `ts` are computed once, when
the checkpoint is written; `get_checkpoint_history` then costs one index range
scan whatever the length of the thread.

What the model was sent comes from the `MODEL_INPUT_CHANNEL` state channel,
where the agent node records each turn's model input (`agent.context.window`
writes it; `model_input_summary` reads it): `model_input_messages`,
`model_input_tokens`, `summary_used` and `usage` for the checkpoint of the turn
that called the model, and `branch_usage` (every model call from the root to
this checkpoint) for every checkpoint after the branch's first turn. A state
channel carries these because it is inherited exactly like the messages: a
branch's checkpoints hold their own values and no other branch's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

#: Longest `last_message` / `last_user_message` kept in a checkpoint's summary, in characters.
LAST_MESSAGE_CHARS = 100

#: The state channel holding the record of the branch's last model input (see `model_input_summary`).
MODEL_INPUT_CHANNEL = "model_input"


def message_text(message: BaseMessage | None) -> str:
    """A one-line text for a message: its text, else the tools it calls."""
    if message is None:
        return ""
    text = message.text
    if not text and isinstance(message, AIMessage) and message.tool_calls:
        text = "[tool call: " + ", ".join(call["name"] for call in message.tool_calls) + "]"
    return text


def summarize(messages: Sequence[BaseMessage], checkpoint: Mapping[str, Any], node_triggers: Mapping[str, Sequence[str]]) -> dict:
    """The summary stored in a checkpoint's metadata, read by history listings.

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
    }


def model_input_summary(values: Mapping[str, Any], parent_id: str | None) -> dict:
    """The metadata about model input and token usage for a checkpoint with channel `values` and parent `parent_id`.

    The record in `values[MODEL_INPUT_CHANNEL]` (a dict) is `{"start", "messages", "tokens",
    "summary_used", "usage", "branch_usage"}`, where `start` is the checkpoint the recording turn
    started from. Only the checkpoint that turn wrote (whose parent is `start`) gets
    `model_input_messages`, `model_input_tokens`, `summary_used` and `usage` (the last omitted when
    the model reported none); later checkpoints of the branch that ran no model (state updates)
    inherit the record but not these keys. Every checkpoint with a record gets `branch_usage`.
    Token counts are ints; `usage` and `branch_usage` are `{"input_tokens", "output_tokens"}`.
    """
    record = values.get(MODEL_INPUT_CHANNEL)
    if not isinstance(record, Mapping):
        return {}
    out: dict[str, Any] = {"branch_usage": dict(record["branch_usage"])}
    if parent_id is not None and record.get("start") == parent_id:
        out["model_input_messages"] = record["messages"]
        out["model_input_tokens"] = record["tokens"]
        out["summary_used"] = bool(record["summary_used"])
        if record.get("usage") is not None:
            out["usage"] = dict(record["usage"])
    return out


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
