"""Short-term memory: checkpoints and thread records, behind one interface (`ThreadStorage`), chosen by URL.

| URL | backend | use |
|---|---|---|
| `postgresql://…`, `postgres://…`, or a libpq `key=value` string | `postgres.PostgresThreadStorage` | production |
| `sqlite:///path` | `sqlite.SqliteThreadStorage` on a file | the embedded default |
| `memory://` | `sqlite.SqliteThreadStorage` on `:memory:` | notebooks, tests, benchmark lower bound |

Modules: `base` (the interface and the turn protocol: claim, run, commit),
`claims` (lease renewal), `saver` (what the agent adds to LangGraph's savers),
`deltas` (messages stored once), `summaries` (history summaries in checkpoint
metadata), and one module per backend (`sqlite_reads` holds the SQLite reads,
which need no LangGraph).

Read-only commands (`tt-agent history`, listings, export) open a store with
`open_reader` or check it with `require_existing_store`: neither ever creates
a store. This package and `base` import no LangGraph; the backends do.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from agent.config import AgentSettings, is_postgres_url, mask_secret_fragments, mask_url, store_label
from agent.errors import ConfigurationError
from agent.storage.base import CheckpointLink, Claim, ExpiredThread, ThreadReads, ThreadRecord, ThreadStorage, Turn, Tx, owned_by

__all__ = [
    "CheckpointLink",
    "Claim",
    "ExpiredThread",
    "ThreadReads",
    "ThreadRecord",
    "ThreadStorage",
    "Turn",
    "Tx",
    "open_reader",
    "open_storage",
    "owned_by",
    "require_existing_store",
    "require_tables",
]

#: How a message about a missing store says to choose another (the same setting in Python and on the command line).
CHOOSE_ANOTHER = "Choose another store with --database-url or AGENT_DATABASE_URL."


def open_storage(url: str, settings: AgentSettings) -> ThreadStorage:
    """The storage for `url`. Does not connect yet; the first read or turn does (and runs setup).

    Raises:
        ConfigurationError: the scheme is not one of postgresql, postgres, sqlite, memory; a sqlite
            URL has no path; a Postgres connection string is malformed. The message shows the URL
            with its password masked.
    """
    if is_postgres_url(url):
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

        return PostgresThreadStorage(conninfo, settings)
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigurationError(f"A sqlite URL needs a path, like sqlite:///.agent/memory.sqlite; got {mask_url(url)}")
        from agent.storage.sqlite import SqliteThreadStorage

        return SqliteThreadStorage(path, settings)
    if scheme == "memory":
        from agent.storage.sqlite import SqliteThreadStorage

        return SqliteThreadStorage(":memory:", settings)
    raise ConfigurationError(
        f"Unknown database URL scheme {scheme!r} in {mask_url(url)}; use postgresql://, sqlite:/// or memory://"
    )


def require_existing_store(url: str) -> None:
    """Check, without creating anything, that the store at `url` can exist outside this process.

    A SQLite URL must name an existing file; `memory://` is refused (its threads
    live only in the process that wrote them). Postgres is checked by
    `ThreadStorage.exists()` once connected (`open_reader` does both).

    Raises:
        ConfigurationError: no such file, or `memory://`; the message names the absolute path
            and how to choose another store.
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
    """The reads of an existing store, for read-only commands; never creates a store or a table.

    SQLite: a `sqlite_reads.SqliteReader` on a read-only connection, which loads
    no LangGraph (a file of an older version is opened as full storage instead,
    which migrates it). Postgres: the full storage, once its tables are found.
    Close the result with `close()`.

    Raises:
        ConfigurationError: there is no store at `url` (see `require_existing_store`), or a Postgres
            database without the agent's tables; the message names the store.
        StorageUnavailable: the database cannot be reached or read.
    """
    require_existing_store(url)
    if url.startswith("sqlite:///"):
        from agent.storage.sqlite_reads import SqliteReader

        reader = SqliteReader.open(Path(url[len("sqlite:///") :]))
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
            the message names the store and how to choose another.
        StorageUnavailable: the database cannot be reached.
    """
    if not storage.exists():
        raise ConfigurationError(
            f"There is no store in {store_label(url)}: its tables do not exist, and nothing was created. "
            + CHOOSE_ANOTHER
        )
