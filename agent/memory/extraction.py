"""Extraction on demand: the model reads a branch and proposes memories, new or changed (`extract_memories`).

Why a separate request rather than the memory tools: the tools save what the
model decides mid-turn; extraction distils a whole branch afterwards, as
managed memory services do with a session, and shows its proposals before
anything is written (a dry run). The request is two messages: instructions
(a system message with a known id, `EXTRACTION_REQUEST_ID`, so the offline
model recognises it, as it does summary requests) and one user message with
the memories the agent knew at that checkpoint (`- [memory_id] content`) and
the branch's conversation (`user: …` / `assistant: …` lines). The model
answers JSON: `{"memories": [{"content": "…", "replaces": "<memory_id>" | null}]}`.

The offline model answers it deterministically (`offline_proposals`): each
first-person statement of the user ("I …", "I'm …", "My …") is a fact; a
fact whose first three words are those of a known memory changes that
memory; a later statement on the branch replaces an earlier one with the same
first words; a fact already known word for word is left out.

This module is light (LangChain messages only): the offline model imports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from agent.models.markers import EXTRACTION_REQUEST_ID

#: Characters of the branch's conversation an extraction request carries (the end is kept).
MAX_TRANSCRIPT_CHARS = 24_000
#: Most memories one extraction proposes.
MAX_PROPOSALS = 50

INSTRUCTIONS = (
    "You distil lasting facts about the user from a conversation: preferences, plans, details of their "
    "life, stated by the user. Each fact is one short first-person sentence. A fact that changes one of the "
    "known memories names that memory's id in `replaces`; a fact already known is left out. Answer only JSON: "
    '{"memories": [{"content": "<fact>", "replaces": "<memory_id or null>"}]}'
)
KNOWN_HEADER = "Known memories ([memory_id] content):"
CONVERSATION_HEADER = "Conversation:"

_KNOWN_LINE = re.compile(r"^- \[(?P<memory_id>[^\]\s]+)\] (?P<content>.*)$")
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_FIRST_PERSON = frozenset({"i", "i'm", "im", "i've", "my", "we", "we're", "our"})
_NOT_A_FACT = frozenset({"want", "need", "wonder", "think", "guess", "hope", "wish"})
_INSTEAD = re.compile(r"^(remember (instead )?that|actually,?|correction:)\s+", re.IGNORECASE)


@dataclass(frozen=True)
class Proposed:
    """One fact the model proposed, and the memory it changes (None: a new one)."""

    content: str
    replaces: str | None


def extraction_request(messages: Sequence[BaseMessage], known: Sequence[tuple[str, str]]) -> list[BaseMessage]:
    """The model input that asks for the memories of a branch (`messages`), given the `(memory_id, content)`
    pairs the agent knew there."""
    lines = []
    for message in messages:
        if message.type in ("human", "ai") and message.text.strip():
            who = "user" if message.type == "human" else "assistant"
            lines.append(f"{who}: {' '.join(message.text.split())}")
    transcript = "\n".join(lines)[-MAX_TRANSCRIPT_CHARS:]
    memories = "\n".join(f"- [{memory_id}] {' '.join(content.split())}" for memory_id, content in known)
    body = f"{KNOWN_HEADER}\n{memories}\n\n{CONVERSATION_HEADER}\n{transcript}"
    return [SystemMessage(INSTRUCTIONS, id=EXTRACTION_REQUEST_ID), HumanMessage(body)]


def parse_proposals(text: str, known_ids: Sequence[str]) -> list[Proposed]:
    """The proposals of a model's answer (JSON, possibly in a code fence); a `replaces` that names no known
    memory makes the fact a new one. At most `MAX_PROPOSALS`, each once.

    Raises:
        ValueError: the answer is not the JSON asked for.
    """
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    start, end = body.find("{"), body.rfind("}")
    data = json.loads(body[start : end + 1] if start != -1 else body)
    items = data.get("memories") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("the answer has no list of memories")
    found: dict[str, Proposed] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            continue
        content = " ".join(item["content"].split())
        if not content or not content.isprintable():
            continue
        replaces = item.get("replaces")
        found.setdefault(content, Proposed(content, replaces if isinstance(replaces, str) and replaces in known_ids else None))
    return list(found.values())[:MAX_PROPOSALS]


# -- the offline model's answer ---------------------------------------------------------------------
def read_request(messages: Sequence[BaseMessage]) -> tuple[list[tuple[str, str]], list[str]]:
    """The known memories and the user's lines of an extraction request (`extraction_request`)."""
    body = messages[-1].text if messages else ""
    known_part, _, conversation = body.partition(f"\n\n{CONVERSATION_HEADER}\n")
    known = [(m["memory_id"], m["content"]) for m in map(_KNOWN_LINE.match, known_part.splitlines()[1:]) if m]
    said = [line[len("user: ") :] for line in conversation.splitlines() if line.startswith("user: ")]
    return known, said


def offline_proposals(messages: Sequence[BaseMessage]) -> str:
    """The offline model's JSON answer to an extraction request (see the module docstring)."""
    known, said = read_request(messages)
    by_subject = {_subject(content): memory_id for memory_id, content in known}
    known_texts = {content.lower() for _, content in known}
    facts: dict[str, str] = {}
    for text in said:
        for sentence in _SENTENCE.findall(text):
            sentence = _INSTEAD.sub("", sentence.strip()).strip()
            if sentence.endswith("?") or not _is_fact(sentence):
                continue
            fact = sentence.rstrip(".!").strip()
            subject = _subject(fact)
            facts.pop(subject, None)  # a later statement replaces an earlier one (and moves to the end)
            facts[subject] = fact
    proposals = [
        {"content": fact, "replaces": by_subject.get(subject)}
        for subject, fact in facts.items()
        if fact.lower() not in known_texts
    ]
    return json.dumps({"memories": proposals})


def _is_fact(sentence: str) -> bool:
    words = sentence.lower().split()
    return len(words) >= 2 and words[0] in _FIRST_PERSON and words[1] not in _NOT_A_FACT


def _subject(fact: str) -> str:
    """What a fact is about, for the offline model: its first three words, lower-cased."""
    return " ".join(re.sub(r"[^\w' ]", "", fact.lower()).split()[:3])
