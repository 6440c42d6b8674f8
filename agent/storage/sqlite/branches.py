"""The SQLite statements of branch records and of the message search index, and the functions that run them.

Apart from `sql` because they are one subject (`agent.operations.branch_records`,
`agent.storage.search`) that every path removing checkpoints must also clean:
deleting a thread, a branch, the checkpoints retention or LangGraph's `prune`
drops, and copying a thread. The search runs FTS5 over `agent_message_fts`,
whose content is `agent_message_text` (see the migration in `schema`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from agent.encryption import Keyring
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

INDEX_MESSAGES_SQL = """
INSERT INTO agent_message_text (thread_id, checkpoint_id, message_ids, body) VALUES (?, ?, ?, ?)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET message_ids = excluded.message_ids, body = excluded.body
"""
# The rows of one user's threads holding every word, best first (FTS5's bm25 `rank`), then newest.
SEARCH_SQL = """
SELECT m.thread_id, m.checkpoint_id, m.message_ids, m.body
FROM agent_message_fts f JOIN agent_message_text m ON m.id = f.rowid
JOIN agent_threads t ON t.thread_id = m.thread_id
WHERE agent_message_fts MATCH ? AND t.user_id IS ?
ORDER BY f.rank, m.checkpoint_id DESC LIMIT ?
"""

# `ids` is a JSON array of checkpoint ids.
IDS = "(SELECT value FROM json_each(:ids))"
DELETE_CHECKPOINTS_SQL = [
    f"DELETE FROM writes WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM checkpoints WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM agent_checkpoint_ids WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM agent_branches WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
    f"DELETE FROM agent_message_text WHERE thread_id = :thread_id AND checkpoint_id IN {IDS}",
]
DELETE_THREAD_SQL = [
    "DELETE FROM agent_branches WHERE thread_id = ?",
    "DELETE FROM agent_message_text WHERE thread_id = ?",
]
# What retention's keep_only_head and LangGraph's prune leave: rows of the checkpoints kept.
KEEP_ONLY_SQL = [
    "DELETE FROM agent_branches WHERE thread_id = :thread_id AND checkpoint_id NOT IN (SELECT checkpoint_id FROM checkpoints WHERE thread_id = :thread_id AND checkpoint_ns = '')",
    "DELETE FROM agent_message_text WHERE thread_id = :thread_id AND checkpoint_id NOT IN (SELECT checkpoint_id FROM checkpoints WHERE thread_id = :thread_id AND checkpoint_ns = '')",
]
COPY_THREAD_SQL = [
    """INSERT INTO agent_branches (thread_id, checkpoint_id, label, pinned, archived)
    SELECT :target, checkpoint_id, label, pinned, archived FROM agent_branches WHERE thread_id = :source""",
    """INSERT INTO agent_message_text (thread_id, checkpoint_id, message_ids, body)
    SELECT :target, checkpoint_id, message_ids, body FROM agent_message_text WHERE thread_id = :source""",
]


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


def search(cur: sqlite3.Cursor, user_id: str | None, match: str, limit: int) -> list[SearchRow]:
    return [SearchRow(*row) for row in cur.execute(SEARCH_SQL, (match, user_id, limit)).fetchall()]


def delete_checkpoints(cur: sqlite3.Cursor, thread_id: str, checkpoint_ids: Sequence[str]) -> None:
    params = {"thread_id": thread_id, "ids": json.dumps(list(checkpoint_ids))}
    for statement in DELETE_CHECKPOINTS_SQL:
        cur.execute(statement, params)
