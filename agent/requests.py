"""Requests parsed once, at the edge, into one typed object.

`parse_request` turns a Responses API request (an MLflow `ResponsesAgentRequest`
or a plain dict) into a `ParsedRequest`: the operation it asks for (see
`agent.operations.registry.ACTIONS`), the `Envelope` every action shares (thread, user,
checkpoint, policy, input messages) and the action's own arguments. Inner
layers never look at raw dicts again.

Envelope `custom_inputs` keys (all optional):

| key | type | meaning |
|---|---|---|
| `thread_id` | str | the thread; else `context.conversation_id`; else a new id |
| `checkpoint_id` | str | start the turn from this checkpoint (a branch) instead of the head |
| `user_id` | str | the caller; else `context.user_id` (both given: they must be equal) |
| `multitask_strategy` | `reject` / `enqueue` / `interrupt` / `rollback` / `steer` | overrides the agent's policy |
| `idempotency_key` | str | a retry with the same key returns the first result instead of running again (turns and `update_checkpoint_state`; other actions ignore it) |
| `action` | str | one of `agent.operations.registry.ACTIONS`; absent: a turn |

A turn also takes `resume` (the answer to the graph's pending `interrupt()`s; empty input) and
`cancel_interrupts` (send the input although a question waits): `agent.operations.interrupts`; and
`include: ["state"]` (the result carries what a client re-renders): `agent.operations.render`.
OpenAI's `mcp_approval_response` input items (`approval_request_id`, `approve`, `reason`) are
the same answer: `resume = {approval_request_id: {"approve": ..., "reason": ...}}`.

Each action adds its own keys (for example `limit` and `before` for
`get_checkpoint_history`). Any other key is refused, so a misspelt
`thread_id` cannot silently start a new conversation. So are `thread_id` and
`checkpoint_id` sent to an action that does not act on them (`list_threads`
with a `thread_id`, `get_checkpoint_history` with a `checkpoint_id`: page with
`before` instead), which would otherwise answer about something else than was
asked; the policy keys (`multitask_strategy`, `idempotency_key`) are ignored
by the actions they do not apply to.

**The OpenAI dialect** (the Responses API's own top-level fields: `previous_response_id`,
`conversation`, `instructions`, `store`, `metadata`, a string `input`) is read by `agent.dialect`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlflow.types.responses import ResponsesAgentRequest
from pydantic import PrivateAttr

from agent.config import AgentSettings
from agent.errors import InvalidRequest
from agent.messages import to_langchain
from agent.dialect import AS_SENT, OPENAI_CUSTOM_KEYS, SCHEMA_FIELDS, openai_fields, start_from_dialect
from agent.operations.envelope import Envelope
from agent.operations.idempotency import request_fingerprint
from agent.operations.operation import Operation, from_request
from agent.operations.registry import ACTION_NAMES, ACTIONS, TURN, TURN_ACTIONS
from agent.operations.turn_options import TURN_KEYS, parse_turn_options
from agent.validation import check_id, check_strategy, check_user_id, encoded_size

#: `custom_inputs` keys every action takes.
ENVELOPE_KEYS = frozenset({"thread_id", "checkpoint_id", "user_id", "multitask_strategy", "idempotency_key", "action"})


class ItemIdsRequest(ResponsesAgentRequest):
    """A `ResponsesAgentRequest` that remembers the `id` of each input item.

    MLflow's input `Message` type has no `id` field, so validating a request
    drops the id of every `message` item, and an item meant to replace the
    message with that id (LangGraph's `add_messages`) would be added as a copy.
    The agent's own edges (in-process `predict`, the Agent Server) build this
    instead (`keeping_item_ids`), and `parse_request` puts the ids back.
    `mlflow models serve` builds MLflow's own request, so there an edit in
    place goes through `custom_inputs.edit_message_id` instead.
    """

    _item_ids: list[Any] = PrivateAttr(default_factory=list)
    _extra_fields: dict[str, Any] = PrivateAttr(default_factory=dict)
    """The request's top-level fields MLflow's schema has no place for (`previous_response_id`, ...), and
    those in `AS_SENT` as they were sent."""


def with_string_input(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw`, with `input` given as a string (the `openai` client's `input="Hi"`) made one user message."""
    if isinstance(raw.get("input"), str):
        return {**raw, "input": [{"role": "user", "content": raw["input"]}]}
    return raw


def keeping_item_ids(raw: dict[str, Any]) -> ResponsesAgentRequest:
    """`ResponsesAgentRequest(**raw)` that keeps the input items' ids and the fields the schema drops
    (`raw` must already be valid)."""
    request = ItemIdsRequest(**raw)
    items = raw.get("input")
    request._item_ids = [item.get("id") if isinstance(item, dict) else None for item in items] if isinstance(items, list) else []
    request._extra_fields = {key: value for key, value in raw.items() if key not in SCHEMA_FIELDS or key in AS_SENT}
    return request


@dataclass(frozen=True)
class ParsedRequest:
    """One request: its action, the envelope, and the action's own arguments.

    `operation` is None for a turn (the default action); `args` is then its `TurnOptions`,
    else the operation's checked arguments.
    """

    operation: Operation | None
    envelope: Envelope
    args: Any = None

    @property
    def is_turn(self) -> bool:
        return self.operation is None


def parse_request(
    request: Any,
    settings: AgentSettings,
    *,
    user_id: str | None = None,
    idempotency_key: str | None = None,
    trusted_user: bool = False,
) -> ParsedRequest:
    """Validate a Responses request and return what it asks for.

    Args:
        request: a `ResponsesAgentRequest` or a dict of the same shape.
        settings: the agent's limits (`max_request_bytes`, `max_input_items`, `require_user_id`).
        user_id: a user id the host already authenticated (a trusted header); it wins over
            the request's, which must then agree with it.
        trusted_user: `user_id` is the only source of the caller (the server has a
            `user_id_header`): with `user_id` None the caller is anonymous, and a user_id
            in the request body is refused.
        idempotency_key: the `Idempotency-Key` HTTP header; `custom_inputs.idempotency_key`,
            if also given, must be equal.

    Raises:
        InvalidRequest: the request is larger than `max_request_bytes` (as UTF-8
            JSON) or has more than `max_input_items` items, holds text that is not
            valid Unicode, has ids that are not non-empty strings, unknown or
            mistyped `custom_inputs`, an unknown action, malformed input items,
            input where the action takes none (or none where it needs some),
            no user_id while one is required, or an idempotency key in the header and
            another in `custom_inputs`; an OpenAI field this agent cannot honour (named in
            the message), `previous_response_id` with `conversation`, a response id that
            does not start with `resp_`, `store: false` with an idempotency key.
    """
    raw = request.model_dump(exclude_none=True) if hasattr(request, "model_dump") else request
    if not isinstance(raw, dict):
        raise InvalidRequest(f"The request must be an object, got {type(raw).__name__}")
    if isinstance(request, ItemIdsRequest):
        raw = {**raw, **request._extra_fields}
    if isinstance(request, ItemIdsRequest) and isinstance(raw.get("input"), list):
        raw["input"] = [
            {**item, "id": item_id} if item_id is not None and isinstance(item, dict) else item
            for item, item_id in zip(raw["input"], request._item_ids + [None] * len(raw["input"]))
        ]
    custom_inputs = raw.get("custom_inputs")
    hint = ""
    if isinstance(custom_inputs, dict) and custom_inputs.get("action") == "import_thread":
        # Threads are not bounded in length; the command line reads a document of any size.
        hint = "; import a thread this large with `tt-agent import FILE` (no size limit), or raise max_request_bytes"
    check_request_size(raw, settings, hint=hint)
    # `is None`, not `or`: an empty list or string is the wrong type, not "none given".
    custom = {} if raw.get("custom_inputs") is None else raw["custom_inputs"]
    context = {} if raw.get("context") is None else raw["context"]
    if not isinstance(custom, dict):
        raise InvalidRequest("custom_inputs must be an object")
    if not isinstance(context, dict):
        raise InvalidRequest("context must be an object")

    name = action_name(custom)
    if not isinstance(name, str) or name not in ACTION_NAMES:
        raise InvalidRequest(f"Unknown action {name!r}; known: {sorted(ACTION_NAMES)}")
    operation = ACTIONS.get(name)
    keys = TURN_KEYS if operation is None else operation.keys
    input_rule = "optional" if operation is None else operation.input
    dialect = openai_fields(raw, custom, turn=name == "turn")
    if name == "turn":
        custom = {key: value for key, value in custom.items() if key not in OPENAI_CUSTOM_KEYS}
        if "metadata" in dialect:
            if "metadata" in custom and custom["metadata"] != dialect["metadata"]:
                raise InvalidRequest("metadata and custom_inputs.metadata disagree; send one")
            custom["metadata"] = dialect["metadata"]
    # A turn's OpenAI keys were taken out of `custom` above (`dialect`), but they are known all the same.
    known = ENVELOPE_KEYS | keys | (OPENAI_CUSTOM_KEYS if name == "turn" else frozenset())
    unknown = sorted(set(custom) - known)
    if unknown:
        raise InvalidRequest(f"Unknown custom_inputs {unknown} for the {name} action; known: {sorted(known)}")
    items = raw.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]  # the OpenAI client's `input="Hi"`
    if not isinstance(items, list):
        raise InvalidRequest("input must be a list of items or a string")
    if len(items) > settings.max_input_items:
        raise InvalidRequest(f"input has {len(items)} items; the limit is {settings.max_input_items}")
    if name == "turn":
        items, custom = _approval_responses(items, custom)
    messages = to_langchain(items)
    if input_rule == "required" and not messages:
        raise InvalidRequest(f"input is empty: the {name} action needs at least one message")
    if input_rule == "none" and messages:
        raise InvalidRequest(f"The {name} action takes no input items")

    thread_id = check_id("thread_id", custom.get("thread_id", context.get("conversation_id")))
    checkpoint_id = check_id("checkpoint_id", custom.get("checkpoint_id"))
    thread_id, checkpoint_id = start_from_dialect(dialect, thread_id, checkpoint_id, custom)
    store = dialect.get("store", True)
    key = _idempotency_key(custom, idempotency_key)
    if key is not None and not store:
        raise InvalidRequest("store: false writes nothing, so it cannot be combined with an idempotency key")
    background = dialect.get("background", False)
    if background and not store:
        raise InvalidRequest("background: true needs store: true (a background response is fetched later)")
    options = {k: custom[k] for k in keys if k in custom}
    if dialect.get("instructions") is not None:
        options["instructions"] = dialect["instructions"]
    envelope = Envelope(
        thread_id=thread_id,
        user_id=check_user_id(_user_id(custom, context, user_id, trusted_only=trusted_user), require=settings.require_user_id),
        checkpoint_id=checkpoint_id,
        multitask_strategy=check_strategy(custom.get("multitask_strategy")),
        idempotency_key=key,
        messages=messages,
        request_hash=None if key is None else request_fingerprint(name, thread_id, checkpoint_id, messages, options),
        thread_of_checkpoint="previous_response_id" in dialect,
        existing_thread="conversation" in dialect,
        instructions=dialect.get("instructions"),
        store=store,
        background=background,
    )
    if operation is None:
        return ParsedRequest(operation=None, envelope=envelope, args=parse_turn_options(envelope, custom))
    _refuse_unused_targets(operation, custom)
    if operation.needs_thread and envelope.thread_id is None:
        raise InvalidRequest(f"The {name} action needs custom_inputs.thread_id")
    if operation.needs_user and envelope.user_id is None:
        raise InvalidRequest(f"The {name} action needs a user_id")
    return ParsedRequest(operation=operation, envelope=envelope, args=from_request(operation, envelope, custom, settings))



#: The envelope keys that say what to act on, and the source (`operation.Source`) of an action that takes them.
TARGET_KEYS = (("thread_id", "thread"), ("checkpoint_id", "checkpoint"))

#: What to send instead of a target key the action does not take, where there is something.
_INSTEAD = {
    ("get_checkpoint_history", "checkpoint_id"): "; to list the checkpoints older than one, send before",
    ("list_threads", "thread_id"): "; to list the threads after one, send before (a thread id or a cursor)",
    ("compare_checkpoints", "checkpoint_id"): "; send checkpoint_a and checkpoint_b",
    ("list_memories", "checkpoint_id"): "; to read the memories as they were at a checkpoint, send as_of_checkpoint",
}


def _refuse_unused_targets(operation: Operation, custom: Mapping[str, Any]) -> None:
    """Refuse `custom_inputs.thread_id` or `checkpoint_id` sent to an action that does not act on it.

    Ignored, they answered about something else than was asked: `get_checkpoint_history` with a
    `checkpoint_id` listed the whole history, `list_threads` with a `thread_id` every thread. The
    policy keys (`multitask_strategy`, `idempotency_key`) stay ignored where they do not apply: a
    client may send them with every request (the `Idempotency-Key` header), and they do not change
    what the answer is about. A key sent as null is absent, as `before`, `idempotency_key` and a turn's
    `thread_id` are: a client that serializes a fixed shape sends every key, with null where it has none.
    """
    sources = {f.metadata["source"] for f in operation.fields}
    for key, source in TARGET_KEYS:
        if custom.get(key) is not None and source not in sources and key not in operation.keys:
            raise InvalidRequest(
                f"The {operation.name} action takes no {key}; nothing was read or written"
                f"{_INSTEAD.get((operation.name, key), '')}."
            )


def check_request_size(raw: Any, settings: AgentSettings, *, hint: str = "") -> None:
    """Refuse a request body (JSON values) larger than `settings.max_request_bytes` as compact UTF-8 JSON.

    Every route that takes a body applies it: `parse_request` (turns and actions) and the Conversations
    routes (`agent.serving.openai`). `hint` is appended to the message.

    Raises:
        InvalidRequest: the body is larger, or holds a lone surrogate or nests more than 100 levels
            (`agent.validation.encoded_size`).
    """
    size = encoded_size("The request", raw)
    if size > settings.max_request_bytes:
        raise InvalidRequest(f"The request is {size} bytes; the limit is {settings.max_request_bytes} bytes{hint}")


def action_name(custom_inputs: Mapping[str, Any]) -> Any:
    """The action `custom_inputs` asks for: its `action`, else a turn (`"turn"`); not checked here."""
    return custom_inputs.get("action", TURN)


def asks_for_turn(raw: Mapping[str, Any]) -> bool:
    """Whether the raw request (a JSON object, not yet parsed) asks for a turn, by `parse_request`'s rule:
    no `custom_inputs.action`, or `"turn"`, or an action that runs as a turn (`registry.TURN_ACTIONS`:
    `merge_branch`). For the server's turn admission (`serving.admission`), which decides before the
    request is parsed, and for tracing; a request that is neither a turn nor an action is refused by
    `parse_request` later."""
    custom = raw.get("custom_inputs")
    if custom is None:
        return True
    if not isinstance(custom, Mapping):
        return False
    action = action_name(custom)
    return isinstance(action, str) and action in TURN_ACTIONS  # anything else is refused by `parse_request`


def asks_for_background(raw: Mapping[str, Any]) -> bool:
    """Whether the raw request (a JSON object, not yet parsed) asks for a background run: `background: true` at
    the top level or in `custom_inputs` (`agent.dialect`). For the server's turn admission (`serving.admission`),
    which must not hold such a request in its queue (it answers `queued` at once); a malformed or contradictory
    value is refused by `parse_request` later."""
    custom = raw.get("custom_inputs")
    return raw.get("background") is True or (isinstance(custom, Mapping) and custom.get("background") is True)


def _approval_responses(items: list[Any], custom: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """OpenAI's answer to an `mcp_approval_request` item, `{"type": "mcp_approval_response",
    "approval_request_id", "approve", "reason"?}`, as `custom_inputs.resume`: the graph's interrupt with
    that id gets `{"approve": bool, "reason": str}` (`agent.operations.interrupts`)."""
    answers = [item for item in items if isinstance(item, dict) and item.get("type") == "mcp_approval_response"]
    if not answers:
        return items, custom
    if "resume" in custom:
        raise InvalidRequest("Send either mcp_approval_response items or custom_inputs.resume, not both")
    resume: dict[str, Any] = {}
    for index, item in enumerate(answers):
        where = f"mcp_approval_response item {index}"
        request_id, approve, reason = item.get("approval_request_id"), item.get("approve"), item.get("reason")
        unknown = sorted(set(item) - {"type", "id", "approval_request_id", "approve", "reason"})
        if unknown:
            raise InvalidRequest(f"{where} has unknown fields {unknown}")
        # An interrupt id, as LangGraph writes them, so the answer is always taken by id (never as a plain value).
        if not isinstance(request_id, str) or not re.fullmatch(r"[0-9a-f]{32}", request_id):
            raise InvalidRequest(
                f"{where}.approval_request_id must be the id of an mcp_approval_request item, got {request_id!r}"
            )
        if not isinstance(approve, bool):
            raise InvalidRequest(f"{where}.approve must be true or false, got {approve!r}")
        if reason is not None and not isinstance(reason, str):
            raise InvalidRequest(f"{where}.reason must be a string")
        resume[request_id] = {"approve": approve, **({"reason": reason} if reason is not None else {})}
    rest = [item for item in items if not (isinstance(item, dict) and item.get("type") == "mcp_approval_response")]
    return rest, {**custom, "resume": resume}


def _idempotency_key(custom: Mapping[str, Any], header: str | None) -> str | None:
    given = check_id("idempotency_key", custom.get("idempotency_key"))
    if header is None:
        return given
    header = check_id("the Idempotency-Key header", header)
    if given is not None and given != header:
        raise InvalidRequest("The Idempotency-Key header and custom_inputs.idempotency_key disagree; send one")
    return header


def _user_id(custom: Mapping[str, Any], context: Mapping[str, Any], trusted: str | None, *, trusted_only: bool = False) -> Any:
    # A host that authenticates its callers puts the user in `context.user_id`
    # (or a trusted header); a client could still send `custom_inputs.user_id`.
    # When several are given they must agree, so a client cannot speak for another user.
    given = [("trusted header", trusted)] if trusted is not None else []
    given += [(f"{where}.user_id", source["user_id"]) for where, source in (("context", context), ("custom_inputs", custom)) if "user_id" in source]
    if trusted_only and trusted is None and given:
        # Without the header the caller is anonymous; a body may not name a user in its place.
        raise InvalidRequest("This server takes the user_id from its trusted header only; the request had none")
    values = {repr(value) for _, value in given}
    if len(values) > 1:
        raise InvalidRequest(f"{' and '.join(where for where, _ in given)} disagree about the user_id; send one")
    return given[0][1] if given else None
