"""`TurnPostgresSaver`: LangGraph's `PostgresSaver` with the agent's turns (`storage.saver`), and no instance lock.

What it changes in `PostgresSaver`, and why:

* **No saver-wide lock.** `PostgresSaver` serializes every query of an
  instance behind one lock even when it is given a pool (langgraph#7259), so
  `_cursor` takes a pooled connection (or the running write transaction's,
  `PostgresThreadStorage.cursor`) without it.
* **Writes join the commit.** Inside a write transaction LangGraph's
  pipelined writes (`put`, `put_writes`) are added to the transaction's
  statement batch (`batch`), sent with its commit in one round trip.
* **Cached plans.** Its upserts call the plpgsql functions of the migrations
  (`sql.PUT_BLOB_SQL`, `sql.PUT_CHECKPOINT_SQL`) with LangGraph's parameters;
  a root-namespace checkpoint's id that another thread holds fails on a
  unique index (`checkpoint_ids`, and "Checkpoint ids" in `migrations`).
* **Inline strings sealed.** LangGraph keeps a channel value that is a string
  (or another primitive) inside the checkpoint's JSONB row rather than in a
  blob, where the serializer never sees it; with encryption on, such strings
  are sealed before `put` and opened when a row is loaded (`agent.encryption`).
  Numbers and booleans stay as they are.
* **Compact rows.** `agent_put_checkpoint` stores a checkpoint without its
  `id` (the row's column), its `ts` (when the summary holds the same one) and
  LangGraph's empty `channel_values` and `pending_sends` (see the migration);
  `expand_checkpoint` puts them back on every read, before LangGraph's loader
  sees the row. The metadata's summary is stored as JSON text
  (`summaries.as_text`, "As text on Postgres" there: about 95 bytes less a
  row) and loaded as the object again, so LangGraph's reads see what was put.
  Of the checkpoint, only what SQL reads stays jsonb (`channel_versions`, and
  `channel_values`, which LangGraph's `put` splits into blobs and inline
  values, and `get_tuple` the format `v`); the rest (`versions_seen`, `updated_channels`, `ts` or
  `pending_sends` when they are not the ones `expand_checkpoint` gives back) is
  one compact JSON text under `REST_KEY` (`compact_checkpoint`, the two
  fields by the short names of `REST_NAMES`): jsonb spends an entry on every
  key and value, about 45 bytes a row on the nested `versions_seen`.
* **Search terms in the row.** A root-namespace checkpoint's search terms
  (`agent.storage.search`) go to `agent_put_checkpoint` under `TERMS_KEY` in
  the compact checkpoint, and the function stores them in the row's
  `agent_terms` column rather than in the document: one statement, and no row
  of their own (see the migration). LangGraph's `put` and its six parameters
  stay as they are.
* **Messages in the row.** A checkpoint that names a version of its
  `messages` value hands the value, typed, to `agent_put_checkpoint` under
  `MESSAGES_KEY` in the compact checkpoint, and the function stores it in the
  row's own columns rather than as a row of `checkpoint_blobs`; every read
  (`SELECT_SQL`, which is ours, and the claim's) takes it from there
  (`inline_messages` has the layout and why).
* **Rows read by the storage's own statements** (the claim's start, a
  checkpoint by id) become `CheckpointTuple`s here (`load_row`), messages resolved.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

import psycopg
from langgraph.checkpoint.base import CheckpointTuple, get_serializable_checkpoint_metadata
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import ConnectionPool

from agent.encryption import Keyring, is_sealed
from agent.storage import deltas, summaries
from agent.storage.postgres import branches, checkpoint_ids, inline_messages, sql
from agent.storage.postgres.batch import running_batch
from agent.storage.postgres.inline_messages import MESSAGES_KEY
from agent.storage.postgres.migrations import TERMS_KEY
from agent.storage.records import Turn
from agent.storage.saver import TurnSaverMixin

#: Channel values `PostgresSaver.put` keeps inside the checkpoint's JSONB row rather than in a blob (None too).
INLINE = (str, int, float, bool)


#: The key of a stored checkpoint holding, as JSON text, the fields SQL never reads (`compact_checkpoint`).
REST_KEY = "r"
#: Short names of fields under `REST_KEY` (any other field keeps its name).
REST_NAMES = {"versions_seen": "s", "updated_channels": "u"}
_REST_FIELDS = {short: name for name, short in REST_NAMES.items()}
#: The fields of a checkpoint that stay jsonb: SQL reads the versions, LangGraph's `put` the values, its
#: `get_tuple` and `list` the format `v` before our loader sees the row.
JSONB_FIELDS = ("v", "id", "channel_values", "channel_versions")


def compact_checkpoint(checkpoint: Mapping[str, Any], metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """`checkpoint` with the fields SQL never reads as one JSON text under `REST_KEY` (module docstring),
    leaving out a `ts` that the summary in `metadata` holds and empty `pending_sends`; as it is when a field
    is not plain JSON."""
    rest = {key: value for key, value in checkpoint.items() if key not in JSONB_FIELDS}
    if "ts" in rest and rest["ts"] == summaries.unpack(metadata).get("ts"):
        del rest["ts"]
    if rest.get("pending_sends") == []:
        del rest["pending_sends"]
    if set(rest) & set(_REST_FIELDS):  # a field named like a short name: it could not be told apart
        return checkpoint
    rest = {REST_NAMES.get(key, key): value for key, value in rest.items()}
    try:
        text = json.dumps(rest, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return checkpoint
    return {**{key: checkpoint[key] for key in JSONB_FIELDS if key in checkpoint}, REST_KEY: text}


def expand_checkpoint(stored: Mapping[str, Any], checkpoint_id: str, metadata: Mapping[str, Any] | None) -> dict:
    """A checkpoint as LangGraph wrote it, from the compact form `agent_put_checkpoint` stores (no `id`): its
    id from the row, the fields under `REST_KEY` (`compact_checkpoint`) when it has them, `ts` from the
    metadata's summary (either layout) unless stored, empty `channel_values` and `pending_sends` unless
    stored."""
    if isinstance(stored.get(REST_KEY), str):
        rest = {_REST_FIELDS.get(key, key): value for key, value in json.loads(stored[REST_KEY]).items()}
        stored = {**{k: v for k, v in stored.items() if k != REST_KEY}, **rest}
    checkpoint = {"v": stored.get("v"), "id": checkpoint_id, **stored}
    if "ts" not in checkpoint:
        checkpoint["ts"] = summaries.unpack(metadata).get("ts")
    checkpoint.setdefault("channel_values", {})
    checkpoint.setdefault("pending_sends", [])
    return checkpoint


class SaverStorage(Protocol):
    """What the saver uses of its storage (`storage.PostgresThreadStorage`, which imports this module)."""

    pool: ConnectionPool
    keyring: Keyring

    def cursor(self, *, pipeline: bool = False) -> AbstractContextManager[Any]: ...

    def transaction(self, apply: Callable[[Any], Any]) -> Any: ...

    def faults(self, action: str, thread_id: str | None = None) -> AbstractContextManager[None]: ...


class TurnPostgresSaver(TurnSaverMixin, PostgresSaver):
    """`PostgresSaver` with turn buffering, message deltas, summaries and no instance lock."""

    # LangGraph's statements, as calls of the functions that run them with cached plans (see `sql`).
    UPSERT_CHECKPOINT_BLOBS_SQL = sql.PUT_BLOB_SQL
    UPSERT_CHECKPOINTS_SQL = sql.PUT_CHECKPOINT_SQL
    # Its reads, with `messages` from the checkpoint's own row (`inline_messages`).
    SELECT_SQL = sql.SELECT_CHECKPOINTS_COLUMNS

    def __init__(self, storage: SaverStorage, *, message_cache_size: int) -> None:
        PostgresSaver.__init__(self, storage.pool)
        self._storage = storage
        self._init_turns(message_cache_size, storage.keyring)

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Any]:
        batch = running_batch()
        if batch is not None and pipeline:
            # LangGraph asks for a pipeline exactly where it only writes (put, put_writes): those
            # statements join the write transaction's batch, sent with its commit.
            yield batch
            return
        # langgraph#7259: the base class holds `self.lock` here even with a pool; a pooled (or the
        # transaction's) connection is not shared, so no lock. Used directly as a LangGraph
        # checkpointer, the saver may be the first to touch the database: the storage sets up first.
        with self._storage.cursor(pipeline=pipeline) as cur:
            yield cur

    def _backend_get_tuple(self, config):
        with self._read_faults("read a checkpoint", config):
            return PostgresSaver.get_tuple(self, config)

    def _read_faults(self, action: str, config) -> AbstractContextManager[None]:
        """Outside a write transaction, the driver's errors of a read as `StorageUnavailable` (a read
        while a turn runs, e.g. LangGraph asking for the head to tell a branch from a continuation,
        would otherwise reach the caller as psycopg's error: a 500). Inside one they propagate, for
        the commit to settle what was written."""
        if running_batch() is not None:
            return nullcontext()
        return self._storage.faults(action, config["configurable"].get("thread_id"))

    def _load_checkpoint_tuple(self, value):
        if "id" not in value["checkpoint"] or REST_KEY in value["checkpoint"]:
            value = {**value, "checkpoint": expand_checkpoint(value["checkpoint"], value["checkpoint_id"], value["metadata"])}
        if value["metadata"]:
            value = {**value, "metadata": summaries.as_object(value["metadata"])}
        tup = self._load_resolved(value)
        values = tup.checkpoint.get("channel_values") or {}
        if not any(is_sealed(v) for v in values.values()):
            return tup
        opened = {k: self.keyring.open_text(v, what=f"Channel {k!r}") for k, v in values.items()}
        return tup._replace(checkpoint={**tup.checkpoint, "channel_values": opened})

    def _load_resolved(self, value):
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

    def committed_head(self, turn: Turn):
        """The CheckpointTuple that `load_row` makes of the head `turn` wrote (its last checkpoint), from what
        the turn holds; None when it cannot be made the same (see "Known heads" in `storage`).

        Only a root-namespace head whose channel values are its message list (resolved in the message cache)
        and JSON primitives (stored inline in the row), without encryption at rest: every other value would
        have to go through the serializer, which is what reading it costs.
        """
        if not turn.puts or self.keyring.enabled:
            return None
        _, checkpoint, _, _ = turn.puts[-1]
        head = checkpoint["id"]
        written = turn.written.get(head)
        if written is None:
            return None
        config, metadata = written
        configurable = config["configurable"]
        values = checkpoint.get("channel_values") or {}
        inline = {k: v for k, v in values.items() if k != "messages"}
        if configurable.get("checkpoint_ns", "") or not all(v is None or isinstance(v, INLINE) for v in inline.values()):
            return None
        if "messages" in values:
            messages = self.message_cache.get_list(head)
            if messages is None:
                return None
            inline["messages"] = messages
        # As the row gives them back: through JSON (JSONB), LangGraph's metadata as `put` stores it.
        stored = json.loads(json.dumps({k: v for k, v in checkpoint.items() if k != "channel_values"}))
        stored_metadata = json.loads(json.dumps(get_serializable_checkpoint_metadata(config, metadata)))
        address = {"thread_id": configurable["thread_id"], "checkpoint_ns": "", "checkpoint_id": head}
        parent = configurable.get("checkpoint_id")
        tup = CheckpointTuple(
            config={"configurable": address},
            checkpoint={**stored, "channel_values": inline},
            metadata=stored_metadata,
            parent_config={"configurable": {**address, "checkpoint_id": parent}} if parent else None,
            pending_writes=[],
        )
        return self.agent_tuple(tup)

    def load_row(self, row: Mapping[str, Any]):
        """A CheckpointTuple (messages resolved, metadata as the agent reads it) from a row of `sql.SELECT_CHECKPOINT_SQL`."""
        return self.agent_tuple(self._load_checkpoint_tuple(row))

    def _backend_put(self, config, checkpoint, metadata, new_versions, terms):
        values = checkpoint["channel_values"]
        if self.keyring.enabled and any(isinstance(v, str) for v in values.values()):
            sealed = {k: self.keyring.seal_text(v) if isinstance(v, str) else v for k, v in values.items()}
            checkpoint = {**checkpoint, "channel_values": sealed}
        stored = compact_checkpoint(checkpoint, metadata)
        # The terms ride in the compact checkpoint, which `agent_put_checkpoint` stores beside it (`TERMS_KEY`);
        # a checkpoint kept whole keeps its own keys, and its terms are set by a statement of their own.
        inline = terms is not None and REST_KEY in stored and TERMS_KEY not in checkpoint
        if inline:
            stored = {**stored, TERMS_KEY: terms}
        if REST_KEY in stored and MESSAGES_KEY not in checkpoint:
            stored = self._messages_in_row(stored, new_versions)
        try:
            result = PostgresSaver.put(self, config, stored, summaries.as_text(metadata), new_versions)
            if terms is not None and not inline:
                params = {"thread_id": str(config["configurable"]["thread_id"]), "checkpoint_id": checkpoint["id"], "terms": terms}
                with self._cursor(pipeline=True) as cur:
                    cur.execute(branches.INDEX_MESSAGES_SQL, params)
            return result
        except psycopg.Error as exc:  # sent at once outside a commit; inside one, the commit says it
            refused = checkpoint_ids.taken(exc, config["configurable"]["thread_id"])
            if refused is not None:
                raise refused from None
            raise

    def _messages_in_row(self, stored: Mapping[str, Any], new_versions) -> Mapping[str, Any]:
        """`stored` (a compact checkpoint) with its `messages` value, typed, under `MESSAGES_KEY` instead of among
        the channel values that LangGraph's `put` writes as blob rows (`inline_messages`): whether or not the
        checkpoint made that version (a `__copy__` of a checkpoint names the version its source made, and its
        parent is the source's parent, which holds another one). As it is when the checkpoint names no version
        of them, or the value is a JSON primitive, which LangGraph keeps in the document itself."""
        values = stored.get("channel_values") or {}
        value = values.get(inline_messages.CHANNEL)
        version = stored.get("channel_versions", {}).get(inline_messages.CHANNEL)
        if not isinstance(value, (dict, list)) or version is None:
            return stored
        if new_versions.get(inline_messages.CHANNEL, version) != version:
            return stored  # a new version the checkpoint does not name: LangGraph's blob row, which no read finds
        type_, blob = self.serde.dumps_typed(value)
        rest = {k: v for k, v in values.items() if k != inline_messages.CHANNEL}
        return {**stored, "channel_values": rest, MESSAGES_KEY: [type_, base64.b64encode(blob).decode("ascii")]}

    def _backend_put_writes(self, config, writes, task_id, task_path):
        return PostgresSaver.put_writes(self, config, writes, task_id, task_path)

    def _fetch_checkpoint_messages(self, thread_id: str, checkpoint_ids: Sequence[str]) -> Mapping[str, Any]:
        config = {"configurable": {"thread_id": thread_id}}
        with self._read_faults("read messages", config), self._cursor() as cur:
            cur.execute(sql.SELECT_CHECKPOINT_MESSAGES_SQL, (thread_id, list(checkpoint_ids)))
            rows = cur.fetchall()
        return {
            row["checkpoint_id"]: None if row["type"] in (None, "empty") else self.serde.loads_typed((row["type"], bytes(row["blob"])))
            for row in rows
        }

    def _fetch_thread_messages(self, thread_id: str, checkpoint_ns: str) -> Mapping[str, Any]:
        with self._read_faults("read messages", {"configurable": {"thread_id": thread_id}}), self._cursor() as cur:
            cur.execute(sql.SELECT_THREAD_MESSAGES_SQL, (thread_id, checkpoint_ns))
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

    def dump_messages_whole(self, messages) -> tuple[str, bytes]:
        """The typed blob of `messages` stored whole (no longer a delta against an ancestor)."""
        return self.serde.dumps_typed(deltas.encode(list(messages), None, ()))
