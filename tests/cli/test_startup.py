"""Start-up: what `tt-agent --help`, `--version`, `tt-agent history` and `import agent` load.

No timing is asserted here (the machine is shared and noisy): `bench/startup.py`
measures the start-up against `python -c pass`. These tests hold what makes it
fast: the help, the version and a history read on the SQLite default import
neither MLflow, LangChain nor LangGraph (each costs about a second or more),
`from agent import create_agent` loads no serving stack, an offline agent
loads no OpenAI client nor tokenizer, and tracing imports MLflow only to record.

Imports are read from `python -X importtime`, which lists every module a
process imported, on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import create_agent

HEAVY = ("mlflow", "langchain_core", "langchain_openai", "langgraph")
SERVING = ("agent.serving.app", "agent.serving.agent_server", "fastapi", "uvicorn")


def imported_modules(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime *args` in `cwd` with no AGENT_*/MLFLOW_* settings; the result and the modules it imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_", "OPENAI_"))}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    modules = {
        line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    return result, modules


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules among `modules` that are one of `names` or inside one of them."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize(
    "args", [["--help"], ["-h"], ["--version"], ["history", "--help"], ["demo", "-h"]], ids=" ".join
)
def test_help_and_version_import_neither_mlflow_langchain_nor_langgraph(args, tmp_path):
    result, modules = imported_modules(["-m", "agent", *args], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "agent.cli" in modules  # the measurement saw the command line itself
    assert loaded(modules, HEAVY) == []
    assert loaded(modules, ("pydantic_settings",)) == []  # the settings load when a command runs (150 ms)


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--database-url", "nosuch://x"],
        ["demo", "--database-url", "sqlite://"],
        ["chat", "--database-url", "nosuch://x"],
        ["serve", "--port", "0", "--database-url", "nosuch://x"],
    ],
    ids=" ".join,
)
def test_a_bad_database_url_fails_with_its_message_before_mlflow_langchain_or_langgraph_is_imported(args, tmp_path):
    # `demo`, `chat` and `serve` imported MLflow (about 2.4 s of CPU) before the URL was looked at.
    result, modules = imported_modules(["-m", "agent", *args], tmp_path)
    assert result.returncode == 1
    assert ("Unknown database URL scheme 'nosuch'" if "nosuch" in args[-1] else "A sqlite URL needs a path") in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert loaded(modules, HEAVY) == []
    assert not (tmp_path / ".agent").exists()  # nothing created


@pytest.fixture(scope="module")
def default_store(tmp_path_factory) -> tuple[Path, str]:
    """A directory whose default store (.agent/checkpoints.sqlite) holds one thread of two turns."""
    cwd = tmp_path_factory.mktemp("store")
    url = f"sqlite:///{cwd / '.agent' / 'checkpoints.sqlite'}"
    with create_agent(url, model="offline", tracing=False) as agent:
        first = agent.predict({"input": [{"role": "user", "content": "I'm headed to SF!"}]})
        thread_id = first.custom_outputs["thread_id"]
        agent.predict({"input": [{"role": "user", "content": "Where?"}], "custom_inputs": {"thread_id": thread_id}})
    return cwd, thread_id


def test_history_on_the_sqlite_default_imports_neither_mlflow_langchain_nor_langgraph(default_store):
    cwd, thread_id = default_store
    result, modules = imported_modules(["-m", "agent", "history", thread_id, "--tree"], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "I'm headed to SF!" in result.stdout and "branch" not in result.stdout  # it did read the thread
    assert "agent.storage.sqlite.reads" in modules
    assert loaded(modules, HEAVY) == []


@pytest.mark.parametrize("args", [["threads"], ["threads", "--json"], ["threads", "show", "THREAD"]], ids=" ".join)
def test_listing_threads_on_the_sqlite_default_imports_neither_mlflow_langchain_nor_langgraph(default_store, args):
    cwd, thread_id = default_store
    result, modules = imported_modules(["-m", "agent", *[thread_id if a == "THREAD" else a for a in args]], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert thread_id in result.stdout
    assert loaded(modules, HEAVY) == []


@pytest.mark.parametrize(
    "args", [["usage", "THREAD"], ["export", "THREAD"], ["fork", "THREAD"], ["sweep"]], ids=" ".join
)
def test_commands_that_send_no_message_build_an_agent_without_mlflow(default_store, args):
    # They need the whole agent (LangGraph, the graph) but not MLflow's ResponsesAgent: the plain `Agent`.
    cwd, thread_id = default_store
    result, modules = imported_modules(["-m", "agent", *[thread_id if a == "THREAD" else a for a in args]], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "langgraph" in modules and "agent.factory" in modules  # the whole agent was built
    assert loaded(modules, ("mlflow",)) == []


def test_a_plain_agent_imports_mlflow_only_to_draw_responses_items(default_store):
    # MLflow's item helpers own the Responses format (agent.items): the first state read loads them.
    cwd, thread_id = default_store
    code = (
        "import sys\n"
        "from agent.agent import Agent\n"
        "from agent.factory import build_agent\n"
        f"with build_agent(Agent, 'sqlite:///{cwd / '.agent' / 'checkpoints.sqlite'}', model='offline') as agent:\n"
        "    print('mlflow' in sys.modules)\n"
        f"    state = agent.get_checkpoint_state('{thread_id}')\n"
        "    print('mlflow' in sys.modules, state['messages'][0]['content'][0]['text'])\n"
    )
    result, _ = imported_modules(["-c", code], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["False", "True I'm headed to SF!"]


def test_history_of_a_store_of_an_older_layout_still_works_through_the_full_storage(default_store, tmp_path):
    # A file whose agent_threads lacks a column the light reader selects: it is migrated, not refused.
    cwd, thread_id = default_store
    old = tmp_path / "old.sqlite"
    old.write_bytes((cwd / ".agent" / "checkpoints.sqlite").read_bytes())
    import sqlite3

    with sqlite3.connect(old) as conn:
        conn.execute("ALTER TABLE agent_threads DROP COLUMN ttl_seconds")
        conn.execute("PRAGMA user_version = 1")
    result, modules = imported_modules(["-m", "agent", "history", thread_id, "--database-url", f"sqlite:///{old}"], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Where?" in result.stdout
    assert "langgraph" in modules  # the full storage ran its migrations


def test_importing_agent_for_create_agent_loads_no_serving_stack_nor_mlflow(tmp_path):
    result, modules = imported_modules(["-c", "import agent; from agent import create_agent, ThreadNotFound"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert loaded(modules, SERVING + HEAVY) == []


def test_an_agent_built_and_used_in_python_loads_no_server(tmp_path):
    # MLflow itself imports FastAPI (mlflow.gateway), so only our server modules and uvicorn are checked.
    code = (
        "import sys\n"
        "from agent import create_agent\n"
        "with create_agent('memory://', model='offline') as agent:\n"
        "    agent.predict({'input': [{'role': 'user', 'content': 'hi'}]})\n"
        "print(sorted(m for m in ('agent.serving.app', 'agent.serving.agent_server', 'uvicorn') if m in sys.modules))\n"
    )
    result, _ = imported_modules(["-c", code], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_an_offline_agent_loads_no_openai_client_nor_tokenizer(tmp_path):
    result, modules = imported_modules(
        ["-c", "from agent import create_agent; create_agent('memory://', model='offline').close()"], tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "agent.context.tokens" in modules  # the token counter was chosen
    assert loaded(modules, ("langchain_openai", "openai", "tiktoken")) == []


def test_tracing_imports_no_mlflow_until_it_records(tmp_path):
    # The graph's model-call span, the trace tags and switching tracing off run in every turn and at
    # start-up; without an imported MLflow there is no trace to add to, so none of them imports it.
    code = (
        "import sys\n"
        "from langchain_core.messages import AIMessage, HumanMessage\n"
        "import agent.graph\n"
        "from agent.tracing import disable_tracing, model_call_span, scrub_trace_inputs, tag_trace\n"
        "disable_tracing()\n"
        "tag_trace('thread', 'checkpoint', user_id='user')\n"
        "scrub_trace_inputs()\n"
        "with model_call_span([HumanMessage('hi')]) as span:\n"
        "    span.reply(AIMessage('hello'))\n"
        "print('mlflow' in sys.modules)\n"
        "from agent.tracing import use_default_tracking_uri\n"
        "use_default_tracking_uri()\n"
        "print('mlflow' in sys.modules)\n"
    )
    result, _ = imported_modules(["-c", code], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "True"]  # recording (its store) does import it
