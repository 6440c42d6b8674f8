"""The Postgres statements of branch records and of the message search index.

Apart from `sql` because they are one subject (`agent.operations.branch_records`,
`agent.storage.search`) that every path removing checkpoints must also clean:
deleting a thread, a branch, the checkpoints retention or LangGraph's `prune`
drops, and copying a thread. The search terms of a checkpoint, the keys of
the words it brings to its branch (see `agent.storage.search`), are a column
of its own row (`checkpoints.agent_terms`), so they go with it and a copy
copies them; `agent_terms @> ARRAY[key]` is served by the migration's partial
GIN index (`agent_checkpoint_terms_idx`), a key at a time: a thread's keys are
spread over its rows.
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

# A checkpoint's terms are a column of its row (`agent_terms`, see the migration), written with it by
# `agent_put_checkpoint`; these set them on a checkpoint that exists (a rewrite, the backfill). NULL: no terms.
INDEX_MESSAGES_SQL = """
UPDATE checkpoints SET agent_terms = %(terms)s
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = %(checkpoint_id)s
"""
# The threads of one user whose rows hold, together, every key; with their newest checkpoint, newest first.
# `@>` is strict, so the planner sees that it implies the GIN index's predicate (`agent_terms IS NOT NULL`).
SEARCH_SQL = """
SELECT f.thread_id,
    (SELECT max(c.checkpoint_id) FROM checkpoints c WHERE c.thread_id = f.thread_id AND c.checkpoint_ns = '')
        AS newest_checkpoint_id
FROM (SELECT DISTINCT m.thread_id, q.key
      FROM unnest(%(keys)s::integer[]) AS q(key)
      JOIN checkpoints m ON m.agent_terms @> ARRAY[q.key]
      JOIN agent_threads t ON t.thread_id = m.thread_id
      WHERE m.checkpoint_ns = '' AND t.user_id IS NOT DISTINCT FROM %(user_id)s) f
GROUP BY f.thread_id
HAVING count(*) = cardinality(%(keys)s::integer[])
ORDER BY newest_checkpoint_id DESC, f.thread_id DESC
"""
# The backfill's pages (`search.backfill`): threads with a root checkpoint without terms, in id order.
UNINDEXED_SQL = """
SELECT DISTINCT c.thread_id FROM checkpoints c
WHERE c.checkpoint_ns = '' AND c.parent_checkpoint_id IS NULL AND c.thread_id > %(after)s AND c.agent_terms IS NULL
ORDER BY c.thread_id
LIMIT %(limit)s
"""
UNINDEX_SQL = """
UPDATE checkpoints SET agent_terms = NULL
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = ANY(%(ids)s) AND agent_terms IS NOT NULL
"""
CLEAR_INDEX_SQL = "UPDATE checkpoints SET agent_terms = NULL WHERE agent_terms IS NOT NULL"

DELETE_CHECKPOINTS_SQL = [
    "DELETE FROM checkpoint_writes WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)",
    "DELETE FROM checkpoints WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)",
    "DELETE FROM agent_branches WHERE thread_id = %(thread_id)s AND checkpoint_id = ANY(%(ids)s)",
    # Blobs are shared between checkpoints by (channel, version): keep exactly those a remaining one points at.
    """DELETE FROM checkpoint_blobs b WHERE b.thread_id = %(thread_id)s AND NOT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = b.checkpoint_ns
          AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)""",
]
DELETE_THREAD_SQL = [
    "DELETE FROM agent_branches WHERE thread_id = %s",
]
# What retention's keep_only_head and LangGraph's prune leave: rows of the checkpoints kept.
KEEP_ONLY_SQL = [
    """DELETE FROM agent_branches b WHERE b.thread_id = %(thread_id)s AND NOT EXISTS (
        SELECT 1 FROM checkpoints c WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''
          AND c.checkpoint_id = b.checkpoint_id)""",
]
COPY_THREAD_SQL = [
    """INSERT INTO agent_branches (thread_id, checkpoint_id, label, pinned, archived)
    SELECT %(target)s, checkpoint_id, label, pinned, archived FROM agent_branches WHERE thread_id = %(source)s""",
]
