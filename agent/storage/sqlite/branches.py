"""The SQLite statements of branch records and of the message search index, and the functions that run them.

Apart from `sql` because they are one subject (`agent.operations.branch_records`,
`agent.storage.search`) that every path removing checkpoints must also clean:
deleting a thread, a branch, the checkpoints retention or LangGraph's `prune`
drops, and copying a thread. A search row (`agent_message_rows`) holds the
tokens of the words a checkpoint brings to its branch (`terms`, see
`agent.storage.search`); it is the external content of the FTS5 table
`agent_message_terms`, which the schema's triggers keep in step, so a row goes
with its entries.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from agent.encryption import Keyring
from agent.storage import search
from agent.storage.records import BranchRecord, SearchCandidate

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

# A checkpoint has at most one row: writing it replaces the one it had.
INDEX_MESSAGES_SQL = [
    "DELETE FROM agent_message_rows WHERE thread_id = ? AND checkpoint_id = ?",
    "INSERT INTO agent_message_rows (thread_id, checkpoint_id, terms) VALUES (?, ?, ?)",
]
# The threads of one user whose rows hold, together, every token (`:tokens`, a JSON array); with their
# newest checkpoint, newest first. A token at a time (a thread's tokens are spread over its rows), quoted
# so that FTS5 reads it as a string.
SEARCH_SQL = """
SELECT f.thread_id,
    (SELECT max(c.checkpoint_id) FROM checkpoints c WHERE c.thread_id = f.thread_id AND c.checkpoint_ns = '')
        AS newest_checkpoint_id
FROM (SELECT DISTINCT m.thread_id, q.value AS token
      FROM json_each(:tokens) q
      JOIN agent_message_terms ON agent_message_terms MATCH '"' || q.value || '"'
      JOIN agent_message_rows m ON m.id = agent_message_terms.rowid
      JOIN agent_threads t ON t.thread_id = m.thread_id
      WHERE t.user_id IS :user_id) f
GROUP BY f.thread_id
HAVING count(*) = json_array_length(:tokens)
ORDER BY newest_checkpoint_id DESC, f.thread_id DESC
"""
# The backfill's pages (`search.backfill`): threads with a root checkpoint without a row, in id order.
UNINDEXED_SQL = """
SELECT DISTINCT c.thread_id FROM checkpoints c
WHERE c.checkpoint_ns = '' AND c.parent_checkpoint_id IS NULL AND c.thread_id > ?
  AND NOT EXISTS (SELECT 1 FROM agent_message_rows m WHERE m.thread_id = c.thread_id AND m.checkpoint_id = c.checkpoint_id)
ORDER BY c.thread_id
LIMIT ?
"""
UNINDEX_SQL = "DELETE FROM agent_message_rows WHERE thread_id = ? AND checkpoint_id IN (SELECT value FROM json_each(?))"
CLEAR_INDEX_SQL = "DELETE FROM agent_message_rows"

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
    """INSERT INTO agent_message_rows (thread_id, checkpoint_id, terms)
    SELECT :target, checkpoint_id, terms FROM agent_message_rows WHERE thread_id = :source""",
]


# The stored checkpoints of some root-namespace checkpoint ids of a thread (history's previews).
SELECT_CHECKPOINT_MESSAGES_SQL = """
SELECT checkpoint_id, type, checkpoint FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id IN (SELECT value FROM json_each(?))
"""

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


def search_candidates(cur: sqlite3.Cursor, user_id: str | None, keys: Sequence[int]) -> list[SearchCandidate]:
    tokens = json.dumps([search.fts5_token(key) for key in keys])
    return [SearchCandidate(*row) for row in cur.execute(SEARCH_SQL, {"tokens": tokens, "user_id": user_id}).fetchall()]


def delete_checkpoints(cur: sqlite3.Cursor, thread_id: str, checkpoint_ids: Sequence[str]) -> None:
    params = {"thread_id": thread_id, "ids": json.dumps(list(checkpoint_ids))}
    for statement in DELETE_CHECKPOINTS_SQL:
        cur.execute(statement, params)


def index_checkpoint(cur: sqlite3.Cursor, thread_id: str, checkpoint_id: str, keys: Sequence[int]) -> None:
    """Write a checkpoint's search index row (`search.new_keys`), replacing its row if it has one."""
    cur.execute(INDEX_MESSAGES_SQL[0], (thread_id, checkpoint_id))
    cur.execute(INDEX_MESSAGES_SQL[1], (thread_id, checkpoint_id, search.fts5_tokens(keys)))


def stored_messages(cur: sqlite3.Cursor, serde: Any, thread_id: str, checkpoint_ids: Sequence[str]) -> dict[str, Any]:
    """The stored `messages` value of each root-namespace checkpoint of `checkpoint_ids` that exists
    (SqliteSaver keeps channel values inside the serialized checkpoint)."""
    rows = cur.execute(SELECT_CHECKPOINT_MESSAGES_SQL, (thread_id, json.dumps(list(checkpoint_ids)))).fetchall()
    return {cid: serde.loads_typed((type_, blob))["channel_values"].get("messages") for cid, type_, blob in rows}
