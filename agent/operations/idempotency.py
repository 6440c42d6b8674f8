"""Exactly-once retries: a request that carries an idempotency key gets the result of the first request with it.

A client that times out cannot tell whether its turn was stored; without a
key, a retry adds the message a second time. With `custom_inputs.idempotency_key`
(or the `Idempotency-Key` HTTP header on `tt-agent serve`), following the
IETF draft "The Idempotency-Key HTTP Header Field":

* **Scope.** Keys belong to a user (`user_id`; anonymous callers share one
  scope), so one user's key never answers another user's request.
* **Fingerprint.** A request's `request_hash` is the SHA-256 of what it asks
  for (the action, thread, checkpoint, input messages and the action's own
  `custom_inputs`), not of how it is sent: `stream`, the strategy and the key
  itself are left out, so a streamed retry of a whole request is the same request.
* **Before the claim**, the key is looked up (`ThreadStorage.find_idempotent`,
  one round trip): a stored result with the same fingerprint is returned as it
  was (same `checkpoint_id`; the model is not called); one with another
  fingerprint is `InvalidRequest`. A turn that runs with the key right now
  (its claim carries it, so this works across processes) is waited for, up
  to `enqueue_timeout`, and its result returned; a failed original stored
  nothing, so the retry runs.
* **At the claim.** Requests with one key sent at the same moment can all pass
  the lookup before the first one's claim records the key; a claim that then
  finds the thread busy looks the key up again and waits in the same way
  (`Idempotency.claim_or_result`), instead of answering `ThreadBusy`. Whatever
  its strategy: a keyed claim tries without waiting first (`turns.start.claim`),
  so a duplicate does not stop, join or queue behind the first request once
  that one holds the thread. Not before: while a turn without the key holds
  the thread, requests with one key sent at once can all find no turn running
  with it (a claim records its key only once granted) and claim by their
  strategy (`enqueue`, `interrupt`, `rollback`), so the model is called for
  each and a later one's request to stop can reach the first. The commit still
  stores exactly one result (below).
* **In the commit**, the result (`{"output": [...], "custom_outputs": {...}}`)
  is stored under (user, key) in the same transaction as the turn
  (`Tx.store_response`). Two requests with one key that both found nothing
  both run, but the primary key lets only one commit; the other writes
  nothing and answers the stored result (`IdempotencyKeyTaken`).
* **Expiry.** A result is kept `idempotency_ttl_seconds` (database clock on
  Postgres). Lookups ignore expired rows, the commit that reuses an expired key
  replaces its row, and this process deletes expired rows at most once per
  `SWEEP_SECONDS`, from a lookup.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage

from agent.config import AgentSettings
from agent.errors import InvalidRequest, ThreadBusy
from agent.storage import ThreadStorage
from agent.storage.base import IdempotencyState
from agent.types import StoredResponse

#: How often (at most) this process deletes expired idempotency rows, in seconds.
SWEEP_SECONDS = 60.0

#: What a claim returns (`Idempotency.claim_or_result`).
T = TypeVar("T")

#: The scope of requests without a user_id.
ANONYMOUS = ""


def request_fingerprint(
    action: str,
    thread_id: str | None,
    checkpoint_id: str | None,
    messages: Sequence[BaseMessage],
    options: Mapping[str, Any],
) -> str:
    """SHA-256 (hex) of what a request asks for: equal for a retry, different for another request.

    Messages count by type, content, name, tool calls and tool_call_id (not their ids, which a
    client may leave to the agent); `options` are the action's own `custom_inputs`.
    """
    described = {
        "action": action,
        "thread_id": thread_id,
        "checkpoint_id": checkpoint_id,
        "messages": [
            {
                "type": m.type,
                "content": m.content,
                "name": m.name,
                "tool_calls": getattr(m, "tool_calls", None) or None,
                "tool_call_id": getattr(m, "tool_call_id", None),
            }
            for m in messages
        ],
        "options": dict(options),
    }
    encoded = json.dumps(described, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def claim_key(user_id: str | None, key: str) -> str:
    """The key as a claim carries it: scoped by user, unambiguous whatever characters either holds."""
    return json.dumps([user_id or ANONYMOUS, key])


class Idempotency:
    """Looks up and stores results by idempotency key for one agent's storage."""

    def __init__(self, storage: ThreadStorage, settings: AgentSettings) -> None:
        self.storage = storage
        self.settings = settings
        self._next_sweep = 0.0
        self._sweep_lock = threading.Lock()

    # -- before the claim ---------------------------------------------------------------------
    def lookup(self, user_id: str | None, key: str, request_hash: str) -> StoredResponse | None:
        """The stored result for this key, waiting (up to `enqueue_timeout`) for a turn that runs with it.

        Returns None when the request should run: no result is stored and no turn runs with the key.

        Raises:
            InvalidRequest: the key was used for a different request.
            ThreadBusy: the turn that runs with the key did not finish within `enqueue_timeout`.
            StorageUnavailable: the database failed.
        """
        self._maybe_sweep()
        return self._wait(user_id, key, request_hash)[0]

    async def alookup(
        self, user_id: str | None, key: str, request_hash: str, in_io: Callable[..., Awaitable[Any]]
    ) -> StoredResponse | None:
        """`lookup` for the event loop: database calls through `in_io`, waits without holding a thread."""
        await in_io(self._maybe_sweep)
        return (await self._await(user_id, key, request_hash, in_io))[0]

    def claim_or_result(
        self, claim: Callable[[], T], user_id: str | None, key: str | None, request_hash: str | None
    ) -> T | StoredResponse:
        """`claim()`, or, when it finds the thread busy with the first request of `key`, that request's result.

        Requests with one key sent at the same moment may all look the key up before the first one's claim
        records it; the others' claims then find the thread busy. Each looks the key up again and waits for
        the turn that runs with it (as `lookup` does): its stored result is returned; if it failed (nothing
        stored), the claim is tried again. It is also tried again, once, when the first look finds no turn
        with the key: the first request may have failed between the claim's `ThreadBusy` and that look, and
        left the thread free. A thread busy with a turn that does not carry the key is `ThreadBusy`, as
        without a key.

        Raises:
            ThreadBusy: as `claim()`, or the key's turn ran longer than `enqueue_timeout`.
            InvalidRequest: the key was used for a different request.
            StorageUnavailable: the database failed.
        """
        retried = False
        while True:
            try:
                return claim()
            except ThreadBusy:
                if key is None or request_hash is None:
                    raise
                stored, ran = self._wait(user_id, key, request_hash)
                if stored is not None:
                    return stored
                if not ran:
                    if retried:
                        raise
                    retried = True

    async def aclaim_or_result(
        self,
        claim: Callable[[], Awaitable[T]],
        user_id: str | None,
        key: str | None,
        request_hash: str | None,
        in_io: Callable[..., Awaitable[Any]],
    ) -> T | StoredResponse:
        """`claim_or_result` for the event loop: database calls through `in_io`, waits without holding a thread."""
        retried = False
        while True:
            try:
                return await claim()
            except ThreadBusy:
                if key is None or request_hash is None:
                    raise
                stored, ran = await self._await(user_id, key, request_hash, in_io)
                if stored is not None:
                    return stored
                if not ran:
                    if retried:
                        raise
                    retried = True

    def _wait(self, user_id: str | None, key: str, request_hash: str) -> tuple[StoredResponse | None, bool]:
        """The stored result (None: there is none), and whether a turn ran with the key meanwhile."""
        deadline = time.monotonic() + self.settings.enqueue_timeout
        delay, ran = 0.01, False
        while True:
            state = self.storage.find_idempotent(user_id or ANONYMOUS, key, claim_key(user_id, key))
            done, stored = self._decide(state, key, request_hash, deadline)
            if done:
                return stored, ran
            ran = True
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)

    async def _await(
        self, user_id: str | None, key: str, request_hash: str, in_io: Callable[..., Awaitable[Any]]
    ) -> tuple[StoredResponse | None, bool]:
        """`_wait` on the event loop."""
        deadline = time.monotonic() + self.settings.enqueue_timeout
        delay, ran = 0.01, False
        while True:
            state = await in_io(self.storage.find_idempotent, user_id or ANONYMOUS, key, claim_key(user_id, key))
            done, stored = self._decide(state, key, request_hash, deadline)
            if done:
                return stored, ran
            ran = True
            await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)

    def after_race(self, user_id: str | None, key: str, request_hash: str) -> StoredResponse:
        """The result another request stored under the key first (see `IdempotencyKeyTaken`)."""
        state = self.storage.find_idempotent(user_id or ANONYMOUS, key, claim_key(user_id, key))
        done, stored = self._decide(state, key, request_hash, deadline=0.0)
        if stored is None:  # pragma: no cover - the row was committed a moment ago; only a sweep of a tiny TTL races it
            raise ThreadBusy(f"Another request with idempotency_key {key!r} committed first; retry it.")
        return stored

    def _decide(
        self, state: IdempotencyState, key: str, request_hash: str, deadline: float
    ) -> tuple[bool, StoredResponse | None]:
        if state.response is not None:
            if state.request_hash != request_hash:
                raise InvalidRequest(
                    f"idempotency_key {key!r} was already used for a different request; use a new key for a new request."
                )
            return True, StoredResponse(
                output=list(state.response.get("output") or []), custom_outputs=dict(state.response["custom_outputs"])
            )
        if state.running_thread_id is None:
            return True, None
        if time.monotonic() >= deadline:
            raise ThreadBusy(
                f"The request with idempotency_key {key!r} is still running on thread {state.running_thread_id!r} "
                f"after {self.settings.enqueue_timeout} s; retry it later to get its result.",
                thread_id=state.running_thread_id,
            )
        return False, None

    def _maybe_sweep(self) -> None:
        with self._sweep_lock:
            if time.monotonic() < self._next_sweep:
                return
            self._next_sweep = time.monotonic() + min(SWEEP_SECONDS, self.settings.idempotency_ttl_seconds)
        self.storage.sweep_idempotency()

    # -- in the commit ----------------------------------------------------------------------------
    def storing(
        self,
        apply: Callable[[Any], None],
        *,
        user_id: str | None,
        key: str,
        request_hash: str,
        response: StoredResponse,
    ) -> Callable[[Any], None]:
        """`apply` (a commit's writes), followed by storing `response` under the key in the same transaction."""
        ttl = self.settings.idempotency_ttl_seconds

        def apply_and_store(tx: Any) -> None:
            apply(tx)
            tx.store_response(
                user_id or ANONYMOUS,
                key,
                request_hash=request_hash,
                thread_id=response.custom_outputs["thread_id"],
                response=response.as_dict(),
                ttl_seconds=ttl,
            )

        return apply_and_store
