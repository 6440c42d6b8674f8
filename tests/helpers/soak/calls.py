"""One HTTP attempt of a soak client, and what its answer means for the retry loop.

`send` posts a Responses body to `/invocations` or `/responses` of one server
(through its front proxy), streamed or not, and sorts the answer:

* `ok`: a 200 whose `custom_outputs` arrived (for a stream: the event that carries them,
  then the end of the stream).
* `retry`: nothing definite: the connection failed or was cut (also mid-stream), a timeout,
  a 5xx (503 is the agent's "the database failed, retry"; any other 5xx is a bug and counted),
  408, and the 409s that say "try again" (`ThreadBusy`, `LeaseExpired`).
* `final`: a definite refusal: 400, 404, and the 409s that are an answer (`TurnCancelled`,
  `ThreadExists`).

The 409 kinds share one status and error code (`agent.serving.errors`); the messages of
`agent.errors`' classes tell them apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from agent.error_answers import ERROR_ANSWERS, INTERNAL

#: MLflow error codes of stream error events, as statuses.
CODE_STATUS = {
    "INVALID_PARAMETER_VALUE": 400,
    "RESOURCE_DOES_NOT_EXIST": 404,
    "RESOURCE_CONFLICT": 409,
    "TEMPORARILY_UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 408,
    "INTERNAL_ERROR": 500,
    # A `POST /responses` stream's error event carries OpenAI's code (`agent.error_answers`), not MLflow's: a
    # database fault after the first event (the run recorder's write, the commit) is "unavailable", a 503.
    **{answer.openai_code: answer.status for _, answer in ERROR_ANSWERS},
    INTERNAL.openai_code: INTERNAL.status,
}

#: Ordinary timeouts: long enough for a retry that waits for its original (`enqueue_timeout`).
TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=10.0, pool=5.0)


@dataclass
class Answer:
    kind: str  # ok, retry, final
    reason: str
    status: int | None = None
    outputs: dict[str, Any] | None = None
    message: str = ""


def conflict_reason(message: str) -> str:
    """Which 409 this is, by the wording of `agent.errors`' raisers."""
    text = message.lower()
    if "rolled this turn back" in text:
        return "TurnCancelled"
    if "expired and another turn took" in text:
        return "LeaseExpired"
    if "already in use" in text or "already exists" in text or "already holds" in text:
        return "ThreadExists"
    if "busy" in text or "still running" in text or "committed first" in text:
        return "ThreadBusy"
    return "Conflict"


def classify(status: int, message: str) -> Answer:
    """The `Answer` for an error status and its message."""
    if status == 409:
        reason = conflict_reason(message)
        kind = "retry" if reason in ("ThreadBusy", "LeaseExpired") else "final"
        return Answer(kind, reason, status, message=message)
    if status == 503:
        return Answer("retry", "Unavailable", status, message=message)
    if status == 408:
        return Answer("retry", "Timeout408", status, message=message)
    if status >= 500:
        return Answer("retry", f"HTTP{status}", status, message=message)
    if status == 400:
        return Answer("final", "InvalidRequest", status, message=message)
    if status == 404:
        return Answer("final", "NotFound", status, message=message)
    return Answer("final", f"HTTP{status}", status, message=message)


def error_message(body: Any) -> str:
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message", ""))
        return str(body.get("message", ""))
    return str(body)


def send(
    client: httpx.Client,
    base_url: str,
    path: str,
    body: dict[str, Any],
    *,
    key_header: str | None = None,
    stream: bool = False,
    abort_after: float | None = None,
) -> Answer:
    """POST `body` to `base_url` + `path`; the sorted answer (module docstring).

    `key_header`: sent as the `Idempotency-Key` header. `abort_after`: the client gives up
    this attempt (a dropped connection from its side): a stream after its first event, a
    plain request after that many seconds.
    """
    headers = {"Idempotency-Key": key_header} if key_header else {}
    payload = {**body, "stream": True} if stream else body
    if path == "/responses":
        payload = {"model": "timetravel-agent", **payload}
    try:
        if stream:
            return _stream(client, base_url + path, payload, headers, abort=abort_after is not None)
        timeout = httpx.Timeout(abort_after, connect=5.0) if abort_after is not None else TIMEOUT
        response = client.post(base_url + path, json=payload, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return Answer("retry", "client_abort" if abort_after is not None else "timeout")
    except httpx.HTTPError as exc:
        return Answer("retry", f"transport:{type(exc).__name__}")
    return _plain(response)


def _plain(response: httpx.Response) -> Answer:
    try:
        data = response.json()
    except ValueError:
        data = response.text
    if response.status_code == 200 and isinstance(data, dict) and isinstance(data.get("custom_outputs"), dict):
        return Answer("ok", "ok", 200, outputs=data["custom_outputs"])
    if response.status_code == 200:
        return Answer("retry", "HTTP200-without-outputs", 200, message=str(data)[:300])
    return classify(response.status_code, error_message(data))


def _stream(client: httpx.Client, url: str, payload: dict, headers: dict, *, abort: bool) -> Answer:
    outputs = None
    try:
        with client.stream("POST", url, json=payload, headers=headers, timeout=TIMEOUT) as response:
            if response.status_code != 200:
                response.read()
                return _plain(response)
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    return Answer("ok", "ok", 200, outputs=outputs) if outputs else Answer("retry", "stream-without-outputs")
                event = json.loads(data)
                if event.get("type") == "error":
                    status = CODE_STATUS.get(str(event.get("code")), 500)
                    return classify(status, str(event.get("message", "")))
                if isinstance(event.get("custom_outputs"), dict):
                    outputs = event["custom_outputs"]
                if abort:
                    return Answer("retry", "client_abort")
    except httpx.TimeoutException:
        return Answer("retry", "timeout")
    except httpx.HTTPError as exc:
        return Answer("retry", f"transport:{type(exc).__name__}")
    except ValueError as exc:  # a cut in the middle of an event's JSON
        return Answer("retry", f"transport:{type(exc).__name__}")
    return Answer("retry", "transport:stream-cut")
