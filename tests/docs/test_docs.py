"""The documentation is built and tested: `mkdocs build --strict`, and every Python block of
README.md and docs/ runs.

The convention for code blocks (also in docs: "How these pages are checked"):

* Every fenced block whose language is `python` (or `py`, `python3`) in README.md and
  docs/**/*.md is executed, as a program of its own (as `python -c` would run it, in a process
  forked from one that has imported the heavy modules: `tests.helpers.preloaded`), in a fresh empty directory,
  without AGENT_*, OPENAI_* or MLFLOW_* variables: what a new user who copies it would get. It
  must exit 0; use `assert` to show what the reader should see. Tracebacks name the Markdown
  file and line.
* Blocks that are not meant to run are not Python blocks: shell commands are `bash`, output and
  transcripts are `text`, requests are `json`.
* What a block needs is said by an HTML comment on the last non-blank line before its fence
  (invisible on the rendered page):

      <!-- requires: server -->            a real `tt-agent serve` (offline model, SQLite store)
                                           on a free port; `http://127.0.0.1:8000` and
                                           `http://localhost:8000` (the default address) in the
                                           block are rewritten to it; AGENT_SERVER_URL holds it
      <!-- requires: postgres -->          a scratch Postgres database in AGENT_DATABASE_URL
                                           (so `create_agent()` uses it), dropped afterwards
      <!-- requires: server, postgres -->  both; the server keeps its threads in that database

  Any other word after `requires:` fails the test, so a typo cannot skip a block. Servers are
  started once per test session for the blocks that need them.
* README.md's blocks must also leave their directory empty (the in-memory example writes
  nothing) and print no MLflow INFO line.

Each block is a test of its own, named after its file and line (`docs/concepts.md:47`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.databases import fresh_database
from tests.helpers.preloaded import run_source
from tests.helpers.servers import REPO_ROOT, free_port, server_process

PYTHON_LANGUAGES = {"python", "py", "python3"}
REQUIREMENTS = {"server", "postgres"}
DEFAULT_SERVER_ADDRESSES = ("http://127.0.0.1:8000", "http://localhost:8000")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
REQUIRES = re.compile(r"^\s*<!--\s*requires:\s*(?P<needs>[^>]*?)\s*-->\s*$")


@dataclass(frozen=True)
class CodeBlock:
    path: str
    """Relative to the repository root."""
    line: int
    """1-based line of the first line of code (the one after the opening fence)."""
    language: str
    code: str
    requires: frozenset[str]

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def find_code_blocks(text: str, path: str) -> list[CodeBlock]:
    """Every fenced code block of a Markdown text, with its language and `requires` comment.

    Raises:
        ValueError: a fence is never closed, or a `requires` comment names something unknown.
    """
    lines = text.splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, marker = match["indent"], match["marker"]
        language = (match["info"].split() or [""])[0].strip("{}.").lower()
        previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        needs = REQUIRES.match(previous)
        requires = frozenset(n.strip() for n in needs["needs"].split(",") if n.strip()) if needs else frozenset()
        if requires - REQUIREMENTS:
            raise ValueError(f"{path}:{index + 1}: unknown requires {sorted(requires - REQUIREMENTS)}; known: {sorted(REQUIREMENTS)}")
        end = index + 1
        while end < len(lines) and not re.match(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}\s*$", lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{index + 1}: the code fence is never closed")
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[index + 1 : end]]
        blocks.append(CodeBlock(path, index + 2, language, "\n".join(body) + "\n", requires))
        index = end + 1
    return blocks


def documentation_files() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def python_blocks() -> list[CodeBlock]:
    blocks = []
    for file in documentation_files():
        path = file.relative_to(REPO_ROOT).as_posix()
        blocks += [b for b in find_code_blocks(file.read_text(encoding="utf-8"), path) if b.language in PYTHON_LANGUAGES]
    return blocks


# -- the site ------------------------------------------------------------------------------------
def test_the_site_builds_with_mkdocs_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice about its successor
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "agent" / "index.html").is_file()
    reference = (tmp_path / "site" / "reference" / "agent" / "index.html").read_text()
    assert "get_checkpoint_history" in reference  # mkdocstrings rendered the docstrings
    # Offline: the site's own Mermaid (Material loads one from a CDN only when none is loaded) and no web fonts.
    concepts = (tmp_path / "site" / "concepts" / "index.html").read_text()
    assert "javascripts/mermaid.min.js" in concepts and (tmp_path / "site" / "javascripts" / "mermaid.min.js").is_file()
    assert "fonts.googleapis.com" not in concepts


def test_every_relative_link_of_the_readme_points_at_a_file():
    readme = (REPO_ROOT / "README.md").read_text()
    links = re.findall(r"\]\((?!https?://|#)([^)#\s]+)", readme)
    assert links, "the README links to the documentation"
    assert [link for link in links if not (REPO_ROOT / link).exists()] == []


def test_the_configuration_page_has_a_row_for_every_setting():
    from agent.config import AgentSettings

    page = (REPO_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)` \|", page, re.MULTILINE))
    assert sorted(set(AgentSettings.model_fields) - rows) == []


def test_the_python_api_page_has_a_row_for_every_custom_inputs_key_and_every_action():
    from agent.dialect import OPENAI_CUSTOM_KEYS
    from agent.operations.registry import ACTIONS
    from agent.operations.turn_options import TURN_KEYS
    from agent.requests import ENVELOPE_KEYS

    page = (REPO_ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    keys_table = page[page.index("**`custom_inputs`**") : page.index("**Actions**")]
    actions_table = page[page.index("**Actions**") : page.index("**`custom_outputs`**")]

    def first_cells(table: str) -> set[str]:
        # A row's first cell may name several (`title`, `ttl_seconds`).
        return {name for cell in re.findall(r"^\| ([^|]+) \|", table, re.MULTILINE) for name in re.findall(r"`(\w+)`", cell)}

    # The keys `agent.requests.parse_request` accepts: the envelope's, a turn's, the OpenAI dialect's and each action's.
    accepted = set(ENVELOPE_KEYS) | set(TURN_KEYS) | set(OPENAI_CUSTOM_KEYS)
    accepted |= {key for operation in ACTIONS.values() for key in operation.keys}
    keys = first_cells(keys_table)
    assert (sorted(accepted - keys), sorted(keys - accepted)) == ([], [])
    actions = first_cells(actions_table) - {"Action"}
    assert (sorted(set(ACTIONS) - actions), sorted(actions - set(ACTIONS))) == ([], [])


# -- the harness itself -----------------------------------------------------------------------------
def test_the_block_finder_reads_languages_requirements_and_indented_fences():
    text = "\n".join(
        [
            "# Page",
            "```bash",
            "tt-agent demo",
            "```",
            "<!-- requires: server, postgres -->",
            "",
            "```python",
            "print('served')",
            "```",
            "1. A list item:",
            "",
            "    ```py",
            "    if True:",
            "        print('indented')",
            "    ```",
        ]
    )
    bash, served, indented = find_code_blocks(text, "page.md")
    assert (bash.language, bash.requires) == ("bash", frozenset())
    assert (served.line, served.language, served.requires) == (8, "python", frozenset({"server", "postgres"}))
    assert indented.code == "if True:\n    print('indented')\n"
    with pytest.raises(ValueError, match="unknown requires"):
        find_code_blocks("<!-- requires: servr -->\n```python\npass\n```\n", "page.md")
    with pytest.raises(ValueError, match="never closed"):
        find_code_blocks("```python\npass\n", "page.md")


def test_the_documentation_has_python_blocks_to_run():
    paths = {block.path for block in python_blocks()}
    assert {"README.md", "docs/concepts.md", "docs/python-api.md"} <= paths


# -- the blocks ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def docs_servers(tmp_path_factory, request) -> Iterator[dict[frozenset[str], str]]:
    """Servers for blocks that require one, started on first use, keyed by the block's requirements."""
    from contextlib import ExitStack

    started: dict[frozenset[str], str] = {}
    with ExitStack() as stack:

        def server_for(requires: frozenset[str], database_url: str | None) -> str:
            if requires not in started:
                cwd = tmp_path_factory.mktemp("docs-server")
                port = free_port()
                env = {k: v for k, v in clean_environment().items()}
                env["AGENT_DATABASE_URL"] = database_url or f"sqlite:///{cwd / 'checkpoints.sqlite'}"
                env["AGENT_MODEL"] = "offline"
                started[requires] = stack.enter_context(
                    server_process(
                        [sys.executable, "-m", "agent", "serve", "--port", str(port)],
                        port=port,
                        health_path="/health",
                        env=env,
                        cwd=cwd,
                    )
                )
            return started[requires]

        yield server_for


def clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "OPENAI_", "MLFLOW_"))}


@pytest.fixture(scope="session")
def docs_database(request) -> Iterator[str]:
    """One scratch Postgres database for every block that requires postgres."""
    with fresh_database(request.getfixturevalue("pg_server_url"), prefix="tt_docs") as url:
        yield url


def run_block(block: CodeBlock, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The block as a program of its own: a fresh process (forked from one that imported MLflow and LangGraph
    once, `tests.helpers.preloaded`) with `env` as its whole environment and `cwd` as its directory."""
    # Blank lines before the code keep its line numbers those of the Markdown file in tracebacks.
    source = "\n" * (block.line - 1) + block.code
    return run_source(source, block.path, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize("block", python_blocks(), ids=lambda block: block.id)
def test_python_block_runs(block: CodeBlock, tmp_path, request):
    env = clean_environment()
    code = block.code
    if "postgres" in block.requires:
        env["AGENT_DATABASE_URL"] = request.getfixturevalue("docs_database")
    if "server" in block.requires:
        url = request.getfixturevalue("docs_servers")(block.requires, env.get("AGENT_DATABASE_URL"))
        env["AGENT_SERVER_URL"] = url
        for address in DEFAULT_SERVER_ADDRESSES:
            code = code.replace(address, url)
    result = run_block(CodeBlock(block.path, block.line, block.language, code, block.requires), tmp_path, env)
    assert result.returncode == 0, f"{block.id} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    if block.path == "README.md":
        assert sorted(p.name for p in tmp_path.iterdir()) == [], "the README example wrote into the current directory"
        assert "INFO mlflow" not in result.stderr, result.stderr
