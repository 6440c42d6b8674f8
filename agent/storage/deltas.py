"""Messages stored once: a checkpoint keeps only the messages its parent lacks.

Why: LangGraph stores a reducer channel such as `messages` whole in every
checkpoint, so one thread of N turns costs O(N²) bytes (200 turns of ~500 bytes
gave 44.6 MB of blobs). Here the `messages` value of a checkpoint is
written as a delta against the checkpoint the run started from:

    {COMPACT_KEY: <base checkpoint_id or None>, "k": k, "a": [...]}

which means "the first `k` messages of `base`, then the messages `a`". An ordinary turn
appends, so `k` is the base's length and `add` holds that turn's messages. An
edit or removal in the middle (`add_messages` replacing a message by id,
`RemoveMessage`) shortens `k`, so every branch still reads back exactly what
LangGraph wrote. Bases are checkpoint ids, which never change, so a resolved
list can be cached without ever going stale.

**Compact records.** A message of LangChain's own plain classes (human, ai,
system, tool, chat, function) is stored as a record `[type, content, id]`,
plus a dict of its other fields that differ from their defaults:
LangGraph's serializer writes every field of a message under its name
(`additional_kwargs`, `response_metadata`, `tool_calls`, ...), about 260
bytes per message of a turn beyond its text, which was most of a turn's fixed
storage cost with short messages (issue "pay only for what a turn says").
`encode` rebuilds each record and keeps the message object itself whenever
the rebuilt message would not be equal (a subclass, a chunk, a field the
record cannot carry), so what is read back is always what was written. The
earlier layout, `{DELTA_KEY: 1, "base", "keep", "add": [messages]}`, is still
read (`parts`): stored threads need no rewrite.

Why not LangGraph's `DeltaChannel`: it is beta, its messages reducer does not
do everything `add_messages` does, langgraph#8548 reports a fork replaying the
other branch's writes, and measured here its turn latency still grew with the
thread (6.7 ms to 25 ms over 200 turns). This module keeps `add_messages` as
the reducer and changes only how the value is stored.
"""

from __future__ import annotations

import functools
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agent.storage import staging

#: The key of the earlier layout (messages stored as LangChain objects), still read.
DELTA_KEY = "__tt_messages_delta__"
#: The key of the compact layout written now; its value is the base checkpoint id.
COMPACT_KEY = "~m"

Messages = tuple[Any, ...]


def encode(messages: Sequence[Any], base_id: str | None, base_messages: Sequence[Any]) -> dict:
    """The delta that turns `base_messages` (the messages of checkpoint `base_id`) into `messages`.

    Compares by identity first: LangGraph's reducer keeps the loaded message
    objects, so an appending turn costs one C-level `is` pass over the list.
    """
    keep = common_prefix(messages, base_messages)
    return {COMPACT_KEY: base_id if keep else None, "k": keep, "a": [to_record(m) for m in messages[keep:]]}


def parts(delta: Mapping[str, Any]) -> tuple[str | None, int, list[Any]]:
    """(base checkpoint id or None, how many of the base's messages to keep, the messages added) of a
    stored delta, in either layout (see "Compact records" above)."""
    if COMPACT_KEY in delta:
        return delta[COMPACT_KEY], delta["k"], [from_record(r) for r in delta["a"]]
    return delta["base"], delta["keep"], list(delta["add"])


def added_messages(stored: Any) -> list[Any]:
    """The messages a stored `messages` value adds to its base: a delta's added messages, a whole list
    as it is (a thread's root), nothing for anything else a graph keeps there."""
    if is_delta(stored):
        return parts(stored)[2]
    return list(stored) if is_message_list(stored) else []


def base_of(delta: Mapping[str, Any]) -> str | None:
    """The base checkpoint id of a stored delta (either layout), without decoding its messages."""
    return delta[COMPACT_KEY] if COMPACT_KEY in delta else delta["base"]


@functools.cache
def _message_classes() -> dict[str, type]:
    """LangChain's plain message classes by their `type`."""
    from langchain_core.messages import (  # here: `agent.state` imports this module without LangChain
        AIMessage,
        ChatMessage,
        FunctionMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )

    classes = (HumanMessage, AIMessage, SystemMessage, ToolMessage, ChatMessage, FunctionMessage)
    return {c.model_fields["type"].default: c for c in classes}


def to_record(message: Any) -> Any:
    """`[type, content, id]` (+ a dict of the other non-default fields) for a message of LangChain's plain
    classes that it rebuilds exactly; else the message itself (LangGraph's serializer stores it)."""
    classes = _message_classes()
    kind = getattr(message, "type", None)
    if not isinstance(kind, str) or classes.get(kind) is not type(message):
        return message
    try:
        fields = message.model_dump(exclude_defaults=True, exclude={"type"})
        record = [kind, fields.pop("content", ""), fields.pop("id", None)]
        if fields:
            record.append(fields)
        same = from_record(record) == message
    except Exception:  # noqa: BLE001 - a field the record cannot carry: keep the object
        same = False
    return record if same else message


def from_record(record: Any) -> Any:
    """The message a `to_record` record stands for (a message stored as itself is returned as it is)."""
    if not isinstance(record, list):
        return record
    classes = _message_classes()
    kind, content, message_id, *rest = record
    fields = dict(rest[0]) if rest else {}
    if message_id is not None:
        fields["id"] = message_id
    return classes[kind](content=content, **fields)


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading messages `a` and `b` share (the same object, or equal).

    Identity is checked for the whole prefix at C speed first: LangGraph's reducer keeps the
    loaded message objects, so on a long thread nearly every message is the same object.
    """
    limit = min(len(a), len(b))
    same = list(map(operator.is_, a[:limit], b[:limit]))
    keep = same.index(False) if False in same else limit
    while keep < limit and (a[keep] is b[keep] or a[keep] == b[keep]):
        keep += 1
    return keep


def kept_trailing(a: Sequence[Any], b: Sequence[Any], kept: int) -> int:
    """How many trailing messages `a` and `b` share after their first `kept` (their common prefix), when
    both have the same length; 0 when the lengths differ.

    Same length with a shorter prefix is an in-place replacement (`update_checkpoint_state` with a message
    id): the messages after the replaced ones are unchanged, and the branch tree keeps their places
    (`agent.operations.tree`). A change of length (a removal, a turn) shifts positions, so nothing after the
    prefix counts as kept.
    """
    if len(a) != len(b):
        return 0
    trailing = 0
    while trailing < len(a) - kept and (a[-1 - trailing] is b[-1 - trailing] or a[-1 - trailing] == b[-1 - trailing]):
        trailing += 1
    return trailing


def is_message_list(value: Any) -> bool:
    """Whether `value` is stored as a delta: a list of LangChain messages (an empty list included).

    Anything else a graph keeps under `messages` (text, dicts, a tuple) is stored as LangGraph stores it.
    """
    if not isinstance(value, list):
        return False
    from langchain_core.messages import BaseMessage  # here: `agent.state` imports this module without LangChain

    return all(isinstance(message, BaseMessage) for message in value)


def is_delta(value: Any) -> bool:
    """Whether a stored `messages` value is a delta written by `encode` (in either layout)."""
    return isinstance(value, dict) and (COMPACT_KEY in value or DELTA_KEY in value)


class MessageIds:
    """The ids of a message list: a frozen `base` that the lists of one branch share, and the few `added` since.

    Sharing the base keeps one set per branch in the cache instead of one per checkpoint.
    """

    __slots__ = ("added", "base")

    #: How many added ids are merged into a new base.
    MERGE_AT = 256

    def __init__(self, base: frozenset[str], added: frozenset[str] = frozenset()) -> None:
        self.base = base
        self.added = added

    def isdisjoint(self, ids: frozenset[str]) -> bool:
        return self.base.isdisjoint(ids) and self.added.isdisjoint(ids)

    def plus(self, ids: frozenset[str]) -> MessageIds:
        added = self.added | ids
        return MessageIds(self.base | added) if len(added) > self.MERGE_AT else MessageIds(self.base, added)


class MessageList(list):
    """A resolved message list that may know its message ids (`ids`; None once changed in place).

    The state's messages reducer (`agent.state.append_messages`) uses the ids to
    append without reading the whole list, and the cache keeps them with the list,
    so a turn that continues a cached checkpoint reads none of its old messages.
    """

    __slots__ = ("ids",)

    def __init__(self, messages: Iterable[Any] = (), ids: MessageIds | None = None) -> None:
        super().__init__(messages)
        self.ids = ids

    def _changed(self, result: Any = None) -> Any:
        self.ids = None
        return result

    # Any change in place makes the known ids stale.
    def __setitem__(self, *args):
        return self._changed(super().__setitem__(*args))

    def __delitem__(self, *args):
        return self._changed(super().__delitem__(*args))

    def __iadd__(self, other):
        super().__iadd__(other)
        return self._changed(self)

    def __imul__(self, other):
        super().__imul__(other)
        return self._changed(self)

    def append(self, item):
        return self._changed(super().append(item))

    def extend(self, items):
        return self._changed(super().extend(items))

    def insert(self, index, item):
        return self._changed(super().insert(index, item))

    def pop(self, *args):
        return self._changed(super().pop(*args))

    def remove(self, item):
        return self._changed(super().remove(item))

    def clear(self):
        return self._changed(super().clear())

    def sort(self, *args, **kwargs):
        return self._changed(super().sort(*args, **kwargs))

    def reverse(self):
        return self._changed(super().reverse())


class MessageCache:
    """A bounded LRU of resolved message lists (and their ids when known), keyed by checkpoint id. Thread-safe.

    Inside a write transaction (`staging.scope`) entries are held back until it commits, and that
    transaction's lookups see them first.
    """

    def __init__(self, maxsize: int) -> None:
        #: The most entries kept (`staging.Publishes`).
        self.capacity = maxsize
        self._items: OrderedDict[str, tuple[Messages, MessageIds | None]] = OrderedDict()
        self._lock = threading.Lock()

    def _entry(self, checkpoint_id: str) -> tuple[Messages, MessageIds | None] | None:
        staged = staging.current()
        if staged is not None and (held := staged.get(self, checkpoint_id)) is not None:
            return held
        with self._lock:
            found = self._items.get(checkpoint_id)
            if found is not None:
                self._items.move_to_end(checkpoint_id)
            return found

    def get(self, checkpoint_id: str) -> Messages | None:
        found = self._entry(checkpoint_id)
        return found[0] if found is not None else None

    def get_list(self, checkpoint_id: str) -> MessageList | None:
        """A new `MessageList` of the cached messages, with their ids if they are known."""
        found = self._entry(checkpoint_id)
        return MessageList(*found) if found is not None else None

    def put(self, checkpoint_id: str, messages: Sequence[Any]) -> None:
        if self.capacity == 0:
            return
        entry = (tuple(messages), messages.ids if isinstance(messages, MessageList) else None)
        staged = staging.current()
        if staged is not None:
            staged.put(self, checkpoint_id, entry)
        else:
            self.publish({checkpoint_id: entry})

    def publish(self, entries: dict[str, tuple[Messages, MessageIds | None]]) -> None:
        """Store `entries` (checkpoint id -> entry, oldest first), as `put` does outside a transaction."""
        with self._lock:
            for checkpoint_id, entry in entries.items():
                self._items[checkpoint_id] = entry
                self._items.move_to_end(checkpoint_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


def resolve(
    value: Any,
    cache: MessageCache,
    fetch_thread: Callable[[], Mapping[str, Any]],
) -> list[Any]:
    """The full message list for a stored `messages` value.

    `fetch_thread` returns every stored `messages` value of the thread, keyed by
    checkpoint id; it is called only when a base is not cached, so a turn that
    continues a thread this process has seen reads no old messages.

    Raises:
        LookupError: a delta names a base checkpoint that is not stored (the
            thread was deleted while being read).
    """
    if not is_delta(value):
        return list(value or ())
    base, keep, added = parts(value)
    if base is None:
        prefix: Messages = ()
    else:
        cached = cache.get(base)
        prefix = cached if cached is not None else resolve_stored(base, fetch_thread(), cache)
    return [*prefix[:keep], *added]


def resolve_stored(target: str, stored: Mapping[str, Any], cache: MessageCache) -> Messages:
    """The messages of checkpoint `target`, given every stored `messages` value of its thread (by checkpoint id).

    Caches every list it resolves on the way.

    Raises:
        LookupError: a delta names a base checkpoint that is not in `stored`.
    """
    # Walk back to the nearest cached (or first) checkpoint, then rebuild forwards.
    # Iterative, because a long thread is a long chain.
    chain: list[tuple[str, Any]] = []
    current: str | None = target
    prefix: Messages = ()
    while current is not None:
        cached = cache.get(current)
        if cached is not None:
            prefix = cached
            break
        if current not in stored:
            raise LookupError(f"checkpoint {current!r} is referenced by a message delta but is not stored")
        value = stored[current]
        chain.append((current, value))
        current = base_of(value) if is_delta(value) else None
    for checkpoint_id, value in reversed(chain):
        if is_delta(value):
            _, keep, added = parts(value)
            prefix = (*prefix[:keep], *added)
        else:
            # No value, or one that is not a list of messages: no message is shared with it.
            prefix = tuple(value) if is_message_list(value) else ()
        cache.put(checkpoint_id, prefix)
    return prefix
