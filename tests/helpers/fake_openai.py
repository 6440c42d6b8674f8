"""A fake OpenAI chat completions server, run as a separate process, for tests without network.

It answers like `agent.models.OfflineChatModel` with the marker `[fake openai] `:
the reply quotes the user messages of the request, so tests can see memory.
When a `calculator` tool is offered and the last message is a user message
starting with "calculate ", it calls the tool; after tool messages it repeats
their results. It rejects an invalid history with HTTP 400, as the real API does.

Endpoints:
    GET  /v1/models            one model, `fake`.
    POST /v1/chat/completions  `stream` false (JSON) or true (SSE, with `stream_options.include_usage`).
    GET  /_requests            every chat completions request body received, oldest first.
    POST /_reset               forget the recorded bodies.

It uses only the standard library, so the process starts in a fraction of a second.

    with fake_openai_server() as base_url:
        ChatOpenAI(base_url=base_url, api_key="test", model="fake").invoke("hi")

Run alone: `python -m tests.helpers.fake_openai --port 8123`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import socket
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

MODEL_ID = "fake"
MARKER = "[fake openai] "
# The same quoting rule as agent.models (kept separate: this process stands in for an external service).
MAX_QUOTED_MESSAGES = 10
MAX_QUOTED_CHARS = 80
CALCULATE_PREFIX = "calculate "
WORDS_PER_CHUNK = 3
KNOWN_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}

REPO_ROOT = Path(__file__).resolve().parents[2]


class InvalidRequest(Exception):
    """The request would get HTTP 400 from the real API."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


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
    user_texts = [text_of(m.get("content")) for m in messages if m["role"] == "user"]
    return {"role": "assistant", "content": MARKER + _tool_results(messages) + _quote(user_texts)}


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


# --- Wire format ----------------------------------------------------------------------------


def _usage(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, int]:
    # Words, not tokens: close enough for tests that only check usage is reported.
    prompt = sum(len(text_of(m.get("content")).split()) for m in body["messages"])
    completion = len((reply.get("content") or "").split())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(body: dict[str, Any], reply: dict[str, Any], completion_id: str) -> dict[str, Any]:
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
        "usage": _usage(body, reply),
    }


def chunks(body: dict[str, Any], reply: dict[str, Any], completion_id: str) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a streaming response, in order."""
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL_ID}
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        out = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
        if include_usage:
            out["usage"] = None  # As the real API: null on every chunk but the last.
        return out

    if reply.get("tool_calls"):
        call = reply["tool_calls"][0]
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        yield chunk({"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": call["id"], "type": "function", "function": {"name": "calculator", "arguments": ""}}
        ]})
        for piece in (arguments[:half], arguments[half:]):
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        yield chunk({}, finish_reason="tool_calls")
    else:
        yield chunk({"role": "assistant", "content": ""})
        words = re.findall(r"\S+\s*", reply["content"])
        for start in range(0, len(words), WORDS_PER_CHUNK):
            yield chunk({"content": "".join(words[start : start + WORDS_PER_CHUNK])})
        yield chunk({}, finish_reason="stop")
    if include_usage:
        yield {**base, "choices": [], "usage": _usage(body, reply)}


# --- HTTP -----------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """Serves the endpoints in the module docstring; `server.requests` holds the recorded bodies."""

    server: FakeOpenAIServer

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "fake-openai"}
            ]})
        elif self.path == "/_requests":
            with self.server.lock:
                self._json(200, list(self.server.requests))
        else:
            self._error(404, f"Unknown path {self.path}", code="unknown_url")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/_reset":
            with self.server.lock:
                self.server.requests.clear()
            self._json(200, {"ok": True})
            return
        if self.path != "/v1/chat/completions":
            self._error(404, f"Unknown path {self.path}", code="unknown_url")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._error(400, "We could not parse the JSON body of your request.")
            return
        with self.server.lock:
            self.server.requests.append(body)
            completion_id = f"chatcmpl-{len(self.server.requests)}"
        try:
            validate(body.get("messages"))
        except InvalidRequest as exc:
            self._error(400, str(exc), param=exc.param, code=exc.code)
            return
        reply = answer(body)
        if body.get("stream"):
            self._sse(chunks(body, reply, completion_id))
        else:
            self._json(200, completion(body, reply, completion_id))

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

    def _sse(self, events: Iterator[dict[str, Any]]) -> None:
        # HTTP/1.0 response without Content-Length: the body ends when the connection closes.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # Quiet: tests read /_requests instead of access logs.


class FakeOpenAIServer(ThreadingHTTPServer):
    """A threading HTTP server that records the chat completions request bodies it receives."""

    daemon_threads = True

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []


# --- Process lifecycle ----------------------------------------------------------------------


def free_port() -> int:
    """A local TCP port that is free now (another process may take it before we bind it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def fake_openai_server(*, startup_timeout: float = 10.0) -> Iterator[str]:
    """Run the fake server in a child process; yield its base URL, `http://127.0.0.1:<port>/v1`.

    Raises:
        RuntimeError: the process exited, or `GET /v1/models` did not answer within `startup_timeout` seconds.
    """
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    # stderr goes to a file, not a pipe nobody reads, so a chatty child can never block on a full pipe.
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.fake_openai", "--port", str(port)],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
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


def _wait_until_ready(process: subprocess.Popen, base_url: str, timeout: float, stderr: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr.seek(0)
            raise RuntimeError(f"fake OpenAI server exited with {process.returncode}: {stderr.read().decode()}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"fake OpenAI server did not answer at {base_url} within {timeout} s")


def main(argv: list[str] | None = None) -> None:
    """Serve on 127.0.0.1 until interrupted or terminated."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free port)")
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(args.port)
    print(f"fake openai ready at http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
