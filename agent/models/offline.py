"""The offline model: a deterministic chat model that needs no network.

`OfflineChatModel` is deterministic, so tests and demos can see memory at work:
each reply quotes, in order, the user messages the model received in that call,
and the long-term memories it was given (`agent.memory`), and ends by saying
what it received (`model_input_note`: how many messages and tokens, and
whether a context summary was among them), so the token budget is visible. It
reports token usage like a real model (`usage_metadata`), streams a few words
per chunk, can call the `calculator` tool and the memory tools, writes a
deterministic summary when asked for one (`agent.context.summaries`), proposes
a branch's memories deterministically when asked (`agent.memory.extraction`), and
rejects a history with unanswered tool calls as the OpenAI API does
(`agent.models.pairing`). What it recognises and how it marks its replies is
`agent.models.markers`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.errors import ErrorCode, create_error_message
from pydantic import Field

from agent.config import OFFLINE_MODEL_NAME
from agent.memory import FORGET_MEMORY_TOOL, SAVE_MEMORY_TOOL, SEARCH_MEMORIES_TOOL
from agent.memory.retrieval import memories_in
from agent.models.markers import (
    CALCULATE_PREFIX,
    CALCULATOR_TOOL,
    CHANGE_PREFIX,
    FORGET_PREFIX,
    OFFLINE_MARKER,
    OFFLINE_SUMMARY_MARKER,
    RECALL_PREFIX,
    REMEMBER_PREFIX,
    USE_TOOL_PREFIX,
    is_extraction_request,
    is_summary_message,
    is_summary_request,
)
from agent.models.pairing import tool_call_pairing

#: How many user messages a reply quotes (the most recent ones), and how many characters of each.
MAX_QUOTED_MESSAGES = 10
MAX_QUOTED_CHARS = 80

#: Words per streamed chunk.
WORDS_PER_CHUNK = 3


class OfflineChatModel(BaseChatModel):
    """A deterministic local chat model that quotes what the user said.

    A reply is `OFFLINE_MARKER`, then "You said, in order: " and the user messages
    of this call numbered and quoted (the last `MAX_QUOTED_MESSAGES`, each cut to
    `MAX_QUOTED_CHARS` characters), then `model_input_note` of what it received.
    After tool results it first says "The <tool> says: <result>.". When
    `calculator` is bound and the last message is a human message starting with
    "calculate ", it replies with one tool call instead, whose arguments are
    `{"expression": <rest of the message>}`; a last human message "use NAME {json
    arguments}" naming a bound tool calls it with those arguments (none: `{}`), so
    a demo or test can drive any tool of yours. Asked for a summary (a request
    from `agent.context.summaries.summary_request`), it answers
    `OFFLINE_SUMMARY_MARKER` and the quotes of the user messages to summarize.

    Usage (`usage_metadata`): input tokens by `count_tokens_approximately` over
    the messages and the bound tools' schemas (the rule of the OpenAI stub),
    output tokens ceil(characters / 4) of the text, or of a tool call's name
    and JSON arguments.

    Long-term memory (when the memory tools are bound): a last human message
    starting with "remember that " calls `save_memory` with the rest of the
    message; "remember instead that " calls `save_memory` with the rest and the id of the first (most
    relevant) memory it was given, which changes that memory; "what do you remember" calls `search_memories` with an empty query
    (the newest memories); "forget " calls `forget_memory` on the first (most
    relevant) memory it was given, if any. A reply given memories says
    `I remember: 1. "…" 2. "…". ` (each cut to `MAX_QUOTED_CHARS`) before the quotes.

    Fields:
        latency_ms: milliseconds to sleep per call, to stand in for a real model (default 0).
        tool_names: names of the bound tools; set by `bind_tools` (default none).
        tool_schemas: the bound tools in OpenAI function format; set by `bind_tools` (default none).

    Raises (on every call):
        ValueError: the history is invalid for a chat API (message contains `INVALID_CHAT_HISTORY`):
            a tool call is not answered by a ToolMessage before the next other message,
            or a ToolMessage answers no preceding tool call.
    """

    latency_ms: float = Field(default=0.0, ge=0)
    tool_names: tuple[str, ...] = ()
    tool_schemas: tuple[dict[str, Any], ...] = ()

    @property
    def _llm_type(self) -> str:
        return OFFLINE_MODEL_NAME

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": OFFLINE_MODEL_NAME, "latency_ms": self.latency_ms, "tool_names": self.tool_names}

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> OfflineChatModel:
        """A copy of this model that knows `tools` by name (dicts, functions or BaseTools).

        Other keyword arguments (such as `tool_choice`) are accepted and ignored.
        """
        schemas = tuple(convert_to_openai_tool(tool) for tool in tools)
        names = tuple(schema["function"]["name"] for schema in schemas)
        return self.model_copy(update={"tool_names": names, "tool_schemas": schemas})

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000)
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # Sleep on the event loop, not in an executor thread, so concurrent turns overlap as with a real model.
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000)
        # No on_llm_new_token here: langchain-core 1.x BaseChatModel.stream/_generate_with_cache
        # report each chunk to the callbacks themselves, so calling it here would double every token.
        yield from _to_chunks(self._reply(messages))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        for chunk in _to_chunks(self._reply(messages)):
            yield chunk

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        """The whole reply to `messages`, with its usage, without an id (LangChain assigns it)."""
        check_tool_calls_answered(messages)
        received = count_tokens_approximately(messages, tools=list(self.tool_schemas) or None)
        if is_summary_request(messages):
            text = offline_summary(messages)
            return AIMessage(content=text, usage_metadata=_usage(received, len(text)))
        if is_extraction_request(messages):
            from agent.memory.extraction import offline_proposals

            text = offline_proposals(messages)
            return AIMessage(content=text, usage_metadata=_usage(received, len(text)))
        last = messages[-1] if messages else None
        if (
            isinstance(last, HumanMessage)
            and CALCULATOR_TOOL in self.tool_names
            and last.text.lower().startswith(CALCULATE_PREFIX)
        ):
            expression = last.text[len(CALCULATE_PREFIX) :].strip()
            call_id = tool_call_id(len(messages), expression)
            arguments = {"expression": expression}
            return AIMessage(
                content="",
                tool_calls=[{"name": CALCULATOR_TOOL, "args": arguments, "id": call_id}],
                usage_metadata=_usage(received, len(CALCULATOR_TOOL) + len(json.dumps(arguments))),
            )
        memory_call = _memory_tool_call(messages, self.tool_names) or _used_tool_call(messages, self.tool_names)
        if memory_call is not None:
            return AIMessage(
                content="",
                tool_calls=[memory_call],
                usage_metadata=_usage(received, len(memory_call["name"]) + len(json.dumps(memory_call["args"]))),
            )
        note = model_input_note(len(messages), received, summary=any(map(is_summary_message, messages)))
        quoted = quote_user_messages(_recent_user_texts(messages))
        text = f"{OFFLINE_MARKER}{_tool_results(messages)}{_remembered(messages)}{quoted} {note}"
        return AIMessage(content=text, usage_metadata=_usage(received, len(text)))


def model_input_note(messages: int, tokens: int, *, summary: bool) -> str:
    """What the offline model says it received: `[received 5 messages, 230 tokens, no summary]`
    (`1 message`; `with a summary` when a context summary was among them)."""
    plural = "" if messages == 1 else "s"
    return f"[received {messages} message{plural}, {tokens} tokens, {'with a' if summary else 'no'} summary]"


def quote_user_messages(texts: Sequence[str]) -> str:
    """`You said, in order: 1. "…" 2. "…"` for the last `MAX_QUOTED_MESSAGES` texts, each cut to `MAX_QUOTED_CHARS`.

    Numbering starts at 1 with the oldest quoted text. No texts gives `You said nothing yet.`
    """
    recent = list(texts)[-MAX_QUOTED_MESSAGES:]
    if not recent:
        return "You said nothing yet."
    quoted = " ".join(f'{n}. "{text[:MAX_QUOTED_CHARS]}"' for n, text in enumerate(recent, start=1))
    return f"You said, in order: {quoted}"


def offline_summary(request: Sequence[BaseMessage]) -> str:
    """The offline model's summary for a summary request: `OFFLINE_SUMMARY_MARKER`, then `The user said, in
    order:` and one line `- "…"` per user message, the previous summary's lines first, keeping the last
    `MAX_QUOTED_MESSAGES`, each cut to `MAX_QUOTED_CHARS` characters with line breaks made spaces."""
    quoted = [
        line[3:-1]
        for message in request
        if is_summary_message(message)
        for line in message.text.splitlines()
        if line.startswith('- "') and line.endswith('"')
    ]
    quoted += [" ".join(m.text.splitlines())[:MAX_QUOTED_CHARS] for m in request[1:-1] if isinstance(m, HumanMessage)]
    lines = "".join(f'\n- "{text}"' for text in quoted[-MAX_QUOTED_MESSAGES:])
    return f"{OFFLINE_SUMMARY_MARKER}The user said, in order:{lines}"


def _usage(input_tokens: int, output_chars: int) -> UsageMetadata:
    output_tokens = math.ceil(output_chars / 4)
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}


def tool_call_id(position: int, expression: str) -> str:
    """A deterministic tool call id: `call_` and a short hash of the call's position in the history and its input."""
    digest = hashlib.sha256(f"{position}:{expression}".encode()).hexdigest()
    return f"call_{digest[:12]}"


def check_tool_calls_answered(messages: Sequence[BaseMessage]) -> None:
    """Reject a history that a chat API would reject (the rule: `agent.models.pairing.pairing_walk`).

    Raises:
        ValueError: with `INVALID_CHAT_HISTORY` and the offending tool call ids in its message.
    """
    pairing = tool_call_pairing(messages)
    if not pairing.well_formed:
        raise ValueError(
            create_error_message(
                message=(
                    "Invalid chat history: tool calls without a ToolMessage right after them: "
                    f"{list(pairing.unanswered)}; ToolMessages that answer no preceding tool call: {list(pairing.stray)}."
                ),
                error_code=ErrorCode.INVALID_CHAT_HISTORY,
            )
        )


def _recent_user_texts(messages: Sequence[BaseMessage]) -> list[str]:
    """The texts of the last `MAX_QUOTED_MESSAGES` user messages, oldest first (reads from the end only)."""
    texts: list[str] = []
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            texts.append(message.text)
            if len(texts) == MAX_QUOTED_MESSAGES:
                break
    return texts[::-1]


def _memory_tool_call(messages: Sequence[BaseMessage], tool_names: Sequence[str]) -> dict | None:
    """The memory tool call a last human message asks for (see `OfflineChatModel`), or None."""
    last = messages[-1] if messages else None
    if not isinstance(last, HumanMessage):
        return None
    text = last.text.strip()
    lowered = text.lower()
    if lowered.startswith(REMEMBER_PREFIX) and SAVE_MEMORY_TOOL in tool_names:
        name, args = SAVE_MEMORY_TOOL, {"content": text[len(REMEMBER_PREFIX) :].strip()}
    elif lowered.startswith(CHANGE_PREFIX) and SAVE_MEMORY_TOOL in tool_names and memories_in(messages):
        name, args = SAVE_MEMORY_TOOL, {"content": text[len(CHANGE_PREFIX) :].strip(), "memory_id": memories_in(messages)[0][0]}
    elif lowered.startswith(RECALL_PREFIX) and SEARCH_MEMORIES_TOOL in tool_names:
        name, args = SEARCH_MEMORIES_TOOL, {"query": ""}
    elif lowered.startswith(FORGET_PREFIX) and FORGET_MEMORY_TOOL in tool_names and memories_in(messages):
        name, args = FORGET_MEMORY_TOOL, {"memory_id": memories_in(messages)[0][0]}
    else:
        return None
    return {"name": name, "args": args, "id": tool_call_id(len(messages), f"{name}:{json.dumps(args)}")}


def _used_tool_call(messages: Sequence[BaseMessage], tool_names: Sequence[str]) -> dict | None:
    """The call a last human message "use NAME {json arguments}" asks for (see `OfflineChatModel`), or None."""
    last = messages[-1] if messages else None
    if not isinstance(last, HumanMessage) or not last.text.lower().startswith(USE_TOOL_PREFIX):
        return None
    name, _, rest = last.text[len(USE_TOOL_PREFIX) :].strip().partition(" ")
    if name not in tool_names:
        return None
    try:
        args = json.loads(rest) if rest.strip() else {}
    except json.JSONDecodeError:
        return None
    if not isinstance(args, dict):
        return None
    return {"name": name, "args": args, "id": tool_call_id(len(messages), f"{name}:{json.dumps(args)}")}


def _remembered(messages: Sequence[BaseMessage]) -> str:
    """`I remember: 1. "…" 2. "…". ` for the long-term memories the model was given; "" for none."""
    memories = memories_in(messages)
    if not memories:
        return ""
    quoted = " ".join(f'{n}. "{content[:MAX_QUOTED_CHARS]}"' for n, (_, content) in enumerate(memories, start=1))
    return f"I remember: {quoted}. "


def _tool_results(messages: Sequence[BaseMessage]) -> str:
    """`The <tool> says: <result>. ` for each ToolMessage at the end of `messages`, oldest first."""
    trailing: list[ToolMessage] = []
    index = len(messages) - 1
    while index >= 0 and isinstance(messages[index], ToolMessage):
        trailing.append(messages[index])
        index -= 1
    if not trailing:
        return ""
    # A ToolMessage's name is optional; the tool call it answers (just before them) always has one.
    caller = messages[index] if index >= 0 else None
    call_names = {c["id"]: c["name"] for c in caller.tool_calls} if isinstance(caller, AIMessage) else {}
    return "".join(
        f"The {m.name or call_names.get(m.tool_call_id, 'tool')} says: {m.text}. " for m in reversed(trailing)
    )


def _to_chunks(message: AIMessage) -> Iterator[ChatGenerationChunk]:
    """`message` as stream chunks of `WORDS_PER_CHUNK` words, the last one with the usage; a tool call is one chunk."""
    usage = message.usage_metadata
    if message.tool_calls:
        call_chunks = [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i, "type": "tool_call_chunk"}
            for i, c in enumerate(message.tool_calls)
        ]
        yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=call_chunks, usage_metadata=usage))
        return
    words = re.findall(r"\S+\s*", message.text)
    starts = range(0, len(words), WORDS_PER_CHUNK)
    for start in starts:
        piece = "".join(words[start : start + WORDS_PER_CHUNK])
        last = start == starts[-1]
        yield ChatGenerationChunk(message=AIMessageChunk(content=piece, usage_metadata=usage if last else None))
