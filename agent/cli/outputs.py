"""How each operation's command shows its result: a table or a view for people (`agent.views`), JSON with `--json`.

An operation without an entry here prints its result as JSON whether or not
`--json` is given, so a new operation's command works before anyone draws it.
An entry may add options of its own (`history --tree`, `--full-ids`): they are
about showing, so they belong here rather than in the operation's arguments.
This module imports rich only; the views load when a command prints.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text

from agent.cli.app import console

if TYPE_CHECKING:
    from agent.cli.runs import Run


@dataclass(frozen=True)
class Flag:
    """An option of the output's own: a flag `--<name with dashes>`."""

    name: str
    help: str


@dataclass(frozen=True)
class Output:
    """What a command prints: `show(run)` for people; `as_json(run)` the value `--json` prints
    (default: what the agent's method returns, `run.python`)."""

    show: Callable[[Run], None]
    as_json: Callable[[Run], Any] | None = None
    flags: tuple[Flag, ...] = ()


def print_json(value: Any) -> None:
    """`value` as indented JSON on stdout (non-ASCII text as is)."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def show(run: Run, as_json: bool) -> None:
    """Print `run`'s result: as JSON with `as_json` or when its operation has no `Output`."""
    output = OUTPUTS.get(run.operation.name)
    if output is None or as_json:
        print_json(output.as_json(run) if output is not None and output.as_json else run.python)
        return
    output.show(run)


# -- the outputs ------------------------------------------------------------------------------------
def _history(run: Run) -> None:
    from agent.views import branch_tree, history_table

    args = run.args
    title = f"Thread {args.thread_id}"
    console.print(history_table(run.python, title=title, full_ids=run.flags["full_ids"], head_known=args.before is None))
    if run.flags["tree"]:
        console.print(branch_tree(run.history()))


def _threads(run: Run) -> None:
    from agent.views import threads_table

    found, next_before = run.result
    user_id = run.args.user_id
    title = f"Threads of {user_id}" if user_id else "Threads (no user_id)"
    console.print(threads_table(found, title=title, next_before=next_before))


def _thread(run: Run) -> None:
    from agent.views import thread_view

    console.print(thread_view(run.python))


def _memories(run: Run) -> None:
    from agent.views import memories_table

    query = run.args.query
    title = f"Memories of {run.args.user_id}" + (f" for {query!r}" if query else "")
    console.print(memories_table(run.python, title=title))


def _state(run: Run) -> None:
    from agent.views import state_view

    console.print(state_view(run.python))


def _branches(run: Run) -> None:
    from agent.views import SHELL_SWITCH, branches_table

    console.print(branches_table(run.python, switch=SHELL_SWITCH.format(thread_id=run.args.thread_id)))


def _switched(run: Run) -> None:
    moved = run.python
    console.print(
        f"The head of thread {moved['thread_id']} is now checkpoint {moved['checkpoint_id']} "
        f"(was {moved['previous_checkpoint_id']}); the next turn continues there.",
        markup=False,
    )


def _head(run: Run) -> None:
    head = run.python
    console.print(
        f"The head of thread {head['thread_id']} is checkpoint {head['checkpoint_id']}; the next turn continues there.",
        markup=False,
    )


def _forked(run: Run) -> None:
    fork = run.python
    source = fork["forked_from"]
    console.print(
        f"Thread {fork['thread_id']} is a fork of checkpoint {source['checkpoint_id']} of thread "
        f"{source['thread_id']}; its head is checkpoint {fork['checkpoint_id']}.",
        markup=False,
    )


def _compared(run: Run) -> None:
    from agent.views import diff_view

    console.print(diff_view(run.python))


def _usage(run: Run) -> None:
    from agent.views import short_id

    usage = run.python

    def tokens(counts: dict[str, int]) -> str:
        return f"{counts['input_tokens']} input + {counts['output_tokens']} output tokens"

    console.print(Text(f"Thread {usage['thread_id']}: {tokens(usage['thread_usage'])} (every branch)"))
    console.print(Text(f"Branch up to checkpoint {short_id(usage['checkpoint_id'])}: {tokens(usage['branch_usage'])}"))


def _merged(run: Run) -> None:
    merged = run.python
    console.print(
        f"Merged checkpoint {run.args.source_checkpoint_id} ({run.args.mode}) into thread {merged['thread_id']}: "
        f"saved as checkpoint {merged['checkpoint_id']} (parent {merged['parent_checkpoint_id']}), now the head.",
        markup=False,
    )


def _searched(run: Run) -> None:
    from agent.views import search_table

    user_id = run.args.user_id
    title = f"Search {run.args.query!r}" + (f" in the threads of {user_id}" if user_id else " (no user_id)")
    console.print(search_table(run.python, title=title))


def _branch_changed(run: Run) -> None:
    """A branch record change (`branch label|pin|archive|unarchive|delete`): what it did, then the thread's
    branches as they are now (archived ones too, marked), as `tt-agent branches --include-archived` shows them."""
    from agent.views import SHELL_SWITCH, branches_table, short_id

    change, name = run.python, run.operation.name
    at = short_id(change["checkpoint_id"])
    if name == "label_branch":
        label = change["label"]
        said = f"Labelled the branch through {at} {label!r}." if label else f"Removed the label of the branch through {at}."
    elif name == "pin_branch":
        said = f"Pinned the branch through {at} as the main branch." if change["pinned"] else "The thread has no pinned branch now."
    elif name in ("archive_branch", "unarchive_branch"):
        said = f"{'Archived' if change['archived'] else 'Unarchived'} the branch from {at}."
    else:
        gone = change["deleted_checkpoint_ids"]
        said = (
            f"Deleted the branch from {at}: {len(gone)} checkpoint{'s' if len(gone) != 1 else ''} "
            f"({', '.join(short_id(c) for c in gone)}), {change['deleted_memory_versions']} memory version(s) with them."
        )
    console.print(Text(f"Thread {change['thread_id']}: {said}"))
    console.print(branches_table(run.branches(), switch=SHELL_SWITCH.format(thread_id=change["thread_id"])))


#: By operation name.
OUTPUTS: dict[str, Output] = {
    "get_checkpoint_history": Output(
        _history,
        flags=(Flag("full_ids", "Show whole checkpoint ids."), Flag("tree", "Also draw the branches as a tree.")),
    ),
    "list_threads": Output(_threads, as_json=lambda run: run.outputs),
    "get_thread": Output(_thread),
    "update_thread": Output(_thread),
    "list_memories": Output(_memories),
    "get_checkpoint_state": Output(_state),
    "list_branches": Output(_branches),
    "get_head": Output(_head),
    "set_head": Output(_switched),
    "fork_thread": Output(_forked),
    "compare_checkpoints": Output(_compared),
    "get_usage": Output(_usage),
    "merge_branch": Output(_merged),
    "search_threads": Output(_searched),
    **{name: Output(_branch_changed) for name in ("label_branch", "pin_branch", "archive_branch", "unarchive_branch", "delete_branch")},
}
