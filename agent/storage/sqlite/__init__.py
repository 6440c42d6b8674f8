"""SQLite backend (`sqlite:///path`, and `memory://`): LangGraph's `SqliteSaver` on one connection.

Modules, cut as the Postgres backend's: `schema` (migrations and setup's
apply), `sql` (statements as named constants), `reads` (the reads shared with
the light `SqliteReader` of read-only commands, which loads no LangGraph),
`saver` (`TurnSqliteSaver`), `transaction` (`SqliteTx`) and `storage`
(`SqliteThreadStorage`). This `__init__` imports none of them until a name is
asked for (`__getattr__`, as the OpenAI Agents SDK keeps its optional
backends): `tt-agent history` imports `reads` and must not load LangGraph
through the package.

Design notes:

* **The embedded default.** No server, one file under `./.agent/`. `memory://`
  is the same code on an in-process `:memory:` database, so notebooks and
  benchmarks exercise the real storage path without a file.
* **The same turn protocol as Postgres** (`storage.turns`): a claim row in
  `agent_claims` with a token, a fencing number and an expiry, renewed while
  the turn runs, so it works across processes sharing the file and frees a
  crashed process's threads after `lease_seconds`. Expiry uses this machine's
  clock (a SQLite file is shared only on one machine). Waiting turns poll with
  backoff, so they are not served in arrival order.
* **Short transactions.** The claim (with the reads of the record and the
  start) and the commit (fencing check, writes, head, release) are each one
  `BEGIN IMMEDIATE` transaction; nothing is held while the model runs.
* **Schema.** `schema.MIGRATIONS` is an ordered list applied with `PRAGMA
  user_version` (a migration's position + 1 is its version), like Postgres's
  migrations table; LangGraph's store tables (long-term memory) are applied
  from its own lists, recorded in its own version tables (`STORE_SCHEMA`).
  `setup()` also checks that every table exists and re-applies the migrations
  if one was dropped; a running agent that finds a table missing does the
  same and runs the claim or read again.
* The connection is in autocommit mode (`isolation_level=None`), so
  `SqliteSaver`'s own commits are no-ops and transactions are explicit.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module of this package that defines it.
_EXPORTS = {
    "MIGRATIONS": "schema",
    "TABLES": "schema",
    "STORE_SCHEMA": "schema",
    "SqliteReader": "reads",
    "SqliteThreadStorage": "storage",
    "SqliteTx": "transaction",
    "TurnSqliteSaver": "saver",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
