"""mkdocs hook: the parts of the API reference that come from the operation registry, so none is kept by hand.

A page names a part with a marker line; the hook puts the part in its place
before the page is rendered (`on_page_markdown`, before mkdocstrings reads the
`:::` blocks):

* `<!-- registry: agent -->`: the `agent.Agent` block, every public member in
  the registry's order, then the others. Its methods are made at import time
  (`agent.operations.operation.python_method`), so reading the source does not
  see them: `registry_methods.py`, a griffe extension, adds them from the
  imported class.
* `<!-- registry: actions -->`: the table of `custom_inputs.action`s, with the
  keys each takes, its Python method and its `tt-agent` command.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def on_config(config: Any) -> Any:
    # The reference documents this checkout, installed or not (mkdocstrings' `paths: [.]` does the same for griffe).
    root = str(Path(config.config_file_path).parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, render in (("<!-- registry: agent -->", agent_block), ("<!-- registry: actions -->", actions_table)):
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown


def agent_members() -> list[str]:
    """The public members of `agent.Agent`: the registered operations first, in the registry's order."""
    from agent.agent import Agent
    from agent.operations.registry import OPERATIONS

    names = [operation.name for operation in OPERATIONS]
    return names + sorted(name for name in vars(Agent) if not name.startswith("_") and name not in names)


def agent_block() -> str:
    members = "\n".join(f"        - {name}" for name in agent_members())
    return f"::: agent.agent.Agent\n    options:\n      members:\n{members}\n"


def actions_table() -> str:
    from agent.operations.registry import ACTIONS, TURN

    rows = [
        "| `custom_inputs.action` | its `custom_inputs` keys | input items | Python method | `tt-agent` | what it does |",
        "|---|---|---|---|---|---|",
        f"| `{TURN}` (the default) | see `agent.requests` | the new messages | `predict`, `predict_stream` | `chat` | "
        "One turn: the input messages on the head (or `checkpoint_id`), the model's answer saved as a new checkpoint. |",
    ]
    for name, operation in ACTIONS.items():
        keys = ", ".join(f"`{key}`" for key in sorted(operation.keys)) or "—"
        needs = [word for word, needed in (("thread_id", operation.needs_thread), ("user_id", operation.needs_user)) if needed]
        if needs:
            keys += " (needs " + " and ".join(f"`{word}`" for word in needs) + ")"
        command = f"`{operation.cli}`" if operation.cli else "—"
        method = f"[`{name}`][agent.agent.Agent.{name}]"
        summary = (operation.summary + (" Writes." if operation.writes else "")).replace("|", r"\|")
        rows.append(f"| `{name}` | {keys} | {operation.input} | {method} | {command} | {summary} |")
    return "\n".join(rows) + "\n"
