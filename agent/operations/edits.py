"""Where an edit or a regeneration starts, and what it sends; which messages a removal takes out.

These decide *what* to run; `agent.operations.turns` runs it like any turn
(claim, run with writes buffered, commit), so editing and regenerating stream,
run on the async path and follow the thread's multitask strategy for free.

* **Edit** message m of checkpoint X (the head unless `checkpoint_id` says
  otherwise): the turn starts from the checkpoint before m first appeared
  (`agent.operations.tree`), so its new checkpoint is a sibling of the one that
  wrote m, and the model sees X's messages before m, then the new input. That
  starting checkpoint normally holds exactly X's messages before m, and only
  the input is sent; when it does not (a message before m was replaced or
  removed later on X's branch, for example in place, which leaves m at its
  place: `agent.operations.tree`), the input first resets the state to X's
  messages before m (`RemoveMessage(REMOVE_ALL_MESSAGES)`), so the edit never
  brings back what X's branch had replaced.
* **Regenerate** at X: rerun the model on X's messages up to its last user
  message u (with `regenerate_message_id` a: the user message u that answer a
  of X answers, the last one before a; X's messages after u are left out).
  It starts from the newest checkpoint on X's branch that holds
  exactly those messages (u not answered yet), with no input; if there is none
  (the usual case: u and its answer were written by one turn), from the
  checkpoint before u first appeared, sending u again (the same message, same
  id). Either way the new answer is a sibling of the old one.
* **Remove** (`remove_message_ids`): LangGraph's `RemoveMessage` for each id.
  Removing an assistant message or one of its tool calls (a `function_call`
  item's id is its call id) also removes the tool results that answer it, so
  the history stays valid for chat APIs (OpenAI and Anthropic reject a tool
  result without its call). A tool result removed alone leaves its call
  unanswered, which `agent.context` repairs before each model call. A
  message the same update writes with the id of one to remove replaces it
  in place instead (`removals`).

An edit's input message may have no id (it gets a new one), the edited
message's id, or any other id except those of the messages before the
edited one, which the edit keeps: with one of those it would replace that
message instead of taking the edited one's place, or, where the start
resets the state, stand beside it (two messages with one id, which no
export of the thread could import). Such an edit is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from agent.errors import InvalidRequest
from agent.operations.tree import ThreadTree


@dataclass(frozen=True)
class TurnStart:
    """Where a turn starts and what it sends from there."""

    checkpoint_id: str
    messages: list[BaseMessage]


def position_of(messages: Sequence[BaseMessage], message_id: str, *, thread_id: str, checkpoint_id: str) -> int:
    """The index of the message with id `message_id`, or of the assistant message that made the tool call
    with that id (a `function_call` item's id).

    Raises:
        InvalidRequest: no message of the checkpoint has that id.
    """
    for index, message in enumerate(messages):
        if message.id == message_id:
            return index
    for index, message in enumerate(messages):
        if message.type == "ai" and any(call["id"] == message_id for call in message.tool_calls):
            return index
    raise _not_in_checkpoint(message_id, thread_id, checkpoint_id)


def plan_edit(
    tree: ThreadTree, chain: Sequence[str], messages: Sequence[BaseMessage], message_id: str, new: Sequence[BaseMessage]
) -> TurnStart:
    """The start of a turn that puts `new` in place of message `message_id` of the chain's last checkpoint.

    `messages` are that checkpoint's messages; `tree` must know `kept_messages` for the chain.

    Raises:
        InvalidRequest: the message is not in the checkpoint or is not a user message; an input message has
            the id of a message before it (module docstring); or there is no checkpoint before it (a
            `keep_latest` sweep kept only the checkpoint that holds it, or the thread was written before
            threads started with an empty root).
    """
    target = chain[-1]
    position = position_of(messages, message_id, thread_id=tree.thread_id, checkpoint_id=target)
    if messages[position].type != "human":
        # The turn's input is a user message; put in place of an answer, the model would see two user messages
        # in a row. An answer is changed in place with update_checkpoint_state instead.
        raise InvalidRequest(
            f"Message {message_id!r} is not a user message: a turn with edit_message_id edits user messages. "
            "To change another message in place, use update_checkpoint_state with edit_message_id. Nothing was written.",
            thread_id=tree.thread_id,
            checkpoint_id=target,
            message_id=message_id,
        )
    kept = {message.id for message in messages[:position]}
    taken = next((message.id for message in new if message.id in kept), None)
    if taken is not None:
        raise InvalidRequest(
            f"The input of an edit of message {message_id!r} has the id of message {taken!r}, which comes before "
            "it and which the edit keeps. Send the edited message with no id, or with the id of the message it "
            "edits. Nothing was written.",
            thread_id=tree.thread_id,
            checkpoint_id=target,
            message_id=taken,
        )
    return _start_before(tree, chain, messages, position, list(new), what=f"edit message {message_id!r}")


def plan_regenerate(
    tree: ThreadTree, chain: Sequence[str], messages: Sequence[BaseMessage], message_id: str | None = None
) -> TurnStart:
    """The start of a turn that answers a user message of the chain's last checkpoint again: the one that
    answer `message_id` answers (the last user message before it), or with None the last user message.

    Raises:
        InvalidRequest: `message_id` is not a message (or tool call) of the checkpoint, or not part of an
            assistant answer (an assistant message, tool call or tool result), or no user message comes before it; the checkpoint has no user message; or there is no
            checkpoint before it (see `plan_edit`).
    """
    target = chain[-1]
    end = len(messages)
    if message_id is not None:
        position = position_of(messages, message_id, thread_id=tree.thread_id, checkpoint_id=target)
        if messages[position].type not in ("ai", "tool"):
            # An answer (its text, tool calls and their results) is what a regeneration redoes; a user message is
            # changed with edit_message_id.
            raise InvalidRequest(
                f"Message {message_id!r} is not an assistant answer: regenerate_message_id names the answer to "
                "redo, or one of its tool calls or results (to change a user message, send edit_message_id). "
                "Nothing was written.",
                thread_id=tree.thread_id,
                checkpoint_id=target,
                message_id=message_id,
            )
        end = position
    last_user = next((i for i in range(end - 1, -1, -1) if messages[i].type == "human"), None)
    if last_user is None:
        answer = "" if message_id is None else f" before answer {message_id!r}"
        raise InvalidRequest(
            f"Checkpoint {target!r} of thread {tree.thread_id!r} has no user message{answer} to regenerate the "
            "answer to; nothing was written.",
            thread_id=tree.thread_id,
            checkpoint_id=target,
        )
    first = tree.first_seen(chain, len(messages))[last_user]
    # The newest checkpoint on the branch, from where the user message first appeared, that holds exactly the
    # messages up to it.
    holding = tree.newest_holding(chain, last_user + 1, since=first)
    if holding is not None:
        return TurnStart(chain[holding], [])
    answered = "the last answer" if message_id is None else f"answer {message_id!r}"
    return _start_before(
        tree, chain, messages, last_user, [messages[last_user]],
        what=f"regenerate {answered} (to user message {messages[last_user].id!r})",
    )  # fmt: skip


def _start_before(
    tree: ThreadTree, chain: Sequence[str], messages: Sequence[BaseMessage], position: int, new: list[BaseMessage], *, what: str
) -> TurnStart:
    """Start from the checkpoint before message `position` first appeared; send `new` in its place."""
    first = tree.first_seen(chain, len(messages))[position]
    if first == 0:
        raise _no_checkpoint_before(tree, chain[0], what)
    start = chain[first - 1]
    if tree.holds(chain, first - 1, position):
        return TurnStart(start, new)  # the start holds exactly the messages before `position`
    return TurnStart(start, [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages[:position], *new])


def removals(
    messages: Sequence[BaseMessage],
    ids: Sequence[str],
    *,
    thread_id: str,
    checkpoint_id: str,
    adding: Sequence[BaseMessage] = (),
) -> list[BaseMessage]:
    """The messages that, applied with `add_messages`, remove `ids` from `messages` (see the module docstring).

    An assistant message that loses some of its tool calls but keeps text or
    other calls is replaced by a copy without them (same id). `adding`: the
    messages the same update writes after these. One of them with the id of a
    message this would remove or copy replaces that message in place instead
    (what `add_messages` makes of a `RemoveMessage` followed by a message with
    its id), so it is left out here: an update's write holds each id once, as
    every message list of a thread document must (`agent.operations.transfer`).
    What the removal takes along (the results of a removed message's tool
    calls) still goes.

    Raises:
        InvalidRequest: an id names no message or tool call of the checkpoint, or the update would leave no message
            (the graph's edges need one).
    """
    by_id = {message.id: message for message in messages}
    calls = {call["id"] for message in messages if message.type == "ai" for call in message.tool_calls}
    gone: set[str] = set()
    gone_calls: set[str] = set()
    for message_id in ids:
        if message_id in by_id:
            gone.add(message_id)
            if by_id[message_id].type == "ai":
                gone_calls.update(call["id"] for call in by_id[message_id].tool_calls)
        elif message_id in calls:
            gone_calls.add(message_id)
        else:
            raise _not_in_checkpoint(message_id, thread_id, checkpoint_id)
    out: list[BaseMessage] = []
    left = 0
    for message in messages:
        if message.id in gone or (message.type == "tool" and message.tool_call_id in gone_calls):
            out.append(RemoveMessage(id=message.id))
            continue
        left += 1
        if message.type == "ai" and any(call["id"] in gone_calls for call in message.tool_calls):
            kept = [call for call in message.tool_calls if call["id"] not in gone_calls]
            if not kept and not message.text:
                out.append(RemoveMessage(id=message.id))
                left -= 1
                continue
            # langchain-openai also keeps the raw calls in additional_kwargs and would send those back.
            extra = dict(message.additional_kwargs)
            if "tool_calls" in extra:
                extra["tool_calls"] = [call for call in extra["tool_calls"] if call.get("id") not in gone_calls]
            out.append(message.model_copy(update={"tool_calls": kept, "additional_kwargs": extra}))
    replacing = {message.id for message in adding if message.id is not None}
    out = [message for message in out if message.id not in replacing]
    if left + len(adding) == 0:
        raise InvalidRequest(
            f"Removing {list(ids)} would leave checkpoint {checkpoint_id!r} of thread {thread_id!r} without messages; "
            "to start over, send a turn with the thread's root checkpoint as checkpoint_id. Nothing was written.",
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
        )
    return out


def _no_checkpoint_before(tree: ThreadTree, root: str, what: str) -> InvalidRequest:
    """The message first appeared in the thread's root: there is no checkpoint to branch from before it."""
    if tree.made_root_by_retention(root):
        return InvalidRequest(
            f"Cannot {what} of thread {tree.thread_id!r}: the message is in checkpoint {root!r}, which a "
            "keep_latest retention sweep kept as the thread's only checkpoint (it deleted the earlier ones), so "
            "there is no earlier checkpoint to branch from. Nothing was written. Still possible: new turns from "
            "this checkpoint; editing and regenerating messages written after the sweep; update_checkpoint_state "
            "to replace (edit_message_id) or remove (remove_message_ids) this checkpoint's messages in place, "
            "after which regenerate answers the last user message again; fork_thread.",
            thread_id=tree.thread_id,
            checkpoint_id=root,
        )
    return InvalidRequest(
        f"Cannot {what} of thread {tree.thread_id!r}: it was written before threads started with an empty "
        "root checkpoint, so there is no checkpoint before it; fork the thread or start a new one. "
        "Nothing was written.",
        thread_id=tree.thread_id,
    )


def _not_in_checkpoint(message_id: str, thread_id: str, checkpoint_id: str) -> InvalidRequest:
    return InvalidRequest(
        f"No message or tool call with id {message_id!r} in checkpoint {checkpoint_id!r} of thread {thread_id!r}; "
        "nothing was written.",
        thread_id=thread_id,
        checkpoint_id=checkpoint_id,
        message_id=message_id,
    )
