"""The graph's state: the branch's messages and its context summary.

* `messages`: every message of the branch, merged with LangGraph's `add_messages`
  semantics (append; a message whose id is already there replaces it;
  `RemoveMessage` deletes). Time travel reads these in full.
* `context_summary`: the branch's summary of its oldest turns
  (`agent.context.summaries`), written only by the agent node of this branch,
  so a branch from an older checkpoint never sees it.

The summary is a small dict: LangGraph's Postgres saver writes a non-primitive
channel value to a blob only when its version changes, so an unchanged summary
costs no storage per checkpoint. (What each turn sent the model is checkpoint
metadata, not state: `agent.storage.summaries`.)

Why `append_messages` instead of `add_messages` itself: a turn merges into the
message list three times (the input, the reply, and LangGraph's re-read for
the conditional edge), and `add_messages` builds an id index of the whole list
each time, so a small turn on a long thread cost many times one on a short
thread even when the model saw only its newest turns (docs/performance.md). `append_messages` gives the same result: it appends in
O(new messages) when none of the new messages replaces or removes one already
there (every turn), and otherwise calls `add_messages`. The list it returns,
`agent.storage.deltas.MessageList`, knows the ids it holds, and the message
cache keeps them, so the next turn of the branch starts with them too.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Annotated, Any, NotRequired, TypedDict

from langchain_core.messages import AnyMessage, BaseMessage, BaseMessageChunk, RemoveMessage
from langgraph.graph.message import add_messages

from agent.storage.deltas import MessageIds, MessageList

#: The state channel that holds the branch's context summary.
CONTEXT_SUMMARY_CHANNEL = "context_summary"

_message_id = attrgetter("id")


def _known_ids(messages: Any) -> MessageIds | None:
    """The ids of `messages` when it is a list of plain messages with distinct ids, else None."""
    if isinstance(messages, MessageList) and messages.ids is not None:
        return messages.ids
    if not isinstance(messages, list):
        return None
    # C-level passes: a per-item Python loop is what makes add_messages slow on long lists.
    if not all(issubclass(t, BaseMessage) and not issubclass(t, BaseMessageChunk) for t in set(map(type, messages))):
        return None
    ids = frozenset(map(_message_id, messages))
    if None in ids or len(ids) != len(messages):
        return None
    return MessageIds(ids)


def append_messages(left: Any, right: Any) -> MessageList:
    """`add_messages(left, right)`, in O(len(right)) when `right` only adds messages (see the module docstring)."""
    new = right if isinstance(right, list) else [right]
    known = _known_ids(left)
    if known is not None and not any(isinstance(m, RemoveMessage) for m in new):
        # Coerces dicts and chunks, assigns missing ids, and merges duplicates within `right`, as add_messages does.
        added = add_messages([], new)
        added_ids = frozenset(map(_message_id, added))
        if known.isdisjoint(added_ids):
            merged = MessageList(left, known.plus(added_ids))
            list.extend(merged, added)
            return merged
    merged = add_messages(left, right)
    return MessageList(merged, _known_ids(merged))


class AgentState(TypedDict):
    """The agent graph's state (see the module docstring)."""

    messages: Annotated[list[AnyMessage], append_messages]
    context_summary: NotRequired[dict[str, Any] | None]  # CONTEXT_SUMMARY_CHANNEL

