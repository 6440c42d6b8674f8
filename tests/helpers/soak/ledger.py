"""What the soak's clients tried and what they were told: one `Op` per write, one `ThreadBook` per thread.

The checks (`soak.checks`) compare this against the database. An op's outcome is
what the client was finally told, after its retries:

* `landed`: a 200 with the new checkpoint (or thread); `checkpoint_id` says which.
* `refused`: a final answer that nothing was done (`reason`: `TurnCancelled`, `ThreadBusy`
  under `reject` on a shared thread, `InvalidRequest`...).
* `unresolved`: the client gave up retrying (`reason`: the last answer it got).

A `ThreadBook` holds what a client knows of one thread: the checkpoints that were there when
it learned of the thread (`base`: the root a first turn wrote, or a fork's or an import's
copies, read back once they landed) and those it was told of since (`told`); the thread must
end up holding exactly these. `head` is the head the last landed op left, for threads one
client writes alone.

Every op that sends text carries a unique token, `[op:<run>-<n>]`, at the start of its text:
the checks find a turn's messages by it (the model quotes user messages, so a reply carries the
tokens of the turn it answers).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Finds the tokens of ops in any text.
TOKEN_RE = re.compile(r"\[op:([0-9a-z]+-[0-9]+)\]")

#: Ops that are turns (the model runs); the summary counts them as "turns tried".
TURN_KINDS = ("new_thread", "turn", "shared_turn", "memory", "edit", "regenerate")

#: Ops that write without a turn.
OTHER_WRITE_KINDS = ("update_state", "set_head", "fork", "import", "expire")


@dataclass
class Op:
    """One write a client tried."""

    id: str
    kind: str
    user_id: str
    thread_id: str | None
    key: str | None = None
    token: str | None = None
    #: `landed`, `refused`, `unresolved` (or `pending` while it runs).
    outcome: str = "pending"
    reason: str | None = None
    checkpoint_id: str | None = None
    #: `completed` or `interrupted` for turns.
    status: str | None = None
    attempts: int = 0
    #: Set by the checks: the op did not land for its client, but its key's result was stored.
    late: bool = False
    #: What a fork or an import should have written (the source chain's or the document's checkpoint count).
    expected_count: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tag(self) -> str | None:
        return f"[op:{self.token}]" if self.token else None


@dataclass
class ThreadBook:
    """What the clients know of one thread."""

    thread_id: str
    user_id: str
    #: `own` (one client writes it), `shared` (every client of the user), `ephemeral` (a ttl was set; swept).
    kind: str
    origin: str
    base: set[str] = field(default_factory=set)
    told: dict[str, str] = field(default_factory=dict)
    head: str | None = None
    #: The head and message count when the ttl was set (ephemeral threads).
    ttl_head: str | None = None
    ttl_message_count: int | None = None
    #: Ops on this thread whose outcome is not known for sure (unresolved, or landed late): the head is not checked.
    uncertain: bool = False


class Ledger:
    """Every op and thread book of a run; thread-safe."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.lock = threading.Lock()
        self.ops: list[Op] = []
        self.books: dict[str, ThreadBook] = {}
        self._next = 0
        #: Retried answers by reason, and faults by kind (clients count their own aborts here too).
        self.retries: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        #: Answers with a 5xx other than 503 (a bug on the server), by reason, with an example each.
        self.server_errors: Counter[str] = Counter()
        self.server_error_examples: dict[str, str] = {}
        #: What the clients saw that contradicts a guarantee at once (e.g. a fork with too many checkpoints).
        self.problems: list[str] = []

    def new_op(self, kind: str, user_id: str, thread_id: str | None, *, keyed: bool, text: bool) -> Op:
        with self.lock:
            self._next += 1
            n = self._next
        name = f"{self.run_id}-{n}"
        op = Op(id=name, kind=kind, user_id=user_id, thread_id=thread_id,
                key=f"soak-{name}" if keyed else None, token=name if text else None)  # fmt: skip
        with self.lock:
            self.ops.append(op)
        return op

    def add_book(self, book: ThreadBook) -> None:
        with self.lock:
            self.books[book.thread_id] = book

    def book(self, thread_id: str) -> ThreadBook | None:
        with self.lock:
            return self.books.get(thread_id)

    def tell(self, op: Op, *, moves_head: bool) -> None:
        """Record that `op` landed at `op.checkpoint_id` in its thread's book."""
        with self.lock:
            book = self.books.get(op.thread_id)
            if book is None or op.checkpoint_id is None:
                return
            book.told[op.checkpoint_id] = op.id
            if moves_head:
                book.head = op.checkpoint_id

    def count_retry(self, reason: str) -> None:
        with self.lock:
            self.retries[reason] += 1

    def count_fault(self, kind: str) -> None:
        with self.lock:
            self.faults[kind] += 1

    def count_read(self, outcome: str) -> None:
        with self.lock:
            self.reads[outcome] += 1

    def count_server_error(self, reason: str, example: str) -> None:
        with self.lock:
            self.server_errors[reason] += 1
            self.server_error_examples.setdefault(reason, example[:300])

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def by_token(self) -> dict[str, Op]:
        with self.lock:
            return {op.token: op for op in self.ops if op.token}
