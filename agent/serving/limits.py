"""`RequestBodyLimits`: ASGI middleware that refuses a POST body before MLflow's server reads it.

MLflow's Agent Server parses (and traces) any body in full, and answers a body
that is not a JSON object with a 500; so the body is checked here first, and
refused with the agent's error body (`serving.errors`):

* **Slower than `body_timeout` seconds** (from the first byte asked for to the
  last): 408, and the connection is closed. Without it a client that sends a
  byte a minute holds a connection and its buffer forever.
* **Over the size limit** (`body_limit`), declared or counted: 400.
* **Not JSON, or not a JSON object**: 400.
* **Nested deeper than `MAX_JSON_DEPTH`**: 400. Python's `json` raises
  RecursionError at about 1,000 levels (less when the stack is already deep, as
  in a server), pydantic stops serializing at 255 levels, and MLflow
  serializes the request into the trace with `json.dumps`; a request of the
  Responses API is about 6 levels deep. Refusing here, far below every one of
  those limits, means no depth reaches a library that would answer with a 500.

The accepted body's parsed object rides on in the ASGI scope (`JSON_BODY_KEY`), so
that the turn admission inside (`serving.admission`) reads it without parsing it again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent.serving.errors import send_error_answer, status_answer_body

#: The ASGI scope key of an accepted POST body's parsed JSON object.
JSON_BODY_KEY = "agent.json_body"

#: Deepest accepted nesting of JSON objects and arrays in a body (a Responses request is about 6 deep).
MAX_JSON_DEPTH = 100


def body_limit(max_request_bytes: int) -> int:
    """The most bytes a body may have for a request of `max_request_bytes` (as compact UTF-8 JSON).

    A body may spell the same text with whitespace or \\uXXXX escapes (up to 6 bytes a character).
    """
    return 6 * max_request_bytes + 64 * 1024


#: POST routes whose body may be empty (read as `{}`).
BODYLESS_POST_SUFFIXES = ("/cancel",)


class RequestBodyLimits:
    """ASGI middleware: a POST body must arrive within `timeout` seconds (else 408), be at most
    `max_bytes` bytes, and be a JSON object nested at most `MAX_JSON_DEPTH` deep (else 400)."""

    def __init__(self, app: Any, max_bytes: int, timeout: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(scope, send, 400, f"The request body is {int(declared)} bytes; the limit is {self.max_bytes} bytes")
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await self._read(scope, receive, send)
        except TimeoutError:
            await _refuse(scope, send, 408, f"The request body did not arrive within {self.timeout:g} s", close=True)
            return
        if body is None:
            return  # refused, or the client left
        if not body.strip() and scope.get("path", "").endswith(BODYLESS_POST_SUFFIXES):
            parsed, problem = {}, None  # the openai client's `responses.cancel(id)` sends no body
        else:
            parsed, problem = _json_object(body)
        if problem is None:
            problem = _stream_problem(scope.get("path", ""), parsed)
        if problem is not None:
            await _refuse(scope, send, 400, problem)
            return
        scope[JSON_BODY_KEY] = parsed
        delivered = False

        async def replay() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: dict, receive: Any, send: Any) -> bytes | None:
        """The whole body; None when the client left or the body went over the limit (then refused)."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client left
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await _refuse(scope, send, 400, f"The request body is over the limit of {self.max_bytes} bytes")
                return None
        return b"".join(chunks)


def _stream_problem(path: str, parsed: dict) -> str | None:
    """Why a turn's `stream` is refused, or None. Checked before the route: MLflow's Agent Server picks the
    streaming handler by the value's truth, so `"stream": "false"` would stream and be refused mid-stream."""
    if path not in ("/responses", "/invocations") or "stream" not in parsed:
        return None
    value = parsed["stream"]
    if value is None or isinstance(value, bool):
        return None
    return f"stream must be true or false, got {json.dumps(value)[:40]}"


def _json_object(body: bytes) -> tuple[dict | None, str | None]:
    """`body` parsed, and None; or None and why it is not an acceptable JSON object."""
    try:
        parsed = json.loads(body)
    except RecursionError:
        return None, f"The request body is nested more than {MAX_JSON_DEPTH} levels deep"
    except ValueError as exc:
        return None, f"The request body is not valid JSON: {exc}"
    if not isinstance(parsed, dict):
        return None, f"The request body must be a JSON object, got {type(parsed).__name__}"
    # Counting brackets is fast (C); only a body with many of them is walked.
    if body.count(b"{") + body.count(b"[") > MAX_JSON_DEPTH and _deeper_than(parsed, MAX_JSON_DEPTH):
        return None, f"The request body is nested more than {MAX_JSON_DEPTH} levels deep"
    return parsed, None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests objects/arrays more than `limit` levels deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


async def _refuse(scope: dict, send: Any, status: int, message: str, *, close: bool = False) -> None:
    # close: the rest of the body may still come, so the connection cannot carry another request.
    headers = [(b"connection", b"close")] if close else []
    await send_error_answer(scope, send, status, status_answer_body(scope.get("path", ""), status, message), headers=headers)
