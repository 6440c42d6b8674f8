"""Settings: what `create_agent(...)` and the environment configure, in one typed object.

Every setting can be passed to `create_agent(**settings)` or set in the
environment as `AGENT_<NAME>` (for example `AGENT_DATABASE_URL`,
`AGENT_MULTITASK_STRATEGY`). Keyword arguments win over the environment.
`OPENAI_API_KEY` and `OPENAI_BASE_URL` keep their usual names and are read by
`langchain-openai` itself. Every default is resolved here (`AgentSettings`
after validation holds the database URL and model name that will be used), so
no other module guesses them.

This module imports only pydantic and the standard library: `tt-agent --help`
and `import agent` must stay fast.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent.errors import ConfigurationError, validation_problems

#: Where the embedded store lives when no database URL is configured (relative to the current directory).
DEFAULT_SQLITE_PATH = Path(".agent") / "checkpoints.sqlite"

#: The OpenAI model used when an API key or base URL is set and `AGENT_MODEL` is not.
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"

#: The `model` setting that selects the offline model.
OFFLINE_MODEL_NAME = "offline"

#: What a turn does when another turn holds its thread (LangGraph Agent Server's double-texting strategies).
MultitaskStrategy = Literal["reject", "enqueue", "interrupt", "rollback", "steer"]
MULTITASK_STRATEGIES: tuple[str, ...] = ("reject", "enqueue", "interrupt", "rollback", "steer")

def _listed(value: object) -> object:
    """A list setting as the environment gives it: a JSON list, or comma-separated text; anything else as it is."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    return json.loads(text) if text.startswith("[") else [part.strip() for part in text.split(",") if part.strip()]


#: What an `allowed_hosts` entry looks like: a name (a leading `*.` for its subdomains), an IPv4 or a bracketed
#: IPv6 address, or `*`.
_HOST = re.compile(r"\*|(\*\.)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*|\[[0-9A-Fa-f:.]+\]")
#: What a CORS origin looks like (a browser's `Origin` header): scheme://host[:port].
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")
#: An HTTP header name: RFC 9110's `token` (section 5.1), letters, digits and ``!#$%&'*+-.^_`|~``.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

#: Default admission of `tt-agent serve` (`serving.admission`): turns running at once per pooled connection,
#: and turns waiting per running turn (`AgentSettings.max_running_turns`, `max_waiting_turns` say why).
RUNNING_TURNS_PER_CONNECTION = 20
WAITING_TURNS_PER_RUNNING = 4

ContextStrategy = Literal["trim", "summarize"]
MemoryScope = Literal["user", "branch"]
ThreadTtlStrategy = Literal["delete", "keep_latest"]


class AgentSettings(BaseSettings):
    """All knobs of one agent. Defaults are visible here; durations are in seconds, sizes in bytes."""

    # env_ignore_empty: an empty AGENT_* variable is an unset one, for every setting (`AGENT_MODEL= tt-agent serve`,
    # or a compose file's `AGENT_MODEL: ${AGENT_MODEL}` when the shell has none), as most tools read them.
    model_config = SettingsConfigDict(
        env_prefix="AGENT_", extra="forbid", arbitrary_types_allowed=True, env_ignore_empty=True
    )

    # -- what to run -------------------------------------------------------------------------
    database_url: str = ""
    """`postgresql://…` (or a libpq `key=value` string), `sqlite:///path`, or `memory://`.
    Empty: `sqlite:///.agent/checkpoints.sqlite` in the current directory. A SQLite path is made
    absolute when the settings are built."""
    model: str | None = None
    """`"offline"` or an OpenAI-compatible model name. None (unset): offline unless an OpenAI key or base URL is
    set. An empty or blank name is refused: it names no model, and would have meant the default silently."""

    # -- Postgres connections (psycopg_pool.ConnectionPool) ------------------------------------
    # A turn uses a connection only for its two short transactions (claim, commit),
    # never while the model runs, so a small pool serves many concurrent turns.
    pool_min_size: int = Field(default=2, ge=0)
    pool_max_size: int = Field(default=10, ge=1)
    pool_timeout: float = Field(default=30.0, gt=0)
    """Seconds to wait for a free connection when the database is reachable but every connection is in use."""
    pool_max_lifetime: float = Field(default=45 * 60.0, gt=0)
    """Seconds after which a pooled connection is replaced; keep it below a managed credential's lifetime."""
    connect_timeout: float = Field(default=5.0, gt=0)
    """Seconds a new connection may take; an unreachable database fails within about this long."""
    statement_timeout_ms: int = Field(default=30_000, ge=0)
    """Milliseconds one database statement may run (waits for locks included) before it fails with
    StorageUnavailable, nothing written. Postgres: `statement_timeout` on every connection; SQLite: the
    wait for another process's write lock, and each read or transaction's run time. 0: no limit.
    Setup's migrations and index builds are not limited."""
    reply_timeout: float = Field(default=5.0, gt=0)
    """Seconds the agent waits for Postgres to answer on an open connection beyond what `statement_timeout_ms`
    lets a statement run. A database that stops answering without closing its connections (a network
    partition, a frozen host, proxy or pooler) fails each read, claim and commit with StorageUnavailable
    after `statement_timeout_ms` + this (35 s by default), its connection closed, and `/ready` answers
    503 within `connect_timeout` + this. Also libpq's `tcp_user_timeout` and TCP keepalive idle time, so a
    vanished peer breaks even idle connections. `statement_timeout_ms` 0 leaves statements unbounded here
    too (`/ready`'s check excepted), as are setup's migrations and index builds."""
    prepare_threshold: int | None = None
    """psycopg's `prepare_threshold`: None (default) never prepares statements, which transaction-mode
    poolers such as PgBouncer require; an integer prepares a statement after that many runs."""
    credential_provider: Callable[[], str] | None = None
    """Called for the Postgres password when the pool opens a connection (Lakebase, Azure AD, RDS IAM tokens)."""
    credential_cache_seconds: float = Field(default=15 * 60.0, ge=0)
    """How long a password from `credential_provider` is reused before the provider is called again."""

    # -- encryption at rest (agent.encryption, docs/encryption.md) ----------------------------
    encryption_key: SecretStr | None = None
    """Encrypt stored conversations with AES-256-GCM: one base64 key of 32 bytes, or several separated by
    commas, newest first (written with the first, read with any: rotation). None: stored in plaintext."""
    encryption_key_provider: Callable[[], str | list[str]] | None = None
    """Called once when the storage opens, for the value of `encryption_key` (a secret manager, a KMS)."""

    # -- turns on one thread -----------------------------------------------------------------
    multitask_strategy: MultitaskStrategy = "reject"
    """A turn on a thread another turn holds: `reject` raises ThreadBusy, `enqueue` waits, `interrupt` stops
    the running turn and keeps what it produced, `rollback` stops it and writes nothing of it, `steer` adds the
    messages to the running turn before its next model call (or, past its last one, runs them next)."""
    enqueue_timeout: float = Field(default=30.0, ge=0)
    """Seconds a turn waits for its thread (`enqueue`, `interrupt`, `rollback`) before ThreadBusy."""
    lease_seconds: float = Field(default=15.0, gt=0)
    """A running turn's claim on its thread lasts this long and is renewed while it runs; a crashed
    process's claim frees the thread after at most this long."""
    idempotency_ttl_seconds: float = Field(default=24 * 3600.0, gt=0)
    """How long an `idempotency_key`'s result is kept for retries."""
    response_events_seconds: float = Field(default=600.0, gt=0)
    """How long a streamed or background turn's events and status (`agent.runs`) are kept after it ends, for
    `GET /responses/{id}?stream=true&starting_after=N` and a background response's `GET /responses/{id}`."""
    finish_left_streams: bool = False
    """A client that leaves a (non-background) stream: False cancels its turn, nothing written; True lets the
    turn run on to its end, so that the client can resume it (`GET /responses/{id}?stream=true`)."""
    shutdown_grace_seconds: float = Field(default=25.0, ge=0)
    """`tt-agent serve` on SIGINT/SIGTERM: how long each server process lets its background runs, queued or
    running, and its open streams go on after the signal. Those still going then are stopped, nothing of
    them written, and read `failed` at once (`serving.drain`). The default fits under Kubernetes' default
    30 s termination grace period; 0 stops them at once."""

    # -- requests ----------------------------------------------------------------------------
    require_user_id: bool = False
    """Refuse every request that carries no user_id (InvalidRequest)."""
    user_id_header: str | None = None
    """A trusted HTTP header that carries the caller's user_id (e.g. `X-Forwarded-User` on Databricks Apps); a name
    no request can carry (a space, a colon) is refused."""
    max_request_bytes: int = Field(default=1_000_000, gt=0)
    """Largest accepted request, measured as UTF-8 JSON."""
    max_input_items: int = Field(default=1000, ge=1)
    """Most input items (messages, tool calls and results) one request may carry."""
    body_timeout: float = Field(default=30.0, gt=0)
    """Seconds a client may take to send a request body before the server answers 408."""
    # NoDecode: the environment gives a comma-separated list (`_origins`), not only JSON.
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Origins whose web pages may call `tt-agent serve` from a browser (CORS), e.g.
    `["https://chat.example.com"]`; `AGENT_CORS_ORIGINS` takes them comma-separated. `["*"]`: any
    origin. Empty: none (a page on another origin gets no CORS headers, so browsers block it)."""

    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Host names `tt-agent serve` answers to (the `Host` header, without its port), e.g.
    `["chat.example.com", "*.example.com"]`; `AGENT_ALLOWED_HOSTS` takes them comma-separated. Another
    host gets a 400, so that a page whose name an attacker points at the server (DNS rebinding) cannot
    use it (`serving.origins`). Empty or `["*"]`: any host. `tt-agent serve` bound to a loopback address
    (its default, 127.0.0.1) uses `localhost,127.0.0.1,[::1]` when this is not set."""

    # -- turns at once (`tt-agent serve`, per process: serving.admission) ------------------------
    max_running_turns: int | None = Field(default=None, ge=1)
    """Turns (requests that run the model) one server process runs at once; more wait. None: 20 x
    `pool_max_size` (200 with the default pool). A ceiling: fewer run while the event loop lags
    (`loop_lag_target_seconds`), since every running turn's steps share the process's one event loop
    (one core whatever the machine has; more cores: more `--workers`, each with its own bound), so the
    turns that run at once set how long `/health` and reads wait for a round of the loop during a burst,
    and how many keep them fast depends on the share of a core the process gets. A turn holds
    a pooled connection only for its claim and its commit (milliseconds each) and no connection, no OS
    thread and no CPU while it waits on its model, so a process can keep 1,000 streams open (about
    200 kB of memory each; `bench.streams` measures them with this set to 1,000 and
    `loop_lag_target_seconds` to 0): do both when a burst's own wall matters more than reads during it."""
    loop_lag_target_seconds: float = Field(default=0.02, ge=0)
    """How late the server's event loop may run before fewer turns start (`tt-agent serve`: `serving.admission`).
    While a timer on the loop runs later than this, the process lets fewer turns run than `max_running_turns`
    (not fewer than 32), and while it runs on time, more again: the share of a core the process gets
    (which other work on the machine sets) decides how many turns keep `/health` and reads fast, not a fixed
    number. A burst starts 32 at once and grows from there. 0: always up to `max_running_turns`."""
    max_waiting_turns: int | None = Field(default=None, ge=0)
    """Turns that may wait for a place among the running ones (first come, first served); beyond them a
    turn is refused with ServerBusy (429 and `Retry-After`), nothing written. None: 4 x
    `max_running_turns` (800 with the default pool), so a waiting turn starts within about four turn
    lengths. 0: no queue."""

    # -- memory and context --------------------------------------------------------------------
    message_cache_size: int = Field(default=1024, ge=0)
    """Checkpoints whose message lists are kept in memory (they are immutable, so the cache is never stale)."""
    max_context_tokens: int | None = Field(default=None, ge=1)
    """Most tokens sent to the model per call. None: a safe default for the configured model."""
    context_strategy: ContextStrategy = "trim"
    """Over the budget: `trim` drops the oldest whole turns, `summarize` folds them into a summary."""
    memory_scope: MemoryScope = "user"
    """Long-term memories: `user` (visible in every thread of the user) or `branch` (only on the branch that wrote them)."""
    max_memories_in_context: int = Field(default=5, ge=0)
    """Most long-term memories given to the model before a turn."""
    memory_tools: bool = True
    """Bind the long-term memory tools (save, search, forget) to the built-in graph's model, beside its own tools.
    False: the model gets only the agent's tools (a user's graph binds its own tools either way)."""
    embedding_model: str | None = None
    """An OpenAI-compatible embeddings model for semantic memory search (SQLite and Postgres: exact cosine
    over the stored vectors, ranked by pgvector on a Postgres that has it). None: keyword search."""
    memory_ttl_seconds: float | None = Field(default=None, gt=0)
    """Long-term memories expire after this long without being used (given to the model or found by
    `search_memories`). None: never."""

    # -- retention ----------------------------------------------------------------------------
    # At most 100 years (`operations.thread_values.MAX_TTL_SECONDS`): Postgres cannot add a larger interval.
    thread_ttl_seconds: float | None = Field(default=None, gt=0, le=100 * 365 * 24 * 3600)
    """A thread idle (no write) for this long expires. None: never."""
    thread_ttl_strategy: ThreadTtlStrategy = "delete"
    """What expiry does: `delete` the whole thread, or `keep_latest` (only the head checkpoint stays)."""
    sweep_interval_seconds: float | None = Field(default=None, gt=0)
    """`tt-agent serve` sweeps expired threads this often. None: no sweeper."""

    # -- observability ----------------------------------------------------------------------------
    tracing: bool | None = None
    """MLflow tracing of every turn. None: on when a tracking server is configured (`MLFLOW_TRACKING_URI`,
    or a Databricks runtime), else off. `tt-agent serve` turns it on."""
    trace_sample_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    """The fraction of turns traced when tracing is on. None: by where traces go (`agent.tracing`): every
    turn to a tracking server or Databricks, `LOCAL_TRACE_SAMPLE_RATIO` of them into a store this process
    writes itself (the default `.agent/mlflow.db`), whose writes cost more CPU than the turn."""
    trace_actions: bool = False
    """Also trace requests that name a `custom_inputs.action` (reads such as `get_checkpoint_state`, and
    state edits). False: only turns are traced."""

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> object:
        value = _listed(value)
        if isinstance(value, (list, tuple)):
            for host in value:
                if isinstance(host, str) and not _HOST.fullmatch(host):
                    raise ValueError(
                        f"{host!r} is not a host name: write it without scheme, port or path (chat.example.com, "
                        "*.example.com, [::1]), or *"
                    )
        return value

    @field_validator("user_id_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        # A name no request can carry (a space, a colon) would make every request anonymous, silently.
        if value and not _HEADER_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an HTTP header name: letters, digits and !#$%&'*+-.^_`|~ only, without spaces "
                "or a colon (X-Forwarded-User)"
            )
        return value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> object:
        value = _listed(value)
        if isinstance(value, (list, tuple)):
            for origin in value:
                # A browser's Origin header is exactly scheme://host[:port]; anything else would never match.
                if isinstance(origin, str) and origin != "*" and not _ORIGIN.fullmatch(origin):
                    raise ValueError(
                        f"{origin!r} is not an origin: write scheme://host[:port], without a path or a trailing slash, or *"
                    )
        return value

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(
                f"{value!r} names no model: leave model (AGENT_MODEL) unset for the default (offline, or an OpenAI model when "
                "OPENAI_API_KEY or OPENAI_BASE_URL is set), or name one (\"offline\", \"gpt-4o-mini\")"
            )
        return value

    @model_validator(mode="after")
    def _resolve(self) -> AgentSettings:
        if "pool_min_size" not in self.model_fields_set:
            self.pool_min_size = min(self.pool_min_size, self.pool_max_size)
        elif self.pool_min_size > self.pool_max_size:
            raise ValueError(f"pool_min_size ({self.pool_min_size}) is larger than pool_max_size ({self.pool_max_size})")
        self.database_url = resolve_database_url(self.database_url)
        check_database_url(self.database_url)  # here, before any backend or MLflow is imported: a typo fails at once
        self.model = resolve_model_name(self.model)
        if self.tracing is None:
            self.tracing = tracking_server_configured()
        if self.max_running_turns is None:
            self.max_running_turns = RUNNING_TURNS_PER_CONNECTION * self.pool_max_size
        if self.max_waiting_turns is None:
            self.max_waiting_turns = WAITING_TURNS_PER_RUNNING * self.max_running_turns
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
        raise ConfigurationError(f"Invalid agent settings: {validation_problems(exc.errors(), most=10)}") from None


def resolve_database_url(url: str | None) -> str:
    """The URL to use: `url`, else the embedded SQLite file `.agent/checkpoints.sqlite`.

    A SQLite path is made absolute against the current directory, now: the
    store is named the same way everywhere (banners, errors) and does not move
    if the directory changes later.
    """
    url = url or f"sqlite:///{DEFAULT_SQLITE_PATH}"
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return f"sqlite:///{os.path.abspath(url[len('sqlite:///') :])}"
    return url


def resolve_model_name(model: str | None) -> str:
    """`model`, else an OpenAI model when a key or base URL is configured, else `"offline"`."""
    if model:
        return model
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        return DEFAULT_OPENAI_MODEL
    return OFFLINE_MODEL_NAME


def tracking_server_configured() -> bool:
    """Whether an MLflow tracking store is configured: `MLFLOW_TRACKING_URI` set, a Databricks runtime,
    or `mlflow.set_tracking_uri(...)` already called in this process (MLflow is not imported to find out)."""
    if os.environ.get("MLFLOW_TRACKING_URI") or os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return True
    mlflow = sys.modules.get("mlflow")
    return bool(mlflow is not None and mlflow.is_tracking_uri_set())


# -- connection strings ------------------------------------------------------------------------
# The userinfo's password runs to the last "@" before the path (an unencoded "@" in it is a user's mistake
# that must not leak the rest).
_URL_PASSWORD = re.compile(r"^(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/@:]*):(?P<secret>[^/]*)@")
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&]password=)[^&#]*", re.IGNORECASE)
# A key=value password: quoted ('...' with \' escapes), quoted but never closed (the rest of the string),
# or unquoted (backslash escapes allowed); then any stray words that are not `key=`: a malformed string
# such as `password=se cret` holds the secret's second half there.
_KV_PASSWORD = re.compile(
    r"(?P<key>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|'.*|(?:\\.|\S)*)(?:\s+(?![A-Za-z_]\w*\s*=)\S+)*",
    re.IGNORECASE | re.DOTALL,
)


def is_postgres_url(url: str) -> bool:
    """Whether `url` names a Postgres database: a `postgres(ql)://` URL or a libpq `key=value` string."""
    lowered = url.strip().lower()
    return lowered.startswith(("postgresql://", "postgres://", "postgresql+")) or ("=" in url and "://" not in url)


def check_database_url(url: str) -> Literal["postgres", "sqlite", "memory"]:
    """The kind of store `url` names, once its form is checked (nothing connected, nothing imported; a Postgres
    connection string's own syntax is checked by `agent.storage.open_storage`, with psycopg).

    Raises:
        ConfigurationError: the scheme is not one of postgresql, postgres, sqlite, memory, or a sqlite URL has
            no path. The message shows the URL with its password masked.
    """
    if is_postgres_url(url):
        return "postgres"
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise ConfigurationError(f"A sqlite URL needs a path, like sqlite:///.agent/memory.sqlite; got {mask_url(url)}")
        return "sqlite"
    if scheme == "memory":
        return "memory"
    raise ConfigurationError(
        f"Unknown database URL scheme {scheme!r} in {mask_url(url)}; use postgresql://, sqlite:/// or memory://"
    )


def store_kind(url: str) -> str:
    """`"postgres"`, `"sqlite"` or `"memory"` for a database URL (else its scheme); never the URL itself."""
    if is_postgres_url(url):
        return "postgres"
    return url.split("://", 1)[0].lower() if "://" in url else "unknown"


def store_label(url: str) -> str:
    """How people are told which store is used: a SQLite file's absolute path, a Postgres URL with its
    password masked, or `memory:// (this process only)`.

    Example: `store_label("sqlite:///.agent/checkpoints.sqlite")` is
    `"/home/me/project/.agent/checkpoints.sqlite"` when run in `/home/me/project`.
    """
    kind = store_kind(url)
    if kind == "sqlite" and url.startswith("sqlite:///"):
        return os.path.abspath(url[len("sqlite:///") :])
    if kind == "memory":
        return "memory:// (this process only)"
    return mask_url(url)


def mask_url(url: str) -> str:
    """`url` with its password replaced by `***`, safe to put in messages and logs.

    Handles every form libpq accepts: `postgresql://user:secret@host/db`,
    `…?password=secret`, and `host=h password=secret` (also quoted, with
    escapes), and malformed ones that libpq refuses (an unclosed quote, a
    password with a space and no quotes); leaves URLs without a password
    (`sqlite:///…`, `memory://`) unchanged.
    """
    masked = _URL_PASSWORD.sub(r"\g<head>:***@", url)
    masked = _QUERY_PASSWORD.sub(r"\g<key>***", masked)
    if "://" not in masked:
        masked = _KV_PASSWORD.sub(r"\g<key>***", masked)
    return masked


def mask_secret_fragments(text: str, url: str) -> str:
    """`text` (e.g. a parser's error about `url`) with every quoted fragment of `url`'s password masked.

    libpq's messages quote the part of a connection string they choke on
    (`missing "=" after "cret"`); a fragment that is in `url` but not in
    `mask_url(url)` was part of the password.
    """
    masked_url = mask_url(url)

    def mask(match: re.Match) -> str:
        fragment = match.group(1)
        return '"***"' if fragment and fragment in url and fragment not in masked_url else match.group(0)

    return re.sub(r'"([^"]*)"', mask, mask_url(text))

