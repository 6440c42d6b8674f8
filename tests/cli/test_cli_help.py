"""`tt-agent`'s help, version, suggestions and hints read like other command lines' and work as printed."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.servers import REPO_ROOT
from tests.cli.test_cli import assert_clean_success, run_cli

COMMANDS = ["demo", "chat", "history", "serve"]


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_shows_flags_as_flags_and_values_by_metavar(command, tmp_path):
    result = run_cli(command, "--help", cwd=tmp_path)
    assert_clean_success(result)
    # Typer's own style would print "--tree <bool>", "thread_id <str>" and "{thread_id}".
    assert not re.search(r"<(bool|str|int|float)[^>]*>", result.stdout), result.stdout
    assert "{" not in result.stdout
    assert re.search(r"--database-url\s+URL\s", result.stdout)


def test_history_usage_names_its_argument_like_other_command_lines(tmp_path):
    result = run_cli("history", "--help", cwd=tmp_path)
    assert "Usage: tt-agent history [OPTIONS] THREAD_ID" in result.stdout
    assert re.search(r"--tree\s+Also draw", result.stdout)  # a flag: no value shown
    missing = run_cli("history", cwd=tmp_path)
    assert missing.returncode == 2 and "Missing argument 'THREAD_ID'" in missing.stderr


@pytest.mark.parametrize("args", [["-h"], ["history", "-h"]], ids=" ".join)
def test_dash_h_is_the_same_as_dash_dash_help(args, tmp_path):
    short = run_cli(*args, cwd=tmp_path)
    long = run_cli(*args[:-1], "--help", cwd=tmp_path)
    assert_clean_success(short)
    assert short.stdout == long.stdout


def test_version_prints_the_installed_version(tmp_path):
    result = run_cli("--version", cwd=tmp_path)
    assert_clean_success(result)
    assert result.stdout.strip() == f"tt-agent {importlib.metadata.version('timetravel-agent')}"


def test_a_near_miss_of_the_offline_model_name_is_refused_with_a_suggestion(tmp_path):
    result = run_cli("demo", "--model", "offlin", cwd=tmp_path)
    assert result.returncode == 1
    assert "did you mean 'offline'?" in result.stderr
    assert "Missing credentials" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / ".agent").exists()  # refused before the store was opened


def _without_venv_on_path(env: dict[str, str]) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != Path(venv_bin))
    return {**env, "PATH": path}


def test_the_demo_hint_runs_as_printed_in_the_same_shell(tmp_path):
    # As after the Quick start: `.venv/` below the current directory, not activated (not on PATH).
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    env = _without_venv_on_path({k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_"))})
    demo = subprocess.run(
        [".venv/bin/tt-agent", "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert_clean_success(demo)
    last = demo.stdout.strip().splitlines()[-1]
    hint = re.fullmatch(r"See this thread again with: (.*)", last)
    assert hint and hint.group(1).startswith(".venv/bin/tt-agent history "), last
    again = subprocess.run(["bash", "-c", hint.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert_clean_success(again)
    assert "branch 1" in again.stdout and "branch 2" in again.stdout


def test_the_demo_on_memory_gives_no_hint_to_a_thread_that_is_gone(tmp_path):
    result = run_cli("demo", "--database-url", "memory://", cwd=tmp_path)
    assert_clean_success(result)
    last = result.stdout.strip().splitlines()[-1]
    assert "history" not in last and "memory://" in last


def test_a_demo_hint_repeats_a_given_database_url_with_its_password_masked(monkeypatch):
    from agent.cli.app import rerun_hint

    monkeypatch.delenv("AGENT_DATABASE_URL", raising=False)
    hint = rerun_hint(["memories", "--user-id", "ana"], "postgresql://ana:s3cret@db-host/agent")
    assert hint.endswith(" memories --user-id ana --database-url 'postgresql://ana:***@db-host/agent'")
    assert rerun_hint(["memories"], "memory://") is None


def test_the_demo_script_runs_in_the_directory_it_was_started_from(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "MLFLOW_"))}
    result = subprocess.run(
        [str(REPO_ROOT / "scripts" / "demo.sh")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert_clean_success(result)
    assert (tmp_path / ".agent" / "checkpoints.sqlite").is_file()
    assert f"Store: {tmp_path / '.agent' / 'checkpoints.sqlite'}" in result.stdout
