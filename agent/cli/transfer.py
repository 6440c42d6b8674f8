"""`tt-agent export` and `tt-agent import`: threads as JSON documents (`agent.operations.transfer`).

One thread is written as one JSON document (indented). Every thread of a user
(`export --user-id U` without a thread id) is written as JSON Lines: one
thread document per line, in thread id order, so an export of many threads is
written (and read back) one thread at a time, and `head`, `grep` or `split`
can cut it. `import` reads either form: a file that parses as one JSON value
is one document, anything else is read line by line. Each thread is imported
in its own transaction; the command stops at the first failure, and says which
threads were imported before it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.cli.app import DatabaseUrl, UserId, agent_errors, app, console
from agent.cli.stores import open_agent, store_label


@app.command("export")
def export(
    thread_id: Annotated[str | None, typer.Argument(help="The thread to export; omit it with --user-id for all of theirs.")] = None,
    user_id: UserId = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write here instead of to standard output.")
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Write a thread (or every thread of --user-id, as JSON Lines) as a JSON document. Never creates a store."""
    from agent.errors import InvalidRequest

    with agent_errors(store=store_label(database_url)):
        if thread_id is None and user_id is None:
            raise InvalidRequest("Name a THREAD_ID, or give --user-id to export every thread of that user.")
        with open_agent(database_url, "offline", False, read_only=True) as agent:
            if thread_id is not None:
                text = json.dumps(agent.export_thread(thread_id, user_id=user_id), ensure_ascii=False, indent=2) + "\n"
                _write(output, [text])
            else:
                lines = (json.dumps(doc, ensure_ascii=False) + "\n" for doc in _user_documents(agent, user_id))
                count = _write(output, lines)
                if output is not None:
                    console.print(f"Exported {count} thread(s) of {user_id} to {output}", markup=False)


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="A document from `tt-agent export` (one thread, or JSON Lines); - reads stdin.")],
    user_id: Annotated[str | None, typer.Option("--user-id", metavar="ID", help="Who owns the imported threads.")] = None,
    thread_id: Annotated[
        str | None,
        typer.Option("--thread-id", metavar="ID", help="Import under this id: a copy with new checkpoint ids (one thread only)."),
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Restore exported threads into the store; importing the same document again changes nothing."""
    from agent.errors import InvalidRequest

    with agent_errors(store=store_label(database_url)):
        documents = list(_documents(file))
        if not documents:
            raise InvalidRequest(f"{file} holds no thread document.")
        if thread_id is not None and len(documents) != 1:
            raise InvalidRequest(f"--thread-id names one thread, but {file} holds {len(documents)} documents.")
        with open_agent(database_url, "offline", False) as agent:
            for document in documents:
                present = _present(agent, thread_id or _thread_id_of(document), user_id)
                thread = agent.import_thread(document, user_id=user_id, thread_id=thread_id)
                if present:  # the import succeeded over an existing thread: the same content, a no-op
                    console.print(f"Thread {thread['thread_id']} is already there with this content; nothing was written.",
                                  markup=False)  # fmt: skip
                    continue
                console.print(
                    f"Imported thread {thread['thread_id']} ({thread['message_count']} messages at the head "
                    f"{thread['checkpoint_id']})",
                    markup=False,
                )


def _user_documents(agent, user_id: str) -> Iterator[dict[str, Any]]:
    """A document per thread of `user_id`, in thread id order, each exported when it is written (a
    thread deleted meanwhile is left out)."""
    from agent.errors import ThreadNotFound

    thread_ids: list[str] = []
    before = None
    while page := agent.list_threads(user_id=user_id, limit=100, before=before):
        thread_ids += [thread["thread_id"] for thread in page]
        before = page[-1]["cursor"]
    for thread_id in sorted(thread_ids):
        try:
            yield agent.export_thread(thread_id, user_id=user_id)
        except ThreadNotFound:
            continue


def _thread_id_of(document: object) -> str | None:
    thread = document.get("thread") if isinstance(document, dict) else None
    thread_id = thread.get("thread_id") if isinstance(thread, dict) else None
    return thread_id if isinstance(thread_id, str) else None


def _present(agent, thread_id: str | None, user_id: str | None) -> bool:
    """Whether the caller already has thread `thread_id` (so a successful import of it wrote nothing)."""
    from agent.errors import InvalidRequest, ThreadNotFound

    if thread_id is None:
        return False
    try:
        agent.get_thread(thread_id, user_id=user_id)
    except (ThreadNotFound, InvalidRequest):
        return False
    return True


def _write(output: Path | None, chunks: Any) -> int:
    """Write `chunks` (strings) to `output` or stdout; how many were written."""
    count = 0
    try:
        stream = output.open("w", encoding="utf-8") if output is not None else sys.stdout
    except OSError as exc:
        from agent.errors import InvalidRequest

        raise InvalidRequest(f"Cannot write {output}: {exc.strerror or exc}") from None
    try:
        for chunk in chunks:
            stream.write(chunk)
            count += 1
    finally:
        if output is not None:
            stream.close()
    return count


def _documents(file: Path) -> Iterator[Any]:
    """The documents in `file`: one JSON value, or JSON Lines (blank lines skipped)."""
    from agent.errors import InvalidRequest

    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"Cannot read {file}: {exc}") from None
    try:
        yield json.loads(text)
        return
    except json.JSONDecodeError:
        pass
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{file} is neither one JSON document nor JSON Lines (line {number}: {exc.msg}).") from None
