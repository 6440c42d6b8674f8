"""The web page's test helpers: Debian's Chromium under Playwright, what the page shows, what the API holds.

Shared by tests/web and the bench (`bench.web`). The browser is the system's (`/usr/bin/chromium`, Debian's
package): Playwright never downloads one here (`playwright install` fetches a browser build, which this
project does not do). The flags keep a headless Chromium off the network and quiet as root.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # root, in a container
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

#: The page's messages: id, role, text (its text parts), and "i/n" when the message has alternatives.
PAGE_VIEW_JS = """() => [...document.querySelectorAll('[data-testid=message]')].map(m => ({
  id: m.dataset.messageId,
  role: m.dataset.role,
  text: [...m.querySelectorAll('.text-part')].map(e => e.textContent).join('\\n'),
  count: m.querySelector('[data-testid=branch-count]')?.textContent ?? null,
}))"""


@contextmanager
def launch_chromium() -> Iterator[Any]:
    """A headless Debian Chromium under Playwright; closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def page_view(page: Any) -> list[dict]:
    return page.evaluate(PAGE_VIEW_JS)


def _text(item: dict) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


def api_view(state: dict) -> list[dict]:
    """`get_checkpoint_state`'s messages as the page groups them: each user message, and each answer (its tool
    calls, results and text) as one message named by its first item; an assistant text message right after
    another (a merge's summary after an answer) starts a message of its own."""
    out: list[dict] = []
    previous: dict | None = None
    for item in state["messages"]:
        user = item["type"] == "message" and item.get("role") == "user"
        text = item["type"] == "message" and not user
        after_text = previous is not None and previous["type"] == "message" and previous.get("role") != "user"
        previous = item
        if user or not out or out[-1]["role"] == "user" or (text and after_text):
            out.append({"id": item["id"], "role": "user" if user else "assistant", "texts": [], "count": None})
        if item["type"] == "message":
            out[-1]["texts"].append(_text(item))
        alternatives = item.get("alternatives") or {}
        count = alternatives.get("count", 0)
        out[-1]["count"] = f"{alternatives['index'] + 1}/{count}" if count > 1 else None
    return [{"id": m["id"], "role": m["role"], "text": "\n".join(m["texts"]), "count": m["count"]} for m in out]


def action(http: httpx.Client, name: str, **inputs: Any) -> dict:
    response = http.post("/responses", json={"model": "agent", "input": [], "custom_inputs": {"action": name, **inputs}})
    response.raise_for_status()
    return response.json()["custom_outputs"]


def settled(page: Any, http: httpx.Client, thread: Callable[[], str | None], *, view: bool = False, timeout: float = 15.0) -> Any:
    """Wait until the page is idle and shows what the API holds: its messages, their "i/n" and the checkpoint
    it shows (also in the URL) equal `get_checkpoint_state` at the thread's head. Returns the thread id
    (`view`: the page's messages). Raises AssertionError with both sides when they never agree."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        thread_id = thread()
        if thread_id and page.get_by_test_id("send").is_visible():
            state = action(http, "get_checkpoint_state", thread_id=thread_id)
            shown = page_view(page)
            params = parse_qs(urlparse(page.url).query)
            checkpoint = page.get_by_test_id("shown-checkpoint")
            shown_id = checkpoint.inner_text() if checkpoint.count() else None
            last = (shown, api_view(state), shown_id, state["checkpoint_id"], params)
            if (
                shown == api_view(state)
                and shown_id == state["checkpoint_id"]
                and params.get("thread") == [thread_id]
                and params.get("head") == [state["checkpoint_id"]]
            ):
                return shown if view else thread_id
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed what the API holds: {last}")
        time.sleep(0.1)


def two_hundred_turn_document(turns: int = 200, branches: int = 20) -> tuple[dict, int, int]:
    """A thread document (`export_thread`) of `turns` turns on one branch and `branches` one-turn branches off it,
    evenly spread, written in memory with the offline model (seconds, against minutes of browser turns).
    Returns (document, turns, branches); the head is the main branch's last turn."""
    from agent import create_agent

    with create_agent("memory://", model="offline") as agent:

        def say(text: str, **custom_inputs: Any) -> dict:
            request = {"input": [{"role": "user", "content": text}], "custom_inputs": custom_inputs}
            return agent.predict(request).custom_outputs

        first = say("Turn 0: let's plan a long trip")
        thread_id, checkpoints = first["thread_id"], [first["checkpoint_id"]]
        for i in range(1, turns):
            checkpoints.append(say(f"Turn {i}: another stop", thread_id=thread_id)["checkpoint_id"])
        step = turns // branches
        for b in range(branches):
            say(f"Branch {b}: what if we went elsewhere", thread_id=thread_id, checkpoint_id=checkpoints[b * step + step // 2])
        agent.set_head(thread_id, checkpoints[-1])
        return agent.export_thread(thread_id), turns, branches
