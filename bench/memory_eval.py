"""Memory evaluation: a small deterministic set shaped like LongMemEval, plus branch cases, with the offline model.

Usage::

    python -m bench.memory_eval [--quick] [--json out.json] [--database-url URL]

The public long-memory benchmarks (LongMemEval, LoCoMo) cannot be downloaded
on the machines this project runs on; this set has their shape at a small
size, written here so it is deterministic and needs no network. Each user has
a multi-session history (one thread per session, several user messages per
session). After each session the agent distils memories with
`extract_memories(..., dry_run=False)` (the offline model's deterministic
extraction, `agent.memory.extraction`), so facts stated again later become
new versions that supersede the old ones. Then each question is asked as a
turn would ask it: `Memories.recall` with the question as the turn's new
message and the branch it is asked on as the history (a new thread for the
LongMemEval questions, under `memory_scope="user"`; the named branch for the
branch cases, under `"branch"`).

Question types (LongMemEval's abilities): `extraction` (a fact from one
session), `multi_session` (facts from several sessions), `knowledge_update`
(a fact changed in a later session: the new value is the answer), `temporal`
(which came first: the earliest of the matching memories by checkpoint),
`abstention` (never said: the answer is "I don't know"). Branch cases:
`abandoned_branch` (a fact said only on a branch the user left must not be
recalled under branch scope) and `superseded` (a changed fact: the old value
must not be recalled, let alone preferred).

Scoring. `recall@k`: the share of answerable questions whose evidence (the
memories that hold the answer) are all among the first k recalled. Exact
answer: the offline reader (`answer`) reads the recalled memories that share
a word with the question, best first, and answers from them; the answer is
exact when every expected value is in it (for abstention: when it abstains).
Leaks: a recalled memory from an abandoned branch, or a superseded version.

Figures, on SQLite and on Postgres (the same numbers are expected on both):
recall@1/3/5, exact answers per type and in total, leaks (target 0), and the
share of exact answers (target >= 0.8, a floor against regressions of
retrieval, extraction or the branch rule).
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import report
from bench.databases import scratch_database, server_version

#: Memories a recall returns (the largest k of recall@k).
K = 5
#: Target: the share of questions answered exactly.
MIN_EXACT = 0.8
TYPES = ("extraction", "multi_session", "knowledge_update", "temporal", "abstention", "abandoned_branch", "superseded")
BACKENDS = ("sqlite", "postgres")


@dataclass(frozen=True)
class Question:
    kind: str
    text: str
    expected: tuple[str, ...]
    """Values the answer must hold; () for abstention."""
    evidence: tuple[str, ...] = ()
    """Contents of the memories that hold the answer (recall@k)."""
    must_not_recall: tuple[str, ...] = ()
    """Contents that must not be recalled (an abandoned branch's, a superseded version's)."""
    branch: str | None = None
    """For a branch case: the branch it is asked on; None: a new thread of the user."""


@dataclass(frozen=True)
class History:
    """A user's sessions (each a list of user messages, one thread each) and questions."""

    sessions: tuple[tuple[str, ...], ...]
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class BranchCase:
    """A thread that branches: `trunk` messages, then `branches` (name -> messages) from the trunk's end."""

    trunk: tuple[str, ...]
    branches: dict[str, tuple[str, ...]] = field(default_factory=dict)
    questions: tuple[Question, ...] = ()


HISTORIES = (
    History(
        sessions=(
            ("Hi! My cat is called Miso.", "I work at a bakery in Porto.", "I live in Porto."),
            ("My sister lives in Oslo.", "I visited Rome in March."),
            ("I live in Lisbon now.", "I visited Vienna in July.", "Any museum tips?"),
            ("My favourite colour is blue.",),
            ("My favourite colour is green, honestly.",),
        ),
        questions=(
            Question("extraction", "What is my cat called?", ("Miso",), ("My cat is called Miso",)),
            Question("extraction", "Where do I work?", ("bakery",), ("I work at a bakery in Porto",)),
            Question(
                "multi_session",
                "My sister and my cat: which city, which name?",
                ("Oslo", "Miso"),
                ("My sister lives in Oslo", "My cat is called Miso"),
            ),
            Question("knowledge_update", "Where do I live these days?", ("Lisbon",), ("I live in Lisbon now",), ("I live in Porto",)),
            Question(
                "knowledge_update",
                "What is my favourite colour?",
                ("green",),
                ("My favourite colour is green, honestly",),
                ("My favourite colour is blue",),
            ),
            Question("temporal", "Which city did I visit first, Rome or Vienna?", ("Rome",), ("I visited Rome in March", "I visited Vienna in July")),
            Question("abstention", "What breed is my dog?", ()),
            Question("abstention", "Which car do I drive?", ()),
        ),
    ),
    History(
        sessions=(
            ("I'm training for a marathon in October.", "My coach is Marta."),
            ("I'm allergic to peanuts.", "My brother Teo studies physics."),
            ("My coach is Joana since the summer.", "I read mostly poetry."),
            ("I ran my first half marathon in April.", "I ran a trail race in June."),
        ),
        questions=(
            Question("extraction", "What am I allergic to?", ("peanuts",), ("I'm allergic to peanuts",)),
            Question(
                "multi_session",
                "What does my brother study, and what am I allergic to?",
                ("physics", "peanuts"),
                ("My brother Teo studies physics", "I'm allergic to peanuts"),
            ),
            Question("knowledge_update", "Who is my coach?", ("Joana",), ("My coach is Joana since the summer",), ("My coach is Marta",)),
            Question(
                "temporal",
                "Which race did I run first: the half marathon or the trail race?",
                ("half marathon",),
                ("I ran my first half marathon in April", "I ran a trail race in June"),
            ),
            Question("abstention", "What instrument do I play?", ()),
        ),
    ),
)

BRANCH_CASES = (
    BranchCase(
        trunk=("I'm planning a trip.",),
        branches={"sf": ("I'm headed to SF.",), "new_york": ("I'm headed to New York.",)},
        questions=(
            Question(
                "abandoned_branch",
                "Where am I headed?",
                ("New York",),
                ("I'm headed to New York",),
                ("I'm headed to SF",),
                branch="new_york",
            ),
            Question("abandoned_branch", "Where am I headed?", ("SF",), ("I'm headed to SF",), ("I'm headed to New York",), branch="sf"),
        ),
    ),
    BranchCase(
        trunk=("My seat is 12A.", "My seat is 14C after the upgrade."),
        branches={"main": ("Thanks!",)},
        questions=(
            Question(
                "superseded", "What is my seat?", ("14C",), ("My seat is 14C after the upgrade",), ("My seat is 12A",), branch="main"
            ),
        ),
    ),
)


def answer(question: Question, recalled: Sequence[Any]) -> str:
    """The offline reader: an answer from the recalled memories that share a word with the question, best
    first. Temporal: the earliest of them (by the checkpoint that saved it). None: "I don't know"."""
    from agent.memory.store import keywords

    words = keywords(question.text)
    matching = [m for m in recalled if any(word in m.content.lower() for word in words)]
    if not matching:
        return "I don't know"
    if question.kind == "temporal":
        return min(matching[:2], key=lambda m: m.checkpoint_id).content
    if question.kind == "multi_session":
        return " / ".join(m.content for m in matching[:3])
    return matching[0].content


def is_exact(question: Question, reply: str) -> bool:
    if not question.expected:
        return reply == "I don't know"
    return reply != "I don't know" and all(value.lower() in reply.lower() for value in question.expected)


def evaluate(url: str) -> dict[str, Any]:
    """Build every history and branch case on `url`, ask every question; per-question results."""
    from agent import create_agent

    results: list[dict[str, Any]] = []
    run = uuid.uuid4().hex[:6]
    with create_agent(url, model="offline", tracing=False, memory_scope="user", max_memories_in_context=K) as agent:
        for n, history in enumerate(HISTORIES):
            user = f"eval-{run}-{n}"
            for session in history.sessions:
                thread = None
                for text in session:
                    out = _say(agent, text, user, thread)
                    thread = out["thread_id"]
                agent.extract_memories(thread, user_id=user, dry_run=False)
            for question in history.questions:
                results.append(_ask(agent, user, question, history_messages=()))
    with create_agent(url, model="offline", tracing=False, memory_scope="branch", max_memories_in_context=K) as agent:
        for n, case in enumerate(BRANCH_CASES):
            user = f"eval-{run}-branch-{n}"
            thread, checkpoint = None, None
            for text in case.trunk:
                out = _say(agent, text, user, thread)
                thread, checkpoint = out["thread_id"], out["checkpoint_id"]
                agent.extract_memories(thread, user_id=user, dry_run=False)
            heads = {}
            for name, messages in case.branches.items():
                at = checkpoint
                for text in messages:
                    at = _say(agent, text, user, thread, at)["checkpoint_id"]
                agent.extract_memories(thread, checkpoint_id=at, user_id=user, dry_run=False)
                heads[name] = at
            for question in case.questions:
                state = agent.get_checkpoint_state(thread, heads[question.branch], user_id=user)
                messages = agent.operation_context.storage.get_checkpoint(thread, state["checkpoint_id"])
                history = tuple(messages.checkpoint["channel_values"].get("messages") or ())
                results.append(_ask(agent, user, question, history_messages=history))
    return {"questions": results}


def _say(agent: Any, text: str, user: str, thread: str | None, checkpoint: str | None = None) -> dict[str, Any]:
    custom = {"user_id": user, **({"thread_id": thread} if thread else {}), **({"checkpoint_id": checkpoint} if checkpoint else {})}
    return agent.predict({"input": [{"role": "user", "content": text}], "custom_inputs": custom}).custom_outputs


def _ask(agent: Any, user: str, question: Question, *, history_messages: Sequence[Any]) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    recalled = agent.operation_context.memories.recall(user, [HumanMessage(question.text)], list(history_messages))
    contents = [memory.content for memory in recalled]
    reply = answer(question, recalled)
    return {
        "kind": question.kind,
        "question": question.text,
        "recalled": contents,
        "answer": reply,
        "exact": is_exact(question, reply),
        "recall_at": {k: all(e in contents[:k] for e in question.evidence) for k in (1, 3, 5)} if question.evidence else None,
        "leaks": [c for c in contents if c in question.must_not_recall],
    }


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    answerable = [r for r in results if r["recall_at"] is not None]
    values: dict[str, Any] = {f"recall_at_{k}": sum(r["recall_at"][k] for r in answerable) / len(answerable) for k in (1, 3, 5)}
    for kind in TYPES:
        of_kind = [r for r in results if r["kind"] == kind]
        values[f"exact_{kind}"] = f"{sum(r['exact'] for r in of_kind)}/{len(of_kind)}"
    values["exact_share"] = sum(r["exact"] for r in results) / len(results)
    values["leaks"] = sum(len(r["leaks"]) for r in results)
    return values


def figures() -> dict[str, report.Figure]:
    out: dict[str, report.Figure] = {}
    for backend in BACKENDS:
        for k in (1, 3, 5):
            out[f"{backend}_recall_at_{k}"] = report.Figure(f"recall@{k} ({backend})", fmt=report.fixed(2))
        for kind in TYPES:
            out[f"{backend}_exact_{kind}"] = report.Figure(f"exact answers, {kind.replace('_', ' ')} ({backend})")
        out[f"{backend}_exact_share"] = report.Figure(
            f"exact answers, all questions ({backend})", target=f">= {MIN_EXACT}", check=lambda v: v >= MIN_EXACT, fmt=report.fixed(2)
        )
        out[f"{backend}_leaks"] = report.Figure(
            f"abandoned-branch or superseded memories recalled ({backend})", target="0", check=lambda v: v == 0
        )
    return out


def run(server_url: str, *, quick: bool) -> dict[str, Any]:
    """Evaluate on SQLite and Postgres (the set is small: `quick` changes nothing); the report."""
    values: dict[str, Any] = {}
    measurements: dict[str, Any] = {}
    broken: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in BACKENDS:
            print(f"backend: {backend}", flush=True)
            try:
                if backend == "sqlite":
                    measured = evaluate(f"sqlite:///{Path(tmp) / 'eval.sqlite'}")
                else:
                    with scratch_database(server_url, "tt_memory_eval") as url:
                        measured = evaluate(url)
            except Exception as exc:  # noqa: BLE001 - one broken backend must not hide the other
                import traceback

                traceback.print_exc()
                measurements[backend] = {"error": f"{type(exc).__name__}: {exc}"}
                broken.append(backend)
                continue
            measurements[backend] = measured
            values.update({f"{backend}_{key}": value for key, value in summarize(measured["questions"]).items()})
    version = None
    try:
        version = server_version(server_url)
    except psycopg.Error:
        pass
    questions = sum(len(h.questions) for h in HISTORIES) + sum(len(c.questions) for c in BRANCH_CASES)
    return report.build_report(
        figures(),
        values,
        **report.environment(version),
        sizes={"users": len(HISTORIES) + len(BRANCH_CASES), "questions": questions, "k": K},
        measurements=measurements,
        broken_configurations=broken,
    )


def print_result(result: dict[str, Any]) -> None:
    report.print_report("Long-term memory: a LongMemEval-shaped set and branch cases (offline model)", result)


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help="the same small set (it is small already)")


if __name__ == "__main__":
    sys.exit(main())
