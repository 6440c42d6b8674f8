"""`TrustedUserHeader`: ASGI middleware that lets the `user_id_header` through only as one plain value.

With `user_id_header` set, that header is who the caller is, on every route
(`agent_server._caller`, `openai.caller`). The server trusts it because a proxy
in front sets it after authenticating the user; the proxy must **replace** any
header of that name the client sent. A proxy that **appends** instead leaves
the client's own value in the request, as a second header line, or in the same
line before a comma (HTTP lets a recipient combine repeated field lines into one
comma-separated value, RFC 9110 section 5.3). Envoy's `request_headers_to_add`
appends by default, and so do Google Cloud load balancers' custom request headers
(docs/guides/openai-client.md lists what each proxy must be set to).
Starlette's `request.headers.get` and MLflow's `get_request_headers()` (a
`dict(request.headers)`) both answer the *first* line, which is the client's:
the client would choose the user.

So, before any route runs, a request whose trusted header arrives more than
once, or whose value holds a comma, is refused with 400 and nothing is done.
A user id therefore cannot contain a comma when it comes from the header
(e-mail addresses and the ids identity providers issue do not). The body is
the route's error shape, by its path (`errors.speaks_openai`): OpenAI's
`{"error": {...}}` on `/responses` and `/conversations` (the `openai` client
raises `BadRequestError` with the message, `param` naming the header), MLflow's
`{"error_code", "message"}` elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

from agent.errors import InvalidRequest
from agent.serving.errors import error_body, log_error_answer, openai_error_body, speaks_openai


def header_problem(name: str, values: list[bytes]) -> str | None:
    """Why the values of the trusted header `name` (every line of it in the request) cannot name a user,
    or None when there is at most one line and it holds no comma."""
    if len(values) > 1:
        return (
            f"The {name} header appears {len(values)} times; it must appear at most once. A proxy in front of "
            "this server must replace the client's header, not add another. Nothing was done."
        )
    if values and b"," in values[0]:
        return (
            f"The {name} header holds a list (a comma); it must be one user id. A proxy in front of this server "
            "must replace the client's header, not append to it. Nothing was done."
        )
    return None


class TrustedUserHeader:
    """ASGI middleware: with header `name` configured, a request carrying it more than once, or with a
    comma in its value, is answered 400 before the app sees it (module docstring)."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.name = name
        self._key = name.lower().encode("latin-1")  # ASGI header names are lower-case bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            values = [value for key, value in scope.get("headers") or () if key.lower() == self._key]
            problem = header_problem(self.name, values)
            if problem is not None:
                await _refuse(scope, send, InvalidRequest(problem), self.name)
                return
        await self.app(scope, receive, send)


async def _refuse(scope: dict, send: Any, error: InvalidRequest, param: str) -> None:
    path = scope.get("path", "")
    body = openai_error_body(error, param=param) if speaks_openai(path) else error_body(error)
    log_error_answer(scope.get("method", ""), path, 400, body)
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
