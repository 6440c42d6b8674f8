"""The OpenAI dialect of a request: the Responses API's own fields, read before MLflow's schema drops them.

**The OpenAI dialect.** A turn also takes the OpenAI Responses API's own state
fields at the top level of the request (as the `openai` client sends them),
read by `agent.requests.parse_request` (through `openai_fields`) before MLflow's request schema would drop them (`ItemIdsRequest`
keeps them for the HTTP server and `predict`):

| field | meaning |
|---|---|
| `input` as a string | one user message (`input="Hi"`) |
| `previous_response_id` | continue from that response's checkpoint (`resp_<checkpoint_id>`); the thread is the one it belongs to. Two requests with the same id make two sibling branches. Also accepted in `custom_inputs`. |
| `conversation` | a thread id (or `{"id": ...}`): continue from its head; an unknown one is ThreadNotFound |
| `instructions` | a system message for this turn only, never stored (OpenAI's rule). Also in `custom_inputs`. |
| `store` | `false`: the turn runs from the requested state and writes nothing. Also in `custom_inputs`. |
| `metadata` | stored with the thread when the turn creates it (as `custom_inputs.metadata`) |
| `background` | `true`: answer at once with the response id and `status: "queued"`; the turn runs on without the client (`agent.runs`). Also in `custom_inputs`. |

Fields that change nothing here are accepted with their harmless values
(`HARMLESS_FIELDS`: `model`, `stream`, `user`, `truncation: "auto"`, ...);
every other Responses API field (`temperature`, `tools`, `reasoning`,
`prompt`, ...) and any unknown top-level field is an
InvalidRequest naming it: never silently ignored. `previous_response_id`
together with `conversation` (or with `custom_inputs.thread_id` /
`checkpoint_id`) is refused too: a request names its start once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mlflow.types.responses import ResponsesAgentRequest

from agent.errors import InvalidRequest, shown_id
from agent.validation import check_id

#: The prefix of a response id: `resp_<checkpoint_id>` names the checkpoint a turn wrote.
RESPONSE_ID_PREFIX = "resp_"

#: Top-level request fields of MLflow's request schema (`ResponsesAgentRequest`).
SCHEMA_FIELDS = frozenset(ResponsesAgentRequest.model_fields)

#: OpenAI fields this agent honours, for a turn (module docstring).
OPENAI_TURN_FIELDS = frozenset({"previous_response_id", "conversation", "instructions", "store", "metadata", "background"})

#: Schema fields read as sent: outside strict mode pydantic turns `"store": "no"` into False, which would
#: silently decide whether a turn is written.
AS_SENT = frozenset({"store", "background"})
#: OpenAI fields `custom_inputs` may carry too (for `mlflow models serve`, whose schema drops top-level ones).
OPENAI_CUSTOM_KEYS = frozenset({"previous_response_id", "instructions", "store", "background"})

#: Fields that change nothing here, with the values accepted; any other value is refused.
#: `model`: the server's model answers (the `openai` client always sends one). `user`,
#: `safety_identifier`, `prompt_cache_key`: hints for OpenAI's abuse monitoring and caching;
#: `user` is NOT the caller's user_id (that comes from `custom_inputs`, `context` or the
#: trusted header). `truncation: "auto"`: what the context budget does (old turns dropped).
HARMLESS_FIELDS: dict[str, Callable[[Any], bool]] = {
    "model": lambda value: isinstance(value, str),
    "stream": lambda value: isinstance(value, bool),
    "stream_options": lambda value: isinstance(value, dict),
    "user": lambda value: isinstance(value, str),
    "safety_identifier": lambda value: isinstance(value, str),
    "prompt_cache_key": lambda value: isinstance(value, str),
    "truncation": lambda value: value == "auto",
    "tool_choice": lambda value: value == "auto",
    "parallel_tool_calls": lambda value: value is True,
    "tools": lambda value: value == [],
    "include": lambda value: value == [],
}

#: What a response says it ran with (OpenAI's `Response` requires them): the values above that ask for what the
#: agent does anyway (its own tools are the server's, not client tools).
RESPONSE_SETTINGS: dict[str, Any] = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}

#: Why a Responses API field is refused (any field neither honoured nor harmless is refused).
REFUSED_BECAUSE = {
    "tools": "the agent's tools are the server's; client-defined tools are not supported",
    "tool_choice": "the agent decides when to call its tools (only \"auto\")",
    "parallel_tool_calls": "the agent decides how to call its tools",
    "truncation": "the agent fits the context to its budget by dropping old turns (only \"auto\")",
    "include": "no extra output data is available (what a client re-renders after a turn is custom_inputs.include: [\"state\"])",
    "temperature": "sampling settings are the server's",
    "top_p": "sampling settings are the server's",
    "top_logprobs": "log probabilities are not available",
    "max_output_tokens": "output limits are the server's",
    "max_tool_calls": "tool limits are the server's",
    "reasoning": "reasoning settings are the server's",
    "text": "output formats other than plain text are not supported",
    "prompt": "stored prompts are not supported",
    "service_tier": "service tiers are not supported",
}


def openai_fields(raw: Mapping[str, Any], custom: Mapping[str, Any], *, turn: bool) -> dict[str, Any]:
    """The OpenAI dialect fields of a request, validated: {"previous_response_id": checkpoint id,
    "conversation": thread id, "instructions", "store", "metadata", "background"} (only those given).

    Raises:
        InvalidRequest: a field this agent cannot honour, an unknown top-level field, a malformed value,
            a field given both at the top level and in `custom_inputs` with different values, or an
            OpenAI field on an action other than a turn.
    """
    given: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SCHEMA_FIELDS - {*OPENAI_TURN_FIELDS, *HARMLESS_FIELDS, *REFUSED_BECAUSE} or value is None:
            continue
        if key in OPENAI_TURN_FIELDS:
            given[key] = value
        elif key in HARMLESS_FIELDS and HARMLESS_FIELDS[key](value):
            continue
        elif key in REFUSED_BECAUSE:
            raise InvalidRequest(
                f"The request field {key!r} is not supported: {REFUSED_BECAUSE[key]}; remove it", param=key
            )
        else:
            raise InvalidRequest(
                f"Unknown request field {key!r}; see the OpenAI Responses fields this agent accepts in its docs", param=key
            )
    for key in OPENAI_CUSTOM_KEYS & set(custom):
        if key in given and given[key] != custom[key]:
            raise InvalidRequest(f"{key} and custom_inputs.{key} disagree; send one")
        given[key] = custom[key]
    given = {key: value for key, value in given.items() if value is not None}
    if given and not turn:
        raise InvalidRequest(f"{sorted(given)} apply to turns only, not to custom_inputs.action {custom.get('action')!r}")
    out: dict[str, Any] = {}
    if "previous_response_id" in given:
        response_id = check_id("previous_response_id", given["previous_response_id"])
        if not response_id.startswith(RESPONSE_ID_PREFIX) or response_id == RESPONSE_ID_PREFIX:
            raise InvalidRequest(f"previous_response_id must be a response id ({RESPONSE_ID_PREFIX}...), got {shown_id(response_id)}")
        out["previous_response_id"] = response_id.removeprefix(RESPONSE_ID_PREFIX)
    if "conversation" in given:
        conversation = given["conversation"]
        if isinstance(conversation, dict):
            if set(conversation) != {"id"}:
                raise InvalidRequest('conversation must be a conversation id or {"id": <conversation id>}')
            conversation = conversation["id"]
        out["conversation"] = check_id("conversation", conversation)
    if "previous_response_id" in out and "conversation" in out:
        raise InvalidRequest("previous_response_id and conversation cannot be used together; send one")
    if "instructions" in given:
        if not isinstance(given["instructions"], str):
            raise InvalidRequest(f"instructions must be a string, got {type(given['instructions']).__name__}")
        if given["instructions"]:
            out["instructions"] = given["instructions"]
    if "store" in given:
        if not isinstance(given["store"], bool):
            raise InvalidRequest(f"store must be true or false, got {given['store']!r}")
        out["store"] = given["store"]
    if "background" in given:
        if not isinstance(given["background"], bool):
            raise InvalidRequest(f"background must be true or false, got {given['background']!r}")
        out["background"] = given["background"]
    if "metadata" in given:
        out["metadata"] = given["metadata"]  # validated with custom_inputs.metadata by the turn's parser
    return out


def start_from_dialect(
    dialect: Mapping[str, Any], thread_id: str | None, checkpoint_id: str | None, custom: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """(thread_id, checkpoint_id) once `previous_response_id` / `conversation` are applied."""
    if "previous_response_id" in dialect:
        if "thread_id" in custom or checkpoint_id is not None:
            raise InvalidRequest(
                "previous_response_id names the thread and the checkpoint to continue from; "
                "do not send custom_inputs.thread_id or checkpoint_id with it"
            )
        return None, dialect["previous_response_id"]
    if "conversation" in dialect:
        if "thread_id" in custom and custom["thread_id"] != dialect["conversation"]:
            raise InvalidRequest("conversation and custom_inputs.thread_id disagree; send one")
        return dialect["conversation"], checkpoint_id
    return thread_id, checkpoint_id
