"""Full-text search over every message of every branch: what is indexed, and how a hit is told apart.

Why one index row per checkpoint and not per message: each checkpoint's row
holds the messages that first appeared there (a turn's delta, `deltas`: its
`add` part), joined by `SEPARATOR`, so a turn costs one row (two messages) and
one key in the index, not two; the storage bound of a turn stays near its
messages' own text. Each backend indexes that row with its own full-text
engine (Postgres: a GIN index on `to_tsvector('simple', body)`; SQLite: an FTS5
table over it, `content=` the row table, so the text is stored once). The
database finds the rows that hold every query word; `hits` then finds, in
Python, which of the row's messages matched and cuts the snippet, so both
backends answer with the same messages and the same snippets.

Words are `\\w+` runs, lower-cased, with no stemming (the `simple`
configuration and FTS5's `unicode61` tokenizer agree on that): "going" does
not find "go". A message edited in the middle of a thread is indexed again at
the checkpoint where the edit made it appear, as `get_checkpoint_state` places
it. With encryption at rest nothing is indexed (the index would hold the text
in the clear) and search is refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agent.storage.records import SearchRow

#: Joins the messages (and their ids) of one index row: a control character no tokenizer counts as a word.
SEPARATOR = "\x1e"
#: At most this many words of a query are used.
MAX_TERMS = 16
#: Characters of message text around the first matched word in a snippet.
SNIPPET_CHARS = 160

_WORD = re.compile(r"\w+", re.UNICODE)


def message_text(message: Any) -> str:
    """The searchable text of a LangChain message (its text content; a tool call's name when it has none).

    NUL characters become spaces: Postgres text cannot hold them (the message itself keeps them).
    """
    from agent.storage.summaries import message_text as one_line

    return one_line(message).replace(SEPARATOR, " ").replace("\x00", " ")


def index_row(messages: Sequence[Any]) -> tuple[str, str] | None:
    """(`message_ids`, `body`) of the messages that have an id and some text, or None when none has."""
    ids, bodies = [], []
    for message in messages:
        text = message_text(message)
        if getattr(message, "id", None) and text.strip():
            ids.append(str(message.id).replace(SEPARATOR, " ").replace("\x00", " "))
            bodies.append(text)
    if not ids:
        return None
    return SEPARATOR.join(ids), SEPARATOR.join(bodies)


def terms(query: str) -> list[str]:
    """The query's words, lower-cased, each once, in order (at most `MAX_TERMS`)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def fts5_query(words: Sequence[str]) -> str:
    """An FTS5 MATCH expression requiring every word (each quoted, so no word is read as an operator)."""
    return " ".join('"' + word.replace('"', '""') + '"' for word in words)


def hits(row: SearchRow, words: Sequence[str]) -> list[dict[str, str]]:
    """The messages of an index row that hold every word (each `{"message_id", "text"}`), in order.

    When no single message holds them all (the row matched across messages), the first message
    that holds any of them stands for the row.
    """
    wanted = set(words)
    pairs = list(zip(row.message_ids.split(SEPARATOR), row.body.split(SEPARATOR), strict=False))
    found = [(mid, text) for mid, text in pairs if wanted <= set(_WORD.findall(text.lower()))]
    if not found:
        found = [(mid, text) for mid, text in pairs if wanted & set(_WORD.findall(text.lower()))][:1]
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
