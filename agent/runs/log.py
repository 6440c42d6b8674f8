"""A run's event log: the turn's own events, compact (`encode` / `Replay`), and the stream events made from them.

What is stored is not the stream (`agent.response_events`) but what the stream is made of: the turn's events
(`TurnStarted`, `TextDelta`, `NewMessages`, `TurnResult`), which `StreamEvents` turns into the stream
deterministically. Replaying the log through a fresh `StreamEvents` therefore gives the very events, with
the very `sequence_number`s, that the live stream sent, while the stream's repetitions are not stored: each
message's text is in `output_text.delta`, `output_text.done`, `content_part.done`, `output_item.done` and
again in `response.completed` (five times), but once in the log.

**The bound.** While the turn runs, its rows hold the turn's text once (its streamed text, tool calls and
results) + at most `DELTA_OVERHEAD` bytes per text delta (its length, to split the coalesced text again) + a
few hundred bytes per turn (ids, `custom_outputs` without `state`); a message whose text streamed is stored
without its text (its text part's `text` is null): it is the deltas joined. When the turn ends, its rows are
replaced by one row holding the whole log deflated (`whole`), in the transaction that ends the run, so what
is kept for `response_events_seconds` costs less than the turn's text (English text deflates to about a
third; the delta lengths to almost nothing). `bench.runs` measures both.

Ops, one JSON array each, a row holding the ops written since the last one:
`["s", response_id]`, `["d", item_id, text, [len, ...]]` (consecutive deltas of one message),
`["m", [item, ...]]` (a message item whose text streamed has its text part's `text` null),
`["r", custom_outputs, tail_items, interrupted]`, `["x", output, custom_outputs]` (an idempotent replay),
`["e", code, message]` (the turn failed after it started).

Rows are sealed with the agent's keyring when encryption is on (`agent.encryption`), as checkpoints are.
"""

from __future__ import annotations

import json
import zlib
from types import SimpleNamespace
from typing import Any

from agent.messages import to_output_items
from agent.response_events import StreamEvents, message_text
from agent.turn_events import NewMessages, StoredResponse, TextDelta, TurnResult, TurnStarted

#: Bytes a delta costs beyond its text: its length in the list of lengths (digits and a comma).
DELTA_OVERHEAD = 5
#: The first byte of a row's payload: JSON ops, sealed ops, the whole log deflated, the whole log sealed.
_PLAIN, _SEALED, _WHOLE, _WHOLE_SEALED = b"J", b"E", b"W", b"V"


class Ops:
    """The ops of a run not yet written, with text deltas coalesced; `streamed` remembers each message's text."""

    def __init__(self) -> None:
        self.pending: list[list[Any]] = []
        self.streamed: dict[str, str] = {}

    def add(self, event: Any) -> None:
        """Add the op(s) for one turn event (`state` of a result is left out: `response.completed` of a
        replay does not carry it)."""
        if isinstance(event, TurnStarted):
            self.pending.append(["s", event.response_id])
        elif isinstance(event, TextDelta):
            self.streamed[event.item_id] = self.streamed.get(event.item_id, "") + event.text
            last = self.pending[-1] if self.pending else None
            if last is not None and last[0] == "d" and last[1] == event.item_id:
                last[2] += event.text
                last[3].append(len(event.text))
            else:
                self.pending.append(["d", event.item_id, event.text, [len(event.text)]])
        elif isinstance(event, NewMessages):
            items = []
            for item in to_output_items(event.messages):
                content = item.get("content") if item.get("type") == "message" else None
                if content and len(content) == 1 and message_text(item) == self.streamed.get(item.get("id"), None):
                    item = {**item, "content": [{**content[0], "text": None}]}
                items.append(item)
            self.pending.append(["m", items])
        elif isinstance(event, TurnResult):
            custom = {k: v for k, v in event.as_dict().items() if k != "state"}
            self.pending.append(["r", custom, [i.as_item() for i in event.interrupts], event.status == "interrupted"])
        elif isinstance(event, StoredResponse):
            custom = {k: v for k, v in event.custom_outputs.items() if k != "state"}
            self.pending.append(["x", list(event.output), custom])

    def failed(self, code: str, message: str) -> None:
        self.pending.append(["e", code, message])

    def take(self) -> list[list[Any]]:
        out, self.pending = self.pending, []
        return out


def encode(ops: list[list[Any]], keyring: Any, *, whole: bool = False) -> bytes:
    """A row's payload: `ops` as JSON, sealed when the keyring has a key; `whole` (the log compacted at the
    turn's end): deflated (sealing deflates by itself)."""
    data = json.dumps(ops, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if keyring is not None and keyring.enabled:
        return (_WHOLE_SEALED if whole else _SEALED) + keyring.encrypt(data)
    if whole:
        return _WHOLE + zlib.compress(data, 6)
    return _PLAIN + data


def decode(payload: bytes, keyring: Any) -> tuple[list[list[Any]], bool]:
    """(the ops of a row, whether it is the whole log: `Runs.follow` skips the ops it already had)."""
    kind, body = payload[:1], payload[1:]
    if kind in (_SEALED, _WHOLE_SEALED):
        return json.loads(keyring.decrypt(body, what="A stored response event")), kind == _WHOLE_SEALED
    if kind == _WHOLE:
        return json.loads(zlib.decompress(body)), True
    return json.loads(body), False


class Replay:
    """The stream events (dicts, numbered from 0) of a run's log, fed row by row: OpenAI's whole set, or MLflow's
    for a turn streamed on `/invocations` (its request's `stream_events`), as the turn's own stream sent them."""

    def __init__(self, *, model: str, request: dict[str, Any], background_id: str | None) -> None:
        previous = request.get("previous_response_id")
        envelope = SimpleNamespace(instructions=request.get("instructions"), thread_of_checkpoint=previous is not None,
                                   checkpoint_id=(previous or "").removeprefix("resp_"))  # fmt: skip
        # A turn streamed with MLflow's event set (`/invocations`) is replayed with it, numbered as it was sent,
        # so that `starting_after=N` means the same event to its client as on the first connection.
        lifecycle = request.get("stream_events") != "mlflow"
        self.stream = StreamEvents(SimpleNamespace(envelope=envelope), model=model, lifecycle=lifecycle,  # type: ignore[arg-type]
                                   response_id=background_id)
        self.text: dict[str, str] = {}
        self.ended = False

    @property
    def next_sequence(self) -> int:
        return self.stream.sequence

    def feed(self, ops: list[list[Any]]) -> list[dict[str, Any]]:
        out: list[Any] = []
        for op in ops:
            kind = op[0]
            if kind == "s":
                out += self.stream.numbered(self.stream.started(op[1]))
            elif kind == "d":
                _, item_id, text, lengths = op
                self.text[item_id] = self.text.get(item_id, "") + text
                start = 0
                for length in lengths:
                    out += self.stream.events(TextDelta(item_id, text[start : start + length]))
                    start += length
            elif kind == "m":
                items = [self._whole(item) for item in op[1]]
                out += self.stream.items_done(items)
            elif kind == "r":
                out += self.stream.result_done(op[1], op[2], interrupted=op[3])
                self.ended = True
            elif kind == "x":
                out += self.stream.events(StoredResponse(op[1], op[2]))
                self.ended = True
            elif kind == "e":
                out.append(self.error(op[1], op[2]))
        return [event if isinstance(event, dict) else event.model_dump(exclude_none=True) for event in out]

    def error(self, code: str, message: str) -> dict[str, Any]:
        """OpenAI's error event, as a live stream ends when its turn fails (`serving.agent_server`)."""
        self.ended = True
        error = {"message": message, "type": "server_error" if code in ("lease_expired", "server_shutdown", "server_error") else "invalid_request_error",
                 "code": code, "param": None}  # fmt: skip
        event = {"type": "error", "sequence_number": self.stream.sequence, "code": code, "message": message, "param": None, "error": error}
        self.stream.sequence += 1
        return event

    def _whole(self, item: dict) -> dict:
        content = item.get("content") if item.get("type") == "message" else None
        if content and content[0].get("text", "") is None:
            return {**item, "content": [{**content[0], "text": self.text.get(item["id"], "")}]}
        return item
