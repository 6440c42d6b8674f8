"""Storage backends behind one interface (`Store`), chosen by the database URL's scheme.

| URL | backend | use |
|---|---|---|
| `postgresql://…` (or `postgres://…`) | `PostgresStore` | production |
| `sqlite:///path` | `SqliteStore` on a file | the embedded default |
| `memory://` | `SqliteStore` on `:memory:` | notebooks, tests, benchmark lower bound |
"""

from __future__ import annotations

from urllib.parse import urlsplit

from agent.config import AgentSettings, mask_url
from agent.errors import ConfigurationError
from agent.storage.base import Store, ThreadRecord, Turn

__all__ = ["Store", "ThreadRecord", "Turn", "open_store"]


def open_store(url: str, settings: AgentSettings) -> Store:
    """A store for `url`. Does not connect yet; the first read or turn does (and runs setup).

    Raises:
        ConfigurationError: the scheme is not one of postgresql, postgres, sqlite, memory,
            or a sqlite URL has no path. The message shows the URL with its password masked.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        from agent.storage.postgres import PostgresStore

        return PostgresStore(url.replace("postgresql+psycopg://", "postgresql://", 1), settings)
    if scheme == "sqlite":
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigurationError(f"A sqlite URL needs a path, like sqlite:///.agent/memory.sqlite; got {mask_url(url)}")
        from agent.storage.sqlite import SqliteStore

        return SqliteStore(path, settings)
    if scheme == "memory":
        from agent.storage.sqlite import SqliteStore

        return SqliteStore(":memory:", settings)
    raise ConfigurationError(
        f"Unknown database URL scheme {scheme!r} in {mask_url(url)}; use postgresql://, sqlite:/// or memory://"
    )
