"""Chat models: the factory that turns the `model` setting into a LangChain chat model, and the offline model.

`make_chat_model` turns the setting into a model: `"offline"` gives
`offline.OfflineChatModel` (deterministic, no network: tests and demos see
memory at work), any other name an OpenAI-compatible `ChatOpenAI`, imported
only then (`langchain_openai` and the `openai` client weigh more than the
rest of the agent, and the offline model needs none of it).

Modules: `offline` (the offline model), `markers` (the words the offline
model recognises in its input and marks its output with, shared with
`agent.context`, which writes the summary requests it answers), `pairing`
(the tool-call pairing rule a chat API holds a history to). None of them
imports `agent.context`: the model-input pipeline is built on the models, not
the other way round.
"""

from __future__ import annotations

import os
from typing import Any

from langchain_core.language_models import BaseChatModel

from agent.config import OFFLINE_MODEL_NAME, resolve_model_name
from agent.errors import ConfigurationError
from agent.models.markers import (
    CALCULATE_PREFIX,
    CALCULATOR_TOOL,
    FORGET_PREFIX,
    OFFLINE_MARKER,
    OFFLINE_SUMMARY_MARKER,
    RECALL_PREFIX,
    REMEMBER_PREFIX,
    USE_TOOL_PREFIX,
)
from agent.models.offline import (
    MAX_QUOTED_CHARS,
    MAX_QUOTED_MESSAGES,
    WORDS_PER_CHUNK,
    OfflineChatModel,
    check_tool_calls_answered,
    model_input_note,
    offline_summary,
    quote_user_messages,
    tool_call_id,
)

__all__ = [
    "CALCULATE_PREFIX",
    "CALCULATOR_TOOL",
    "FORGET_PREFIX",
    "KNOWN_MODEL_NAMES",
    "MAX_QUOTED_CHARS",
    "MAX_QUOTED_MESSAGES",
    "OFFLINE_MARKER",
    "OFFLINE_SUMMARY_MARKER",
    "RECALL_PREFIX",
    "REMEMBER_PREFIX",
    "USE_TOOL_PREFIX",
    "WORDS_PER_CHUNK",
    "OfflineChatModel",
    "check_tool_calls_answered",
    "make_chat_model",
    "model_input_note",
    "model_name_of",
    "offline_summary",
    "quote_user_messages",
    "tool_call_id",
]


def make_chat_model(model: str | BaseChatModel | None = None) -> BaseChatModel:
    """The chat model for the `model` setting.

    Args:
        model: a chat model (returned as is); `"offline"` for `OfflineChatModel`;
            another name for a streaming `ChatOpenAI`, which reads `OPENAI_API_KEY`
            and `OPENAI_BASE_URL` from the environment; `None` for
            `agent.config.resolve_model_name(None)` (offline unless a key or base URL is set).

    Returns:
        A LangChain chat model.

    Raises:
        ConfigurationError: `model` is an empty string or neither a string nor a chat model, a
            near miss of a known name (`"offlin"`: did you mean `"offline"`?), or `ChatOpenAI`
            refuses the configuration (for example no API key).
    """
    if isinstance(model, BaseChatModel):
        return model
    if model is None:
        model = resolve_model_name(None)
    if not isinstance(model, str) or not model.strip():
        raise ConfigurationError(
            f"model must be a non-empty model name or a chat model, not {model!r}", model=repr(model)
        )
    if model == OFFLINE_MODEL_NAME:
        return OfflineChatModel()
    _refuse_near_miss(model)
    return _make_openai_model(model)


def model_name_of(model: BaseChatModel) -> str:
    """A chat model's name for people and `/agent/info`: its `model_name` or `model` (ChatOpenAI has
    both), else its class name."""
    if isinstance(model, OfflineChatModel):
        return OFFLINE_MODEL_NAME
    for attribute in ("model_name", "model"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


#: Model names this agent knows itself; any other name goes to an OpenAI-compatible server.
KNOWN_MODEL_NAMES = (OFFLINE_MODEL_NAME,)


def _refuse_near_miss(name: str) -> None:
    # "offlin" would otherwise reach ChatOpenAI and fail with "Missing credentials", which hides the typo.
    # 0.85 keeps real names such as "offline-v2" (similarity 0.82) apart from typos ("offlin": 0.92).
    import difflib

    close = difflib.get_close_matches(name.strip().lower(), KNOWN_MODEL_NAMES, n=1, cutoff=0.85)
    if close:
        raise ConfigurationError(
            f"Unknown model {name!r}; did you mean {close[0]!r}? "
            "(Other names are OpenAI-compatible models, which need OPENAI_API_KEY or OPENAI_BASE_URL.)",
            model=name,
        )


def _make_openai_model(name: str) -> BaseChatModel:
    # Imported here: it costs over a second, and the offline model needs none of it.
    from langchain_openai import ChatOpenAI

    extra: dict[str, Any] = {}
    if os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
        # Local OpenAI-compatible servers (vLLM, Ollama) ignore the key, but the openai client requires one.
        extra["api_key"] = "unused"
    try:
        # stream_usage: token usage is recorded per turn; langchain-openai asks for it on streams only
        # from api.openai.com unless told to (stream_options.include_usage).
        return ChatOpenAI(model=name, streaming=True, stream_usage=True, **extra)
    except Exception as exc:  # openai.OpenAIError when no key is set; pydantic errors for bad values.
        raise ConfigurationError(f"Cannot configure OpenAI model {name!r}: {exc}", model=name) from None

