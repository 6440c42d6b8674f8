"""Counting tokens the way the configured model does where we can, and the default budget per model.

Two counters:

* **tiktoken**, through `ChatOpenAI.get_num_tokens_from_messages`, for the
  OpenAI models `langchain-openai` knows (`gpt-3.5-turbo*`, `gpt-4*`, `gpt-5*`,
  `o1*`, `o3*`, `o4*`), when tiktoken's encoding is available. tiktoken
  downloads its encoding files from the internet on first use (and keeps them
  in `TIKTOKEN_CACHE_DIR`); where that fails, or takes longer than
  `TIKTOKEN_PROBE_SECONDS` (its download has no timeout), this counter is not used.
* **approximate**, `langchain_core.messages.utils.count_tokens_approximately`
  with its defaults: per message ceil(characters / 4) + 3, where characters
  are the text, the role, the name, a tool message's `tool_call_id` and an
  assistant message's tool calls. It is used for every other model, the
  offline model and the OpenAI-compatible stub (which counts prompts by the
  same rule), and for tool schemas with either counter (langchain-openai does
  not count tools: ceil(characters of the JSON schemas / 4)).

`token_counter(model)` picks one once per agent; its `name` says which, and
the agent logs it at start-up (`agent.context.window`). It imports neither
`langchain_openai` nor tiktoken to find out (they would be most of a cold
agent's start-up after LangGraph): a model of `langchain_openai`'s classes exists only once that library is
imported, so a process that has not imported it has no OpenAI model to count
for, and the offline model loads no tokenizer library.

Default `max_context_tokens` (`default_max_context_tokens`): half the context
window of a known OpenAI model, at most `MAX_DEFAULT_TOKENS`, which leaves room
for the reply and for the approximate counter's error (text in scripts such as
Chinese or Japanese has about one token per character, four times the estimate);
`UNKNOWN_MODEL_TOKENS` for the offline model and any model not in the table.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.messages.utils import count_tokens_approximately

#: Seconds to wait for tiktoken to load its encoding before counting approximately instead.
TIKTOKEN_PROBE_SECONDS = 3.0

#: Context windows (tokens) of OpenAI models by name prefix, most specific first (OpenAI's model pages).
CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
)
#: The default budget's ceiling: a larger window is not filled by default (every turn pays for what it sends).
MAX_DEFAULT_TOKENS = 64_000
#: The default budget for models not in `CONTEXT_WINDOWS` (the offline model, other OpenAI-compatible servers).
UNKNOWN_MODEL_TOKENS = 8_000

APPROXIMATE = "approximate"


@dataclass(frozen=True)
class TokenCounter:
    """Counts the tokens of messages; counts of disjoint lists add up (plus `overhead` once per call)."""

    name: str
    """`approximate`, or `tiktoken <encoding>`."""
    count: Callable[[Sequence[BaseMessage]], int]
    """Tokens of a list of messages, without `overhead`."""
    overhead: int = 0
    """Tokens every model call adds once (tiktoken: 3, the reply's priming)."""


def approximate_counter() -> TokenCounter:
    return TokenCounter(APPROXIMATE, lambda messages: count_tokens_approximately(messages) if messages else 0)


def tool_tokens(schemas: Sequence[dict[str, Any]]) -> int:
    """Tokens of tool schemas (OpenAI function format) as sent with a request: ceil(JSON characters / 4)."""
    return count_tokens_approximately([], tools=list(schemas)) if schemas else 0


def token_counter(model: BaseChatModel) -> TokenCounter:
    """tiktoken through the model for an OpenAI model whose encoding loads, else the approximate counter."""
    openai_models = sys.modules.get("langchain_openai.chat_models.base")
    if openai_models is None or not isinstance(model, openai_models.BaseChatOpenAI):
        return approximate_counter()
    encoding = _probe_tiktoken(model)
    if encoding is None:
        return approximate_counter()
    # get_num_tokens_from_messages adds 3 tokens per call for the reply's priming: counted once, as `overhead`.
    return TokenCounter(
        f"tiktoken {encoding}",
        lambda messages: model.get_num_tokens_from_messages(list(messages)) - 3 if messages else 0,
        overhead=3,
    )


def _probe_tiktoken(model: Any) -> str | None:
    """The name of the model's tiktoken encoding if counting works within `TIKTOKEN_PROBE_SECONDS`, else None."""
    result: list[str] = []

    def probe() -> None:
        try:
            model.get_num_tokens_from_messages([HumanMessage("probe")])
        except Exception:  # noqa: BLE001 - no network, unknown model (NotImplementedError): count approximately
            return
        try:  # only for the name; counting works either way
            result.append(model._get_encoding_model()[1].name)
        except Exception:  # noqa: BLE001
            result.append("encoding")

    worker = threading.Thread(target=probe, name="tt-tiktoken-probe", daemon=True)
    worker.start()
    worker.join(TIKTOKEN_PROBE_SECONDS)
    return result[0] if result else None


def default_max_context_tokens(model: BaseChatModel) -> int:
    """The budget used when `max_context_tokens` is not set (see the module docstring)."""
    name = str(getattr(model, "model_name", "") or "").lower()
    for prefix, window in CONTEXT_WINDOWS:
        if name.startswith(prefix):
            return min(window // 2, MAX_DEFAULT_TOKENS)
    return UNKNOWN_MODEL_TOKENS
