"""Full-text search over every message of every branch: what is indexed, and how a hit is told apart.

**What a row holds.** One index row per checkpoint, for the messages that first
appeared there (a turn's delta, `deltas`: its `add` part, so a turn costs one
row and one key, not one per message), and the row holds no text: only a
32-bit key per distinct word (`word_key`, a BLAKE2b digest of the lower-cased
word). Postgres keeps the keys as an `integer[]` with a GIN index (`@>` finds
the rows holding every key of a query); SQLite gives them, as short ASCII
tokens (`fts5_tokens`), to a contentless FTS5 table with `detail=none`
(https://sqlite.org/fts5.html#contentless_tables): it keeps only which rows
hold which token. The text of a hit is read at search time
from the checkpoint itself (`saver.TurnSaverMixin.first_appeared`), where
`hits` checks, in Python, which of that checkpoint's messages hold every word
and cuts the snippet; a row whose keys matched by a collision, or whose words
are spread over two messages, gives no hit or its first partly matching message.
So both backends answer with the same messages and the same snippets, newest
checkpoint first.

**Why no copy of the text.** The earlier layout kept each row's text (and a
GIN index over `to_tsvector` of it): about 4 times the text on Postgres and 2
times on SQLite, which broke the storage bound (storage growth over 3 times the
raw message bytes). Keys cost about 4 bytes per distinct word on Postgres (plus
the GIN posting lists), and about 2 on SQLite (`docs/performance.md` gives the
measured bytes per message). Snippets come from the checkpoint the hit names,
which is read anyway when a client opens it.

**Deletion.** Postgres deletes a row with its checkpoint. A contentless FTS5
table can only forget a row given its original tokens (SQLite before 3.43 has
no `contentless_delete`), so on SQLite the row's key in `agent_message_rows`
goes with the checkpoint, the FTS5 entry stays until `rebuild` (the
maintenance command `tt-agent search-index --rebuild`) drops them all, and
since FTS5 row ids are never reused (`AUTOINCREMENT`) a stale entry never names
another checkpoint: a deleted branch's text is not found, on either backend.

Words are `\\w+` runs, lower-cased, with no stemming: "going" does not find
"go". A message edited in the middle of a thread is indexed again at the
checkpoint where the edit made it appear, as `get_checkpoint_state` places it.
With encryption at rest nothing is indexed (the keys of common words are easy
to guess) and search is refused. Messages written before the index existed (or
before this layout) are indexed by `backfill` (setup does not: it may be long;
`tt-agent search-index` runs it, in batches, and running it twice changes
nothing).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

#: At most this many words of a query are used.
MAX_TERMS = 16
#: Characters of message text around the first matched word in a snippet.
SNIPPET_CHARS = 160

_WORD = re.compile(r"\w+", re.UNICODE)


def message_text(message: Any) -> str:
    """The searchable text of a LangChain message (its text content; a tool call's name when it has none)."""
    from agent.storage.summaries import message_text as one_line

    return one_line(message)


def words_of(text: str) -> set[str]:
    """The distinct words of `text`, lower-cased."""
    return set(_WORD.findall(text.lower()))


def word_key(word: str) -> int:
    """The signed 32-bit key of a lower-cased word (the first 4 bytes of its BLAKE2b digest)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest(), "big", signed=True)


def index_keys(messages: Sequence[Any]) -> list[int] | None:
    """The sorted distinct keys of the words of the messages that have an id and some text, or None when
    none has (no row is written)."""
    words: set[str] = set()
    for message in messages:
        if getattr(message, "id", None):
            words |= words_of(message_text(message))
    return sorted({word_key(word) for word in words}) or None


def terms(query: str) -> list[str]:
    """The query's words, lower-cased, each once, in order (at most `MAX_TERMS`)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def query_keys(words: Iterable[str]) -> list[int]:
    """The keys of a query's words (`terms`), sorted."""
    return sorted({word_key(word) for word in words})


def fts5_tokens(keys: Iterable[int]) -> str:
    """The FTS5 document of a row's keys: one ASCII token per key (`k` and 8 hex digits), which every
    FTS5 tokenizer reads as one token."""
    return " ".join(f"k{key & 0xFFFFFFFF:08x}" for key in keys)


def fts5_query(words: Sequence[str]) -> str:
    """An FTS5 MATCH expression requiring every word's token (tokens are plain ASCII: no operator)."""
    return fts5_tokens(query_keys(words))


def hits(messages: Sequence[Any], words: Sequence[str]) -> list[dict[str, str]]:
    """Of the messages that first appeared at a checkpoint, those that hold every word
    (each `{"message_id", "text"}`), in order.

    When none holds them all (the words are spread over several messages), the first message that
    holds any of them stands for the checkpoint; when none holds any (a key collision), no hit.
    """
    wanted = set(words)
    pairs = [(str(m.id), message_text(m)) for m in messages if getattr(m, "id", None)]
    found = [(mid, text) for mid, text in pairs if wanted <= words_of(text)]
    if not found:
        found = [(mid, text) for mid, text in pairs if wanted & words_of(text)][:1]
    return [{"message_id": mid, "text": text} for mid, text in found]


def snippet(text: str, words: Sequence[str]) -> str:
    """About `SNIPPET_CHARS` characters of `text` around its first matched word, on one line, with `…`
    where it was cut."""
    flat = " ".join(text.split())
    lowered = flat.lower()
    starts = [m.start() for m in _WORD.finditer(lowered) if m.group() in set(words)]
    first = starts[0] if starts else 0
    begin = max(0, first - SNIPPET_CHARS // 3)
    end = min(len(flat), begin + SNIPPET_CHARS)
    begin = max(0, min(begin, end - SNIPPET_CHARS))
    return ("…" if begin > 0 else "") + flat[begin:end] + ("…" if end < len(flat) else "")


#: Checkpoints indexed per transaction by `backfill`.
BACKFILL_BATCH = 500


def backfill(storage: Any, *, batch_size: int = BACKFILL_BATCH, rebuild: bool = False) -> int:
    """Index every root-namespace checkpoint of `storage` (a `ThreadStorage`) that has no search index row:
    those written before the index existed, or before its current layout (the migration dropped them).

    Batched: `batch_size` checkpoints are read (one query per thread of the batch) and written in one
    transaction at a time, so turns go on meanwhile (a checkpoint a turn writes meanwhile is indexed by
    its own commit). Idempotent: a second run finds nothing to do. `rebuild=True` first removes every
    row (on SQLite this also drops the FTS5 entries that deleted checkpoints left, see "Deletion" above).
    Does nothing with encryption at rest (nothing is indexed there).

    Returns: the number of checkpoints indexed (those whose messages add no searchable text are looked at
    but not counted).
    """
    if storage.keyring.enabled:
        return 0
    if rebuild:
        storage.clear_search_index()
    indexed, after = 0, None
    while True:
        page = storage.unindexed_checkpoints(after, batch_size)
        if not page:
            return indexed
        after = page[-1]
        by_thread: dict[str, list[str]] = {}
        for thread_id, checkpoint_id in page:
            by_thread.setdefault(thread_id, []).append(checkpoint_id)
        rows = []
        for thread_id, checkpoint_ids in by_thread.items():
            for checkpoint_id, messages in storage.saver.first_appeared(thread_id, checkpoint_ids).items():
                keys = index_keys(messages)
                if keys is not None:
                    rows.append((thread_id, checkpoint_id, keys))
        if rows:
            storage.index_checkpoints(rows)
        indexed += len(rows)
