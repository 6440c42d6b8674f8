"""`RequestBodyLimits`: ASGI middleware that refuses a POST body before MLflow's server reads it.

MLflow's Agent Server parses (and traces) any body in full, and answers a body
that is not a JSON object with a 500; so a body over the limit, or not a JSON
object, gets a 400 here first (with the agent's error body, `serving.errors`).
"""

from __future__ import annotations

import json
from typing import Any

from agent.errors import InvalidRequest
from agent.serving.errors import error_body


def body_limit(max_request_bytes: int) -> int:
    """The most bytes a body may have for a request of `max_request_bytes` (as compact UTF-8 JSON).

    A body may spell the same text with whitespace or \\uXXXX escapes (up to 6 bytes a character).
    """
    return 6 * max_request_bytes + 64 * 1024


class RequestBodyLimits:
    """ASGI middleware: a POST body must be at most `max_bytes` and a JSON object, or it gets a 400."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, f"The request body is {int(declared)} bytes; the limit is {self.max_bytes} bytes")
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(send, f"The request body is over the limit of {self.max_bytes} bytes")
                return
        try:
            parsed = json.loads(body)
        except ValueError as exc:
            await self._refuse(send, f"The request body is not valid JSON: {exc}")
            return
        except RecursionError:
            await self._refuse(send, "The request body is nested too deeply to read")
            return
        if not isinstance(parsed, dict):
            await self._refuse(send, f"The request body must be a JSON object, got {type(parsed).__name__}")
            return
        delivered = False

        async def replay() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Any, message: str) -> None:
        payload = json.dumps(error_body(InvalidRequest(message))).encode()
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})
