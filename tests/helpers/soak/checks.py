"""The soak's end checks: what the clients were told against what the database holds.

`check_run` first settles what is not settled: an op whose client never heard it landed but
whose idempotency key has a stored result did land (its commit wrote both), and a fork or an
import whose thread exists did too; these are "landed late", and their threads' heads are not
checked. Then, beside the table checks of `soak.snapshot`:

* **Content** (through LangGraph's checkpointer API, `saver.list`, which decodes the agent's
  message deltas): every checkpoint's messages load, no message id twice in one checkpoint,
  no op's text in two user messages of one checkpoint, every checkpoint after a turn ends with
  the model's answer (not a user message waiting for one, nor a tool call without its result)
  unless it is an interrupted turn's, and the thread record's `message_count` is its head's.
* **Ledger** (lost, duplicated): each thread holds exactly the checkpoints its clients know
  (`ThreadBook.base` and `told`). A told checkpoint that is not there is **lost**. A checkpoint
  nobody was told of is **duplicated** when it repeats the text of an op that landed (a retry
  that ran again), or "unattributed" (counted as duplicated too); one that carries the text of an
  op that was refused is **written though refused**. Each told checkpoint must carry its own op's
  text (a replayed result naming another turn's checkpoint would not), the text of a refused op
  may appear nowhere, a thread nobody knows is a duplicate of the turn that made it, the head of a
  thread one client writes is where its last op left it, and every keyed op that landed has its
  stored result naming the checkpoint its client got.
* **Retention**: a thread given a ttl is gone from every table (`delete`), or is its head alone,
  a root holding all its messages (`keep_latest`).
* **Memories**: a memory turn that landed saved its fact exactly once (more only when it was
  regenerated), naming the checkpoint that made it; a refused one saved nothing.
* **Round trip**: every thread exported, imported into a fresh Postgres database and a fresh
  SQLite file, and exported again, gives the same document (but for when it was exported, and
  the record's timestamps and ttl, which the docs say an import does not keep), and the same history.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from agent import create_agent
from tests.helpers.soak.ledger import TOKEN_RE, Ledger, Op, ThreadBook
from tests.helpers.soak.snapshot import Snapshot, orphan_problems, tree_problems

#: Problems listed per check in the summary (the count is always whole).
SHOWN = 8


@dataclass
class Check:
    name: str
    detail: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Verdict:
    checks: list[Check]
    lost: int = 0
    duplicated: int = 0
    written_though_refused: int = 0
    late: int = 0
    stale_claims: int = 0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks) and not (self.lost or self.duplicated or self.written_though_refused)


def tokens_of(message: BaseMessage) -> set[str]:
    text = message.content if isinstance(message.content, str) else json.dumps(message.content, default=str)
    calls = json.dumps(getattr(message, "tool_calls", None) or [], default=str)
    return set(TOKEN_RE.findall(text + calls))


@dataclass
class ThreadContent:
    """Per checkpoint of one thread: its messages' tokens, the tokens it brought in (`_new_tokens`)."""

    tokens: dict[str, set[str]] = field(default_factory=dict)
    new: dict[str, set[str]] = field(default_factory=dict)
    head_messages: int | None = None


def read_content(agent: Any, snap: Snapshot, check: Check) -> dict[str, ThreadContent]:
    contents: dict[str, ThreadContent] = {}
    for thread_id in sorted(snap.thread_ids()):
        content = contents[thread_id] = ThreadContent()
        parents: dict[str, str | None] = {}
        listed: dict[str, list[BaseMessage]] = {}
        try:
            tuples = list(agent.storage.saver.list({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}))
        except Exception as exc:  # noqa: BLE001 - a checkpoint that does not load is what this looks for
            check.problems.append(f"thread {thread_id}: its checkpoints do not load: {type(exc).__name__}: {exc}")
            continue
        head = (snap.threads.get(thread_id) or {}).get("head_checkpoint_id")
        for tup in tuples:
            checkpoint_id = tup.config["configurable"]["checkpoint_id"]
            parents[checkpoint_id] = (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            messages = list(tup.checkpoint["channel_values"].get("messages") or [])
            where = f"checkpoint {checkpoint_id} of thread {thread_id}"
            ids = Counter(m.id for m in messages if m.id)
            if any(n > 1 for n in ids.values()):
                check.problems.append(f"{where}: message ids twice: {[i for i, n in ids.items() if n > 1]}")
            user_tokens = Counter(t for m in messages if isinstance(m, HumanMessage) for t in tokens_of(m))
            if any(n > 1 for n in user_tokens.values()):
                check.problems.append(f"{where}: an op's text in two user messages: {[t for t, n in user_tokens.items() if n > 1]}")
            interrupted = bool((tup.metadata or {}).get("interrupted"))
            if messages and not interrupted and not _answered(messages[-1]):
                check.problems.append(f"{where}: ends with a {messages[-1].type} message, not the model's answer")
            content.tokens[checkpoint_id] = set().union(*(tokens_of(m) for m in messages)) if messages else set()
            listed[checkpoint_id] = messages
            if checkpoint_id == head:
                content.head_messages = len(messages)
        for checkpoint_id, messages in listed.items():
            parent = parents.get(checkpoint_id)
            if parent is not None:
                content.new[checkpoint_id] = _new_tokens(messages, listed.get(parent, []))
        record = snap.threads.get(thread_id)
        if record and content.head_messages is not None and record["message_count"] != content.head_messages:
            check.problems.append(
                f"thread {thread_id}: message_count {record['message_count']}, its head has {content.head_messages}"
            )
    check.detail = f"{snap.checkpoint_count} checkpoints of {len(contents)} threads read"
    return contents


def _new_tokens(messages: list[BaseMessage], parent: list[BaseMessage]) -> set[str]:
    """The ops whose text a checkpoint brought in: the tokens of its user messages that its parent does not
    hold (by id and text: an edit in place is new), and of its other new messages (the answer, an edited
    answer) those its parent holds nowhere (an answer quotes the earlier user messages)."""
    before = {(m.id, str(m.content)) for m in parent}
    new = [m for m in messages if (m.id, str(m.content)) not in before]
    seen = set().union(*(tokens_of(m) for m in parent)) if parent else set()
    from_users = {t for m in new if isinstance(m, HumanMessage) for t in tokens_of(m)}
    return from_users | {t for m in new if not isinstance(m, HumanMessage) for t in tokens_of(m) - seen}


def _answered(message: BaseMessage) -> bool:
    return isinstance(message, AIMessage) and not message.tool_calls


def settle_late(ledger: Ledger, snap: Snapshot) -> int:
    """Mark the ops that landed after their client stopped waiting (module docstring); how many."""
    late = 0
    for op in ledger.ops:
        if op.outcome == "landed":
            continue
        book = ledger.books.get(op.thread_id or "")
        if op.key and (op.user_id, op.key) in snap.idempotency:
            row = snap.idempotency[(op.user_id, op.key)]
            op.late, op.thread_id, op.checkpoint_id = True, row["thread_id"], row["checkpoint_id"]
            book = ledger.books.get(op.thread_id)
            if book is None:  # a first turn: the thread exists only through it
                cp = snap.checkpoints.get(op.thread_id, {}).get(op.checkpoint_id)
                book = ThreadBook(op.thread_id, op.user_id, "own", "turn", base={cp.parent_id} if cp and cp.parent_id else set())
                ledger.books[op.thread_id] = book
            if op.checkpoint_id:
                book.told[op.checkpoint_id] = op.id
            book.uncertain = True
            late += 1
        elif op.kind in ("fork", "import") and op.thread_id in snap.threads and book is None:
            op.late = True
            ids = set(snap.checkpoints.get(op.thread_id, {}))
            if op.expected_count is not None and len(ids) != op.expected_count:
                ledger.problem(f"{op.kind} {op.id} into {op.thread_id} wrote {len(ids)} checkpoints, expected {op.expected_count}")
            ledger.books[op.thread_id] = ThreadBook(op.thread_id, op.user_id, "own", op.kind, base=ids, uncertain=True)
            late += 1
        elif op.outcome == "unresolved" and book is not None:
            book.uncertain = True
    return late


def landed(op: Op) -> bool:
    return op.outcome == "landed" or op.late


def compare_ledger(ledger: Ledger, snap: Snapshot, contents: dict[str, ThreadContent], verdict: Verdict, check: Check) -> None:
    by_token = ledger.by_token()
    ops_by_id = {op.id: op for op in ledger.ops}

    def attribute(thread_id: str, checkpoint_id: str) -> None:
        new = contents.get(thread_id, ThreadContent()).new.get(checkpoint_id, set())
        ops = [by_token[t] for t in sorted(new) if t in by_token]
        where = f"checkpoint {checkpoint_id} of thread {thread_id}"
        if any(landed(op) for op in ops):
            verdict.duplicated += 1
            check.problems.append(f"duplicated: {where} repeats {', '.join(op.kind + ' ' + op.id for op in ops if landed(op))}")
        elif ops:
            verdict.written_though_refused += 1
            check.problems.append(f"written though refused: {where} carries {', '.join(f'{o.kind} {o.id} ({o.reason})' for o in ops)}")
        else:
            verdict.duplicated += 1
            check.problems.append(f"duplicated: {where} was told to nobody (new text: {sorted(new) or 'none'})")

    for thread_id, book in sorted(ledger.books.items()):
        if book.kind == "ephemeral":
            continue
        stored = set(snap.checkpoints.get(thread_id, {}))
        for checkpoint_id, op_id in sorted(book.told.items()):
            if checkpoint_id not in stored:
                verdict.lost += 1
                check.problems.append(f"lost: {ops_by_id[op_id].kind} {op_id} told checkpoint {checkpoint_id} of thread {thread_id}")
                continue
            op = ops_by_id[op_id]
            if op.token and op.token not in contents[thread_id].new.get(checkpoint_id, set()):
                check.problems.append(f"{op.kind} {op_id} was told checkpoint {checkpoint_id}, which does not carry its text")
        for checkpoint_id in sorted(book.base - stored):
            verdict.lost += 1
            check.problems.append(f"lost: checkpoint {checkpoint_id} of thread {thread_id}, there when its client read it")
        for checkpoint_id in sorted(stored - book.base - set(book.told)):
            attribute(thread_id, checkpoint_id)
        record = snap.threads.get(thread_id)
        if book.kind == "own" and not book.uncertain and record and book.head and record["head_checkpoint_id"] != book.head:
            check.problems.append(f"thread {thread_id}: head {record['head_checkpoint_id']}, its client last left it at {book.head}")
    for thread_id in sorted(snap.thread_ids() - set(ledger.books)):
        for checkpoint_id, cp in sorted(snap.checkpoints.get(thread_id, {}).items()):
            if cp.parent_id is not None:
                attribute(thread_id, checkpoint_id)
    # The text of an op that was refused may appear nowhere.
    seen_anywhere = defaultdict(set)
    for thread_id, content in contents.items():
        for checkpoint_id, tokens in content.tokens.items():
            for token in tokens:
                seen_anywhere[token].add((thread_id, checkpoint_id))
    for op in ledger.ops:
        if op.token and not landed(op) and op.outcome == "refused" and seen_anywhere.get(op.token):
            verdict.written_though_refused += 1
            thread_id, checkpoint_id = sorted(seen_anywhere[op.token])[0]
            check.problems.append(f"written though refused: {op.kind} {op.id} ({op.reason}) is in checkpoint {checkpoint_id} of {thread_id}")
    # Every keyed op that landed has its result stored, naming what its client got.
    known_keys = {(op.user_id, op.key) for op in ledger.ops if op.key}
    for op in ledger.ops:
        if not (op.key and landed(op)):
            continue
        book = ledger.books.get(op.thread_id or "")
        row = snap.idempotency.get((op.user_id, op.key))
        if book is not None and book.kind == "ephemeral":
            continue  # checked with retention
        if row is None:
            check.problems.append(f"{op.kind} {op.id} landed but its idempotency result is not stored")
        elif row["checkpoint_id"] != op.checkpoint_id:
            check.problems.append(f"{op.kind} {op.id}: told {op.checkpoint_id}, its stored result names {row['checkpoint_id']}")
    for user_key, key in sorted(set(snap.idempotency) - known_keys):
        check.problems.append(f"an idempotency result nobody sent: {key!r} of {user_key!r}")
    told = sum(len(b.told) for b in ledger.books.values())
    check.detail = f"{told} told checkpoints in {len(ledger.books)} threads"


def check_retention(ledger: Ledger, snap: Snapshot, ttl_strategy: str, check: Check) -> None:
    books = [b for b in ledger.books.values() if b.kind == "ephemeral"]
    for book in books:
        rows = snap.rows_of_thread(book.thread_id)
        if ttl_strategy == "delete":
            left = {table: n for table, n in rows.items() if n}
            if left:
                check.problems.append(f"thread {book.thread_id} (ttl 1 s) not swept whole: rows left {left}")
            continue
        cps = snap.checkpoints.get(book.thread_id, {})
        record = snap.threads.get(book.thread_id)
        if set(cps) != {book.ttl_head} or record is None:
            check.problems.append(f"thread {book.thread_id} (ttl 1 s): checkpoints {sorted(cps)}, expected its head {book.ttl_head} alone")
        elif cps[book.ttl_head].parent_id is not None or record["head_checkpoint_id"] != book.ttl_head:
            check.problems.append(f"thread {book.thread_id}: the kept head {book.ttl_head} is not a root and the head")
        elif record["message_count"] != book.ttl_message_count:
            check.problems.append(f"thread {book.thread_id}: {record['message_count']} messages kept of {book.ttl_message_count}")
    check.detail = f"{len(books)} threads swept ({ttl_strategy})"


def check_memories(ledger: Ledger, snap: Snapshot, contents: dict[str, ThreadContent], check: Check) -> None:
    by_token = ledger.by_token()
    rows_by_token: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for memory in snap.memories:
        for token in TOKEN_RE.findall(str(memory.get("content", ""))):
            rows_by_token[token].append(memory)
    ops = [op for op in ledger.ops if op.kind == "memory"]
    for op in ops:
        rows = rows_by_token.get(op.token, [])
        # Runs of the memory turn that were told: the turn itself, and regenerations of it.
        runs = {
            (thread_id, cp)
            for thread_id, book in ledger.books.items()
            for cp, op_id in book.told.items()
            if op.token in contents.get(thread_id, ThreadContent()).new.get(cp, set())
        }
        if not landed(op):
            if rows and op.outcome == "refused":
                check.problems.append(f"memory {op.id} was refused ({op.reason}) but saved {len(rows)} memories")
            continue
        if not rows or len(rows) > max(1, len(runs)):
            check.problems.append(f"memory {op.id} landed and saved {len(rows)} memories (runs told: {len(runs)})")
        for row in rows:
            made = contents.get(row.get("thread_id"), ThreadContent()).new.get(row.get("checkpoint_id"), set())
            if op.token not in made:
                check.problems.append(f"memory of {op.id} names checkpoint {row.get('checkpoint_id')}, which did not save it")
    for token in sorted(set(rows_by_token) - set(by_token)):
        check.problems.append(f"a memory nobody asked for: {token}")
    check.detail = f"{len(snap.memories)} memories, {len(ops)} memory turns"


def check_round_trip(agent: Any, snap: Snapshot, targets: dict[str, str], check: Check) -> None:
    """Export each thread, import it into each target URL (fresh stores), export again: the same."""
    opened = {name: create_agent(url, model="offline", tracing=False) for name, url in targets.items()}
    try:
        for thread_id, record in sorted(snap.threads.items()):
            user_id = record["user_id"]
            try:
                document = agent.export_thread(thread_id, user_id=user_id)
                history = agent.get_checkpoint_history(thread_id, user_id=user_id)
            except Exception as exc:  # noqa: BLE001 - reported as a failed check
                check.problems.append(f"export of {thread_id}: {type(exc).__name__}: {exc}")
                continue
            for name, target in opened.items():
                try:
                    target.import_thread(json.loads(json.dumps(document)), user_id=user_id)
                    again = target.export_thread(thread_id, user_id=user_id)
                    their_history = target.get_checkpoint_history(thread_id, user_id=user_id)
                except Exception as exc:  # noqa: BLE001 - reported as a failed check
                    check.problems.append(f"{thread_id} into {name}: {type(exc).__name__}: {exc}")
                    continue
                first = first_difference(_comparable(document), _comparable(again))
                if first:
                    check.problems.append(f"{thread_id}: exported again from {name}, the document differs at {first}")
                elif their_history != history:
                    check.problems.append(f"{thread_id}: its history in {name} differs")
    finally:
        for target in opened.values():
            target.close()
    check.detail = f"{len(snap.threads)} threads into {', '.join(targets)}"


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two JSON values first differ (`checkpoints[0].metadata.usage: {...} != missing`), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}: {'missing' if key not in a else repr(a[key])[:60]} != {'missing' if key not in b else repr(b[key])[:60]}"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {repr(a)[:60]} != {repr(b)[:60]}"


def _comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The document without what an import does not keep (docs/guides/operations.md, "What is not restored":
    the record's timestamps, and `ttl_seconds`, which follows the importing deployment), and each checkpoint's
    pending writes in one order: the document lists them in the order the database returns them, which
    follows LangGraph's `task_path`, a field the document does not carry (so an imported copy lists them
    by task id)."""
    thread = {k: v for k, v in document["thread"].items() if k not in ("created_at", "updated_at", "ttl_seconds")}
    checkpoints = [
        {**c, "pending_writes": sorted(c.get("pending_writes") or [], key=lambda w: json.dumps(w, sort_keys=True, default=str))}
        if isinstance(c, dict) else c
        for c in document.get("checkpoints") or []
    ]
    return {**{k: v for k, v in document.items() if k != "exported_at"}, "thread": thread, "checkpoints": checkpoints}


def check_run(ledger: Ledger, database_url: str, *, ttl_strategy: str, round_trip_targets: dict[str, str]) -> Verdict:
    """Every check of the module docstring, on the soak database at `database_url` (every server stopped)."""
    with psycopg.connect(database_url) as conn:
        snap = Snapshot.read(conn)
    verdict = Verdict(checks=[])
    verdict.late = settle_late(ledger, snap)
    tree = Check("tree", f"{len(snap.thread_ids())} threads, {snap.checkpoint_count} checkpoints", tree_problems(snap))
    orphans = Check("orphans")
    orphans.problems, verdict.stale_claims = orphan_problems(snap)
    orphans.detail = f"{len(snap.blobs)} blobs, {len(snap.idempotency)} stored results, {len(snap.claims)} claims"
    content, ledger_check = Check("content"), Check("ledger")
    retention, memories, round_trip = Check("retention"), Check("memories"), Check("round trip")
    with create_agent(database_url, model="offline", tracing=False) as agent:
        contents = read_content(agent, snap, content)
        compare_ledger(ledger, snap, contents, verdict, ledger_check)
        check_retention(ledger, snap, ttl_strategy, retention)
        check_memories(ledger, snap, contents, memories)
        check_round_trip(agent, snap, round_trip_targets, round_trip)
    clients = Check("clients", "what clients saw at once", list(ledger.problems))
    verdict.checks = [tree, orphans, content, ledger_check, retention, memories, round_trip, clients]
    return verdict


def round_trip_targets(cluster_create_database: Any, root: Path) -> dict[str, str]:
    """A fresh Postgres database (made by `cluster_create_database(name)`) and a fresh SQLite file in `root`."""
    return {"postgres": cluster_create_database("soak_round_trip"), "sqlite": f"sqlite:///{root / 'round-trip.sqlite'}"}
