"""What the load benchmark sends to an Agent Server and how it judges the answers.

* `send_turn`: one turn over HTTP (`POST /responses`, streamed or not) as an
  `Outcome`: its time, status, the checkpoint it left, or why it failed. A
  turn succeeded only with HTTP 200, no `error` event, and a `checkpoint_id`
  in `custom_outputs` (for a stream: on one of its events).
* `at_once` and `conversations`: many turns at once, or a fixed number of
  turns by a fixed number of conversations. `conversations` sends through a
  `LightClient` (aiohttp), because there the load generator shares two cores
  with the servers it measures (the `--workers` figure): httpx took about 3 ms
  of CPU per request, aiohttp about 0.6 ms, against 15 ms of the server's per
  turn with a 0 s model.
* `HistoryPoller`, `HealthPoller` and `ConnectionSampler` run in their own OS threads, so a
  busy event loop in the load generator does not inflate what they measure.
* `check_chain`: whether one thread's history is one linear chain holding
  each acknowledged turn exactly once.

All times are `time.perf_counter` seconds.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import statistics
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import psycopg

#: Longest a turn may take before it counts as failed; generous, so a slow server is measured, not cut off.
TURN_TIMEOUT_S = 300.0

#: Active connections to one database, not counting the sampler's own (it connects to another database anyway).
CONNECTIONS_SQL = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"

#: Ids in error messages (UUIDs, hex suffixes of scratch database names), masked so that equal errors group.
_IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|(?=[0-9a-f]*\d)[0-9a-f]{8,}")


@dataclass(frozen=True)
class Outcome:
    """What became of one request."""

    seconds: float
    status: int | None
    """The HTTP status; None when no response came (timeout, connection error)."""
    checkpoint_id: str | None = None
    error: str | None = None
    """Why the request failed; None when it succeeded."""
    body: Any = None
    """The JSON answer of an unstreamed request."""
    retry_after: str | None = None
    """The `Retry-After` header of a refused request (429), None when it had none."""

    @property
    def ok(self) -> bool:
        return self.error is None


def new_client(base_url: str = "", connections: int = 512) -> httpx.AsyncClient:
    """An async client allowing `connections` connections at once, with `TURN_TIMEOUT_S` timeouts."""
    return httpx.AsyncClient(
        base_url=base_url,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        timeout=httpx.Timeout(TURN_TIMEOUT_S, connect=60.0),
    )


class LightClient:
    """Unstreamed JSON requests over one aiohttp session with up to `connections` connections at once."""

    def __init__(self, base_url: str, connections: int) -> None:
        self.session = aiohttp.ClientSession(
            base_url=base_url,
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=TURN_TIMEOUT_S, connect=60.0),
        )

    async def post_json(self, url: str, body: dict[str, Any]) -> tuple[int, str]:
        """(HTTP status, body text) of `POST url` with `body` as JSON."""
        async with self.session.post(url, json=body) as response:
            return response.status, await response.text()

    async def aclose(self) -> None:
        await self.session.close()


def new_light_client(base_url: str, connections: int) -> LightClient:
    """A `LightClient` for `conversations`; close it with `await client.aclose()`."""
    return LightClient(base_url, connections)


def turn_body(text: str, thread_id: str, *, stream: bool, **custom_inputs: Any) -> dict[str, Any]:
    """A Responses API request for one user message on `thread_id`, with extra `custom_inputs`."""
    body: dict[str, Any] = {
        "input": [{"role": "user", "content": text}],
        "custom_inputs": {"thread_id": thread_id, **custom_inputs},
    }
    if stream:
        body["stream"] = True
    return body


async def send_turn(
    client: httpx.AsyncClient, text: str, thread_id: str, *, stream: bool, url: str = "/responses", **custom_inputs: Any
) -> Outcome:
    """One turn; never raises for what the server does (errors are in the `Outcome`)."""
    start = time.perf_counter()
    body = turn_body(text, thread_id, stream=stream, **custom_inputs)
    status: int | None = None
    try:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            if not stream:
                response = await client.post(url, json=body)
                status = response.status_code
                return _judge(start, status, response.text, response.headers.get("retry-after"))
            async with client.stream("POST", url, json=body) as response:
                status = response.status_code
                if status != 200:
                    text = (await response.aread()).decode(errors="replace")
                    return _judge(start, status, text, response.headers.get("retry-after"))
                checkpoint_id, error = None, None
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[len("data:") :])
                    if event.get("type") == "error":
                        error = error or f"error event: {event.get('message') or event}"
                    checkpoint_id = (event.get("custom_outputs") or {}).get("checkpoint_id") or checkpoint_id
                if error is None and checkpoint_id is None:
                    error = "the stream ended without custom_outputs.checkpoint_id"
                return Outcome(time.perf_counter() - start, status, checkpoint_id, error)
    except TimeoutError:
        error = f"no complete answer within {TURN_TIMEOUT_S:.0f} s"
    except (httpx.HTTPError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Outcome(time.perf_counter() - start, status, None, error)


async def _send_unstreamed(client: LightClient, text: str, thread_id: str, url: str) -> Outcome:
    """One unstreamed turn through a `LightClient`; never raises for what the server does."""
    start = time.perf_counter()
    status: int | None = None
    try:
        status, answer = await client.post_json(url, turn_body(text, thread_id, stream=False))
        return _judge(start, status, answer)
    except TimeoutError:
        error = f"no complete answer within {TURN_TIMEOUT_S:.0f} s"
    except (aiohttp.ClientError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Outcome(time.perf_counter() - start, status, None, error)


def _judge(start: float, status: int, text: str, retry_after: str | None = None) -> Outcome:
    seconds = time.perf_counter() - start
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if status != 200:
        message = body.get("message") or body.get("detail") if isinstance(body, dict) else None
        return Outcome(seconds, status, None, f"HTTP {status}: {message or text[:200]}", body, retry_after)
    outputs = (body or {}).get("custom_outputs") or {} if isinstance(body, dict) else {}
    if not outputs.get("checkpoint_id"):
        return Outcome(seconds, status, None, "the answer has no custom_outputs.checkpoint_id", body)
    return Outcome(seconds, status, outputs["checkpoint_id"], None, body)


async def at_once(client: httpx.AsyncClient, count: int, *, stream: bool, label: str) -> tuple[float, list[Outcome]]:
    """`count` turns sent at once, each on a new thread; (wall seconds until the last ended, outcomes)."""
    start = time.perf_counter()
    outcomes = await asyncio.gather(
        *(send_turn(client, f"I'm planning a trip ({label} conversation {n}).", new_thread_id(label), stream=stream)
          for n in range(count))
    )  # fmt: skip
    return time.perf_counter() - start, list(outcomes)


async def conversations(
    client: LightClient, turns: int, concurrency: int, *, label: str, url: str = "/responses"
) -> tuple[float, list[Outcome]]:
    """`turns` unstreamed turns by `concurrency` conversations at once, each on its own thread;
    (wall seconds, outcomes)."""
    remaining = turns
    outcomes: list[Outcome] = []

    async def conversation() -> None:
        nonlocal remaining
        thread_id = new_thread_id(label)
        while remaining > 0:
            remaining -= 1
            text = f"Turn {len(outcomes)} of {label}"
            outcomes.append(await _send_unstreamed(client, text, thread_id, url))

    start = time.perf_counter()
    await asyncio.gather(*(conversation() for _ in range(concurrency)))
    return time.perf_counter() - start, outcomes


def new_thread_id(label: str) -> str:
    return f"load-{label}-{uuid.uuid4()}"


def summarize(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Counts, error reasons (the 5 most frequent, ids and numbers masked) and p50/max seconds."""
    reasons = collections.Counter(_IDS.sub("<id>", o.error)[:160] for o in outcomes if o.error)
    times = [o.seconds for o in outcomes]
    return {
        "requests": len(outcomes),
        "errors": sum(not o.ok for o in outcomes),
        "error_reasons": dict(reasons.most_common(5)),
        "p50_s": statistics.median(times) if times else None,
        "max_s": max(times) if times else None,
    }


class Poller:
    """Sends one request every `interval` seconds in its own OS thread, until stopped; subclasses say which.

    One request at a time, as one user would: a request that takes longer than
    `interval` is followed at once by the next, so a stuck server shows as a
    large max over few requests, not as many slow requests piling onto it.
    """

    name = "poller"

    def __init__(self, base_url: str, interval: float) -> None:
        self.base_url = base_url
        self.interval = interval
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> list[Outcome]:
        """Stop after the request in flight; the outcomes of every request."""
        self._stop.set()
        self._thread.join()
        return self.outcomes

    def request(self, client: httpx.Client) -> str | None:
        """Send one request; why it failed, or None when it succeeded."""
        raise NotImplementedError

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=TURN_TIMEOUT_S) as client:
            due = time.perf_counter()
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    error = self.request(client)
                except (httpx.HTTPError, ValueError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
                self.outcomes.append(Outcome(time.perf_counter() - start, None, None, error))
                due = max(due + self.interval, time.perf_counter())
                self._stop.wait(due - time.perf_counter())


class HistoryPoller(Poller):
    """Reads one thread's history over HTTP every `interval` seconds (`Poller`).

    Each read is `POST /invocations` with `custom_inputs.action = get_checkpoint_history`.
    """

    name = "history-poller"

    def __init__(self, base_url: str, thread_id: str, user_id: str | None, interval: float = 0.1) -> None:
        super().__init__(base_url, interval)
        self.body = {"input": [], "custom_inputs": {"action": "get_checkpoint_history", "thread_id": thread_id}}
        if user_id:
            self.body["custom_inputs"]["user_id"] = user_id

    def request(self, client: httpx.Client) -> str | None:
        response = client.post("/invocations", json=self.body)
        ok = response.status_code == 200 and "history" in (response.json().get("custom_outputs") or {})
        return None if ok else f"HTTP {response.status_code}: {response.text[:200]}"


class HealthPoller(Poller):
    """`GET /health` every `interval` seconds (`Poller`): what a load balancer's health check sees."""

    name = "health-poller"

    def __init__(self, base_url: str, interval: float = 0.05) -> None:
        super().__init__(base_url, interval)

    def request(self, client: httpx.Client) -> str | None:
        response = client.get("/health")
        return None if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:200]}"


class ConnectionSampler:
    """Counts the connections to one database (`pg_stat_activity`) every `interval` seconds, in its own OS thread."""

    def __init__(self, server_url: str, dbname: str, interval: float = 0.05) -> None:
        self.server_url = server_url
        self.dbname = dbname
        self.interval = interval
        self.samples: list[int] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-sampler", daemon=True)

    def start(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def stop(self) -> list[int]:
        """Stop; the samples taken, oldest first.

        Raises:
            RuntimeError: the sampler lost its connection (the samples would hide a peak).
        """
        self._stop.set()
        self._thread.join()
        if self.error:
            raise RuntimeError(f"sampling pg_stat_activity failed: {self.error}")
        return self.samples

    def _run(self) -> None:
        try:
            with psycopg.connect(self.server_url, autocommit=True, connect_timeout=10) as conn:
                while not self._stop.is_set():
                    self.samples.append(conn.execute(CONNECTIONS_SQL, (self.dbname,)).fetchone()[0])
                    self._stop.wait(self.interval)
        except psycopg.Error as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def check_chain(
    history: Sequence[dict[str, Any]],
    landed: dict[str, str],
    refused: Iterable[str],
    head_user_texts: Sequence[str],
) -> list[str]:
    """What is wrong with one thread after concurrent turns; empty when nothing is.

    Args:
        history: its `get_checkpoint_history` entries, newest first (all of them).
        landed: user text -> checkpoint_id of each turn answered 200.
        refused: user texts of the turns answered 409 (ThreadBusy).
        head_user_texts: the user messages of the head checkpoint's state, in order.

    A linear chain: oldest first, every checkpoint's parent is the one before it
    (a first checkpoint with 0 messages, a root some designs write, is allowed),
    each turn adds 2 messages, there is one checkpoint per landed turn, and the
    checkpoints are exactly those the answers named. No lost or duplicated turn:
    the head holds each landed user message once and no refused one.
    """
    problems: list[str] = []
    entries = list(reversed(history))
    parent = None
    if entries and entries[0]["message_count"] == 0:
        parent = entries.pop(0)["checkpoint_id"]
    for index, entry in enumerate(entries):
        if entry["parent_checkpoint_id"] != parent:
            problems.append(f"checkpoint {entry['checkpoint_id']} has parent {entry['parent_checkpoint_id']}, "
                            f"not the checkpoint before it ({parent}): a fork")  # fmt: skip
        if entry["message_count"] != 2 * (index + 1):
            problems.append(f"checkpoint {entry['checkpoint_id']} holds {entry['message_count']} messages, "
                            f"expected {2 * (index + 1)}")  # fmt: skip
        parent = entry["checkpoint_id"]
    if len(entries) != len(landed):
        problems.append(f"{len(entries)} turn checkpoints for {len(landed)} turns answered 200")
    unknown = {e["checkpoint_id"] for e in entries} ^ set(landed.values())
    if unknown:
        problems.append(f"{len(unknown)} checkpoints not both in the history and in an answer")
    counts = collections.Counter(head_user_texts)
    duplicated = sorted(text for text, n in counts.items() if n > 1)
    lost = sorted(set(landed) - set(counts))
    stored_refused = sorted(set(refused) & set(counts))
    for what, texts in (("duplicated", duplicated), ("lost", lost), ("refused but stored", stored_refused)):
        if texts:
            problems.append(f"{what} user messages: {texts[:3]}{' ...' if len(texts) > 3 else ''}")
    return problems
