"""The soak's clients: threads that each take turns and branch operations on their user's threads, and retry.

Each `Client` is one user's session (four clients share a user): it owns the threads it
starts (only it writes them, so the checks know their head), and shares its user's `shared`
threads with the user's other clients, where turns race under a random double-texting
strategy (`reject`, `enqueue`, `interrupt`, `rollback`). It picks one op at a time (weights in
`WEIGHTS`), sends it to a random server, and retries until it gets a definite answer:

* **Turns and state updates carry an idempotency key** (in `custom_inputs` or the
  `Idempotency-Key` header, at random), and a retry sends the very same body with the same key,
  to any server. So a retry of a turn that committed gets its result, never a second turn.
* **The other writes are retried as they are**: `set_head` to the same checkpoint, `fork_thread`
  with the same `new_thread_id` (if it is "in use", the thread is looked up: there, the fork
  landed), `import_thread` of the same document under the same `thread_id` (a repeat is a
  no-op), `update_thread` with the same ttl.
* Some first attempts are abandoned by the client (`client_abort`, counted as a fault): a
  stream after its first event, a plain request after a fraction of a second.

An op's final answer goes to the `Ledger`; so do the threads a fork or an import created, read
back once they landed. Reads (history, state, branches, usage, the catalogue) are retried until
they answer.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from tests.helpers.soak.calls import Answer, send
from tests.helpers.soak.ledger import Ledger, Op, ThreadBook

#: Relative weights of the ops a client picks.
WEIGHTS = {
    "turn": 28, "new_thread": 6, "shared_turn": 14, "memory": 4, "edit": 8, "regenerate": 7,
    "update_state": 6, "set_head": 6, "fork": 5, "import": 3, "expire": 3, "read": 6,
}  # fmt: skip

#: A client stops starting threads of its own past this many.
MAX_OWN_THREADS = 12

#: Documents larger than this are not imported (the action's body limit is `max_request_bytes`, 1 MB).
MAX_IMPORT_BYTES = 400_000

#: Entries per page when a client reads a whole history (the action's largest `limit`).
HISTORY_PAGE = 1000

#: The strategies a shared-thread turn picks from.
STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")


class Client(threading.Thread):
    """One user's session; runs ops until `stop` is set, then finishes the op in hand (its retries included)."""

    def __init__(
        self,
        index: int,
        user_id: str,
        servers: Callable[[], list[str]],
        ledger: Ledger,
        stop: threading.Event,
        *,
        shared_threads: list[str],
        seed: int,
        abort_rate: float = 0.03,
        retry_seconds: float = 120.0,
    ) -> None:
        super().__init__(name=f"soak-client-{index}", daemon=True)
        self.user_id = user_id
        self.servers = servers
        self.ledger = ledger
        self.stop = stop
        self.shared = shared_threads
        self.rng = random.Random(seed)
        self.abort_rate = abort_rate
        self.retry_seconds = retry_seconds
        self.own: list[str] = []
        self.http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=4))
        self.crashed: BaseException | None = None

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.one_op()
        except BaseException as exc:  # noqa: BLE001 - reported by the runner: a client must not die silently
            self.crashed = exc
        finally:
            self.http.close()

    def one_op(self) -> None:
        kinds = list(WEIGHTS)
        weights = [WEIGHTS[k] for k in kinds]
        kind = self.rng.choices(kinds, weights)[0]
        if not self.own or (kind == "new_thread" and len(self.own) >= MAX_OWN_THREADS):
            kind = "new_thread" if len(self.own) < MAX_OWN_THREADS else "turn"
        getattr(self, f"op_{kind}")()

    # -- turns ----------------------------------------------------------------------------------
    def op_new_thread(self, *, ephemeral: bool = False) -> str | None:
        op = self.ledger.new_op("new_thread", self.user_id, None, keyed=True, text=True)
        inputs: dict[str, Any] = {}
        if self.rng.random() < 0.5:  # a thread id of the client's choosing; else the agent mints one
            op.thread_id = f"soak-{uuid.uuid4().hex[:12]}"
            inputs["thread_id"] = op.thread_id
        answer = self.write(op, self.turn_body(op, f"{op.tag} I'm planning a trip, thread {op.id}.", inputs), turn=True)
        if answer is None:
            return None
        op.thread_id = answer.outputs["thread_id"]
        book = ThreadBook(op.thread_id, self.user_id, "own", "turn", base={answer.outputs["parent_checkpoint_id"]})
        self.ledger.add_book(book)
        self.ledger.tell(op, moves_head=True)
        if not ephemeral:
            self.own.append(op.thread_id)
        return op.thread_id

    def op_turn(self, *, kind: str = "turn", text: str = "Where am I going next?") -> None:
        thread_id = self.rng.choice(self.own)
        op = self.ledger.new_op(kind, self.user_id, thread_id, keyed=True, text=True)
        inputs: dict[str, Any] = {"thread_id": thread_id}
        book = self.ledger.book(thread_id)
        if kind == "turn" and book and book.told and self.rng.random() < 0.15:
            inputs["checkpoint_id"] = self.rng.choice(sorted(book.told))  # a branch from an earlier turn
        if kind == "memory":
            text = "use save_memory " + json.dumps({"content": f"{op.tag} fact of {op.id}"})
            body = self.turn_body(op, text, inputs)
        else:
            body = self.turn_body(op, f"{op.tag} {text}", inputs)
        if self.write(op, body, turn=True):
            self.ledger.tell(op, moves_head=True)

    def op_memory(self) -> None:
        self.op_turn(kind="memory")

    def op_shared_turn(self) -> None:
        thread_id = self.rng.choice(self.shared)
        strategy = self.rng.choice(STRATEGIES)
        op = self.ledger.new_op("shared_turn", self.user_id, thread_id, keyed=True, text=True)
        op.extra["strategy"] = strategy
        inputs = {"thread_id": thread_id, "multitask_strategy": strategy}
        body = self.turn_body(op, f"{op.tag} From a shared tab ({strategy}).", inputs)
        # Under reject, a busy thread is an answer: another client's turn has it.
        if self.write(op, body, turn=True, busy_is_final=strategy == "reject"):
            self.ledger.tell(op, moves_head=False)

    def op_edit(self) -> None:
        thread_id = self.rng.choice(self.own)
        state = self.read(thread_id, "get_checkpoint_state")
        users = [m for m in (state or {}).get("messages", []) if m.get("role") == "user" and m.get("id")]
        if not users:
            return
        target = self.rng.choice(users)
        op = self.ledger.new_op("edit", self.user_id, thread_id, keyed=True, text=True)
        inputs = {"thread_id": thread_id, "edit_message_id": target["id"]}
        if self.write(op, self.turn_body(op, f"{op.tag} Actually, somewhere else.", inputs), turn=True):
            self.ledger.tell(op, moves_head=True)

    def op_regenerate(self) -> None:
        thread_id = self.rng.choice(self.own)
        op = self.ledger.new_op("regenerate", self.user_id, thread_id, keyed=True, text=False)
        body = {"input": [], "custom_inputs": {"user_id": self.user_id, "thread_id": thread_id, "regenerate": True}}
        if self.write(op, body, turn=True):
            self.ledger.tell(op, moves_head=True)

    # -- other writes ---------------------------------------------------------------------------
    def op_update_state(self) -> None:
        thread_id = self.rng.choice(self.own)
        state = self.read(thread_id, "get_checkpoint_state")
        messages = (state or {}).get("messages", [])
        if not messages or messages[-1].get("role") != "assistant" or not messages[-1].get("id"):
            return
        op = self.ledger.new_op("update_state", self.user_id, thread_id, keyed=True, text=True)
        item = {"type": "message", "role": "assistant", "id": messages[-1]["id"], "content": f"{op.tag} A revised answer."}
        body = {"input": [item], "custom_inputs": {
            "user_id": self.user_id, "thread_id": thread_id, "action": "update_checkpoint_state",
            "checkpoint_id": state["checkpoint_id"]}}  # fmt: skip
        if self.write(op, body, turn=False):
            self.ledger.tell(op, moves_head=True)

    def op_set_head(self) -> None:
        thread_id = self.rng.choice(self.own)
        listed = self.read(thread_id, "list_branches")
        branches = (listed or {}).get("branches") or []
        if not branches:
            return
        target = self.rng.choice(branches)["checkpoint_id"]
        op = self.ledger.new_op("set_head", self.user_id, thread_id, keyed=False, text=False)
        if self.write(op, self.action_body("set_head", thread_id=thread_id, checkpoint_id=target)):
            op.checkpoint_id = target
            with self.ledger.lock:
                self.ledger.books[thread_id].head = target

    def op_fork(self) -> None:
        source = self.rng.choice(self.own)
        entries = self.history(source)
        if not entries:
            return
        parents = {e["checkpoint_id"]: e.get("parent_checkpoint_id") for e in entries}
        turns = [e for e in entries if e.get("parent_checkpoint_id")]  # not the root: a fork to turn on
        start = self.rng.choice(turns)["checkpoint_id"] if turns and self.rng.random() < 0.5 else None
        chain, at = 0, start or next(e["checkpoint_id"] for e in entries if e.get("is_head"))
        while at:
            chain, at = chain + 1, parents.get(at)
        new_id = f"fork-{uuid.uuid4().hex[:12]}"
        op = self.ledger.new_op("fork", self.user_id, new_id, keyed=False, text=False)
        op.expected_count = chain
        body = self.action_body("fork_thread", thread_id=source, new_thread_id=new_id,
                                **({"checkpoint_id": start} if start else {}))  # fmt: skip
        answer = self.write(op, body, landed_if=lambda: self.thread_exists(new_id))
        if answer is not None:
            self.adopt(op, new_id, "fork")

    def op_import(self) -> None:
        source = self.rng.choice(self.own)
        exported = self.read(source, "export_thread")
        document = (exported or {}).get("document")
        if not document or len(json.dumps(document)) > MAX_IMPORT_BYTES:
            self.ledger.count_read("import-skipped")
            return
        new_id = f"copy-{uuid.uuid4().hex[:12]}"
        op = self.ledger.new_op("import", self.user_id, new_id, keyed=False, text=False)
        op.expected_count = len(document.get("checkpoints") or [])
        if self.write(op, self.action_body("import_thread", document=document, thread_id=new_id)):
            self.adopt(op, new_id, "import")

    def op_expire(self) -> None:
        """A thread of its own, then a ttl of 1 s: the servers' sweepers remove it (or trim it to its head)."""
        thread_id = self.op_new_thread(ephemeral=True)
        if thread_id is None:
            return
        op = self.ledger.new_op("expire", self.user_id, thread_id, keyed=False, text=False)
        answer = self.write(op, self.action_body("update_thread", thread_id=thread_id, ttl_seconds=1))
        if answer is not None:
            thread = answer.outputs.get("thread") or {}
            with self.ledger.lock:
                book = self.ledger.books[thread_id]
                book.kind = "ephemeral"
                book.ttl_head = thread.get("checkpoint_id")
                book.ttl_message_count = thread.get("message_count")
        else:
            self.own.append(thread_id)  # no ttl: an ordinary thread of its own

    def op_read(self) -> None:
        action = self.rng.choice(["get_checkpoint_history", "get_checkpoint_state", "list_branches", "get_usage"])
        if self.rng.random() < 0.2:
            self.read(None, "list_threads")
        else:
            self.read(self.rng.choice(self.own), action)

    def adopt(self, op: Op, thread_id: str, origin: str) -> None:
        """Book a thread a fork or an import wrote: its checkpoints as read back now (only this client writes it)."""
        entries = self.history(thread_id) or []
        ids = {e["checkpoint_id"] for e in entries}
        head = next((e["checkpoint_id"] for e in entries if e.get("is_head")), None)
        if op.expected_count is not None and len(ids) != op.expected_count:
            self.ledger.problem(f"{origin} {op.id} into {thread_id} wrote {len(ids)} checkpoints, expected {op.expected_count}")
        op.checkpoint_id = head
        self.ledger.add_book(ThreadBook(thread_id, self.user_id, "own", origin, base=ids, head=head))
        self.own.append(thread_id)

    # -- requests -------------------------------------------------------------------------------
    def turn_body(self, op: Op, text: str, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"input": [{"role": "user", "content": text}], "custom_inputs": {"user_id": self.user_id, **inputs}}

    def action_body(self, action: str, **inputs: Any) -> dict[str, Any]:
        return {"input": [], "custom_inputs": {"user_id": self.user_id, "action": action, **inputs}}

    def write(
        self,
        op: Op,
        body: dict[str, Any],
        *,
        turn: bool = False,
        busy_is_final: bool = False,
        landed_if: Callable[[], bool] | None = None,
    ) -> Answer | None:
        """Send `op` until a definite answer (module docstring); the landed answer, or None (the op's outcome says why).

        `landed_if`: asked when a retry is refused as "in use" (a fork whose first attempt landed).
        """
        key_header = None
        if op.key:
            if self.rng.random() < 0.5:
                key_header = op.key
            else:
                body = {**body, "custom_inputs": {**body["custom_inputs"], "idempotency_key": op.key}}
        # One path and one way of streaming per op: a retry is the same request.
        path = self.rng.choice(["/invocations", "/responses"])
        stream = turn and self.rng.random() < 0.5
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.1
        while True:
            op.attempts += 1
            abort = None
            if op.attempts == 1 and self.rng.random() < self.abort_rate:
                abort = self.rng.uniform(0.05, 0.4)
                self.ledger.count_fault("client_abort")
            answer = send(self.http, self.rng.choice(self.servers()), path, body, key_header=key_header,
                          stream=stream, abort_after=abort)  # fmt: skip
            if answer.kind == "ok":
                op.outcome, op.reason = "landed", None
                op.checkpoint_id = answer.outputs.get("checkpoint_id")
                op.status = answer.outputs.get("status", "completed") if turn else None
                if op.thread_id is None:
                    op.thread_id = answer.outputs.get("thread_id")
                return answer
            if answer.status is not None and answer.status >= 500 and answer.status != 503:
                self.ledger.count_server_error(answer.reason, f"{op.kind} {op.id}: {answer.message}")
            final = answer.kind == "final" or (busy_is_final and answer.reason == "ThreadBusy")
            if final and landed_if is not None and op.attempts > 1 and "in use" in answer.message:
                if landed_if():  # an earlier attempt landed
                    op.outcome = "landed"
                    return answer
                # An earlier attempt still holds the new id (its server may have been killed: until its
                # lease runs out): not an answer yet.
                final, answer.reason = False, "in use by an earlier attempt"
            if final:
                op.outcome, op.reason = "refused", answer.reason
                op.extra["message"] = answer.message[:300]
                if answer.reason == "InvalidRequest" and "idempotency_key" in answer.message:
                    self.ledger.problem(f"{op.kind} {op.id}: a retry with its own key was refused: {answer.message}")
                return None
            self.ledger.count_retry(answer.reason)
            if time.monotonic() > deadline:
                op.outcome, op.reason = "unresolved", answer.reason
                return None
            time.sleep(delay * self.rng.uniform(0.5, 1.5))
            delay = min(delay * 2, 2.0)

    def history(self, thread_id: str) -> list[dict[str, Any]] | None:
        """The thread's whole history (every page), newest first; None if a page was refused or never answered."""
        entries: list[dict[str, Any]] = []
        before = None
        while True:
            page = self.read(thread_id, "get_checkpoint_history", limit=HISTORY_PAGE, **({"before": before} if before else {}))
            if page is None:
                return None
            entries += page["history"]
            if len(page["history"]) < HISTORY_PAGE:
                return entries
            before = page["history"][-1]["checkpoint_id"]

    def read(self, thread_id: str | None, action: str, **inputs: Any) -> dict[str, Any] | None:
        """A read action's `custom_outputs`, retried until it answers; None if it was refused or never answered."""
        body = self.action_body(action, **({"thread_id": thread_id} if thread_id else {}), **inputs)
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.1
        while True:
            answer = send(self.http, self.rng.choice(self.servers()), "/invocations", body)
            if answer.kind == "ok":
                self.ledger.count_read("ok")
                return answer.outputs
            if answer.status is not None and answer.status >= 500 and answer.status != 503:
                self.ledger.count_server_error(answer.reason, f"{action} on {thread_id}: {answer.message}")
            if answer.kind == "final":
                self.ledger.count_read(f"refused:{answer.reason}")
                if thread_id in self.own:
                    self.ledger.problem(f"{action} on the client's own thread {thread_id} was refused: {answer.message}")
                return None
            if time.monotonic() > deadline:
                self.ledger.count_read("unresolved")
                return None
            time.sleep(delay * self.rng.uniform(0.5, 1.5))
            delay = min(delay * 2, 2.0)

    def thread_exists(self, thread_id: str) -> bool:
        return self.read_quietly(thread_id) is not None

    def read_quietly(self, thread_id: str) -> dict[str, Any] | None:
        body = self.action_body("get_thread", thread_id=thread_id)
        for _ in range(20):
            answer = send(self.http, self.rng.choice(self.servers()), "/invocations", body)
            if answer.kind == "ok":
                return answer.outputs
            if answer.kind == "final":
                return None
            time.sleep(0.5)
        return None
