"""A checkpoint's `messages` value in its own row, not in a row of `checkpoint_blobs`: the layout and its migrations.

Why: LangGraph's `PostgresSaver` stores every channel value that is not a
JSON primitive as a row of `checkpoint_blobs`, keyed by (thread, namespace,
channel, version). The agent's `messages` value is a delta of a few hundred
bytes (`agent.storage.deltas`), and its blob row cost a turn about 80 bytes of
row header and keys besides it, and 65 more in the table's primary key (issue
"pay only for what a turn says": a fixed cost of at most 500 bytes a turn).

The layout:

* **Written by every checkpoint that names a version.** When a checkpoint's
  put names a version of `messages` and carries its value,
  `TurnPostgresSaver._backend_put` hands the typed value to
  `agent_put_checkpoint` under `MESSAGES_KEY` in the compact checkpoint (as
  `[type, base64]`: LangGraph's six parameters stay as they are, as for the
  search terms), and the function stores it in the row's `agent_messages_type`
  and `agent_messages` columns; no blob row is written. That holds also when
  the checkpoint did not make the version: the agent's value is a delta against
  the checkpoint's parent (`agent.storage.deltas`), about 60 bytes with its
  type when the messages did not change (where a shared blob row cost such a
  checkpoint nothing: a graph of your own that writes a checkpoint per step,
  `durability="sync"`, pays that on its steps that leave the messages alone),
  and a `__copy__` of a checkpoint (LangGraph's
  `update_state(..., as_node="__copy__")`) names the version its source made
  while its parent, the source's parent, holds another one.
* **Read from the row first.** Every read of a checkpoint's values
  (`channel_values_sql`: the saver's `SELECT_SQL`, the claim's start) and of
  its messages alone (`sql.SELECT_THREAD_MESSAGES_SQL`) takes `messages` from
  the row when the row holds it, else from `checkpoint_blobs` by version as
  before: threads written before this layout read as they did, with no data
  moved by the upgrade.
* **A checkpoint that names a version without its value** (a put whose
  checkpoint is kept whole, `saver.compact_checkpoint`, or whose values lack
  `messages`) has it from a blob row: when no blob row holds that version,
  `agent_put_checkpoint` copies the value from a row of the thread's namespace
  that holds it into `checkpoint_blobs`. So every version a checkpoint names
  is in its row or in a blob row, and deleting the checkpoint that made a
  version (prune, retention, branch deletion) never loses the value another
  one reads: the deletes keep the blob rows that remaining checkpoints point
  at, as before.
* **Rewrites and copies** (`sql.REWRITE_INLINE_SQL`, `sql.COPY_THREAD_SQL`)
  change or copy the columns with the row.

The value travels as base64 text inside the JSONB parameter, which caps it at
about 190 MB compressed (a bytea parameter could take 1 GB): far above any
message delta, and not checked.

The columns are NULL where the row holds no value (LangGraph's own puts of
other channels, namespaced checkpoints without messages): NULL costs the row
no byte, since its null bitmap is there already.
"""

from __future__ import annotations

import re

#: The compact checkpoint's key under which `TurnPostgresSaver` hands `agent_put_checkpoint` the typed `messages`
#: value, `[type, base64 of the bytes]`; the function stores it in the row's columns and not in the document.
MESSAGES_KEY = "~m"
#: The channel whose value a row holds.
CHANNEL = "messages"


def channel_values_sql(row: str) -> str:
    """The `channel_values` column of LangGraph's `SELECT_SQL` for the checkpoint row aliased `row`: an array of
    [channel, type, blob] (bytea) for each channel version the checkpoint names whose value is stored, `messages`
    from the row's own columns when it holds them, every other value from `checkpoint_blobs` by one primary-key
    lookup per channel (OFFSET 0 keeps the planner from hashing the thread's blobs). Names are read as bytes
    with `convert_to(..., 'UTF8')` (a backslash in `text::bytea` starts an escape)."""
    return f"""(SELECT array_agg(array[convert_to(v.channel, 'UTF8'), convert_to(bl.type, 'UTF8'), bl.blob])
     FROM jsonb_each_text({row}.checkpoint -> 'channel_versions') AS v(channel, version)
     CROSS JOIN LATERAL (
        SELECT {row}.agent_messages_type AS type, {row}.agent_messages AS blob
        WHERE v.channel = '{CHANNEL}' AND {row}.agent_messages_type IS NOT NULL
        UNION ALL
        (SELECT b.type, b.blob FROM checkpoint_blobs b
         WHERE b.thread_id = {row}.thread_id AND b.checkpoint_ns = {row}.checkpoint_ns
           AND b.channel = v.channel AND b.version = v.version
           AND (v.channel <> '{CHANNEL}' OR {row}.agent_messages_type IS NULL)
         OFFSET 0)) AS bl)"""


# The claim's start read, as `agent_claim_turn` had it (after `migrations.text_as_utf8`): blobs only.
_BLOB_VALUES = re.compile(r"\(SELECT array_agg\(array\[convert_to\(bl\.channel::text, 'UTF8'\).*?OFFSET 0\) AS bl\)", re.S)


def claim_with_inline_messages(statement: str) -> str:
    """`statement` (the newest `agent_claim_turn`) with its start's channel values read by `channel_values_sql`.

    Raises:
        AssertionError: the statement does not read channel values exactly once as expected.
    """
    found = _BLOB_VALUES.findall(statement)
    if len(found) != 1:
        raise AssertionError(f"expected one read of channel values in the claim, found {len(found)}")
    return statement.replace(found[0], channel_values_sql("c"))


# `agent_put_checkpoint` as the search terms' migration left it, and what `put_checkpoint_with_messages` makes of it:
# (the text to find once, the text in its place).
_PUT_CHANGES = (
    # Its variables.
    ("        v_terms INTEGER[];\n",
     "        v_terms INTEGER[];\n        v_messages_type TEXT;\n        v_messages BYTEA;\n        v_version TEXT;\n"),
    # The value handed under MESSAGES_KEY, taken out of the document (a compact checkpoint only, as the terms).
    ("        v_checkpoint := p_checkpoint - 'id';\n", f"""\
        IF jsonb_typeof(p_checkpoint -> 'r') = 'string' AND jsonb_typeof(p_checkpoint -> '{MESSAGES_KEY}') = 'array' THEN
            v_messages_type := p_checkpoint -> '{MESSAGES_KEY}' ->> 0;
            v_messages := decode(p_checkpoint -> '{MESSAGES_KEY}' ->> 1, 'base64');
            p_checkpoint := p_checkpoint - '{MESSAGES_KEY}';
        END IF;
        v_checkpoint := p_checkpoint - 'id';
"""),
    # A version it names without its value: a copy of the value a row holds, as a blob row, unless one exists. Its
    # own row first (a put again of the same checkpoint), then the parent's, then any (one scan of the thread's
    # rows, for puts the saver does not write itself).
    ("        INSERT INTO checkpoints (", f"""\
        v_version := p_checkpoint -> 'channel_versions' ->> '{CHANNEL}';
        IF v_messages_type IS NULL AND v_version IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM checkpoint_blobs b
            WHERE b.thread_id = p_thread_id AND b.checkpoint_ns = p_checkpoint_ns AND b.channel = '{CHANNEL}'
              AND b.version = v_version)
        THEN
            INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
            SELECT p_thread_id, p_checkpoint_ns, '{CHANNEL}', v_version, c.agent_messages_type, c.agent_messages
            FROM checkpoints c
            WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
              AND c.agent_messages_type IS NOT NULL AND c.checkpoint -> 'channel_versions' ->> '{CHANNEL}' = v_version
            ORDER BY c.checkpoint_id = p_checkpoint_id DESC, c.checkpoint_id = p_parent_checkpoint_id DESC
            LIMIT 1
            ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;
        END IF;
        INSERT INTO checkpoints ("""),
    # The row's columns.
    ("            agent_terms)\n", "            agent_terms, agent_messages_type, agent_messages)\n"),
    ("p_metadata, v_terms)\n", "p_metadata, v_terms,\n            v_messages_type, v_messages)\n"),
    ("            agent_terms = COALESCE(EXCLUDED.agent_terms, checkpoints.agent_terms);\n",
     "            agent_terms = COALESCE(EXCLUDED.agent_terms, checkpoints.agent_terms),\n"
     "            agent_messages_type = EXCLUDED.agent_messages_type, agent_messages = EXCLUDED.agent_messages;\n"),
)  # fmt: skip


def put_checkpoint_with_messages(statement: str) -> str:
    """`statement` (the newest `agent_put_checkpoint`) storing the typed `messages` value it is handed under
    `MESSAGES_KEY` in the row, and copying a version the checkpoint names without holding it, when no blob row has
    it, from a row of the thread that holds it into `checkpoint_blobs` (module docstring).

    Raises:
        AssertionError: a text it changes is not found exactly once in `statement`.
    """
    for old, new in _PUT_CHANGES:
        if statement.count(old) != 1:
            raise AssertionError(f"expected {old.strip()!r} once in agent_put_checkpoint, found {statement.count(old)}")
        statement = statement.replace(old, new)
    return statement


#: The columns (no default: adding them rewrites no table).
ADD_COLUMNS_SQL = [
    "ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS agent_messages_type TEXT",
    "ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS agent_messages BYTEA",
]
