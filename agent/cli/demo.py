"""`tt-agent demo`: the trip scenario end to end: remember, list history, branch, continue on the branch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from agent.cli.app import MAX_LISTED, DatabaseUrl, Model, Tracing, agent_errors, app, console, rerun_hint
from agent.cli.stores import open_agent, store_label
from agent.cli.printing import send_turn
from agent.views import branch_tree, history_table, nodes_text, short_id

if TYPE_CHECKING:
    from agent.responses import LangGraphResponsesAgent

TRIP = ("I'm planning for an upcoming trip!", "I'm headed to SF!", "Where did I say I'm going?")
BRANCH_MESSAGE = "I'm headed to New York!"
BRANCH_QUESTION = "Where am I going?"


@app.command()
def demo(
    scenario: Annotated[
        Literal["trip", "memory"],
        typer.Argument(help="trip: checkpoints and a branch; memory: a fact remembered across threads."),
    ] = "trip",
    database_url: DatabaseUrl = None,
    model: Model = None,
    tracing: Tracing = False,
) -> None:
    """Run the trip scenario on a fresh thread: memory, history, a branch, and the branch's answer
    (`tt-agent demo memory`: long-term memory crossing threads)."""
    with agent_errors(store=store_label(database_url)), open_agent(database_url, model, tracing, responses=True) as agent:
        if scenario == "memory":
            from agent.cli.memory_demo import run_memory_demo

            run_memory_demo(agent, database_url)
        else:
            _run_demo(agent, database_url)


def _run_demo(agent: LangGraphResponsesAgent, database_url: str | None) -> None:
    console.print(
        Panel.fit(
            f"Store: [bold]{escape(agent.info().store)}[/]\n"
            f"Model: [bold]{escape(agent.info().model)}[/]\n"
            "Each turn is saved as a checkpoint; any checkpoint can be the start of a new branch.",
            title="timetravel-agent demo",
        )
    )
    _step(1, "A new thread starts with the first message.")
    first = send_turn(agent, TRIP[0], echo=True)
    thread_id = first["thread_id"]
    _step(2, "Same thread: the agent gets the earlier turn from its checkpoint memory.")
    send_turn(agent, TRIP[1], echo=True, thread_id=thread_id)
    _step(3, "Asking about the past: the answer uses what was said before.")
    third = send_turn(agent, TRIP[2], echo=True, thread_id=thread_id)

    _step(4, "The thread's checkpoint history, newest first (one checkpoint per turn).")
    entries = agent.get_checkpoint_history(thread_id, limit=MAX_LISTED)
    console.print(history_table(entries, title=f"Thread {thread_id}"))

    branch_point = _entry(entries, first["checkpoint_id"])
    pending = f"next: {nodes_text(branch_point['next_nodes'])}" if branch_point["next_nodes"] else "nothing left to run"
    _step(
        5,
        f"Time travel: branching from checkpoint {short_id(branch_point['checkpoint_id'])}, where turn 1 had "
        f"finished ({branch_point['message_count']} messages, {pending}).",
    )
    console.print(Text(f"  full checkpoint_id: {branch_point['checkpoint_id']}", style="dim"))
    send_turn(agent, BRANCH_MESSAGE, echo=True, thread_id=thread_id, checkpoint_id=branch_point["checkpoint_id"])

    _step(6, "Same thread, no checkpoint_id: the turn continues from the new branch, now the thread head.")
    answer = send_turn(agent, BRANCH_QUESTION, echo=True, thread_id=thread_id)
    sees_new_york, sees_sf = "New York" in answer["text"], "SF" in answer["text"]
    if sees_new_york and not sees_sf:
        console.print("  [green]✓[/] The answer sees New York and not SF: the branch does not see the other branch.")
    else:
        console.print(
            f"  [yellow]![/] The answer mentions New York: {'yes' if sees_new_york else 'no'}; "
            f"mentions SF: {'yes' if sees_sf else 'no'} (a real model may phrase it differently)."
        )

    _step(7, "History again, and the branches drawn from parent_checkpoint_id: nothing was overwritten.")
    entries = agent.get_checkpoint_history(thread_id, limit=MAX_LISTED)
    console.print(history_table(entries, title=f"Thread {thread_id}"))
    sf_head = third["checkpoint_id"]
    console.print(
        branch_tree(entries, notes={branch_point["checkpoint_id"]: "branch point", sf_head: "SF branch"})
    )
    if any(e["checkpoint_id"] == sf_head for e in entries):
        console.print(
            f"  [green]✓[/] The SF branch is still listed (checkpoint {short_id(sf_head)}); "
            "it can be branched from again with its checkpoint_id."
        )
    else:  # pragma: no cover - would be a storage bug
        console.print(f"  [red]✗ The SF branch (checkpoint {short_id(sf_head)}) is missing from the history.[/]")
    console.print(Text(f"\n{_see_again(thread_id, database_url)}", style="dim"))


def _see_again(thread_id: str, database_url: str | None) -> str:
    """The closing hint: a command that shows the thread again, runnable as printed in this shell."""
    again = rerun_hint(["history", thread_id, "--tree"], database_url)
    if again is None:
        return "The thread lived in memory:// and ended with the demo; use a file or Postgres store to keep it."
    return f"See this thread again with: {again}"


def _step(number: int, text: str) -> None:
    console.print(Text.assemble(("\n" + f"{number}. ", "bold magenta"), (text, "bold")))


def _entry(entries: list[dict[str, Any]], checkpoint_id: str) -> dict[str, Any]:
    for entry in entries:
        if entry["checkpoint_id"] == checkpoint_id:
            return entry
    from agent.errors import CheckpointNotFound

    raise CheckpointNotFound(f"Checkpoint {checkpoint_id!r} is not in the history.", checkpoint_id=checkpoint_id)

