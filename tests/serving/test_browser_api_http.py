"""What a browser client needs of `tt-agent serve`, over real HTTP: CORS for the origins of `cors_origins`
(`AGENT_CORS_ORIGINS`) and no others, gzip-compressed answers while server-sent event streams still stream,
typed schemas in `GET /openapi.json`, and the branching fields (`regenerate_message_id`, `alternatives`) as a
page uses them.

One server process for the module (as a user starts it, with `AGENT_CORS_ORIGINS` in its environment) on a
SQLite file, with the offline model. Storage behaviour is tested in-process on both backends
(`tests/operations/test_branches.py`); these tests are about the HTTP layer.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from types import SimpleNamespace

import httpx
import pytest

from tests.helpers.render import rendered
from tests.helpers.scenario import TRIP
from tests.helpers.servers import free_port, server_process

pytestmark = pytest.mark.slow

PAGE = "https://chat.example.com"
OTHER = "https://evil.example.net"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("browser_api_http")
    port = free_port()
    env = {
        "AGENT_DATABASE_URL": f"sqlite:///{cwd / 'checkpoints.sqlite'}",
        "AGENT_MODEL": "offline",
        "AGENT_TRACING": "false",
        "AGENT_CORS_ORIGINS": f"{PAGE}, http://localhost:5173",
    }
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
        with httpx.Client(base_url=base_url, timeout=60) as http:
            yield SimpleNamespace(http=http)


def invoke(server, text: str | None = None, **custom_inputs) -> dict:
    items = [] if text is None else [{"role": "user", "content": text}]
    response = server.http.post("/invocations", json={"input": items, "custom_inputs": custom_inputs})
    assert response.status_code == 200, response.text
    return response.json()["custom_outputs"]


def preflight(server, origin: str, path: str = "/responses") -> httpx.Response:
    return server.http.options(
        path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, idempotency-key, x-stainless-lang",
        },
    )


# -- CORS --------------------------------------------------------------------------------------------------


def test_a_preflight_from_a_listed_origin_succeeds_and_the_answer_names_the_origin(server):
    for path in ("/responses", "/invocations", "/conversations"):
        response = preflight(server, PAGE, path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["access-control-allow-origin"] == PAGE
        assert "POST" in response.headers["access-control-allow-methods"]
        assert "idempotency-key" in response.headers["access-control-allow-headers"].lower()
    answer = server.http.get("/agent/info", headers={"Origin": "http://localhost:5173"})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_a_preflight_from_another_origin_gets_no_cors_headers(server):
    response = preflight(server, OTHER)
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers
    answer = server.http.get("/agent/info", headers={"Origin": OTHER})
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers


def test_an_error_answer_to_a_listed_origin_carries_cors_headers_and_no_traceback(server):
    response = server.http.post(
        "/invocations",
        headers={"Origin": PAGE},
        json={"input": [], "custom_inputs": {"action": "get_checkpoint_state", "thread_id": "no-such-thread"}},
    )
    assert response.status_code == 404 and response.headers["access-control-allow-origin"] == PAGE
    assert response.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST" and "Traceback" not in response.text


# -- writes from other sites' pages, hosts not served (`serving.origins`) -----------------------------------


def forged_turn(server, origin: str | None, thread_id: str, **headers) -> httpx.Response:
    """A turn as a page on `origin` makes a browser send it without a preflight: a `text/plain` body."""
    body = json.dumps({"input": [{"role": "user", "content": "hello"}], "custom_inputs": {"thread_id": thread_id}})
    sent = {"Content-Type": "text/plain;charset=UTF-8", **({"Origin": origin} if origin else {}), **headers}
    return server.http.post("/responses", content=body, headers=sent)


def thread_exists(server, thread_id: str) -> bool:
    return server.http.get(f"/conversations/{thread_id}").status_code == 200


def test_a_write_from_another_sites_page_is_refused_and_runs_nothing(server):
    answer = forged_turn(server, OTHER, "forged-turn")
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert OTHER in error["message"] and "nothing was run" in error["message"] and "Traceback" not in answer.text
    assert not thread_exists(server, "forged-turn")
    # A page that is a file or a sandboxed frame says "null"; a delete is refused alike.
    assert forged_turn(server, "null", "forged-null").status_code == 403 and not thread_exists(server, "forged-null")
    made = invoke(server, "a thread to keep")
    refused = server.http.delete(f"/conversations/{made['thread_id']}", headers={"Origin": OTHER})
    assert refused.status_code == 403 and thread_exists(server, made["thread_id"])
    # Reading is a browser's to block (CORS): a GET from another site is answered, without CORS headers.
    read = server.http.get(f"/conversations/{made['thread_id']}", headers={"Origin": OTHER})
    assert read.status_code == 200 and "access-control-allow-origin" not in read.headers


def test_writes_from_this_servers_own_pages_from_listed_origins_and_from_clients_without_an_origin_run(server):
    own = str(server.http.base_url).rstrip("/")  # http://127.0.0.1:PORT, as the served web page's fetches say
    assert forged_turn(server, own, "from-own-page").status_code == 200
    assert forged_turn(server, PAGE, "from-listed-page").status_code == 200
    assert forged_turn(server, None, "from-a-client").status_code == 200  # the openai package, curl: no Origin
    # Behind a proxy that passes the public name on.
    proxied = forged_turn(server, "https://agent.example.org", "from-proxied-page", **{"X-Forwarded-Host": "agent.example.org"})
    assert proxied.status_code == 200
    assert all(thread_exists(server, t) for t in ("from-own-page", "from-listed-page", "from-a-client", "from-proxied-page"))


def test_a_server_on_a_loopback_address_answers_only_its_loopback_names(server):
    # DNS rebinding: evil.example.com re-pointed at 127.0.0.1 is same-origin with itself, but says its name.
    rebound = forged_turn(server, "http://evil.example.com", "rebound", Host="evil.example.com")
    assert rebound.status_code == 400 and "AGENT_ALLOWED_HOSTS" in rebound.json()["error"]["message"]
    assert server.http.get("/health", headers={"Host": "evil.example.com"}).status_code == 400
    port = server.http.base_url.port
    for name in ("localhost", "127.0.0.1", "[::1]"):
        assert server.http.get("/health", headers={"Host": f"{name}:{port}"}).status_code == 200, name
    assert not thread_exists(server, "rebound")


# -- compression -------------------------------------------------------------------------------------------


def test_answers_are_gzip_compressed_for_clients_that_accept_it(server):
    thread_id = invoke(server, TRIP[0])["thread_id"]
    for text in TRIP[1:]:
        invoke(server, text, thread_id=thread_id)
    body = {"input": [], "custom_inputs": {"action": "get_checkpoint_state", "thread_id": thread_id}}
    plain = server.http.post("/invocations", json=body, headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and "content-encoding" not in plain.headers
    with server.http.stream("POST", "/invocations", json=body, headers={"Accept-Encoding": "gzip"}) as raw:
        assert raw.headers["content-encoding"] == "gzip"
        compressed = b"".join(raw.iter_raw())
    unpacked, expected = json.loads(gzip.decompress(compressed)), plain.json()
    # Each answer is a response of its own (its `id` and `created_at`); what it says is the same.
    assert (unpacked["output"], unpacked["custom_outputs"]) == (expected["output"], expected["custom_outputs"])
    assert unpacked["custom_outputs"]["messages"]  # the state itself, not an error
    assert len(compressed) < len(plain.content) / 2


def test_a_streamed_turn_still_streams_event_by_event_when_the_client_accepts_gzip(server):
    body = {"input": [{"role": "user", "content": "Tell me about streaming"}], "stream": True}
    chunks = []
    with server.http.stream("POST", "/responses", json=body,
                      headers={"Accept-Encoding": "gzip", "Origin": PAGE}) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in response.headers
        assert response.headers["access-control-allow-origin"] == PAGE
        chunks = list(response.iter_raw())
    # Each server-sent event went out as it was produced (not one compressed block at the end).
    assert len(chunks) > 3 and chunks[0].startswith(b"data: ")
    events = b"".join(chunks).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert json.loads(events[-3][len("data: "):])["type"] == "response.completed"


# -- the branching fields, as a page uses them -------------------------------------------------------------


def test_a_page_regenerates_an_answer_by_its_id_and_reads_each_messages_versions(server):
    thread_id = invoke(server, TRIP[0])["thread_id"]
    invoke(server, TRIP[1], thread_id=thread_id)
    state = invoke(server, action="get_checkpoint_state", thread_id=thread_id)
    first_answer = state["messages"][1]
    again = invoke(server, thread_id=thread_id, regenerate_message_id=first_answer["id"])
    assert again["parent_checkpoint_id"] == first_answer["branch_checkpoint_id"] == state["messages"][0]["branch_checkpoint_id"]
    user, answer = invoke(server, action="get_checkpoint_state", thread_id=thread_id)["messages"]
    assert user["alternatives"]["count"] == 1 and user["alternatives"]["options"][0]["preview"] == TRIP[0]
    assert (answer["alternatives"]["kind"], answer["alternatives"]["index"], answer["alternatives"]["count"]) == (
        "regenerations", 1, 2,
    )  # fmt: skip
    assert [o["checkpoint_id"] for o in answer["alternatives"]["options"]] == [first_answer["checkpoint_id"], again["checkpoint_id"]]
    response = server.http.post(
        "/invocations", json={"input": [], "custom_inputs": {"thread_id": thread_id, "regenerate_message_id": user["id"]}}
    )
    assert response.status_code == 400 and "not an assistant answer" in response.json()["message"]


def test_a_page_redraws_after_a_streamed_edit_from_its_last_event_and_reads_only_what_follows_a_message(server):
    thread_id = invoke(server, TRIP[0])["thread_id"]
    invoke(server, TRIP[1], thread_id=thread_id)
    shown = invoke(server, action="get_checkpoint_state", thread_id=thread_id)["messages"]
    body = {
        "input": [{"role": "user", "content": "I'm headed to LA!"}],
        "stream": True,
        "custom_inputs": {"thread_id": thread_id, "edit_message_id": shown[2]["id"], "include": ["state"]},
    }
    with server.http.stream("POST", "/responses", json=body) as response:
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: {")]
    completed = events[-1]
    assert completed["type"] == "response.completed" and "state" not in events[-2]["custom_outputs"]  # once a stream
    state = completed["custom_outputs"]["state"]
    whole = invoke(server, action="get_checkpoint_state", thread_id=thread_id)
    assert rendered(shown, state) == whole["messages"] and state["head_checkpoint_id"] == whole["checkpoint_id"]
    part = invoke(server, action="get_checkpoint_state", thread_id=thread_id, after_message_id=shown[1]["id"])
    assert part["message_offset"] == 2 and part["messages"] == whole["messages"][2:]
    unknown = server.http.post(
        "/invocations",
        json={"input": [], "custom_inputs": {"action": "get_checkpoint_state", "thread_id": thread_id, "after_message_id": "nope"}},
    )
    assert unknown.status_code == 400 and "nope" in unknown.json()["message"]
    # OpenAI's own top-level `include` names other data; the refusal says where a page asks for the state.
    top = server.http.post("/responses", json={"input": "Hi", "include": ["state"]})
    assert top.status_code == 400 and "custom_inputs.include" in top.json()["error"]["message"]


# -- GET /openapi.json -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openapi(server) -> dict:
    response = server.http.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def conforms(openapi: dict, schema: dict, value) -> None:
    """`value` is valid against `schema`, whose `$ref`s point into the document's components."""
    import jsonschema

    jsonschema.Draft202012Validator({**schema, "components": openapi["components"]}).validate(value)


def answer_schema(openapi: dict, method: str, path: str, status: str = "200") -> dict:
    return openapi["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]


def test_openapi_types_every_routes_request_and_answers(openapi):
    routes = [(path, method, operation) for path, item in openapi["paths"].items() for method, operation in item.items()]
    assert len(routes) >= 13
    for path, method, operation in routes:
        assert "$ref" in answer_schema(openapi, method, path), (method, path)  # a model, not an empty schema
        assert "422" not in operation["responses"], (method, path)  # FastAPI's, never answered here
        if method == "post":
            assert "$ref" in operation["requestBody"]["content"]["application/json"]["schema"], path
    turn = openapi["paths"]["/responses"]["post"]
    assert turn["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponsesAgentRequest")
    assert answer_schema(openapi, "post", "/responses")["$ref"].endswith("/ResponsesAgentResponse")
    assert turn["responses"]["200"]["content"]["text/event-stream"]["schema"]["$ref"].endswith("/ResponsesAgentStreamEvent")
    assert answer_schema(openapi, "post", "/invocations", "404")["$ref"].endswith("/ErrorAnswer")
    assert answer_schema(openapi, "get", "/conversations/{conversation_id}", "404")["$ref"].endswith("/OpenAIErrorAnswer")
    names = {p["name"] for p in openapi["paths"]["/conversations/{conversation_id}/items"]["get"]["parameters"]}
    assert {"conversation_id", "after", "limit", "order"} <= names
    text = json.dumps(openapi)
    assert all(ref in openapi["components"]["schemas"] for ref in re.findall(r'"#/components/schemas/([^"]+)"', text))


def test_the_servers_answers_conform_to_the_schemas_it_publishes(server, openapi):
    for path in ("/health", "/ready", "/agent/info"):
        conforms(openapi, answer_schema(openapi, "get", path), server.http.get(path).json())
    turn = server.http.post("/invocations", json={"input": [{"role": "user", "content": TRIP[0]}]})
    conforms(openapi, answer_schema(openapi, "post", "/invocations"), turn.json())
    missing = server.http.post("/invocations", json={"input": [], "custom_inputs": {"action": "list_branches", "thread_id": "nope"}})
    assert missing.status_code == 404
    conforms(openapi, answer_schema(openapi, "post", "/invocations", "404"), missing.json())
    created = server.http.post("/conversations", json={"items": [{"role": "user", "content": "Hi"}], "metadata": {"a": "b"}})
    conforms(openapi, answer_schema(openapi, "post", "/conversations"), created.json())
    items = server.http.get(f"/conversations/{created.json()['id']}/items")
    conforms(openapi, answer_schema(openapi, "get", "/conversations/{conversation_id}/items"), items.json())
    unknown = server.http.get("/conversations/no-such-conversation")
    assert unknown.status_code == 404
    conforms(openapi, answer_schema(openapi, "get", "/conversations/{conversation_id}", "404"), unknown.json())
