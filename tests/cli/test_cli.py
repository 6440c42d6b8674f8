"""The `tt-agent` command line, run for real in separate processes (`python -m agent ...`, forked from a
preloaded interpreter: see `run_cli`).

Each test starts the CLI as a user would: a separate process, a fresh working
directory, no OPENAI_* or AGENT_* variables (so the offline model and the
default store are used unless a test sets them), and checks what it prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.preloaded import run_agent_cli
from tests.helpers.scenario import TRIP

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
SHORT = 8  # characters of a checkpoint id the tables show (its end)


def run_cli(
    *args: str, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None, new_interpreter: bool = False
):
    """Run `python -m agent *args` in `cwd` with a clean environment; returns the CompletedProcess.

    The process is forked from the preloaded server (`tests.helpers.preloaded.run_agent_cli`): a separate
    process with its own environment, directory, arguments and streams, which does not import the agent
    again. `new_interpreter` starts a new interpreter instead, for what happens at a fresh start (MLflow
    sets up its logging when it is first imported); tests/cli/test_startup.py checks the imports themselves.
    """
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "AGENT_", "MLFLOW_")) and k != "COLUMNS"
    }
    clean.update(env or {})
    if new_interpreter:
        command = [sys.executable, "-m", "agent", *args]
        return subprocess.run(command, cwd=cwd, env=clean, input=stdin, capture_output=True, text=True, timeout=300)
    return run_agent_cli(args, cwd=cwd, env=clean, stdin=stdin, timeout=300)


def steps(stdout: str) -> dict[int, str]:
    """The demo's output cut at its numbered step headings ("1. ...", "2. ...")."""
    parts = re.split(r"^(\d+)\. ", stdout, flags=re.MULTILINE)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def replies(text: str) -> list[str]:
    """The agent's replies printed in `text`."""
    return re.findall(r"agent › (.*)", text)


def saved_checkpoints(text: str) -> list[str]:
    """The checkpoint ids of the turns in `text`, in order."""
    return re.findall(rf"saved as checkpoint ({UUID})", text)


def assert_clean_success(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr


def check_demo_output(stdout: str) -> dict:
    """Assert everything the demo must show; returns the thread id and the turns' checkpoint ids."""
    parts = steps(stdout)
    assert sorted(parts) == [1, 2, 3, 4, 5, 6, 7]
    thread_id = re.search(rf"new thread_id ({UUID})", parts[1]).group(1)
    turn1, turn2, turn3 = (saved_checkpoints(parts[n])[0] for n in (1, 2, 3))

    # Turn 3 remembers turns 1 and 2: the offline model quotes what it was given.
    answer = replies(parts[3])[0]
    assert "SF" in answer and TRIP[0] in answer

    # Step 4: the history table lists the three turns, newest first, by short id.
    assert "checkpoint" in parts[4] and "last message" in parts[4]
    shown = [parts[4].index(cid[-SHORT:]) for cid in (turn3, turn2, turn1)]
    assert shown == sorted(shown)

    # Step 5 branches from turn 1's checkpoint; the new turn's parent is that checkpoint.
    assert turn1 in parts[5]
    assert f"(parent {turn1[-SHORT:]})" in parts[5]
    branched = saved_checkpoints(parts[5])[0]

    # Step 6 continues on the branch: New York, not SF.
    branch_answer = replies(parts[6])[0]
    assert "New York" in branch_answer and "SF" not in branch_answer
    assert f"(parent {branched[-SHORT:]})" in parts[6]
    assert "✓ The answer sees New York and not SF" in parts[6]

    # Step 7: the SF branch is still listed, in the table and as its own branch of the tree.
    assert turn3[-SHORT:] in parts[7] and branched[-SHORT:] in parts[7]
    assert "branch 1" in parts[7] and "branch 2" in parts[7]
    assert "SF branch" in parts[7]
    assert f"The SF branch is still listed (checkpoint {turn3[-SHORT:]})" in parts[7]
    return {"thread_id": thread_id, "turns": (turn1, turn2, turn3), "branched": branched}


def test_demo_remembers_branches_and_keeps_the_sf_branch(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.sqlite'}"
    result = run_cli("demo", "--database-url", url, cwd=tmp_path)
    assert_clean_success(result)
    check_demo_output(result.stdout)
    assert "Model: offline" in result.stdout


@pytest.fixture(scope="module")
def zero_config_demo(tmp_path_factory):
    """`tt-agent demo` with no options and no environment, in an empty directory."""
    cwd = tmp_path_factory.mktemp("zero-config")
    result = run_cli("demo", cwd=cwd)
    assert_clean_success(result)
    return cwd, result, check_demo_output(result.stdout)


def test_demo_without_configuration_stores_under_dot_agent_in_cwd(zero_config_demo):
    cwd, result, _ = zero_config_demo
    assert f"Store: {cwd / '.agent' / 'checkpoints.sqlite'}" in result.stdout  # the absolute path
    assert (cwd / ".agent" / "checkpoints.sqlite").is_file()
    # Tracing is off by default on the command line, so nothing else appears (no mlflow.db, no mlruns/).
    assert sorted(p.name for p in cwd.iterdir()) == [".agent"]


def test_demo_uses_a_fresh_thread_on_each_run(zero_config_demo):
    cwd, _, first = zero_config_demo
    again = run_cli("demo", cwd=cwd)
    assert_clean_success(again)
    assert check_demo_output(again.stdout)["thread_id"] != first["thread_id"]


def test_history_lists_a_demo_thread_newest_first_from_another_process(zero_config_demo):
    cwd, _, demo = zero_config_demo
    result = run_cli("history", demo["thread_id"], "--full-ids", "--tree", cwd=cwd)
    assert_clean_success(result)
    turn1, turn2, turn3 = demo["turns"]
    positions = [result.stdout.index(f"{cid[-SHORT:]} = {cid}") for cid in (demo["branched"], turn3, turn2, turn1)]
    assert positions == sorted(positions)  # newest first; the SF branch is still there
    assert "branch 1" in result.stdout and "branch 2" in result.stdout


def test_history_limit_and_before_page_backwards_by_short_id(zero_config_demo):
    cwd, _, demo = zero_config_demo
    turn1, turn2, turn3 = demo["turns"]
    result = run_cli("history", demo["thread_id"], "--before", turn3[-SHORT:], "--limit", "1", cwd=cwd)
    assert_clean_success(result)
    rows = re.findall(r"^│ ([0-9a-f]{8}) ", result.stdout, flags=re.MULTILINE)
    assert rows == [turn2[-SHORT:]]  # one entry, the one right before turn 3 on its branch


def test_history_reads_the_database_url_from_the_environment(zero_config_demo, tmp_path):
    cwd, _, demo = zero_config_demo
    env = {"AGENT_DATABASE_URL": f"sqlite:///{cwd / '.agent' / 'checkpoints.sqlite'}"}
    result = run_cli("history", demo["thread_id"], cwd=tmp_path, env=env)
    assert_clean_success(result)
    assert demo["turns"][0][-SHORT:] in result.stdout
    assert not (tmp_path / ".agent").exists()


def test_history_of_unknown_thread_exits_1_with_a_message_and_no_traceback(zero_config_demo):
    cwd, _, _ = zero_config_demo
    result = run_cli("history", "no-such-thread", cwd=cwd)
    assert result.returncode == 1
    assert "Thread 'no-such-thread' was not found" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_demo_with_unknown_url_scheme_exits_1_without_traceback(tmp_path):
    result = run_cli("demo", "--database-url", "nosuchdb://somewhere", cwd=tmp_path)
    assert result.returncode == 1
    assert "Unknown database URL scheme 'nosuchdb'" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_chat_remembers_lists_history_and_branches_from_piped_commands(tmp_path):
    url = f"sqlite:///{tmp_path / 'chat.sqlite'}"
    first = run_cli(
        "chat",
        "--database-url",
        url,
        cwd=tmp_path,
        stdin=f"{TRIP[0]}\nI'm headed to SF!\n/history\n/quit\n",
    )
    assert_clean_success(first)
    thread_id = re.search(rf"new thread_id ({UUID})", first.stdout).group(1)
    turn1, turn2 = saved_checkpoints(first.stdout)
    assert "SF" in replies(first.stdout)[1] and TRIP[0] in replies(first.stdout)[1]
    history = first.stdout.split("/history", 1)[1]
    assert history.index(turn2[-SHORT:]) < history.index(turn1[-SHORT:])  # the table, newest first

    # A second session: switch to the thread, branch from turn 1 by short id, continue on the branch.
    second = run_cli(
        "chat",
        "--database-url",
        url,
        cwd=tmp_path,
        stdin="\n".join(
            [
                f"/thread {thread_id}",
                "/branch zzzzzzzz",
                f"/branch {turn1[-SHORT:]}",
                "I'm headed to New York!",
                "Where am I going?",
                "/bogus",
                "/new",
                "Hello again",
                "/quit",
                "never sent",
            ]
        )
        + "\n",
    )
    assert_clean_success(second)
    out = second.stdout
    assert f"Switched to thread {thread_id}" in out
    assert "No checkpoint of thread" in out and "'zzzzzzzz'" in out  # an AgentError, printed, and the chat goes on
    branched, answered, fresh = saved_checkpoints(out)
    assert f"saved as checkpoint {branched} (parent {turn1[-SHORT:]})" in out
    branch_answer = replies(out)[1]
    assert "New York" in branch_answer and "SF" not in branch_answer
    assert "Unknown command /bogus" in out
    assert re.search(rf"new thread_id (?!{thread_id}){UUID}", out)  # /new started another thread
    assert "never sent" not in "".join(replies(out))  # /quit ended the session

    # The SF branch survives the branch.
    listed = run_cli("history", thread_id, "--database-url", url, "--full-ids", cwd=tmp_path)
    assert_clean_success(listed)
    for cid in (turn1, turn2, branched, answered):
        assert cid in listed.stdout


def test_chat_streams_tool_calls_and_ends_on_end_of_input(tmp_path):
    result = run_cli(
        "chat", "--database-url", f"sqlite:///{tmp_path / 'c.sqlite'}", cwd=tmp_path, stdin="calculate 6*7\n"
    )
    assert_clean_success(result)
    assert "tool call calculator" in result.stdout
    assert "The calculator says: 42" in replies(result.stdout)[0]


def test_demo_on_postgres(pg_url, tmp_path):
    result = run_cli("demo", "--database-url", pg_url, cwd=tmp_path)
    assert_clean_success(result)
    demo = check_demo_output(result.stdout)
    assert "Store: postgresql://" in result.stdout
    listed = run_cli("history", demo["thread_id"], "--database-url", pg_url, "--full-ids", cwd=tmp_path)
    assert_clean_success(listed)
    assert demo["turns"][2] in listed.stdout
    assert not (tmp_path / ".agent").exists()


def test_serve_with_unknown_url_scheme_exits_1_before_binding(tmp_path):
    result = run_cli("serve", "--port", "0", "--database-url", "nosuchdb://somewhere", cwd=tmp_path)
    assert result.returncode == 1
    assert "Unknown database URL scheme 'nosuchdb'" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# -- one store, named ------------------------------------------------------------------------------
def test_history_of_an_unknown_thread_names_the_store_it_searched(zero_config_demo):
    cwd, _, _ = zero_config_demo
    result = run_cli("history", "no-such-thread", cwd=cwd)
    assert result.returncode == 1
    assert str(cwd / ".agent" / "checkpoints.sqlite") in " ".join(result.stderr.split())


def test_history_in_a_directory_without_a_store_creates_none_and_says_where_it_looked(tmp_path):
    result = run_cli("history", "some-thread", cwd=tmp_path)
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert f"There is no store at {tmp_path / '.agent' / 'checkpoints.sqlite'}" in message
    assert "--database-url" in message and "AGENT_DATABASE_URL" in message
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_history_on_memory_is_refused_because_nothing_outlives_the_process(tmp_path):
    result = run_cli("history", "some-thread", "--database-url", "memory://", cwd=tmp_path)
    assert result.returncode == 1
    assert "memory://" in result.stderr and "--database-url" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_history_on_a_postgres_database_without_the_agent_tables_creates_none(pg_server_url, tmp_path):
    import psycopg

    from tests.helpers.databases import fresh_database

    with fresh_database(pg_server_url, prefix="tt_readonly") as url:
        result = run_cli("history", "some-thread", "--database-url", url, cwd=tmp_path)
        assert result.returncode == 1
        message = " ".join(result.stderr.split())
        assert "There is no store in postgresql://" in message and "nothing was created" in message
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('agent_threads')").fetchone()[0] is None


def test_chat_banner_and_its_not_found_errors_name_the_store(tmp_path):
    result = run_cli("chat", cwd=tmp_path, stdin="hello\n/branch zzzzzzzz\n/quit\n")
    assert_clean_success(result)
    store = tmp_path / ".agent" / "checkpoints.sqlite"
    shown = " ".join(result.stdout.split())  # the terminal wraps a long store path onto lines of its own
    assert f"Store: {store} Model: offline" in shown
    assert f"has the id or short id 'zzzzzzzz' in the store {store}." in shown


def test_chat_on_postgres_names_the_store_with_its_password_masked(pg_url, tmp_path):
    secret_url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")  # trust auth ignores it
    result = run_cli("chat", "--database-url", secret_url, cwd=tmp_path, stdin="/quit\n")
    assert_clean_success(result)
    assert "Store: postgresql://postgres:***@" in result.stdout
    assert "s3cret" not in result.stdout + result.stderr


def test_read_only_open_agent_creates_no_sqlite_file_and_no_postgres_tables(pg_server_url, tmp_path):
    # For the read-only commands that need the whole agent (listings, export), not only history's reads.
    import psycopg

    from agent.cli import open_agent
    from agent.errors import ConfigurationError
    from tests.helpers.databases import fresh_database

    missing = tmp_path / "none" / "checkpoints.sqlite"
    with pytest.raises(ConfigurationError, match=f"There is no store at {missing}"):
        with open_agent(f"sqlite:///{missing}", "offline", False, read_only=True):
            pass
    assert not missing.parent.exists()
    with fresh_database(pg_server_url, prefix="tt_readonly") as url:
        with pytest.raises(ConfigurationError, match="its tables do not exist"):
            with open_agent(url, "offline", False, read_only=True):
                pass
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('agent_threads')").fetchone()[0] is None
