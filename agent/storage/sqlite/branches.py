"""The SQLite statements of branch records and of the message search index, and the functions that run them.

Apart from `sql` because they are one subject (`agent.operations.branch_records`,
`agent.storage.search`) that every path removing checkpoints must also clean:
deleting a thread, a branch, the checkpoints retention or LangGraph's `prune`
drops, and copying a thread. The search runs FTS5 over `agent_message_terms`, a
contentless table whose row ids are those of `agent_message_rows` (thread and
checkpoint; see the migration in `schema` and "Deletion" in `agent.storage.search`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from agent.encryption import Keyring
from agent.storage import deltas, search
from agent.storage.records import BranchRecord, SearchRow

SELECT_BRANCHES_SQL = "SELECT checkpoint_id, label, pinned, archived FROM agent_branches WHERE thread_id = ?"
UPSERT_LABEL_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, label) VALUES (?, ?, ?)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET label = excluded.label
"""
UNPIN_SQL = "UPDATE agent_branches SET pinned = 0 WHERE thread_id = ? AND pinned"
UPSERT_PIN_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, pinned) VALUES (?, ?, 1)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET pinned = 1
"""
UPSERT_ARCHIVED_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, archived) VALUES (?, ?, ?)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET archived = excluded.archived
"""
# A row that says nothing any more goes.
DROP_EMPTY_SQL = "DELETE FROM agent_branches WHERE thread_id = ? AND label IS NULL AND NOT pinned AND NOT archived"
INSERT_BRANCH_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, label, pinned, archived) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET label = excluded.label, pinned = excluded.pinned,
    archived = excluded.archived
"""

# A contentless FTS5 row cannot be updated: a checkpoint indexed again gets a new row id (the old entry is
# left to `CLEAR_INDEX_SQL`, and names no checkpoint any more).
INDEX_MESSAGES_SQL = [
    "DELETE FROM agent_message_rows WHERE thread_id = ? AND checkpoint_id = ?",
    "INSERT INTO agent_message_rows (thread_id, checkpoint_id) VALUES (?, ?)",
    "INSERT INTO agent_message_terms (rowid, body) VALUES (last_insert_rowid(), ?)",
]
# The rows of one user's threads holding every token, newest first.
SEARCH_SQL = """
SELECT m.thread_id, m.checkpoint_id
FROM agent_message_terms f JOIN agent_message_rows m ON m.id = f.rowid
JOIN agent_threads t ON t.thread_id = m.thread_id
WHERE agent_message_terms MATCH ? AND t.user_id IS ?
ORDER BY m.checkpoint_id DESC LIMIT ?
"""
# The backfill's pages (`search.backfill`): root-namespace checkpoints without a row, in key order.
UNINDEXED_SQL = """
SELECT c.thread_id, c.checkpoint_id FROM checkpoints c
WHERE c.checkpoint_ns = '' AND (c.thread_id, c.checkpoint_id) > (?, ?)
  AND NOT EXISTS (SELECT 1 FROM agent_message_rows m WHERE m.thread_id = c.thread_id AND m.checkpoint_id = c.checkpoint_id)
ORDER BY c.thread_id, c.checkpoint_id
LIMIT ?
"""
SELECT_CHECKPOINT_MESSAGES_SQL = """
SELECT checkpoint_id, type, checkpoint FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id IN (SELECT value FROM json_each(?))
"""
INDEXED_OF_THREAD_SQL = "SELECT checkpoint_id FROM agent_message_rows WHERE thread_id = ? ORDER BY id"
CLEAR_INDEX_SQL = [
    "DELETE FROM agent_message_rows",
    "INSERT INTO agent_message_terms (agent_message_terms) VALUES ('delete-all')",
]

# `ids` is a JSON array of checkpoint ids.
IDS = "(SELECT value FROM json_each(:ids))"
DELETE_CHECKPOINTS_SQL = [
    f"DELETE FROM writes WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM checkpoints WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM agent_checkpoint_ids WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM agent_branches WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM agent_message_rows WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
]
DELETE_THREAD_SQL = [
    "DELETE FROM agent_branches WHERE thread_id = ?",
    "DELETE FROM agent_message_rows WHERE thread_id = ?",
]
# What retention's keep_only_head and LangGraph's prune leave: rows of the checkpoints kept.
KEEP_ONLY_SQL = [
    "DELETE FROM agent_branches WHERE thread_id = :thread_id AND checkpoint_id NOT IN (SELECT checkpoint_id FROM checkpoints WHERE thread_id = :thread_id AND checkpoint_ns = '')",
    "DELETE FROM agent_message_rows WHERE thread_id = :thread_id AND checkpoint_id NOT IN (SELECT checkpoint_id FROM checkpoints WHERE thread_id = :thread_id AND checkpoint_ns = '')",
]
COPY_THREAD_SQL = [
    """INSERT INTO agent_branches (thread_id, checkpoint_id, label, pinned, archived)
    SELECT :target, checkpoint_id, label, pinned, archived FROM agent_branches WHERE thread_id = :source""",
]  # the search index rows: `copy_index`


def branch_records(cur: sqlite3.Cursor, thread_id: str, keyring: Keyring) -> dict[str, BranchRecord]:
    """The thread's branch records by checkpoint id (none when the file predates them)."""
    try:
        rows = cur.execute(SELECT_BRANCHES_SQL, (thread_id,)).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return {}
        raise
    return {
        cid: BranchRecord(cid, keyring.open_text(label) if label is not None else None, bool(pinned), bool(archived))
        for cid, label, pinned, archived in rows
    }


def search_rows(cur: sqlite3.Cursor, user_id: str | None, match: str, limit: int) -> list[SearchRow]:
    return [SearchRow(*row) for row in cur.execute(SEARCH_SQL, (match, user_id, limit)).fetchall()]


def delete_checkpoints(cur: sqlite3.Cursor, thread_id: str, checkpoint_ids: Sequence[str]) -> None:
    params = {"thread_id": thread_id, "ids": json.dumps(list(checkpoint_ids))}
    for statement in DELETE_CHECKPOINTS_SQL:
        cur.execute(statement, params)


def index_checkpoint(cur: sqlite3.Cursor, thread_id: str, checkpoint_id: str, keys: list[int]) -> None:
    """Write a checkpoint's search index row (`search.index_keys`), replacing its row if it has one."""
    cur.execute(INDEX_MESSAGES_SQL[0], (thread_id, checkpoint_id))
    cur.execute(INDEX_MESSAGES_SQL[1], (thread_id, checkpoint_id))
    cur.execute(INDEX_MESSAGES_SQL[2], (search.fts5_tokens(keys),))


def stored_messages(cur: sqlite3.Cursor, serde: Any, thread_id: str, checkpoint_ids: Sequence[str]) -> dict[str, Any]:
    """The stored `messages` value of each root-namespace checkpoint of `checkpoint_ids` that exists
    (SqliteSaver keeps channel values inside the serialized checkpoint)."""
    rows = cur.execute(SELECT_CHECKPOINT_MESSAGES_SQL, (thread_id, json.dumps(list(checkpoint_ids)))).fetchall()
    return {cid: serde.loads_typed((type_, blob))["channel_values"].get("messages") for cid, type_, blob in rows}


def copy_index(cur: sqlite3.Cursor, serde: Any, source_thread_id: str, target_thread_id: str) -> None:
    """Index a copied thread's checkpoints that its source has indexed (a contentless FTS5 table cannot
    give the source's tokens back: they are made again from the copied checkpoints' messages)."""
    ids = [row[0] for row in cur.execute(INDEXED_OF_THREAD_SQL, (source_thread_id,)).fetchall()]
    for checkpoint_id, stored in stored_messages(cur, serde, target_thread_id, ids).items():
        keys = search.index_keys(deltas.added_messages(stored))
        if keys is not None:
            index_checkpoint(cur, target_thread_id, checkpoint_id, keys)
