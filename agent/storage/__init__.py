"""Short-term memory: checkpoints and thread records, behind one interface (`ThreadStorage`), chosen by URL.

| URL | backend | use |
|---|---|---|
| `postgresql://…`, `postgres://…`, or a libpq `key=value` string | `postgres.PostgresThreadStorage` | production |
| `sqlite:///path` | `sqlite.SqliteThreadStorage` on a file | the embedded default |
| `memory://` | `sqlite.SqliteThreadStorage` on `:memory:` | notebooks, tests, benchmark lower bound |

Modules: `base` (the interface and the turn protocol: claim, run, commit),
`claims` (lease renewal), `saver` (what the agent adds to LangGraph's savers),
`deltas` (messages stored once), `summaries` (history summaries in checkpoint
metadata), and one module per backend.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from agent.config import AgentSettings, is_postgres_url, mask_secret_fragments, mask_url
from agent.errors import ConfigurationError
from agent.storage.base import Claim, ThreadRecord, ThreadStorage, Turn, Tx, owned_by

__all__ = ["Claim", "ThreadRecord", "ThreadStorage", "Turn", "Tx", "open_storage", "owned_by"]


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
