"""`PostgresTx`: the statements of one Postgres write transaction (`transaction.Tx`), on its statement batch.

Writes are added to the batch (`batch.StatementBatch`) and sent with the
commit, in its one round trip; a statement whose result is needed
(`update_thread`, `is_expired`, the saver's thread operations' reads) sends
what is pending first, inside the same transaction, so statements run in the
order they were given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Json, Jsonb

from agent.encryption import Keyring
from agent.storage import deltas, search, summaries
from agent.storage.postgres import branches, sql
from agent.storage.postgres.batch import StatementBatch
from agent.storage.postgres.saver import TurnPostgresSaver
from agent.storage.records import ThreadRecord, Turn
from agent.storage.transaction import Tx


def to_record(row: Mapping[str, Any] | None, keyring: Keyring) -> ThreadRecord | None:
    """A `ThreadRecord` from a row of `sql.THREAD_COLUMNS`, its title opened with `keyring`; or None.

    Raises:
        EncryptionKeyError: the title is sealed with a key `keyring` lacks.
    """
    if not row:
        return None
    title = keyring.open_text(row["title"], what=f"The title of thread {row['thread_id']!r}")
    return ThreadRecord(**{**row, "title": title})


class PostgresTx(Tx):
    """The statements of one write transaction: writes join its batch, reads send the batch first."""

    def __init__(self, batch: StatementBatch, saver: TurnPostgresSaver) -> None:
        self.batch = batch
        self.saver = saver
        self.keyring = saver.keyring
        #: The turn written here and the head it was given (`upsert_thread`), when that is all that moved a head.
        self.turn: Turn | None = None
        self.head: tuple[str, str] | None = None
        self._other_writes = False

    def committed_turn(self) -> Turn | None:
        """The turn this transaction wrote, when it set its thread's head to the turn's last checkpoint and
        nothing else here wrote a checkpoint or moved a head (`PostgresThreadStorage`, "Known heads")."""
        turn = self.turn
        if turn is None or self._other_writes or self.head != (turn.thread_id, turn.new_head):
            return None
        return turn

    def write_turn(self, turn: Turn) -> None:
        self._other_writes = self._other_writes or self.turn is not None
        self.turn = turn
        self.saver.write_turn(turn)

    def upsert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title=None, metadata=None) -> None:
        self._other_writes = self._other_writes or self.head is not None
        self.head = (thread_id, head_checkpoint_id)
        self.batch.execute(
            sql.UPSERT_THREAD_SQL,
            (thread_id, user_id, head_checkpoint_id, message_count, self.keyring.seal_text(title), Jsonb(dict(metadata or {}))),
        )

    def update_thread(self, thread_id, *, user_id, title, metadata, ttl_seconds) -> ThreadRecord | None:
        self._other_writes = True
        params = {
            "thread_id": thread_id,
            "user_id": user_id,
            "title": self.keyring.seal_text(title),
            "metadata": Jsonb(dict(metadata)) if metadata is not None else None,
            "ttl_seconds": ttl_seconds,
        }
        return to_record(self.batch.read(sql.UPDATE_THREAD_SQL, params).fetchone(), self.keyring)

    def delete_thread(self, thread_id: str) -> None:
        self._other_writes = True
        for statement in (*sql.DELETE_THREAD_SQL, *branches.DELETE_THREAD_SQL):
            self.batch.execute(statement, (thread_id,))
        self.batch.execute(sql.DELETE_RELEASED_CLAIM_SQL, (thread_id,))

    def store_response(self, user_key, key, *, request_hash, thread_id, response, ttl_seconds) -> None:
        self.batch.execute(sql.DELETE_EXPIRED_KEY_SQL, (user_key, key))
        stored = Json(self.keyring.seal_json(response))
        self.batch.execute(sql.STORE_RESPONSE_SQL, (user_key, key, request_hash, thread_id, stored, ttl_seconds))

    def set_head(self, thread_id: str, head_checkpoint_id: str, *, message_count: int) -> None:
        self._other_writes = True
        self.batch.execute(sql.SET_HEAD_SQL, (head_checkpoint_id, message_count, thread_id))

    def insert_thread(self, thread_id, *, user_id, head_checkpoint_id, message_count, title, metadata, forked_from):
        self._other_writes = True
        forked = Jsonb(dict(forked_from)) if forked_from is not None else None
        self.batch.execute(
            sql.INSERT_THREAD_SQL,
            (thread_id, user_id, head_checkpoint_id, message_count, self.keyring.seal_text(title), Jsonb(dict(metadata)), forked),
        )

    def is_expired(self, thread_id: str, *, default_ttl: float | None, now: datetime | None) -> bool:
        params = {"thread_id": thread_id, "ttl": default_ttl, "now": now}
        return self.batch.read(sql.IS_EXPIRED_SQL, params).fetchone() is not None

    def keep_only_head(self, thread_id: str, head) -> int:
        self._other_writes = True
        head_id = head.config["configurable"]["checkpoint_id"]
        messages = head.checkpoint["channel_values"].get("messages")
        version = head.checkpoint["channel_versions"].get("messages")
        if messages is not None and version is not None:
            # Whole: its base checkpoints are about to go (see `deltas`).
            blob = self.saver.dump_messages_whole(messages)
            self.batch.execute(sql.REWRITE_BLOB_SQL, (*blob, thread_id, "", str(version)))
            self.batch.execute(sql.REWRITE_INLINE_SQL, (*blob, thread_id, "", head_id))
        params = {"thread_id": thread_id, "head": head_id}
        self.batch.execute(sql.DELETE_OTHER_WRITES_SQL, params)
        self.batch.execute(sql.DELETE_OTHER_BLOBS_SQL, params)
        removed = self.batch.read(sql.DELETE_OTHER_CHECKPOINTS_SQL, params).fetchone()["removed"]
        self.batch.execute(sql.MAKE_ROOT_SQL, params)
        for statement in branches.KEEP_ONLY_SQL:
            self.batch.execute(statement, params)
        if not self.keyring.enabled:
            # The head is now the root: every message of it first appears there.
            params = {"thread_id": thread_id, "checkpoint_id": head_id, "terms": search.rewritten_keys(messages)}
            self.batch.execute(branches.INDEX_MESSAGES_SQL, params)
        return int(removed)

    def thread_record(self, thread_id: str) -> ThreadRecord | None:
        return to_record(self.batch.read(sql.SELECT_THREAD_SQL, (thread_id,)).fetchone(), self.keyring)

    def thread_has_rows(self, thread_id: str) -> bool:
        return self.batch.read(sql.THREAD_HAS_ROWS_SQL, (thread_id,)).fetchone() is not None

    def busy_threads(self, thread_ids: Sequence[str]) -> list[str]:
        return [row["thread_id"] for row in self.batch.read(sql.BUSY_THREADS_SQL, (list(thread_ids),)).fetchall()]

    def threads_of_runs(self, run_ids: Sequence[str]) -> list[str]:
        return [row["thread_id"] for row in self.batch.read(sql.THREADS_OF_RUNS_SQL, (list(run_ids),)).fetchall()]

    def copy_thread_rows(self, source_thread_id: str, target_thread_id: str) -> None:
        self._other_writes = True
        for statement in (*sql.COPY_THREAD_SQL, *branches.COPY_THREAD_SQL):
            self.batch.execute(statement, {"source": source_thread_id, "target": target_thread_id})

    def rewrite_checkpoint(self, thread_id, tup, *, parent_id, metadata) -> None:
        self._other_writes = True
        configurable = tup.config["configurable"]
        ns, checkpoint_id = configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"]
        messages = tup.checkpoint["channel_values"].get("messages")
        version = tup.checkpoint["channel_versions"].get("messages")
        if deltas.is_message_list(messages) and version is not None:
            blob = self.saver.dump_messages_whole(messages)
            self.batch.execute(sql.REWRITE_BLOB_SQL, (*blob, thread_id, ns, str(version)))
            self.batch.execute(sql.REWRITE_INLINE_SQL, (*blob, thread_id, ns, checkpoint_id))
        self.batch.execute(sql.REPARENT_SQL, (parent_id, Jsonb(summaries.as_text(metadata)), thread_id, ns, checkpoint_id))
        keys = search.rewritten_keys(messages)
        if not ns and not self.keyring.enabled and (keys or parent_id is None):
            # Its ancestors may go: its row holds every word of its messages (`search`).
            self.batch.execute(branches.INDEX_MESSAGES_SQL, {"thread_id": thread_id, "checkpoint_id": checkpoint_id, "terms": keys})

    def delete_checkpoints(self, thread_id: str, *, keep: Sequence[tuple[str, str]]) -> None:
        self._other_writes = True
        params = {"thread_id": thread_id, "ns": [ns for ns, _ in keep], "ids": [cid for _, cid in keep]}
        for statement in sql.DELETE_UNKEPT_SQL:
            self.batch.execute(statement, params)
        for statement in branches.KEEP_ONLY_SQL:
            self.batch.execute(statement, {"thread_id": thread_id})

    # -- branch records (`operations.branch_records`) --
    def label_branch(self, thread_id: str, checkpoint_id: str, label: str | None) -> None:
        self.batch.execute(branches.UPSERT_LABEL_SQL, (thread_id, checkpoint_id, self.keyring.seal_text(label)))
        self.batch.execute(branches.DROP_EMPTY_SQL, (thread_id,))

    def pin_branch(self, thread_id: str, checkpoint_id: str | None) -> None:
        self.batch.execute(branches.UNPIN_SQL, (thread_id,))
        if checkpoint_id is not None:
            self.batch.execute(branches.UPSERT_PIN_SQL, (thread_id, checkpoint_id))
        self.batch.execute(branches.DROP_EMPTY_SQL, (thread_id,))

    def archive_branch(self, thread_id: str, checkpoint_id: str, archived: bool) -> None:
        self.batch.execute(branches.UPSERT_ARCHIVED_SQL, (thread_id, checkpoint_id, archived))
        self.batch.execute(branches.DROP_EMPTY_SQL, (thread_id,))

    def put_branch_records(self, thread_id: str, records) -> None:
        for r in records:
            params = (thread_id, r.checkpoint_id, self.keyring.seal_text(r.label), r.pinned, r.archived)
            self.batch.execute(branches.INSERT_BRANCH_SQL, params)

    def index_thread(self, thread_id: str, checkpoint_ids: Sequence[str], rows: Sequence[tuple[str, list[int]]]) -> None:
        self.batch.execute(branches.UNINDEX_SQL, {"thread_id": thread_id, "ids": list(checkpoint_ids)})
        for checkpoint_id, keys in rows:
            self.batch.execute(branches.INDEX_MESSAGES_SQL, {"thread_id": thread_id, "checkpoint_id": checkpoint_id, "terms": keys})

    def clear_search_index(self) -> None:
        self.batch.execute(branches.CLEAR_INDEX_SQL)

    def delete_branch_checkpoints(self, thread_id: str, checkpoint_ids: Sequence[str]) -> None:
        params = {"thread_id": thread_id, "ids": list(checkpoint_ids)}
        for statement in branches.DELETE_CHECKPOINTS_SQL:
            self.batch.execute(statement, params)
