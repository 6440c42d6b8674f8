"""`SqliteTx`: the statements of one SQLite write transaction (`transaction.Tx`), on the saver's connection.

SqliteSaver keeps channel values inside the serialized checkpoint, so the
operations that store a checkpoint's messages whole (`keep_only_head`,
`rewrite_checkpoint`) decode and re-encode the checkpoint row.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime

from agent.storage import deltas, summaries
from agent.storage.records import ThreadRecord, Turn
from agent.storage import search
from agent.storage.sqlite import branches, reads, sql
from agent.storage.sqlite.saver import TurnSqliteSaver
from agent.storage.transaction import Tx


class SqliteTx(Tx):
    """The statements of one write transaction, on the saver's connection."""

    def __init__(self, cur: sqlite3.Cursor, saver: TurnSqliteSaver) -> None:
        self.cur = cur
        self.saver = saver
        self.keyring = saver.keyring

    def write_turn(self, turn: Turn) -> None:
        self.saver.write_turn(turn)

    def upsert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title=None, metadata=None) -> None:
        now = time.time()
        self.cur.execute(
            sql.UPSERT_THREAD_SQL,
            (thread_id, user_id, head_checkpoint_id, message_count, self.keyring.seal_text(title),
             json.dumps(dict(metadata or {})), now, now),  # fmt: skip
        )

    def update_thread(self, thread_id, *, user_id, title, metadata, ttl_seconds) -> ThreadRecord | None:
        params = {
            "thread_id": thread_id,
            "user_id": user_id,
            "title": self.keyring.seal_text(title),
            "metadata": json.dumps(dict(metadata)) if metadata is not None else None,
            "ttl_seconds": ttl_seconds,
        }
        return reads.record(self.cur.execute(sql.UPDATE_THREAD_SQL, params).fetchone(), self.keyring)

    def delete_thread(self, thread_id: str) -> None:
        for statement in (*sql.DELETE_THREAD_SQL, *branches.DELETE_THREAD_SQL):
            self.cur.execute(statement, (thread_id,))

    def store_response(self, user_key, key, *, request_hash, thread_id, response, ttl_seconds) -> None:
        now = time.time()
        self.cur.execute(sql.DELETE_EXPIRED_KEY_SQL, (user_key, key, now))
        self.cur.execute(
            sql.STORE_RESPONSE_SQL,
            (user_key, key, request_hash, thread_id, json.dumps(self.keyring.seal_json(response)), now, now + ttl_seconds),
        )

    def set_head(self, thread_id: str, head_checkpoint_id: str, *, message_count: int) -> None:
        self.cur.execute(sql.SET_HEAD_SQL, (head_checkpoint_id, message_count, time.time(), thread_id))

    def insert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title, metadata, forked_from):
        now = time.time()
        forked = json.dumps(dict(forked_from)) if forked_from is not None else None
        self.cur.execute(
            sql.INSERT_THREAD_SQL,
            (thread_id, user_id, head_checkpoint_id, message_count, self.keyring.seal_text(title),
             json.dumps(dict(metadata)), forked, now, now),  # fmt: skip
        )

    def is_expired(self, thread_id: str, *, default_ttl: float | None, now: datetime | None) -> bool:
        params = {"thread_id": thread_id, "ttl": default_ttl, "now": epoch(now)}
        return self.cur.execute(sql.IS_EXPIRED_SQL, params).fetchone() is not None

    def keep_only_head(self, thread_id: str, head) -> int:
        head_id = head.config["configurable"]["checkpoint_id"]
        row = self.cur.execute(sql.SELECT_HEAD_ROW_SQL, (thread_id, head_id)).fetchone()
        if row is None:
            return 0
        type_, blob, metadata = row
        # SqliteSaver keeps channel values inside the checkpoint: store the head's messages whole
        # there (its base checkpoints are about to go, see `deltas`), and make it a root.
        checkpoint = self.saver.serde.loads_typed((type_, blob))
        messages = head.checkpoint["channel_values"].get("messages")
        if messages is not None and "messages" in checkpoint["channel_values"]:
            checkpoint["channel_values"]["messages"] = deltas.encode(list(messages), None, ())
        summary = summaries.with_fields(json.loads(metadata) if metadata is not None else {}, kept_messages=0)
        type_, blob = self.saver.serde.dumps_typed(checkpoint)
        self.cur.execute(
            sql.UPDATE_HEAD_ROW_SQL, (type_, blob, json.dumps(summary, ensure_ascii=False).encode(), thread_id, head_id)
        )
        self.cur.execute(sql.DELETE_OTHER_WRITES_SQL, (thread_id, head_id))
        removed = self.cur.execute(sql.DELETE_OTHER_ROOT_CHECKPOINTS_SQL, (thread_id, head_id)).rowcount
        self.cur.execute(sql.DELETE_OTHER_CHECKPOINT_IDS_SQL, (thread_id, head_id))
        self.cur.execute(sql.DELETE_NAMESPACED_CHECKPOINTS_SQL, (thread_id,))
        for statement in branches.KEEP_ONLY_SQL:
            self.cur.execute(statement, {"thread_id": thread_id})
        if not self.keyring.enabled:
            # The head is now the root: every message of it first appears there.
            branches.index_checkpoint(self.cur, thread_id, head_id, search.rewritten_keys(messages))
        return removed

    def thread_record(self, thread_id: str) -> ThreadRecord | None:
        return reads.get_thread(self.cur, thread_id, self.keyring)

    def thread_has_rows(self, thread_id: str) -> bool:
        return self.cur.execute(sql.THREAD_HAS_ROWS_SQL, (thread_id,)).fetchone() is not None

    def busy_threads(self, thread_ids: Sequence[str]) -> list[str]:
        now = time.time()
        return sorted(t for t in set(thread_ids) if self.cur.execute(sql.BUSY_THREAD_SQL, (t, now)).fetchone())

    def threads_of_runs(self, run_ids: Sequence[str]) -> list[str]:
        return [row[0] for row in self.cur.execute(sql.THREADS_OF_RUNS_SQL, (json.dumps(list(run_ids)),)).fetchall()]

    def copy_thread_rows(self, source_thread_id: str, target_thread_id: str) -> None:
        for statement in (*sql.COPY_THREAD_SQL, *branches.COPY_THREAD_SQL):
            self.cur.execute(statement, {"source": source_thread_id, "target": target_thread_id})

    def rewrite_checkpoint(self, thread_id, tup, *, parent_id, metadata) -> None:
        configurable = tup.config["configurable"]
        address = (thread_id, configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"])
        row = self.cur.execute(sql.SELECT_CHECKPOINT_ROW_SQL, address).fetchone()
        if row is None:
            return
        # SqliteSaver keeps channel values inside the serialized checkpoint.
        checkpoint = self.saver.serde.loads_typed(row)
        messages = tup.checkpoint["channel_values"].get("messages")
        if deltas.is_message_list(messages) and "messages" in checkpoint["channel_values"]:
            checkpoint["channel_values"]["messages"] = deltas.encode(list(messages), None, ())
        type_, blob = self.saver.serde.dumps_typed(checkpoint)
        encoded = json.dumps(dict(metadata), ensure_ascii=False).encode()
        self.cur.execute(sql.REWRITE_CHECKPOINT_SQL, (parent_id, type_, blob, encoded, *address))
        keys = search.rewritten_keys(messages)
        if not address[1] and not self.keyring.enabled and (keys or parent_id is None):
            # Its ancestors may go: its row holds every word of its messages (`search`).
            branches.index_checkpoint(self.cur, thread_id, address[2], keys)

    def delete_checkpoints(self, thread_id: str, *, keep: Sequence[tuple[str, str]]) -> None:
        params = {"thread_id": thread_id, "keep": json.dumps([list(pair) for pair in keep])}
        for statement in sql.DELETE_UNKEPT_SQL:
            self.cur.execute(statement, params)
        for statement in branches.KEEP_ONLY_SQL:
            self.cur.execute(statement, {"thread_id": thread_id})

    # -- branch records (`operations.branch_records`) --
    def label_branch(self, thread_id: str, checkpoint_id: str, label: str | None) -> None:
        self.cur.execute(branches.UPSERT_LABEL_SQL, (thread_id, checkpoint_id, self.keyring.seal_text(label)))
        self.cur.execute(branches.DROP_EMPTY_SQL, (thread_id,))

    def pin_branch(self, thread_id: str, checkpoint_id: str | None) -> None:
        self.cur.execute(branches.UNPIN_SQL, (thread_id,))
        if checkpoint_id is not None:
            self.cur.execute(branches.UPSERT_PIN_SQL, (thread_id, checkpoint_id))
        self.cur.execute(branches.DROP_EMPTY_SQL, (thread_id,))

    def archive_branch(self, thread_id: str, checkpoint_id: str, archived: bool) -> None:
        self.cur.execute(branches.UPSERT_ARCHIVED_SQL, (thread_id, checkpoint_id, int(archived)))
        self.cur.execute(branches.DROP_EMPTY_SQL, (thread_id,))

    def put_branch_records(self, thread_id: str, records) -> None:
        for r in records:
            params = (thread_id, r.checkpoint_id, self.keyring.seal_text(r.label), int(r.pinned), int(r.archived))
            self.cur.execute(branches.INSERT_BRANCH_SQL, params)

    def delete_branch_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]) -> None:
        branches.delete_checkpoints(self.cur, thread_id, checkpoint_ids)

    def index_thread(self, thread_id: str, checkpoint_ids: Sequence[str], rows: Sequence[tuple[str, list[int]]]) -> None:
        self.cur.execute(branches.UNINDEX_SQL, (thread_id, json.dumps(list(checkpoint_ids))))
        for checkpoint_id, keys in rows:
            branches.index_checkpoint(self.cur, thread_id, checkpoint_id, keys)

    def clear_search_index(self) -> None:
        self.cur.execute(branches.CLEAR_INDEX_SQL)


def epoch(now: datetime | None) -> float:
    """`now` (None: this machine's clock now) as the epoch seconds SQLite rows store."""
    return time.time() if now is None else now.timestamp()
