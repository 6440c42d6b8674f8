"""Summaries that belong to their branch: the record in the state, the message the model reads, the request
that makes one, and the rule that retires one after an edit.

A summary stands for the first `count` stored messages of a branch (`messages[:count]`,
whose last one has id `through`), without their system messages, which the
model input always keeps. It lives in the `context_summary` state channel
(`agent.state`): the agent node writes it into the checkpoint of the turn that
made it, later turns of the branch inherit it with the rest of the state, and
a branch from an older checkpoint starts from that checkpoint's state, which
never held it. The messages stay complete: history, `get_checkpoint_state` and
branching read them all; only the model input is reduced.

A summary is used only while it still describes its branch
(`ContextSummary.applies_to`): its last message is where it was, and the
newest user message is after it. Editing a message it covers in place
(`update_checkpoint_state` with an existing id, or `RemoveMessage`) retires it
(`edit_keeps_summary`); the next turn that needs one folds again.

The summary is written by the configured chat model from a request
(`summary_request`) of the previous summary, if any, and the turns to fold in,
with the tools defined but `tool_choice="none"` (Anthropic refuses tool calls
in a history without tool definitions). The offline model recognises the
request by its first message's id and answers with a deterministic summary
(`agent.models`). Both ids, and the checks for them (`is_summary_message`,
`is_summary_request`, re-exported here), are `agent.models.markers`, which the
model reads without importing this pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage, SystemMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from agent.models.markers import SUMMARY_MESSAGE_ID, SUMMARY_REQUEST_ID, is_summary_message, is_summary_request
from agent.state import CONTEXT_SUMMARY_CHANNEL

#: What precedes a summary's text in the model input; `{messages}` is how many messages it stands for.
SUMMARY_HEADER = "Summary of the {messages} earlier messages of this conversation, which are not repeated here: "
SUMMARY_INSTRUCTIONS = (
    "You keep a running summary of a conversation between a user and an assistant. Summarize the messages "
    "below, after this one, keeping names, places, dates, facts, decisions and open questions. If a summary "
    "of earlier messages is given, include what it says. Answer with the summary only, at most {words} words."
)
SUMMARY_PROMPT = "Write the summary of the conversation so far now."


@dataclass(frozen=True)
class ContextSummary:
    """A branch's summary of its first `count` messages (see the module docstring)."""

    text: str
    count: int
    """How many stored messages, from the first, it stands for (system messages among them are kept as they are)."""
    through: str
    """The id of the last of them, `messages[count - 1].id`."""
    messages: int
    """How many of them it replaces: the non-system ones."""

    @classmethod
    def from_state(cls, value: Any) -> ContextSummary | None:
        """The summary stored in the state channel, or None (nothing stored, or a retired summary)."""
        if not isinstance(value, Mapping):
            return None
        return cls(text=value["text"], count=value["count"], through=value["through"], messages=value["messages"])

    def as_state(self) -> dict[str, Any]:
        return asdict(self)

    def applies_to(self, messages: Sequence[BaseMessage], newest_user: int) -> bool:
        """Whether it still describes `messages[:count]`: its last message is in place and the newest user
        message (at index `newest_user`, -1 if none) is not among the messages it stands for."""
        if not 0 < self.count < len(messages) or messages[self.count - 1].id != self.through:
            return False
        return newest_user < 0 or newest_user >= self.count


def summary_message(summary: ContextSummary) -> SystemMessage:
    """The system message that stands for the summarized messages in the model input."""
    return SystemMessage(SUMMARY_HEADER.format(messages=summary.messages) + summary.text, id=SUMMARY_MESSAGE_ID)


def summary_request(previous: ContextSummary | None, messages: Sequence[BaseMessage], max_tokens: int) -> list[BaseMessage]:
    """The chat model's input for a summary of `previous` (if any) and `messages` (whole turns, tool calls paired)."""
    request: list[BaseMessage] = [
        SystemMessage(SUMMARY_INSTRUCTIONS.format(words=max(1, max_tokens * 3 // 4)), id=SUMMARY_REQUEST_ID)
    ]
    if previous is not None:
        request.append(summary_message(previous))
    request.extend(messages)
    request.append(HumanMessage(SUMMARY_PROMPT))
    return request


def edit_keeps_summary(values: Mapping[str, Any], updates: Sequence[Any]) -> bool:
    """Whether the summary in state `values` still holds once `updates` are merged into its messages:
    False when one of them replaces or removes a message the summary stands for (matched by id)."""
    summary = ContextSummary.from_state(values.get(CONTEXT_SUMMARY_CHANNEL))
    if summary is None:
        return True
    covered = {message.id for message in (values.get("messages") or [])[: summary.count]}
    for update in updates:
        update_id = getattr(update, "id", None)
        if update_id in covered or (isinstance(update, RemoveMessage) and update_id == REMOVE_ALL_MESSAGES):
            return False
    return True
