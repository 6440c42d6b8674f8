"""`tt-agent`: the command line (also `python -m agent`).

Commands:

* `demo`     the trip scenario end to end: remember, list history, branch, continue on the branch
* `chat`     an interactive session with `/history`, `/branch`, `/thread`, `/new`
* `history`  one thread's checkpoints as a table
* `serve`    the MLflow Agent Server (`agent.serving.agent_server`)

Options left unset come from the environment (`AGENT_DATABASE_URL`,
`AGENT_MODEL`, `AGENT_TRACING`, and `OPENAI_API_KEY` / `OPENAI_BASE_URL` for a
real model). With nothing set, the store is `sqlite:///.agent/checkpoints.sqlite`
under the current directory and the model is the offline one.

An `AgentError` is printed in red on stderr, with exit code 1 and no traceback.

Checkpoint ids are time-ordered UUIDs, so ids written close together share
their first characters; their last 8 characters are random. Tables therefore
show that suffix as the short id, and every command that takes a checkpoint id
also takes such a suffix (resolved within the thread).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

if TYPE_CHECKING:  # importing the agent costs seconds (MLflow); commands import it when they run.
    from agent.responses import LangGraphResponsesAgent

#: Characters of a checkpoint id shown as its short form (the random end of the UUID).
SHORT_ID_CHARS = 8

#: Width used when output is not a terminal (pipes, logs, tests) and COLUMNS is unset; rich would use 80.
PIPE_WIDTH = 120

#: Most checkpoints read to resolve a short id or draw a branch tree.
MAX_LISTED = 1000

TRIP = ("I'm planning for an upcoming trip!", "I'm headed to SF!", "Where did I say I'm going?")
BRANCH_MESSAGE = "I'm headed to New York!"
BRANCH_QUESTION = "Where am I going?"

CHAT_HELP = """\
Commands:
  /history [N] [full]   the thread's last N checkpoints (default 10); "full" shows whole ids
  /tree                 the thread's checkpoints as a branch tree
  /branch <id>          start the next message from this checkpoint (full id or short id)
  /thread <id>          switch to another thread (a new id starts a new thread)
  /new                  start a new thread with the next message
  /help                 this help
  /quit                 leave (also Ctrl-D)
Anything else is sent to the agent."""

app = typer.Typer(
    name="tt-agent",
    help="A conversational agent with checkpoint memory you can branch from (time travel).",
    no_args_is_help=True,
    add_completion=False,
    # Tracebacks with local variables could show a database password.
    pretty_exceptions_enable=False,
)


def _make_console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, width=width, highlight=False)


console = _make_console()
err_console = _make_console(stderr=True)

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="AGENT_DATABASE_URL",
        show_envvar=True,
        help="postgresql://…, sqlite:///path or memory://. Unset: sqlite:///.agent/checkpoints.sqlite.",
    ),
]
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        envvar="AGENT_MODEL",
        show_envvar=True,
        help='"offline" or an OpenAI-compatible model name. Unset: offline unless OPENAI_API_KEY/OPENAI_BASE_URL is set.',
    ),
]
Tracing = Annotated[
    bool,
    typer.Option("--tracing/--no-tracing", envvar="AGENT_TRACING", show_envvar=True, help="MLflow tracing of each turn."),
]
UserId = Annotated[str | None, typer.Option("--user-id", help="The caller; threads are only visible to their owner.")]


def main() -> None:
    """Entry point of the `tt-agent` console script and of `python -m agent`."""
    # psycopg_pool logs a warning per failed connection attempt while it retries; the
    # StorageUnavailable that follows says the same once, with the URL masked.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    app(prog_name="tt-agent")


# -- commands --------------------------------------------------------------------------------
@app.command()
def demo(database_url: DatabaseUrl = None, model: Model = None, tracing: Tracing = False) -> None:
    """Run the trip scenario on a fresh thread: memory, history, a branch, and the branch's answer."""
    with _agent_errors(), _open_agent(database_url, model, tracing) as agent:
        _run_demo(agent, database_url, model)


@app.command()
def chat(
    database_url: DatabaseUrl = None,
    model: Model = None,
    thread_id: Annotated[str | None, typer.Option("--thread-id", help="Continue this thread. Unset: a new one.")] = None,
    user_id: UserId = None,
    tracing: Tracing = False,
) -> None:
    """Talk to the agent. Type /help for /history, /branch, /thread, /new and /quit."""
    with _agent_errors(), _open_agent(database_url, model, tracing) as agent:
        _Chat(agent, thread_id=thread_id, user_id=user_id).run()


@app.command()
def history(
    thread_id: Annotated[str, typer.Argument(help="The thread to list.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_LISTED, help="Most checkpoints to show.")] = 10,
    before: Annotated[
        str | None, typer.Option("--before", help="Only checkpoints older than this one (full or short id).")
    ] = None,
    user_id: UserId = None,
    full_ids: Annotated[bool, typer.Option("--full-ids", help="Show whole checkpoint ids.")] = False,
    tree: Annotated[bool, typer.Option("--tree", help="Also draw the branches as a tree.")] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Print one thread's checkpoints, newest first."""
    # No turn runs here, so no chat model is needed (and none is configured).
    with _agent_errors(), _open_agent(database_url, "offline", False) as agent:
        everything = agent.get_checkpoint_history(thread_id, limit=MAX_LISTED, user_id=user_id) if before or tree else []
        if before is not None:
            before = _resolve_checkpoint(everything, thread_id, before)
        entries = agent.get_checkpoint_history(thread_id, limit=limit, before=before, user_id=user_id)
        console.print(_history_table(entries, title=f"Thread {thread_id}", full_ids=full_ids, head_known=before is None))
        if tree:
            console.print(_branch_tree(everything))


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    database_url: DatabaseUrl = None,
    model: Model = None,
) -> None:
    """Start the MLflow Agent Server (POST /invocations, POST /responses, GET /health)."""
    with _agent_errors():
        from agent.serving.app import run_agent_server

        run_agent_server(host=host, port=port, database_url=database_url, model=model)


# -- the demo --------------------------------------------------------------------------------
def _run_demo(agent: LangGraphResponsesAgent, database_url: str | None, model: str | None) -> None:
    from agent.config import mask_url, resolve_database_url, resolve_model_name

    console.print(
        Panel.fit(
            f"Store: [bold]{escape(mask_url(resolve_database_url(database_url)))}[/]   "
            f"Model: [bold]{escape(resolve_model_name(model))}[/]\n"
            "Each turn is saved as a checkpoint; any checkpoint can be the start of a new branch.",
            title="timetravel-agent demo",
        )
    )
    _step(1, "A new thread starts with the first message.")
    first = _turn(agent, TRIP[0], echo=True)
    thread_id = first["thread_id"]
    _step(2, "Same thread: the agent gets the earlier turn from its checkpoint memory.")
    _turn(agent, TRIP[1], echo=True, thread_id=thread_id)
    _step(3, "Asking about the past: the answer uses what was said before.")
    third = _turn(agent, TRIP[2], echo=True, thread_id=thread_id)

    _step(4, "The thread's checkpoint history, newest first (one checkpoint per turn).")
    entries = agent.get_checkpoint_history(thread_id, limit=MAX_LISTED)
    console.print(_history_table(entries, title=f"Thread {thread_id}"))

    branch_point = _entry(entries, first["checkpoint_id"])
    pending = f"next: {_nodes(branch_point['next_nodes'])}" if branch_point["next_nodes"] else "nothing left to run"
    _step(
        5,
        f"Time travel: branching from checkpoint {_short(branch_point['checkpoint_id'])}, where turn 1 had "
        f"finished ({branch_point['message_count']} messages, {pending}).",
    )
    console.print(Text(f"  full checkpoint_id: {branch_point['checkpoint_id']}", style="dim"))
    _turn(agent, BRANCH_MESSAGE, echo=True, thread_id=thread_id, checkpoint_id=branch_point["checkpoint_id"])

    _step(6, "Same thread, no checkpoint_id: the turn continues from the new branch, now the thread head.")
    answer = _turn(agent, BRANCH_QUESTION, echo=True, thread_id=thread_id)
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
    console.print(_history_table(entries, title=f"Thread {thread_id}"))
    sf_head = third["checkpoint_id"]
    console.print(
        _branch_tree(entries, notes={branch_point["checkpoint_id"]: "branch point", sf_head: "SF branch"})
    )
    if any(e["checkpoint_id"] == sf_head for e in entries):
        console.print(
            f"  [green]✓[/] The SF branch is still listed (checkpoint {_short(sf_head)}); "
            "it can be branched from again with its checkpoint_id."
        )
    else:  # pragma: no cover - would be a storage bug
        console.print(f"  [red]✗ The SF branch (checkpoint {_short(sf_head)}) is missing from the history.[/]")
    console.print(
        Text(f"\nSee this thread again with: tt-agent history {thread_id} --tree", style="dim"),
    )


def _step(number: int, text: str) -> None:
    console.print(Text.assemble(("\n" + f"{number}. ", "bold magenta"), (text, "bold")))


def _entry(entries: list[dict[str, Any]], checkpoint_id: str) -> dict[str, Any]:
    for entry in entries:
        if entry["checkpoint_id"] == checkpoint_id:
            return entry
    from agent.errors import CheckpointNotFound

    raise CheckpointNotFound(f"Checkpoint {checkpoint_id!r} is not in the history.", checkpoint_id=checkpoint_id)


# -- chat ------------------------------------------------------------------------------------
class _Chat:
    """The REPL's state: the current thread and the checkpoint the next message branches from."""

    def __init__(self, agent: LangGraphResponsesAgent, *, thread_id: str | None, user_id: str | None) -> None:
        self.agent = agent
        self.thread_id = thread_id
        self.user_id = user_id
        self.branch_from: str | None = None
        # Piped input is not shown by the terminal; echo it so the transcript reads like a session.
        self.echo = not sys.stdin.isatty()

    def run(self) -> None:
        where = f"thread {self.thread_id}" if self.thread_id else "a new thread"
        console.print(Text.assemble(("tt-agent chat", "bold"), f" on {where}. Type /help for commands, /quit to leave."))
        while True:
            try:
                line = console.input("[bold cyan]you ›[/] ")
            except (EOFError, KeyboardInterrupt):
                console.print()
                return
            if self.echo:
                console.print(line, markup=False)
            line = line.strip()
            if not line:
                continue
            with _agent_errors(exit_on_error=False, to=console):
                if line.startswith("/"):
                    if not self.command(line):
                        return
                else:
                    self.send(line)

    def send(self, text: str) -> None:
        try:
            result = _turn(
                self.agent, text, thread_id=self.thread_id, checkpoint_id=self.branch_from, user_id=self.user_id
            )
        except KeyboardInterrupt:
            console.print("\n[yellow]Interrupted.[/]")
            return
        self.thread_id = result["thread_id"]
        self.branch_from = None

    def command(self, line: str) -> bool:
        """Run one /command; False means quit."""
        name, *args = line.split()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            console.print(CHAT_HELP, markup=False)
        elif name == "/new":
            self.thread_id, self.branch_from = None, None
            console.print("Your next message starts a new thread.")
        elif name == "/thread":
            self.switch_thread(args)
        elif name == "/history":
            self.show_history(args)
        elif name == "/tree":
            if self.require_thread():
                entries = self.agent.get_checkpoint_history(self.thread_id, limit=MAX_LISTED, user_id=self.user_id)
                console.print(_branch_tree(entries, notes=self.notes()))
        elif name == "/branch":
            self.branch(args)
        else:
            console.print(f"[red]Unknown command {escape(name)}.[/] Type /help for the list.")
        return True

    def switch_thread(self, args: list[str]) -> None:
        if len(args) != 1:
            console.print("[red]Usage: /thread <thread_id>[/]")
            return
        from agent.errors import ThreadNotFound

        try:
            entries = self.agent.get_checkpoint_history(args[0], limit=1, user_id=self.user_id)
        except ThreadNotFound:
            entries = []
        self.thread_id, self.branch_from = args[0], None
        if entries:
            console.print(
                f"Switched to thread {escape(args[0])}; its head is checkpoint {_short(entries[0]['checkpoint_id'])} "
                f"({entries[0]['message_count']} messages)."
            )
        else:
            # Another user's thread looks the same as a missing one (agent.threads.authorize).
            console.print(
                f"Switched to thread {escape(args[0])}; it has no checkpoints you can see, "
                "so your next message starts it."
            )

    def show_history(self, args: list[str]) -> None:
        if not self.require_thread():
            return
        full = "full" in args
        numbers = [a for a in args if a != "full"]
        try:
            limit = int(numbers[0]) if numbers else 10
        except ValueError:
            console.print("[red]Usage: /history [N] [full][/]")
            return
        entries = self.agent.get_checkpoint_history(self.thread_id, limit=limit, user_id=self.user_id)
        console.print(_history_table(entries, title=f"Thread {self.thread_id}", full_ids=full, notes=self.notes()))

    def branch(self, args: list[str]) -> None:
        if len(args) != 1:
            console.print("[red]Usage: /branch <checkpoint_id>[/] (a full id or the short id from /history)")
            return
        if not self.require_thread():
            return
        entries = self.agent.get_checkpoint_history(self.thread_id, limit=MAX_LISTED, user_id=self.user_id)
        checkpoint_id = _resolve_checkpoint(entries, self.thread_id, args[0])
        self.branch_from = checkpoint_id
        message = Text(f"Your next message starts a branch from checkpoint {_short(checkpoint_id)}")
        entry = next((e for e in entries if e["checkpoint_id"] == checkpoint_id), None)
        if entry is not None:
            message.append(f" ({entry['message_count']} messages; last: {_last_message(entry)!r})")
        console.print(message)

    def require_thread(self) -> bool:
        if self.thread_id is None:
            console.print("[red]No thread yet:[/] send a message first, or /thread <id>.")
            return False
        return True

    def notes(self) -> dict[str, str]:
        return {self.branch_from: "next message branches from here"} if self.branch_from else {}


# -- shared helpers --------------------------------------------------------------------------
@contextmanager
def _open_agent(database_url: str | None, model: str | None, tracing: bool) -> Iterator[LangGraphResponsesAgent]:
    from agent import create_agent

    agent = create_agent(database_url, model, tracing=tracing)
    try:
        yield agent
    finally:
        agent.close()


@contextmanager
def _agent_errors(*, exit_on_error: bool = True, to: Console | None = None) -> Iterator[None]:
    """Print an `AgentError` in red (on stderr unless `to` says otherwise); then exit with code 1,
    or carry on (the chat loop, which prints to stdout so that a transcript keeps its order)."""
    from agent.errors import AgentError

    try:
        yield
    except AgentError as exc:
        (to or err_console).print(Text.assemble(("Error: ", "bold red"), (exc.message, "red")))
        if exit_on_error:
            raise typer.Exit(code=1) from None


def _turn(
    agent: LangGraphResponsesAgent,
    text: str,
    *,
    echo: bool = False,
    thread_id: str | None = None,
    checkpoint_id: str | None = None,
    user_id: str | None = None,
) -> dict[str, Any]:
    """Send one user message with `predict_stream`, printing the reply as it arrives.

    Returns `custom_outputs` (thread_id, checkpoint_id, parent_checkpoint_id) plus `text`, the reply.
    """
    if echo:
        console.print(Text.assemble(("  you › ", "bold cyan"), text))
    custom = {"thread_id": thread_id, "checkpoint_id": checkpoint_id, "user_id": user_id}
    request = {
        "input": [{"role": "user", "content": text}],
        "custom_inputs": {k: v for k, v in custom.items() if v is not None},
    }
    out = _ReplyPrinter()
    outputs: dict[str, Any] = {}
    for event in agent.predict_stream(request):
        data = event.model_dump(exclude_none=True)
        if data["type"] == "response.output_text.delta":
            out.text(data["item_id"], data["delta"])
        elif data["type"] == "response.output_item.done":
            out.item(data["item"])
        outputs = data.get("custom_outputs") or outputs
    out.end()
    parent = outputs.get("parent_checkpoint_id")
    if thread_id is None:
        console.print(Text(f"  new thread_id {outputs.get('thread_id')}", style="dim"))
    where = f"parent {_short(parent)}" if thread_id else f"the thread's first, after its root {_short(parent)}"
    console.print(Text(f"  saved as checkpoint {outputs.get('checkpoint_id')} ({where})", style="dim"))
    return {**outputs, "text": out.reply}


class _ReplyPrinter:
    """Prints streamed text as it arrives, then the items that were not streamed (tool calls, unstreamed replies)."""

    def __init__(self) -> None:
        self.streamed: set[str] = set()
        self.open = False  # a reply line is being written
        self.reply = ""  # the assistant text of this turn

    def text(self, item_id: str, delta: str) -> None:
        if item_id not in self.streamed:
            self.streamed.add(item_id)
            self.start()
        self.reply += delta
        console.print(delta, end="", markup=False, soft_wrap=True)

    def item(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "message" and item.get("id") not in self.streamed:
            text = "".join(part.get("text", "") for part in item.get("content", []))
            self.start()
            self.reply += text
            console.print(text, end="", markup=False, soft_wrap=True)
        elif kind == "function_call":
            self.line(f"  ↳ tool call {item.get('name')}({item.get('arguments')})")
        elif kind == "function_call_output":
            self.line(f"  ↳ tool result {item.get('output')}")

    def start(self) -> None:
        if self.open:
            console.print()
        console.print(Text("  agent › ", style="bold green"), end="")
        self.open = True

    def line(self, text: str) -> None:
        self.end()
        console.print(Text(text, style="dim"))

    def end(self) -> None:
        if self.open:
            console.print()
            self.open = False


def _resolve_checkpoint(entries: list[dict[str, Any]], thread_id: str, ref: str) -> str:
    """The full checkpoint id for `ref`: a full id (returned as is) or a unique suffix of an id in `entries`.

    `entries` is the thread's history (`get_checkpoint_history(..., limit=MAX_LISTED)`).

    Raises:
        CheckpointNotFound: no checkpoint in `entries` ends with `ref`.
        InvalidRequest: several do.
    """
    from agent.errors import CheckpointNotFound, InvalidRequest

    ref = ref.strip().lstrip("…")
    if len(ref) >= 36 or any(e["checkpoint_id"] == ref for e in entries):
        return ref  # a full id; the agent checks that it belongs to the thread
    matches = [e["checkpoint_id"] for e in entries if e["checkpoint_id"].endswith(ref)]
    if not matches:
        raise CheckpointNotFound(
            f"No checkpoint of thread {thread_id!r} has the id or short id {ref!r}.",
            thread_id=thread_id,
            checkpoint_id=ref,
        )
    if len(matches) > 1:
        raise InvalidRequest(f"Short id {ref!r} matches {len(matches)} checkpoints; give more characters.")
    return matches[0]


def _history_table(
    entries: list[dict[str, Any]],
    *,
    title: str,
    full_ids: bool = False,
    head_known: bool = True,
    notes: dict[str, str] | None = None,
) -> RenderableType:
    """A table of history entries (newest first); the first row is the thread head when `head_known`.

    With `full_ids`, the whole ids follow the table as `short = full` lines, which
    stay intact at any terminal width (a 36-character column would squeeze the rest).
    """
    notes = notes or {}
    table = Table(
        title=title,
        caption=None
        if full_ids
        else f"ids: last {SHORT_ID_CHARS} characters of checkpoint_id (whole ids: --full-ids, or /history full in chat)",
        caption_justify="left",
        header_style="bold",
    )
    table.add_column("checkpoint", no_wrap=True, style="cyan")
    table.add_column("parent", no_wrap=True, style="dim")
    table.add_column("time (UTC)", overflow="fold")
    table.add_column("msgs", justify="right", no_wrap=True)
    table.add_column("next", no_wrap=True)
    table.add_column("last message")
    for index, entry in enumerate(entries):
        marks = [notes[entry["checkpoint_id"]]] if entry["checkpoint_id"] in notes else []
        if entry.get("is_head"):
            marks.insert(0, "head")
        last = Text(_last_message(entry))
        if marks:
            last = Text.assemble((f"[{', '.join(marks)}] ", "bold yellow"), last)
        table.add_row(
            _short(entry["checkpoint_id"]),
            _short(entry["parent_checkpoint_id"]),
            _time(entry["timestamp"]),
            str(entry["message_count"]),
            _nodes(entry["next_nodes"]),
            last,
        )
    if not entries:
        table.add_row("—", "", "", "", "", Text("no checkpoints" if head_known else "no older checkpoints", style="dim"))
    if not full_ids:
        return table
    lines = [Text.assemble((_short(e["checkpoint_id"]), "cyan"), " = ", e["checkpoint_id"]) for e in entries]
    return Group(table, Text("Whole checkpoint ids:", style="bold"), *lines)


def _branch_tree(entries: list[dict[str, Any]], *, notes: dict[str, str] | None = None) -> Tree:
    """The checkpoints as a tree built from `parent_checkpoint_id`.

    A run of turns without forks is one list; a checkpoint with several children
    gets one "branch" subtree per child, oldest first. The newest checkpoint is the head.
    """
    notes = notes or {}
    thread_id = entries[0]["thread_id"] if entries else "?"
    root = Tree(Text(f"thread {thread_id}", style="bold"))
    if not entries:
        return root
    by_id = {e["checkpoint_id"]: e for e in entries}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for entry in sorted(entries, key=lambda e: e["checkpoint_id"]):  # ids are time-ordered
        parent = entry["parent_checkpoint_id"] if entry["parent_checkpoint_id"] in by_id else None
        children.setdefault(parent, []).append(entry)
    head = next((e["checkpoint_id"] for e in entries if e.get("is_head")), None)

    def label(entry: dict[str, Any]) -> Text:
        marks = (["head"] if entry["checkpoint_id"] == head else []) + (
            [notes[entry["checkpoint_id"]]] if entry["checkpoint_id"] in notes else []
        )
        text = Text.assemble(
            (_short(entry["checkpoint_id"]), "cyan"), f"  {entry['message_count']} msgs  ", _last_message(entry)
        )
        if marks:
            text.append(f"  ← {', '.join(marks)}", style="bold yellow")
        return text

    def chain(into: Tree, entry: dict[str, Any]) -> None:
        while True:
            node = into.add(label(entry))
            kids = children.get(entry["checkpoint_id"], [])
            if len(kids) == 1:
                entry = kids[0]
                continue
            for number, kid in enumerate(kids, start=1):
                chain(node.add(Text(f"branch {number}", style="magenta")), kid)
            return

    for start in children.get(None, []):
        chain(root, start)
    return root


def _short(checkpoint_id: str | None) -> str:
    return checkpoint_id[-SHORT_ID_CHARS:] if checkpoint_id else "—"


def _last_message(entry: dict[str, Any]) -> str:
    from agent.storage.summaries import LAST_MESSAGE_CHARS

    text = entry["last_message"] or ""
    # The history keeps the first LAST_MESSAGE_CHARS characters; show that the text was cut.
    return text + "…" if len(text) >= LAST_MESSAGE_CHARS else text


def _nodes(nodes: list[str]) -> str:
    return ", ".join(nodes) if nodes else "—"


def _time(timestamp: str | None) -> str:
    if not timestamp:
        return "—"
    try:
        return datetime.fromisoformat(timestamp).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except ValueError:
        return timestamp
