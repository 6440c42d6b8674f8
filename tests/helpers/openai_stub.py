"""An OpenAI-compatible model server, run as a separate process: the model of tests and benchmarks.

Shared test infrastructure: the tests start it through `openai_stub_server`,
and so do the benchmarks (`bench.load`, `bench.memory`), which import it from
here as they would any test fixture; it lives with the tests because what it
answers is what the tests assert.

It answers like `agent.models.OfflineChatModel`, with the marker `[fake openai] `:
the reply quotes the user messages of the request, so tests can see memory.
When a `calculator` tool is offered and the last message is a user message
starting with "calculate ", it calls the tool; a last user message "use NAME
{json arguments}" calls any offered tool NAME with those arguments (none: `{}`);
after tool messages it repeats their results. A memory extraction request (its user message starts with
`EXTRACTION_HEADER`, see agent.memory.extraction) is answered with the JSON it asks for: one new memory per
"remember that …" line of the user in its conversation. It rejects an invalid history with HTTP 400, as the real API does.

Endpoints:
    GET  /v1/models            two models: `fake` (chat) and `fake-embed` (embeddings); any name is accepted.
    POST /v1/chat/completions  `stream` false (JSON) or true (SSE, with `stream_options.include_usage`).
    POST /v1/embeddings        `input` a string or a list of strings (or token id lists); `encoding_format`
                               `float` or `base64` (the `openai` client asks for base64); `dimensions`.
    GET  /_requests            the chat completions request bodies received, oldest first;
                               `?path=/v1/embeddings` the embeddings bodies; `?path=all` every body
                               as `{"path": ..., "body": ...}`.
    POST /_reset               forget the recorded bodies (the configuration stays).
    GET|POST /_config          read or change the configuration at runtime: a JSON object with any of
                               `latency_s`, `chunks`, `max_context_tokens` (null restores the default);
                               answers the whole configuration. So one process serves several phases.

Timing (why: a real model takes seconds and streams a few chunks, and that is
what load on the agent looks like). With `latency_s` S, a non-streamed reply
is sent S seconds after the request was read. A streamed reply sends its
headers at once, then its pieces spread evenly over S: with `chunks` K a text
reply is K content chunks, the i-th sent at i*S/K seconds (`--latency-s 2
--chunks 4`: 0.5 s apart, the last at 2 s); the role rides with the first,
the finish chunk and the usage chunk follow the last. The reply is cut at
word boundaries, or between characters when it has fewer than K words (so a
reply shorter than K characters has fewer chunks). Without `chunks` a text
reply is split every 3 words. A tool call streams as three chunks, spread the
same way. Errors (400) are answered at once.

Tokens (`count_prompt_tokens`), the rule of
`langchain_core.messages.utils.count_tokens_approximately` with its defaults,
so a client can reproduce the count: for each message,
ceil(characters / 4) + 3, where characters are those of the text content
(string, or the `text` parts of a list; each image part adds 85 tokens
instead), the role, the `name` if any, the `tool_call_id` of a tool message,
and for an assistant message with `tool_calls`, `repr()` of the calls in
LangChain's form (`[{'name': ..., 'args': {...}, 'id': ..., 'type': 'tool_call'}]`);
plus ceil(characters of `json.dumps(tool)` over the request's `tools`, summed, / 4).
For LangChain messages that is `count_tokens_approximately(messages)`, with
`tools=` the same tool dicts as sent. Completion tokens: ceil(characters of
the reply text, or of the tool call's name and arguments, / 4). Every response
reports them as `usage`. With `max_context_tokens` N, a request of more than N
prompt tokens gets OpenAI's 400 `context_length_exceeded`.

Embeddings (`embed`): a hashed bag of words. Each lower-cased word (`\\w+`)
adds 1 to one of `dimensions` (default 64) coordinates chosen by its SHA-256,
then the vector is L2-normalised; a text without words is the first unit
vector. Texts that share words are therefore closer (cosine) than unrelated
texts, and the same text always gets the same vector. Usage counts
ceil(characters / 4) tokens per input.

It uses only the standard library, so the process starts in a fraction of a second, and it imports
nothing of the repository, so it runs as a file from any directory.

    with openai_stub_server(latency_s=2, chunks=4) as base_url:
        ChatOpenAI(base_url=base_url, api_key="test", model="fake").invoke("hi")
        configure_stub(base_url, latency_s=0)

Run alone: `python tests/helpers/openai_stub.py --port 8123 --latency-s 2 --chunks 4` (from the repository
root, `python -m tests.helpers.openai_stub` is the same).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import math
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

MODEL_ID = "fake"
EMBEDDING_MODEL_ID = "fake-embed"
MARKER = "[fake openai] "
# The same quoting rule as agent.models (kept separate: this process stands in for an external service).
MAX_QUOTED_MESSAGES = 10
MAX_QUOTED_CHARS = 80
CALCULATE_PREFIX = "calculate "
#: The start of a memory extraction request's user message (agent.memory.extraction.KNOWN_HEADER).
EXTRACTION_HEADER = "Known memories ([memory_id] content):"
EXTRACTION_FACT = re.compile(r"^user: remember that (?P<fact>.+)$", re.IGNORECASE | re.MULTILINE)
#: A user message "use NAME {json}" makes the stub call the offered tool NAME.
USE_TOOL_PREFIX = "use "
WORDS_PER_CHUNK = 3
KNOWN_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}

#: count_tokens_approximately's defaults (langchain_core.messages.utils).
CHARS_PER_TOKEN = 4.0
EXTRA_TOKENS_PER_MESSAGE = 3
TOKENS_PER_IMAGE = 85

#: Coordinates of an embedding unless the request asks for `dimensions`.
EMBEDDING_DIMENSIONS = 64

#: Pending connections the listening socket holds: hundreds of clients connect at once under load.
LISTEN_BACKLOG = 1024



class InvalidRequest(Exception):
    """The request would get HTTP 400 from the real API."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclasses.dataclass(frozen=True)
class StubConfig:
    """How the stub answers. Durations in seconds."""

    latency_s: float = 0.0
    """Seconds from the request to the reply (non-streamed) or to its last chunk (streamed)."""
    chunks: int | None = None
    """Content chunks of a streamed text reply; None: one chunk every 3 words."""
    max_context_tokens: int | None = None
    """Largest prompt, in tokens (`count_prompt_tokens`), before `context_length_exceeded`; None: no limit."""

    def updated(self, changes: Any) -> StubConfig:
        """A copy with `changes` (a dict of some fields; None restores a field's default) applied.

        Raises:
            InvalidRequest: not a JSON object, an unknown field, or a value out of range.
        """
        if not isinstance(changes, dict):
            raise InvalidRequest("The configuration must be a JSON object")
        fields = {f.name: f.default for f in dataclasses.fields(self)}
        unknown = set(changes) - set(fields)
        if unknown:
            raise InvalidRequest(f"Unknown configuration fields {sorted(unknown)}; known: {sorted(fields)}")
        values = dataclasses.asdict(self)
        for name, value in changes.items():
            values[name] = fields[name] if value is None else value
        latency, chunks, limit = values["latency_s"], values["chunks"], values["max_context_tokens"]
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 <= latency < 3600:
            raise InvalidRequest(f"latency_s must be a number of seconds from 0 to 3600, got {latency!r}")
        for name, value in (("chunks", chunks), ("max_context_tokens", limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidRequest(f"{name} must be a positive integer or null, got {value!r}")
        return StubConfig(latency_s=float(latency), chunks=chunks, max_context_tokens=limit)


# --- What to answer -------------------------------------------------------------------------


def text_of(content: Any) -> str:
    """The text of a message's `content`: a string, or a list of parts of which the `text` ones count."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def validate(messages: Any) -> None:
    """Raise InvalidRequest where the real API answers 400 about `messages`."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("[] is too short - 'messages'", param="messages", code="empty_array")
    pending: dict[str, int] = {}  # unanswered tool_call_id -> index of its assistant message
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in KNOWN_ROLES:
            raise InvalidRequest(
                f"Invalid value: {role!r}. Supported values are: {sorted(KNOWN_ROLES)}.",
                param=f"messages.[{index}].role",
                code="invalid_value",
            )
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                raise InvalidRequest(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'.",
                    param=f"messages.[{index}].role",
                )
            del pending[message["tool_call_id"]]
            continue
        _reject_unanswered(pending, index)
        if role == "assistant":
            pending = {call["id"]: index for call in message.get("tool_calls") or []}
    _reject_unanswered(pending, len(messages))


def _reject_unanswered(pending: dict[str, int], index: int) -> None:
    if pending:
        raise InvalidRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to "
            "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
            + ", ".join(pending),
            param=f"messages.[{index}].role",
        )


def check_context_length(prompt_tokens: int, limit: int | None) -> None:
    """Raise InvalidRequest (`context_length_exceeded`, OpenAI's wording) when the prompt is over `limit`."""
    if limit is not None and prompt_tokens > limit:
        raise InvalidRequest(
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message (`content` and maybe `tool_calls`) for a valid request body."""
    messages = body["messages"]
    last = messages[-1]
    offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
    last_text = text_of(last.get("content"))
    if last["role"] == "user" and "calculator" in offered and last_text.lower().startswith(CALCULATE_PREFIX):
        expression = last_text[len(CALCULATE_PREFIX) :].strip()
        digest = hashlib.sha256(f"{len(messages)}:{expression}".encode()).hexdigest()[:12]
        call = {
            "id": f"call_{digest}",
            "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if last["role"] == "user" and last_text.startswith(EXTRACTION_HEADER):
        facts = [{"content": m["fact"].strip(), "replaces": None} for m in EXTRACTION_FACT.finditer(last_text)]
        return {"role": "assistant", "content": json.dumps({"memories": facts})}
    used = _used_tool(last_text, offered) if last["role"] == "user" else None
    if used is not None:
        name, arguments = used
        digest = hashlib.sha256(f"{len(messages)}:{name}:{arguments}".encode()).hexdigest()[:12]
        call = {"id": f"call_{digest}", "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    user_texts = [text_of(m.get("content")) for m in messages if m["role"] == "user"]
    return {"role": "assistant", "content": MARKER + _tool_results(messages) + _quote(user_texts)}


def _used_tool(text: str, offered: set[str]) -> tuple[str, str] | None:
    """`(name, JSON arguments)` for a message "use NAME {arguments}" naming an offered tool, else None."""
    if not text.lower().startswith(USE_TOOL_PREFIX):
        return None
    name, _, rest = text[len(USE_TOOL_PREFIX) :].strip().partition(" ")
    if name not in offered:
        return None
    try:
        arguments = json.loads(rest) if rest.strip() else {}
    except json.JSONDecodeError:
        return None
    return name, json.dumps(arguments)


def _quote(texts: list[str]) -> str:
    recent = texts[-MAX_QUOTED_MESSAGES:]
    if not recent:
        return "You said nothing yet."
    return "You said, in order: " + " ".join(
        f'{n}. "{text[:MAX_QUOTED_CHARS]}"' for n, text in enumerate(recent, start=1)
    )


def _tool_results(messages: list[dict[str, Any]]) -> str:
    names = {
        c["id"]: c.get("function", {}).get("name", "tool")
        for m in messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    }
    results: list[str] = []
    for message in reversed(messages):
        if message["role"] != "tool":
            break
        name = names.get(message["tool_call_id"], "tool")
        results.append(f"The {name} says: {text_of(message.get('content'))}. ")
    return "".join(reversed(results))


# --- Tokens and embeddings ------------------------------------------------------------------


def _tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens of a chat completions body, by the rule in the module docstring."""
    total = _tokens(sum(len(json.dumps(tool)) for tool in body.get("tools") or []))
    for message in body["messages"]:
        content = message.get("content")
        chars = len(content) if isinstance(content, str) else 0
        for part in content if isinstance(content, list) else ():
            if isinstance(part, str):
                chars += len(part)
            elif isinstance(part, dict) and part.get("type") in ("image", "image_url"):
                total += TOKENS_PER_IMAGE
            elif isinstance(part, dict) and part.get("type") == "text":
                chars += len(part.get("text", ""))
            else:
                chars += len(repr(part))
        if message.get("role") == "assistant" and message.get("tool_calls") and not isinstance(content, list):
            chars += len(repr([_langchain_tool_call(call) for call in message["tool_calls"]]))
        if message.get("role") == "tool":
            chars += len(message.get("tool_call_id") or "")
        chars += len(message.get("role") or "") + len(message.get("name") or "")
        total += _tokens(chars) + EXTRA_TOKENS_PER_MESSAGE
    return total


def _langchain_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    # langchain_core.messages.tool.tool_call(): the shape count_tokens_approximately takes repr() of.
    function = call.get("function") or {}
    try:
        args = json.loads(function.get("arguments") or "{}")
    except ValueError:
        args = {}
    return {"name": function.get("name"), "args": args, "id": call.get("id"), "type": "tool_call"}


def count_completion_tokens(reply: dict[str, Any]) -> int:
    """Completion tokens of an assistant reply: its text, or its tool calls' names and arguments, / 4."""
    chars = len(reply.get("content") or "")
    for call in reply.get("tool_calls") or []:
        chars += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return _tokens(chars)


def usage(prompt_tokens: int, reply: dict[str, Any]) -> dict[str, int]:
    completion = count_completion_tokens(reply)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def embed(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """The unit vector of `text`: a hashed bag of its lower-cased words (see the module docstring)."""
    vector = [0.0] * dimensions
    words = re.findall(r"\w+", text.lower())
    if not words:
        vector[0] = 1.0
        return vector
    for word in words:
        vector[int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "big") % dimensions] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def embeddings_response(body: Any) -> dict[str, Any]:
    """The `list` object of an embeddings request.

    Raises:
        InvalidRequest: `input` missing, empty, or not text or token ids; bad `dimensions` or `encoding_format`.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    texts = _embedding_inputs(body.get("input"))
    dimensions = body.get("dimensions", EMBEDDING_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= 4096:
        raise InvalidRequest(f"Invalid 'dimensions': {dimensions!r}", param="dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(f"Invalid 'encoding_format': {encoding!r}", param="encoding_format")
    data = []
    for index, text in enumerate(texts):
        vector: Any = embed(text, dimensions)
        if encoding == "base64":  # little-endian float32, as the API sends it
            vector = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(_tokens(len(text)) for text in texts)
    return {
        "object": "list",
        "data": data,
        "model": body.get("model", EMBEDDING_MODEL_ID),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _embedding_inputs(value: Any) -> list[str]:
    # A string, a list of strings, a list of token ids, or a list of lists of token ids (the API's
    # four forms); token ids are embedded as the words "<id>", so equal ids stay equal.
    def is_ids(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)

    if isinstance(value, str):
        value = [value]
    elif is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a non-empty string or array", param="input")
    texts = []
    for item in value:
        if isinstance(item, str) and item:
            texts.append(item)
        elif is_ids(item):
            texts.append(" ".join(str(i) for i in item))
        else:
            raise InvalidRequest(f"Invalid 'input' item: {item!r}", param="input")
    return texts


# --- Wire format ----------------------------------------------------------------------------


def completion(body: dict[str, Any], reply: dict[str, Any], completion_id: str, prompt_tokens: int) -> dict[str, Any]:
    """A `chat.completion` object for a non-streaming request."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", MODEL_ID),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                "logprobs": None,
            }
        ],
        "usage": usage(prompt_tokens, reply),
    }


def stream_events(
    body: dict[str, Any], reply: dict[str, Any], completion_id: str, prompt_tokens: int, chunks: int | None
) -> list[tuple[float, dict[str, Any]]]:
    """The `chat.completion.chunk` objects of a streaming response, in order, each with its due time.

    The due time is a fraction of the latency: the i-th of n pieces is due at i/n
    (see "Timing" in the module docstring); the chunks around a piece share its time.
    """
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL_ID}
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        out = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
        if include_usage:
            out["usage"] = None  # As the real API: null on every chunk but the last.
        return out

    pieces: list[list[dict[str, Any]]] = []  # each piece: the chunks sent together
    if reply.get("tool_calls"):
        call = reply["tool_calls"][0]
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        pieces.append([chunk({"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}
        ]})])  # fmt: skip
        for part in (arguments[:half], arguments[half:]):
            pieces.append([chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})])
        pieces[-1].append(chunk({}, finish_reason="tool_calls"))
    else:
        pieces = [[chunk({"content": text})] for text in split_reply(reply["content"], chunks)]
        pieces[0].insert(0, chunk({"role": "assistant", "content": ""}))
        pieces[-1].append(chunk({}, finish_reason="stop"))
    if include_usage:
        pieces[-1].append({**base, "choices": [], "usage": usage(prompt_tokens, reply)})
    return [((i + 1) / len(pieces), event) for i, piece in enumerate(pieces) for event in piece]


def split_reply(text: str, chunks: int | None) -> list[str]:
    """`text` cut into `chunks` pieces at word boundaries (by characters when it has fewer words);
    None: every `WORDS_PER_CHUNK` words. Joined, the pieces are `text`."""
    words = re.findall(r"\S+\s*", text) or [text]
    if chunks is None:
        return ["".join(words[i : i + WORDS_PER_CHUNK]) for i in range(0, len(words), WORDS_PER_CHUNK)]
    units: list[str] = words if len(words) >= chunks else list(text)
    count = min(chunks, len(units)) or 1
    size, extra = divmod(len(units), count)
    pieces, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        pieces.append("".join(units[start:end]))
        start = end
    return pieces


# --- HTTP -----------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """Serves the endpoints in the module docstring; `server.records` holds the recorded bodies."""

    server: StubServer

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "openai-stub"}
                for name in (MODEL_ID, EMBEDDING_MODEL_ID)
            ]})  # fmt: skip
        elif url.path == "/_requests":
            wanted = parse_qs(url.query).get("path", ["/v1/chat/completions"])[0]
            with self.server.lock:
                records = list(self.server.records)
            if wanted == "all":
                self._json(200, [{"path": path, "body": body} for path, body in records])
            else:
                self._json(200, [body for path, body in records if path == wanted])
        elif url.path == "/_config":
            self._json(200, dataclasses.asdict(self.server.config))
        else:
            self._error(404, f"Unknown path {self.path}", code="unknown_url")

    def do_POST(self) -> None:
        started = time.monotonic()
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        if path == "/_reset":
            with self.server.lock:
                self.server.records.clear()
            self._json(200, {"ok": True})
            return
        if path not in ("/v1/chat/completions", "/v1/embeddings", "/_config"):
            self._error(404, f"Unknown path {self.path}", code="unknown_url")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._error(400, "We could not parse the JSON body of your request.")
            return
        if path == "/_config":
            self._configure(body)
            return
        with self.server.lock:
            self.server.records.append((path, body))
            completion_id = f"chatcmpl-{len(self.server.records)}"
            config = self.server.config  # one request, one configuration
        try:
            if path == "/v1/embeddings":
                self._json(200, embeddings_response(body))
                return
            validate(body.get("messages") if isinstance(body, dict) else None)
            prompt_tokens = count_prompt_tokens(body)
            check_context_length(prompt_tokens, config.max_context_tokens)
        except InvalidRequest as exc:
            self._error(400, str(exc), param=exc.param, code=exc.code)
            return
        reply = answer(body)
        if body.get("stream"):
            events = stream_events(body, reply, completion_id, prompt_tokens, config.chunks)
            self._sse(events, started, config.latency_s)
        else:
            _sleep_until(started + config.latency_s)
            self._json(200, completion(body, reply, completion_id, prompt_tokens))

    def _configure(self, changes: Any) -> None:
        with self.server.lock:
            try:
                self.server.config = self.server.config.updated(changes)
            except InvalidRequest as exc:
                self._error(400, str(exc))
                return
            config = self.server.config
        self._json(200, dataclasses.asdict(config))

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
        self._json(status, {"error": error})

    def _sse(self, events: list[tuple[float, dict[str, Any]]], started: float, latency_s: float) -> None:
        # HTTP/1.0 response without Content-Length: the body ends when the connection closes.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.flush()
        for due, event in events:
            if _sleep_until(started + due * latency_s):
                self.wfile.flush()
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # Quiet: tests read /_requests instead of access logs.


def _sleep_until(deadline: float) -> bool:
    """Sleep until `deadline` (time.monotonic); whether there was anything to wait for."""
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
        return True
    return False


class StubServer(ThreadingHTTPServer):
    """A threading HTTP server that records the request bodies it receives, and its `StubConfig`."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, port: int, config: StubConfig) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.lock = threading.Lock()
        self.records: list[tuple[str, Any]] = []
        self.config = config

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that leaves mid-stream is normal under load; anything else is worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


# --- Process lifecycle ----------------------------------------------------------------------


def free_port() -> int:
    """A local TCP port that is free now (another process may take it before we bind it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def openai_stub_server(
    *,
    latency_s: float = 0.0,
    chunks: int | None = None,
    max_context_tokens: int | None = None,
    startup_timeout: float = 10.0,
) -> Iterator[str]:
    """Run the stub in a child process on a free port; yield its base URL, `http://127.0.0.1:<port>/v1`.

    The options are those of `StubConfig` (the command line's `--latency-s`,
    `--chunks`, `--max-context-tokens`). The process is stopped on exit.

    Raises:
        RuntimeError: the process exited, or `GET /v1/models` did not answer within `startup_timeout` seconds.
    """
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    # Run by path, as a reader would run it: the child needs neither the repository root as cwd nor `tests` importable.
    command = [sys.executable, str(Path(__file__).resolve()), "--port", str(port), "--latency-s", str(latency_s)]
    if chunks is not None:
        command += ["--chunks", str(chunks)]
    if max_context_tokens is not None:
        command += ["--max-context-tokens", str(max_context_tokens)]
    # stderr goes to a file, not a pipe nobody reads, so a chatty child can never block on a full pipe.
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            _wait_until_ready(process, base_url, startup_timeout, stderr)
            yield base_url
        finally:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def configure_stub(base_url: str, **changes: Any) -> dict[str, Any]:
    """Change the running stub's configuration (`POST /_config`); returns the whole new configuration.

    `base_url` is what `openai_stub_server` yields; `changes` are `StubConfig` fields (None: the default).

    Raises:
        urllib.error.HTTPError: 400 for an unknown field or a bad value.
    """
    request = urllib.request.Request(
        base_url.removesuffix("/v1") + "/_config",
        data=json.dumps(changes).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def reset_stub(base_url: str) -> None:
    """Make the stub forget the request bodies it recorded (`POST /_reset`; its configuration stays)."""
    request = urllib.request.Request(base_url.removesuffix("/v1") + "/_reset", data=b"{}", method="POST")
    urllib.request.urlopen(request, timeout=10).close()


def received(base_url: str) -> list[dict]:
    """The chat completions request bodies the stub received, oldest first (`GET /_requests`)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_requests", timeout=30) as response:
        return json.load(response)


def _wait_until_ready(process: subprocess.Popen, base_url: str, timeout: float, stderr: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr.seek(0)
            raise RuntimeError(f"OpenAI stub exited with {process.returncode}: {stderr.read().decode()}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"OpenAI stub did not answer at {base_url} within {timeout} s")


def main(argv: list[str] | None = None) -> None:
    """Serve on 127.0.0.1 until interrupted or terminated."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--latency-s", type=float, default=0.0, help="seconds until the reply or its last chunk")
    parser.add_argument("--chunks", type=int, default=None, help="content chunks of a streamed reply")
    parser.add_argument("--max-context-tokens", type=int, default=None, help="largest prompt, in tokens")
    args = parser.parse_args(argv)
    try:
        config = StubConfig().updated(
            {"latency_s": args.latency_s, "chunks": args.chunks, "max_context_tokens": args.max_context_tokens}
        )
    except InvalidRequest as exc:
        parser.error(str(exc))
    server = StubServer(args.port, config)
    print(f"OpenAI stub ready at http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
