"""Short-term memory: checkpoints and thread records, behind one interface (`ThreadStorage`), chosen by URL.

| URL | backend | use |
|---|---|---|
| `postgresql://…`, `postgres://…`, or a libpq `key=value` string | `postgres.PostgresThreadStorage` | production |
| `sqlite:///path` | `sqlite.SqliteThreadStorage` on a file | the embedded default |
| `memory://` | `sqlite.SqliteThreadStorage` on `:memory:` | notebooks, tests, benchmark lower bound |

Modules, from the values up:

* `records` (thread records and the other values storage hands out),
  `claims` (a turn's claim, the keeper that renews it, a deletion's user claim), `transaction`
  (`Tx`, the statements of one write transaction), `turns` (the turn
  protocol, written once: why a turn is two short transactions and a lease),
  `base` (`ThreadStorage`, the whole interface, and `ThreadReads`);
* `saver` (what the agent adds to LangGraph's savers: buffered turns, deltas,
  summaries) and `saver_threads` (its thread operations: prune, copy, delete);
  `deltas` (messages stored once), `summaries` (history summaries in
  checkpoint metadata), `encrypted` and `compression` (the saver's serializer:
  blobs sealed, long ones compressed first);
* one package per backend, each cut as langgraph-checkpoint-postgres cuts its
  own: `schema` (migrations, a migration's position its version), `sql`
  (statements as named constants), `saver`, `transaction`, `storage`, and
  Postgres's `connections` (pool, credentials, faults) and `batch` (the
  commit's one round trip); `sqlite.reads` holds the SQLite reads, which need
  no LangGraph.

`open_storage` picks the backend by URL and hands it its claim keeper.
Read-only commands (`tt-agent history`, listings, export) open a database with
`open_reader` or check it with `require_existing_database`: neither ever
creates one. This package, `base` and `sqlite.reads` import no LangGraph; the
backends' storages and savers do.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from agent.config import AgentSettings, check_database_url, is_postgres_url, mask_secret_fragments, mask_url, store_label
from agent.errors import ConfigurationError
from agent.storage.base import BranchRecord, CheckpointLink, Claim, ExpiredThread, ThreadReads, ThreadRecord, ThreadStorage, Turn, Tx, owned_by
from agent.storage.claims import ClaimKeeper, UserClaim

__all__ = [
    "BranchRecord",
    "CheckpointLink",
    "Claim",
    "ExpiredThread",
    "ThreadReads",
    "ThreadRecord",
    "ThreadStorage",
    "Turn",
    "Tx",
    "UserClaim",
    "open_reader",
    "open_storage",
    "owned_by",
    "require_existing_database",
    "require_tables",
]

#: How a message about a missing database says to choose another (the same setting in Python and on the command line).
CHOOSE_ANOTHER = "Choose another store with --database-url or AGENT_DATABASE_URL."


def open_storage(url: str, settings: AgentSettings) -> ThreadStorage:
    """The storage for `url`, with a claim keeper of its own. Does not connect yet; the first read or
    turn does (and runs setup).

    Raises:
        ConfigurationError: the scheme is not one of postgresql, postgres, sqlite, memory; a sqlite
            URL has no path; a Postgres connection string is malformed. The message shows the URL
            with its password masked.
    """
    kind = check_database_url(url)
    if kind == "postgres":
        from psycopg.conninfo import conninfo_to_dict

        conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
        try:
            conninfo_to_dict(conninfo)
        except Exception as exc:  # psycopg.ProgrammingError, or ValueError for a bad port and the like
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigurationError(
                f"Malformed Postgres connection string {mask_url(url)}: {mask_secret_fragments(reason, url)}"
            ) from None
        from agent.storage.postgres import PostgresThreadStorage

        return PostgresThreadStorage(conninfo, settings, keeper=_keeper(settings))
    from agent.storage.sqlite import SqliteThreadStorage

    path = url[len("sqlite:///") :] if kind == "sqlite" else ":memory:"
    return SqliteThreadStorage(path, settings, keeper=_keeper(settings))


def _keeper(settings: AgentSettings) -> ClaimKeeper:
    return ClaimKeeper(lease_seconds=settings.lease_seconds)


def require_existing_database(url: str) -> None:
    """Check, without creating anything, that the database at `url` can exist outside this process.

    A SQLite URL must name an existing file; `memory://` is refused (its threads
    live only in the process that wrote them). Postgres is checked by
    `ThreadStorage.exists()` once connected (`open_reader` does both).

    Raises:
        ConfigurationError: no such file, or `memory://`; the message names the absolute path
            and how to choose another database.
    """
    scheme = "postgres" if is_postgres_url(url) else urlsplit(url).scheme.lower()
    if scheme == "memory":
        raise ConfigurationError(
            "memory:// keeps threads only inside the process that wrote them, so there is nothing to read here. "
            + CHOOSE_ANOTHER
        )
    if scheme == "sqlite" and url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :]).resolve()
        if not path.is_file():
            raise ConfigurationError(f"There is no store at {path}; nothing was created. {CHOOSE_ANOTHER}")


def open_reader(url: str, settings: AgentSettings) -> ThreadReads:
    """The reads of an existing database, for read-only commands; never creates a database or a table.

    SQLite: a `sqlite.reads.SqliteReader` on a read-only connection, which loads
    no LangGraph (a file of an older version is opened as full storage instead,
    which migrates it). Postgres: the full storage, once its tables are found.
    Close the result with `close()`.

    Raises:
        ConfigurationError: there is no database at `url` (see `require_existing_database`), or a
            Postgres database without the agent's tables; the message names it.
        StorageUnavailable: the database cannot be reached or read.
    """
    require_existing_database(url)
    if url.startswith("sqlite:///"):
        from agent.storage.sqlite.reads import SqliteReader

        from agent.encryption import Keyring

        reader = SqliteReader.open(Path(url[len("sqlite:///") :]), Keyring.from_settings(settings))
        if reader is not None:
            return reader
    storage = open_storage(url, settings)
    try:
        require_tables(storage, url)
    except BaseException:
        storage.close()
        raise
    return storage


def require_tables(storage: ThreadStorage, url: str) -> None:
    """Check, without creating anything, that `storage` (opened on `url`) has been set up.

    Raises:
        ConfigurationError: its tables do not exist (a Postgres database the agent never used);
            the message names the database and how to choose another.
        StorageUnavailable: the database cannot be reached.
    """
    if not storage.exists():
        raise ConfigurationError(
            f"There is no store in {store_label(url)}: its tables do not exist, and nothing was created. "
            + CHOOSE_ANOTHER
        )
