"""Web page benchmark: the first render of a long branched thread in headless Chromium.

    python -m bench.web [--quick] [--json FILE] [--database-url URL]

A thread of 200 turns with 20 one-turn branches (quick: 20 and 2) is written in memory with the offline
model and imported over HTTP (`import_thread`) into `tt-agent serve` (a real process, Postgres, the
offline model). Debian's Chromium (Playwright, `tests.helpers.web`) then opens `/?thread=<id>` in a new
browser context each sample (a cold cache: the page's scripts are fetched too) and the clock runs from
the navigation to the moment the last message is visible and the tree has every checkpoint drawn, after
one render that warms the server's caches (not with `--quick`, whose one sample is a smoke test).

Figures: that time (median of the samples); the bytes the page fetched on the wire (Playwright's
`request.sizes()`: compressed bodies and headers), for the API alone (its requests: the state, the
history pages, the thread list, who the user is) and with the page's own files; and the messages' own
bytes (the UTF-8 text of the shown branch's messages), against which the API's bytes are set.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from bench import report
from bench.databases import scratch_database, server_version


@dataclass(frozen=True)
class Sizes:
    turns: int = 200
    branches: int = 20
    samples: int = 5


QUICK = Sizes(turns=20, branches=2, samples=1)

RENDER_TARGET_S = 3.0
BYTES_RATIO_TARGET = 1.5


def figures(sizes: Sizes = Sizes()) -> dict[str, report.Figure]:
    return {
        "render_s": report.Figure(
            f"first render of a {sizes.turns}-turn thread: last message visible, tree drawn (median)",
            f"<= {RENDER_TARGET_S:g} s", lambda v: v <= RENDER_TARGET_S, report.fixed(2, " s"),
        ),
        "api_bytes": report.Figure("bytes fetched from the API (on the wire)", fmt=lambda v: f"{v / 1000:.1f} kB"),
        "all_bytes": report.Figure("bytes fetched in all (the page's files too, cold cache)", fmt=lambda v: f"{v / 1000:.1f} kB"),
        "message_bytes": report.Figure("the shown messages' own text", fmt=lambda v: f"{v / 1000:.1f} kB"),
        "api_ratio": report.Figure(
            "API bytes / messages' own bytes", f"<= {BYTES_RATIO_TARGET:g}", lambda v: v <= BYTES_RATIO_TARGET, report.fixed(2),
        ),
    }  # fmt: skip


def _message_bytes(state: dict[str, Any]) -> int:
    total = 0
    for item in state["messages"]:
        if item["type"] == "message":
            content = item.get("content")
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
        else:
            text = item.get("arguments") or item.get("output") or ""
        total += len(text.encode("utf-8"))
    return total


def _one_render(browser: Any, base_url: str, thread_id: str, last_id: str, nodes: int) -> tuple[float, int, int]:
    """(seconds to the last message and every tree node, API bytes, all bytes) in a fresh browser context."""
    context = browser.new_context(viewport={"width": 1400, "height": 860})
    requests: list[Any] = []
    page = context.new_page()
    page.on("requestfinished", lambda request: requests.append(request))
    try:
        started = time.perf_counter()
        page.goto(f"{base_url}/?thread={thread_id}")
        page.locator(f'[data-message-id="{last_id}"]').wait_for(state="visible", timeout=60_000)
        page.get_by_test_id("tree-node").nth(nodes - 1).wait_for(timeout=60_000)
        elapsed = time.perf_counter() - started
        api = every = 0
        for request in requests:
            sizes = request.sizes()
            size = sizes["responseBodySize"] + sizes["responseHeadersSize"] + sizes["requestBodySize"] + sizes["requestHeadersSize"]
            every += size
            if not request.url.startswith(f"{base_url}/assets/") and request.url.rstrip("/") != base_url:
                api += size
        return elapsed, api, every
    finally:
        context.close()


def run(server_url: str, *, quick: bool) -> dict[str, Any]:
    """Run the benchmark on a scratch database of the Postgres server at `server_url`; return the report
    (`bench.report.build_report`'s, with `settings`, `measurements` and `error`)."""
    from tests.helpers.servers import free_port, server_process
    from tests.helpers.web import launch_chromium, two_hundred_turn_document

    sizes = QUICK if quick else Sizes()
    header = report.environment(server_version(server_url), (*report.DEFAULT_PACKAGES, "playwright"))
    values: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    error = None
    started = time.perf_counter()
    try:
        document, _, _ = two_hundred_turn_document(sizes.turns, sizes.branches)
        with scratch_database(server_url, "tt_web") as url:
            port = free_port()
            env = {"AGENT_DATABASE_URL": url, "AGENT_MODEL": "offline", "AGENT_TRACING": "false"}
            command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
            with server_process(command, port=port, health_path="/health", env=env) as base_url, httpx.Client(
                base_url=base_url, timeout=120
            ) as http:

                def act(name: str, **inputs: Any) -> dict[str, Any]:
                    body = {"model": "agent", "input": [], "custom_inputs": {"action": name, **inputs}}
                    answer = http.post("/responses", json=body)
                    answer.raise_for_status()
                    return answer.json()["custom_outputs"]

                thread_id = act("import_thread", document=document)["thread"]["thread_id"]
                state = act("get_checkpoint_state", thread_id=thread_id)
                nodes = len(act("get_checkpoint_history", thread_id=thread_id, limit=1000)["history"])
                user_ids = [i for i, item in enumerate(state["messages"]) if item.get("role") == "user"]
                last_id = state["messages"][user_ids[-1] + 1]["id"]  # the last answer, named by its first item
                with launch_chromium() as browser:
                    if not quick:  # the quick run's one sample is not to be trusted anyway: a render less of CPU
                        _one_render(browser, base_url, thread_id, last_id, nodes)  # warm-up: the server's caches
                    runs = [_one_render(browser, base_url, thread_id, last_id, nodes) for _ in range(sizes.samples)]
        samples = {"render_s": [r[0] for r in runs], "api_bytes": [r[1] for r in runs], "all_bytes": [r[2] for r in runs],
                   "checkpoints": nodes, "messages": len(state["messages"])}  # fmt: skip
        values = {
            "render_s": statistics.median(samples["render_s"]),
            "api_bytes": statistics.median(samples["api_bytes"]),
            "all_bytes": statistics.median(samples["all_bytes"]),
            "message_bytes": _message_bytes(state),
        }
        values["api_ratio"] = values["api_bytes"] / values["message_bytes"]
    except Exception:  # noqa: BLE001 - reported: the figures say "not measured"
        error = traceback.format_exc()
    return report.build_report(
        figures(sizes),
        values,
        **header,
        settings={"quick": quick, "sizes": asdict(sizes)},
        measurements=samples,
        error=error,
        elapsed_seconds=time.perf_counter() - started,
    )


def print_result(result: dict[str, Any]) -> None:
    """The table of figures (`bench.report.print_report`)."""
    sizes = result["settings"]["sizes"]
    report.print_report(
        f"Web page: first render of a {sizes['turns']}-turn thread with {sizes['branches']} branches (Chromium, tt-agent serve, Postgres)",
        result,
    )


def main(argv: list[str] | None = None) -> int:
    return report.standalone_main(__doc__, run, print_result, argv, quick_help="a 20-turn thread, one sample (a smoke test)")


if __name__ == "__main__":
    sys.exit(main())

