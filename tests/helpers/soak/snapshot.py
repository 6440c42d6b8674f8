"""The soak database's tables read directly (no agent code in between), and the checks that need only them.

`Snapshot.read(conn)` reads every row that matters of LangGraph's tables (`checkpoints`,
`checkpoint_blobs`, `checkpoint_writes`), the agent's (`agent_threads`, `agent_claims`,
`agent_idempotency`) and LangGraph's store (`store`, the long-term memories).

* `tree_problems`: each thread is one tree: checkpoints only in the root namespace, exactly one
  root (no parent), every parent a checkpoint of the same thread, every checkpoint reachable
  from the root, and a thread record whose head is one of its checkpoints; no checkpoints
  without a record, no record without checkpoints.
* `orphan_problems`: a blob no checkpoint of its thread names (by channel and version), a
  checkpoint whose `messages` version has no blob, writes of a checkpoint that is not there,
  idempotency results and memories of a thread that is not there, a claim still held after
  every server stopped. Claims of threads that do not exist are counted apart (`stale_claims`):
  a first turn whose server was killed before it committed leaves its (expired) claim row;
  nothing reads it, and the next claim of that id takes it over.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row
from tests.helpers.stored_values import STORED_VALUES


@dataclass
class Checkpoint:
    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    versions: dict[str, Any]


@dataclass
class Snapshot:
    threads: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, Checkpoint]] = field(default_factory=lambda: defaultdict(dict))
    other_ns: list[Checkpoint] = field(default_factory=list)
    blobs: set[tuple[str, str, str, str]] = field(default_factory=set)
    writes: set[tuple[str, str, str]] = field(default_factory=set)
    #: (user_key, key) -> {"thread_id", "checkpoint_id"}.
    idempotency: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)
    memories: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, conn: psycopg.Connection) -> Snapshot:
        snap = cls()
        cur = conn.cursor(row_factory=dict_row)
        for row in cur.execute("SELECT thread_id, user_id, head_checkpoint_id, message_count, ttl_seconds FROM agent_threads"):
            snap.threads[row["thread_id"]] = row
        rows = cur.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint -> 'channel_versions' AS v "
            "FROM checkpoints"
        )
        for row in rows:
            cp = Checkpoint(row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"], row["parent_checkpoint_id"], row["v"] or {})
            if cp.ns:
                snap.other_ns.append(cp)
            else:
                snap.checkpoints[cp.thread_id][cp.checkpoint_id] = cp
        for row in cur.execute(f"SELECT thread_id, checkpoint_ns, channel, version FROM {STORED_VALUES}"):
            snap.blobs.add((row["thread_id"], row["checkpoint_ns"], row["channel"], row["version"]))
        for row in cur.execute("SELECT DISTINCT thread_id, checkpoint_ns, checkpoint_id FROM checkpoint_writes"):
            snap.writes.add((row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"]))
        rows = cur.execute(
            "SELECT user_key, key, thread_id, response -> 'custom_outputs' ->> 'checkpoint_id' AS checkpoint_id "
            "FROM agent_idempotency"
        )
        for row in rows:
            snap.idempotency[(row["user_key"], row["key"])] = row
        snap.claims = cur.execute(
            "SELECT thread_id, token <> '' AS unreleased, token <> '' AND expires_at > clock_timestamp() AS held "
            "FROM agent_claims"
        ).fetchall()
        for row in cur.execute("SELECT prefix, key, value FROM store"):
            value = row["value"] if isinstance(row["value"], dict) else json.loads(row["value"])
            snap.memories.append({"prefix": row["prefix"], "key": row["key"], **value})
        return snap

    @property
    def checkpoint_count(self) -> int:
        return sum(len(c) for c in self.checkpoints.values())

    def thread_ids(self) -> set[str]:
        return set(self.threads) | {t for t, cps in self.checkpoints.items() if cps}

    def has_checkpoint(self, thread_id: str, checkpoint_id: str | None) -> bool:
        return checkpoint_id is not None and checkpoint_id in self.checkpoints.get(thread_id, {})

    def rows_of_thread(self, thread_id: str) -> dict[str, int]:
        """How many rows of each table still name `thread_id`."""
        return {
            "agent_threads": int(thread_id in self.threads),
            "checkpoints": len(self.checkpoints.get(thread_id, {})),
            "checkpoint_blobs": sum(1 for b in self.blobs if b[0] == thread_id),
            "checkpoint_writes": sum(1 for w in self.writes if w[0] == thread_id),
            "agent_idempotency": sum(1 for r in self.idempotency.values() if r["thread_id"] == thread_id),
        }


def tree_problems(snap: Snapshot) -> list[str]:
    problems = [f"checkpoint {c.checkpoint_id} of thread {c.thread_id} in namespace {c.ns!r}" for c in snap.other_ns]
    for thread_id in sorted(snap.thread_ids()):
        cps = snap.checkpoints.get(thread_id, {})
        record = snap.threads.get(thread_id)
        if record is None:
            problems.append(f"thread {thread_id}: {len(cps)} checkpoints and no thread record")
            continue
        if not cps:
            problems.append(f"thread {thread_id}: a thread record and no checkpoint")
            continue
        if record["head_checkpoint_id"] not in cps:
            problems.append(f"thread {thread_id}: its head {record['head_checkpoint_id']} is not one of its checkpoints")
        roots = [c for c in cps.values() if c.parent_id is None]
        if len(roots) != 1:
            problems.append(f"thread {thread_id}: {len(roots)} roots")
        dangling = [c for c in cps.values() if c.parent_id is not None and c.parent_id not in cps]
        for c in dangling:
            problems.append(f"thread {thread_id}: checkpoint {c.checkpoint_id}'s parent {c.parent_id} is not in the thread")
        children: dict[str, list[str]] = defaultdict(list)
        for c in cps.values():
            if c.parent_id is not None:
                children[c.parent_id].append(c.checkpoint_id)
        seen, todo = set(), [r.checkpoint_id for r in roots]
        while todo:
            at = todo.pop()
            if at not in seen:
                seen.add(at)
                todo.extend(children.get(at, []))
        if len(roots) == 1 and not dangling and len(seen) != len(cps):
            problems.append(f"thread {thread_id}: {len(cps) - len(seen)} checkpoints not reachable from the root (a cycle)")
    return problems


def orphan_problems(snap: Snapshot) -> tuple[list[str], int]:
    """(problems, stale claim rows): see the module docstring."""
    problems: list[str] = []
    referenced = {
        (c.thread_id, c.ns, channel, str(version))
        for cps in snap.checkpoints.values()
        for c in cps.values()
        for channel, version in c.versions.items()
    }
    for blob in sorted(snap.blobs - referenced):
        problems.append(f"blob {blob[2]}@{blob[3]} of thread {blob[0]}: no checkpoint names it")
    for cps in snap.checkpoints.values():
        for c in cps.values():
            version = c.versions.get("messages")
            if version is not None and (c.thread_id, c.ns, "messages", str(version)) not in snap.blobs:
                problems.append(f"checkpoint {c.checkpoint_id} of thread {c.thread_id}: its messages blob is missing")
    for thread_id, ns, checkpoint_id in sorted(snap.writes):
        if ns or not snap.has_checkpoint(thread_id, checkpoint_id):
            problems.append(f"writes of checkpoint {checkpoint_id} of thread {thread_id}: no such checkpoint")
    for (user_key, key), row in sorted(snap.idempotency.items()):
        if row["thread_id"] not in snap.threads:
            problems.append(f"idempotency result {key!r} of {user_key!r}: its thread {row['thread_id']} is gone")
    for memory in snap.memories:
        thread_id = memory.get("thread_id")
        if thread_id and thread_id not in snap.threads:
            problems.append(f"memory {memory['key']}: its thread {thread_id} is gone")
    stale = 0
    for claim in snap.claims:
        if claim["held"]:
            problems.append(f"claim on thread {claim['thread_id']} still held after every server stopped")
        elif claim["thread_id"] not in snap.threads:
            if claim["unreleased"]:
                stale += 1
            else:
                problems.append(f"released claim row of thread {claim['thread_id']}, which is gone")
    return problems, stale
