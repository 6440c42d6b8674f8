"""The Postgres statements of branch records and of the message search index.

Apart from `sql` because they are one subject (`agent.operations.branch_records`,
`agent.storage.search`) that every path removing checkpoints must also clean:
deleting a thread, a branch, the checkpoints retention or LangGraph's `prune`
drops, and copying a thread. A search row holds the keys of the words a
checkpoint brings to its branch (`terms`, see `agent.storage.search`);
`terms @> ARRAY[key]` is served by the GIN index of the migration
(`agent_message_terms_idx`), a key at a time: a thread's keys are spread over
its rows.
"""

from __future__ import annotations

SELECT_BRANCHES_SQL = "SELECT checkpoint_id, label, pinned, archived FROM agent_branches WHERE thread_id = %s"
UPSERT_LABEL_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, label) VALUES (%s, %s, %s)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET label = EXCLUDED.label
"""
UNPIN_SQL = "UPDATE agent_branches SET pinned = false WHERE thread_id = %s AND pinned"
UPSERT_PIN_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, pinned) VALUES (%s, %s, true)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET pinned = true
"""
UPSERT_ARCHIVED_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, archived) VALUES (%s, %s, %s)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET archived = EXCLUDED.archived
"""
# A row that says nothing any more goes.
DROP_EMPTY_SQL = "DELETE FROM agent_branches WHERE thread_id = %s AND label IS NULL AND NOT pinned AND NOT archived"
INSERT_BRANCH_SQL = """
INSERT INTO agent_branches (thread_id, checkpoint_id, label, pinned, archived) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (thread_id, checkpoint_id) DO UPDATE SET label = EXCLUDED.label, pinned = EXCLUDED.pinned,
    archived = EXCLUDED.archived
"""

# A checkpoint has at most one row: writing it replaces the one it had. No unique index to conflict on (the
# rows are found by the thread's index, see the migration), so an update, else an insert.
INDEX_MESSAGES_SQL = """
WITH replaced AS (
    UPDATE agent_message_terms SET terms = %(terms)s
    WHERE thread_id = %(thread_id)s AND checkpoint_id = %(checkpoint_id)s RETURNING 1)
INSERT INTO agent_message_terms (thread_id, checkpoint_id, terms)
SELECT %(thread_id)s, %(checkpoint_id)s, %(terms)s WHERE NOT EXISTS (SELECT 1 FROM replaced)
"""
INSERT_ROW_SQL = "INSERT INTO agent_message_terms (thread_id, checkpoint_id, terms) VALUES (%s, %s, %s)"
# The threads of one user whose rows hold, together, every key; with their newest checkpoint, newest first.
SEARCH_SQL = """
SELECT f.thread_id,
    (SELECT max(c.checkpoint_id) FROM checkpoints c WHERE c.thread_id = f.thread_id AND c.checkpoint_ns = '')
        AS newest_checkpoint_id
FROM (SELECT DISTINCT m.thread_id, q.key
      FROM unnest(%(keys)s::integer[]) AS q(key)
      JOIN agent_message_terms m ON m.terms @> ARRAY[q.key]
      JOIN agent_threads t ON t.thread_id = m.thread_id
      WHERE t.user_id IS NOT DISTINCT FROM %(user_id)s) f
GROUP BY f.thread_id
HAVING count(*) = cardinality(%(keys)s::integer[])
ORDER BY newest_checkpoint_id DESC, f.thread_id DESC
"""
# The backfill's pages (`search.backfill`): threads with a root checkpoint without a row, in id order.
UNINDEXED_SQL = """
SELECT DISTINCT c.thread_id FROM checkpoints c
WHERE c.checkpoint_ns = '' AND c.parent_checkpoint_id IS NULL AND c.thread_id > %(after)s
  AND NOT EXISTS (SELECT 1 FROM agent_message_terms m WHERE m.thread_id = c.thread_id AND m.checkpoint_id = c.checkpoint_id)
ORDER BY c.thread_id
LIMIT %(limit)s
"""
UNINDEX_SQL = "DELETE FROM agent_message_terms WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)"
CLEAR_INDEX_SQL = "DELETE FROM agent_message_terms"

DELETE_CHECKPOINTS_SQL = [
    "DELETE FROM checkpoint_writes WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)",
    "DELETE FROM checkpoints WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)",
    "DELETE FROM agent_branches WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)",
    "DELETE FROM agent_message_terms WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)",
    # Blobs are shared between checkpoints by (channel, version): keep exactly those a remaining one points at.
    """DELETE FROM checkpoint_blobs b WHERE b.thread_id = %(thread_id)s AND NOT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = b.checkpoint_ns
          AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)""",
]
DELETE_THREAD_SQL = [
    "DELETE FROM agent_branches WHERE thread_id = %s",
    "DELETE FROM agent_message_terms WHERE thread_id = %s",
]
# What retention's keep_only_head and LangGraph's prune leave: rows of the checkpoints kept.
KEEP_ONLY_SQL = [
    """DELETE FROM agent_branches b WHERE b.thread_id = %(thread_id)s AND NOT EXISTS (
        SELECT 1 FROM checkpoints c WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
          AND c.checkpoint_id = b.checkpoint_id)""",
    """DELETE FROM agent_message_terms m WHERE m.thread_id = %(thread_id)s AND NOT EXISTS (
        SELECT 1 FROM checkpoints c WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
          AND c.checkpoint_id = m.checkpoint_id)""",
]
COPY_THREAD_SQL = [
    """INSERT INTO agent_branches (thread_id, checkpoint_id, label, pinned, archived)
    SELECT %(target)s, checkpoint_id, label, pinned, archived FROM agent_branches WHERE thread_id = %(source)s""",
    """INSERT INTO agent_message_terms (thread_id, checkpoint_id, terms)
    SELECT %(target)s, checkpoint_id, terms FROM agent_message_terms WHERE thread_id = %(source)s""",
]
