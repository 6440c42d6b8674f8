"""The Postgres backend's statements, as named constants (the way langgraph-checkpoint-postgres keeps its own).

In order: the claim and the reads of a thread and its checkpoints, the rest
of the turn protocol (commit, release, lease), the catalogue and the write
transaction's statements (`transaction.PostgresTx`), the retention sweep, the
saver's thread operations, idempotency. A statement is
never assembled inside a method: where one varies (`LIST_THREADS_SQLS`), every
variant is built here, once, at import. The commit's writes and the claim call
plpgsql functions the migrations create (`schema`), for their cached plans.
"""

from __future__ import annotations

import re

from agent.storage import summaries
from agent.storage.postgres import inline_messages

CLAIM_TURN_SQL = "SELECT * FROM agent_claim_turn(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
# The row version (xmin) of the head a turn's commit wrote, read in that commit (`storage.KnownHeads`).
HEAD_XMIN_SQL = "SELECT xmin::text FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s"
THREAD_COLUMNS = """thread_id, user_id, head_checkpoint_id, title, metadata, message_count, forked_from, ttl_seconds,
    to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS created_at,
    to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS updated_at"""
SELECT_THREAD_SQL = f"SELECT {THREAD_COLUMNS} FROM agent_threads WHERE thread_id = %s"
# Checkpoints in the shape of PostgresSaver.SELECT_SQL (the saver's own `SELECT_SQL`), `messages` from the
# row when it holds them (`inline_messages.channel_values_sql`).
SELECT_CHECKPOINTS_COLUMNS = f"""
SELECT c.thread_id, c.checkpoint, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.metadata,
    {inline_messages.channel_values_sql("c")} AS channel_values,
    (SELECT array_agg(array[convert_to(cw.task_id::text, 'UTF8'), convert_to(cw.channel, 'UTF8'),
                            convert_to(cw.type, 'UTF8'), cw.blob, convert_to(cw.task_path, 'UTF8'),
                            convert_to(cw.idx::text, 'UTF8')])
     FROM checkpoint_writes cw
     WHERE cw.thread_id = c.thread_id AND cw.checkpoint_ns = c.checkpoint_ns AND cw.checkpoint_id = c.checkpoint_id
    ) AS pending_writes
FROM checkpoints c
"""
# The turn's start: the requested checkpoint, else the thread head.
SELECT_CHECKPOINT_SQL = SELECT_CHECKPOINTS_COLUMNS + """
WHERE c.thread_id = %s AND c.checkpoint_ns = '' AND c.checkpoint_id = COALESCE(
    %s, (SELECT head_checkpoint_id FROM agent_threads WHERE thread_id = %s))
"""
SELECT_SOME_CHECKPOINTS_SQL = SELECT_CHECKPOINTS_COLUMNS + """
WHERE c.thread_id = %s AND c.checkpoint_ns = '' AND c.checkpoint_id = ANY(%s)
"""
END_CLAIM_SQL = "SELECT agent_end_claim(%s, %s)"
RELEASE_CLAIM_SQL = """
UPDATE agent_claims SET token = '', expires_at = '-infinity', cancel = NULL, idempotency_key = NULL
WHERE thread_id = %s AND token = %s
"""
# A claim on a thread that was never written leaves nothing behind when released.
DROP_CLAIM_SQL = "DELETE FROM agent_claims WHERE thread_id = %s AND token = %s"
CLAIM_STATE_SQL = "SELECT token, fence FROM agent_claims WHERE thread_id = %s"
REQUEST_CANCEL_SQL = """
UPDATE agent_claims SET cancel = %s WHERE thread_id = %s AND token <> '' AND expires_at >= clock_timestamp()
"""
RENEW_CLAIMS_SQL = """
UPDATE agent_claims c SET expires_at = clock_timestamp() + make_interval(secs => %s)
FROM unnest(%s::text[], %s::text[]) AS held(thread_id, token)
WHERE c.thread_id = held.thread_id AND c.token = held.token
RETURNING c.thread_id, c.cancel
"""
POLL_CANCELS_SQL = """
SELECT c.thread_id, c.cancel FROM agent_claims c
JOIN unnest(%s::text[], %s::text[]) AS held(thread_id, token) ON c.thread_id = held.thread_id AND c.token = held.token
WHERE c.cancel IS NOT NULL
"""
# A waiter that gave up leaves the thread's queue (`agent_claim_waiters`).
LEAVE_QUEUE_SQL = "DELETE FROM agent_claim_waiters WHERE thread_id = %s AND token = %s"
# Steering (`storage.turns`): an offer bound to the thread's live claim, refused while a live waiter holds a
# smaller ticket than the offering request's own; the running turn reads its offers; the request deletes its own
# (and offers older than a day, whose request died).
OFFER_STEER_SQL = """
INSERT INTO agent_steers (thread_id, token, target, type, payload)
SELECT c.thread_id, %(token)s, c.token, %(type)s, %(payload)s FROM agent_claims c
WHERE c.thread_id = %(thread_id)s AND c.token <> '' AND c.token <> %(token)s AND c.expires_at >= clock_timestamp()
  AND NOT EXISTS (
    SELECT 1 FROM agent_claim_waiters w
    WHERE w.thread_id = %(thread_id)s AND w.expires_at >= clock_timestamp() AND w.token <> %(token)s
      AND w.ticket < COALESCE((SELECT m.ticket FROM agent_claim_waiters m
                               WHERE m.thread_id = %(thread_id)s AND m.token = %(token)s), 9223372036854775807))
ON CONFLICT (token) DO NOTHING
RETURNING target
"""
STEERED_MESSAGES_SQL = "SELECT token, type, payload FROM agent_steers WHERE thread_id = %s AND target = %s ORDER BY id"
DROP_STEER_SQL = """
DELETE FROM agent_steers
WHERE thread_id = %s AND (token = %s OR created_at < clock_timestamp() - make_interval(secs => %s))
"""
# A deletion's user claim: taken (or extended) under the user's exclusive advisory lock, which waits for
# claims running `agent_claim_turn` for that user to commit (see `storage.turns`). No row returned: another
# unexpired user claim holds the user.
LOCK_USER_SQL = "SELECT pg_advisory_xact_lock(%s::integer, hashtext(%s))"
CLAIM_USER_SQL = """
INSERT INTO agent_user_claims AS u (user_id, token, expires_at)
VALUES (%(user_id)s, %(token)s, clock_timestamp() + make_interval(secs => %(seconds)s))
ON CONFLICT (user_id) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
WHERE u.expires_at < clock_timestamp() OR u.token = EXCLUDED.token
RETURNING u.token
"""
RELEASE_USER_SQL = "DELETE FROM agent_user_claims WHERE user_id = %s AND token = %s"
CLAIMED_THREADS_OF_USER_SQL = """
SELECT thread_id FROM agent_claims
WHERE user_id = %s AND token <> '' AND expires_at >= clock_timestamp() ORDER BY thread_id
"""
UPSERT_THREAD_SQL = "SELECT agent_upsert_thread(%s, %s, %s, %s, %s, %s)"
# LangGraph's UPSERT_CHECKPOINT_BLOBS_SQL and UPSERT_CHECKPOINTS_SQL as calls of the functions that run them with
# cached plans (`schema`). The version as text: LangGraph's versions may be int or float
# (`langgraph.checkpoint.base.V`), which psycopg sends as numbers, and a function call has no implicit cast to
# TEXT (LangGraph's INSERT has).
PUT_BLOB_SQL = "SELECT agent_put_blob(%s, %s, %s, %s::text, %s, %s)"
PUT_CHECKPOINT_SQL = "SELECT agent_put_checkpoint(%s, %s, %s, %s, %s, %s)"
CHECKPOINT_IN_THREAD_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s"
LIST_CHECKPOINTS_SQL = """
SELECT checkpoint_id, parent_checkpoint_id, metadata FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = '' AND (%s::text IS NULL OR checkpoint_id < %s)
ORDER BY checkpoint_id DESC LIMIT %s
"""
# A summary field of a checkpoint's metadata in any layout (`summaries`: under SUMMARY_KEY by its short
# name, as an object, as JSON text of an object or of an array (`summaries`, "Positional on Postgres"), or
# flat in checkpoints written before); `{place}` is the field's jsonb path in the array.
SUMMARY_FIELD = (
    "(CASE jsonb_typeof(metadata -> '{key}') WHEN 'string' THEN (metadata ->> '{key}')::jsonb #> "
    "(CASE WHEN left(metadata ->> '{key}', 1) = '[' THEN '{{{place}}}' ELSE '{{{short}}}' END)::text[] "
    "WHEN 'object' THEN metadata #> '{{{key},{short}}}' ELSE metadata #> '{{{long}}}' END)"
)


def summary_field(name: str, *, index: int | None = None) -> str:
    """SQL for one summary field (jsonb); `index` picks input (0) or output (1) tokens of a usage field."""
    short, long = summaries.SHORT_NAMES[name], name
    place = str(summaries.POSITIONAL.index(short)) if short in summaries.POSITIONAL else f"{summaries.REST_INDEX},{short}"
    if index is not None:  # packed usages are [input, output]; flat ones {"input_tokens", "output_tokens"}
        short, long, place = f"{short},{index}", f"{long},{('input_tokens', 'output_tokens')[index]}", f"{place},{index}"
    return SUMMARY_FIELD.format(key=summaries.SUMMARY_KEY, short=short, long=long, place=place)


# The task path of each task with a pending write on a checkpoint (`ThreadStorage.task_paths`): no value read.
TASK_PATHS_SQL = """
SELECT DISTINCT task_id, task_path FROM checkpoint_writes
WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s
"""
# The thread's tree from the metadata summaries, without reading messages or whole metadata documents.
CHECKPOINT_LINKS_SQL = f"""
SELECT checkpoint_id, parent_checkpoint_id, COALESCE(({summary_field("message_count")} #>> '{{}}')::int, 0) AS message_count,
    ({summary_field("kept_messages")} #>> '{{}}')::int AS kept_messages,
    COALESCE(({summary_field("kept_trailing")} #>> '{{}}')::int, 0) AS kept_trailing
FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''
"""
SET_HEAD_SQL = """
UPDATE agent_threads SET head_checkpoint_id = %s, message_count = %s, updated_at = now() WHERE thread_id = %s
"""
INSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, title, metadata, forked_from)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
# Every checkpoint's stored `messages` value: the row's own (`inline_messages`), else the blob its channel
# version points at. A LEFT JOIN: a checkpoint with no messages yet (the input checkpoint of a plain
# MessagesState graph) is a base too.
STORED_MESSAGES_SQL = """
SELECT c.checkpoint_id, COALESCE(c.agent_messages_type, b.type) AS type,
    CASE WHEN c.agent_messages_type IS NULL THEN b.blob ELSE c.agent_messages END AS blob
FROM checkpoints c
LEFT JOIN checkpoint_blobs b ON c.agent_messages_type IS NULL AND b.thread_id = c.thread_id
  AND b.checkpoint_ns = c.checkpoint_ns
  AND b.channel = 'messages' AND b.version = c.checkpoint -> 'channel_versions' ->> 'messages'
"""
SELECT_THREAD_MESSAGES_SQL = STORED_MESSAGES_SQL + "WHERE c.thread_id = %s AND c.checkpoint_ns = %s"
# The stored messages of some root-namespace checkpoints of a thread (history's previews).
SELECT_CHECKPOINT_MESSAGES_SQL = STORED_MESSAGES_SQL + "WHERE c.thread_id = %s AND c.checkpoint_ns = '' AND c.checkpoint_id = ANY(%s)"
SELECT_USER_THREADS_SQL = "SELECT thread_id FROM agent_threads WHERE user_id = %s ORDER BY thread_id"
# The thread a checkpoint id names: the one whose row `checkpoint_ids.OWNER_INDEX` holds, else (a copy whose source
# is gone) the first copy holding it (`checkpoint_ids.COPIES_INDEX`). Each branch's WHERE implies its index's.
THREAD_OF_CHECKPOINT_SQL = """
SELECT thread_id FROM (
    SELECT thread_id, 0 AS copy FROM checkpoints
    WHERE checkpoint_id = %(checkpoint_id)s AND checkpoint_ns = '' AND agent_copy IS NULL
    UNION ALL
    SELECT thread_id, 1 FROM checkpoints WHERE checkpoint_id = %(checkpoint_id)s AND agent_copy AND checkpoint_ns = ''
) AS found ORDER BY copy, thread_id LIMIT 1
"""
# The catalogue (`operations.catalogue`): one backward range scan of agent_threads_activity_asc_idx per page. The
# position is the row's (updated_at, thread_id); `activity` is updated_at as exact text (microseconds).
# Qualified columns: a bare `updated_at` in ORDER BY would name the output column (text), not the index's.
LIST_THREADS_SQL = f"""
SELECT {THREAD_COLUMNS} FROM agent_threads t
WHERE {{owner}} AND t.metadata @> %(metadata)s {{after}}
ORDER BY t.updated_at DESC, t.thread_id DESC LIMIT %(limit)s
"""
LIST_THREADS_AFTER = "AND (t.updated_at, t.thread_id) < (%(activity)s::timestamptz, %(thread_id)s)"
# The only `activity` text a cursor may hold: what the to_char above writes.
ACTIVITY_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}\+00:00")
#: One statement per (anonymous caller?, next page?): `user_id = NULL` would match nothing.
LIST_THREADS_SQLS = {
    (anonymous, paging): LIST_THREADS_SQL.format(
        owner="t.user_id IS NULL" if anonymous else "t.user_id = %(user_id)s", after=LIST_THREADS_AFTER if paging else ""
    )
    for anonymous in (False, True)
    for paging in (False, True)
}
THREAD_POSITION_SQL = """
SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS activity, thread_id
FROM agent_threads WHERE thread_id = %s
"""
# Leaves updated_at alone: it is the conversation's last activity (see operations.catalogue).
UPDATE_THREAD_SQL = f"""
UPDATE agent_threads SET title = COALESCE(%(title)s, title), metadata = COALESCE(%(metadata)s, metadata),
    ttl_seconds = COALESCE(%(ttl_seconds)s, ttl_seconds)
WHERE thread_id = %(thread_id)s AND user_id IS NOT DISTINCT FROM %(user_id)s
RETURNING {THREAD_COLUMNS}
"""
# A thread's token usage (summed over the checkpoints' `usage`) and one checkpoint's `branch_usage`.
TOKEN_USAGE_SQL = f"""
SELECT coalesce(sum(({summary_field("usage", index=0)} #>> '{{}}')::bigint), 0) AS input_tokens,
    coalesce(sum(({summary_field("usage", index=1)} #>> '{{}}')::bigint), 0) AS output_tokens,
    coalesce(bool_or(checkpoint_id = %s), false) AS found,
    (array_agg(metadata) FILTER (WHERE checkpoint_id = %s))[1] AS metadata
FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''
"""
DELETE_THREAD_SQL = [
    "DELETE FROM checkpoint_writes WHERE thread_id = %s",
    "DELETE FROM checkpoint_blobs WHERE thread_id = %s",
    "DELETE FROM checkpoints WHERE thread_id = %s",
    "DELETE FROM agent_idempotency WHERE thread_id = %s",
    "DELETE FROM agent_threads WHERE thread_id = %s",
    # Its runs (`agent.runs.store`): their events hold its turns' text, kept for response_events_seconds otherwise.
    "DELETE FROM agent_run_events WHERE response_id IN (SELECT response_id FROM agent_runs WHERE thread_id = %s)",
    "DELETE FROM agent_runs WHERE thread_id = %s",
]
# -- retention (`operations.retention`) --
# A thread's expiry: its own ttl_seconds, else the agent's thread_ttl_seconds (NULL: never). The ttl is read
# as 0 to MAX_TTL_SECONDS: a row written before that bound was enforced (1e15, NaN, Infinity) would make
# make_interval overflow (DatetimeFieldOverflow) and the query fail for every thread of the database.
MAX_TTL_SECONDS = 100 * 365 * 24 * 3600  # = operations.thread_values.MAX_TTL_SECONDS, which entry enforces
EXPIRED_CONDITION = f"""COALESCE(t.ttl_seconds, %(ttl)s::float8) IS NOT NULL
    AND t.updated_at + make_interval(secs => LEAST(GREATEST(COALESCE(t.ttl_seconds, %(ttl)s::float8), 0), {MAX_TTL_SECONDS}))
        <= COALESCE(%(now)s::timestamptz, now())"""
# Candidates only (the sweep claims each one and checks again); a thread a turn holds is left out.
EXPIRED_THREADS_SQL = f"""
SELECT t.thread_id, t.user_id, t.updated_at FROM agent_threads t
WHERE {EXPIRED_CONDITION}
  AND (%(after_ts)s::timestamptz IS NULL OR (t.updated_at, t.thread_id) > (%(after_ts)s::timestamptz, %(after_id)s::text))
  AND NOT EXISTS (SELECT 1 FROM agent_claims c
                  WHERE c.thread_id = t.thread_id AND c.token <> '' AND c.expires_at >= clock_timestamp())
  AND (NOT %(trimmable)s OR EXISTS (SELECT 1 FROM checkpoints k
                                    WHERE k.thread_id = t.thread_id AND k.checkpoint_id <> t.head_checkpoint_id))
ORDER BY t.updated_at, t.thread_id
LIMIT %(limit)s
"""
IS_EXPIRED_SQL = f"SELECT 1 FROM agent_threads t WHERE t.thread_id = %(thread_id)s AND {EXPIRED_CONDITION}"
# keep_latest and prune: a checkpoint's `messages` value rewritten whole, where it is stored: its blob row (by
# version) and its own row (`inline_messages`); the one that holds nothing is left as it is.
REWRITE_BLOB_SQL = """
UPDATE checkpoint_blobs SET type = %s, blob = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND channel = 'messages' AND version = %s
"""
REWRITE_INLINE_SQL = """
UPDATE checkpoints SET agent_messages_type = %s, agent_messages = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s AND agent_messages_type IS NOT NULL
"""
# -- the saver's thread operations (`saver_threads.SaverThreadOperations`: prune, copy_thread, delete_for_runs) --
REPARENT_SQL = """
UPDATE checkpoints SET parent_checkpoint_id = %s, metadata = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
"""
THREAD_HAS_ROWS_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = %s LIMIT 1"
BUSY_THREADS_SQL = """
SELECT thread_id FROM agent_claims
WHERE thread_id = ANY(%s) AND token <> '' AND expires_at >= clock_timestamp() ORDER BY thread_id
"""
THREADS_OF_RUNS_SQL = "SELECT DISTINCT thread_id FROM checkpoints WHERE metadata ->> 'run_id' = ANY(%s) ORDER BY thread_id"
# The copy's rows are marked: their ids keep naming the source (`checkpoint_ids`).
COPY_THREAD_SQL = [
    """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata,
        agent_copy, agent_terms, agent_messages_type, agent_messages)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata, true, agent_terms,
        agent_messages_type, agent_messages
    FROM checkpoints WHERE thread_id = %(source)s""",
    """INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %(target)s, checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs WHERE thread_id = %(source)s""",
    """INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
    FROM checkpoint_writes WHERE thread_id = %(source)s""",
]
# `keep` is two arrays: namespaces and checkpoint ids, pairwise.
KEPT_PAIRS = "(SELECT * FROM unnest(%(ns)s::text[], %(ids)s::text[]))"
DELETE_UNKEPT_SQL = [
    f"""DELETE FROM checkpoint_writes WHERE thread_id = %(thread_id)s
        AND (checkpoint_ns, checkpoint_id) NOT IN {KEPT_PAIRS}""",
    f"""DELETE FROM checkpoints WHERE thread_id = %(thread_id)s
        AND (checkpoint_ns, checkpoint_id) NOT IN {KEPT_PAIRS}""",
    # Blobs are shared between checkpoints by (channel, version): keep exactly those a kept one points at.
    """DELETE FROM checkpoint_blobs b WHERE b.thread_id = %(thread_id)s AND NOT EXISTS (
        SELECT 1 FROM checkpoints c
        WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = b.checkpoint_ns
          AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)""",
]
DELETE_OTHER_WRITES_SQL = """
DELETE FROM checkpoint_writes WHERE thread_id = %(thread_id)s
  AND NOT (checkpoint_ns = '' AND checkpoint_id = %(head)s)
"""
# Blobs are shared between checkpoints by (channel, version): keep exactly those the head points at.
DELETE_OTHER_BLOBS_SQL = """
DELETE FROM checkpoint_blobs b WHERE b.thread_id = %(thread_id)s AND NOT EXISTS (
    SELECT 1 FROM checkpoints h
    WHERE h.thread_id = %(thread_id)s AND h.checkpoint_ns = '' AND h.checkpoint_id = %(head)s
      AND b.checkpoint_ns = '' AND h.checkpoint -> 'channel_versions' ->> b.channel = b.version)
"""
DELETE_OTHER_CHECKPOINTS_SQL = """
WITH gone AS (
    DELETE FROM checkpoints WHERE thread_id = %(thread_id)s AND NOT (checkpoint_ns = '' AND checkpoint_id = %(head)s)
    RETURNING checkpoint_ns)
SELECT count(*) FILTER (WHERE checkpoint_ns = '') AS removed FROM gone
"""
MAKE_ROOT_SQL = f"""
UPDATE checkpoints SET parent_checkpoint_id = NULL, metadata = CASE jsonb_typeof(metadata -> '{summaries.SUMMARY_KEY}')
    WHEN 'string' THEN jsonb_set(metadata, '{{{summaries.SUMMARY_KEY}}}', to_jsonb(jsonb_set(
        (metadata ->> '{summaries.SUMMARY_KEY}')::jsonb,
        (CASE WHEN left(metadata ->> '{summaries.SUMMARY_KEY}', 1) = '['
              THEN '{{{summaries.POSITIONAL.index(summaries.SHORT_NAMES["kept_messages"])}}}'
              ELSE '{{{summaries.SHORT_NAMES["kept_messages"]}}}' END)::text[], '0')::text))
    WHEN 'object'
    THEN jsonb_set(metadata, '{{{summaries.SUMMARY_KEY},{summaries.SHORT_NAMES["kept_messages"]}}}', '0')
    ELSE metadata || '{{"kept_messages": 0}}'::jsonb END
WHERE thread_id = %(thread_id)s AND checkpoint_ns = '' AND checkpoint_id = %(head)s
"""
# The claim row goes last and only if it is released: the deleting operation's own claim
# is released by its commit, which runs agent_end_claim first.
DELETE_RELEASED_CLAIM_SQL = "DELETE FROM agent_claims WHERE thread_id = %s AND token = ''"

FIND_IDEMPOTENCY_SQL = """
SELECT request_hash, thread_id, response FROM agent_idempotency
WHERE user_key = %s AND key = %s AND expires_at > now()
"""
RUNNING_WITH_KEY_SQL = """
SELECT thread_id FROM agent_claims
WHERE idempotency_key = %s AND token <> '' AND expires_at >= clock_timestamp() LIMIT 1
"""
DELETE_EXPIRED_KEY_SQL = "DELETE FROM agent_idempotency WHERE user_key = %s AND key = %s AND expires_at <= now()"
# A plain INSERT: an unexpired row with the same key fails the commit (UniqueViolation).
STORE_RESPONSE_SQL = """
INSERT INTO agent_idempotency (user_key, key, request_hash, thread_id, response, created_at, expires_at)
VALUES (%s, %s, %s, %s, %s, now(), now() + make_interval(secs => %s))
"""
SWEEP_IDEMPOTENCY_SQL = "DELETE FROM agent_idempotency WHERE expires_at <= now()"
IDEMPOTENCY_PKEY = "agent_idempotency_pkey"

#: SQLSTATE raised by `agent_end_claim` when the claim is gone.
CLAIM_LOST_SQLSTATE = "TT001"

READY_SQL = "SELECT 1"
