"""`PostgresThreadStorage`: the storage on Postgres: setup, connections, the turn protocol's hooks, the commit.

The reads live in `reads.PostgresReads` (a base class of this one), the pool
and the fault mapping in `connections`, the statements in `sql` and `schema`;
what is left here is what writes, and the two doors other code uses to run
inside the write transaction (`run`, `cursor`: long-term memory's statements
and the saver's queries join the commit that way). The why of each choice is
in the package docstring.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import psycopg
from psycopg.rows import dict_row

from agent.config import AgentSettings
from agent.errors import AgentError, LeaseExpired, StorageUnavailable
from agent.storage import staging
from agent.storage.base import ThreadStorage
from agent.storage.claims import Claim, ClaimAttempt, ClaimKeeper, UserClaim
from agent.storage.postgres import checkpoint_ids, indexes, schema, sql
from agent.storage.postgres.batch import StatementBatch, running, running_batch
from agent.storage.postgres.connections import ROLLED_BACK, SCHEMA_MISSING, PostgresConnections, first_line
from agent.storage.postgres.known_heads import KnownHead, KnownHeads, fresh
from agent.storage.postgres.reads import PostgresReads, prefixed
from agent.storage.postgres.round_trips import NoReply, bounded, unbounded
from agent.storage.postgres.saver import TurnPostgresSaver
from agent.storage.postgres.transaction import PostgresTx, to_record
from agent.storage.records import IdempotencyKeyTaken, Turn
from agent.storage.transaction import Tx
from agent.storage.turns import STEER_ROW_TTL_SECONDS

logger = logging.getLogger(__name__)


class PostgresThreadStorage(PostgresReads, ThreadStorage):
    """Postgres storage for one agent. Connects on first use; `setup()` runs then.

    `conninfo` is a `postgresql://` URL or a libpq `key=value` string; `keeper` renews its claims
    (`agent.storage.open_storage` builds both).
    """

    def __init__(self, conninfo: str, settings: AgentSettings, *, keeper: ClaimKeeper) -> None:
        super().__init__(settings, keeper=keeper)
        self.conninfo = conninfo
        self.connections = PostgresConnections(conninfo, settings)
        self.masked = self.connections.masked
        self.pool = self.connections.pool
        self.saver = TurnPostgresSaver(self, message_cache_size=settings.message_cache_size)
        #: The heads this process's turns committed, so that the next claim need not read them (`known_heads`).
        self.known_heads = KnownHeads(settings.message_cache_size)
        self._setup_lock = threading.Lock()
        self._ready = False

    # -- lifecycle ---------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:  # every claim calls this; only the first does the work
            return
        with self._setup_lock:
            if self._ready:
                return
            with self._faults("set up the database"):
                if not self.connections.reachable():
                    raise StorageUnavailable(f"{self.connections.unreachable()}; nothing was written.")
                self.pool.open(wait=False)
                with self.connection() as conn:
                    if schema.missing_tables(conn) or not schema.migrations_current(conn):
                        # No deadline: the migrations' transaction lifts statement_timeout too (`round_trips`).
                        with unbounded():
                            try:
                                schema.migrate(conn, where=self.masked)
                            except ROLLED_BACK:  # chosen as a deadlock's victim by turns running meanwhile
                                schema.migrate(conn, where=self.masked)
                        missing = schema.missing_tables(conn)
                        if missing:
                            raise StorageUnavailable(f"Could not create the tables {missing} in {self.masked}.")
                    # After the migrations' transaction: CREATE INDEX CONCURRENTLY cannot run inside one.
                    indexes.build(
                        conn,
                        schema.CONCURRENT_INDEXES,
                        connect=lambda: self.connections.connect(unlimited=True),
                        where=self.masked,
                    )
                    if checkpoint_ids.settle_duplicates(conn, self.masked):
                        owner = {checkpoint_ids.OWNER_INDEX: schema.CONCURRENT_INDEXES[checkpoint_ids.OWNER_INDEX]}
                        indexes.build(
                            conn, owner, connect=lambda: self.connections.connect(unlimited=True), where=self.masked
                        )
            self._ready = True

    def exists(self) -> bool:
        if self._ready:
            return True
        with self._faults("check the database"):
            if not self.connections.reachable():
                raise StorageUnavailable(f"{self.connections.unreachable()}.")
            self.pool.open(wait=False)  # does nothing if it is open
            with self.connection() as conn:
                return not schema.missing_tables(conn)

    def ready(self) -> bool:
        """Whether the database answers a query now, within `reply_timeout` (a check needs no statement time;
        for readiness probes). Never raises."""
        try:
            self.setup()  # outside the check's deadline: migrations take as long as they take
            with bounded(self.settings.reply_timeout):
                self._run("check the database", lambda conn: conn.execute(sql.READY_SQL).fetchone())
        except AgentError:
            return False
        return True

    def _close(self) -> None:
        self.connections.close()

    # -- connections -----------------------------------------------------------------------
    def connection(self) -> AbstractContextManager[psycopg.Connection]:
        """A pooled connection for one short piece of work (never across a model call), as a context manager.

        Every connection this storage and its saver use outside a write transaction comes from here.
        """
        return self.connections.connection()

    def run(self, action: str, work: Callable[[psycopg.Connection], Any], thread_id: str | None = None) -> Any:
        """`work(conn)` inside the write transaction running on this thread (a commit's `apply`, `transaction`),
        so its statements commit or roll back with it; else on a pooled connection of its own (`_run`: once
        more if that one was found dead). For code that keeps rows beside the checkpoints (long-term memory).

        `action` says what the work does, for the error ("Could not {action} at …").

        Raises:
            StorageUnavailable: outside a transaction, the database failed. Inside one, psycopg's error
                propagates, and the commit that runs it says what was written.
        """
        batch = running_batch()
        if batch is not None:
            return work(batch.connection())
        return self._run(action, work, thread_id)

    @contextmanager
    def cursor(self, *, pipeline: bool = False) -> Iterator[psycopg.Cursor]:
        """A cursor (binary, dict rows) on the running write transaction's connection, its batch sent so far
        (see `run`), else on a pooled connection after setup; in a pipeline if `pipeline` and none is open.

        For LangGraph's `_cursor` of the saver and the memory store.
        """
        batch = running_batch()
        if batch is None:
            self.setup()
        with nullcontext(batch.connection()) if batch is not None else self.connection() as conn:
            nested = pipeline and conn.info.pipeline_status == psycopg.pq.PipelineStatus.OFF
            with conn.pipeline() if nested else nullcontext(), conn.cursor(binary=True, row_factory=dict_row) as cur:
                yield cur

    def _run(self, action: str, work: Callable[[psycopg.Connection], Any], thread_id: str | None = None) -> Any:
        """`work(conn)` on a pooled connection; run once more if the first was found dead (on a fresh
        one), or if a table was missing (after re-creating it).

        Only for work that is safe to repeat (reads, claims with their token).
        """
        self.setup()
        with self._faults(action, thread_id):
            for attempt in (1, 2):
                repair = False
                with self.connection() as conn:
                    try:
                        return work(conn)
                    except ROLLED_BACK:
                        # A deadlock or serialization failure (with a concurrent setup's DDL): rolled back, retry.
                        if attempt == 2:
                            raise
                    except NoReply:
                        # No retry: another connection to a server that does not answer would wait as long.
                        self.connections.suspect_down = True
                        raise
                    except psycopg.OperationalError:
                        if attempt == 2 or not conn.closed:
                            raise
                        # The server restarted or ended the session: drop every dead idle connection.
                        self.connections.discard_dead()
                    except SCHEMA_MISSING as exc:
                        if attempt == 2:
                            raise
                        logger.warning("%s at %s; re-creating the agent's tables", first_line(exc), self.masked)
                        repair = True
                if repair:
                    self._ready = False
                    self.setup()
        raise AssertionError("unreachable")

    def faults(self, action: str, thread_id: str | None = None) -> AbstractContextManager[None]:
        """psycopg's errors inside the block as `StorageUnavailable` saying what could not be done (`action`);
        for the saver's reads outside a write transaction (`TurnPostgresSaver._read_faults`)."""
        return self._faults(action, thread_id)

    def _faults(self, action: str, thread_id: str | None = None) -> AbstractContextManager[None]:
        """`PostgresConnections.faults`; a missing table makes the next request run setup again."""
        return self.connections.faults(action, thread_id, on_schema_missing=self._forget_setup)

    def _forget_setup(self) -> None:
        self._ready = False

    # -- the turn protocol -----------------------------------------------------------------
    def _try_claim(
        self, thread_id, token, *, user_id, checkpoint_id, idempotency_key, read_start=True, queue=False, user_claim=None
    ):
        known = self.known_heads.get(thread_id) if read_start else None

        def attempt(conn: psycopg.Connection):
            row = conn.cursor(binary=True).execute(sql.CLAIM_TURN_SQL, (
                thread_id, token, user_id, self.settings.lease_seconds, idempotency_key, checkpoint_id, read_start,
                queue, user_claim, known.checkpoint_id if known else None, known.xmin if known else None,
            )).fetchone()  # fmt: skip
            record_row = prefixed(row, "t_")
            if row["claim_fence"] is not None and row["missing_privileges"]:
                # Given up as `try_release` would: a new thread's claim leaves no row behind.
                conn.execute(sql.DROP_CLAIM_SQL if record_row is None else sql.RELEASE_CLAIM_SQL, (thread_id, token))
                raise StorageUnavailable(
                    f"The database role may not write the conversation ({', '.join(row['missing_privileges'])}) "
                    f"at {self.connections.masked}; nothing was written and the model was not called."
                )
            return row["claim_fence"], row["user_being_deleted"], record_row, prefixed(row, "s_"), row["known_start"]

        fence, user_being_deleted, record_row, start_row, known_start = self._run("claim the thread", attempt, thread_id)
        try:
            record = to_record(record_row, self.keyring)
        except BaseException:  # a title sealed with a key the keyring lacks: the committed claim is given back
            if fence is not None:
                release = lambda conn: conn.execute(sql.RELEASE_CLAIM_SQL, (thread_id, token))  # noqa: E731
                self._run("release the thread", release, thread_id)
            raise
        if fence is None:
            return ClaimAttempt(None, record, user_being_deleted)
        claim = Claim(thread_id=thread_id, user_id=user_id, token=token, fence=fence, record=record, start=None,
                      idempotency_key=idempotency_key)  # fmt: skip
        if known_start:
            claim.start = fresh(known.tup)
            return ClaimAttempt(claim, record)
        if known is not None and fence is not None:
            self.known_heads.forget(thread_id)  # no longer the start: moved, rewritten, or waited on
        try:
            with self._faults("read the thread", thread_id):
                claim.start = self.saver.load_row(start_row) if start_row else None
        except BaseException:  # stored rows that cannot be read: the committed claim is given back, not held a lease
            self.release(claim)
            raise
        return ClaimAttempt(claim, record)

    def _leave_queue(self, thread_id: str, token: str) -> None:
        self._run("leave the thread's queue", lambda conn: conn.execute(sql.LEAVE_QUEUE_SQL, (thread_id, token)))

    def _commit(self, claim: Claim, apply: Callable[[Tx], None]) -> None:
        thread_id = claim.thread_id
        self.setup()
        self.known_heads.forget(thread_id)  # whatever this commit does, the head it knew is not known to stay
        for attempt in (1, 2):
            with self._faults("commit the turn", thread_id):
                conn = self.connections.checkout_live()
            staged = staging.Staged()  # the scope's below: published only once the commit landed
            try:
                with staging.scope() as staged:
                    batch = StatementBatch(conn)
                    batch.execute(sql.END_CLAIM_SQL, (thread_id, claim.token))
                    tx = PostgresTx(batch, self.saver)
                    with running(batch):
                        apply(tx)
                    turn = tx.committed_turn()
                    if turn is None or turn.thread_id != thread_id:
                        batch.commit()
                        staged.publish()
                        return
                    xmin = batch.commit(returning=(sql.HEAD_XMIN_SQL, (thread_id, turn.new_head)))
                    staged.publish()
                self._know_head(turn, xmin)
                return
            except psycopg.Error as exc:
                if exc.sqlstate == sql.CLAIM_LOST_SQLSTATE:
                    raise LeaseExpired(
                        f"The turn's claim on thread {thread_id!r} expired and another turn took the thread; "
                        "nothing was written.",
                        thread_id=thread_id,
                    ) from None
                if isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.constraint_name == sql.IDEMPOTENCY_PKEY:
                    raise IdempotencyKeyTaken(thread_id) from None
                refused = checkpoint_ids.taken(exc, thread_id)
                if refused is not None:
                    raise refused from None
                # A statement over statement_timeout_ms (QueryCanceled) is no lost connection: the server
                # rolled the commit back and said so.
                if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.errors.QueryCanceled):
                    with self._faults("commit the turn", thread_id):
                        raise
                self.connections.suspect_down = True
                # An unanswered commit may still be delivered later: its claim is taken back, so that it
                # never lands (`round_trips`), and it is not sent again.
                unanswered = isinstance(exc, NoReply)
                landed = self._commit_landed(claim, take_back=unanswered)
                if landed:
                    staged.publish()
                    return
                if landed is False and attempt == 1 and not unanswered:
                    self.pool.check()
                    continue  # nothing was written and the claim is still ours: commit again
                outcome = (
                    "nothing was written; the request can be retried"
                    if landed is False
                    else "the database could not be asked whether the turn was saved; "
                    "list the thread's history before retrying"
                )
                raise StorageUnavailable(
                    f"Lost the connection to {self.connections.masked} while committing: {first_line(exc)}; {outcome}.",
                    thread_id=thread_id,
                ) from None
            finally:
                self.connections.checkin(conn)

    def _know_head(self, turn: Turn, xmin: str | None) -> None:
        """Keep the head `turn` committed (row version `xmin`) for the thread's next claim (`known_heads`)."""
        if xmin is None:
            return
        try:
            tup = self.saver.committed_head(turn)
        except Exception:  # noqa: BLE001 - only a read saved: the next claim reads the start
            logger.debug("Could not keep the head of thread %r", turn.thread_id, exc_info=True)
            return
        if tup is not None:
            self.known_heads.put(turn.thread_id, KnownHead(turn.new_head, xmin, tup))

    def _commit_landed(self, claim: Claim, *, take_back: bool = False) -> bool | None:
        """After a commit's connection failed: True if it committed, False if not, None if that cannot be known.
        With `take_back` (the commit went unanswered, and may still arrive), False also means it never will:
        the claim was released first (dropped, for a new thread), so the commit's fencing check fails.

        Asks on a new connection of its own: the pool's idle connections may be as dead as the one that failed.
        """
        release = sql.DROP_CLAIM_SQL if claim.record is None else sql.RELEASE_CLAIM_SQL
        try:
            with self.connections.connect() as conn:
                if take_back and conn.execute(release, (claim.thread_id, claim.token)).rowcount == 1:
                    return False
                row = conn.execute(sql.CLAIM_STATE_SQL, (claim.thread_id,)).fetchone()
        except psycopg.Error:
            return None
        if row is None:
            return None
        if row["token"] == claim.token:
            return False  # still claimed by this turn: the commit did not happen
        if row["token"] == "" and row["fence"] == claim.fence:
            return True  # released by this turn's commit, and nobody claimed it since
        return None

    def try_release(self, claim: Claim) -> None:
        statement = sql.DROP_CLAIM_SQL if claim.record is None else sql.RELEASE_CLAIM_SQL
        self._run("release the thread", lambda conn: conn.execute(statement, (claim.thread_id, claim.token)))

    def _request_cancel(self, thread_id: str, mode: str) -> None:
        self._run("ask the running turn to stop", lambda conn: conn.execute(sql.REQUEST_CANCEL_SQL, (mode, thread_id)))

    def _offer_steer(self, thread_id: str, token: str, steer: tuple[str, bytes]) -> str | None:
        params = {"thread_id": thread_id, "token": token, "type": steer[0], "payload": steer[1]}
        row = self._run("offer messages to the running turn", lambda conn: conn.execute(sql.OFFER_STEER_SQL, params).fetchone())
        return None if row is None else row["target"]

    def steered_messages(self, thread_id: str, target: str) -> list[tuple[str, str, bytes]]:
        rows = self._run(
            "read the messages offered to the turn",
            lambda conn: conn.execute(sql.STEERED_MESSAGES_SQL, (thread_id, target)).fetchall(),
        )
        return [(row["token"], row["type"], bytes(row["payload"])) for row in rows]

    def _drop_steer(self, thread_id: str, token: str) -> None:
        params = (thread_id, token, STEER_ROW_TTL_SECONDS)
        self._run("delete the offered messages", lambda conn: conn.execute(sql.DROP_STEER_SQL, params))

    def renew(self, claims: Sequence[Claim]) -> dict[str, str | None]:
        params = (self.settings.lease_seconds, [c.thread_id for c in claims], [c.token for c in claims])
        rows = self._run("renew claims", lambda conn: conn.execute(sql.RENEW_CLAIMS_SQL, params).fetchall())
        return {row["thread_id"]: row["cancel"] for row in rows}

    def poll_cancels(self, claims: Sequence[Claim]) -> dict[str, str]:
        params = ([c.thread_id for c in claims], [c.token for c in claims])
        rows = self._run("poll cancel requests", lambda conn: conn.execute(sql.POLL_CANCELS_SQL, params).fetchall())
        return {row["thread_id"]: row["cancel"] for row in rows}

    def _claim_user(self, held: UserClaim, seconds: float) -> bool:
        params = {"user_id": held.user_id, "token": held.token, "seconds": seconds}

        def claim_user(conn: psycopg.Connection) -> bool:
            with conn.transaction():
                conn.execute(sql.LOCK_USER_SQL, (schema.USER_LOCK_CLASS, held.user_id))
                return conn.execute(sql.CLAIM_USER_SQL, params).fetchone() is not None

        return self._run("hold the user's data", claim_user)

    def _release_user(self, held: UserClaim) -> None:
        self._run("release the user's data", lambda conn: conn.execute(sql.RELEASE_USER_SQL, (held.user_id, held.token)))

    def claimed_threads_of_user(self, user_id: str) -> list[str]:
        rows = self._run(
            "list the user's running turns", lambda conn: conn.execute(sql.CLAIMED_THREADS_OF_USER_SQL, (user_id,)).fetchall()
        )
        return [row["thread_id"] for row in rows]

    def sweep_idempotency(self) -> int:
        return self._run("delete expired idempotency keys", lambda conn: conn.execute(sql.SWEEP_IDEMPOTENCY_SQL).rowcount)

    def transaction(self, apply: Callable[[Tx], Any]) -> Any:
        self.setup()
        with self._faults("write to the database"), self.connection() as conn, staging.scope() as staged:
            session = conn.info.backend_pid
            batch = StatementBatch(conn, long_statements=True)
            with running(batch):
                result = apply(PostgresTx(batch, self.saver))
            try:
                batch.commit()
            except psycopg.OperationalError as exc:
                if isinstance(exc, psycopg.errors.QueryCanceled):
                    raise  # statement_timeout_ms: the server rolled the transaction back and said so
                raise self._unknown_commit(session, exc) from None
            staged.publish()
            return result

    def _unknown_commit(self, session: int, exc: psycopg.OperationalError) -> StorageUnavailable:
        """The error of a write transaction (`transaction`) whose `COMMIT` was sent and never answered (`NoReply`)
        or whose connection was lost meanwhile: the server may or may not have committed it. Its session
        (backend pid `session`) is ended first on a new connection, so that a `COMMIT` a silent network still
        holds cannot land after the caller was told; a turn's commit is settled by its claim instead (`_commit`).
        """
        self.connections.suspect_down = True
        try:
            with self.connections.connect() as other:
                # No row: the session is gone already. False: it did not end within reply_timeout.
                ended = other.execute(
                    "SELECT pg_terminate_backend(pid, %s) AS ended FROM pg_stat_activity WHERE pid = %s",
                    (max(1, round(self.settings.reply_timeout * 1000)), session),
                ).fetchone()
            later = "it cannot be saved later" if ended is None or ended["ended"] else "it may still be saved later"
        except psycopg.Error:
            later = "the database could not be asked, so it may still be saved later"
        return StorageUnavailable(
            f"Lost the connection to {self.connections.masked} while committing: {first_line(exc)}; whether the "
            f"change was saved is not known ({later}): read it back before retrying."
        )
