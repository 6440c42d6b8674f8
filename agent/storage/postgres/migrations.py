"""The agent's Postgres migrations, in order: a migration's position in `MIGRATIONS` is its version.

Read top to bottom, `MIGRATIONS` is the agent's schema; each version is
recorded in `agent_migrations` as LangGraph records its own in
`checkpoint_migrations` and `store_migrations` (`agent.storage.postgres.schema`
applies them). Six of them are
plpgsql functions, for their cached plans (see "Plans cached without prepared
statements" in the package docstring): the claim (`agent_claim_turn`, which
replaced `agent_begin_turn`, with `agent_missing_privileges`), the commit's
fencing check (`agent_end_claim`) and the commit's writes (`agent_put_blob`,
`agent_put_checkpoint`, `agent_upsert_thread`). A function changed later is
created again by a later migration (the earlier text stays, as history), except
`agent_missing_privileges`, whose last text is made from `TABLES`
(`missing_privileges_sql`) and created again whenever setup applies a
migration: a table added later is checked without another copy of the list.

Checkpoint ids. A response id is `resp_<checkpoint_id>`, so a checkpoint id
must name one thread, and two imports racing with the same ids into two new
threads must not both commit. LangGraph's key is (thread_id, checkpoint_ns,
checkpoint_id), and a unique index on all of `checkpoints (checkpoint_id)`
cannot hold the rule: LangGraph's `copy_thread` copies a thread with the same
checkpoint ids (its conformance suite, run on our savers by
tests/storage/test_saver_conformance.py, checks that the copy's ids equal the
source's). The rule was first a table of its own, `agent_checkpoint_ids`,
keyed by the checkpoint id, which `agent_put_checkpoint` wrote for every
root-namespace checkpoint (TT002 when another thread held it). It is now a
partial unique index on the rows that are no copy (`checkpoint_ids`): the copy
marks its rows (`agent_copy`), whose ids keep naming the source, and a put of
another thread's id fails on the index. Namespaced (subgraph) checkpoints are
not covered, since no response id names them. `checkpoint_ids` has the rest:
the lookup, the error, and the migrations.
"""

from __future__ import annotations

import re

from agent.storage import summaries
from agent.storage.postgres import checkpoint_ids, inline_messages

#: Indexes that earn less than their bytes, dropped by a migration (and so never built again by
#: `indexes.build`): LangGraph's `thread_id` indexes on its three tables duplicate the first column of each
#: table's primary key, which serves every `WHERE thread_id = ...` as well (about 160 bytes a turn on a
#: thread of short messages); `agent_threads_user_id_idx` duplicates the first column of
#: `agent_threads_activity_idx`, and every turn's update of `updated_at` wrote an entry into both;
#: `agent_checkpoints_checkpoint_id_idx` gave way to the owner and copies indexes (`checkpoint_ids`).
DROPPED_INDEXES = (
    "checkpoints_thread_id_idx",
    "checkpoint_blobs_thread_id_idx",
    "checkpoint_writes_thread_id_idx",
    "agent_threads_user_id_idx",
    "agent_checkpoints_checkpoint_id_idx",
)

#: The catalogue's index (`sql.LIST_THREADS_SQL`): a user's threads by activity, scanned backward for the
#: newest first. It replaced `agent_threads_activity_idx`, the same columns in descending order (see its migration).
ACTIVITY_INDEX = "agent_threads_activity_asc_idx"

#: The first key of the per-user advisory locks (the second is the user id's hash): a claim takes its
#: user's lock shared, a deletion's user claim exclusively (see `storage.turns`). Any constant works.
USER_LOCK_CLASS = 714_021_392

#: Every table setup must leave behind (LangGraph's and the agent's).
TABLES = (
    "checkpoint_migrations", "checkpoints", "checkpoint_blobs", "checkpoint_writes",
    "agent_migrations", "agent_threads", "agent_claims", "agent_idempotency", "agent_claim_waiters",
    "agent_user_claims", "agent_steers", "store_migrations", "store", "agent_branches", "agent_runs",
    "agent_run_events",
)  # fmt: skip

#: Tables only setup writes (each schema's record of its applied migrations); the agent writes every
#: other table of `TABLES`, each under a claim (turns, deletions, branch operations).
SETUP_ONLY_TABLES = ("checkpoint_migrations", "agent_migrations", "store_migrations")

#: The privileges the agent's writes need on each table it writes.
TURN_PRIVILEGES = ("INSERT", "UPDATE")


def missing_privileges_sql() -> str:
    """`agent_missing_privileges()`, which the claim calls before the model runs: `TURN_PRIVILEGES` on every
    table of `TABLES` but `SETUP_ONLY_TABLES`, so that a table added to `TABLES` is checked without a copy
    of the list to keep (`schema.migrate` creates it again after applying any migration)."""
    checked = [(table, privilege) for table in TABLES if table not in SETUP_ONLY_TABLES for privilege in TURN_PRIVILEGES]
    rows = ", ".join(f"({i}, '{table}', '{privilege}')" for i, (table, privilege) in enumerate(checked, 1))
    return f"""CREATE OR REPLACE FUNCTION agent_missing_privileges() RETURNS TEXT[]
    LANGUAGE plpgsql STABLE AS $$
    BEGIN
        RETURN (SELECT coalesce(array_agg(n.privilege || ' on ' || n.tbl ORDER BY n.i), '{{}}')
                FROM (VALUES {rows}) AS n(i, tbl, privilege)
                WHERE NOT has_table_privilege(n.tbl, n.privilege));
    END $$"""


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
    # (LangGraph's primary key starts with thread_id). CONCURRENTLY (added to this migration's text later,
    # the same index): on an existing table `migrate` leaves it to `indexes.build`.
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_checkpoints_checkpoint_id_idx ON checkpoints (checkpoint_id)",
    # A turn's claim in one statement (see "Plans cached without prepared statements" in the package
    # docstring). It claims the thread unless an unexpired claim holds it or the thread belongs to another user (the rule of
    # `records.owned_by`); re-running it with the same token succeeds, so a claim whose connection died can be
    # retried. It returns the thread's record, the privileges a commit needs that the role lacks, and (only
    # when the claim succeeded and p_read_start) the start: p_checkpoint_id, else the head, in the shape of
    # sql.SELECT_CHECKPOINTS_COLUMNS (the blobs by one primary-key lookup per channel, as there).
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
    # Waiting turns in arrival order, and deleting a user's data while turns may start (see `storage.turns`):
    # a claim records its user, so a deletion finds the turns running for that user (on new threads too).
    "ALTER TABLE agent_claims ADD COLUMN IF NOT EXISTS user_id TEXT",
    "CREATE INDEX IF NOT EXISTS agent_claims_user_id_idx ON agent_claims (user_id) WHERE user_id IS NOT NULL",
    # The turns waiting for a busy thread; the smallest live ticket is served next.
    """CREATE TABLE IF NOT EXISTS agent_claim_waiters (
        thread_id TEXT NOT NULL,
        ticket BIGINT GENERATED ALWAYS AS IDENTITY,
        token TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (thread_id, ticket)
    )""",
    # A deletion's hold on all of one user's data (a lease, like a claim).
    """CREATE TABLE IF NOT EXISTS agent_user_claims (
        user_id TEXT PRIMARY KEY,
        token TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    )""",
    # The claim of `agent_begin_turn` (above, kept for processes of the previous release during a rolling
    # upgrade), plus: the claim row records p_user_id; refused while a user claim other than p_user_claim
    # holds p_user_id (`user_being_deleted`), taken under the user's shared advisory lock (the user claim
    # takes it exclusively: see `storage.turns`); and served in ticket order: refused while a live waiter
    # holds a smaller ticket than p_token's (any, if p_token has none), unless p_token holds the claim
    # already (a retry of a claim whose answer was lost). With p_queue, a refusal because the thread is
    # busy gives p_token a ticket; every attempt renews p_token's ticket, and the claim removes it.
    f"""CREATE OR REPLACE FUNCTION agent_claim_turn(
        p_thread_id TEXT, p_token TEXT, p_user_id TEXT, p_lease DOUBLE PRECISION, p_key TEXT,
        p_checkpoint_id TEXT, p_read_start BOOLEAN, p_queue BOOLEAN, p_user_claim TEXT)
    RETURNS TABLE (
        claim_fence BIGINT, user_being_deleted BOOLEAN, missing_privileges TEXT[],
        t_thread_id TEXT, t_user_id TEXT, t_head_checkpoint_id TEXT, t_title TEXT, t_metadata JSONB,
        t_message_count INTEGER, t_forked_from JSONB, t_ttl_seconds DOUBLE PRECISION, t_created_at TEXT,
        t_updated_at TEXT,
        s_thread_id TEXT, s_checkpoint JSONB, s_checkpoint_ns TEXT, s_checkpoint_id TEXT,
        s_parent_checkpoint_id TEXT, s_metadata JSONB, s_channel_values BYTEA[], s_pending_writes BYTEA[])
    LANGUAGE plpgsql AS $$
    DECLARE v_ticket BIGINT;
    BEGIN
        PERFORM set_config('synchronous_commit', 'off', true);
        user_being_deleted := false;
        IF p_user_id IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock_shared({USER_LOCK_CLASS}, hashtext(p_user_id));
            user_being_deleted := EXISTS (
                SELECT 1 FROM agent_user_claims u WHERE u.user_id = p_user_id
                  AND u.expires_at >= clock_timestamp() AND u.token IS DISTINCT FROM p_user_claim);
        END IF;
        UPDATE agent_claim_waiters SET expires_at = clock_timestamp() + make_interval(secs => p_lease)
        WHERE thread_id = p_thread_id AND token = p_token
        RETURNING ticket INTO v_ticket;

        IF NOT user_being_deleted THEN
            INSERT INTO agent_claims AS c (thread_id, token, fence, expires_at, idempotency_key, cancel, user_id)
            SELECT p_thread_id, p_token, 1, clock_timestamp() + make_interval(secs => p_lease), p_key, NULL, p_user_id
            WHERE NOT EXISTS (
                SELECT 1 FROM agent_threads t WHERE t.thread_id = p_thread_id AND t.user_id IS DISTINCT FROM p_user_id)
              AND (NOT EXISTS (
                    SELECT 1 FROM agent_claim_waiters w
                    WHERE w.thread_id = p_thread_id AND w.expires_at >= clock_timestamp() AND w.token <> p_token
                      AND (v_ticket IS NULL OR w.ticket < v_ticket))
                OR EXISTS (SELECT 1 FROM agent_claims h WHERE h.thread_id = p_thread_id AND h.token = p_token))
            ON CONFLICT (thread_id) DO UPDATE
            SET token = EXCLUDED.token, fence = c.fence + 1, expires_at = EXCLUDED.expires_at,
                idempotency_key = EXCLUDED.idempotency_key, cancel = NULL, user_id = EXCLUDED.user_id
            WHERE c.expires_at < clock_timestamp() OR c.token = EXCLUDED.token
            RETURNING c.fence INTO claim_fence;
        END IF;

        SELECT t.thread_id, t.user_id, t.head_checkpoint_id, t.title, t.metadata, t.message_count, t.forked_from,
            t.ttl_seconds, to_char(t.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            to_char(t.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
        INTO t_thread_id, t_user_id, t_head_checkpoint_id, t_title, t_metadata, t_message_count, t_forked_from,
            t_ttl_seconds, t_created_at, t_updated_at
        FROM agent_threads t WHERE t.thread_id = p_thread_id;

        IF claim_fence IS NOT NULL THEN
            -- Out of the queue; so are waiters of this thread whose process died (their tickets expired).
            DELETE FROM agent_claim_waiters
            WHERE thread_id = p_thread_id AND (token = p_token OR expires_at < clock_timestamp());
        ELSIF p_queue AND v_ticket IS NULL AND NOT user_being_deleted
              AND (t_thread_id IS NULL OR t_user_id IS NOT DISTINCT FROM p_user_id) THEN
            INSERT INTO agent_claim_waiters (thread_id, token, expires_at)
            VALUES (p_thread_id, p_token, clock_timestamp() + make_interval(secs => p_lease));
        END IF;

        missing_privileges := agent_missing_privileges();

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
    # The thread each checkpoint id names, unique by this primary key (see "Checkpoint ids" above).
    """CREATE TABLE IF NOT EXISTS agent_checkpoint_ids (
        checkpoint_id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS agent_checkpoint_ids_thread_idx ON agent_checkpoint_ids (thread_id)",
    # Rows whose checkpoint is gone go (re-applied after a dropped table), then the stored checkpoints are
    # registered; `migrate` first refuses ids that two threads hold (`checkpoint_ids.refuse_duplicates`).
    checkpoint_ids.FORGET_STALE_SQL,
    checkpoint_ids.REGISTER_STORED_SQL,
    # The commit's checkpoint write, now registering a root-namespace checkpoint's id to its thread first. ON
    # CONFLICT waits for a concurrent insert of the same id to commit or roll back; then a row of another
    # thread is TT002 (the id in DETAIL), and the same thread's (LangGraph writing a checkpoint again) is fine.
    """CREATE OR REPLACE FUNCTION agent_put_checkpoint(
        p_thread_id TEXT, p_checkpoint_ns TEXT, p_checkpoint_id TEXT, p_parent_checkpoint_id TEXT,
        p_checkpoint JSONB, p_metadata JSONB)
    RETURNS VOID LANGUAGE plpgsql AS $$
    BEGIN
        IF p_checkpoint_ns = '' THEN
            INSERT INTO agent_checkpoint_ids (checkpoint_id, thread_id) VALUES (p_checkpoint_id, p_thread_id)
            ON CONFLICT (checkpoint_id) DO NOTHING;
            IF NOT FOUND AND NOT EXISTS (
                SELECT 1 FROM agent_checkpoint_ids WHERE checkpoint_id = p_checkpoint_id AND thread_id = p_thread_id)
            THEN
                RAISE EXCEPTION 'checkpoint % belongs to another thread', p_checkpoint_id
                    USING ERRCODE = 'TT002', DETAIL = p_checkpoint_id;
            END IF;
        END IF;
        INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
        VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_checkpoint_id, p_checkpoint, p_metadata)
        ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
        DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
    END $$""",
    # The privileges a commit needs, which the claim checks before the model runs: a function of its own,
    # so that a table added later replaces only this (agent_claim_turn calls it; agent_begin_turn, kept for
    # processes of the previous release during a rolling upgrade, keeps its own older list).
    """CREATE OR REPLACE FUNCTION agent_missing_privileges() RETURNS TEXT[]
    LANGUAGE plpgsql STABLE AS $$
    BEGIN
        RETURN (SELECT coalesce(array_agg(n.privilege || ' on ' || n.tbl ORDER BY n.i), '{}')
                FROM (VALUES (1, 'checkpoints', 'INSERT'), (2, 'checkpoints', 'UPDATE'),
                             (3, 'checkpoint_blobs', 'INSERT'), (4, 'checkpoint_blobs', 'UPDATE'),
                             (5, 'checkpoint_writes', 'INSERT'), (6, 'checkpoint_writes', 'UPDATE'),
                             (7, 'agent_threads', 'INSERT'), (8, 'agent_threads', 'UPDATE'),
                             (9, 'agent_checkpoint_ids', 'INSERT')) AS n(i, tbl, privilege)
                WHERE NOT has_table_privilege(n.tbl, n.privilege));
    END $$""",
    # Branch records (`agent.operations.branch_records`): rows only for checkpoints a user labelled,
    # pinned or archived, so a turn writes none. At most one pinned checkpoint per thread.
    """CREATE TABLE IF NOT EXISTS agent_branches (
        thread_id TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        label TEXT,
        pinned BOOLEAN NOT NULL DEFAULT false,
        archived BOOLEAN NOT NULL DEFAULT false,
        PRIMARY KEY (thread_id, checkpoint_id)
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS agent_branches_pinned_idx ON agent_branches (thread_id) WHERE pinned",
    # The message search index (`agent.storage.search`): one row per checkpoint with the messages that first
    # appeared there; the GIN index is on an expression, so no tsvector is stored beside the text.
    """CREATE TABLE IF NOT EXISTS agent_message_text (
        thread_id TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        message_ids TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_id)
    )""",
    "CREATE INDEX IF NOT EXISTS agent_message_text_search_idx ON agent_message_text USING GIN (to_tsvector('simple', body))",
    # A commit now also writes the search index: the claim checks that privilege too, before the model runs.
    """CREATE OR REPLACE FUNCTION agent_missing_privileges() RETURNS TEXT[]
    LANGUAGE plpgsql STABLE AS $$
    BEGIN
        RETURN (SELECT coalesce(array_agg(n.privilege || ' on ' || n.tbl ORDER BY n.i), '{}')
                FROM (VALUES (1, 'checkpoints', 'INSERT'), (2, 'checkpoints', 'UPDATE'),
                             (3, 'checkpoint_blobs', 'INSERT'), (4, 'checkpoint_blobs', 'UPDATE'),
                             (5, 'checkpoint_writes', 'INSERT'), (6, 'checkpoint_writes', 'UPDATE'),
                             (7, 'agent_threads', 'INSERT'), (8, 'agent_threads', 'UPDATE'),
                             (9, 'agent_checkpoint_ids', 'INSERT'), (10, 'agent_message_text', 'INSERT'),
                             (11, 'agent_message_text', 'UPDATE')) AS n(i, tbl, privilege)
                WHERE NOT has_table_privilege(n.tbl, n.privilege));
    END $$""",
    # Steering (`multitask_strategy="steer"`, see `storage.turns`): messages offered to a running turn (`target`:
    # its claim's token), by a request waiting for the thread (`token`: its own), read in `id` order.
    """CREATE TABLE IF NOT EXISTS agent_steers (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id TEXT NOT NULL,
        token TEXT NOT NULL UNIQUE,
        target TEXT NOT NULL,
        type TEXT NOT NULL,
        payload BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )""",
    "CREATE INDEX IF NOT EXISTS agent_steers_thread_idx ON agent_steers (thread_id, target)",
    # The commit's checkpoint write (as above), storing the checkpoint without what its row or metadata
    # already hold: `id` (the checkpoint_id column), `ts` when the summary holds the same one (its `t`),
    # and LangGraph's empty `channel_values` and `pending_sends`; `saver.expand_checkpoint` puts them back
    # on every read (a row without `id` is a compacted one). About 150 bytes of every checkpoint row.
    f"""CREATE OR REPLACE FUNCTION agent_put_checkpoint(
        p_thread_id TEXT, p_checkpoint_ns TEXT, p_checkpoint_id TEXT, p_parent_checkpoint_id TEXT,
        p_checkpoint JSONB, p_metadata JSONB)
    RETURNS VOID LANGUAGE plpgsql AS $$
    DECLARE v_checkpoint JSONB := p_checkpoint - 'id';
    BEGIN
        IF p_checkpoint ->> 'id' IS DISTINCT FROM p_checkpoint_id THEN
            v_checkpoint := p_checkpoint;  -- kept whole: the row could not give its id back
        ELSE
            IF p_checkpoint -> 'ts' = p_metadata -> '{summaries.SUMMARY_KEY}' -> '{summaries.SHORT_NAMES["ts"]}' THEN
                v_checkpoint := v_checkpoint - 'ts';
            END IF;
            IF p_checkpoint -> 'channel_values' = '{{}}'::jsonb THEN
                v_checkpoint := v_checkpoint - 'channel_values';
            END IF;
            IF p_checkpoint -> 'pending_sends' = '[]'::jsonb THEN
                v_checkpoint := v_checkpoint - 'pending_sends';
            END IF;
        END IF;
        IF p_checkpoint_ns = '' THEN
            INSERT INTO agent_checkpoint_ids (checkpoint_id, thread_id) VALUES (p_checkpoint_id, p_thread_id)
            ON CONFLICT (checkpoint_id) DO NOTHING;
            IF NOT FOUND AND NOT EXISTS (
                SELECT 1 FROM agent_checkpoint_ids WHERE checkpoint_id = p_checkpoint_id AND thread_id = p_thread_id)
            THEN
                RAISE EXCEPTION 'checkpoint % belongs to another thread', p_checkpoint_id
                    USING ERRCODE = 'TT002', DETAIL = p_checkpoint_id;
            END IF;
        END IF;
        INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
        VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_checkpoint_id, v_checkpoint, p_metadata)
        ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
        DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
    END $$""",
    # See DROPPED_INDEXES. A plain DROP (not CONCURRENTLY: setup's migrations run in one transaction) holds
    # each table's lock only for the catalogue change. One command: a migration may run as a prepared statement.
    f"DROP INDEX IF EXISTS {', '.join(DROPPED_INDEXES)}",
    # Runs (`agent.runs.store`): one row per streamed or background turn, and its event log. Short-lived rows
    # (swept `response_events_seconds` after the turn ends), but tables like any other: setup creates them,
    # and re-creates them with the rest if one was dropped.
    """CREATE TABLE IF NOT EXISTS agent_runs (
        response_id TEXT PRIMARY KEY,
        user_id TEXT,
        status TEXT NOT NULL,
        background BOOLEAN NOT NULL,
        thread_id TEXT,
        checkpoint_id TEXT,
        reason TEXT,
        code TEXT,
        cancel_requested BOOLEAN NOT NULL DEFAULT false,
        request JSONB NOT NULL DEFAULT '{}',
        expires_at TIMESTAMPTZ NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS agent_runs_expires_idx ON agent_runs (expires_at)",
    """CREATE TABLE IF NOT EXISTS agent_run_events (
        response_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        payload BYTEA NOT NULL,
        PRIMARY KEY (response_id, seq)
    )""",
    # The search index without a copy of the text (`agent.storage.search`): the earlier table kept each row's
    # text and a GIN index over its tsvector, about 4 times the text, and broke the storage bound. Its rows
    # are dropped, not converted: `search.backfill` (`tt-agent search-index`) indexes them again from the
    # checkpoints.
    "DROP TABLE IF EXISTS agent_message_text",
    """CREATE TABLE IF NOT EXISTS agent_message_terms (
        thread_id TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        terms INTEGER[] NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_id)
    )""",
    # fastupdate off: GIN's pending list (on by default) holds new entries until a vacuum merges them, and the
    # pages it grew stay in the index afterwards, measured at 2.9 kB a turn against 0.3 kB written directly.
    "CREATE INDEX IF NOT EXISTS agent_message_terms_idx ON agent_message_terms USING GIN (terms) WITH (fastupdate = off)",
    # The privileges a commit needs, now naming the new table.
    """CREATE OR REPLACE FUNCTION agent_missing_privileges() RETURNS TEXT[]
    LANGUAGE plpgsql STABLE AS $$
    BEGIN
        RETURN (SELECT coalesce(array_agg(n.privilege || ' on ' || n.tbl ORDER BY n.i), '{}')
                FROM (VALUES (1, 'checkpoints', 'INSERT'), (2, 'checkpoints', 'UPDATE'),
                             (3, 'checkpoint_blobs', 'INSERT'), (4, 'checkpoint_blobs', 'UPDATE'),
                             (5, 'checkpoint_writes', 'INSERT'), (6, 'checkpoint_writes', 'UPDATE'),
                             (7, 'agent_threads', 'INSERT'), (8, 'agent_threads', 'UPDATE'),
                             (9, 'agent_checkpoint_ids', 'INSERT'), (10, 'agent_message_terms', 'INSERT'),
                             (11, 'agent_message_terms', 'UPDATE')) AS n(i, tbl, privilege)
                WHERE NOT has_table_privilege(n.tbl, n.privilege));
    END $$""",
    # The privileges a turn needs, now on every table a turn writes (the earlier lists had missed the run
    # tables, the steers, the claims, the branch records and the store), derived from `TABLES`.
    missing_privileges_sql(),
    # The search index holds only the words new to a checkpoint's branch, and a row at each root
    # (`agent.storage.search`). The earlier rows (every word of every checkpoint's new messages, about 0.9 kB a
    # turn) are dropped, not converted (that needs each thread's tree): `search.backfill`
    # (`tt-agent search-index`) indexes their threads again, a thread at a time.
    "TRUNCATE agent_message_terms",
    # Its rows are found by thread (a search's candidates, a thread's deletions, the backfill), and a B-tree
    # over the thread id alone stores each thread once with its rows' addresses (deduplication): about 6
    # bytes a row, where the primary key copied both ids into every entry (about 90).
    "ALTER TABLE agent_message_terms DROP CONSTRAINT IF EXISTS agent_message_terms_pkey",
    "CREATE INDEX IF NOT EXISTS agent_message_terms_thread_idx ON agent_message_terms (thread_id)",
    # The claim of the `agent_claim_turn` above, plus the start this process already holds: when the turn starts
    # from p_known_start (the head this process's own commit wrote: `storage.PostgresThreadStorage`, "Known
    # heads"), the row is still the version that commit wrote (its xmin is p_known_xmin; any later write of
    # the row, a prune's or a rewrite's, gives it another) and no write waits on it, the start is not read
    # (known_start; the s_ columns stay NULL) and the process uses its copy. Another process's turn, a branch
    # switch or a fork moves the head to another checkpoint id, and then the known start is not the start.
    # An overload (two more arguments): processes of the previous release keep calling the nine-argument one.
    f"""CREATE OR REPLACE FUNCTION agent_claim_turn(
        p_thread_id TEXT, p_token TEXT, p_user_id TEXT, p_lease DOUBLE PRECISION, p_key TEXT,
        p_checkpoint_id TEXT, p_read_start BOOLEAN, p_queue BOOLEAN, p_user_claim TEXT,
        p_known_start TEXT, p_known_xmin TEXT)
    RETURNS TABLE (
        claim_fence BIGINT, user_being_deleted BOOLEAN, missing_privileges TEXT[], known_start BOOLEAN,
        t_thread_id TEXT, t_user_id TEXT, t_head_checkpoint_id TEXT, t_title TEXT, t_metadata JSONB,
        t_message_count INTEGER, t_forked_from JSONB, t_ttl_seconds DOUBLE PRECISION, t_created_at TEXT,
        t_updated_at TEXT,
        s_thread_id TEXT, s_checkpoint JSONB, s_checkpoint_ns TEXT, s_checkpoint_id TEXT,
        s_parent_checkpoint_id TEXT, s_metadata JSONB, s_channel_values BYTEA[], s_pending_writes BYTEA[])
    LANGUAGE plpgsql AS $$
    DECLARE v_ticket BIGINT;
    BEGIN
        PERFORM set_config('synchronous_commit', 'off', true);
        user_being_deleted := false;
        IF p_user_id IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock_shared({USER_LOCK_CLASS}, hashtext(p_user_id));
            user_being_deleted := EXISTS (
                SELECT 1 FROM agent_user_claims u WHERE u.user_id = p_user_id
                  AND u.expires_at >= clock_timestamp() AND u.token IS DISTINCT FROM p_user_claim);
        END IF;
        UPDATE agent_claim_waiters SET expires_at = clock_timestamp() + make_interval(secs => p_lease)
        WHERE thread_id = p_thread_id AND token = p_token
        RETURNING ticket INTO v_ticket;

        IF NOT user_being_deleted THEN
            INSERT INTO agent_claims AS c (thread_id, token, fence, expires_at, idempotency_key, cancel, user_id)
            SELECT p_thread_id, p_token, 1, clock_timestamp() + make_interval(secs => p_lease), p_key, NULL, p_user_id
            WHERE NOT EXISTS (
                SELECT 1 FROM agent_threads t WHERE t.thread_id = p_thread_id AND t.user_id IS DISTINCT FROM p_user_id)
              AND (NOT EXISTS (
                    SELECT 1 FROM agent_claim_waiters w
                    WHERE w.thread_id = p_thread_id AND w.expires_at >= clock_timestamp() AND w.token <> p_token
                      AND (v_ticket IS NULL OR w.ticket < v_ticket))
                OR EXISTS (SELECT 1 FROM agent_claims h WHERE h.thread_id = p_thread_id AND h.token = p_token))
            ON CONFLICT (thread_id) DO UPDATE
            SET token = EXCLUDED.token, fence = c.fence + 1, expires_at = EXCLUDED.expires_at,
                idempotency_key = EXCLUDED.idempotency_key, cancel = NULL, user_id = EXCLUDED.user_id
            WHERE c.expires_at < clock_timestamp() OR c.token = EXCLUDED.token
            RETURNING c.fence INTO claim_fence;
        END IF;

        SELECT t.thread_id, t.user_id, t.head_checkpoint_id, t.title, t.metadata, t.message_count, t.forked_from,
            t.ttl_seconds, to_char(t.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            to_char(t.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
        INTO t_thread_id, t_user_id, t_head_checkpoint_id, t_title, t_metadata, t_message_count, t_forked_from,
            t_ttl_seconds, t_created_at, t_updated_at
        FROM agent_threads t WHERE t.thread_id = p_thread_id;

        IF claim_fence IS NOT NULL THEN
            -- Out of the queue; so are waiters of this thread whose process died (their tickets expired).
            DELETE FROM agent_claim_waiters
            WHERE thread_id = p_thread_id AND (token = p_token OR expires_at < clock_timestamp());
        ELSIF p_queue AND v_ticket IS NULL AND NOT user_being_deleted
              AND (t_thread_id IS NULL OR t_user_id IS NOT DISTINCT FROM p_user_id) THEN
            INSERT INTO agent_claim_waiters (thread_id, token, expires_at)
            VALUES (p_thread_id, p_token, clock_timestamp() + make_interval(secs => p_lease));
        END IF;

        missing_privileges := agent_missing_privileges();

        known_start := COALESCE(claim_fence IS NOT NULL AND p_read_start
            AND p_known_start = COALESCE(p_checkpoint_id, t_head_checkpoint_id)
            AND EXISTS (
                SELECT 1 FROM checkpoints c
                WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = p_known_start
                  AND c.xmin::text = p_known_xmin)
            AND NOT EXISTS (
                SELECT 1 FROM checkpoint_writes cw
                WHERE cw.thread_id = p_thread_id AND cw.checkpoint_ns = '' AND cw.checkpoint_id = p_known_start),
            false);

        IF claim_fence IS NOT NULL AND p_read_start AND NOT known_start THEN
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
    # The commit's checkpoint write (as above), now also when the metadata's summary is JSON text
    # (`summaries.as_text`, which the saver writes now): `ts` is left out when the summary holds the same one.
    f"""CREATE OR REPLACE FUNCTION agent_put_checkpoint(
        p_thread_id TEXT, p_checkpoint_ns TEXT, p_checkpoint_id TEXT, p_parent_checkpoint_id TEXT,
        p_checkpoint JSONB, p_metadata JSONB)
    RETURNS VOID LANGUAGE plpgsql AS $$
    DECLARE
        v_checkpoint JSONB := p_checkpoint - 'id';
        v_summary JSONB := p_metadata -> '{summaries.SUMMARY_KEY}';
    BEGIN
        IF jsonb_typeof(v_summary) = 'string' THEN
            v_summary := (v_summary #>> '{{}}')::jsonb;
        END IF;
        IF p_checkpoint ->> 'id' IS DISTINCT FROM p_checkpoint_id THEN
            v_checkpoint := p_checkpoint;  -- kept whole: the row could not give its id back
        ELSE
            IF p_checkpoint -> 'ts' = v_summary -> '{summaries.SHORT_NAMES["ts"]}' THEN
                v_checkpoint := v_checkpoint - 'ts';
            END IF;
            IF p_checkpoint -> 'channel_values' = '{{}}'::jsonb THEN
                v_checkpoint := v_checkpoint - 'channel_values';
            END IF;
            IF p_checkpoint -> 'pending_sends' = '[]'::jsonb THEN
                v_checkpoint := v_checkpoint - 'pending_sends';
            END IF;
        END IF;
        IF p_checkpoint_ns = '' THEN
            INSERT INTO agent_checkpoint_ids (checkpoint_id, thread_id) VALUES (p_checkpoint_id, p_thread_id)
            ON CONFLICT (checkpoint_id) DO NOTHING;
            IF NOT FOUND AND NOT EXISTS (
                SELECT 1 FROM agent_checkpoint_ids WHERE checkpoint_id = p_checkpoint_id AND thread_id = p_thread_id)
            THEN
                RAISE EXCEPTION 'checkpoint % belongs to another thread', p_checkpoint_id
                    USING ERRCODE = 'TT002', DETAIL = p_checkpoint_id;
            END IF;
        END IF;
        INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
        VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_checkpoint_id, v_checkpoint, p_metadata)
        ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
        DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
    END $$""",
    # The catalogue's index in ascending order (`ACTIVITY_INDEX`): each turn's update of `updated_at` writes
    # an entry, and in the descending index it went in at the left end of the user's range, where a full page
    # splits in half (the right end splits at 90%): 106 bytes a turn against 65 ascending, measured over a
    # thread's turns before a vacuum. The catalogue scans it backward, in the same order. CONCURRENTLY: on
    # an existing table `indexes.build` builds it after setup's transaction, and until then the catalogue
    # sorts the user's rows instead.
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {ACTIVITY_INDEX} ON agent_threads (user_id, updated_at, thread_id)",
    "DROP INDEX IF EXISTS agent_threads_activity_idx",
]


def text_as_utf8(statement: str) -> str:
    """`statement` with every `x::bytea` and `x::text::bytea` of a text value read as `convert_to(x, 'UTF8')`."""
    return re.sub(r"\b([a-z_]+\.[a-z_]+)(?:::text)?::bytea", r"convert_to(\1::text, 'UTF8')", statement)


#: The index of the migration that created the claim with a known start (the 11-argument `agent_claim_turn`).
CLAIM_WITH_KNOWN_START = next(n for n, statement in enumerate(MIGRATIONS) if "p_known_xmin TEXT)" in statement)

# That claim again, its start's blob and write names read as bytes with `convert_to(..., 'UTF8')`: `text::bytea`
# reads a backslash as the start of an escape, so a pending write imported with a backslash in its task id
# made every read of its checkpoint fail ("invalid input syntax for type bytea"; found by
# tests/operations/test_hostile_imports.py). `sql.SELECT_CHECKPOINTS_COLUMNS` reads them the same way.
MIGRATIONS.append(text_as_utf8(MIGRATIONS[CLAIM_WITH_KNOWN_START]))


def without_registration(statement: str) -> str:
    """`statement` (an `agent_put_checkpoint`) without its registration of the id in `agent_checkpoint_ids`."""
    found = REGISTRATION.findall(statement)
    if len(found) != 1:
        raise AssertionError(f"expected one registration in the statement, found {len(found)}")
    return statement.replace(found[0], "")


# An `agent_put_checkpoint`'s registration of a root-namespace checkpoint id: from its `IF` to its `END IF;`.
REGISTRATION = re.compile(
    r"\n *IF p_checkpoint_ns = '' THEN\n *INSERT INTO agent_checkpoint_ids .*?\n *END IF;\n *END IF;", re.S
)
#: The index of the migration that created the newest `agent_put_checkpoint` with a registration.
PUT_WITH_REGISTRATION = max(
    n for n, statement in enumerate(MIGRATIONS)
    if "FUNCTION agent_put_checkpoint" in statement and "INSERT INTO agent_checkpoint_ids" in statement
)  # fmt: skip

# One index in place of the registry ("Checkpoint ids" above, `checkpoint_ids`): a copy's rows are marked
# (`agent_copy`), and a unique index over the other root-namespace rows holds the rule; the registry's row and
# key (about 164 bytes a turn) and `agent_checkpoints_checkpoint_id_idx` go. A column with no default is no
# rewrite of the table, and NULL costs a row no byte (its null bitmap is there already: `type` is NULL).
MIGRATIONS += [
    "ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS agent_copy BOOLEAN",
    checkpoint_ids.MARK_COPIES_SQL,
    checkpoint_ids.OWNER_INDEX_SQL,
    checkpoint_ids.COPIES_INDEX_SQL,
    without_registration(MIGRATIONS[PUT_WITH_REGISTRATION]),
    "DROP INDEX IF EXISTS agent_checkpoints_checkpoint_id_idx",
    "DROP TABLE IF EXISTS agent_checkpoint_ids",
    # The claim's privilege check names every table of `TABLES`, which no longer holds the registry.
    missing_privileges_sql(),
]
#: The first migration of the index that replaced the registry. An agent of an earlier release that finds
#: `agent_checkpoint_ids` missing re-creates it and re-applies its own migrations, its registering
#: `agent_put_checkpoint` among them; setup applies this one and those after it again (`schema.migrate`).
REGISTRY_REPLACED = MIGRATIONS.index("ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS agent_copy BOOLEAN")

#: The checkpoint's key under which `TurnPostgresSaver` hands `agent_put_checkpoint` the checkpoint's search
#: terms (`agent.storage.search`), which the function stores in the row's `agent_terms` and not in the document.
TERMS_KEY = "~w"

# The search terms in the checkpoint's own row (`agent_terms`, NULL where the checkpoint brings no word to its
# branch; `agent.storage.search`), no longer a row of `agent_message_terms` beside it: that row's header and
# both ids cost about 120 bytes a turn (issue "pay only for what a turn says"), and a commit wrote one
# statement more. The GIN index covers only the rows that hold terms. The rows of `agent_message_terms` are
# moved into their checkpoints (one update of each indexed checkpoint, inside setup's transaction: turns wait
# for it, about as long as a scan of the table), then the table goes. `agent_put_checkpoint` takes the terms
# under `TERMS_KEY` in the compact checkpoint (`TurnPostgresSaver._backend_put`) and stores them beside it;
# LangGraph's six parameters stay as they are.
MIGRATIONS += [
    "ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS agent_terms INTEGER[]",
    """DO $$
    BEGIN
        IF to_regclass('agent_message_terms') IS NOT NULL THEN
            UPDATE checkpoints c SET agent_terms = m.terms
            FROM agent_message_terms m
            WHERE c.thread_id = m.thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = m.checkpoint_id;
        END IF;
    END $$""",
    "DROP TABLE IF EXISTS agent_message_terms",
    f"""CREATE OR REPLACE FUNCTION agent_put_checkpoint(
        p_thread_id TEXT, p_checkpoint_ns TEXT, p_checkpoint_id TEXT, p_parent_checkpoint_id TEXT,
        p_checkpoint JSONB, p_metadata JSONB)
    RETURNS VOID LANGUAGE plpgsql AS $$
    DECLARE
        v_terms INTEGER[];
        v_checkpoint JSONB;
        v_summary JSONB := p_metadata -> '{summaries.SUMMARY_KEY}';
    BEGIN
        -- Only a compact checkpoint (its REST_KEY text) carries terms: a checkpoint kept whole keeps every key.
        IF jsonb_typeof(p_checkpoint -> 'r') = 'string' AND jsonb_typeof(p_checkpoint -> '{TERMS_KEY}') = 'array' THEN
            v_terms := ARRAY(SELECT jsonb_array_elements_text(p_checkpoint -> '{TERMS_KEY}')::integer);
            p_checkpoint := p_checkpoint - '{TERMS_KEY}';
        END IF;
        v_checkpoint := p_checkpoint - 'id';
        IF jsonb_typeof(v_summary) = 'string' THEN
            v_summary := (v_summary #>> '{{}}')::jsonb;
        END IF;
        IF p_checkpoint ->> 'id' IS DISTINCT FROM p_checkpoint_id THEN
            v_checkpoint := p_checkpoint;  -- kept whole: the row could not give its id back
        ELSE
            IF p_checkpoint -> 'ts' = v_summary -> '{summaries.SHORT_NAMES["ts"]}' THEN
                v_checkpoint := v_checkpoint - 'ts';
            END IF;
            IF p_checkpoint -> 'channel_values' = '{{}}'::jsonb THEN
                v_checkpoint := v_checkpoint - 'channel_values';
            END IF;
            IF p_checkpoint -> 'pending_sends' = '[]'::jsonb THEN
                v_checkpoint := v_checkpoint - 'pending_sends';
            END IF;
        END IF;
        INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata,
            agent_terms)
        VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_checkpoint_id, v_checkpoint, p_metadata, v_terms)
        ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
        DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata,
            agent_terms = COALESCE(EXCLUDED.agent_terms, checkpoints.agent_terms);
    END $$""",
    # The claim's privilege check names every table of `TABLES`, which no longer holds the search table.
    missing_privileges_sql(),
    # fastupdate off, as for the table's index before (see its migration).
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_checkpoint_terms_idx ON checkpoints USING GIN (agent_terms) "
    "WITH (fastupdate = off) WHERE agent_terms IS NOT NULL",
]

# A checkpoint's `messages` value in its own row (`inline_messages`): about 140 bytes a turn less than its blob
# row and that row's key. No data moves: a row without the columns' value is read from its blob as before.
MIGRATIONS += [
    *inline_messages.ADD_COLUMNS_SQL,
    inline_messages.put_checkpoint_with_messages(
        MIGRATIONS[max(n for n, statement in enumerate(MIGRATIONS) if "FUNCTION agent_put_checkpoint(" in statement)]
    ),
    inline_messages.claim_with_inline_messages(
        MIGRATIONS[max(n for n, statement in enumerate(MIGRATIONS) if "FUNCTION agent_claim_turn(" in statement)]
    ),
]
