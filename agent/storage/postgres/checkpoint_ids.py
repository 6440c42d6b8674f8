"""`agent_checkpoint_ids`: which thread each checkpoint id names (see "Checkpoint ids" in `schema` for why a table).

* **Written by the commit's own statement.** `agent_put_checkpoint` (a
  migration in `schema`) registers a root-namespace checkpoint's id before it
  writes the checkpoint, in the same transaction; another thread's row makes it
  fail with `sql.CHECKPOINT_TAKEN_SQLSTATE`, which the commit turns into
  `ThreadExists` (`records.checkpoint_taken`). The primary key, not a read
  before the write, decides: `INSERT ... ON CONFLICT` waits for a concurrent
  insert of the same id to commit or roll back.
* **Deleted with the checkpoint** by the statements that delete checkpoints
  (`sql.DELETE_THREAD_SQL`, `sql.DELETE_UNKEPT_SQL`,
  `sql.DELETE_OTHER_CHECKPOINT_IDS_SQL`), so a deleted thread's ids are free again.
* **Read by `sql.THREAD_OF_CHECKPOINT_SQL`**, which falls back on
  `checkpoints` (through `agent_checkpoints_checkpoint_id_idx`) for an id no
  commit registered: a copy whose source is gone, or a checkpoint an older
  agent wrote while this one migrated (its `agent_put_checkpoint` was replaced
  when the migrations committed).
* **Filled from what is stored** by a migration (`REGISTER_STORED_SQL`), which
  `schema.migrate` runs only after `refuse_duplicates` found no id held by two
  threads: choosing which thread keeps an id would lose the other's response
  ids, so that is left to the operator, with the ids named. A copy that
  LangGraph's `copy_thread` made is no duplicate: its record's `forked_from`
  names a thread that holds the same id, and the id stays the source's.
"""

from __future__ import annotations

import psycopg

from agent.storage import records

# The checkpoints (root namespace) no row names yet, with their thread; a copy's are left out (module docstring).
UNREGISTERED_SQL = """
SELECT c.checkpoint_id, c.thread_id FROM checkpoints c
WHERE c.checkpoint_ns = ''
  AND NOT EXISTS (SELECT 1 FROM agent_checkpoint_ids r WHERE r.checkpoint_id = c.checkpoint_id)
  AND NOT EXISTS (
    SELECT 1 FROM agent_threads t JOIN checkpoints s ON s.thread_id = t.forked_from ->> 'thread_id'
    WHERE t.thread_id = c.thread_id AND s.thread_id <> c.thread_id
      AND s.checkpoint_ns = '' AND s.checkpoint_id = c.checkpoint_id)
"""
# Migrations (their text is part of the schema's history: change it only by adding a migration).
FORGET_STALE_SQL = """DELETE FROM agent_checkpoint_ids r WHERE NOT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = r.thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = r.checkpoint_id)"""
REGISTER_STORED_SQL = f"""
INSERT INTO agent_checkpoint_ids (checkpoint_id, thread_id) {UNREGISTERED_SQL}
ON CONFLICT (checkpoint_id) DO NOTHING
"""
# The first few ids more than one thread holds, with their threads, and how many such ids there are.
DUPLICATES_SQL = f"""
SELECT checkpoint_id, array_agg(thread_id ORDER BY thread_id) AS thread_ids, count(*) OVER () AS total
FROM ({UNREGISTERED_SQL}) AS unregistered
GROUP BY checkpoint_id HAVING count(*) > 1 ORDER BY checkpoint_id LIMIT %s
"""


def refuse_duplicates(conn: psycopg.Connection, where: str) -> None:
    """Refuse to register the stored checkpoints when an id is held by more than one thread (read only).

    Raises:
        ConfigurationError: naming the first few ids with their threads, and what to do (`records.duplicate_checkpoint_ids`).
    """
    rows = conn.execute(DUPLICATES_SQL, (records.DUPLICATES_SHOWN,)).fetchall()
    if rows:
        found = [(row["checkpoint_id"], list(row["thread_ids"])) for row in rows]
        raise records.duplicate_checkpoint_ids(where, found, total=rows[0]["total"])
