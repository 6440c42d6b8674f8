"""`tt-agent threads rename THREAD TITLE`: the one hand-written command of the `threads` group.

`tt-agent threads` (the list), `threads show` and `threads update` are the
catalogue's operations (`agent.cli.operations`); `rename` is `update --title`
with the title as an argument, run through the same door.
"""

from __future__ import annotations

from typing import Annotated

import typer

from agent.cli.app import DatabaseUrl, Json, UserId
from agent.cli.operations import GROUPS, run_command
from agent.cli.manifest import COMMANDS

_UPDATE = next(spec for spec in COMMANDS if spec["operation"] == "update_thread")


@GROUPS["threads"].command()
def rename(
    thread_id: Annotated[str, typer.Argument(help="The thread.")],
    title: Annotated[str, typer.Argument(help="Its new title (1 to 256 characters).")],
    user_id: UserId = None,
    as_json: Json = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Give a thread a new title (its activity time and order do not change). Never creates a store."""
    values = {"thread_id": thread_id, "title": title, "user_id": user_id, "as_json": as_json, "database_url": database_url}
    run_command(_UPDATE, values)
