"""Conversions between Responses API items and LangChain messages, and the tool-call repair.

Input items (`message`, `function_call`, `function_call_output`) become chat
completion dicts through MLflow's `to_chat_completions_input`, then LangChain
messages through `convert_to_messages`; output messages become Responses items
through MLflow's `output_to_responses_items_stream` (`agent.items`, the
output direction, which the result types use too; re-exported here). This
module only adds validation (so bad items get `InvalidRequest` instead of a
KeyError deep in a library). The tool-call repair lives with the pairing rule
in `agent.context.repair` (re-exported here).

MLflow is imported on the first conversion, not with this module: any `import mlflow.<x>` runs
`mlflow/__init__` (about 2 s of CPU: its tracking client, pandas, `mlflow.genai`), and building
an agent imports this module long before a turn needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_messages

from agent.context.repair import UNANSWERED_TOOL_CALL, close_unanswered_tool_calls
from agent.errors import InvalidRequest
from agent.items import to_output_items, to_state_items
from agent.validation import check_id

__all__ = [
    "UNANSWERED_TOOL_CALL",
    "close_unanswered_tool_calls",
    "to_langchain",
    "to_output_items",
    "to_state_items",
]

ROLES = {"user", "assistant", "system", "developer"}
TEXT_PART_TYPES = {"input_text", "output_text", "text"}


def to_langchain(items: Sequence[Any]) -> list[BaseMessage]:
    """LangChain messages for Responses input items, in order.

    Accepts `message` items (role user/assistant/system/developer; content a
    string or a list of text parts), `function_call` and `function_call_output`
    items, as dicts or MLflow pydantic items.

    An item's `id`, when given, becomes its message's id, so that applying the
    messages with LangGraph's `add_messages` replaces the message with that id
    instead of adding a copy (ids come from `get_checkpoint_state` or a turn's
    output). A `message` item with an id is one message even when its content
    has several text parts (MLflow's conversion makes one message per part).
    Other keys (such as the `checkpoint_id`, `branch_checkpoint_id` and
    `siblings` of `get_checkpoint_state` items) are ignored.

    Raises:
        InvalidRequest: an item of another type, a missing or mistyped field, an `id` that is not an id.
    """
    plain = [item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else item for item in items]
    for index, item in enumerate(plain):
        _check_item(index, item)
    from mlflow.types.responses import to_chat_completions_input

    messages: list[BaseMessage] = []
    try:
        for item in plain:
            # MLflow reads a content list only from an item typed `message` (the type's default here).
            converted = to_chat_completions_input([{"type": "message", **item}])
            if item.get("id") is not None and converted:
                converted = [_one_message(converted)]
                converted[0]["id"] = item["id"]
            messages.extend(convert_to_messages(converted))
    except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
        raise InvalidRequest(f"Could not read the input items: {exc}") from None
    return messages


def _one_message(converted: list[dict]) -> dict:
    if len(converted) == 1:
        return dict(converted[0])
    # Several text parts of one message item: one message whose content keeps the parts.
    return {"role": converted[0]["role"], "content": [{"type": "text", "text": part["content"]} for part in converted]}


def _check_item(index: int, item: Any) -> None:
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object, got {type(item).__name__}")
    check_id(f"{where}.id", item.get("id"))
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        # isinstance first: `in` a set raises TypeError for an unhashable value.
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"{where}.role must be one of {sorted(ROLES)}, got {role!r}")
        content = item.get("content")
        if isinstance(content, str):
            return
        if not isinstance(content, list) or not content:
            raise InvalidRequest(f"{where}.content must be a string or a non-empty list of text parts")
        for part_index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if not (isinstance(kind, str) and kind in TEXT_PART_TYPES and isinstance(part.get("text"), str)):
                raise InvalidRequest(
                    f"{where}.content[{part_index}] must be a text part like {{'type': 'input_text', 'text': '...'}}"
                )
    elif kind == "function_call":
        for key in ("call_id", "name"):
            if not isinstance(item.get(key), str) or not item.get(key):
                raise InvalidRequest(f"{where}.{key} must be a non-empty string")
        if not isinstance(item.get("arguments", "{}"), str):
            raise InvalidRequest(f"{where}.arguments must be a JSON string")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not item.get("call_id"):
            raise InvalidRequest(f"{where}.call_id must be a non-empty string")
        if "output" not in item:
            raise InvalidRequest(f"{where}.output is required")
    else:
        raise InvalidRequest(
            f"{where}.type {kind!r} is not supported; use 'message', 'function_call' or 'function_call_output'"
        )
