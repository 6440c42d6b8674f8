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

What the model was sent comes from the run's **turn report**: a dict under
`TURN_REPORT_KEY` in the run config's `configurable`, which the turn runner
creates and the agent node fills (`agent.context.window`). `model_input_summary`
turns it into `model_input_messages`, `model_input_tokens`, `summary_used` and
`usage` for the checkpoint the turn writes, and adds `usage` to the parent's
`branch_usage` (every model call from the root to this checkpoint), so a
branch's total is one checkpoint's metadata and every branch counts only its
own calls. Why not a state channel: a new channel value each turn is a blob row
and an index entry, about 600 bytes per turn on Postgres, which took the
storage benchmark over its target (3.2 times the message bytes instead of 2.6);
metadata alone adds about 250.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on use: `agent.views` reads LAST_MESSAGE_CHARS without loading LangChain
    from langchain_core.messages import BaseMessage

#: Longest `last_message` / `last_user_message` kept in a checkpoint's summary, in characters.
LAST_MESSAGE_CHARS = 100

#: The `configurable` key of a run's turn report (a dict; see the module docstring). `tt_` keys are not metadata.
TURN_REPORT_KEY = "tt_turn_report"


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


def model_input_summary(
    report: Mapping[str, Any] | None, parent_id: str | None, parent_metadata: Mapping[str, Any] | None
) -> dict:
    """The metadata about model input and token usage of a checkpoint with parent `parent_id`.

    Args:
        report: the run's turn report, `{"start", "messages", "tokens", "summary_used", "usage"}`
            once the agent node called the model (`start`: the checkpoint the turn started from), or
            None / empty. It describes this checkpoint only when `start` is `parent_id`.
        parent_metadata: the parent checkpoint's metadata (None for a root checkpoint).

    Returns:
        `model_input_messages`, `model_input_tokens`, `summary_used` and `usage` (omitted when the
        model reported none) from the report, and `branch_usage`: the parent's plus `usage`, for every
        checkpoint that has a parent. Token counts are ints; usages are `{"input_tokens", "output_tokens"}`.
    """
    out: dict[str, Any] = {}
    if parent_id is None:
        return out
    branch = dict((parent_metadata or {}).get("branch_usage") or {"input_tokens": 0, "output_tokens": 0})
    if report and report.get("start") == parent_id:
        out["model_input_messages"] = report["messages"]
        out["model_input_tokens"] = report["tokens"]
        out["summary_used"] = bool(report["summary_used"])
        usage = report.get("usage")
        if usage is not None:
            out["usage"] = dict(usage)
            branch = {key: int(branch.get(key, 0)) + int(usage.get(key, 0)) for key in ("input_tokens", "output_tokens")}
    out["branch_usage"] = branch
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
