"""Which thread a checkpoint id names (see "Checkpoint ids" in `migrations` for why the rule exists).

* **One unique index holds the rule** (`OWNER_INDEX`): over `checkpoints
  (checkpoint_id)`, the root-namespace rows that are no copy. A commit that
  would give a root checkpoint id another thread holds fails there
  (`UniqueViolation` on `OWNER_INDEX`), and the commit turns that into
  `ThreadExists` (`taken`). The index, not a read before the write, decides:
  an insert waits for a concurrent insert of the same id to commit or roll
  back. A copy's rows (`saver_threads`' `copy_thread`, `sql.COPY_THREAD_SQL`)
  are marked `agent_copy` and left out, so the source keeps its ids; the
  copy's own later checkpoints are no copy.
* **Read by `sql.THREAD_OF_CHECKPOINT_SQL`**: the thread of the row the index
  holds, else (a copy whose source is gone) the first copy holding the id,
  through `COPIES_INDEX`, which holds only copies' rows.
* **Deleting a checkpoint frees its id**: nothing else holds it.
* **What it replaced**: a table, `agent_checkpoint_ids` (a row and a primary
  key entry per checkpoint, about 164 bytes a turn beside the index on
  `checkpoints (checkpoint_id)` that served unregistered ids). Its migrations
  stay in `MIGRATIONS` as history (`FORGET_STALE_SQL`, `REGISTER_STORED_SQL`,
  with `refuse_duplicates` checking the latter). The migration that replaces
  it marks every root row the table did not name as a copy (`MARK_COPIES_SQL`:
  LangGraph copies, and rows an older agent wrote unregistered), so the unique
  index can be built, then drops the table.
* **Upgrading a big table**: the two indexes are built `CONCURRENTLY` after
  setup's transaction (`indexes`). Until the owner index is built, the rule is
  not enforced and lookups by id read the table: two imports racing with the
  same ids into two new threads in that window could both commit, and the
  build then fails. Setup then settles them (`settle_duplicates`): the first
  thread (by id, as the lookup answered meanwhile) keeps the id, the others'
  rows become copies (logged, naming them), and the index is built again. A
  build that fails for another reason (a deadlock with another setup's build,
  a cancel) is tried once more; failing again, it leaves the rule off until a
  later setup builds it.
"""

from __future__ import annotations

import logging
import re

import psycopg

from agent.errors import ThreadExists
from agent.storage import records

logger = logging.getLogger(__name__)

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


#: The unique index of the rule (module docstring), and the index of copies' rows.
OWNER_INDEX = "agent_checkpoint_owner_idx"
COPIES_INDEX = "agent_checkpoint_copies_idx"
# Migrations (their text is part of the schema's history: change it only by adding a migration).
# Without the table (a database whose migrations were partly undone by hand), a copy is known by its record's
# `forked_from` naming a thread that holds the same id, as `UNREGISTERED_SQL` leaves copies out.
MARK_COPIES_SQL = """DO $$ BEGIN
    IF to_regclass('agent_checkpoint_ids') IS NOT NULL THEN
        UPDATE checkpoints c SET agent_copy = true
        WHERE c.checkpoint_ns = '' AND c.agent_copy IS NULL AND NOT EXISTS (
            SELECT 1 FROM agent_checkpoint_ids r WHERE r.checkpoint_id = c.checkpoint_id AND r.thread_id = c.thread_id);
    ELSE
        UPDATE checkpoints c SET agent_copy = true
        WHERE c.checkpoint_ns = '' AND c.agent_copy IS NULL AND EXISTS (
            SELECT 1 FROM agent_threads t JOIN checkpoints s ON s.thread_id = t.forked_from ->> 'thread_id'
            WHERE t.thread_id = c.thread_id AND s.thread_id <> c.thread_id
              AND s.checkpoint_ns = '' AND s.checkpoint_id = c.checkpoint_id);
    END IF;
END $$"""
OWNER_INDEX_SQL = (
    f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {OWNER_INDEX} ON checkpoints (checkpoint_id) "
    "WHERE checkpoint_ns = '' AND agent_copy IS NULL"
)
COPIES_INDEX_SQL = f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {COPIES_INDEX} ON checkpoints (checkpoint_id) WHERE agent_copy"
# The id in a unique violation's DETAIL, "Key (checkpoint_id)=(...) already exists." (the words are translated
# with the server's lc_messages; this part is not). The server writes the id as it is: it may hold line breaks
# (DOTALL) and parentheses (greedy, to the last one, which closes it).
TAKEN_DETAIL = re.compile(r"\(checkpoint_id\)=\((.*)\)", re.DOTALL)


def taken(exc: psycopg.Error, thread_id: str) -> ThreadExists | None:
    """The `ThreadExists` of a write that failed because another thread holds its checkpoint id (a unique
    violation on `OWNER_INDEX`), naming the id when the server said it; None for any other error."""
    if not isinstance(exc, psycopg.errors.UniqueViolation) or exc.diag.constraint_name != OWNER_INDEX:
        return None
    found = TAKEN_DETAIL.search(exc.diag.message_detail or "")
    return records.checkpoint_taken(thread_id, found.group(1) if found else None)


def refuse_duplicates(conn: psycopg.Connection, where: str) -> None:
    """Refuse to register the stored checkpoints when an id is held by more than one thread (read only).

    Raises:
        ConfigurationError: naming the first few ids with their threads, and what to do (`records.duplicate_checkpoint_ids`).
    """
    rows = conn.execute(DUPLICATES_SQL, (records.DUPLICATES_SHOWN,)).fetchall()
    if rows:
        found = [(row["checkpoint_id"], list(row["thread_ids"])) for row in rows]
        raise records.duplicate_checkpoint_ids(where, found, total=rows[0]["total"])


# Whether the owner index is valid, and whether a session is building it now (`indexes.INDEX_STATE_SQL`).
OWNER_STATE_SQL = f"""
SELECT coalesce(i.indisvalid, false) AS valid,
    EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid) AS building
FROM (SELECT to_regclass('{OWNER_INDEX}') AS oid) AS n LEFT JOIN pg_index i ON i.indexrelid = n.oid
"""
# Of the threads holding one id outside copies, the first (by thread id) keeps it, as the lookup answered
# while the index was missing (`sql.THREAD_OF_CHECKPOINT_SQL` without it); the others' rows become copies.
SETTLE_DUPLICATES_SQL = """
UPDATE checkpoints c SET agent_copy = true
FROM (
    SELECT checkpoint_id, min(thread_id) AS keeper FROM checkpoints WHERE checkpoint_ns = '' AND agent_copy IS NULL
    GROUP BY checkpoint_id HAVING count(*) > 1
) AS d
WHERE c.checkpoint_ns = '' AND c.agent_copy IS NULL AND c.checkpoint_id = d.checkpoint_id AND c.thread_id <> d.keeper
RETURNING c.checkpoint_id, c.thread_id, d.keeper
"""


def settle_duplicates(conn: psycopg.Connection, where: str) -> bool:
    """When `OWNER_INDEX` is not valid and no session is building it: make each id that threads hold outside
    copies (written while an upgrade built the index, module docstring) name one thread, the first, and mark
    the others' rows as copies, so the index can be built. `conn` is in autocommit mode; `where` names the
    database in the log, which names the ids and threads.

    Returns:
        Whether the index is to be built again: not valid and no session building it (its build failed on
        those ids, or for another reason, such as a deadlock with another setup's concurrent build, which
        two partial indexes on one table can have).
    """
    state = conn.execute(OWNER_STATE_SQL).fetchone()
    if state["valid"] or state["building"]:
        return False
    marked = conn.execute(SETTLE_DUPLICATES_SQL).fetchall()
    if marked:
        shown = "; ".join(
            f"{row['checkpoint_id']} of {row['thread_id']!r} (kept by {row['keeper']!r})" for row in marked[: records.DUPLICATES_SHOWN]
        )
        logger.warning(
            "%d checkpoint(s) in %s held an id another thread holds (written while the index %s was built); "
            "each is now a copy, its id naming the thread that keeps it: %s",
            len(marked),
            where,
            OWNER_INDEX,
            shown,
        )
    return True
