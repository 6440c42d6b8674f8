"""The channel values a Postgres database stores, wherever they are: rows of `checkpoint_blobs`, and the
`messages` values checkpoints hold in their own rows (`agent.storage.postgres.inline_messages`)."""

from __future__ import annotations

import psycopg

#: A FROM item (alias `stored`) with LangGraph's blob columns: thread_id, checkpoint_ns, channel, version, type,
#: blob; and checkpoint_id, the checkpoint whose row holds the value (NULL for a blob row).
STORED_VALUES = """(
    SELECT thread_id, checkpoint_ns, channel, version, type, blob, NULL::text AS checkpoint_id FROM checkpoint_blobs
    UNION ALL
    SELECT thread_id, checkpoint_ns, 'messages', checkpoint -> 'channel_versions' ->> 'messages', agent_messages_type,
        agent_messages, checkpoint_id
    FROM checkpoints WHERE agent_messages_type IS NOT NULL
) AS stored"""


def move_messages_to_blobs(conn: psycopg.Connection, thread_id: str | None = None) -> int:
    """Store every `messages` value a checkpoint row holds (of `thread_id`, else of every thread) as a
    `checkpoint_blobs` row instead, as the layout before `inline_messages` did; how many values moved."""
    which = "agent_messages_type IS NOT NULL AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)"
    moved = conn.execute(
        f"""INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
        SELECT thread_id, checkpoint_ns, 'messages', checkpoint -> 'channel_versions' ->> 'messages', agent_messages_type,
            agent_messages
        FROM checkpoints WHERE {which}
        ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING""",
        {"thread_id": thread_id},
    ).rowcount
    conn.execute(f"UPDATE checkpoints SET agent_messages_type = NULL, agent_messages = NULL WHERE {which}", {"thread_id": thread_id})
    return moved


def begun_before_the_upgrade(agent, thread_id: str) -> None:
    """On Postgres, store what `thread_id` holds so far as the layout before `inline_messages` did (its messages
    in blob rows), as a thread an earlier release began; nothing on another backend."""
    from agent.storage.postgres import PostgresThreadStorage

    if isinstance(agent.storage, PostgresThreadStorage):
        with agent.storage.pool.connection() as conn:
            assert move_messages_to_blobs(conn, thread_id) > 0
