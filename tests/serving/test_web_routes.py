"""The web page's routes on the Agent Server (`agent.serving.web`), in process: the page and its files are
served from the package, and `GET /web/identity` says who the page acts as and nothing more.

The page itself is tested in Chromium (tests/web).
"""

from __future__ import annotations

import re

import httpx
import pytest

from agent import create_agent
from agent.serving.agent_server import build_app
from agent.serving.web import ASSET_CACHE, ASSETS_DIR
from tests.helpers.servers import in_process_server

HEADER = "X-Forwarded-User"


@pytest.fixture(params=[None, HEADER], ids=["no-header", "header"])
def served(request, tmp_path):
    with create_agent(f"sqlite:///{tmp_path / 'web.sqlite'}", model="offline", tracing=False, user_id_header=request.param) as agent:
        with in_process_server(build_app(agent)) as url, httpx.Client(base_url=url, timeout=60) as http:
            yield request.param, http


def test_the_page_and_its_files_are_served_from_the_package(served):
    _, http = served
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == (ASSETS_DIR / "index.html").read_text()
    assert page.headers["cache-control"] == "no-cache"
    files = re.findall(r'(?:src|href)="(/assets/[^"]+)"', page.text)
    assert any(f.endswith(".js") for f in files) and any(f.endswith(".css") for f in files)
    for path in files:
        answer = http.get(path)
        assert answer.status_code == 200 and answer.content == (ASSETS_DIR / path.lstrip("/")).read_bytes()
        assert answer.headers["cache-control"] == ASSET_CACHE
    assert http.get("/assets/nothing-here.js").status_code == 404


def test_identity_names_the_header_and_the_callers_own_value_only(served):
    header, http = served
    if header is None:
        assert http.get("/web/identity", headers={HEADER: "alice"}).json() == {"header": None, "user_id": None}
    else:
        assert http.get("/web/identity", headers={HEADER: "alice"}).json() == {"header": HEADER, "user_id": "alice"}
        assert http.get("/web/identity").json() == {"header": HEADER, "user_id": None}
        assert http.get("/web/identity", headers=[(HEADER, "a"), (HEADER, "b")]).status_code == 400  # as every route


def test_unknown_routes_still_answer_the_apis_404(served):
    _, http = served
    answer = http.get("/no/such/route")
    assert answer.status_code == 404 and "error_code" in answer.json()
