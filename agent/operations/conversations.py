"""The OpenAI dialect of thread state: response ids and conversations, mapped onto checkpoints and threads.

OpenAI's model of state is the agent's own: a response is an immutable
snapshot that later requests continue from (`previous_response_id`), several
requests may continue from the same one (siblings), and a conversation is a
line of responses with a current end. So:

* **A response id is a checkpoint id**: `resp_<checkpoint_id>`, for the
  checkpoint the turn wrote. Continuing from it is a branch from that
  checkpoint; its thread is found from the checkpoint (checkpoint ids are
  unique across threads; `ThreadStorage.thread_of_checkpoint`, one indexed read).
* **A conversation id is the thread id itself**, with no prefix: any thread,
  whichever API created it, is a conversation, and a conversation created with
  the Conversations API is a thread usable with `custom_inputs.thread_id`. A
  prefix would have made every id exist twice. Its items are the head's messages.
* **The items of a response** are the messages of its checkpoint that the turn
  wrote (those that first appeared in it, per the thread's tree), after the
  turn's last user message: what the model and its tools produced, then the
  questions the turn stopped at (`interrupt()`) as `mcp_approval_request` items,
  as its answer had them. Its input
  items are everything before them, the turn's own input included: the whole
  context that led to the response.
* **Ownership** is the agent's one rule (`access`): another user's response or
  conversation answers exactly as one that does not exist (404), never 403.

Lists use OpenAI's shape: `{"object": "list", "data", "first_id", "last_id",
"has_more"}` (plus the `limit`, `order` and `after` they were asked with), paged
with `after` (an item id) in `order` ("desc", OpenAI's default, or "asc").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest, NotFound, ResponseNotFound, shown_id
from agent.operations import branches
from agent.operations.access import authorize
from agent.storage import ThreadRecord, ThreadStorage, owned_by
from agent.validation import check_id

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from agent.types import CheckpointState

#: The prefix of a response id (`agent.dialect.RESPONSE_ID_PREFIX`).
RESPONSE_PREFIX = "resp_"

#: Page size bounds of the list endpoints (OpenAI's: 1 to 100, default 20).
MAX_PAGE = 100
DEFAULT_PAGE = 20


def response_id(checkpoint_id: str) -> str:
    """`resp_<checkpoint_id>`."""
    return f"{RESPONSE_PREFIX}{checkpoint_id}"


def checkpoint_of(response: str) -> str:
    """The checkpoint id a response id names.

    Raises:
        ResponseNotFound: `response` is not of the form `resp_<checkpoint_id>`.
    """
    checkpoint_id = response.removeprefix(RESPONSE_PREFIX) if isinstance(response, str) else ""
    if not response.startswith(RESPONSE_PREFIX) or not checkpoint_id:
        raise response_not_found(str(response))
    return checkpoint_id


def response_not_found(response: str) -> ResponseNotFound:
    return ResponseNotFound(f"Response {shown_id(response)} was not found.", response_id=response)


def thread_of_response(storage: ThreadStorage, checkpoint_id: str, *, user_id: str | None) -> ThreadRecord:
    """The record of the thread the checkpoint `checkpoint_id` belongs to, if `user_id` may use it.

    Raises:
        ResponseNotFound: no such checkpoint, or its thread is another user's (worded the same).
    """
    thread_id = storage.thread_of_checkpoint(checkpoint_id)
    record = storage.get_thread(thread_id) if thread_id is not None else None
    if not owned_by(record, user_id):
        raise response_not_found(response_id(checkpoint_id))
    return record


def split_turn(state: CheckpointState) -> tuple[list[BaseMessage], list[BaseMessage]]:
    """(the input that led to the checkpoint, what its turn produced), oldest first (module docstring)."""
    messages, here = list(state.messages), state.summary.checkpoint_id
    first_new = next((i for i, place in enumerate(state.places) if place.checkpoint_id == here), len(messages))
    last_user = max((i for i in range(first_new, len(messages)) if messages[i].type == "human"), default=first_new - 1)
    return messages[: last_user + 1], messages[last_user + 1 :]


def response_object(
    storage: ThreadStorage, response: str, *, user_id: str | None, model: str
) -> dict[str, Any]:
    """The Responses API object of the response `response` (`resp_<checkpoint_id>`).

    Out: `id`, `object` ("response"), `created_at` (Unix seconds), `status` ("completed", or
    "incomplete" for a turn another one interrupted), `model`, `output` (the turn's items, oldest
    first, then an `mcp_approval_request` item for each `interrupt()` the turn stopped at, as its answer
    had them), `previous_response_id` (the checkpoint the turn started from; None for a thread's first
    turn), `conversation` (`{"id": thread_id}`), `metadata` (the thread's), `tools`, `tool_choice` and
    `parallel_tool_calls` (`agent.dialect.RESPONSE_SETTINGS`) and `custom_outputs` (`thread_id`,
    `checkpoint_id`, `parent_checkpoint_id`, `response_id`).

    Raises:
        ResponseNotFound: unknown response id, or another user's.
    """
    from agent.dialect import RESPONSE_SETTINGS
    from agent.messages import to_output_items

    checkpoint_id = checkpoint_of(response)
    record = thread_of_response(storage, checkpoint_id, user_id=user_id)
    state = branches.get_checkpoint_state(storage, record.thread_id, checkpoint_id, user_id=user_id, alternatives=False)
    before, produced = split_turn(state)
    summary = state.summary
    parent = summary.parent_checkpoint_id
    return {
        "id": response_id(checkpoint_id),
        "object": "response",
        "created_at": _epoch(summary.timestamp),
        "status": "incomplete" if summary.extra.get("interrupted") else "completed",
        "model": model,
        # The turn's answer as it was sent: its messages, then the questions it stopped at (`interrupt()`),
        # each the same `mcp_approval_request` item (`PendingInterrupt.as_item`).
        "output": [*to_output_items(produced), *(interrupt.as_item() for interrupt in state.interrupts)],
        "previous_response_id": response_id(parent) if parent is not None and before else None,
        "conversation": {"id": record.thread_id},
        "metadata": dict(record.metadata),
        **RESPONSE_SETTINGS,
        "custom_outputs": {
            "thread_id": record.thread_id,
            "checkpoint_id": checkpoint_id,
            "parent_checkpoint_id": parent,
            "response_id": response_id(checkpoint_id),
        },
    }


def response_input_items(
    storage: ThreadStorage, response: str, *, user_id: str | None, after: str | None, limit: int, order: str
) -> dict[str, Any]:
    """A page of the items that led to the response (module docstring), in OpenAI's list shape.

    Raises:
        ResponseNotFound: unknown response id, or another user's.
        InvalidRequest: `after` is not an item of the list; a bad `limit` or `order`.
    """
    checkpoint_id = checkpoint_of(response)
    record = thread_of_response(storage, checkpoint_id, user_id=user_id)
    state = branches.get_checkpoint_state(storage, record.thread_id, checkpoint_id, user_id=user_id, alternatives=False)
    before, _ = split_turn(state)
    return page(_items(before), after=after, limit=limit, order=order)


def conversation_object(record: ThreadRecord) -> dict[str, Any]:
    """`{"id", "object": "conversation", "created_at" (Unix seconds), "metadata"}` for a thread."""
    return {
        "id": record.thread_id,
        "object": "conversation",
        "created_at": _epoch(record.created_at),
        "metadata": dict(record.metadata),
    }


def get_conversation(storage: ThreadStorage, conversation_id: str, *, user_id: str | None) -> ThreadRecord:
    """The thread `conversation_id`, if `user_id` may use it.

    Raises:
        ThreadNotFound: unknown, or another user's.
    """
    return authorize(storage.get_thread(conversation_id), conversation_id, user_id)


def conversation_items(
    storage: ThreadStorage, conversation_id: str, *, user_id: str | None, after: str | None, limit: int, order: str
) -> dict[str, Any]:
    """A page of the head's messages as Responses items, in OpenAI's list shape.

    Raises:
        ThreadNotFound: unknown conversation, or another user's.
        InvalidRequest: `after` is not an item of the head; a bad `limit` or `order`.
    """
    state = branches.get_checkpoint_state(storage, conversation_id, None, user_id=user_id, alternatives=False)
    return page(_items(state.messages), after=after, limit=limit, order=order)


def conversation_item(storage: ThreadStorage, conversation_id: str, item_id: str, *, user_id: str | None) -> dict[str, Any]:
    """The item `item_id` of the head's messages, as `conversation_items` lists it.

    Raises:
        ThreadNotFound: unknown conversation, or another user's.
        NotFound: no item of the head has that id (worded with the item and the conversation).
    """
    state = branches.get_checkpoint_state(storage, conversation_id, None, user_id=user_id, alternatives=False)
    for item in _items(state.messages):
        if item.get("id") == item_id:
            return item
    raise NotFound(
        f"Item {shown_id(item_id)} was not found in conversation {shown_id(conversation_id)} (among the messages of its head).",
        thread_id=conversation_id,
        item_id=item_id,
    )


def added_items(state: CheckpointState) -> dict[str, Any]:
    """The items a state update added (those that first appeared in its checkpoint), as one list page."""
    here = state.summary.checkpoint_id
    added = [message for message, place in zip(state.messages, state.places) if place.checkpoint_id == here]
    items = _items(added)
    return page(items, after=None, limit=max(len(items), 1), order="asc")


def page(items: Sequence[Mapping[str, Any]], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """One page of `items` (oldest first) in `order`, starting after the item with id `after`.

    Raises:
        InvalidRequest: a bad `order` or `limit`, or `after` names no item of the list.
    """
    if order not in ("asc", "desc"):
        raise InvalidRequest(f'order must be "asc" or "desc", got {order!r}')
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        check_id("after", after)
        start = next((i + 1 for i, item in enumerate(ordered) if item.get("id") == after), -1)
        if start < 0:
            raise InvalidRequest(f"after {after!r} is not an item of this list")
    data = [dict(item) for item in ordered[start : start + limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
        "limit": limit,
        "order": order,
        "after": after,
    }


def _items(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """The stored messages as the items of OpenAI's lists, each with its `status` (their models require one)."""
    from agent.items import completed, to_state_items

    return [completed(item) for message in messages for item in to_state_items(message)]


def _epoch(timestamp: str | None) -> int | None:
    """Unix seconds of an ISO 8601 timestamp (None stays None)."""
    return None if timestamp is None else int(datetime.fromisoformat(timestamp).timestamp())
