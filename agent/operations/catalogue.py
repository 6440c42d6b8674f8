"""The thread catalogue: a user's threads, newest activity first, with titles and metadata.

Design notes:

* **One shape.** `thread_dict(record)` is the only builder of the thread dict
  (`thread_id`, `user_id`, `title`, `created_at`, `updated_at`, `checkpoint_id`
  (the head), `message_count`, `metadata`, `forked_from`, `ttl_seconds`); every
  operation, action and endpoint that shows a thread uses it.
* **Activity.** `updated_at` is the time of the thread's last write to its
  conversation: a turn, a state update, an edit or regeneration (those are
  turns), a head switch. Each of them goes through the claim, so one thread's
  `updated_at` only grows. `update_thread` changes what describes the thread
  (title, metadata, ttl), not the conversation: it leaves `updated_at` alone,
  so renaming a thread does not reorder a sidebar, and it needs no claim (it
  writes columns no turn writes, in one statement).
* **Keyset paging.** Pages are ordered by (`updated_at` DESC, `thread_id` DESC),
  the order of the index on (user_id, updated_at DESC, thread_id DESC) (on
  Postgres an ascending one scanned backward), so a page is one index range scan whatever the user's
  number of threads (bench/catalogue.py measures it). The cursor (`before`)
  is the exact sort key of the previous page's last thread, not its id: an id
  would have to be looked up again, and a thread that got new activity since
  would put the cursor at the top and repeat everything. What this guarantees
  while others write:
  - no thread appears twice in one paging (a thread only moves up, above the
    cursor, never below it);
  - every thread whose activity did not change during the paging appears
    exactly once (inserts above or below the cursor shift nothing, unlike
    OFFSET paging);
  - a thread created, or given new activity, after the page before was read
    is not in the remaining pages: it is at the top of a fresh first page.
    (A snapshot of where it was cannot be had without holding a transaction
    open between pages.)
* **Ownership.** A listing shows only the caller's threads (threads written
  without a user_id: anonymous callers'); `get_thread` and `update_thread` on
  another user's thread answer ThreadNotFound, as every operation does
  (`access`).
* **Metadata** follows OpenAI's rule for `metadata` objects (`thread_values`).
  `update_thread` replaces it (as OpenAI's `conversations.update` does); a turn's
  `custom_inputs.metadata` is stored when that turn creates the thread and is
  ignored on later turns (so a client may send it with every turn).
* **Default title**: the first user message of the turn that created the thread, shortened (`thread_values`).
* **Title search** (`title_contains`): case-insensitive, in Python over the same keyset pages
  (`TITLE_SCAN_PAGE` threads a read) until a page is full, not in SQL: with encryption at rest a
  title is stored sealed (`agent.encryption`), so the database cannot compare it. A search thus
  reads up to all of the user's threads (their rows only, no message); its cursor is that of the
  last thread it returns, so the next page goes on from there with the same filter.

This module imports no LangGraph, LangChain or MLflow: `tt-agent threads`
lists a SQLite store through the light reader (`storage.open_reader`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.errors import InvalidRequest
from agent.operations import checks
from agent.operations.access import authorize, thread_not_found
from agent.operations.operation import Operation, param
from agent.storage import ThreadRecord, owned_by
from agent.operations.thread_values import MAX_TITLE_CHARS, check_metadata, check_title, check_ttl, default_title
from agent.validation import MAX_ID_CHARS, check_id, check_limit

if TYPE_CHECKING:
    from agent.operations.context import OperationContext

    from agent.storage import ThreadReads, ThreadStorage

#: Default and largest page of `list_threads`.
DEFAULT_THREAD_LIMIT = 20
MAX_THREAD_LIMIT = 100
#: A cursor's prefix: its format's version.
CURSOR_PREFIX = "t1."
#: Threads read per statement while a title search filters them (see "Title search").
TITLE_SCAN_PAGE = 200


def thread_dict(record: ThreadRecord) -> dict[str, Any]:
    """The wire shape of a thread: `thread_id`, `user_id`, `title` (None if none), `created_at` and
    `updated_at` (ISO 8601, UTC; `updated_at` is the last activity), `checkpoint_id` (the head),
    `message_count` (the head's messages), `metadata` (str -> str), `forked_from`
    (`{"thread_id", "checkpoint_id"}` for a fork, else None) and `ttl_seconds` (None: the agent's setting)."""
    return {
        "thread_id": record.thread_id,
        "user_id": record.user_id,
        "title": record.title,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "checkpoint_id": record.head_checkpoint_id,
        "message_count": record.message_count,
        "metadata": dict(record.metadata or {}),
        "forked_from": dict(record.forked_from) if record.forked_from is not None else None,
        "ttl_seconds": record.ttl_seconds,
    }


# -- reads ------------------------------------------------------------------------------------------
def list_threads(
    storage: ThreadReads,
    *,
    user_id: str | None,
    limit: int = DEFAULT_THREAD_LIMIT,
    before: str | None = None,
    metadata: Mapping[str, str] | None = None,
    title_contains: str | None = None,
) -> list[dict[str, Any]]:
    """Up to `limit` of the caller's threads, newest activity first (`updated_at` DESC, then `thread_id` DESC).

    Args:
        storage: a `ThreadStorage`, or the light reader of read-only commands.
        user_id: the caller; only threads it owns are listed (None: threads written without a user_id).
        limit: 1 to 100.
        before: the `cursor` of the previous page's last thread (next page), or a thread_id (the
            threads after that thread's current position; see the module docstring for why the
            cursor is the one that neither skips nor repeats while others write).
        metadata: only threads whose metadata holds every given key with the given value.
        title_contains: only threads whose title holds this text, ignoring case (see "Title search").

    Returns:
        `thread_dict`s, each with one more key, `cursor` (opaque): pass the last one as `before`.

    Raises:
        InvalidRequest: bad limit, metadata or cursor (`before` neither a cursor nor one of the caller's
            thread ids; worded the same for another user's thread). StorageUnavailable: the database failed.
    """
    return list_page(
        storage, user_id=user_id, limit=limit, before=before, metadata=metadata, title_contains=title_contains
    )[0]


def list_page(
    storage: ThreadReads,
    *,
    user_id: str | None,
    limit: int = DEFAULT_THREAD_LIMIT,
    before: str | None = None,
    metadata: Mapping[str, str] | None = None,
    title_contains: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """`list_threads`, and the cursor of the next page (None: this was the last page)."""
    limit = check_limit(limit, maximum=MAX_THREAD_LIMIT)
    metadata = check_metadata(metadata) or {}
    needle = check_title_contains("title_contains", title_contains)
    key = _position(storage, before, user_id)
    if needle is None:
        rows = storage.list_threads(user_id, limit=limit + 1, before=key, metadata=metadata)  # one more: a next page?
    else:
        rows = _titled(storage, user_id, limit + 1, key, metadata, needle)
    threads = [{**thread_dict(record), "cursor": encode_cursor(sort_key)} for record, sort_key in rows[:limit]]
    return threads, threads[-1]["cursor"] if len(rows) > limit else None


def check_title_contains(name: str, value: Any) -> str | None:
    """None (or an empty text), or the text to look for in titles, casefolded: at most 256 characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > MAX_TITLE_CHARS:
        raise InvalidRequest(f"{name} must be at most {MAX_TITLE_CHARS} characters long")
    return value.strip().casefold() or None


def _titled(
    storage: ThreadReads,
    user_id: str | None,
    wanted: int,
    key: tuple[str, str] | None,
    metadata: Mapping[str, str],
    needle: str,
) -> list[tuple[ThreadRecord, tuple[str, str]]]:
    """Up to `wanted` rows of `storage.list_threads` whose title holds `needle`, read page after page."""
    found: list[tuple[ThreadRecord, tuple[str, str]]] = []
    while len(found) < wanted:
        rows = storage.list_threads(user_id, limit=TITLE_SCAN_PAGE, before=key, metadata=metadata)
        found += [row for row in rows if needle in (row[0].title or "").casefold()]
        if len(rows) < TITLE_SCAN_PAGE:
            break
        key = rows[-1][1]
    return found[:wanted]


def get_thread(storage: ThreadReads, thread_id: str, *, user_id: str | None) -> dict[str, Any]:
    """The thread as `thread_dict`.

    Raises:
        ThreadNotFound: unknown thread, or not the caller's.
    """
    return thread_dict(authorize(storage.get_thread(thread_id), thread_id, user_id))


def update_thread(
    storage: ThreadStorage,
    thread_id: str,
    *,
    user_id: str | None,
    title: str | None = None,
    metadata: Mapping[str, str] | None = None,
    ttl_seconds: float | None = None,
) -> dict[str, Any]:
    """Set the thread's title, metadata (replaced as a whole) and/or ttl_seconds; None leaves one as it is.

    One statement, without a claim (a running turn writes other columns); `updated_at` is not
    changed (see the module docstring). Everything is checked before anything is written.

    Returns:
        The thread after the change (`thread_dict`).

    Raises:
        InvalidRequest: a title that is empty or longer than 256 characters, metadata beyond
            OpenAI's limits, a ttl_seconds that is not a positive number; nothing is written.
        ThreadNotFound: unknown thread, or not the caller's; nothing is written.
    """
    title = check_title(title)
    metadata = check_metadata(metadata)
    ttl_seconds = check_ttl(ttl_seconds)
    record = storage.transaction(
        lambda tx: tx.update_thread(thread_id, user_id=user_id, title=title, metadata=metadata, ttl_seconds=ttl_seconds)
    )
    if record is None:
        raise thread_not_found(thread_id)
    return thread_dict(record)


# -- cursors ----------------------------------------------------------------------------------------
def encode_cursor(sort_key: tuple[str, str]) -> str:
    """An opaque cursor for a position (`activity`, `thread_id`) in the listing order."""
    raw = json.dumps(list(sort_key), separators=(",", ":")).encode()
    return CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    """The position a cursor of `encode_cursor` names.

    Raises:
        InvalidRequest: not such a cursor.
    """
    body = cursor[len(CURSOR_PREFIX) :]
    try:
        decoded = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError):
        decoded = None
    if not (
        isinstance(decoded, list)
        and len(decoded) == 2
        and all(isinstance(part, str) and part for part in decoded)
        and len(decoded[0]) <= MAX_ID_CHARS
    ):
        raise InvalidRequest(f"before is not a cursor of list_threads: {cursor[:80]!r}")
    try:  # the thread id part goes to the database as text: no NUL, no lone surrogate
        check_id("before (a cursor's thread id)", decoded[1])
    except InvalidRequest:
        raise InvalidRequest(f"before is not a cursor of list_threads: {cursor[:80]!r}") from None
    return decoded[0], decoded[1]


def _position(storage: ThreadReads, before: Any, user_id: str | None) -> tuple[str, str] | None:
    if before is None:
        return None
    if not isinstance(before, str):
        raise InvalidRequest(f"before must be a string, got {type(before).__name__}")
    if before.startswith(CURSOR_PREFIX):
        try:
            return decode_cursor(before)
        except InvalidRequest:
            # Unless it is a thread id of the caller's that merely looks like a cursor.
            if len(before) > MAX_ID_CHARS or not owned_by(storage.get_thread(before), user_id):
                raise
    thread_id = check_id("before", before)
    # Not one of the caller's threads (unknown, another user's, deleted meanwhile): `before` is a bad position
    # in the caller's own listing, worded the same in every case (so it tells nothing of other users' ids).
    position = storage.thread_position(thread_id) if owned_by(storage.get_thread(thread_id), user_id) else None
    if position is None:
        raise InvalidRequest(
            f"before is neither a cursor of list_threads (a listed thread's `cursor`) nor one of your thread ids: "
            f"{before[:80]!r}"
        )
    return position


# -- the operations ------------------------------------------------------------------------------
def _cursor(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string, got {type(value).__name__}")
    return value


_JSON = {"help": "Print JSON instead of a table."}


@dataclass(frozen=True, kw_only=True)
class ListArgs:
    user_id: str | None = param(None, source="user")
    limit: int = param(
        DEFAULT_THREAD_LIMIT, check=checks.limit(MAX_THREAD_LIMIT), cli={"metavar": "N", "help": "Most threads to show."}
    )
    before: str | None = param(
        None,
        check=_cursor,
        cli={"metavar": "CURSOR", "help": "The next page: the cursor the previous page printed (or a thread id)."},
    )
    metadata: dict[str, str] | None = param(
        None,
        check=checks.named(check_metadata),
        cli={"metavar": "KEY=VALUE", "help": "Only threads with this metadata (repeatable)."},
    )
    title_contains: str | None = param(
        None,
        check=check_title_contains,
        cli={"metavar": "TEXT", "help": "Only threads whose title holds TEXT (ignoring case)."},
    )


def list_threads_page(context: OperationContext, args: ListArgs) -> tuple[list[dict[str, Any]], str | None]:
    """The caller's threads, newest activity first (`updated_at` DESC, then `thread_id` DESC).

    Each: `thread_id`, `user_id`, `title` (default: the first user message, shortened to 60
    characters), `created_at`, `updated_at` (last activity; ISO 8601, UTC), `checkpoint_id` (the
    head), `message_count`, `metadata`, `forked_from`, `ttl_seconds`, and `cursor`: pass the last
    thread's as `before` for the next page (an empty page: no more). Paging neither repeats nor
    skips a thread while others write, except that a thread given new activity meanwhile moves to
    the top of a fresh first page (see `agent.operations.catalogue`). `limit`: 1 to 100.
    `metadata`: only threads whose metadata holds all these pairs. `title_contains`: only threads
    whose title holds this text, ignoring case (at most 256 characters; the search reads the
    user's threads until the page is full, so it also finds old ones).

    Raises: `InvalidRequest` (bad limit, cursor, metadata or title_contains; `before` neither a cursor nor one of
    the caller's thread ids).
    """
    return list_page(
        context.storage,
        user_id=args.user_id,
        limit=args.limit,
        before=args.before,
        metadata=args.metadata,
        title_contains=args.title_contains,
    )


@dataclass(frozen=True, kw_only=True)
class GetThreadArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    user_id: str | None = param(None, source="user")


def get_thread_record(context: OperationContext, args: GetThreadArgs) -> dict[str, Any]:
    """One thread, as `list_threads` lists it (without `cursor`).

    Raises: `InvalidRequest` (bad ids), `ThreadNotFound` (unknown, or not the caller's).
    """
    return get_thread(context.storage, args.thread_id, user_id=args.user_id)


@dataclass(frozen=True, kw_only=True)
class UpdateThreadArgs:
    thread_id: str = param(source="thread", check=checks.required_id, cli={"argument": True, "help": "The thread."})
    title: str | None = param(None, check=checks.value_only(check_title), cli={"metavar": "TEXT", "help": "A new title."})
    metadata: dict[str, str] | None = param(
        None,
        check=checks.named(check_metadata),
        cli={"metavar": "KEY=VALUE", "help": "The new metadata (repeatable; replaces all of it)."},
    )
    ttl_seconds: float | None = param(
        None,
        check=checks.value_only(check_ttl),
        cli={"metavar": "SECONDS", "help": "Idle time before retention may remove it."},
    )
    user_id: str | None = param(None, source="user")


def update_thread_record(context: OperationContext, args: UpdateThreadArgs) -> dict[str, Any]:
    """Set the thread's `title` (1 to 256 characters), `metadata` (replaces the whole object: at most
    16 pairs, string keys up to 64 characters, string values up to 512, as OpenAI's) and/or
    `ttl_seconds` (idle seconds before retention may remove it); None leaves a field as it is.
    `updated_at` (the last activity) does not change. Returns the thread as `get_thread` does.

    Raises: `InvalidRequest` (a value out of bounds; nothing is written), `ThreadNotFound`.
    """
    return update_thread(
        context.storage,
        args.thread_id,
        user_id=args.user_id,
        title=args.title,
        metadata=args.metadata,
        ttl_seconds=args.ttl_seconds,
    )


LIST_THREADS = Operation(
    name="list_threads",
    summary="The user's threads, newest activity first; `before`: the previous page's `next_before`.",
    args=ListArgs,
    run=list_threads_page,
    positional=0,
    python=lambda page: page[0],
    outputs=lambda page, args: {"threads": page[0], "next_before": page[1]},
    returns="list[dict[str, Any]]",
    reads_only=True,
    cli="threads",
)
GET_THREAD = Operation(
    name="get_thread",
    summary="The thread: title, metadata, head checkpoint_id, message_count, timestamps.",
    args=GetThreadArgs,
    run=get_thread_record,
    outputs=lambda thread, args: {"thread": thread},
    reads_only=True,
    cli="threads show",
)
UPDATE_THREAD = Operation(
    name="update_thread",
    summary="Set the thread's title, metadata (replaced) and/or ttl_seconds.",
    args=UpdateThreadArgs,
    run=update_thread_record,
    outputs=lambda thread, args: {"thread": thread},
    writes=True,
    cli="threads update",
)
