"""Full-text search over every message of every branch: what is indexed, and how a hit is found.

**What is indexed: the words new to a branch.** A checkpoint gets an index
row only for the words its new messages (a turn's delta, `deltas`: its `add`
part) bring to its branch, i.e. the words that the messages it inherits from
its parent lack (`new_keys`; the rows of its path hold those already), plus a
row, possibly empty, at each root (it says "this thread is indexed", see
"Backfill"). A row holds no text: a
32-bit key per word (`word_key`, a BLAKE2b digest of the lower-cased word).
So a word costs once per branch, not once per turn it is said in: in chat, most
words of a turn were said before (the model quotes the user; people repeat
themselves), and the earlier layout, a row per checkpoint with every distinct
word of its new messages, cost nearly as much as the messages' text on
Postgres (874 B a turn of 1,105 B of text, 200 B user messages), more than the
500 B "fixed cost per turn" budget on its own; now 355 B (`docs/performance.md`
has both vocabularies of `bench.search`). Postgres keeps a checkpoint's keys
as an `integer[]` in its own row (`checkpoints.agent_terms`, NULL for "no
row"), with a partial GIN index: a table of their own cost a row header and
both ids per row, about 120 bytes a turn more. SQLite keeps them as
4-character tokens (`fts5_token`) in `agent_message_rows.terms`, the content
table of an FTS5 table with `detail=none`
(https://sqlite.org/fts5.html#external_content_tables), whose rows are found by
an index on the thread id alone, not a unique (thread, checkpoint) one, which
would copy both ids into every entry.

**Why per branch, not per thread.** "New to the thread" would cost a word once
per thread even when branches repeat it, but a word said on two sibling
branches would then be indexed on the first only, and deleting that branch
(`delete_branch`) would lose the word for the other. A branch's path from the
root survives every deletion of a subtree, so the rows of a checkpoint and its
ancestors always hold the key of every word of its message list (the
invariant the search relies on), and nothing is recomputed when a branch goes.
The write needs nothing read: the keys of each recent checkpoint's message
list are cached (`KeySets`). What removes
ancestors (retention's `keep_only_head`, `prune`, `delete_for_runs`) rewrites
the checkpoints it keeps as roots or on new parents, and those are indexed
again with every word of their messages.

**How a query is answered.** The index finds the candidate threads, those of
the user whose rows hold, together, the key of every query word
(`ThreadStorage.search_candidates`, newest thread first). The hits are then
found by reading each candidate thread's messages (its stored deltas, one
query; `thread_hits`): every message that first appeared at a checkpoint
whose new messages hold every word, on every branch, newest checkpoint first,
with its snippet. A thread whose keys matched by a collision or whose words are
spread over several turns gives no hit. Candidates are read newest first and
the reading stops once `limit` hits are newer than the next candidate's newest
checkpoint. A word said once in a long thread costs a read of that thread: the
price of not indexing every turn (`bench.search` gives the latencies).

**Deletion.** Rows go with their checkpoints on both backends (on Postgres they are the checkpoints' own). On SQLite the
FTS5 table takes its tokens from `agent_message_rows` (external content), and
triggers delete a row's entries with the tokens the row holds, so nothing stale
stays (the earlier contentless table could not forget a row before SQLite 3.43's
`contentless_delete`; its entries stayed until a rebuild). The price is each
token stored twice on SQLite (5 bytes a word more): with a large vocabulary,
where most turns bring new words, the SQLite index is larger than the earlier
contentless one (`docs/performance.md`). And the hits are read from the
checkpoints that exist: a deleted branch's text is never found.

Words are `\\w+` runs, lower-cased, with no stemming: "going" does not find
"go". A message edited in the middle of a thread is a hit at the checkpoint
where the edit made it appear, as `get_checkpoint_state` places it. With
encryption at rest nothing is indexed (the keys of common words are easy to
guess) and search is refused.

**Backfill.** A thread is indexed when its root checkpoint has a row (every
commit writes it with the thread's first checkpoint). Threads written before
the index, or before this layout (the migrations drop the earlier rows), have
none: `backfill` (`tt-agent search-index`, not setup: it may be long) indexes
them a thread at a time, and running it twice changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.storage import deltas, staging

#: At most this many words of a query are used.
MAX_TERMS = 16
#: Characters of message text around the first matched word in a snippet.
SNIPPET_CHARS = 160

_WORD = re.compile(r"\w+", re.UNICODE)
#: The digits of an FTS5 token (`fts5_token`): letters and digits, and punctuation that the FTS5 table's
#: tokenizer counts as part of a token (`tokenchars` in the SQLite schema); no quote.
FTS5_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz!#$%&()*+,-./:;<=>?@[]^_{|}~"


def message_text(message: Any) -> str:
    """The searchable text of a LangChain message (its text content; a tool call's name when it has none)."""
    from agent.storage.summaries import message_text as one_line

    return one_line(message)


def words_of(text: str) -> set[str]:
    """The distinct words of `text`, lower-cased."""
    return set(_WORD.findall(text.lower()))


@functools.lru_cache(maxsize=256)
def _word_in(word: str) -> re.Pattern[str]:
    """Finds `word` as a whole word (a `\\w+` run) of lower-cased text: what `words_of` would hold."""
    return re.compile(rf"(?<!\w){re.escape(word)}(?!\w)")


def word_key(word: str) -> int:
    """The signed 32-bit key of a lower-cased word (the first 4 bytes of its BLAKE2b digest)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest(), "big", signed=True)


def message_keys(messages: Iterable[Any]) -> set[int]:
    """The keys of the words of the messages that have an id (those a hit can name)."""
    words: set[str] = set()
    for message in messages:
        if getattr(message, "id", None):
            words |= words_of(message_text(message))
    return {word_key(word) for word in words}


def new_keys(added: Iterable[Any], inherited: set[int] | frozenset[int]) -> list[int]:
    """A checkpoint's row: the sorted keys of the words of its new messages (`added`) that are not among
    the keys of the messages it inherits from its parent (`inherited`)."""
    return sorted(message_keys(added) - inherited)


class KeySets:
    """The keys of the message lists of recently written checkpoints (by checkpoint id, least recently used
    out first), so that a turn's write knows which of its words its branch already holds without reading.

    The rows of a checkpoint's path hold every key of its message list: a row holds the keys of the new
    messages that the inherited ones lack, and what removes ancestors rewrites the checkpoints it keeps
    with every key of their list (`rewritten_keys`). A committed checkpoint's list never changes, so an
    entry never goes stale (a write transaction's entries wait for its commit: `staging`); a miss (or an
    edit, which inherits only part of its parent's list) reads the inherited messages' words again."""

    def __init__(self, maxsize: int = 256) -> None:
        #: The most entries kept (`staging.Publishes`).
        self.capacity = maxsize
        self._entries: OrderedDict[str, tuple[int, frozenset[int]]] = OrderedDict()
        self._lock = threading.Lock()

    def row(self, checkpoint_id: str, parent_id: str | None, messages: Sequence[Any], kept: int) -> list[int]:
        """The row (`new_keys`) of checkpoint `checkpoint_id` whose message list is `messages`, of which
        the first `kept` are its parent's (`deltas.encode`); remembers the list's keys."""
        staged = staging.current()
        cached = None
        if parent_id is not None:
            cached = staged.get(self, parent_id) if staged is not None else None
            if cached is None:
                with self._lock:
                    cached = self._entries.get(parent_id)
        if kept == 0:
            inherited: frozenset[int] = frozenset()
        elif cached is not None and cached[0] == kept:
            inherited = cached[1]
        else:
            inherited = frozenset(message_keys(messages[:kept]))
        row = new_keys(messages[kept:], inherited)
        entry = (len(messages), inherited.union(row) if row else inherited)
        if staged is not None:
            staged.put(self, checkpoint_id, entry)
        else:
            self.publish({checkpoint_id: entry})
        return row

    def publish(self, entries: dict[str, tuple[int, frozenset[int]]]) -> None:
        """Remember `entries` (checkpoint id -> (list length, keys), oldest first): `staging.Publishes`."""
        with self._lock:
            for checkpoint_id, entry in entries.items():
                self._entries[checkpoint_id] = entry
                self._entries.move_to_end(checkpoint_id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)


def thread_rows(stored: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
    """The index rows of a thread (`KeySets`): (checkpoint_id, sorted keys) from the stored `messages`
    value of each of its root-namespace checkpoints (`stored`, as the saver wrote them), each delta's
    inherited messages followed through its base. A row for every root (possibly empty), and for every
    other checkpoint whose new messages bring words its inherited ones lack; in checkpoint id order."""
    parts: dict[str, tuple[str | None, int, list[Any]]] = {}
    children: dict[str, int] = {}
    for checkpoint_id, value in stored.items():
        base, kept, added = deltas.parts(value) if deltas.is_delta(value) else (None, 0, deltas.added_messages(value))
        parts[checkpoint_id] = (base if base in stored else None, kept, added)
        if base in stored:
            children[base] = children.get(base, 0) + 1
    lists: dict[str, tuple[int, set[int]]] = {}  # (length, keys) of the lists some unread checkpoint inherits
    cache = deltas.MessageCache(64)
    rows = []
    # A base is written before the checkpoints that extend it, so its id is smaller; a base not read yet
    # (an id out of order) counts as inheriting nothing: its words are indexed twice, never missed.
    for checkpoint_id in sorted(stored):
        base, kept, added = parts[checkpoint_id]
        inherited: set[int] = set()
        if base is not None and kept and base in lists:
            length, keys = lists[base]
            children[base] -= 1
            if kept < length:  # an edit: only the first `kept` of the base's messages
                try:
                    inherited = message_keys(deltas.resolve_stored(base, stored, cache)[:kept])
                except LookupError:  # a chain of bases broken by a deletion: inherit nothing
                    inherited = set()
            elif children[base] == 0:
                inherited = keys  # the last reader takes the set (no copy on a straight line)
            else:
                inherited = set(keys)
            if children[base] == 0:
                del lists[base]
        row = new_keys(added, inherited)
        inherited.update(row)
        if row or base is None:
            rows.append((checkpoint_id, row))
        if children.get(checkpoint_id):
            lists[checkpoint_id] = (kept + len(added), inherited)
    return rows


def rewritten_keys(messages: Any) -> list[int]:
    """The row of a checkpoint rewritten whole (retention's rewrites: its ancestors go): every key of
    its messages."""
    return sorted(message_keys(messages)) if deltas.is_message_list(messages) else []


def terms(query: str) -> list[str]:
    """The query's words, lower-cased, each once, in order (at most `MAX_TERMS`)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def query_keys(words: Iterable[str]) -> list[int]:
    """The keys of a query's words (`terms`), sorted."""
    return sorted({word_key(word) for word in words})


def fts5_token(key: int) -> str:
    """The FTS5 token of a key: its low 24 bits as 4 digits of `FTS5_DIGITS` (base 64).

    Short because SQLite stores a row's tokens twice (the row's `terms`, the FTS5 table's terms): 5
    bytes a word with its space, against 8 for 32 bits in base 36. The 24 bits collide more often (a
    word of a query matches some other word of a thread of 3,000 words about once in 5,600 threads),
    which costs only the reading of a thread that has no hit."""
    value = key & 0xFFFFFF
    return "".join(FTS5_DIGITS[(value >> shift) & 63] for shift in (18, 12, 6, 0))


def fts5_tokens(keys: Iterable[int]) -> str:
    """The FTS5 document of a row's keys, space-separated tokens (`fts5_token`)."""
    return " ".join(fts5_token(key) for key in keys)


@dataclass(frozen=True)
class Hit:
    """A message holding every word of a query, at the checkpoint where it first appeared."""

    thread_id: str
    checkpoint_id: str
    message_id: str
    text: str


def hits(messages: Sequence[Any], words: Sequence[str]) -> list[dict[str, str]]:
    """Of the messages that first appeared at a checkpoint, those that hold every word
    (each `{"message_id", "text"}`), in order.

    When the messages hold every word together but none alone (the words are spread over a question and
    its answer), the first message that holds any of them stands for the checkpoint; when they do not
    hold every word together, no hit.
    """
    wanted = set(words)
    pairs = []
    for message in messages:
        if getattr(message, "id", None):
            text = message_text(message)
            low = text.lower()
            # A substring test first: cheaper than the whole-word search, and most messages fail it.
            held = {word for word in wanted if word in low and _word_in(word).search(low)}
            if held:
                pairs.append((str(message.id), text, held))
    if not pairs or not wanted <= set().union(*(held for _, _, held in pairs)):
        return []
    found = [(mid, text) for mid, text, held in pairs if wanted <= held]
    if not found:
        found = [(mid, text) for mid, text, held in pairs if wanted & held][:1]
    return [{"message_id": mid, "text": text} for mid, text in found]


def _may_hold(record: Any, words: Sequence[str]) -> bool:
    """False when a stored message record (`deltas.to_record`) surely holds none of `words`: a text
    content without them and no other field (a tool call's name would be its text). Building the
    message is most of the cost of reading a thread."""
    if not isinstance(record, list) or len(record) > 3 or not isinstance(record[1], str):
        return True
    low = record[1].lower()
    return any(word in low for word in words)


def _added(stored: Any, words: Sequence[str]) -> list[Any]:
    """The messages a stored `messages` value adds (`deltas.added_messages`), less those that surely hold
    none of `words`."""
    if isinstance(stored, Mapping) and deltas.COMPACT_KEY in stored:
        return [deltas.from_record(r) for r in stored["a"] if _may_hold(r, words)]
    return deltas.added_messages(stored)


def thread_hits(thread_id: str, stored: Mapping[str, Any], words: Sequence[str]) -> list[Hit]:
    """Every hit (`hits`) of a thread, from the stored `messages` value of each of its root-namespace
    checkpoints (`stored`): newest checkpoint first, a checkpoint's messages in their order."""
    found = []
    for checkpoint_id in sorted(stored, reverse=True):
        for hit in hits(_added(stored[checkpoint_id], words), words):
            found.append(Hit(thread_id, checkpoint_id, hit["message_id"], hit["text"]))
    return found


def search(storage: Any, user_id: str | None, words: Sequence[str], limit: int) -> list[Hit]:
    """Up to `limit` hits of `words` (`terms`) in `user_id`'s threads (`storage`, a `ThreadStorage`),
    newest checkpoint first (ties: the greater thread id first; a checkpoint's messages in order).

    Reads the candidate threads (`ThreadStorage.search_candidates`) newest first, and stops once `limit`
    hits are newer than the next candidate's newest checkpoint."""
    found: list[Hit] = []
    for candidate in storage.search_candidates(user_id, list(words)):
        if len(found) >= limit and candidate.newest_checkpoint_id < found[limit - 1].checkpoint_id:
            break
        stored = storage.saver.stored_messages(candidate.thread_id)
        found.extend(thread_hits(candidate.thread_id, stored, words))
        # A stable sort: a checkpoint's messages keep their order.
        found.sort(key=lambda hit: (hit.checkpoint_id, hit.thread_id), reverse=True)
        del found[limit:]
    return found


def snippet(text: str, words: Sequence[str]) -> str:
    """About `SNIPPET_CHARS` characters of `text` around its first matched word, on one line, with `…`
    where it was cut."""
    flat = " ".join(text.split())
    lowered = flat.lower()
    starts = [found.start() for found in (_word_in(word).search(lowered) for word in words) if found]
    first = min(starts, default=0)
    begin = max(0, first - SNIPPET_CHARS // 3)
    end = min(len(flat), begin + SNIPPET_CHARS)
    begin = max(0, min(begin, end - SNIPPET_CHARS))
    return ("…" if begin > 0 else "") + flat[begin:end] + ("…" if end < len(flat) else "")


#: Threads listed per page by `backfill`.
BACKFILL_BATCH = 500


def backfill(storage: Any, *, batch_size: int = BACKFILL_BATCH, rebuild: bool = False) -> int:
    """Index every thread of `storage` (a `ThreadStorage`) whose root checkpoint has no search index row:
    those written before the index existed, or before its current layout (the migration dropped them).

    Pages of `batch_size` threads; each thread is read (one query) and its rows written in one
    transaction, replacing those of the checkpoints read, so turns go on meanwhile (a checkpoint a turn
    writes meanwhile is indexed by its own commit). Idempotent: a second run finds nothing to do.
    `rebuild=True` first removes every row. Does nothing with encryption at rest (nothing is indexed there).

    Returns: the number of root-namespace checkpoints of the threads indexed.
    """
    if storage.keyring.enabled:
        return 0
    if rebuild:
        storage.clear_search_index()
    indexed, after = 0, None
    while True:
        page = storage.unindexed_threads(after, batch_size)
        if not page:
            return indexed
        after = page[-1]
        for thread_id in page:
            stored = storage.saver.stored_messages(thread_id)
            storage.index_thread(thread_id, list(stored), thread_rows(stored))
            indexed += len(stored)
