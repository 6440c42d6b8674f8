"""Settings: what `create_agent(...)` and the environment configure, in one typed object.

Every setting can be passed to `create_agent(**settings)` or set in the
environment as `AGENT_<NAME>` (for example `AGENT_DATABASE_URL`,
`AGENT_MULTITASK_STRATEGY`). Keyword arguments win over the environment.
`OPENAI_API_KEY` and `OPENAI_BASE_URL` keep their usual names and are read by
`langchain-openai` itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

from agent.errors import ConfigurationError

#: Where the embedded store lives when no database URL is configured.
DEFAULT_SQLITE_PATH = Path(".agent") / "checkpoints.sqlite"

#: The OpenAI model used when an API key or base URL is set and `AGENT_MODEL` is not.
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"

MultitaskStrategy = Literal["reject", "enqueue"]


class AgentSettings(BaseSettings):
    """All knobs of one agent. Defaults are visible here; durations are in seconds, sizes in bytes."""

    model_config = SettingsConfigDict(env_prefix="AGENT_", extra="forbid", arbitrary_types_allowed=True)

    database_url: str | None = None
    """`postgresql://…`, `sqlite:///path`, or `memory://`. Unset: `sqlite:///.agent/checkpoints.sqlite`."""

    model: str | None = None
    """`"offline"` or an OpenAI-compatible model name. Unset: offline unless an OpenAI key or base URL is set."""

    # Postgres pool (psycopg_pool.ConnectionPool). One turn holds one connection
    # for its whole duration (it holds the thread's lock), so `pool_max_size`
    # bounds the turns that run at once in this process.
    pool_min_size: int = Field(default=2, ge=0)
    pool_max_size: int = Field(default=20, ge=1)
    pool_timeout: float = Field(default=30.0, gt=0)
    """Seconds to wait for a free connection before `StorageUnavailable`."""
    pool_max_lifetime: float = Field(default=45 * 60.0, gt=0)
    """Seconds after which a pooled connection is replaced; keep it below a managed credential's lifetime."""
    credential_provider: Callable[[], str] | None = None
    """Called for the Postgres password when the pool opens a connection (Lakebase, Azure AD, RDS IAM tokens)."""
    credential_cache_seconds: float = Field(default=15 * 60.0, ge=0)
    """How long a password from `credential_provider` is reused before the provider is called again."""

    multitask_strategy: MultitaskStrategy = "reject"
    """What a turn does when another turn holds its thread: `reject` raises ThreadBusy, `enqueue` waits."""
    enqueue_timeout: float = Field(default=30.0, ge=0)
    """Seconds an `enqueue` turn waits for its thread before ThreadBusy."""
    sqlite_lease_seconds: float = Field(default=300.0, gt=0)
    """SQLite only: a thread lock left by a crashed process expires after this many seconds."""

    require_user_id: bool = False
    """Refuse every request that carries no user_id (InvalidRequest)."""
    max_request_bytes: int = Field(default=1_000_000, gt=0)
    """Largest accepted request, measured as UTF-8 JSON."""
    message_cache_size: int = Field(default=1024, ge=0)
    """Checkpoints whose message lists are kept in memory (they are immutable, so the cache is never stale)."""
    tracing: bool = True
    """MLflow tracing (LangChain autolog) of every turn."""


    @model_validator(mode="after")
    def _pool_bounds(self) -> AgentSettings:
        if "pool_min_size" not in self.model_fields_set:
            self.pool_min_size = min(self.pool_min_size, self.pool_max_size)
        elif self.pool_min_size > self.pool_max_size:
            raise ValueError(f"pool_min_size ({self.pool_min_size}) is larger than pool_max_size ({self.pool_max_size})")
        return self


def load_settings(**overrides) -> AgentSettings:
    """Build settings from keyword arguments over the environment.

    Raises:
        ConfigurationError: an unknown setting name or a value of the wrong type.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return AgentSettings(**given)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigurationError(f"Invalid agent settings: {problems}") from None


def resolve_database_url(url: str | None) -> str:
    """The URL to use: `url`, else the embedded SQLite file under `./.agent/`."""
    return url or f"sqlite:///{DEFAULT_SQLITE_PATH}"


def resolve_model_name(model: str | None) -> str:
    """`model`, else an OpenAI model when a key or base URL is configured, else `"offline"`."""
    if model:
        return model
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        return DEFAULT_OPENAI_MODEL
    return "offline"


def mask_url(url: str) -> str:
    """`url` with its password replaced by `***`, safe to put in messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        # Not a URL we can parse: show only the scheme, which holds no secret.
        return url.split(":", 1)[0] + ":<unparseable>"
