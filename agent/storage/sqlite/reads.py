"""The SQLite backend's reads (thread records, checkpoint summaries), and a read-only reader that needs no LangGraph.

The statements and row mappings here are the backend's only copy: the full
storage (`storage.SqliteThreadStorage`) runs them on its connection, inside its
lock, and `SqliteReader` runs them on a read-only connection of its own.

Why a second way in: `tt-agent history` reads only `agent_threads` and the
checkpoints' metadata (the summaries written by `summaries.summarize`), yet
opening the full storage loads LangGraph's `SqliteSaver`, LangChain and, with
the agent, MLflow: seconds before the first row. `SqliteReader` imports only
`sqlite3`. It opens the file with `mode=ro` (https://www.sqlite.org/uri.html),
so a read-only command can neither create a missing store nor change one, and
it checks that the columns its statements read exist; a store written by an
older version fails that check, and the caller opens the full storage, which
migrates it (`agent.storage.open_reader`).
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agent.encryption import NO_KEYS, Keyring
from agent.errors import InvalidRequest, StorageUnavailable
from agent.storage import compression, summaries
from agent.storage.records import ThreadRecord

THREAD_COLUMNS = (
    "thread_id, user_id, head_checkpoint_id, title, metadata, message_count, forked_from, ttl_seconds, "
    "created_at, updated_at"
)
SELECT_THREAD_SQL = f"SELECT {THREAD_COLUMNS} FROM agent_threads WHERE thread_id = ?"
CHECKPOINT_IN_THREAD_SQL = "SELECT 1 FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?"
LIST_CHECKPOINTS_SQL = """
SELECT checkpoint_id, parent_checkpoint_id, metadata FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = '' AND (? IS NULL OR checkpoint_id < ?)
ORDER BY checkpoint_id DESC LIMIT ?
"""
# The stored checkpoints (with their messages) of some of a thread's checkpoints; `?2` is a JSON array of ids.
LIGHT_CHECKPOINTS_SQL = """
SELECT checkpoint_id, type, checkpoint FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id IN (SELECT value FROM json_each(?))
"""
SELECT_USER_THREADS_SQL = "SELECT thread_id FROM agent_threads WHERE user_id = ? ORDER BY thread_id"
# The catalogue (`operations.catalogue`): one range scan of agent_threads_activity_idx per page. The
# position is the row's (updated_at, thread_id), updated_at being the stored REAL, exactly (`repr`).
LIST_THREADS_SQL = f"""
SELECT {THREAD_COLUMNS} FROM agent_threads
WHERE user_id IS ? {{metadata}} {{after}}
ORDER BY updated_at DESC, thread_id DESC LIMIT ?
"""
LIST_THREADS_AFTER = "AND (updated_at, thread_id) < (?, ?)"
# One per metadata pair asked for; json_each reads any key, however it is spelt.
LIST_THREADS_METADATA = "AND EXISTS (SELECT 1 FROM json_each(metadata) m WHERE m.key = ? AND m.value = ?)"
THREAD_POSITION_SQL = "SELECT updated_at, thread_id FROM agent_threads WHERE thread_id = ?"
#: The only `activity` text a cursor may hold: `repr` of a float (digits, a point or an exponent).
ACTIVITY_PATTERN = re.compile(r"-?[0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?")
# Fails (no such table / column) unless the file holds every column the statements above read.
SCHEMA_CHECK_SQL = [
    f"SELECT {THREAD_COLUMNS} FROM agent_threads LIMIT 0",
    "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, metadata FROM checkpoints LIMIT 0",
]


def get_thread(cur: sqlite3.Cursor, thread_id: str, keyring: Keyring) -> ThreadRecord | None:
    """The thread's record (its title opened with `keyring`), or None."""
    return record(cur.execute(SELECT_THREAD_SQL, (thread_id,)).fetchone(), keyring)


def checkpoint_in_thread(cur: sqlite3.Cursor, thread_id: str, checkpoint_id: str) -> bool:
    """Whether `checkpoint_id` is a checkpoint of `thread_id` (root namespace)."""
    return cur.execute(CHECKPOINT_IN_THREAD_SQL, (thread_id, checkpoint_id)).fetchone() is not None


def list_checkpoints(
    cur: sqlite3.Cursor, thread_id: str, *, limit: int | None, before: str | None, keyring: Keyring
) -> list[dict]:
    """Up to `limit` rows (None: all) (`checkpoint_id`, `parent_checkpoint_id`, `metadata` dict, its message
    previews opened with `keyring`; those it does not store are left to `summaries.agent_rows`), newest first."""
    # A negative LIMIT is no limit in SQLite.
    rows = cur.execute(LIST_CHECKPOINTS_SQL, (thread_id, before, before, -1 if limit is None else limit)).fetchall()
    return [
        {"checkpoint_id": cid, "parent_checkpoint_id": parent, "metadata": summaries.agent_view(json.loads(meta), keyring.open_text)}
        for cid, parent, meta in rows
    ]


def light_previews(cur: sqlite3.Cursor, keyring: Keyring, thread_id: str, checkpoint_ids: list[str]) -> dict[str, dict]:
    """`summaries.record_previews` of the stored messages of each of the thread's checkpoints `checkpoint_ids`
    whose stored checkpoint (msgpack, maybe compressed and sealed) holds them as compact records, decoded
    without LangGraph (its serializer's extension types are left opaque); by checkpoint id. The others
    are not keys."""
    import ormsgpack  # LangGraph's msgpack library, light on its own

    found = {}
    rows = cur.execute(LIGHT_CHECKPOINTS_SQL, (thread_id, json.dumps(checkpoint_ids))).fetchall()
    for checkpoint_id, typ, payload in rows:
        if "+" in typ:
            typ, _ = typ.split("+", 1)
            payload = keyring.decrypt(payload, what="A checkpoint blob")
        typ, payload = compression.decompress(typ, payload)
        if typ != "msgpack":
            continue
        checkpoint = ormsgpack.unpackb(payload, ext_hook=lambda code, data: None, option=ormsgpack.OPT_NON_STR_KEYS)
        values = checkpoint.get("channel_values") if isinstance(checkpoint, dict) else None
        derived = summaries.record_previews(values.get("messages")) if isinstance(values, dict) else None
        if derived is not None:
            found[checkpoint_id] = derived
    return found


def threads_of_user(cur: sqlite3.Cursor, user_id: str) -> list[str]:
    """The ids of the threads `user_id` owns, sorted."""
    return [row[0] for row in cur.execute(SELECT_USER_THREADS_SQL, (user_id,))]


def list_threads(
    cur: sqlite3.Cursor,
    user_id: str | None,
    *,
    limit: int,
    before: tuple[str, str] | None,
    metadata: Mapping[str, str],
    keyring: Keyring,
) -> list[tuple[ThreadRecord, tuple[str, str]]]:
    """See `ThreadStorage.list_threads`; `activity` is `repr` of the stored REAL updated_at."""
    params: list[Any] = [user_id]
    for key, value in metadata.items():
        params += [key, value]
    if before is not None:
        # `repr` of a finite REAL, as written below; float() alone also reads "nan", "inf" and "1_000".
        try:
            activity = float(before[0]) if ACTIVITY_PATTERN.fullmatch(before[0]) else math.nan
        except ValueError:
            activity = math.nan
        if not math.isfinite(activity):
            raise InvalidRequest(f"before is not a cursor of this store: {before[0][:40]!r}")
        params += [activity, before[1]]
    params.append(limit)
    statement = LIST_THREADS_SQL.format(
        metadata=" ".join([LIST_THREADS_METADATA] * len(metadata)), after=LIST_THREADS_AFTER if before is not None else ""
    )
    return [(record(row, keyring), (repr(row[-1]), row[0])) for row in cur.execute(statement, params).fetchall()]


def thread_position(cur: sqlite3.Cursor, thread_id: str) -> tuple[str, str] | None:
    """See `ThreadStorage.thread_position`."""
    row = cur.execute(THREAD_POSITION_SQL, (thread_id,)).fetchone()
    return (repr(row[0]), row[1]) if row else None


def record(row: Sequence[Any] | None, keyring: Keyring) -> ThreadRecord | None:
    """A `ThreadRecord` from a row of `THREAD_COLUMNS` (timestamps are REAL epoch seconds in SQLite), its
    title opened with `keyring`.

    Raises:
        EncryptionKeyError: the title is sealed with a key `keyring` lacks.
    """
    if row is None:
        return None
    thread_id, user_id, head, title, metadata, count, forked_from, ttl, created, updated = row
    return ThreadRecord(
        thread_id=thread_id,
        user_id=user_id,
        head_checkpoint_id=head,
        title=keyring.open_text(title, what=f"The title of thread {thread_id!r}"),
        metadata=json.loads(metadata) if metadata else {},
        message_count=count,
        forked_from=json.loads(forked_from) if forked_from else None,
        ttl_seconds=ttl,
        created_at=_iso(created),
        updated_at=_iso(updated),
    )


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat() if epoch is not None else None


class SqliteReader:
    """Reads of an existing SQLite database on a read-only connection (`agent.storage.ThreadReads`).

    Build it with `SqliteReader.open(path, keyring)`; close it with `close()` or `with`.
    Every method raises `StorageUnavailable` when SQLite fails (a locked or
    corrupt file), and `EncryptionKeyError` on a sealed value `keyring` cannot open.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, keyring: Keyring = NO_KEYS) -> None:
        self.conn = conn
        self.path = path
        self.keyring = keyring

    @classmethod
    def open(cls, path: Path, keyring: Keyring = NO_KEYS) -> SqliteReader | None:
        """A reader of the store at `path` (sealed values opened with `keyring`), or None when its tables
        lack a column the reads need (a store of an older version: the full storage migrates it).

        Raises:
            FileNotFoundError: there is no file at `path` (nothing is created).
            StorageUnavailable: the file is not a SQLite database, or cannot be read.
        """
        path = Path(path).resolve()
        if not path.is_file():
            raise FileNotFoundError(path)
        try:
            conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False, timeout=30)
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"Cannot open SQLite database {str(path)!r}: {exc}") from None
        try:
            for statement in SCHEMA_CHECK_SQL:
                conn.execute(statement)
        except sqlite3.OperationalError:
            conn.close()
            return None
        except sqlite3.DatabaseError as exc:  # not a database, or corrupt
            conn.close()
            raise StorageUnavailable(f"Cannot read SQLite database {str(path)!r}: {exc}") from None
        return cls(conn, path, keyring)

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        with self._cursor() as cur:
            return get_thread(cur, thread_id, self.keyring)

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        with self._cursor() as cur:
            return checkpoint_in_thread(cur, thread_id, checkpoint_id)

    def list_checkpoints(self, thread_id: str, *, limit: int, before: str | None, previews: bool = True) -> list[dict]:
        with self._cursor() as cur:
            rows = list_checkpoints(cur, thread_id, limit=limit, before=before, keyring=self.keyring)
        return self.fill_previews(thread_id, rows) if previews else rows

    def fill_previews(self, thread_id: str, rows: list[dict]) -> list[dict]:
        lacking = {row["checkpoint_id"]: row["metadata"] for row in rows if summaries.lacks_previews(row["metadata"])}
        if not lacking:
            return rows
        with self._cursor() as cur:
            found = light_previews(cur, self.keyring, thread_id, list(lacking))
        for checkpoint_id, derived in found.items():
            summaries.set_missing(lacking.pop(checkpoint_id), derived)
        if lacking:  # a message stored as an object: decoded by LangGraph's serializer, imported for it only
            from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

            from agent.storage.encrypted import KeyringSerializer
            from agent.storage.sqlite.branches import stored_messages

            serde = KeyringSerializer(self.keyring, JsonPlusSerializer())
            with self._cursor() as cur:
                fetch = lambda checkpoint_ids: stored_messages(cur, serde, thread_id, checkpoint_ids)  # noqa: E731
                summaries.agent_rows([r for r in rows if r["checkpoint_id"] in lacking], fetch)
        return rows

    def threads_of_user(self, user_id: str) -> list[str]:
        with self._cursor() as cur:
            return threads_of_user(cur, user_id)

    def branch_records(self, thread_id: str) -> dict:
        from agent.storage.sqlite.branches import branch_records  # imports only sqlite3 and the records

        with self._cursor() as cur:
            return branch_records(cur, thread_id, self.keyring)

    def list_threads(self, user_id, *, limit, before, metadata):
        with self._cursor() as cur:
            return list_threads(cur, user_id, limit=limit, before=before, metadata=metadata, keyring=self.keyring)

    def thread_position(self, thread_id: str) -> tuple[str, str] | None:
        with self._cursor() as cur:
            return thread_position(cur, thread_id)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SqliteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _cursor(self) -> Iterator[sqlite3.Cursor]:
        cur = self.conn.cursor()
        try:
            yield cur
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"SQLite database {str(self.path)!r} failed: {exc}") from None
        finally:
            cur.close()
