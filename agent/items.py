"""Stored LangChain messages as Responses API items: the output direction, built with MLflow's helpers.

A turn's new messages (`to_output_items`) and a checkpoint's stored messages
(`to_state_items`) leave the agent as Responses items. The items are built
with MLflow's helpers (`create_text_output_item`, `output_to_responses_items_stream`
…), so the format has one owner. This module is apart from `agent.messages`
(which reads request items, and checks them) because the result types
(`agent.types`) draw their messages with it and must not depend on request
parsing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from langchain_core.messages import BaseMessage

__all__ = ["STATUS_TYPES", "completed", "to_output_items", "to_state_items"]

#: Item types that have a `status` in OpenAI's schema (its item models require one).
STATUS_TYPES = frozenset({"message", "function_call", "function_call_output"})


def completed(item: dict) -> dict:
    """`item` with `status: "completed"` when its type has one: a stored item, or one that is whole."""
    return {**item, "status": "completed"} if item.get("type", "message") in STATUS_TYPES else item


def to_output_items(messages: Iterable[BaseMessage]) -> list[dict]:
    """Responses output items (`message`, `function_call`, `function_call_output`) for the turn's new messages.

    MLflow's items, with what OpenAI's schema adds (`openai.types.responses.ResponseOutputItem`): every
    item's `status` ("completed": a message is an item once it is whole), and a `function_call_output`'s
    `id` (its tool message's id, as `to_state_items` gives it).
    """
    from mlflow.types.responses import output_to_responses_items_stream

    items = []
    for message in messages:
        for event in output_to_responses_items_stream(iter([message])):
            item = completed(event.item)
            if item.get("type") == "function_call_output":
                item.setdefault("id", message.id or f"fco_{item['call_id']}")
            items.append(item)
    return items


def to_state_items(message: BaseMessage) -> list[dict]:
    """The Responses items of one stored message, each with an `id` a request can name.

    A user (or system) message is one `message` item with `input_text` content; an
    assistant message is a `message` item with its text (none when it only calls
    tools) followed by one `function_call` item per tool call; a tool result is a
    `function_call_output` item. Ids: the message's id, except that a
    `function_call` item's id is its `call_id`, as in a turn's output (MLflow's
    `output_to_responses_items_stream`).
    """
    from mlflow.types.responses import (
        create_function_call_item,
        create_function_call_output_item,
        create_text_output_item,
    )

    kind = message.type
    if kind == "ai":
        items = []
        if message.text or not message.tool_calls:
            items.append(create_text_output_item(text=message.text, id=message.id))
        for call in message.tool_calls:
            items.append(
                create_function_call_item(
                    id=call["id"], call_id=call["id"], name=call["name"], arguments=json.dumps(call["args"])
                )
            )
        return items
    if kind == "tool":
        return [{**create_function_call_output_item(call_id=message.tool_call_id, output=message.text), "id": message.id}]
    role = {"human": "user", "system": "system"}.get(kind, kind)
    return [{"type": "message", "role": role, "id": message.id, "content": [{"type": "input_text", "text": message.text}]}]
