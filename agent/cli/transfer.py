"""`tt-agent export` and `tt-agent import`: threads as JSON documents (`agent.operations.transfer`).

One thread is written as one JSON document (indented). Every thread of a user
(`export --user-id U` without a thread id) is written as JSON Lines: one
thread document per line, in thread id order, so an export of many threads is
written (and read back) one thread at a time, and `head`, `grep` or `split`
can cut it. With encryption at rest on (`AGENT_ENCRYPTION_KEY`), each
document is sealed with the key unless `--plaintext` is given
(`agent.operations.transfer.sealed`). `import` reads either form: a file whose first line is a JSON
value on its own is JSON Lines, read a line at a time (so a large export is
never held whole), and anything else is one document.

`import` reads the file twice: first it checks every document as
`import_thread` will (`parse_document`: no database is opened, so a bad file
creates no store and writes nothing), then it imports each thread in its own
transaction, stopping at the first failure; the threads imported before it
have been printed. Errors in JSON Lines name the line (1-based). Standard
input is copied to a temporary file for the second reading. A SQLite store
that the command created and left without a thread (the first import failed)
is removed again (`stores.removed_if_left_empty`).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from agent.cli.app import DatabaseUrl, UserId, agent_errors, app, console
from agent.cli.stores import open_agent, removed_if_left_empty, store_label


@app.command("export")
def export(
    thread_id: Annotated[str | None, typer.Argument(help="The thread to export; omit it with --user-id for all of theirs.")] = None,
    user_id: UserId = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write here instead of to standard output.")
    ] = None,
    plaintext: Annotated[
        bool, typer.Option("--plaintext", help="With encryption at rest on, write the documents decrypted instead of sealed.")
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Write a thread (or every thread of --user-id, as JSON Lines) as a JSON document. Never creates a store."""
    from agent.errors import InvalidRequest

    with agent_errors(store=store_label(database_url)):
        if thread_id is None and user_id is None:
            raise InvalidRequest("Name a THREAD_ID, or give --user-id to export every thread of that user.")
        with open_agent(database_url, "offline", False, read_only=True) as agent:
            if thread_id is not None:
                document = agent.export_thread(thread_id, user_id=user_id, plaintext=plaintext)
                text = json.dumps(document, ensure_ascii=False, indent=2) + "\n"
                _write(output, [text])
            else:
                lines = (json.dumps(doc, ensure_ascii=False) + "\n" for doc in _user_documents(agent, user_id, plaintext))
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

    with agent_errors(store=store_label(database_url)), _readable(file) as stream:
        count = _check(file, stream)
        if not count:
            raise InvalidRequest(f"{file} holds no thread document.")
        if thread_id is not None and count != 1:
            raise InvalidRequest(f"--thread-id names one thread, but {file} holds {count} documents.")
        with removed_if_left_empty(database_url) as written, open_agent(database_url, "offline", False) as agent:
            for where, document in _documents(file, stream):
                present = _present(agent, thread_id or _thread_id_of(document), user_id)
                with _located(file, where):
                    thread = agent.import_thread(document, user_id=user_id, thread_id=thread_id)
                written.append(thread["thread_id"])
                if present:  # the import succeeded over an existing thread: the same content, a no-op
                    console.print(f"Thread {thread['thread_id']} is already there with this content; nothing was written.",
                                  markup=False)  # fmt: skip
                    continue
                console.print(
                    f"Imported thread {thread['thread_id']} ({thread['message_count']} messages at the head "
                    f"{thread['checkpoint_id']})",
                    markup=False,
                )


def _user_documents(agent, user_id: str, plaintext: bool) -> Iterator[dict[str, Any]]:
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
            yield agent.export_thread(thread_id, user_id=user_id, plaintext=plaintext)
        except ThreadNotFound:
            continue


def _thread_id_of(document: object) -> str | None:
    thread = document.get("thread") if isinstance(document, dict) else None
    thread_id = thread.get("thread_id") if isinstance(thread, dict) else None
    if thread_id is None and isinstance(document, dict):  # a sealed document names its thread outside
        thread_id = document.get("thread_id")
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


@contextmanager
def _readable(file: Path) -> Iterator[TextIO]:
    """`file` opened as text (lines split at newlines only, as JSON Lines are), or standard input copied
    to a temporary file, so that it can be read twice."""
    from agent.errors import InvalidRequest

    try:
        if str(file) == "-":
            stream: TextIO = tempfile.TemporaryFile("w+", encoding="utf-8", newline="")
            shutil.copyfileobj(sys.stdin, stream)
        else:
            stream = file.open(encoding="utf-8", newline="")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"Cannot read {file}: {exc}") from None
    with stream:
        yield stream


def _check(file: Path, stream: TextIO) -> int:
    """How many documents `stream` holds, each checked as `import_thread` checks it (nothing is opened; a
    sealed document is opened with the keys of `AGENT_ENCRYPTION_KEY` first).

    Raises:
        InvalidRequest: a line or document that is not a thread document (naming the line in JSON Lines),
            or a sealed one the configured keys cannot open.
    """
    from agent.config import load_settings
    from agent.encryption import Keyring
    from agent.operations.transfer import parse_document
    from agent.operations.transfer.sealed import is_sealed_document, open_document

    count = 0
    keyring: Keyring | None = None
    for where, document in _documents(file, stream):
        with _located(file, where):
            if is_sealed_document(document):
                keyring = keyring or Keyring.from_settings(load_settings(model="offline"))
                document = open_document(document, keyring)
            parse_document(document)
        count += 1
    return count


def _documents(file: Path, stream: TextIO) -> Iterator[tuple[int | None, Any]]:
    """`(line number, document)` for each document of `stream`, from its start: JSON Lines (blank lines
    skipped), or one document (line number None) when the first line is not a JSON value on its own.

    Lines end at newlines only (file iteration), not at U+2028 as `str.splitlines()` cuts them: a
    document written with `ensure_ascii=False` may hold that character inside a string.
    """
    from agent.errors import InvalidRequest

    stream.seek(0)
    numbered = enumerate(stream, start=1)
    try:
        for number, line in numbered:
            if line.strip():
                break
        else:
            return  # nothing but blank lines
        try:
            first = json.loads(line)
        except json.JSONDecodeError:  # not JSON Lines: one (indented) document
            stream.seek(0)
            text = stream.read()
        else:
            yield number, first
            for number, line in numbered:
                if not line.strip():
                    continue
                try:
                    document = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InvalidRequest(f"{_name(file)}, line {number}: not a JSON document ({exc.msg}).") from None
                yield number, document
            return
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"Cannot read {file}: {exc}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"{_name(file)} is neither one JSON document nor JSON Lines (line {exc.lineno}: {exc.msg})."
        ) from None
    yield None, document


@contextmanager
def _located(file: Path, line: int | None) -> Iterator[None]:
    """An `AgentError` raised inside, its message led by "FILE, line N: " when `line` is known (JSON Lines)."""
    from agent.errors import AgentError

    try:
        yield
    except AgentError as exc:
        if line is None:
            raise
        raise type(exc)(f"{_name(file)}, line {line}: {exc.message}", **exc.ids) from None


def _name(file: Path) -> str:
    return "standard input" if str(file) == "-" else str(file)
