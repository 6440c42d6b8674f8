"""Conversions between Responses API items and LangChain messages, the tool-call repair, and `with_ids`.

Input items (`message`, `function_call`, `function_call_output`) become chat
completion dicts through MLflow's `to_chat_completions_input`, then LangChain
messages through `convert_to_messages`; output messages become Responses items
through MLflow's `output_to_responses_items_stream` (`agent.items`, the
output direction, which the result types use too; re-exported here). This
module adds validation (so bad items get `InvalidRequest` instead of a
KeyError deep in a library) and the regrouping below. The tool-call repair
lives with the pairing rule in `agent.context.repair` (re-exported here).

**Tool calls and their results, paired by `call_id`.** The Responses API keeps
each tool call as its own `function_call` item and pairs a
`function_call_output` with its call by `call_id`, wherever it stands in the
input (two calls then their outputs in reverse order, or an output after an
intervening message). A chat model, in LangChain's convention, needs one
`AIMessage` holding the turn's `tool_calls` with the `ToolMessage`s answering
them right after it (`agent.models.pairing`). MLflow's per-item conversion
makes each `function_call` an assistant message of its own with the content
"tool call" (`mlflow.types.responses.responses_to_cc`, a placeholder for
models that refuse empty content), and keeps the items' order, so results that
do not follow their call at once would look unanswered to the model (and be
replaced by `UNANSWERED_TOOL_CALL`), and a client replaying our own output
items (the OpenAI Agents SDK's sessions send back the previous response's
`function_call`, `function_call_output` and `message` items) would store a
"tool call" message nobody wrote. So, after MLflow's conversion:

1. consecutive `function_call` items become one assistant message, joined to
   the assistant `message` item right before them if there is one, with no
   invented content: exactly the message our own output items were drawn from
   (`agent.items.to_state_items` splits it the same way back);
2. each `function_call_output` is placed among the results right after the
   message holding its call (the nearest call with that `call_id` before it,
   else the first after it), in the order the outputs were sent; an output
   whose call is not in the input goes first, where it can answer a call the
   thread's history left open (a turn refuses it if it answers none:
   `agent.operations.turns.start.check_tool_results`).

Every other item keeps its place, so the stored messages, what
`get_checkpoint_state` shows and what the model is sent are the items as sent,
grouped as a chat API needs them.

MLflow is imported on the first conversion, not with this module: any `import mlflow.<x>` runs
`mlflow/__init__` (about 2 s of CPU: its tracking client, pandas, `mlflow.genai`), and building
an agent imports this module long before a turn needs it.
"""

from __future__ import annotations

import uuid
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
    "with_ids",
]

ROLES = {"user", "assistant", "system", "developer"}
TEXT_PART_TYPES = {"input_text", "output_text", "text"}


def to_langchain(items: Sequence[Any]) -> list[BaseMessage]:
    """LangChain messages for Responses input items, in order, except that tool calls and their results
    are grouped by `call_id` as a chat model needs them (module docstring).

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

    try:
        grouped: list[dict] = []
        for item in plain:
            # MLflow reads a content list only from an item typed `message` (the type's default here).
            converted = to_chat_completions_input([{"type": "message", **item}])
            if item.get("type") == "function_call":
                _add_call(grouped, converted[0], item.get("id"))
                continue
            if item.get("id") is not None and converted:
                converted = [_one_message(converted)]
                converted[0]["id"] = item["id"]
            grouped.extend({**message, _FROM_CALL: False} for message in converted)
        return convert_to_messages(_results_after_calls(grouped))
    except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
        raise InvalidRequest(f"Could not read the input items: {exc}") from None


#: Marks a converted assistant message that holds `function_call` items (step 1 of the module docstring).
_FROM_CALL = "_from_function_call"


def _add_call(grouped: list[dict], converted: dict, item_id: str | None) -> None:
    """Step 1: the `function_call` item's call joins the assistant message right before it, or starts one."""
    calls = converted["tool_calls"]
    last = grouped[-1] if grouped else None
    if last is not None and last["role"] == "assistant" and (last[_FROM_CALL] or not last.get("tool_calls")):
        last["tool_calls"] = [*(last.get("tool_calls") or ()), *calls]
        last[_FROM_CALL] = True
        return
    # No "tool call" placeholder: the content is the empty string a model's own tool-only reply has.
    message = {"role": "assistant", "content": "", "tool_calls": list(calls), _FROM_CALL: True}
    if item_id is not None:
        message["id"] = item_id
    grouped.append(message)


def _results_after_calls(grouped: Sequence[dict]) -> list[dict]:
    """Step 2: every tool result right after the message holding its call (results for no call in the input
    first); every other message in its place."""
    holders: dict[str, list[int]] = {}  # call_id -> positions of the messages holding a call with that id
    for position, message in enumerate(grouped):
        for call in message.get("tool_calls") or ():
            holders.setdefault(call["id"], []).append(position)
    results: dict[int | None, list[dict]] = {}
    for position, message in enumerate(grouped):
        if message["role"] == "tool":
            found = holders.get(message["tool_call_id"], ())
            before = [p for p in found if p < position]
            holder = before[-1] if before else (found[0] if found else None)
            results.setdefault(holder, []).append(message)
    paired = list(results.get(None, ()))
    for position, message in enumerate(grouped):
        if message["role"] != "tool":
            paired.append(message)
            paired.extend(results.get(position, ()))
    return [{key: value for key, value in message.items() if key != _FROM_CALL} for message in paired]


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
            if not content and role == "user":
                # As an empty list of parts is: a user message with no text is a mistake, not a turn (OpenAI
                # refuses it too); an assistant's or a system's may be empty in a replayed conversation.
                raise InvalidRequest(f"{where}.content is empty: a user message needs some text")
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


def with_ids(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """`messages`, each with an id: a copy with a new one (a UUID4 string, as LangGraph's `add_messages`
    gives) where it is missing, the message itself where it has one."""
    return [m if m.id else m.model_copy(update={"id": str(uuid.uuid4())}) for m in messages]
