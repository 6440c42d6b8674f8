"""The SQLite backend's statements, as named constants (the reads shared with the light reader are in `reads`).

In order: the turn protocol (claim, release, lease), the write transaction's
statements (`transaction.SqliteTx`) and the reads of the full storage, the
retention sweep, the saver's thread operations, idempotency. Timestamps are
REAL epoch seconds of this machine's clock, passed in as parameters.
"""

from __future__ import annotations

from agent.storage import summaries
from agent.storage.sqlite.reads import THREAD_COLUMNS

# Claims the thread unless an unexpired claim holds it or the thread belongs to another user (the rule of
# `records.owned_by`), or a live waiter holds a smaller ticket than :token's (any, if :ticket is NULL) and
# :token does not hold the claim already (see "Waiting turns" in `storage.turns`); `changes()` tells whether it did.
CLAIM_SQL = """
INSERT INTO agent_claims AS c (thread_id, token, fence, expires_at, idempotency_key, cancel, user_id)
SELECT :thread_id, :token, 1, :expires_at, :key, NULL, :user_id
WHERE NOT EXISTS (SELECT 1 FROM agent_threads t WHERE t.thread_id = :thread_id AND t.user_id IS NOT :user_id)
  AND (NOT EXISTS (SELECT 1 FROM agent_claim_waiters w
                   WHERE w.thread_id = :thread_id AND w.expires_at >= :now AND w.token <> :token
                     AND (:ticket IS NULL OR w.ticket < :ticket))
       OR EXISTS (SELECT 1 FROM agent_claims h WHERE h.thread_id = :thread_id AND h.token = :token))
ON CONFLICT (thread_id) DO UPDATE
SET token = excluded.token, fence = c.fence + 1, expires_at = excluded.expires_at,
    idempotency_key = excluded.idempotency_key, cancel = NULL, user_id = excluded.user_id
WHERE c.expires_at < :now OR c.token = excluded.token
"""
# A user claim other than the caller's own (:user_claim) holds :user_id: a deletion of the user's data runs.
USER_BEING_DELETED_SQL = """
SELECT 1 FROM agent_user_claims WHERE user_id = :user_id AND expires_at >= :now AND token IS NOT :user_claim
"""
# The thread's queue (`agent_claim_waiters`): an attempt renews its ticket, a refused one takes one, the claim
# (and a waiter that gives up) removes it; the claim also removes the tickets of waiters whose process died.
RENEW_TICKET_SQL = """
UPDATE agent_claim_waiters SET expires_at = :expires_at WHERE thread_id = :thread_id AND token = :token RETURNING ticket
"""
TAKE_TICKET_SQL = """
INSERT INTO agent_claim_waiters (thread_id, token, expires_at) VALUES (:thread_id, :token, :expires_at)
"""
DONE_WAITING_SQL = """
DELETE FROM agent_claim_waiters WHERE thread_id = :thread_id AND (token = :token OR expires_at < :now)
"""
LEAVE_QUEUE_SQL = "DELETE FROM agent_claim_waiters WHERE thread_id = ? AND token = ?"
# Steering (`storage.turns`): as Postgres's OFFER_STEER_SQL, STEERED_MESSAGES_SQL and DROP_STEER_SQL.
OFFER_STEER_SQL = """
INSERT INTO agent_steers (thread_id, token, target, type, payload, created_at)
SELECT c.thread_id, :token, c.token, :type, :payload, :now FROM agent_claims c
WHERE c.thread_id = :thread_id AND c.token <> '' AND c.token <> :token AND c.expires_at >= :now
  AND NOT EXISTS (
    SELECT 1 FROM agent_claim_waiters w
    WHERE w.thread_id = :thread_id AND w.expires_at >= :now AND w.token <> :token
      AND w.ticket < COALESCE((SELECT m.ticket FROM agent_claim_waiters m
                               WHERE m.thread_id = :thread_id AND m.token = :token), 9223372036854775807))
ON CONFLICT (token) DO NOTHING
RETURNING target
"""
STEERED_MESSAGES_SQL = "SELECT token, type, payload FROM agent_steers WHERE thread_id = ? AND target = ? ORDER BY id"
DROP_STEER_SQL = "DELETE FROM agent_steers WHERE thread_id = ? AND (token = ? OR created_at < ?)"
# A deletion's user claim, taken or extended; no row returned: another unexpired user claim holds the user.
CLAIM_USER_SQL = """
INSERT INTO agent_user_claims AS u (user_id, token, expires_at) VALUES (:user_id, :token, :expires_at)
ON CONFLICT (user_id) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at
WHERE u.expires_at < :now OR u.token = excluded.token
RETURNING token
"""
RELEASE_USER_SQL = "DELETE FROM agent_user_claims WHERE user_id = ? AND token = ?"
CLAIMED_THREADS_OF_USER_SQL = """
SELECT thread_id FROM agent_claims WHERE user_id = ? AND token <> '' AND expires_at >= ? ORDER BY thread_id
"""
CLAIM_FENCE_SQL = "SELECT fence FROM agent_claims WHERE thread_id = ? AND token = ?"
RELEASE_CLAIM_SQL = """
UPDATE agent_claims SET token = '', expires_at = -1, cancel = NULL, idempotency_key = NULL
WHERE thread_id = ? AND token = ?
"""
DROP_CLAIM_SQL = "DELETE FROM agent_claims WHERE thread_id = ? AND token = ?"
REQUEST_CANCEL_SQL = "UPDATE agent_claims SET cancel = ? WHERE thread_id = ? AND token <> '' AND expires_at >= ?"
RENEW_CLAIM_SQL = "UPDATE agent_claims SET expires_at = ? WHERE thread_id = ? AND token = ? RETURNING thread_id, cancel"
CANCEL_OF_SQL = "SELECT cancel FROM agent_claims WHERE thread_id = ? AND token = ? AND cancel IS NOT NULL"
UPSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, title, metadata, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (thread_id) DO UPDATE SET head_checkpoint_id = excluded.head_checkpoint_id,
    message_count = excluded.message_count, updated_at = excluded.updated_at
"""
# A summary field of a checkpoint's metadata in any layout (`summaries`: under SUMMARY_KEY by its short
# name or as the positional array, or flat in checkpoints written before). SqliteSaver stores metadata as a JSON blob: a BLOB, which
# json_extract would read as binary JSONB, so it is cast to text.
SUMMARY_FIELD = (
    "(CASE json_type(CAST(metadata AS TEXT), '$.\"{key}\"') "
    "WHEN 'object' THEN json_extract(CAST(metadata AS TEXT), '$.\"{key}\".{short}') "
    "WHEN 'array' THEN json_extract(CAST(metadata AS TEXT), '$.\"{key}\"{place}') "
    "ELSE json_extract(CAST(metadata AS TEXT), '$.{long}') END)"
)


def summary_field(name: str, *, index: int | None = None) -> str:
    """SQL for one summary field; `index` picks input (0) or output (1) tokens of a usage field."""
    short, long = summaries.SHORT_NAMES[name], name
    # In the positional array (`summaries.as_positional`): its place, or its key in the object at the end.
    place = f"[{summaries.POSITIONAL.index(short)}]" if short in summaries.POSITIONAL else f"[{summaries.REST_INDEX}].{short}"
    if index is not None:  # packed usages are [input, output]; flat ones {"input_tokens", "output_tokens"}
        short, long, place = f"{short}[{index}]", f"{long}.{('input_tokens', 'output_tokens')[index]}", f"{place}[{index}]"
    return SUMMARY_FIELD.format(key=summaries.SUMMARY_KEY, short=short, long=long, place=place)


# The task path of each task with a pending write on a checkpoint (`ThreadStorage.task_paths`): no value read.
TASK_PATHS_SQL = """
SELECT DISTINCT task_id, task_path FROM writes WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?
"""
CHECKPOINT_LINKS_SQL = f"""
SELECT checkpoint_id, parent_checkpoint_id, {summary_field("message_count")}, {summary_field("kept_messages")},
    {summary_field("kept_trailing")}
FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''
"""
# The thread a checkpoint id names: the one agent_checkpoint_ids registers it to, else (an id no commit
# registered: a LangGraph copy_thread copy's once its source is gone) the first thread holding it.
THREAD_OF_CHECKPOINT_SQL = """
SELECT thread_id FROM (
    SELECT thread_id, 0 AS registered FROM agent_checkpoint_ids WHERE checkpoint_id = :checkpoint_id
    UNION ALL
    SELECT thread_id, 1 FROM checkpoints WHERE checkpoint_id = :checkpoint_id AND checkpoint_ns = ''
) ORDER BY registered, thread_id LIMIT 1
"""
# A root-namespace checkpoint's id registered to its thread, in the checkpoint's transaction (`TurnSqliteSaver`):
# nothing changes when a row exists, and CHECKPOINT_OWNER_SQL then tells this thread's from another's.
REGISTER_CHECKPOINT_SQL = """
INSERT INTO agent_checkpoint_ids (checkpoint_id, thread_id) VALUES (?, ?) ON CONFLICT (checkpoint_id) DO NOTHING
"""
CHECKPOINT_OWNER_SQL = "SELECT thread_id FROM agent_checkpoint_ids WHERE checkpoint_id = ?"
# Leaves updated_at alone: it is the conversation's last activity (see operations.catalogue).
UPDATE_THREAD_SQL = f"""
UPDATE agent_threads SET title = COALESCE(:title, title), metadata = COALESCE(:metadata, metadata),
    ttl_seconds = COALESCE(:ttl_seconds, ttl_seconds)
WHERE thread_id = :thread_id AND user_id IS :user_id
RETURNING {THREAD_COLUMNS}
"""
SET_HEAD_SQL = "UPDATE agent_threads SET head_checkpoint_id = ?, message_count = ?, updated_at = ? WHERE thread_id = ?"
INSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, title, metadata, forked_from,
    created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
SELECT_THREAD_MESSAGES_SQL = "SELECT checkpoint_id, type, checkpoint FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
# A thread's token usage (summed over the checkpoints' `usage`) and one checkpoint's metadata (its `branch_usage`).
TOKEN_USAGE_SQL = f"""
SELECT coalesce(sum({summary_field("usage", index=0)}), 0),
    coalesce(sum({summary_field("usage", index=1)}), 0),
    coalesce(max(checkpoint_id = ?), 0),
    max(CASE WHEN checkpoint_id = ? THEN CAST(metadata AS TEXT) END)
FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''
"""
DELETE_THREAD_SQL = [
    "DELETE FROM writes WHERE thread_id = ?",
    "DELETE FROM checkpoints WHERE thread_id = ?",
    "DELETE FROM agent_checkpoint_ids WHERE thread_id = ?",
    "DELETE FROM agent_idempotency WHERE thread_id = ?",
    "DELETE FROM agent_threads WHERE thread_id = ?",
    # Its runs (`agent.runs.store`): their events hold its turns' text, kept for response_events_seconds otherwise.
    "DELETE FROM agent_run_events WHERE response_id IN (SELECT response_id FROM agent_runs WHERE thread_id = ?)",
    "DELETE FROM agent_runs WHERE thread_id = ?",
    # Only a released claim: the deleting operation's own claim is released by its commit first.
    "DELETE FROM agent_claims WHERE thread_id = ? AND token = ''",
]

# -- retention (`operations.retention`) --
# A thread's expiry: its own ttl_seconds, else the agent's thread_ttl_seconds (NULL: never); epoch seconds.
EXPIRED_CONDITION = """COALESCE(t.ttl_seconds, :ttl) IS NOT NULL
    AND t.updated_at + COALESCE(t.ttl_seconds, :ttl) <= :now"""
# Candidates only (the sweep claims each one and checks again); a thread a turn holds is left out.
EXPIRED_THREADS_SQL = f"""
SELECT t.thread_id, t.user_id, t.updated_at FROM agent_threads t
WHERE {EXPIRED_CONDITION}
  AND (:after_ts IS NULL OR t.updated_at > :after_ts OR (t.updated_at = :after_ts AND t.thread_id > :after_id))
  AND NOT EXISTS (SELECT 1 FROM agent_claims c
                  WHERE c.thread_id = t.thread_id AND c.token <> '' AND c.expires_at >= :clock)
  AND (NOT :trimmable OR EXISTS (SELECT 1 FROM checkpoints k
                                 WHERE k.thread_id = t.thread_id AND k.checkpoint_id <> t.head_checkpoint_id))
ORDER BY t.updated_at, t.thread_id
LIMIT :limit
"""
IS_EXPIRED_SQL = f"SELECT 1 FROM agent_threads t WHERE t.thread_id = :thread_id AND {EXPIRED_CONDITION}"
SELECT_HEAD_ROW_SQL = """
SELECT type, checkpoint, metadata FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?
"""
UPDATE_HEAD_ROW_SQL = """
UPDATE checkpoints SET parent_checkpoint_id = NULL, type = ?, checkpoint = ?, metadata = ?
WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?
"""
DELETE_OTHER_WRITES_SQL = "DELETE FROM writes WHERE thread_id = ? AND NOT (checkpoint_ns = '' AND checkpoint_id = ?)"
DELETE_OTHER_ROOT_CHECKPOINTS_SQL = "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id <> ?"
DELETE_NAMESPACED_CHECKPOINTS_SQL = "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns <> ''"
DELETE_OTHER_CHECKPOINT_IDS_SQL = "DELETE FROM agent_checkpoint_ids WHERE thread_id = ? AND checkpoint_id <> ?"
# -- the saver's thread operations (`saver_threads.SaverThreadOperations`: prune, copy_thread, delete_for_runs) --
SELECT_CHECKPOINT_ROW_SQL = """
SELECT type, checkpoint FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
REWRITE_CHECKPOINT_SQL = """
UPDATE checkpoints SET parent_checkpoint_id = ?, type = ?, checkpoint = ?, metadata = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
THREAD_HAS_ROWS_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = ? LIMIT 1"
BUSY_THREAD_SQL = "SELECT 1 FROM agent_claims WHERE thread_id = ? AND token <> '' AND expires_at >= ?"
THREADS_OF_RUNS_SQL = """
SELECT DISTINCT thread_id FROM checkpoints
WHERE json_extract(CAST(metadata AS TEXT), '$.run_id') IN (SELECT value FROM json_each(?)) ORDER BY thread_id
"""
COPY_THREAD_SQL = [
    """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT :target, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
    FROM checkpoints WHERE thread_id = :source""",
    """INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)
    SELECT :target, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
    FROM writes WHERE thread_id = :source""",
]
# `keep` is a JSON array of [checkpoint_ns, checkpoint_id] pairs.
KEPT_PAIRS = "(SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:keep))"
DELETE_UNKEPT_SQL = [
    f"DELETE FROM writes WHERE thread_id = :thread_id AND (checkpoint_ns, checkpoint_id) NOT IN {KEPT_PAIRS}",
    f"DELETE FROM checkpoints WHERE thread_id = :thread_id AND (checkpoint_ns, checkpoint_id) NOT IN {KEPT_PAIRS}",
    f"DELETE FROM agent_checkpoint_ids WHERE thread_id = :thread_id AND ('', checkpoint_id) NOT IN {KEPT_PAIRS}",
]


FIND_IDEMPOTENCY_SQL = """
SELECT request_hash, thread_id, response FROM agent_idempotency WHERE user_key = ? AND key = ? AND expires_at > ?
"""
RUNNING_WITH_KEY_SQL = """
SELECT thread_id FROM agent_claims WHERE idempotency_key = ? AND token <> '' AND expires_at >= ? LIMIT 1
"""
DELETE_EXPIRED_KEY_SQL = "DELETE FROM agent_idempotency WHERE user_key = ? AND key = ? AND expires_at <= ?"
# A plain INSERT: an unexpired row with the same key fails the commit (IntegrityError).
STORE_RESPONSE_SQL = """
INSERT INTO agent_idempotency (user_key, key, request_hash, thread_id, response, created_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""
SWEEP_IDEMPOTENCY_SQL = "DELETE FROM agent_idempotency WHERE expires_at <= ?"
