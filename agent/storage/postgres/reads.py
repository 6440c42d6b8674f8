"""`PostgresReads`: the reads of the Postgres storage (thread records, checkpoints, the catalogue, usage).

A base class of `storage.PostgresThreadStorage`, apart so that each reads on
its own (langgraph-checkpoint-postgres cuts its saver the same way: a base with
the statements, thin classes doing I/O). Every read is one statement
(`sql`), run by the storage's `_run`: once more on a fresh connection if the
first was found dead, or after re-creating a missing table. Checkpoint rows
are turned into `CheckpointTuple`s by the saver (`load_row`), messages resolved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agent.encryption import Keyring
from agent.errors import InvalidRequest
from agent.storage import search, summaries
from agent.storage.postgres import branches, sql
from agent.storage.postgres.saver import TurnPostgresSaver
from agent.storage.postgres.transaction import to_record
from agent.storage.records import BranchRecord, CheckpointLink, SearchCandidate, ExpiredThread, IdempotencyState, ThreadRecord


def prefixed(row: Mapping[str, Any], prefix: str) -> dict[str, Any] | None:
    """The columns of `row` named `prefix…`, without the prefix; None when their first one is NULL (no such row)."""
    values = {name[len(prefix):]: value for name, value in row.items() if name.startswith(prefix)}
    return values if next(iter(values.values())) is not None else None


class PostgresReads:
    """The `ThreadStorage` reads on Postgres, over the storage's `_run` and `_faults` (see the module docstring)."""

    saver: TurnPostgresSaver
    keyring: Keyring
    _run: Callable[..., Any]
    _faults: Callable[..., Any]

    def _read(self, thread_id: str | None, query: str, params: tuple) -> list[dict]:
        return self._run("read from the database", lambda conn: conn.execute(query, params).fetchall(), thread_id)

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        rows = self._read(thread_id, sql.SELECT_THREAD_SQL, (thread_id,))
        return to_record(rows[0], self.keyring) if rows else None

    def checkpoint_in_thread(self, thread_id: str, checkpoint_id: str) -> bool:
        return bool(self._read(thread_id, sql.CHECKPOINT_IN_THREAD_SQL, (thread_id, checkpoint_id)))

    def get_checkpoint(self, thread_id: str, checkpoint_id: str):
        def read(conn: psycopg.Connection):
            return conn.cursor(binary=True).execute(sql.SELECT_CHECKPOINT_SQL, (thread_id, checkpoint_id, thread_id)).fetchone()

        row = self._run("read a checkpoint", read, thread_id)
        with self._faults("read a checkpoint", thread_id):
            return self.saver.load_row(row) if row else None

    def get_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]):
        def read(conn: psycopg.Connection):
            return conn.cursor(binary=True).execute(sql.SELECT_SOME_CHECKPOINTS_SQL, (thread_id, list(checkpoint_ids))).fetchall()

        rows = self._run("read checkpoints", read, thread_id)
        with self._faults("read checkpoints", thread_id):
            # Oldest first: each resolved message list is cached before its children need it.
            return [self.saver.load_row(row) for row in sorted(rows, key=lambda row: row["checkpoint_id"])]

    def list_checkpoints(self, thread_id: str, *, limit: int | None, before: str | None, previews: bool = True) -> list[dict]:
        rows = self._read(thread_id, sql.LIST_CHECKPOINTS_SQL, (thread_id, before, before, limit))  # LIMIT NULL: all
        rows = [{**row, "metadata": summaries.agent_view(row["metadata"], self.keyring.open_text)} for row in rows]
        return self.fill_previews(thread_id, rows) if previews else rows

    def fill_previews(self, thread_id: str, rows: list[dict]) -> list[dict]:
        return self.saver.agent_rows(thread_id, rows)  # its read raises StorageUnavailable on a fault

    def task_paths(self, thread_id: str, checkpoint_id: str) -> dict[str, str]:
        rows = self._read(thread_id, sql.TASK_PATHS_SQL, (thread_id, checkpoint_id))
        return {row["task_id"]: row["task_path"] for row in rows}

    def checkpoint_links(self, thread_id: str) -> list[CheckpointLink]:
        return [CheckpointLink(**row) for row in self._read(thread_id, sql.CHECKPOINT_LINKS_SQL, (thread_id,))]

    def branch_records(self, thread_id: str) -> dict[str, BranchRecord]:
        rows = self._read(thread_id, branches.SELECT_BRANCHES_SQL, (thread_id,))
        return {
            row["checkpoint_id"]: BranchRecord(
                row["checkpoint_id"],
                self.keyring.open_text(row["label"]) if row["label"] is not None else None,
                row["pinned"],
                row["archived"],
            )
            for row in rows
        }

    def search_candidates(self, user_id: str | None, words: list[str]) -> list[SearchCandidate]:
        params = {"keys": search.query_keys(words), "user_id": user_id}
        return [SearchCandidate(**row) for row in self._read(None, branches.SEARCH_SQL, params)]

    def unindexed_threads(self, after: str | None, limit: int) -> list[str]:
        params = {"after": after or "", "limit": limit}
        return [row["thread_id"] for row in self._read(None, branches.UNINDEXED_SQL, params)]

    def threads_of_user(self, user_id: str) -> list[str]:
        return [row["thread_id"] for row in self._read(None, sql.SELECT_USER_THREADS_SQL, (user_id,))]

    def thread_of_checkpoint(self, checkpoint_id: str) -> str | None:
        rows = self._read(None, sql.THREAD_OF_CHECKPOINT_SQL, {"checkpoint_id": checkpoint_id})
        return rows[0]["thread_id"] if rows else None

    def list_threads(self, user_id, *, limit, before, metadata):
        params = {"user_id": user_id, "metadata": Jsonb(dict(metadata)), "limit": limit}
        if before is not None:
            params["activity"], params["thread_id"] = before
            # Exactly the text THREAD_COLUMNS writes: Python reads forms Postgres's timestamptz does not
            # (a week date, 2024-W01-1), and those would fail the query.
            try:
                ok = sql.ACTIVITY_PATTERN.fullmatch(params["activity"]) is not None
                ok = ok and datetime.fromisoformat(params["activity"]) is not None
            except ValueError:  # e.g. month 13
                ok = False
            if not ok:
                raise InvalidRequest(f"before is not a cursor of this store: {params['activity'][:40]!r}")
        rows = self._read(None, sql.LIST_THREADS_SQLS[user_id is None, before is not None], params)
        # updated_at is already the exact text of the stored timestamp (THREAD_COLUMNS).
        return [(to_record(row, self.keyring), (row["updated_at"], row["thread_id"])) for row in rows]

    def thread_position(self, thread_id: str) -> tuple[str, str] | None:
        rows = self._read(thread_id, sql.THREAD_POSITION_SQL, (thread_id,))
        return (rows[0]["activity"], rows[0]["thread_id"]) if rows else None

    def token_usage(self, thread_id: str, checkpoint_id: str) -> tuple[dict[str, int], dict[str, int] | None] | None:
        [row] = self._read(thread_id, sql.TOKEN_USAGE_SQL, (checkpoint_id, checkpoint_id, thread_id))
        if not row["found"]:
            return None
        thread = {"input_tokens": int(row["input_tokens"]), "output_tokens": int(row["output_tokens"])}
        return thread, summaries.unpack(row["metadata"]).get("branch_usage")

    # -- idempotency and retention ------------------------------------------------------------
    def find_idempotent(self, user_key: str, key: str, claim_key: str) -> IdempotencyState:
        # The claim first, then the result: each statement reads its own snapshot, and the commit that
        # stores the result releases the claim, so "no claim, then no result" means nothing ran with the
        # key. In the other order a commit between the two reads looked like neither, and a retry ran the
        # model a second time (then answered the stored result; a suite run saw it once).
        def read(conn: psycopg.Connection):
            with conn.pipeline():
                running = conn.execute(sql.RUNNING_WITH_KEY_SQL, (claim_key,))
                stored = conn.execute(sql.FIND_IDEMPOTENCY_SQL, (user_key, key))
            return stored.fetchone(), running.fetchone()

        stored, running = self._run("look up the idempotency key", read)
        return IdempotencyState(
            request_hash=stored["request_hash"] if stored else None,
            thread_id=stored["thread_id"] if stored else None,
            response=self.keyring.open_json(stored["response"], what="A stored response") if stored else None,
            running_thread_id=running["thread_id"] if running else None,
        )

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
        rows = self._read(None, sql.EXPIRED_THREADS_SQL, params)
        return [ExpiredThread(row["thread_id"], row["user_id"], (row["updated_at"], row["thread_id"])) for row in rows]
