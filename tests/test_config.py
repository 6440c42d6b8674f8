"""`create_agent` configuration: URL schemes and their errors (passwords masked), settings and the
`AGENT_*` environment, the embedded default store, and the pool's lifecycle on real Postgres."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from agent import ConfigurationError, StorageUnavailable, create_agent
from agent.config import DEFAULT_OPENAI_MODEL, AgentSettings, load_settings, mask_url
from agent.storage.postgres import PostgresThreadStorage
from agent.storage.sqlite import SqliteThreadStorage
from tests.helpers.openai_stub import free_port
from tests.helpers.preloaded import run_agent_cli
from tests.helpers.scenario import TRIP, outputs, say, text_of

SECRET = "s3cret-pa55word"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No AGENT_* or OPENAI_* setting from the machine leaks into these tests."""
    for name in ("AGENT_DATABASE_URL", "AGENT_MODEL", "AGENT_POOL_MAX_SIZE", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


# --- URLs and settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [f"mysql://u:{SECRET}@h/db", f"redis://:{SECRET}@cache:6379/0", f"mongodb+srv://admin:{SECRET}@cluster/db"],
)
def test_unknown_scheme_is_a_configuration_error_with_the_password_masked(url):
    with pytest.raises(ConfigurationError) as err:
        create_agent(url, model="offline", tracing=False)
    message = err.value.message
    assert SECRET not in message and SECRET not in str(err.value)
    assert url.split("://")[0] in message
    assert url.rsplit("@", 1)[1] in message  # host and database are named


def test_sqlite_url_without_a_path_is_a_configuration_error():
    with pytest.raises(ConfigurationError) as err:
        create_agent("sqlite://", model="offline", tracing=False)
    assert "sqlite" in err.value.message


def test_unreachable_postgres_is_storage_unavailable_naming_the_masked_url():
    port = free_port()  # nothing listens there
    url = f"postgresql://agent:{SECRET}@127.0.0.1:{port}/agentdb"
    with pytest.raises(StorageUnavailable) as err:
        create_agent(url, model="offline", tracing=False, pool_timeout=1)
    message = err.value.message
    assert SECRET not in message and SECRET not in str(err.value)
    assert f"127.0.0.1:{port}/agentdb" in message
    assert "agent:***@" in message


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        (f"postgresql://agent:{SECRET}@db-host:5432/agentdb", "postgresql://agent:***@db-host:5432/agentdb"),
        (f"postgres://:{SECRET}@db-host/agentdb", "postgres://:***@db-host/agentdb"),
        (f"postgresql+psycopg://agent:{SECRET}@h1:5432,h2:5433/agentdb", "postgresql+psycopg://agent:***@h1:5432,h2:5433/agentdb"),
        (f"postgresql://agent:pa@{SECRET}@db-host/agentdb", "postgresql://agent:***@db-host/agentdb"),  # an unencoded @
        (f"postgresql:///agentdb?host=db-host&password={SECRET}&sslmode=require",
         "postgresql:///agentdb?host=db-host&password=***&sslmode=require"),
        (f"host=db-host password={SECRET} dbname=agentdb", "host=db-host password=*** dbname=agentdb"),
        (f"host=db-host PASSWORD = {SECRET} dbname=agentdb", "host=db-host PASSWORD = *** dbname=agentdb"),
        (f"host=db-host password='{SECRET} with spaces \\' and a quote' dbname=agentdb", "host=db-host password=*** dbname=agentdb"),
        (f"host=db-host password={SECRET}\\ escaped dbname=agentdb", "host=db-host password=*** dbname=agentdb"),
        # Malformed, refused by libpq: still masked whole.
        (f"host=db-host password={SECRET} unquoted", "host=db-host password=***"),
        (f"host=db-host password='{SECRET} never closed", "host=db-host password=***"),
        ("sqlite:///.agent/checkpoints.sqlite", "sqlite:///.agent/checkpoints.sqlite"),
        ("memory://", "memory://"),
        ("host=db-host dbname=agentdb", "host=db-host dbname=agentdb"),
    ],
)
def test_mask_url_masks_the_password_of_every_libpq_form(url, kept):
    masked = mask_url(url)
    assert masked == kept
    assert SECRET not in masked and "unquoted" not in masked and "spaces" not in masked


@pytest.mark.parametrize(
    "url",
    [
        f"host=127.0.0.1 password={SECRET} unquoted",  # libpq: missing "=" after "unquoted"
        f"host=127.0.0.1 password=pa55 {SECRET}",  # the message quotes the password's second half
        f"host=127.0.0.1 password='{SECRET} never closed",
        f"host=127.0.0.1 port=5432 =value password={SECRET}",
        f"postgresql://agent:{SECRET}@127.0.0.1:5432/agentdb?sslmode=bogus&connect_timeout=1",
        f"postgresql://agent:{SECRET}@[::1/agentdb",
    ],
)
def test_a_malformed_connection_string_is_a_configuration_error_with_the_password_masked(url):
    try:
        create_agent(url, model="offline", tracing=False, pool_timeout=1)
    except ConfigurationError as err:
        assert "Malformed Postgres connection string" in err.message
        assert SECRET not in err.message and SECRET not in str(err)
    except StorageUnavailable as err:  # well-formed enough for libpq's parser, refused when connecting
        assert SECRET not in err.message and SECRET not in str(err)
    else:
        pytest.fail("the agent was created")


@pytest.mark.slow
@pytest.mark.parametrize("form", ["url", "query", "key=value", "quoted"])
def test_tt_agent_serve_masks_the_password_when_the_database_is_unreachable(tmp_path, form):
    port = free_port()  # nothing listens there
    url = {
        "url": f"postgresql://agent:{SECRET}@127.0.0.1:{port}/agentdb",
        "query": f"postgresql://agent@127.0.0.1:{port}/agentdb?password={SECRET}",
        "key=value": f"host=127.0.0.1 port={port} user=agent password={SECRET} dbname=agentdb",
        "quoted": f"host=127.0.0.1 port={port} user=agent password='{SECRET} x' dbname=agentdb",
    }[form]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_"))}
    done = run_agent_cli(  # `python -m agent serve ...`, forked from the preloaded interpreter
        ["serve", "--port", str(free_port()), "--database-url", url],
        cwd=tmp_path, env={**env, "AGENT_POOL_TIMEOUT": "1", "AGENT_TRACING": "false"}, stdin=None, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "***" in done.stderr and "agentdb" in done.stderr


def test_unreachable_postgres_with_deferred_connect_fails_on_the_first_request():
    port = free_port()
    url = f"postgresql://agent:{SECRET}@127.0.0.1:{port}/agentdb"
    agent = create_agent(url, model="offline", tracing=False, pool_timeout=1, connect=False)
    try:
        with pytest.raises(StorageUnavailable) as err:
            say(agent, TRIP[0])
        assert SECRET not in err.value.message
        assert f"127.0.0.1:{port}/agentdb" in err.value.message
    finally:
        agent.close()


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"pool_size": 3}, "pool_size"),
        ({"databse_url": "memory://"}, "databse_url"),
        ({"pool_max_size": 0}, "pool_max_size"),
        ({"multitask_strategy": "yolo"}, "multitask_strategy"),
        ({"pool_timeout": "soon"}, "pool_timeout"),
    ],
)
def test_unknown_or_invalid_setting_is_a_configuration_error_naming_it(settings, named):
    with pytest.raises(ConfigurationError) as err:
        create_agent("memory://", model="offline", tracing=False, **settings)
    assert named in err.value.message


@pytest.mark.parametrize(
    "value, origins",
    [
        ("https://chat.example.com, http://localhost:5173", ["https://chat.example.com", "http://localhost:5173"]),
        ('["https://chat.example.com"]', ["https://chat.example.com"]),
        ("*", ["*"]),
        ("", []),
    ],
)
def test_cors_origins_come_from_the_environment_comma_separated_or_as_json(monkeypatch, value, origins):
    monkeypatch.setenv("AGENT_CORS_ORIGINS", value)
    assert load_settings(database_url="memory://").cors_origins == origins


def test_no_cors_origin_by_default_and_one_with_a_path_is_a_configuration_error(monkeypatch):
    monkeypatch.delenv("AGENT_CORS_ORIGINS", raising=False)
    assert load_settings(database_url="memory://").cors_origins == []
    for wrong in ("https://chat.example.com/", "chat.example.com", "https://chat.example.com/app"):
        with pytest.raises(ConfigurationError, match="cors_origins"):
            load_settings(database_url="memory://", cors_origins=[wrong])


def test_allowed_hosts_come_from_the_environment_and_a_url_or_port_is_a_configuration_error(monkeypatch):
    monkeypatch.setenv("AGENT_ALLOWED_HOSTS", "chat.example.com, *.example.org,[::1],127.0.0.1")
    assert load_settings(database_url="memory://").allowed_hosts == ["chat.example.com", "*.example.org", "[::1]", "127.0.0.1"]
    monkeypatch.delenv("AGENT_ALLOWED_HOSTS")
    assert load_settings(database_url="memory://").allowed_hosts == []
    for wrong in ("https://chat.example.com", "chat.example.com:8000", "chat.example.com/app", "::1"):
        with pytest.raises(ConfigurationError, match="allowed_hosts"):
            load_settings(database_url="memory://", allowed_hosts=[wrong])


@pytest.mark.parametrize("wrong", ["X-Forwarded User", "X-Forwarded-User:", " X-User", "X-User\n", "X-Üser"])
def test_a_user_id_header_that_is_no_http_header_name_is_a_configuration_error_at_start_up(monkeypatch, wrong):
    # Found by a new user: the server started, and no request could carry the header, so every caller was anonymous.
    monkeypatch.setenv("AGENT_USER_ID_HEADER", wrong)
    with pytest.raises(ConfigurationError, match=r"user_id_header: .* is not an HTTP header name"):
        load_settings(database_url="memory://")
    monkeypatch.setenv("AGENT_USER_ID_HEADER", "X-Forwarded-User")
    assert load_settings(database_url="memory://").user_id_header == "X-Forwarded-User"


def test_is_loopback_tells_the_addresses_that_serve_only_this_machine():
    from agent.serving.app import is_loopback

    assert all(is_loopback(host) for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "::", "10.1.2.3", "agent.example.com"))


def test_environment_configures_database_model_and_settings(tmp_path, monkeypatch):
    path = tmp_path / "from-env.sqlite"
    monkeypatch.setenv("AGENT_DATABASE_URL", f"sqlite:///{path}")
    monkeypatch.setenv("AGENT_POOL_MAX_SIZE", "3")
    # A key would select an OpenAI model; AGENT_MODEL overrides that choice.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used-by-the-offline-model")
    monkeypatch.setenv("AGENT_MODEL", "offline")
    with create_agent(tracing=False) as agent:
        assert agent.settings.pool_max_size == 3
        reply = say(agent, TRIP[1])
        assert text_of(reply).startswith("[offline model]")
    with sqlite3.connect(path) as conn:
        threads = [row[0] for row in conn.execute("SELECT thread_id FROM agent_threads")]
    assert threads == [outputs(reply)["thread_id"]]


def test_memory_url_from_the_environment_keeps_nothing_on_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENT_DATABASE_URL", "memory://")
    with create_agent(model="offline", tracing=False) as agent:
        assert isinstance(agent.storage, SqliteThreadStorage) and agent.storage.path == ":memory:"
        ids = outputs(say(agent, TRIP[1]))
        assert len(agent.get_checkpoint_history(ids["thread_id"])) == 2  # the root and the turn
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model", ["", "   "])
def test_an_empty_or_blank_model_name_is_a_configuration_error_not_the_offline_model(tmp_path, model):
    # A new-user trial's create_agent(model="") ran the offline model silently, while "   " was refused.
    with pytest.raises(ConfigurationError, match="names no model"):
        create_agent(f"sqlite:///{tmp_path / 'never.sqlite'}", model=model, tracing=False)
    assert not (tmp_path / "never.sqlite").exists()


def test_an_empty_agent_variable_is_an_unset_one_and_a_blank_model_is_refused(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")
    monkeypatch.setenv("AGENT_MODEL", "")
    monkeypatch.setenv("AGENT_POOL_MAX_SIZE", "")
    settings = load_settings()
    # As if neither were set: the key selects the OpenAI default, and the pool its default size.
    assert settings.model == DEFAULT_OPENAI_MODEL and settings.pool_max_size == AgentSettings().pool_max_size
    monkeypatch.setenv("AGENT_MODEL", "  ")
    with pytest.raises(ConfigurationError, match="AGENT_MODEL"):
        load_settings()


def test_arguments_win_over_the_environment(tmp_path, monkeypatch):
    from_env = tmp_path / "from-env.sqlite"
    monkeypatch.setenv("AGENT_DATABASE_URL", f"sqlite:///{from_env}")
    monkeypatch.setenv("AGENT_MODEL", "some-openai-model")
    with create_agent(f"sqlite:///{tmp_path / 'explicit.sqlite'}", model="offline", tracing=False) as agent:
        assert text_of(say(agent, TRIP[1])).startswith("[offline model]")
    assert (tmp_path / "explicit.sqlite").exists()
    assert not from_env.exists()


def test_default_store_is_the_embedded_sqlite_file_under_dot_agent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with create_agent(tracing=False) as agent:
        assert isinstance(agent.storage, SqliteThreadStorage)
        reply = say(agent, TRIP[1])
        assert text_of(reply).startswith("[offline model]")  # no key configured: the offline model
    path = tmp_path / ".agent" / "checkpoints.sqlite"
    assert path.is_file()
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (outputs(reply)["thread_id"],))
        assert rows.fetchone()[0] == 2  # the root and the turn
    # A second agent in the same directory finds the thread.
    with create_agent(model="offline", tracing=False) as again:
        assert len(again.get_checkpoint_history(outputs(reply)["thread_id"])) == 2


# --- the Postgres pool's lifecycle ------------------------------------------------------------


def with_application_name(url: str) -> tuple[str, str]:
    """`url` with a unique application_name, so pg_stat_activity shows this agent's connections only."""
    name = f"tt-test-{uuid.uuid4().hex[:12]}"
    return f"{url}?application_name={name}", name


def connections_of(server_url: str, application_name: str) -> int:
    with psycopg.connect(server_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchone()[0]


def wait_for_no_connections(server_url: str, application_name: str, timeout: float = 10.0) -> int:
    """The connection count once it reaches 0, or what it is after `timeout` s.

    A backend leaves pg_stat_activity a moment after its client hung up.
    """
    deadline = time.monotonic() + timeout
    while (count := connections_of(server_url, application_name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def test_close_releases_every_postgres_connection(pg_url, pg_server_url):
    url, name = with_application_name(pg_url)
    agent = create_agent(url, model="offline", tracing=False, pool_min_size=2)
    say(agent, TRIP[0])
    assert connections_of(pg_server_url, name) >= 1
    agent.close()
    assert agent.storage.pool.closed
    assert wait_for_no_connections(pg_server_url, name) == 0


def test_context_manager_releases_every_postgres_connection(pg_url, pg_server_url):
    url, name = with_application_name(pg_url)
    with create_agent(url, model="offline", tracing=False) as agent:
        ids = outputs(say(agent, TRIP[0]))
        assert connections_of(pg_server_url, name) >= 1
    assert wait_for_no_connections(pg_server_url, name) == 0
    # The thread outlives the agent.
    with create_agent(pg_url, model="offline", tracing=False) as again:
        assert len(again.get_checkpoint_history(ids["thread_id"])) == 2


def test_graph_and_pool_are_built_once_per_agent(pg_url, pg_server_url, make_agent):
    url, name = with_application_name(pg_url)
    agent = make_agent(url, pool_min_size=1, pool_max_size=3)
    graph, pool = agent.graph, agent.storage.pool

    thread_id = None
    for n in range(10):
        thread_id = outputs(say(agent, f"message {n}", thread_id=thread_id))["thread_id"]
        agent.get_checkpoint_history(thread_id)
    # More turns at once than the pool has connections: they share the three.
    with ThreadPoolExecutor(max_workers=8) as workers:
        replies = list(workers.map(lambda n: say(agent, f"parallel {n}"), range(16)))
    assert all(text_of(reply).startswith("[offline model]") for reply in replies)

    assert agent.graph is graph and agent.storage.pool is pool
    stats = pool.get_stats()
    # connections_num counts every connection the pool ever opened.
    assert stats["connections_num"] <= 3
    assert stats["pool_size"] <= 3
    assert connections_of(pg_server_url, name) <= 3
    assert isinstance(agent.storage, PostgresThreadStorage)
