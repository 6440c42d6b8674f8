"""The web page at `/` in a real headless Chromium (Debian's, driven by Playwright), against `tt-agent serve`
on Postgres as a real process, with the OpenAI-compatible stub streaming slowly as its model.

Every flow is checked against the API: after a turn, an edit, a regeneration, a switch and a reload, the
page's messages (ids, roles, texts), their "i/n" and the checkpoint it shows equal `get_checkpoint_state`.
The server trusts `X-Forwarded-User` (`user_id_header`), as behind a proxy; each browser context sends
its own user's header, as the proxy would. It serves examples/approval_agent.py (the built-in agent's
operations, and a tool that asks for approval with `interrupt()`), so the interrupt card is tested too.

One server for the module (tests/helpers/scheduling.py groups it). A missing browser fails, never skips:
`.ci/run` installs Debian's `chromium`. Screenshots go to a temporary directory, or to the directory named
by `TT_WEB_SCREENSHOTS` (`TT_WEB_SCREENSHOTS=docs/images scripts/test.sh tests/web -n 0` refreshes the
documentation's pictures).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from playwright.sync_api import expect

from tests.helpers.databases import fresh_database
from tests.helpers.openai_stub import configure_stub, openai_stub_server
from tests.helpers.servers import REPO_ROOT, free_port, server_process
from tests.helpers.web import CHROMIUM, launch_chromium, settled, two_hundred_turn_document

# About a minute of one worker (its tests share the module's server): scheduled among the first units.
pytestmark = pytest.mark.longest

HEADER = "X-Forwarded-User"


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    target = os.environ.get("TT_WEB_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def server(pg_server_url, tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)", pytrace=False)
    cwd = tmp_path_factory.mktemp("web")
    with fresh_database(pg_server_url, "tt_web") as db_url, openai_stub_server(latency_s=0.3, chunks=4) as model_url:
        port = free_port()
        env = {
            "AGENT_DATABASE_URL": db_url,
            "AGENT_MODEL": "fake",
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "unused",
            "AGENT_TRACING": "false",
            "AGENT_USER_ID_HEADER": HEADER,
        }
        command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--agent", str(REPO_ROOT / "examples" / "approval_agent.py")]  # fmt: skip
        with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
            with launch_chromium() as browser:
                yield SimpleNamespace(base_url=base_url, model_url=model_url, browser=browser, db_url=db_url)


def api(server, user: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={HEADER: user}, timeout=60)


def act(http: httpx.Client, action: str, **inputs) -> dict:
    response = http.post("/responses", json={"model": "agent", "input": [], "custom_inputs": {"action": action, **inputs}})
    assert response.status_code == 200, response.text
    return response.json()["custom_outputs"]


def new_page(server, user: str):
    context = server.browser.new_context(viewport={"width": 1400, "height": 860}, extra_http_headers={HEADER: user})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors
    return page


def send(page, text: str) -> None:
    page.get_by_test_id("composer-input").fill(text)
    page.get_by_test_id("send").click()


def thread_of(page) -> str:
    return page.evaluate("new URLSearchParams(location.search).get('thread')")


def test_the_page_streams_a_turn_and_shows_what_the_api_holds(server, shots):
    page = new_page(server, "alice")
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("identity")).to_contain_text("Signed in as alice")
    configure_stub(server.model_url, latency_s=2.0, chunks=8)
    send(page, "I'm planning a trip!")
    # Streaming: part of the answer is on the page before the turn ends, with the stop button.
    page.locator('[data-message-id="pending-answer"]', has_text="[fake openai]").wait_for(timeout=10_000)
    assert page.get_by_test_id("stop").is_visible()
    page.get_by_test_id("send").wait_for(timeout=10_000)
    configure_stub(server.model_url, latency_s=0.3, chunks=4)
    with api(server, "alice") as http:
        thread_id = settled(page, http, lambda: thread_of(page))
        # A tool that asks first: the question shows as a card, and answering it resumes the turn.
        send(page, 'use book_trip {"destination": "Tokyo"}')
        card = page.get_by_test_id("interrupt")
        expect(card).to_contain_text("Book a trip to Tokyo?", timeout=10_000)
        assert act(http, "get_checkpoint_state", thread_id=thread_id)["interrupts"][0]["value"]["destination"] == "Tokyo"
        page.screenshot(path=str(shots / "web-interrupt.png"))
        # Sending instead asks first: nothing is sent, the question and the typed text stay.
        before = act(http, "get_head", thread_id=thread_id)["checkpoint_id"]
        send(page, "Never mind")
        expect(page.get_by_test_id("drop-question")).to_contain_text("drops the question")
        expect(page.get_by_test_id("composer-input")).to_have_value("Never mind")
        assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] == before
        expect(card).to_be_visible()
        page.get_by_role("button", name="Keep the question").click()
        expect(page.get_by_test_id("drop-question")).to_have_count(0)
        page.get_by_test_id("composer-input").fill("")
        card.get_by_placeholder("Your answer").fill("yes")
        card.get_by_role("button", name="Answer").click()
        settled(page, http, lambda: thread_id)
        assert page.get_by_test_id("interrupt").count() == 0
        assert "book_trip" in page.get_by_test_id("tool-call").first.inner_text()  # the tool call, on one line
        assert "Booked" in page.get_by_test_id("tool-call").first.inner_text()
        page.get_by_test_id("model-saw-toggle").last.click()
        saw = page.get_by_test_id("model-saw").inner_text()
        state = act(http, "get_checkpoint_state", thread_id=thread_id)
        assert f"{state['model_input_messages']} ({state['model_input_tokens']} tokens counted)" in saw
        assert f"{state['usage']['input_tokens']} / {state['usage']['output_tokens']}" in saw
        page.screenshot(path=str(shots / "web-chat.png"))
        # The thread is in the sidebar, titled, and a reload shows the same thread and head.
        assert page.get_by_test_id("thread-row").filter(has_text="I'm planning a trip!").count() == 1
        page.reload()
        settled(page, http, lambda: thread_id)
    assert page.errors == []


def test_stop_cancels_the_turn_and_nothing_is_written(server):
    page = new_page(server, "alice")
    page.goto(server.base_url + "/")
    with api(server, "alice") as http:
        send(page, "A first message")
        thread_id = settled(page, http, lambda: thread_of(page))
        before = act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]
        configure_stub(server.model_url, latency_s=2.0, chunks=8)
        try:
            started = time.monotonic()
            send(page, "Stop me")
            page.locator('[data-message-id="pending-answer"]', has_text="[fake openai]").wait_for(timeout=10_000)
            page.get_by_test_id("stop").click()
            assert "nothing was saved" in page.get_by_test_id("notice").inner_text(timeout=10_000)
            time.sleep(max(0.0, 2.5 - (time.monotonic() - started)))  # past the moment the reply would have ended
        finally:
            configure_stub(server.model_url, latency_s=0.3, chunks=4)
        after = act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]
        assert after == before
        settled(page, http, lambda: thread_id)  # the page is back to what was saved


def test_edit_save_only_regenerate_switch_and_reload_match_the_api(server, shots):
    page = new_page(server, "alice")
    page.goto(server.base_url + "/")
    with api(server, "alice") as http:
        send(page, "I'm headed to SF!")
        thread_id = settled(page, http, lambda: thread_of(page))
        send(page, "What should I pack?")
        settled(page, http, lambda: thread_id)

        # Edit the first message, "save and regenerate": a sibling branch, the model runs again.
        page.get_by_test_id("edit").first.click()
        page.get_by_test_id("edit-input").fill("I'm headed to New York!")
        page.get_by_test_id("save-regenerate").click()
        view = settled(page, http, lambda: thread_id, view=True)
        assert view[0]["count"] == "2/2" and view[1]["count"] is None  # two versions of it, one answer each
        assert "New York" in view[1]["text"]

        # Regenerate that answer: its switcher shows 2/2, the user message keeps its versions.
        page.get_by_test_id("regenerate").first.click()
        view = settled(page, http, lambda: thread_id, view=True)
        assert view[0]["count"] == "2/2" and view[1]["count"] == "2/2"
        page.screenshot(path=str(shots / "web-branches.png"))

        # "< 1/2 >" on the user message: back to the original branch, nothing written but the head.
        checkpoints = len(act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"])
        page.get_by_test_id("message").first.get_by_role("button", name="Previous version").click()
        page.wait_for_function("document.querySelector('[data-testid=message] [data-testid=branch-count]')?.innerText === '1/2'")
        view = settled(page, http, lambda: thread_id, view=True)
        assert [m["text"] for m in view if m["role"] == "user"] == ["I'm headed to SF!", "What should I pack?"]
        assert len(act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]) == checkpoints
        assert "2 branches leave this path" in page.get_by_test_id("branches-off-path").inner_text()

        # (the edit and its regeneration are the two leaves off it)
        # A reload (the URL names the thread and the head) shows the same thing.
        page.reload()
        assert settled(page, http, lambda: thread_id, view=True) == view

        # "Save only": the message replaced in place by update_checkpoint_state, no model run.
        page.get_by_test_id("edit").last.click()
        page.get_by_test_id("edit-input").fill("What should I pack for rain?")
        page.get_by_test_id("save-only").click()
        page.locator(".text-part", has_text="What should I pack for rain?").wait_for(timeout=10_000)
        view = settled(page, http, lambda: thread_id, view=True)
        assert view[-2]["text"] == "What should I pack for rain?"
        state = act(http, "get_checkpoint_state", thread_id=thread_id)
        assert state["source"] == "update"

        # The tree: every checkpoint drawn, the head marked; a click on a node moves the head there.
        history = act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]
        assert page.get_by_test_id("tree-node").count() == len(history)
        head = page.locator('[data-testid=tree-node][data-head="true"]')
        assert head.get_attribute("data-checkpoint-id") == state["checkpoint_id"]
        root = next(e for e in history if e["source"] == "root")
        first_turn = next(e for e in history if e["parent_checkpoint_id"] == root["checkpoint_id"])
        page.locator(f'[data-testid=tree-node][data-checkpoint-id="{first_turn["checkpoint_id"]}"]').click()
        page.wait_for_function(f"location.search.includes('{first_turn['checkpoint_id']}')")
        settled(page, http, lambda: thread_id)
        assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] == first_turn["checkpoint_id"]

        # Two clicks in compare mode: the common ancestor and what differs.
        leaves = [e for e in history if not any(o["parent_checkpoint_id"] == e["checkpoint_id"] for o in history)]
        page.get_by_test_id("compare-mode").check()
        for leaf in leaves[:2]:
            page.locator(f'[data-testid=tree-node][data-checkpoint-id="{leaf["checkpoint_id"]}"]').click()
        diff = act(http, "compare_checkpoints", thread_id=thread_id,
                   checkpoint_a=leaves[0]["checkpoint_id"], checkpoint_b=leaves[1]["checkpoint_id"])  # fmt: skip
        shown = page.get_by_test_id("diff").inner_text(timeout=10_000)
        assert diff["common_ancestor_checkpoint_id"][-8:] in shown
    assert page.errors == []


def test_threads_rename_fork_and_delete_from_the_sidebar(server):
    page = new_page(server, "carol")
    page.goto(server.base_url + "/")
    with api(server, "carol") as http:
        send(page, "Plan a picnic")
        thread_id = settled(page, http, lambda: thread_of(page))
        row = page.locator(f'[data-testid=thread-row][data-thread-id="{thread_id}"]')
        row.get_by_role("button", name="Rename").click()
        row.get_by_label("New title").fill("Picnic")
        row.get_by_role("button", name="Save").click()
        row.get_by_text("Picnic").wait_for()
        assert act(http, "get_thread", thread_id=thread_id)["thread"]["title"] == "Picnic"
        page.get_by_test_id("thread-search").fill("picn")
        assert page.get_by_test_id("thread-row").count() == 1
        page.get_by_test_id("thread-search").fill("")

        row.get_by_role("button", name="Fork").click()
        page.wait_for_function(f"!location.search.includes('{thread_id}') && location.search.includes('thread=')")
        fork_id = settled(page, http, lambda: thread_of(page))
        assert act(http, "get_thread", thread_id=fork_id)["thread"]["forked_from"]["thread_id"] == thread_id
        # The sidebar is the catalogue, in its order (newest activity first).
        rows = page.get_by_test_id("thread-row")
        expect(rows).to_have_count(2)
        listed = [t["thread_id"] for t in act(http, "list_threads", limit=100)["threads"]]
        assert [rows.nth(i).get_attribute("data-thread-id") for i in range(2)] == listed

        row.get_by_role("button", name="Delete").click()
        row.get_by_role("button", name="Yes, delete").click()
        row.wait_for(state="detached")
        assert thread_id not in [t["thread_id"] for t in act(http, "list_threads", limit=100)["threads"]]


def test_two_users_never_see_each_others_threads(server):
    alice, bob = new_page(server, "alice-2"), new_page(server, "bob")
    alice.goto(server.base_url + "/")
    with api(server, "alice-2") as http:
        send(alice, "Alice's secret plan")
        thread_id = settled(alice, http, lambda: thread_of(alice))
    bob.goto(server.base_url + "/")
    expect(bob.get_by_test_id("identity")).to_contain_text("Signed in as bob")
    bob.get_by_test_id("new-chat").wait_for()
    assert bob.get_by_test_id("thread-row").count() == 0
    bob.goto(f"{server.base_url}/?thread={thread_id}")
    assert "not found" in bob.get_by_test_id("error").inner_text(timeout=10_000).lower()
    assert bob.get_by_test_id("message").count() == 0
    assert "Alice's secret plan" not in bob.content()
    with api(server, "bob") as http:
        assert act(http, "list_threads", limit=100)["threads"] == []


def test_a_200_turn_thread_with_20_branches_opens_with_its_tree(server, shots):
    document, turns, branches = two_hundred_turn_document()
    with api(server, "dave") as http:
        thread_id = act(http, "import_thread", document=document)["thread"]["thread_id"]
        history = act(http, "get_checkpoint_history", thread_id=thread_id, limit=1000)["history"]
        assert len(history) == 1 + turns + branches  # the root, every turn, every branch
        page = new_page(server, "dave")
        page.goto(f"{server.base_url}/?thread={thread_id}")
        page.get_by_test_id("tree-node").nth(len(history) - 1).wait_for(timeout=30_000)
        assert page.get_by_test_id("tree-node").count() == len(history)
        settled(page, http, lambda: thread_id)
        assert f"{branches} branches leave this path" in page.get_by_test_id("branches-off-path").inner_text()
        page.screenshot(path=str(shots / "web-tree.png"))
    assert page.errors == []
    assert CHROMIUM  # the browser the run used


def test_the_documentation_site_draws_its_mermaid_diagram_without_a_network(server, tmp_path):
    import subprocess
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from tests.helpers.servers import REPO_ROOT

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(site)], cwd=REPO_ROOT, check=True,
                   capture_output=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)  # fmt: skip
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        origin = f"http://127.0.0.1:{httpd.server_address[1]}"
        page = server.browser.new_page()
        elsewhere: list[str] = []
        page.on("request", lambda request: None if request.url.startswith(origin) else elsewhere.append(request.url))
        page.goto(f"{origin}/concepts/")
        # Material draws the diagram into a closed shadow root of `div.mermaid`; undrawn, it stays `pre.mermaid` text.
        page.locator("div.mermaid").first.wait_for(timeout=15_000)
        assert page.locator("pre.mermaid").count() == 0
        assert page.locator("div.mermaid").first.bounding_box()["height"] > 100
        assert elsewhere == []
    finally:
        httpd.shutdown()


def test_a_busy_thread_is_an_error_in_words_and_the_page_keeps_what_was_saved(server):
    import threading

    page = new_page(server, "erin")
    page.goto(server.base_url + "/")
    with api(server, "erin") as http:
        send(page, "Hello")
        thread_id = settled(page, http, lambda: thread_of(page))
        configure_stub(server.model_url, latency_s=2.0, chunks=4)
        try:
            body = {"model": "agent", "input": "Another tab's turn", "custom_inputs": {"thread_id": thread_id}}
            other = threading.Thread(target=lambda: http.post("/responses", json=body))
            other.start()
            time.sleep(0.5)  # the other turn holds the thread
            send(page, "Mine")
            expect(page.get_by_test_id("error")).to_contain_text("busy", timeout=10_000)
            expect(page.get_by_test_id("composer-input")).to_have_value("Mine")  # not to be retyped
            other.join()
            # After the refusal the page reads the head again: the other tab's turn shows, nothing is lost.
            settled(page, http, lambda: thread_id)
            assert page.get_by_test_id("message").count() == 4
            # A double click on Regenerate while the model takes 2 s: one regeneration, and the page follows it.
            page.get_by_test_id("composer-input").fill("")
            before = act(http, "get_head", thread_id=thread_id)["checkpoint_id"]
            # Two clicks in one task, before React draws the first (Playwright's dblclick lets it draw in between).
            page.evaluate("() => { const b = [...document.querySelectorAll('[data-testid=regenerate]')].at(-1); b.click(); b.click(); }")
            page.locator('[data-message-id="pending-answer"]').wait_for(timeout=10_000)
            page.get_by_test_id("send").wait_for(timeout=15_000)
        finally:
            configure_stub(server.model_url, latency_s=0.3, chunks=4)
        view = settled(page, http, lambda: thread_id, view=True)
        assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] != before
        assert view[-1]["count"] == "2/2"
        assert page.get_by_test_id("error").count() == 0


def test_the_memory_panel_lists_the_users_memories_and_deletes_one(server):
    from agent import create_agent

    with create_agent(server.db_url, model="offline", tracing=False) as agent:  # the offline model saves it
        agent.predict({"input": [{"role": "user", "content": "remember that I am vegetarian"}],
                       "custom_inputs": {"user_id": "frank"}})  # fmt: skip
    page = new_page(server, "frank")
    page.goto(server.base_url + "/")
    with api(server, "frank") as http:
        [memory] = act(http, "list_memories")["memories"]
        page.get_by_test_id("load-memories").click()
        row = page.get_by_test_id("memory")
        expect(row).to_have_count(1)
        assert memory["content"] in row.inner_text()
        other = new_page(server, "grace")  # another user's panel never shows frank's
        other.goto(server.base_url + "/")
        other.get_by_test_id("load-memories").click()
        expect(other.get_by_text("No memories.")).to_be_visible()
        row.get_by_role("button", name="Delete").click()
        expect(row).to_have_count(0)
        assert act(http, "list_memories")["memories"] == []


def test_a_link_to_an_earlier_checkpoint_shows_it_and_a_message_sent_there_branches_from_it(server):
    from tests.helpers.web import api_view, page_view

    page = new_page(server, "heidi")
    page.goto(server.base_url + "/")
    with api(server, "heidi") as http:
        send(page, "First")
        thread_id = settled(page, http, lambda: thread_of(page))
        send(page, "Second")
        settled(page, http, lambda: thread_id)
        first = act(http, "get_checkpoint_state", thread_id=thread_id)["messages"][0]["checkpoint_id"]
        page.goto(f"{server.base_url}/?thread={thread_id}&head={first}")  # a shared link: nothing is written
        expect(page.get_by_test_id("shown-checkpoint")).to_have_text(first)
        expect(page.get_by_role("button", name="Make this the head")).to_be_visible()
        assert page_view(page) == api_view(act(http, "get_checkpoint_state", thread_id=thread_id, checkpoint_id=first))
        assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] != first
        send(page, "Instead")
        settled(page, http, lambda: thread_id)
        assert act(http, "get_checkpoint_state", thread_id=thread_id)["parent_checkpoint_id"] == first
        # A link whose head= the thread does not hold: the error, and a button to the thread's real head.
        page.goto(f"{server.base_url}/?thread={thread_id}&head=1f0-no-such-checkpoint")
        expect(page.get_by_test_id("error")).to_be_visible()
        page.get_by_test_id("open-real-head").click()
        settled(page, http, lambda: thread_id)
        expect(page.get_by_test_id("error")).to_have_count(0)


def test_what_the_model_saw_shows_the_summarys_text_and_the_recalled_memories(server):
    from agent import create_agent

    # A thread made by the offline model with a small window: a memory saved, then recalled on every
    # turn, and the oldest turns folded into a summary (tests/operations/test_what_the_model_saw.py).
    with create_agent(server.db_url, model="offline", tracing=False, context_strategy="summarize",
                      max_context_tokens=1200) as agent:  # fmt: skip
        thread_id = agent.predict({"input": [{"role": "user", "content": "remember that I am vegetarian"}],
                                   "custom_inputs": {"user_id": "ivan"}}).custom_outputs["thread_id"]  # fmt: skip
        for n in range(6):
            agent.predict({"input": [{"role": "user", "content": f"message number {n} " + "word " * 40}],
                           "custom_inputs": {"user_id": "ivan", "thread_id": thread_id}})  # fmt: skip
    page = new_page(server, "ivan")
    page.goto(f"{server.base_url}/?thread={thread_id}")
    with api(server, "ivan") as http:
        state = act(http, "get_checkpoint_state", thread_id=thread_id)
        [memory] = act(http, "list_memories")["memories"]
        assert state["summary_used"] and state["recalled_memories"] == [memory["memory_id"]]
        page.get_by_test_id("model-saw-toggle").last.click()
        expect(page.get_by_test_id("model-saw-summary")).to_have_text(state["context_summary"])
        recalled = page.get_by_test_id("model-saw-memories").locator("li")
        expect(recalled).to_have_text([memory["content"]])
        assert recalled.get_attribute("data-memory-id") == memory["memory_id"]
        # The first answer: no summary, and nothing recalled (the memory was saved by that turn).
        page.get_by_test_id("model-saw-toggle").first.click()
        first = page.get_by_test_id("model-saw").first
        expect(first.get_by_test_id("model-saw-summary")).to_have_text("no")
        expect(first).to_contain_text("Memories recalled")
        assert first.get_by_test_id("model-saw-memories").count() == 0
    assert page.errors == []


def test_the_title_search_asks_the_server_and_finds_threads_older_than_the_100_listed(server):
    from agent import create_agent

    # 101 threads written at once (equal activity: listed by thread_id, descending): "a-…" comes last.
    def insert(tx):
        for n in range(100):
            tx.insert_thread(f"t-judy-{n:03}", user_id="judy", head_checkpoint_id="none", message_count=0,
                             title=f"Hay {n}", metadata={}, forked_from=None)  # fmt: skip
        tx.insert_thread("a-judy-needle", user_id="judy", head_checkpoint_id="none", message_count=0,
                         title="A needle in the haystack", metadata={}, forked_from=None)  # fmt: skip

    with create_agent(server.db_url, model="offline", tracing=False) as agent:
        agent.storage.transaction(insert)
    page = new_page(server, "judy")
    page.goto(server.base_url + "/")
    rows = page.get_by_test_id("thread-row")
    expect(rows).to_have_count(100)
    assert rows.filter(has_text="needle").count() == 0  # not among the 100 the sidebar lists
    page.get_by_test_id("thread-search").fill("NEEDLE")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-thread-id", "a-judy-needle")
    page.get_by_test_id("thread-search").fill("")
    expect(rows).to_have_count(100)
    assert page.errors == []


def test_without_a_user_header_the_page_says_it_acts_as_one_local_user(server, tmp_path):
    from agent import create_agent
    from agent.serving.agent_server import build_app
    from tests.helpers.servers import in_process_server

    with create_agent(f"sqlite:///{tmp_path / 'local.sqlite'}", model="offline", tracing=False) as agent:
        with in_process_server(build_app(agent)) as url:
            agent.predict({"input": [{"role": "user", "content": "A laptop's thread"}]})
            page = server.browser.new_page()
            page.goto(url + "/")
            expect(page.get_by_test_id("identity")).to_have_text("One local user (no user header is configured)")
            expect(page.get_by_test_id("thread-row")).to_have_text(re.compile("A laptop's thread"))
            page.close()


# -- living with many branches (issue 23): branch records, merge, search, memory as of a checkpoint -----------
def say(http: httpx.Client, text: str, **custom_inputs) -> dict:
    """One turn over HTTP (not through the page): its `custom_outputs`."""
    response = http.post("/responses", json={"model": "agent", "input": [{"role": "user", "content": text}],
                                             "custom_inputs": custom_inputs})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()["custom_outputs"]


def branch_rows(page) -> list[dict]:
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid=branch-row]')].map(r => ({
        checkpoint_id: r.dataset.checkpointId, pinned: r.dataset.pinned === 'true', archived: r.dataset.archived === 'true',
        label: r.querySelector('[data-testid=branch-label]').textContent || null}))""")


def api_rows(http: httpx.Client, thread_id: str, include_archived: bool = False) -> list[dict]:
    branches = act(http, "list_branches", thread_id=thread_id, include_archived=include_archived)["branches"]
    return [{key: b[key] for key in ("checkpoint_id", "pinned", "archived", "label")} for b in branches]


def rows_match(page, http: httpx.Client, thread_id: str, include_archived: bool = False) -> list[dict]:
    """Wait until the page's branch list equals `list_branches` (order too); returns it."""
    deadline = time.monotonic() + 10
    while True:
        want, got = api_rows(http, thread_id, include_archived), branch_rows(page)
        if want == got:
            return got
        assert time.monotonic() < deadline, (got, want)
        time.sleep(0.1)


def row(page, checkpoint_id: str):
    return page.locator(f'[data-testid=branch-row][data-checkpoint-id="{checkpoint_id}"]')


def test_branches_are_labelled_pinned_archived_merged_and_deleted_from_the_page(server, shots):
    from tests.helpers.web import api_view, page_view

    with api(server, "lena") as http:
        first = say(http, "I'm planning a trip!")
        thread_id = first["thread_id"]
        sf = say(http, "I'm headed to SF!", thread_id=thread_id)["checkpoint_id"]
        ny = say(http, "I'm headed to New York!", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])["checkpoint_id"]
        page = new_page(server, "lena")
        page.goto(f"{server.base_url}/?thread={thread_id}")
        settled(page, http, lambda: thread_id)
        assert [r["checkpoint_id"] for r in rows_match(page, http, thread_id)] == [ny, sf]
        # Label and pin the SF branch: the pinned branch is listed first, marked.
        row(page, sf).get_by_role("button", name="Label").click()
        row(page, sf).get_by_label("Branch label").fill("SF plan")
        row(page, sf).get_by_role("button", name="Save label").click()
        expect(row(page, sf).get_by_test_id("branch-label")).to_have_text("SF plan")
        row(page, sf).get_by_role("button", name="Pin").click()
        expect(row(page, sf).get_by_test_id("branch-pinned")).to_be_visible()
        rows = rows_match(page, http, thread_id)
        assert rows[0] == {"checkpoint_id": sf, "pinned": True, "archived": False, "label": "SF plan"}
        page.reload()  # the tree marks the pinned checkpoint (its history entry says so)
        expect(page.locator(f'[data-testid=tree-node][data-checkpoint-id="{sf}"]')).to_contain_text("★")
        # Merge the SF branch's messages into the head (New York): the chosen messages, with the provenance.
        row(page, sf).get_by_role("button", name="Merge into shown").click()
        page.get_by_test_id("merge-mode-messages").check()
        only = act(http, "compare_checkpoints", thread_id=thread_id, checkpoint_a=sf, checkpoint_b=ny)["only_a"]
        expect(page.get_by_test_id("merge-message")).to_have_count(len(only))
        page.get_by_test_id("merge-message").last.uncheck()  # the SF answer stays out
        page.get_by_test_id("merge-confirm").click()
        expect(page.get_by_test_id("merged-from-checkpoint")).to_have_text(sf)
        settled(page, http, lambda: thread_id)
        state = act(http, "get_checkpoint_state", thread_id=thread_id)
        assert state["parent_checkpoint_id"] == ny
        assert state["merged_from"]["checkpoint_id"] == sf and state["merged_from"]["mode"] == "messages"
        assert state["merged_from"]["message_ids"] == [only[0]["id"]]
        assert page_view(page) == api_view(state)
        assert "⇐" in page.locator(f'[data-testid=tree-node][data-checkpoint-id="{state["checkpoint_id"]}"]').text_content()
        # A turn, so that the head ends with an answer; then merge it again, as the model's summary (the default mode).
        send(page, "And then?")
        settled(page, http, lambda: thread_id)
        state = act(http, "get_checkpoint_state", thread_id=thread_id)
        row(page, sf).get_by_role("button", name="Merge into shown").click()
        page.get_by_test_id("merge-confirm").click()
        expect(page.get_by_test_id("merged-from")).to_contain_text("a summary of")
        settled(page, http, lambda: thread_id)
        summary = act(http, "get_checkpoint_state", thread_id=thread_id)
        assert summary["parent_checkpoint_id"] == state["checkpoint_id"] and summary["merged_from"]["mode"] == "summary"
        assert page_view(page) == api_view(summary)
        # The summary is a bubble of its own after the answer it follows, which keeps its "What the model saw".
        shown = page_view(page)
        assert [m["role"] for m in shown[-2:]] == ["assistant", "assistant"]
        assert shown[-1]["id"] == summary["messages"][-1]["id"]
        answer = page.locator(f'[data-testid=message][data-message-id="{shown[-2]["id"]}"]')
        expect(answer.get_by_test_id("model-saw-toggle")).to_have_count(1)
        state = summary
        page.screenshot(path=str(shots / "web-branch-actions.png"))
        # Archive hides the SF branch unless "show archived"; unarchive shows it again.
        row(page, sf).get_by_role("button", name="Archive").click()
        expect(row(page, sf)).to_have_count(0)
        assert len(rows_match(page, http, thread_id)) == 1
        page.get_by_test_id("show-archived").check()
        assert {"checkpoint_id": sf, "pinned": True, "archived": True, "label": "SF plan"} in rows_match(page, http, thread_id, True)
        row(page, sf).get_by_role("button", name="Unarchive").click()
        expect(row(page, sf)).to_have_attribute("data-archived", "false")
        page.get_by_test_id("show-archived").uncheck()
        assert len(rows_match(page, http, thread_id)) == 2
        # Deleting the head's branch is refused in words, and nothing is deleted.
        before = act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]
        head_row = row(page, state["checkpoint_id"])
        head_row.get_by_role("button", name="Delete").click()
        head_row.get_by_role("button", name="Yes, delete").click()
        expect(page.get_by_test_id("branch-error")).to_contain_text("holds the head")
        assert act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"] == before
        # Deleting the SF branch removes its checkpoint, from the list, the tree and the API.
        row(page, sf).get_by_role("button", name="Delete").click()
        row(page, sf).get_by_role("button", name="Yes, delete").click()
        expect(row(page, sf)).to_have_count(0)
        assert [r["checkpoint_id"] for r in rows_match(page, http, thread_id)] == [state["checkpoint_id"]]
        after = act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]
        assert sf not in {e["checkpoint_id"] for e in after} and len(after) == len(before) - 1
        expect(page.get_by_test_id("tree-node")).to_have_count(len(after))
    assert page.errors == []



def test_a_merge_streams_its_summary_into_the_chat_as_a_turn_streams_its_answer(server):
    from tests.helpers.web import api_view, page_view

    with api(server, "mira") as http:
        first = say(http, "I'm planning a trip!")
        thread_id = first["thread_id"]
        sf = say(http, "I'm headed to SF!", thread_id=thread_id)["checkpoint_id"]
        ny = say(http, "I'm headed to New York!", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])["checkpoint_id"]
        page = new_page(server, "mira")
        page.goto(f"{server.base_url}/?thread={thread_id}")
        settled(page, http, lambda: thread_id)
        configure_stub(server.model_url, latency_s=2.0, chunks=8)
        try:
            row(page, sf).get_by_role("button", name="Merge into shown").click()
            page.get_by_test_id("merge-confirm").click()
            # The model's words are on the page while it still writes them, before anything is saved.
            pending = page.locator('[data-message-id="pending-answer"]', has_text="[fake openai]")
            pending.wait_for(timeout=10_000)
            assert "Summary of another branch" in pending.inner_text()
            assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] == ny
            # Stop cancels it as it cancels a turn: nothing saved. Then the merge again, to its end.
            page.get_by_test_id("stop").click()
            assert "nothing was saved" in page.get_by_test_id("notice").inner_text(timeout=10_000)
            settled(page, http, lambda: thread_id)
            assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] == ny
            page.get_by_test_id("merge-confirm").click()
            pending.wait_for(timeout=10_000)
        finally:
            configure_stub(server.model_url, latency_s=0.3, chunks=4)
        expect(page.get_by_test_id("merged-from")).to_contain_text("a summary of", timeout=15_000)
        settled(page, http, lambda: thread_id)
        state = act(http, "get_checkpoint_state", thread_id=thread_id)
        assert state["parent_checkpoint_id"] == ny and state["merged_from"]["checkpoint_id"] == sf
        assert page_view(page) == api_view(state)
    assert page.errors == []


def test_search_all_branches_opens_the_thread_at_the_hits_checkpoint(server):
    from tests.helpers.web import api_view, page_view

    with api(server, "mallory") as http:
        first = say(http, "Where should we travel?")
        thread_id = first["thread_id"]
        say(http, "By train to Lyon", thread_id=thread_id)
        ferry = say(http, "By ferry to Corsica", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
        say(http, "Something else entirely", thread_id=thread_id)
        say(http, "Another ferry question")  # a second thread
        page = new_page(server, "mallory")
        page.goto(server.base_url + "/")
        page.get_by_test_id("search-all-input").fill("ferry corsica")
        page.get_by_test_id("search-all-go").click()
        hits = act(http, "search_threads", query="ferry corsica", limit=20)["hits"]
        assert hits and {h["thread_id"] for h in hits} == {thread_id}
        shown = page.get_by_test_id("search-hit")
        expect(shown).to_have_count(len(hits))
        titles = {t["thread_id"]: t["title"] for t in act(http, "list_threads", limit=100)["threads"]}
        for i, hit in enumerate(hits):
            assert shown.nth(i).get_attribute("data-checkpoint-id") == hit["checkpoint_id"]
            assert shown.nth(i).get_by_test_id("search-hit-snippet").inner_text() == hit["snippet"]
            assert shown.nth(i).get_by_test_id("search-hit-title").inner_text() == titles[hit["thread_id"]]
        hit = next(h for h in hits if h["checkpoint_id"] == ferry["checkpoint_id"])
        head_before = act(http, "get_head", thread_id=thread_id)["checkpoint_id"]
        page.locator(f'[data-testid=search-hit][data-message-id="{hit["message_id"]}"]').click()
        expect(page.get_by_test_id("shown-checkpoint")).to_have_text(hit["checkpoint_id"])
        assert page.evaluate("location.search") == f"?thread={thread_id}&head={hit['checkpoint_id']}"
        state = act(http, "get_checkpoint_state", thread_id=thread_id, checkpoint_id=hit["checkpoint_id"])
        assert page_view(page) == api_view(state)
        assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] == head_before  # opening writes nothing
    assert page.errors == []


def test_memory_as_of_a_checkpoint_and_extraction_with_a_dry_run_from_the_page(server):
    page = new_page(server, "kim")
    page.goto(server.base_url + "/")
    with api(server, "kim") as http:
        send(page, "Hello there")
        thread_id = settled(page, http, lambda: thread_of(page))
        earlier = act(http, "get_checkpoint_state", thread_id=thread_id)["checkpoint_id"]
        send(page, "remember that I am vegetarian")
        settled(page, http, lambda: thread_id)
        head = act(http, "get_checkpoint_state", thread_id=thread_id)["checkpoint_id"]
        # The dry run shows the model's proposals and writes nothing.
        page.get_by_test_id("extract-memories").click()
        expect(page.get_by_test_id("proposal")).to_have_count(1)
        dry = act(http, "extract_memories", thread_id=thread_id, checkpoint_id=head, dry_run=True)
        assert [p["content"] for p in dry["proposals"]] == ["I am vegetarian"]
        assert "I am vegetarian" in page.get_by_test_id("proposal").inner_text()
        assert act(http, "list_memories")["memories"] == []
        # Confirming writes them, with the checkpoint as provenance.
        page.get_by_test_id("extract-confirm").click()
        expect(page.get_by_test_id("extraction")).to_contain_text("Written: 1 memory")
        [memory] = act(http, "list_memories")["memories"]
        assert memory["content"] == "I am vegetarian" and memory["checkpoint_id"] == head
        # What the agent knew: at the head, the memory; at the earlier checkpoint, none.
        page.get_by_test_id("memories-as-of").click()
        expect(page.get_by_test_id("memory-as-of-row")).to_have_count(1)
        known = act(http, "list_memories", thread_id=thread_id, as_of_checkpoint=head)["memories"]
        assert page.get_by_test_id("memory-as-of-row").all_inner_texts() == [m["content"] for m in known]
        page.goto(f"{server.base_url}/?thread={thread_id}&head={earlier}")
        expect(page.get_by_test_id("shown-checkpoint")).to_have_text(earlier)
        page.get_by_test_id("memories-as-of").click()
        expect(page.get_by_test_id("memory-as-of")).to_contain_text("no memories.")
        assert act(http, "list_memories", thread_id=thread_id, as_of_checkpoint=earlier)["memories"] == []
        assert page.get_by_test_id("memory-as-of-row").count() == 0
    assert page.errors == []


def test_save_only_on_the_first_message_keeps_the_switchers_after_it(server):
    """An in-place edit of an early message leaves the later messages' "< i/n >" where they were."""
    page = new_page(server, "alice")
    page.goto(server.base_url + "/")
    with api(server, "alice") as http:
        send(page, "I'm headed to Lisbon!")
        thread_id = settled(page, http, lambda: thread_of(page))
        send(page, "What should I see?")
        settled(page, http, lambda: thread_id)
        page.get_by_test_id("regenerate").last.click()
        view = settled(page, http, lambda: thread_id, view=True)
        assert view[-1]["count"] == "2/2"
        page.get_by_test_id("edit").first.click()
        page.get_by_test_id("edit-input").fill("I'm headed to Porto!")
        page.get_by_test_id("save-only").click()
        page.locator(".text-part", has_text="I'm headed to Porto!").wait_for(timeout=10_000)
        view = settled(page, http, lambda: thread_id, view=True)
        assert view[0]["text"] == "I'm headed to Porto!"
        assert view[-1]["count"] == "2/2"  # the regenerated answer keeps its switcher


# -- small defects a new user found (issue 20's tryout) ----------------------------------------------------------
def root_of(http: httpx.Client, thread_id: str) -> str:
    history = act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]
    return next(e["checkpoint_id"] for e in history if e["source"] == "root")


def node(page, checkpoint_id: str):
    return page.locator(f'[data-testid=tree-node][data-checkpoint-id="{checkpoint_id}"]')


def test_a_tree_click_while_an_earlier_checkpoint_is_shown_shows_the_clicked_checkpoint(server):
    # set_head's state holds the messages from where the clicked checkpoint parts from the previous head; the
    # page showed another branch (a link to it), so that state does not continue what it shows.
    with api(server, "nina") as http:
        first = say(http, "Where should we go first?")
        thread_id = first["thread_id"]
        second = say(http, "And then?", thread_id=thread_id)
        other = say(http, "A different start", thread_id=thread_id, checkpoint_id=root_of(http, thread_id))
        act(http, "set_head", thread_id=thread_id, checkpoint_id=second["checkpoint_id"])  # the link shows another branch
        page = new_page(server, "nina")
        page.goto(f"{server.base_url}/?thread={thread_id}&head={other['checkpoint_id']}")
        expect(page.get_by_test_id("shown-checkpoint")).to_have_text(other["checkpoint_id"])
        node(page, first["checkpoint_id"]).click()
        expect(page.get_by_test_id("shown-checkpoint")).to_have_text(first["checkpoint_id"])
        assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] == first["checkpoint_id"]
        view = settled(page, http, lambda: thread_id, view=True)
        assert [m["text"] for m in view if m["role"] == "user"] == ["Where should we go first?"]
    assert page.errors == []


#: Holds back the answer to a `set_head` naming `window.slowSetHead` by 2 s (the request reaches the server at
#: once): the answer of an earlier click arrives after a later one's.
SLOW_SET_HEAD_JS = """(() => {
  const real = window.fetch.bind(window);
  window.fetch = async (url, init) => {
    const response = await real(url, init);
    const body = init && typeof init.body === 'string' ? init.body : '';
    if (window.slowSetHead && body.includes('"set_head"') && body.includes(window.slowSetHead)) {
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
    return response;
  };
})()"""


def test_an_earlier_clicks_answer_arriving_last_is_not_drawn(server):
    with api(server, "oscar") as http:
        one = say(http, "One")
        thread_id = one["thread_id"]
        two = say(http, "Two", thread_id=thread_id)
        branch = say(http, "A branch after one", thread_id=thread_id, checkpoint_id=one["checkpoint_id"])
        act(http, "set_head", thread_id=thread_id, checkpoint_id=two["checkpoint_id"])
        page = new_page(server, "oscar")
        page.add_init_script(SLOW_SET_HEAD_JS)
        page.goto(f"{server.base_url}/?thread={thread_id}")
        settled(page, http, lambda: thread_id)
        page.evaluate("id => { window.slowSetHead = id; }", one["checkpoint_id"])
        node(page, one["checkpoint_id"]).click()  # its answer comes 2 s late
        deadline = time.monotonic() + 5
        while act(http, "get_head", thread_id=thread_id)["checkpoint_id"] != one["checkpoint_id"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        node(page, branch["checkpoint_id"]).click()
        expect(page.get_by_test_id("shown-checkpoint")).to_have_text(branch["checkpoint_id"])
        page.wait_for_timeout(2500)  # past the late answer
        assert act(http, "get_head", thread_id=thread_id)["checkpoint_id"] == branch["checkpoint_id"]
        view = settled(page, http, lambda: thread_id, view=True)
        assert [m["text"] for m in view if m["role"] == "user"] == ["One", "A branch after one"]
    assert page.errors == []


#: Each tree node: its label's text, how wide the label is drawn and how wide its box is.
NODE_LABELS_JS = """() => [...document.querySelectorAll('[data-testid=tree-node]')].map(n => ({
  id: n.dataset.checkpointId,
  text: n.querySelector('text').textContent,
  title: n.querySelector('title').textContent,
  width: n.querySelector('text').getBBox().width,
  box: n.querySelector('rect').getBBox().width,
}))"""


def test_tree_labels_tell_siblings_with_a_long_shared_beginning_apart(server):
    start = "Please plan a week-long trip to the mountains of "
    with api(server, "paula") as http:
        colorado = say(http, start + "Colorado for my family")
        thread_id = colorado["thread_id"]
        swiss = say(http, start + "Switzerland for my family", thread_id=thread_id, checkpoint_id=root_of(http, thread_id))
        page = new_page(server, "paula")
        page.goto(f"{server.base_url}/?thread={thread_id}")
        settled(page, http, lambda: thread_id)
        labels = {n["id"]: n for n in page.evaluate(NODE_LABELS_JS)}
        assert "Colorado" in labels[colorado["checkpoint_id"]]["text"]
        assert "Switzerland" in labels[swiss["checkpoint_id"]]["text"]
        # The tooltip has the whole message, and no label is drawn wider than its box.
        assert start + "Switzerland for my family" in labels[swiss["checkpoint_id"]]["title"]
        assert all(n["width"] <= n["box"] for n in labels.values()), labels
    assert page.errors == []


def test_archived_branches_are_hidden_from_the_tree_unless_asked_and_not_counted(server):
    with api(server, "quinn") as http:
        first = say(http, "Start here")
        thread_id = first["thread_id"]
        kept = say(http, "Keep going", thread_id=thread_id)
        gone = say(http, "Archive this one", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
        say(http, "And another branch", thread_id=thread_id, checkpoint_id=first["checkpoint_id"])
        act(http, "set_head", thread_id=thread_id, checkpoint_id=kept["checkpoint_id"])
        act(http, "archive_branch", thread_id=thread_id, checkpoint_id=gone["checkpoint_id"])
        history = act(http, "get_checkpoint_history", thread_id=thread_id, limit=100)["history"]
        listed = act(http, "list_branches", thread_id=thread_id)["branches"]
        page = new_page(server, "quinn")
        page.goto(f"{server.base_url}/?thread={thread_id}")
        settled(page, http, lambda: thread_id)
        # The header counts the branches leaving the path as list_branches lists them: the archived one is not.
        assert len(listed) - 1 == 1
        expect(page.get_by_test_id("branches-off-path")).to_have_text("1 branch leaves this path")
        expect(page.get_by_test_id("tree-node")).to_have_count(len(history) - 1)
        assert node(page, gone["checkpoint_id"]).count() == 0
        page.get_by_test_id("tree-show-archived").check()
        expect(page.get_by_test_id("tree-node")).to_have_count(len(history))
        expect(node(page, gone["checkpoint_id"])).to_have_class(re.compile(r"\barchived\b"))
        # Shown, an archived checkpoint is drawn (its own chain) though the box is unchecked.
        page.get_by_test_id("tree-show-archived").uncheck()
        page.goto(f"{server.base_url}/?thread={thread_id}&head={gone['checkpoint_id']}")
        expect(page.get_by_test_id("shown-checkpoint")).to_have_text(gone["checkpoint_id"])
        expect(node(page, gone["checkpoint_id"])).to_have_count(1)
    assert page.errors == []


def test_a_very_long_unknown_thread_id_is_clipped_where_the_page_says_it(server):
    long_id = "x" * 250 + "-end"
    page = new_page(server, "rosa")
    page.goto(f"{server.base_url}/?thread={long_id}")
    error = page.get_by_test_id("error")
    expect(error).to_contain_text("was not found")
    assert "x" * 40 + "…" in error.inner_text() and "x" * 41 not in error.inner_text()
    assert "x" * 41 not in page.get_by_test_id("thread-title").inner_text()
    assert page.errors == []
