"""Postgres backend: `psycopg_pool.ConnectionPool` + LangGraph's `PostgresSaver`, with the turn protocol of `base`.

Design notes:

* **Short transactions only.** A turn uses a pooled connection twice: one
  statement to claim its thread and read its start (`agent_begin_turn`), and
  one query to commit: `BEGIN`, the fencing check, every write and `COMMIT`,
  bound on the client and sent together (`postgres_batch`: psycopg's pipeline
  spent 0.4 ms more client CPU on the same statements). Nothing is held while
  the model runs, so `pool_max_size` bounds concurrent *database work*, not
  concurrent turns.
* **Plans cached without prepared statements.** Without prepared statements
  (next point) Postgres plans every statement again, and planning was about
  half of a turn's database time: the claim's four statements took 1.6 ms
  unprepared against 0.7 ms prepared (the start read alone plans in 0.3 ms and
  runs in 0.1 ms). So the claim (`agent_begin_turn`), the fencing check
  (`agent_end_claim`) and the commit's writes (`agent_put_blob`,
  `agent_put_checkpoint`, `agent_upsert_thread`) are plpgsql functions
  (migrations): plpgsql keeps the plans of its statements for the life of the
  server session, server-side state that a transaction-mode pooler cannot
  break. The claim's own transaction commits with `synchronous_commit` off:
  losing a claim in a server crash only makes its turn's (durable) commit fail
  the fencing check.
* **Transaction-mode poolers (PgBouncer).** No prepared statements unless
  `prepare_threshold` is set (psycopg's `0` prepares everything, which
  PgBouncer 1.18 in transaction mode breaks with `DuplicatePreparedStatement`,
  langgraph#6705), no session state: no session advisory locks, no `SET`
  outside a transaction.
* **No saver-wide lock.** `PostgresSaver` serializes every query of an
  instance behind one lock even when it is given a pool (langgraph#7259), so
  `_cursor` is overridden to take a pooled connection (or the commit's) without it.
* **Schema.** `setup()` first only reads: when every table exists and every
  migration table is up to date, it writes nothing, so an application role
  without DDL rights and a read-only replica pass it (their turns then fail
  at the claim, with the cause). Otherwise it runs LangGraph's migration lists
  (the checkpointer's, and the store's that long-term memory uses) and the
  agent's (`MIGRATIONS`, a migration's position is its version) in ONE
  transaction under `pg_advisory_xact_lock`: safe from many processes at
  once and through PgBouncer. LangGraph creates its indexes `CONCURRENTLY`,
  which cannot run in a transaction; they are created here without it (on the
  new, empty tables this creates, that is instant). A missing table (dropped
  by hand) makes it re-apply every (idempotent) migration: trusting the
  migrations table alone left a database broken for good. A running agent
  that finds a table missing re-creates it the same way and runs the request again.
* **Faults.** A connection found dead (server restart, `pg_terminate_backend`)
  is replaced and the read or claim is run again (safe: nothing was written).
  The commit is one round trip, sent only on a connection the server has not
  already ended: an idle connection has nothing to read unless the server
  closed it or said why it did, so one poll() call per commit finds the
  connections a restart or a killed backend left behind before anything is
  sent on them (no write was sent: the commit goes to a fresh connection, or
  fails saying nothing was written). A connection that fails after the commit
  was sent is settled by asking the database on a new connection whether the
  claim was released by this commit: not yet, and the commit is sent again.
  Only when the database cannot be asked does the error say the outcome is
  unknown. (The commit used to spend a round trip on the fencing check alone
  to know this; 0.1 ms of every turn.)
  An unreachable server fails after `connect_timeout`, not `pool_timeout`.
  Missing privileges and a read-only server are found by the claim, before
  the model is called.
* **Managed credentials.** With a `credential_provider`, the pool's connection
  kwargs are a callable (psycopg_pool >= 3.3), so every new connection gets a
  fresh or cached password, and `max_lifetime` retires connections before their
  token expires.
"""

from __future__ import annotations

import logging
import math
import select
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.base import MIGRATIONS as LANGGRAPH_MIGRATIONS
from langgraph.store.postgres.base import MIGRATIONS as STORE_MIGRATIONS
from psycopg.rows import dict_row
from psycopg.types.json import Json, Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from agent.config import AgentSettings, mask_url
from agent.errors import AgentError, InvalidRequest, LeaseExpired, StorageUnavailable
from agent.storage import deltas, summaries
from agent.storage.base import (
    CheckpointLink,
    Claim,
    ExpiredThread,
    IdempotencyKeyTaken,
    IdempotencyState,
    ThreadRecord,
    ThreadStorage,
    Turn,
    Tx,
)
from agent.storage.postgres_batch import StatementBatch
from agent.storage.saver import TurnSaverMixin

logger = logging.getLogger(__name__)

# The agent's own migrations; a migration's position is its version. Each is idempotent,
# so setup can re-apply them all when it finds a table missing.
MIGRATIONS = [
    "CREATE TABLE IF NOT EXISTS agent_migrations (v INTEGER PRIMARY KEY)",
    """CREATE TABLE IF NOT EXISTS agent_threads (
        thread_id TEXT PRIMARY KEY,
        user_id TEXT,
        head_checkpoint_id TEXT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    "CREATE INDEX IF NOT EXISTS agent_threads_user_id_idx ON agent_threads (user_id)",
    """ALTER TABLE agent_threads
        ADD COLUMN IF NOT EXISTS title TEXT,
        ADD COLUMN IF NOT EXISTS metadata JSONB NOT NULL DEFAULT '{}',
        ADD COLUMN IF NOT EXISTS message_count INTEGER NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS forked_from JSONB,
        ADD COLUMN IF NOT EXISTS ttl_seconds DOUBLE PRECISION""",
    "CREATE INDEX IF NOT EXISTS agent_threads_activity_idx ON agent_threads (user_id, updated_at DESC, thread_id DESC)",
    "CREATE INDEX IF NOT EXISTS agent_threads_updated_at_idx ON agent_threads (updated_at)",
    """CREATE TABLE IF NOT EXISTS agent_claims (
        thread_id TEXT PRIMARY KEY,
        token TEXT NOT NULL,
        fence BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        idempotency_key TEXT,
        cancel TEXT
    )""",
    # The commit's fencing check, in the commit's own round trip: it releases the
    # claim if `token` still holds it, and otherwise aborts the transaction.
    """CREATE OR REPLACE FUNCTION agent_end_claim(p_thread_id TEXT, p_token TEXT) RETURNS BIGINT
    LANGUAGE plpgsql AS $$
    DECLARE v_fence BIGINT;
    BEGIN
        UPDATE agent_claims SET token = '', expires_at = '-infinity', cancel = NULL, idempotency_key = NULL
        WHERE thread_id = p_thread_id AND token = p_token
        RETURNING fence INTO v_fence;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the claim on thread % is no longer held', p_thread_id USING ERRCODE = 'TT001';
        END IF;
        RETURN v_fence;
    END $$""",
    """CREATE TABLE IF NOT EXISTS agent_idempotency (
        user_key TEXT NOT NULL,
        key TEXT NOT NULL,
        request_hash TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        response JSONB NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        expires_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (user_key, key)
    )""",
    "CREATE INDEX IF NOT EXISTS agent_idempotency_thread_idx ON agent_idempotency (thread_id)",
    # A retry looks for a running turn that carries its key; the sweep deletes expired results.
    "CREATE INDEX IF NOT EXISTS agent_claims_idempotency_idx ON agent_claims (idempotency_key) WHERE idempotency_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS agent_idempotency_expires_idx ON agent_idempotency (expires_at)",
    # An OpenAI response id is `resp_<checkpoint_id>`: finding its thread needs checkpoint_id alone
    # (LangGraph's primary key starts with thread_id).
    "CREATE INDEX IF NOT EXISTS agent_checkpoints_checkpoint_id_idx ON checkpoints (checkpoint_id)",
    # A turn's claim in one statement (see "Plans cached without prepared statements" above). It claims the
    # thread unless an unexpired claim holds it or the thread belongs to another user (the rule of
    # `base.owned_by`); re-running it with the same token succeeds, so a claim whose connection died can be
    # retried. It returns the thread's record, the privileges a commit needs that the role lacks, and (only
    # when the claim succeeded and p_read_start) the start: p_checkpoint_id, else the head, in the shape of
    # SELECT_CHECKPOINTS_COLUMNS (the blobs by one primary-key lookup per channel, as there).
    """CREATE OR REPLACE FUNCTION agent_begin_turn(
        p_thread_id TEXT, p_token TEXT, p_user_id TEXT, p_lease DOUBLE PRECISION, p_key TEXT,
        p_checkpoint_id TEXT, p_read_start BOOLEAN)
    RETURNS TABLE (
        claim_fence BIGINT, missing_privileges TEXT[],
        t_thread_id TEXT, t_user_id TEXT, t_head_checkpoint_id TEXT, t_title TEXT, t_metadata JSONB,
        t_message_count INTEGER, t_forked_from JSONB, t_ttl_seconds DOUBLE PRECISION, t_created_at TEXT,
        t_updated_at TEXT,
        s_thread_id TEXT, s_checkpoint JSONB, s_checkpoint_ns TEXT, s_checkpoint_id TEXT,
        s_parent_checkpoint_id TEXT, s_metadata JSONB, s_channel_values BYTEA[], s_pending_writes BYTEA[])
    LANGUAGE plpgsql AS $$
    BEGIN
        -- The claim need not survive a crash of the server: a lost claim only makes its turn's commit,
        -- whose fencing check is durable, fail with LeaseExpired. Local to this statement's transaction.
        PERFORM set_config('synchronous_commit', 'off', true);
        INSERT INTO agent_claims AS c (thread_id, token, fence, expires_at, idempotency_key, cancel)
        SELECT p_thread_id, p_token, 1, clock_timestamp() + make_interval(secs => p_lease), p_key, NULL
        WHERE NOT EXISTS (
            SELECT 1 FROM agent_threads t WHERE t.thread_id = p_thread_id AND t.user_id IS DISTINCT FROM p_user_id)
        ON CONFLICT (thread_id) DO UPDATE
        SET token = EXCLUDED.token, fence = c.fence + 1, expires_at = EXCLUDED.expires_at,
            idempotency_key = EXCLUDED.idempotency_key, cancel = NULL
        WHERE c.expires_at < clock_timestamp() OR c.token = EXCLUDED.token
        RETURNING c.fence INTO claim_fence;

        SELECT t.thread_id, t.user_id, t.head_checkpoint_id, t.title, t.metadata, t.message_count, t.forked_from,
            t.ttl_seconds, to_char(t.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            to_char(t.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
        INTO t_thread_id, t_user_id, t_head_checkpoint_id, t_title, t_metadata, t_message_count, t_forked_from,
            t_ttl_seconds, t_created_at, t_updated_at
        FROM agent_threads t WHERE t.thread_id = p_thread_id;

        SELECT coalesce(array_agg(p.privilege || ' on ' || w.tbl ORDER BY w.i, p.j), '{}')
        INTO missing_privileges
        FROM unnest(ARRAY['checkpoints', 'checkpoint_blobs', 'checkpoint_writes', 'agent_threads'])
            WITH ORDINALITY AS w(tbl, i)
        CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE']) WITH ORDINALITY AS p(privilege, j)
        WHERE NOT has_table_privilege(w.tbl, p.privilege);

        IF claim_fence IS NOT NULL AND p_read_start THEN
            SELECT c.thread_id, c.checkpoint, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.metadata,
                (SELECT array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
                 FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS v(channel, version)
                 CROSS JOIN LATERAL (
                    SELECT b.channel, b.type, b.blob FROM checkpoint_blobs b
                    WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
                      AND b.channel = v.channel AND b.version = v.version
                    OFFSET 0) AS bl),
                (SELECT array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob,
                                        convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
                 FROM checkpoint_writes cw
                 WHERE cw.thread_id = c.thread_id AND cw.checkpoint_ns = c.checkpoint_ns
                   AND cw.checkpoint_id = c.checkpoint_id)
            INTO s_thread_id, s_checkpoint, s_checkpoint_ns, s_checkpoint_id, s_parent_checkpoint_id, s_metadata,
                s_channel_values, s_pending_writes
            FROM checkpoints c
            WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = ''
              AND c.checkpoint_id = COALESCE(p_checkpoint_id, t_head_checkpoint_id);
        END IF;
        RETURN NEXT;
    END $$""",
    # A commit's writes as plpgsql functions, for their cached plans (see "Plans cached without prepared
    # statements"): LangGraph's UPSERT_CHECKPOINT_BLOBS_SQL and UPSERT_CHECKPOINTS_SQL (TurnPostgresSaver
    # calls these with the same parameters) and the thread record's upsert (UPSERT_THREAD_SQL).
    """CREATE OR REPLACE FUNCTION agent_put_blob(
        p_thread_id TEXT, p_checkpoint_ns TEXT, p_channel TEXT, p_version TEXT, p_type TEXT, p_blob BYTEA)
    RETURNS VOID LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
        VALUES (p_thread_id, p_checkpoint_ns, p_channel, p_version, p_type, p_blob)
        ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;
    END $$""",
    """CREATE OR REPLACE FUNCTION agent_put_checkpoint(
        p_thread_id TEXT, p_checkpoint_ns TEXT, p_checkpoint_id TEXT, p_parent_checkpoint_id TEXT,
        p_checkpoint JSONB, p_metadata JSONB)
    RETURNS VOID LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
        VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_checkpoint_id, p_checkpoint, p_metadata)
        ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
        DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
    END $$""",
    """CREATE OR REPLACE FUNCTION agent_upsert_thread(
        p_thread_id TEXT, p_user_id TEXT, p_head_checkpoint_id TEXT, p_message_count INTEGER, p_title TEXT,
        p_metadata JSONB)
    RETURNS VOID LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, title, metadata)
        VALUES (p_thread_id, p_user_id, p_head_checkpoint_id, p_message_count, p_title, p_metadata)
        ON CONFLICT (thread_id) DO UPDATE SET head_checkpoint_id = EXCLUDED.head_checkpoint_id,
            message_count = EXCLUDED.message_count, updated_at = now();
    END $$""",
    # A stored response is returned whole, never queried into, and may hold a NUL character (a model's
    # reply can): json keeps the text as given, jsonb refuses the escape \u0000.
    "ALTER TABLE agent_idempotency ALTER COLUMN response TYPE json",
]

#: Every table setup must leave behind (LangGraph's and the agent's).
TABLES = (
    "checkpoint_migrations", "checkpoints", "checkpoint_blobs", "checkpoint_writes",
    "agent_migrations", "agent_threads", "agent_claims", "agent_idempotency",
    "store_migrations", "store",
)  # fmt: skip

# Any constant works; it keeps setup's lock apart from other advisory locks.
SETUP_LOCK_KEY = 7_140_213_911

BEGIN_TURN_SQL = "SELECT * FROM agent_begin_turn(%s, %s, %s, %s, %s, %s, %s)"
THREAD_COLUMNS = """thread_id, user_id, head_checkpoint_id, title, metadata, message_count, forked_from, ttl_seconds,
    to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS created_at,
    to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"') AS updated_at"""
SELECT_THREAD_SQL = f"SELECT {THREAD_COLUMNS} FROM agent_threads WHERE thread_id = %s"
# Checkpoints in the shape of PostgresSaver.SELECT_SQL. The blobs are fetched
# by one primary-key lookup per channel (OFFSET 0 keeps the planner from
# flattening it): on a young table without statistics the planner otherwise
# hashes every blob of the thread, a cost that grows with the thread.
SELECT_CHECKPOINTS_COLUMNS = """
SELECT c.thread_id, c.checkpoint, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.metadata,
    (SELECT array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
     FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS v(channel, version)
     CROSS JOIN LATERAL (
        SELECT b.channel, b.type, b.blob FROM checkpoint_blobs b
        WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
          AND b.channel = v.channel AND b.version = v.version
        OFFSET 0) AS bl
    ) AS channel_values,
    (SELECT array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob,
                            convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
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
UPSERT_THREAD_SQL = "SELECT agent_upsert_thread(%s, %s, %s, %s, %s, %s)"
CHECKPOINT_IN_THREAD_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s"
LIST_CHECKPOINTS_SQL = """
SELECT checkpoint_id, parent_checkpoint_id, metadata FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = '' AND (%s::text IS NULL OR checkpoint_id < %s)
ORDER BY checkpoint_id DESC LIMIT %s
"""
# A summary field of a checkpoint's metadata in either layout (`summaries`: under SUMMARY_KEY by its short
# name, or flat in checkpoints written before); `{path}` is a jsonb path of text.
SUMMARY_FIELD = (
    "(CASE WHEN jsonb_typeof(metadata -> '{key}') = 'object' THEN metadata #> '{{{key},{short}}}' "
    "ELSE metadata #> '{{{long}}}' END)"
)


def summary_field(name: str, *, index: int | None = None) -> str:
    """SQL for one summary field (jsonb); `index` picks input (0) or output (1) tokens of a usage field."""
    short, long = summaries.SHORT_NAMES[name], name
    if index is not None:  # packed usages are [input, output]; flat ones {"input_tokens", "output_tokens"}
        short, long = f"{short},{index}", f"{long},{('input_tokens', 'output_tokens')[index]}"
    return SUMMARY_FIELD.format(key=summaries.SUMMARY_KEY, short=short, long=long)


# The thread's tree from the metadata summaries, without reading messages or whole metadata documents.
CHECKPOINT_LINKS_SQL = f"""
SELECT checkpoint_id, parent_checkpoint_id, COALESCE(({summary_field("message_count")} #>> '{{}}')::int, 0) AS message_count,
    ({summary_field("kept_messages")} #>> '{{}}')::int AS kept_messages
FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''
"""
SET_HEAD_SQL = """
UPDATE agent_threads SET head_checkpoint_id = %s, message_count = %s, updated_at = now() WHERE thread_id = %s
"""
INSERT_THREAD_SQL = """
INSERT INTO agent_threads (thread_id, user_id, head_checkpoint_id, message_count, title, metadata, forked_from)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
# Every checkpoint's stored `messages` value: the blob its channel version points at. A LEFT JOIN: a
# checkpoint with no messages yet (the input checkpoint of a plain MessagesState graph) is a base too.
SELECT_THREAD_MESSAGES_SQL = """
SELECT c.checkpoint_id, b.type, b.blob FROM checkpoints c
LEFT JOIN checkpoint_blobs b ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
  AND b.channel = 'messages' AND b.version = c.checkpoint -> 'channel_versions' ->> 'messages'
WHERE c.thread_id = %s AND c.checkpoint_ns = %s
"""
SELECT_USER_THREADS_SQL = "SELECT thread_id FROM agent_threads WHERE user_id = %s ORDER BY thread_id"
THREADS_WITH_CHECKPOINTS_SQL = "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_id = ANY(%s) ORDER BY thread_id"
THREAD_OF_CHECKPOINT_SQL = "SELECT thread_id FROM checkpoints WHERE checkpoint_id = %s AND checkpoint_ns = '' LIMIT 1"
# The catalogue (`operations.catalogue`): one range scan of agent_threads_activity_idx per page. The
# position is the row's (updated_at, thread_id); `activity` is updated_at as exact text (microseconds).
# Qualified columns: a bare `updated_at` in ORDER BY would name the output column (text), not the index's.
LIST_THREADS_SQL = f"""
SELECT {THREAD_COLUMNS} FROM agent_threads t
WHERE {{owner}} AND t.metadata @> %(metadata)s {{after}}
ORDER BY t.updated_at DESC, t.thread_id DESC LIMIT %(limit)s
"""
LIST_THREADS_AFTER = "AND (t.updated_at, t.thread_id) < (%(activity)s::timestamptz, %(thread_id)s)"
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
]
# -- retention (`operations.retention`) --
# A thread's expiry: its own ttl_seconds, else the agent's thread_ttl_seconds (NULL: never).
EXPIRED_CONDITION = """COALESCE(t.ttl_seconds, %(ttl)s::float8) IS NOT NULL
    AND t.updated_at + make_interval(secs => COALESCE(t.ttl_seconds, %(ttl)s::float8))
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
# keep_latest: the head's `messages` blob rewritten whole, everything else of the thread deleted.
REWRITE_BLOB_SQL = """
UPDATE checkpoint_blobs SET type = %s, blob = %s
WHERE thread_id = %s AND checkpoint_ns = '' AND channel = 'messages' AND version = %s
"""
# -- the saver's thread operations (`saver.TurnSaverMixin`: prune, copy_thread, delete_for_runs) --
REWRITE_NS_BLOB_SQL = """
UPDATE checkpoint_blobs SET type = %s, blob = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND channel = 'messages' AND version = %s
"""
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
COPY_THREAD_SQL = [
    """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
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
UPDATE checkpoints SET parent_checkpoint_id = NULL, metadata = CASE
    WHEN jsonb_typeof(metadata -> '{summaries.SUMMARY_KEY}') = 'object'
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

#: Errors after which the server rolled the transaction back and running it again is safe.
ROLLED_BACK = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)

#: SQLSTATE raised by `agent_end_claim` when the claim is gone.
CLAIM_LOST_SQLSTATE = "TT001"

# Set for the duration of one write transaction, so the saver's queries run in
# it (its batch of statements) instead of on a pooled connection.
_TX_BATCH: ContextVar[StatementBatch | None] = ContextVar("tt_tx_batch", default=None)


def transaction_connection() -> psycopg.Connection | None:
    """The connection of the write transaction running on this thread (a commit, `transaction`), if any,
    with the statements batched so far sent (see `postgres_batch`)."""
    batch = _TX_BATCH.get()
    return batch.connection() if batch is not None else None


class TurnPostgresSaver(TurnSaverMixin, PostgresSaver):
    """`PostgresSaver` with turn buffering, message deltas, summaries and no instance lock."""

    # LangGraph's statements, as calls of the functions that run them with cached plans (MIGRATIONS).
    # The version as text: LangGraph's versions may be int or float (`langgraph.checkpoint.base.V`), which
    # psycopg sends as numbers, and a function call has no implicit cast to TEXT (LangGraph's INSERT has).
    UPSERT_CHECKPOINT_BLOBS_SQL = "SELECT agent_put_blob(%s, %s, %s, %s::text, %s, %s)"
    UPSERT_CHECKPOINTS_SQL = "SELECT agent_put_checkpoint(%s, %s, %s, %s, %s, %s)"

    def __init__(self, storage: PostgresThreadStorage, *, message_cache_size: int) -> None:
        PostgresSaver.__init__(self, storage.pool)
        self._storage = storage
        self._init_turns(message_cache_size)

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Any]:
        batch = _TX_BATCH.get()
        if batch is not None and pipeline:
            # LangGraph asks for a pipeline exactly where it only writes (put, put_writes): those
            # statements join the write transaction's batch, sent with its commit.
            yield batch
            return
        if batch is None:
            # Used directly as a LangGraph checkpointer, the saver may be the first to touch the database.
            self._storage.setup()
        # langgraph#7259: the base class holds `self.lock` here even with a
        # pool; a pooled (or the transaction's) connection is not shared, so no lock.
        with nullcontext(batch.connection()) if batch is not None else self._storage.connection() as conn:
            with conn.pipeline() if pipeline else nullcontext(), conn.cursor(binary=True, row_factory=dict_row) as cur:
                yield cur

    @contextmanager
    def in_transaction(self, batch: StatementBatch) -> Iterator[None]:
        """Run the saver's queries in this block in `batch`'s transaction (not on pooled connections)."""
        token = _TX_BATCH.set(batch)
        try:
            yield
        finally:
            _TX_BATCH.reset(token)

    def _backend_get_tuple(self, config):
        return PostgresSaver.get_tuple(self, config)

    def _load_checkpoint_tuple(self, value):
        # With the checkpoint's messages cached, its stored messages value would be decoded only for
        # `_resolve_tuple` to replace it by the cached list: it is left out instead.
        cached = self.message_cache.get_list(value["checkpoint_id"]) if value["channel_values"] else None
        if cached is not None:
            others = [blob for blob in value["channel_values"] if bytes(blob[0]) != b"messages"]
            if len(others) < len(value["channel_values"]):
                tup = PostgresSaver._load_checkpoint_tuple(self, {**value, "channel_values": others})
                values = {**tup.checkpoint["channel_values"], "messages": cached}
                return tup._replace(checkpoint={**tup.checkpoint, "channel_values": values})
        return self._resolve_tuple(PostgresSaver._load_checkpoint_tuple(self, value))

    def load_row(self, row: Mapping[str, Any]):
        """A CheckpointTuple (messages resolved, metadata as the agent reads it) from a row of `SELECT_CHECKPOINT_SQL`."""
        return self.agent_tuple(self._load_checkpoint_tuple(row))

    def _backend_put(self, config, checkpoint, metadata, new_versions):
        return PostgresSaver.put(self, config, checkpoint, metadata, new_versions)

    def _backend_put_writes(self, config, writes, task_id, task_path):
        return PostgresSaver.put_writes(self, config, writes, task_id, task_path)

    def _fetch_thread_messages(self, thread_id: str, checkpoint_ns: str) -> Mapping[str, Any]:
        with self._cursor() as cur:
            cur.execute(SELECT_THREAD_MESSAGES_SQL, (thread_id, checkpoint_ns))
            rows = cur.fetchall()
        decoded: dict[tuple, Any] = {}
        stored = {}
        for row in rows:
            key = (row["type"], bytes(row["blob"]) if row["blob"] is not None else None)
            if key not in decoded:
                # No blob (the LEFT JOIN found none) or LangGraph's "empty" one: no messages.
                decoded[key] = None if row["type"] in (None, "empty") else self.serde.loads_typed(key)
            stored[row["checkpoint_id"]] = decoded[key]
        return stored

    def _dump_messages_whole(self, messages) -> tuple[str, bytes]:
        return self.serde.dumps_typed(deltas.encode(list(messages), None, ()))


class PostgresTx(Tx):
    """The statements of one write transaction: writes join its batch, reads send the batch first."""

    def __init__(self, batch: StatementBatch, saver: TurnPostgresSaver) -> None:
        self.batch = batch
        self.saver = saver

    def write_turn(self, turn: Turn) -> None:
        self.saver.write_turn(turn)

    def upsert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title=None, metadata=None) -> None:
        self.batch.execute(
            UPSERT_THREAD_SQL, (thread_id, user_id, head_checkpoint_id, message_count, title, Jsonb(dict(metadata or {})))
        )

    def update_thread(self, thread_id, *, user_id, title, metadata, ttl_seconds) -> ThreadRecord | None:
        params = {
            "thread_id": thread_id,
            "user_id": user_id,
            "title": title,
            "metadata": Jsonb(dict(metadata)) if metadata is not None else None,
            "ttl_seconds": ttl_seconds,
        }
        return _record(self.batch.read(UPDATE_THREAD_SQL, params).fetchone())

    def delete_thread(self, thread_id: str) -> None:
        for statement in DELETE_THREAD_SQL:
            self.batch.execute(statement, (thread_id,))
        self.batch.execute(DELETE_RELEASED_CLAIM_SQL, (thread_id,))

    def store_response(self, user_key, key, *, request_hash, thread_id, response, ttl_seconds) -> None:
        self.batch.execute(DELETE_EXPIRED_KEY_SQL, (user_key, key))
        self.batch.execute(STORE_RESPONSE_SQL, (user_key, key, request_hash, thread_id, Json(response), ttl_seconds))

    def set_head(self, thread_id: str, head_checkpoint_id: str, *, message_count: int) -> None:
        self.batch.execute(SET_HEAD_SQL, (head_checkpoint_id, message_count, thread_id))

    def insert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title, metadata, forked_from):
        forked = Jsonb(dict(forked_from)) if forked_from is not None else None
        self.batch.execute(
            INSERT_THREAD_SQL,
            (thread_id, user_id, head_checkpoint_id, message_count, title, Jsonb(dict(metadata)), forked),
        )


    def is_expired(self, thread_id: str, *, default_ttl: float | None, now: datetime | None) -> bool:
        params = {"thread_id": thread_id, "ttl": default_ttl, "now": now}
        return self.batch.read(IS_EXPIRED_SQL, params).fetchone() is not None

    def keep_only_head(self, thread_id: str, head) -> int:
        head_id = head.config["configurable"]["checkpoint_id"]
        messages = head.checkpoint["channel_values"].get("messages")
        version = head.checkpoint["channel_versions"].get("messages")
        if messages is not None and version is not None:
            # Whole: its base checkpoints are about to go (see `deltas`).
            blob = self.saver.serde.dumps_typed(deltas.encode(list(messages), None, ()))
            self.batch.execute(REWRITE_BLOB_SQL, (*blob, thread_id, str(version)))
        params = {"thread_id": thread_id, "head": head_id}
        self.batch.execute(DELETE_OTHER_WRITES_SQL, params)
        self.batch.execute(DELETE_OTHER_BLOBS_SQL, params)
        removed = self.batch.read(DELETE_OTHER_CHECKPOINTS_SQL, params).fetchone()["removed"]
        self.batch.execute(MAKE_ROOT_SQL, params)
        return int(removed)

    def thread_record(self, thread_id: str) -> ThreadRecord | None:
        return _record(self.batch.read(SELECT_THREAD_SQL, (thread_id,)).fetchone())

    def thread_has_rows(self, thread_id: str) -> bool:
        return self.batch.read(THREAD_HAS_ROWS_SQL, (thread_id,)).fetchone() is not None

    def busy_threads(self, thread_ids: Sequence[str]) -> list[str]:
        return [row["thread_id"] for row in self.batch.read(BUSY_THREADS_SQL, (list(thread_ids),)).fetchall()]

    def threads_of_runs(self, run_ids: Sequence[str]) -> list[str]:
        return [row["thread_id"] for row in self.batch.read(THREADS_OF_RUNS_SQL, (list(run_ids),)).fetchall()]

    def copy_thread_rows(self, source_thread_id: str, target_thread_id: str) -> None:
        for statement in COPY_THREAD_SQL:
            self.batch.execute(statement, {"source": source_thread_id, "target": target_thread_id})

    def rewrite_checkpoint(self, thread_id, tup, *, parent_id, metadata) -> None:
        configurable = tup.config["configurable"]
        ns, checkpoint_id = configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"]
        messages = tup.checkpoint["channel_values"].get("messages")
        version = tup.checkpoint["channel_versions"].get("messages")
        if deltas.is_message_list(messages) and version is not None:
            blob = self.saver._dump_messages_whole(messages)
            self.batch.execute(REWRITE_NS_BLOB_SQL, (*blob, thread_id, ns, str(version)))
        self.batch.execute(REPARENT_SQL, (parent_id, Jsonb(dict(metadata)), thread_id, ns, checkpoint_id))

    def delete_checkpoints(self, thread_id: str, *, keep: Sequence[tuple[str, str]]) -> None:
        params = {"thread_id": thread_id, "ns": [ns for ns, _ in keep], "ids": [cid for _, cid in keep]}
        for statement in DELETE_UNKEPT_SQL:
            self.batch.execute(statement, params)


class CachedCredential:
    """Calls `provider` for a password at most once per `lifetime` seconds. Thread-safe."""

    def __init__(self, provider: Callable[[], str], lifetime: float) -> None:
        self._provider = provider
        self._lifetime = lifetime
        self._lock = threading.Lock()
        self._value: str | None = None
        self._expires = 0.0

    def __call__(self) -> str:
        with self._lock:
            if self._value is None or time.monotonic() >= self._expires:
                self._value = self._provider()
                self._expires = time.monotonic() + self._lifetime
            return self._value


class PostgresThreadStorage(ThreadStorage):
    """Postgres storage for one agent. Connects on first use; `setup()` runs then.

    `conninfo` is a `postgresql://` URL or a libpq `key=value` string.
    """

    def __init__(self, conninfo: str, settings: AgentSettings) -> None:
        super().__init__(settings)
        self.conninfo = conninfo
        self.masked = mask_url(conninfo)
        # libpq reads connect_timeout in whole seconds, and treats values under 2 as 2. Python text is
        # Unicode: a database or role whose default client_encoding is another one (LATIN1) made psycopg
        # fail on text it had just written, or could not write.
        base_kwargs = {
            "autocommit": True,
            "client_encoding": "UTF8",
            "prepare_threshold": settings.prepare_threshold,
            "row_factory": dict_row,
            "connect_timeout": max(2, math.ceil(settings.connect_timeout)),
        }
        kwargs: Any = base_kwargs
        if settings.credential_provider is not None:
            credential = CachedCredential(settings.credential_provider, settings.credential_cache_seconds)
            kwargs = lambda: {**base_kwargs, "password": credential()}  # noqa: E731 - psycopg_pool calls it per connection
        self._kwargs = kwargs
        self.pool = ConnectionPool(
            conninfo,
            kwargs=kwargs,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=settings.pool_timeout,
            max_lifetime=settings.pool_max_lifetime,
            open=False,
            name="timetravel-agent",
        )
        self.saver = TurnPostgresSaver(self, message_cache_size=settings.message_cache_size)
        self._setup_lock = threading.Lock()
        self._ready = False
        # Set when a connection failed: the next checkout first checks the server answers at all.
        self._suspect_down = False
        self._connect_error: str | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:  # every claim calls this; only the first does the work
            return
        with self._setup_lock:
            if self._ready:
                return
            with self._errors("set up the database"):
                if not self._reachable():
                    raise StorageUnavailable(f"{self._unreachable()}; nothing was written.")
                self.pool.open(wait=False)
                with self.connection() as conn:
                    if self._missing_tables(conn) or not self._migrations_current(conn):
                        try:
                            self._migrate(conn)
                        except ROLLED_BACK:  # chosen as a deadlock's victim by turns running meanwhile
                            self._migrate(conn)
                        missing = self._missing_tables(conn)
                        if missing:
                            raise StorageUnavailable(f"Could not create the tables {missing} in {self.masked}.")
            self._ready = True

    @staticmethod
    def _migrations_current(conn: psycopg.Connection) -> bool:
        """Whether every migration table (they exist) records every migration this code has."""
        row = conn.execute(
            "SELECT (SELECT max(v) FROM checkpoint_migrations) AS langgraph, (SELECT max(v) FROM agent_migrations) AS agent,"
            " (SELECT max(v) FROM store_migrations) AS store"
        ).fetchone()
        return all(
            row[name] is not None and row[name] >= len(migrations) - 1
            for name, migrations in (("langgraph", LANGGRAPH_MIGRATIONS), ("agent", MIGRATIONS), ("store", STORE_MIGRATIONS))
        )

    def _migrate(self, conn: psycopg.Connection) -> None:
        """Apply LangGraph's (checkpointer, store) and the agent's missing migrations in one transaction; all if a table is missing."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK_KEY,))
            # Decided under the lock: another process may have just created everything, and
            # needless DDL (ALTER TABLE takes an exclusive lock) would contend with its turns.
            missing = self._missing_tables(conn)
            everything = bool(missing) and "agent_migrations" not in missing
            if everything:
                logger.warning("Tables %s were missing from %s; re-creating them", missing, self.masked)
            for table, migrations in (
                ("checkpoint_migrations", LANGGRAPH_MIGRATIONS),
                ("agent_migrations", MIGRATIONS),
                # LangGraph's store (long-term memory, agent.memory): the tables of PostgresStore.setup().
                ("store_migrations", STORE_MIGRATIONS),
            ):
                conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (v INTEGER PRIMARY KEY)")
                row = conn.execute(f"SELECT max(v) AS v FROM {table}").fetchone()
                current = -1 if everything or row["v"] is None else row["v"]
                for version in range(current + 1, len(migrations)):
                    # CONCURRENTLY cannot run inside a transaction (see the module docstring).
                    conn.execute(migrations[version].replace("CONCURRENTLY ", ""))
                    conn.execute(f"INSERT INTO {table} (v) VALUES (%s) ON CONFLICT DO NOTHING", (version,))

    @staticmethod
    def _missing_tables(conn: psycopg.Connection) -> list[str]:
        rows = conn.execute("SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NULL", (list(TABLES),))
        return [row["t"] for row in rows.fetchall()]

    def _close(self) -> None:
        self.pool.close()

    # -- connections -----------------------------------------------------------------------
    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection for one short piece of work (never across a model call)."""
        conn = self._checkout()
        try:
            yield conn
        finally:
            _rollback_quietly(conn)
            self.pool.putconn(conn)

    def _checkout(self) -> psycopg.Connection:
        # An unreachable server must fail within connect_timeout, not after
        # pool_timeout of the pool retrying in the background.
        if self._suspect_down and not self._reachable():
            raise StorageUnavailable(f"{self._unreachable()}; nothing was written; the request can be retried.")
        wait = min(self.settings.connect_timeout, self.settings.pool_timeout)
        try:
            return self.pool.getconn(timeout=wait)
        except PoolTimeout:
            if not self._reachable():
                raise StorageUnavailable(f"{self._unreachable()}; nothing was written; the request can be retried.") from None
        return self.pool.getconn(timeout=max(0.1, self.settings.pool_timeout - wait))

    def _checkout_live(self) -> psycopg.Connection:
        """A pooled connection the server has not already ended (see "Faults"); dead ones are discarded.

        Raises:
            StorageUnavailable: no connection could be had (as `_checkout`).
        """
        for _ in range(self.settings.pool_max_size + 1):
            conn = self._checkout()
            if not _ended_by_server(conn):
                return conn
            conn.close()
            self.pool.putconn(conn)  # the pool drops it and opens another
            self.pool.check()  # and the other idle connections the same fault ended
            self._suspect_down = True  # the next checkout first checks that the server answers at all
        return self._checkout()

    def _reachable(self) -> bool:
        """Whether a new connection can be opened now (one attempt, bounded by connect_timeout)."""
        kwargs = self._kwargs() if callable(self._kwargs) else self._kwargs
        try:
            psycopg.connect(self.conninfo, **kwargs).close()
        except psycopg.OperationalError as exc:
            self._suspect_down = True
            self._connect_error = _server_reason(exc)
            return False
        self._suspect_down = False
        return True

    def _unreachable(self) -> str:
        """What the last failed connection attempt said, for errors: a missing database or role is not a timeout."""
        reason = self._connect_error or "no connection"
        if "timeout" in reason or reason == "no connection":
            reason += f" (connect_timeout {self.settings.connect_timeout:g} s)"
        return f"Could not connect to {self.masked}: {reason}"

    def ready(self) -> bool:
        """Whether the database answers a query now (for readiness probes). Never raises."""
        try:
            self._run("check the database", lambda conn: conn.execute("SELECT 1").fetchone())
        except AgentError:
            return False
        return True

    def _run(self, action: str, work: Callable[[psycopg.Connection], Any], thread_id: str | None = None) -> Any:
        """`work(conn)` on a pooled connection; run once more if the first was found dead (on a fresh
        one), or if a table was missing (after re-creating it).

        Only for work that is safe to repeat (reads, claims with their token).
        """
        self.setup()
        with self._errors(action, thread_id):
            for attempt in (1, 2):
                repair = False
                with self.connection() as conn:
                    try:
                        return work(conn)
                    except ROLLED_BACK:
                        # A deadlock or serialization failure (with a concurrent setup's DDL): rolled back, retry.
                        if attempt == 2:
                            raise
                    except psycopg.OperationalError:
                        if attempt == 2 or not conn.closed:
                            raise
                        # The server restarted or ended the session: drop every dead idle connection.
                        self._suspect_down = True
                        self.pool.check()
                    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction) as exc:
                        if attempt == 2:
                            raise
                        logger.warning("%s at %s; re-creating the agent's tables", _first_line(exc), self.masked)
                        repair = True
                if repair:
                    self._ready = False
                    self.setup()
        raise AssertionError("unreachable")

    # -- the turn protocol -----------------------------------------------------------------
    def _try_claim(self, thread_id, token, *, user_id, checkpoint_id, idempotency_key, read_start=True):
        def attempt(conn: psycopg.Connection):
            row = conn.cursor(binary=True).execute(BEGIN_TURN_SQL, (
                thread_id, token, user_id, self.settings.lease_seconds, idempotency_key, checkpoint_id, read_start,
            )).fetchone()  # fmt: skip
            record_row = _prefixed(row, "t_")
            if row["claim_fence"] is not None and row["missing_privileges"]:
                # Given up as `_release` would: a new thread's claim leaves no row behind.
                conn.execute(DROP_CLAIM_SQL if record_row is None else RELEASE_CLAIM_SQL, (thread_id, token))
                raise StorageUnavailable(
                    f"The database role may not write the conversation ({', '.join(row['missing_privileges'])}) "
                    f"at {self.masked}; nothing was written and the model was not called."
                )
            return row["claim_fence"], record_row, _prefixed(row, "s_")

        fence, record_row, start_row = self._run("claim the thread", attempt, thread_id)
        record = _record(record_row)
        if fence is None:
            return None, record
        with self._errors("read the thread", thread_id):
            start = self.saver.load_row(start_row) if start_row else None
        claim = Claim(
            thread_id=thread_id,
            user_id=user_id,
            token=token,
            fence=fence,
            record=record,
            start=start,
            idempotency_key=idempotency_key,
        )
        return claim, record

    def _commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None:
        thread_id = claim.thread_id
        self.setup()
        for attempt in (1, 2):
            with self._errors("commit the turn", thread_id):
                conn = self._checkout_live()
            try:
                batch = StatementBatch(conn)
                batch.execute(END_CLAIM_SQL, (thread_id, claim.token))
                with self.saver.in_transaction(batch):
                    apply(PostgresTx(batch, self.saver))
                batch.commit()
                return
            except psycopg.Error as exc:
                if exc.sqlstate == CLAIM_LOST_SQLSTATE:
                    raise LeaseExpired(
                        f"The turn's claim on thread {thread_id!r} expired and another turn took the thread; "
                        "nothing was written.",
                        thread_id=thread_id,
                    ) from None
                if isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.constraint_name == IDEMPOTENCY_PKEY:
                    raise IdempotencyKeyTaken(thread_id) from None
                if not isinstance(exc, psycopg.OperationalError):
                    with self._errors("commit the turn", thread_id):
                        raise
                self._suspect_down = True
                landed = self._commit_landed(claim)
                if landed:
                    return
                if landed is False and attempt == 1:
                    self.pool.check()
                    continue  # nothing was written and the claim is still ours: commit again
                outcome = (
                    "nothing was written; the request can be retried"
                    if landed is False
                    else "the database could not be asked whether the turn was saved; "
                    "list the thread's history before retrying"
                )
                raise StorageUnavailable(
                    f"Lost the connection to {self.masked} while committing: {_first_line(exc)}; {outcome}.",
                    thread_id=thread_id,
                ) from None
            finally:
                _rollback_quietly(conn)
                self.pool.putconn(conn)

    def _commit_landed(self, claim: Claim) -> bool | None:
        """After a commit's connection failed: True if it committed, False if not, None if that cannot be known.

        Asks on a new connection of its own: the pool's idle connections may be as dead as the one that failed.
        """
        kwargs = self._kwargs() if callable(self._kwargs) else self._kwargs
        try:
            with psycopg.connect(self.conninfo, **kwargs) as conn:
                row = conn.execute(CLAIM_STATE_SQL, (claim.thread_id,)).fetchone()
        except psycopg.Error:
            return None
        if row is None:
            return None
        if row["token"] == claim.token:
            return False  # still claimed by this turn: the commit did not happen
        if row["token"] == "" and row["fence"] == claim.fence:
            return True  # released by this turn's commit, and nobody claimed it since
        return None

    def _release(self, claim: Claim) -> None:
        statement = DROP_CLAIM_SQL if claim.record is None else RELEASE_CLAIM_SQL
        self._run("release the thread", lambda conn: conn.execute(statement, (claim.thread_id, claim.token)))

    def _request_cancel(self, thread_id: str, mode: str) -> None:
        self._run("ask the running turn to stop", lambda conn: conn.execute(REQUEST_CANCEL_SQL, (mode, thread_id)))

    def renew(self, claims: Sequence[Claim]) -> dict[str, str | None]:
        params = (self.settings.lease_seconds, [c.thread_id for c in claims], [c.token for c in claims])
        rows = self._run("renew claims", lambda conn: conn.execute(RENEW_CLAIMS_SQL, params).fetchall())
        return {row["thread_id"]: row["cancel"] for row in rows}

    def poll_cancels(self, claims: Sequence[Claim]) -> dict[str, str]:
        params = ([c.thread_id for c in claims], [c.token for c in claims])
        rows = self._run("poll cancel requests", lambda conn: conn.execute(POLL_CANCELS_SQL, params).fetchall())
        return {row["thread_id"]: row["cancel"] for row in rows}

    def find_idempotent(self, user_key: str, key: str, claim_key: str) -> IdempotencyState:
        def read(conn: psycopg.Connection):
            with conn.pipeline():
                stored = conn.execute(FIND_IDEMPOTENCY_SQL, (user_key, key))
                running = conn.execute(RUNNING_WITH_KEY_SQL, (claim_key,))
            return stored.fetchone(), running.fetchone()

        stored, running = self._run("look up the idempotency key", read)
        return IdempotencyState(
            request_hash=stored["request_hash"] if stored else None,
            thread_id=stored["thread_id"] if stored else None,
            response=stored["response"] if stored else None,
            running_thread_id=running["thread_id"] if running else None,
        )

    def sweep_idempotency(self) -> int:
        return self._run("delete expired idempotency keys", lambda conn: conn.execute(SWEEP_IDEMPOTENCY_SQL).rowcount)

    def expired_threads(self, *, default_ttl, now, limit, after=None, trimmable_only=False) -> list[ExpiredThread]:
        after_ts, after_id = after if after is not None else (None, None)
        params = {
            "ttl": default_ttl,
            "now": now,
            "after_ts": after_ts,
            "after_id": after_id,
            "trimmable": trimmable_only,
            "limit": limit,
        }
        rows = self._read(None, EXPIRED_THREADS_SQL, params)
        return [ExpiredThread(row["thread_id"], row["user_id"], (row["updated_at"], row["thread_id"])) for row in rows]

    def transaction(self, apply: Callable[[Tx], Any]) -> Any:
        self.setup()
        with self._errors("write to the database"), self.connection() as conn:
            batch = StatementBatch(conn)
            with self.saver.in_transaction(batch):
                result = apply(PostgresTx(batch, self.saver))
            batch.commit()
            return result

    # -- reads -------------------------------------------------------------------------------
    def _read(self, thread_id: str | None, query: str, params: tuple) -> list[dict]:
        return self._run("read from the database", lambda conn: conn.execute(query, params).fetchall(), thread_id)

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        rows = self._read(thread_id, SELECT_THREAD_SQL, (thread_id,))
        return _record(rows[0]) if rows else None

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        return bool(self._read(thread_id, CHECKPOINT_IN_THREAD_SQL, (thread_id, checkpoint_id)))

    def get_checkpoint(self, thread_id: str, checkpoint_id: str):
        def read(conn: psycopg.Connection):
            return conn.cursor(binary=True).execute(SELECT_CHECKPOINT_SQL, (thread_id, checkpoint_id, thread_id)).fetchone()

        row = self._run("read a checkpoint", read, thread_id)
        with self._errors("read a checkpoint", thread_id):
            return self.saver.load_row(row) if row else None

    def get_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]):
        def read(conn: psycopg.Connection):
            return conn.cursor(binary=True).execute(SELECT_SOME_CHECKPOINTS_SQL, (thread_id, list(checkpoint_ids))).fetchall()

        rows = self._run("read checkpoints", read, thread_id)
        with self._errors("read checkpoints", thread_id):
            # Oldest first: each resolved message list is cached before its children need it.
            return [self.saver.load_row(row) for row in sorted(rows, key=lambda row: row["checkpoint_id"])]

    def list_checkpoints(self, thread_id: str, *, limit: int | None, before: str | None) -> list[dict]:
        rows = self._read(thread_id, LIST_CHECKPOINTS_SQL, (thread_id, before, before, limit))  # LIMIT NULL: all
        return [{**row, "metadata": summaries.agent_view(row["metadata"])} for row in rows]

    def checkpoint_links(self, thread_id: str) -> list[CheckpointLink]:
        return [CheckpointLink(**row) for row in self._read(thread_id, CHECKPOINT_LINKS_SQL, (thread_id,))]

    def threads_of_user(self, user_id: str) -> list[str]:
        return [row["thread_id"] for row in self._read(None, SELECT_USER_THREADS_SQL, (user_id,))]

    def threads_with_checkpoints(self, checkpoint_ids: Sequence[str]) -> list[str]:
        return [row["thread_id"] for row in self._read(None, THREADS_WITH_CHECKPOINTS_SQL, (list(checkpoint_ids),))]
    def thread_of_checkpoint(self, checkpoint_id: str) -> str | None:
        rows = self._read(None, THREAD_OF_CHECKPOINT_SQL, (checkpoint_id,))
        return rows[0]["thread_id"] if rows else None

    def list_threads(self, user_id, *, limit, before, metadata):
        params = {"user_id": user_id, "metadata": Jsonb(dict(metadata)), "limit": limit}
        if before is not None:
            params["activity"], params["thread_id"] = before
            try:
                datetime.fromisoformat(params["activity"])
            except ValueError:
                raise InvalidRequest(f"before is not a cursor of this store: {params['activity'][:40]!r}") from None
        rows = self._read(None, LIST_THREADS_SQLS[user_id is None, before is not None], params)
        # updated_at is already the exact text of the stored timestamp (THREAD_COLUMNS).
        return [(_record(row), (row["updated_at"], row["thread_id"])) for row in rows]

    def thread_position(self, thread_id: str) -> tuple[str, str] | None:
        rows = self._read(thread_id, THREAD_POSITION_SQL, (thread_id,))
        return (rows[0]["activity"], rows[0]["thread_id"]) if rows else None

    def exists(self) -> bool:
        if self._ready:
            return True
        with self._errors("check the database"):
            if not self._reachable():
                raise StorageUnavailable(f"{self._unreachable()}.")
            self.pool.open(wait=False)  # does nothing if it is open
            with self.connection() as conn:
                return not self._missing_tables(conn)

    def token_usage(self, thread_id: str, checkpoint_id: str) -> tuple[dict[str, int], dict[str, int] | None] | None:
        [row] = self._read(thread_id, TOKEN_USAGE_SQL, (checkpoint_id, checkpoint_id, thread_id))
        if not row["found"]:
            return None
        thread = {"input_tokens": int(row["input_tokens"]), "output_tokens": int(row["output_tokens"])}
        return thread, summaries.unpack(row["metadata"]).get("branch_usage")

    # -- errors --------------------------------------------------------------------------------
    @contextmanager
    def _errors(self, action: str, thread_id: str | None = None) -> Iterator[None]:
        try:
            yield
        except PoolTimeout:
            raise StorageUnavailable(
                f"Could not {action}: no free connection to {self.masked} within {self.settings.pool_timeout} s; "
                "nothing was written.",
                thread_id=thread_id,
            ) from None
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction) as exc:
            reason = "the database is read-only" if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction) else (
                "the database role lacks a privilege"
            )
            raise StorageUnavailable(
                f"Could not {action} at {self.masked}: {reason} ({_first_line(exc)}); nothing was written.",
                thread_id=thread_id,
            ) from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction) as exc:
            self._ready = False  # the next request runs setup, which re-creates what is missing
            raise StorageUnavailable(
                f"Could not {action} at {self.masked}: {_first_line(exc)}; nothing was written; "
                "the agent re-creates missing tables on the next request.",
                thread_id=thread_id,
            ) from None
        except psycopg.OperationalError as exc:
            raise StorageUnavailable(
                f"Could not {action} at {self.masked}: {_first_line(exc)}; nothing was written.",
                thread_id=thread_id,
            ) from None


def _record(row: Mapping[str, Any] | None) -> ThreadRecord | None:
    return ThreadRecord(**row) if row else None


def _prefixed(row: Mapping[str, Any], prefix: str) -> dict[str, Any] | None:
    """The columns of `row` named `prefix…`, without the prefix; None when their first one is NULL (no such row)."""
    values = {name[len(prefix):]: value for name, value in row.items() if name.startswith(prefix)}
    return values if next(iter(values.values())) is not None else None


def _ended_by_server(conn: psycopg.Connection) -> bool:
    """Whether the server already ended this idle connection. A live idle connection has nothing to read
    (no LISTEN, no settings reported after use); one the server ended holds its FATAL message or end of file.

    poll(), where there is one: select() cannot watch a descriptor numbered 1024 or more, and a busy server has them.
    """
    if conn.closed:
        return True
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _rollback_quietly(conn: psycopg.Connection) -> None:
    """End an open transaction; a broken connection is left for the pool to discard."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            pass


def _server_reason(exc: BaseException) -> str:
    """The reason in a libpq connection error: the server's FATAL message (`database "x" does not exist`,
    `password authentication failed …`) when there is one, else the end of its first line (`Connection refused`)."""
    text = str(exc).strip()
    if "FATAL:" in text:
        return text.rsplit("FATAL:", 1)[1].strip().splitlines()[0]
    first = text.splitlines()[0] if text else ""
    return first.rsplit(": ", 1)[-1].strip() or type(exc).__name__


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

