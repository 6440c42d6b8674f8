"""Postgres backend: `psycopg_pool.ConnectionPool` + LangGraph's `PostgresSaver`, with the turn protocol of `storage.turns`.

Modules, in the shape of langgraph-checkpoint-postgres (statements and
migrations apart, thin I/O modules): `migrations` (the agent's migrations, a
migration's position its version), `schema` (setup's apply), `sql` (every statement as a named
constant), `checkpoint_ids` (the unique index that makes a checkpoint id name one
thread), `indexes` (indexes built `CONCURRENTLY` after setup's transaction),
`batch` (the commit's statements in one round trip), `known_heads` (the heads this
process committed, so its next claim on a thread need not read them back), `connections`
(the pool, credentials, and faults as `StorageUnavailable`), `round_trips` (the deadline on
every wait for the server, and TCP keepalives), `saver`
(`TurnPostgresSaver`), `transaction` (`PostgresTx`), `reads` and `storage`
(`PostgresThreadStorage`).

Design notes:

* **Short transactions only.** A turn uses a pooled connection twice: one
  statement to claim its thread and read its start (`agent_claim_turn`), and
  one query to commit: `BEGIN`, the fencing check, every write and `COMMIT`,
  bound on the client and sent together (`batch`: psycopg's pipeline
  spent 0.4 ms more client CPU on the same statements). Nothing is held while
  the model runs, so `pool_max_size` bounds concurrent *database work*, not
  concurrent turns.
* **Plans cached without prepared statements.** Without prepared statements
  (next point) Postgres plans every statement again, and planning was about
  half of a turn's database time: the claim's four statements took 1.6 ms
  unprepared against 0.7 ms prepared (the start read alone plans in 0.3 ms and
  runs in 0.1 ms). So the claim (`agent_claim_turn`), the fencing check
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
* **Schema.** `setup()` first only reads: when every table exists, every
  migration table is up to date and every index valid, it writes nothing, so
  an application role without DDL rights and a read-only replica pass it
  (their turns then fail at the claim, with the cause). Otherwise it runs
  LangGraph's migration lists (the checkpointer's, and the store's that
  long-term memory uses) and the agent's (`migrations.MIGRATIONS`, a migration's
  position is its version) in ONE transaction under `pg_advisory_xact_lock`:
  safe from many processes at once and through PgBouncer. An index created
  `CONCURRENTLY` (LangGraph's, and the agent's checkpoint-id indexes) cannot be
  built in a transaction: on a table that transaction creates it is built
  inside it without `CONCURRENTLY` (instant on an empty table), on an existing
  table after it, concurrently, and an INVALID one an interrupted build left
  is built again (`indexes`). A missing table (dropped by hand) makes it
  re-apply every (idempotent) migration: trusting the migrations table alone
  left a database broken for good. A running agent that finds a table missing
  re-creates it the same way and runs the request again.
* **Checkpoint ids name one thread**, by a unique index over the rows that are
  no copy (`checkpoint_ids`), not by a read before the write.
* **A statement timeout on every connection** (`statement_timeout_ms`, the
  libpq option `-c statement_timeout=…`, `connections.with_statement_timeout`):
  a statement over it is `StorageUnavailable`, nothing written, never a hang.
  Setup lifts it for its own work (`SET LOCAL` in the migrations' transaction,
  a connection without it for index builds).
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
  A server that stops answering on open connections fails each round trip after
  `statement_timeout_ms` + `reply_timeout` (`round_trips`); a commit that went
  unanswered is settled by taking its claim back on a new connection, so that
  it fails its fencing check if the network delivers it later.
  Missing privileges and a read-only server are found by the claim, before
  the model is called.
* **Managed credentials.** With a `credential_provider`, the pool's connection
  kwargs are a callable (psycopg_pool >= 3.3), so every new connection gets a
  fresh or cached password, and `max_lifetime` retires connections before their
  token expires.
"""

from agent.storage.postgres.connections import CachedCredential, PostgresConnections
from agent.storage.postgres.saver import TurnPostgresSaver
from agent.storage.postgres.schema import MIGRATIONS, TABLES
from agent.storage.postgres.storage import PostgresThreadStorage
from agent.storage.postgres.transaction import PostgresTx

__all__ = [
    "MIGRATIONS",
    "TABLES",
    "CachedCredential",
    "PostgresConnections",
    "PostgresThreadStorage",
    "PostgresTx",
    "TurnPostgresSaver",
]
