"""The thread catalogue (`agent.operations.catalogue`): listings per user, keyset paging under concurrent writes,
default titles, metadata on the first turn, filters, `update_thread`, ownership; as Python methods, actions and
over HTTP. Every storage test runs on Postgres and on a SQLite file.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from types import SimpleNamespace

import httpx
import openai
import pytest

from agent.errors import InvalidRequest, ThreadNotFound
from agent.operations.thread_values import default_title, shorten
from tests.helpers.scenario import outputs, request, say
from tests.helpers.servers import free_port, server_process
from tests.cli.test_cli import assert_clean_success, run_cli


def user() -> str:
    # The Postgres database is shared by the session: each test's users are its own.
    return f"u-{uuid.uuid4().hex[:10]}"


def ids(threads: list[dict]) -> list[str]:
    return [thread["thread_id"] for thread in threads]


def insert_threads(agent, user_id: str | None, count: int, *, prefix: str = "t", metadata=None) -> list[str]:
    """`count` thread records written in one transaction (equal `updated_at` on Postgres: ties are
    ordered by thread_id), without checkpoints: the catalogue reads records only."""
    made = [f"{prefix}-{uuid.uuid4().hex[:12]}" for _ in range(count)]

    def apply(tx):
        for thread_id in made:
            tx.insert_thread(
                thread_id,
                user_id=user_id,
                head_checkpoint_id="none",
                message_count=0,
                title=None,
                metadata=metadata or {},
                forked_from=None,
            )

    agent.storage.transaction(apply)
    return made


def touch(agent, thread_id: str) -> None:
    """New activity on a thread (as a head switch writes it): its updated_at becomes now."""
    agent.storage.transaction(lambda tx: tx.set_head(thread_id, "none", message_count=0))


def page_all(agent, user_id, *, limit: int, between=lambda seen: None, **filters) -> list[str]:
    listed: list[str] = []
    before = None
    while True:
        page = agent.list_threads(user_id=user_id, limit=limit, before=before, **filters)
        if not page:
            return listed
        listed += ids(page)
        before = page[-1]["cursor"]
        between(list(listed))


# -- titles -------------------------------------------------------------------------------------------
def test_a_short_first_message_is_the_title_as_it_is():
    assert shorten("  Plan my   trip\nto Tokyo ") == "Plan my trip to Tokyo"
    assert shorten("   ") is None
    assert shorten("nul\x00inside") == "nul inside"  # Postgres text cannot hold NUL


def test_a_long_first_message_is_cut_on_a_word_boundary_to_at_most_60_characters():
    text = "I am planning a long trip through Japan next spring and would like help with the itinerary"
    title = shorten(text)
    assert len(title) <= 60 and title.endswith("…")
    assert text.startswith(title[:-1]) and text[len(title) - 1] == " "  # cut before a space, not inside a word
    assert len(shorten("x" * 200)) == 60  # one endless word: cut inside it


def test_the_title_comes_from_the_first_user_message_not_from_other_roles():
    from langchain_core.messages import HumanMessage, SystemMessage

    assert default_title([SystemMessage("be brief"), HumanMessage([{"type": "text", "text": "Hello there"}])]) == "Hello there"
    assert default_title([SystemMessage("be brief")]) is None


# -- one user's threads ----------------------------------------------------------------------------
def test_three_users_each_see_exactly_their_own_threads(agent):
    users = [user() for _ in range(3)]
    made = {u: [outputs(say(agent, f"hello from {u} #{i}", user_id=u))["thread_id"] for i in range(i + 2)] for i, u in enumerate(users)}
    anonymous = outputs(say(agent, "no user"))["thread_id"]
    for u in users:
        listed = agent.list_threads(user_id=u, limit=100)
        assert sorted(ids(listed)) == sorted(made[u])
        assert {t["user_id"] for t in listed} == {u}
        # Newest activity first: the last thread written is on top.
        assert ids(listed)[0] == made[u][-1]
    assert anonymous in ids(agent.list_threads(limit=100))
    assert not set(ids(agent.list_threads(limit=100))) & {t for u in users for t in made[u]}


def test_a_new_thread_has_its_first_message_as_title_and_the_turns_metadata(agent):
    u = user()
    first = outputs(say(agent, "Planning a trip to Tokyo in the spring", user_id=u, metadata={"app": "web", "plan": "pro"}))
    thread = agent.get_thread(first["thread_id"], user_id=u)
    assert thread["title"] == "Planning a trip to Tokyo in the spring"
    assert thread["metadata"] == {"app": "web", "plan": "pro"}
    assert thread["checkpoint_id"] == first["checkpoint_id"]
    assert thread["message_count"] == 2
    assert thread["forked_from"] is None and thread["ttl_seconds"] is None
    assert thread["created_at"] == thread["updated_at"]
    assert thread["created_at"].endswith("+00:00")

    # A later turn keeps title and metadata (its own metadata is ignored) and moves head and activity.
    second = outputs(say(agent, "Something else", thread_id=first["thread_id"], user_id=u, metadata={"app": "cli"}))
    after = agent.get_thread(first["thread_id"], user_id=u)
    assert (after["title"], after["metadata"]) == (thread["title"], thread["metadata"])
    assert after["checkpoint_id"] == second["checkpoint_id"] and after["message_count"] == 4
    assert after["updated_at"] > thread["updated_at"] and after["created_at"] == thread["created_at"]


def test_every_write_keeps_the_head_message_count_and_activity_current(agent):
    u = user()
    first = outputs(say(agent, "one", user_id=u))
    thread_id = first["thread_id"]
    outputs(say(agent, "two", thread_id=thread_id, user_id=u))
    seen = agent.get_thread(thread_id, user_id=u)

    updated = agent.update_checkpoint_state(thread_id, None, [{"role": "user", "content": "three"}], user_id=u)
    now = agent.get_thread(thread_id, user_id=u)
    assert (now["checkpoint_id"], now["message_count"]) == (updated["checkpoint_id"], 5)
    assert now["updated_at"] > seen["updated_at"]

    agent.set_head(thread_id, first["checkpoint_id"], user_id=u)
    switched = agent.get_thread(thread_id, user_id=u)
    assert (switched["checkpoint_id"], switched["message_count"]) == (first["checkpoint_id"], 2)
    assert switched["updated_at"] > now["updated_at"]

    forked = agent.fork_thread(thread_id, user_id=u)
    fork = agent.get_thread(forked["thread_id"], user_id=u)
    assert fork["forked_from"] == {"thread_id": thread_id, "checkpoint_id": first["checkpoint_id"]}
    assert fork["title"] == "one" and fork["message_count"] == 2
    assert ids(agent.list_threads(user_id=u))[:2] == [forked["thread_id"], thread_id]


def test_metadata_filters_keep_threads_holding_every_given_pair(agent):
    u = user()
    web = insert_threads(agent, u, 3, metadata={"app": "web", "tier": "pro"})
    cli = insert_threads(agent, u, 2, metadata={"app": "cli"})
    odd = insert_threads(agent, u, 1, metadata={'we"ird.key': "x"})
    assert sorted(ids(agent.list_threads(user_id=u, metadata={"app": "web"}))) == sorted(web)
    assert sorted(ids(agent.list_threads(user_id=u, metadata={"app": "cli"}))) == sorted(cli)
    assert sorted(ids(agent.list_threads(user_id=u, metadata={"app": "web", "tier": "pro"}))) == sorted(web)
    assert agent.list_threads(user_id=u, metadata={"app": "web", "tier": "free"}) == []
    assert ids(agent.list_threads(user_id=u, metadata={'we"ird.key': "x"})) == odd
    assert sorted(page_all(agent, u, limit=2, metadata={"app": "web"})) == sorted(web)


def test_title_search_finds_old_threads_page_after_page_ignoring_case(agent, monkeypatch):
    from agent.operations import catalogue

    monkeypatch.setattr(catalogue, "TITLE_SCAN_PAGE", 3)  # several reads for ten threads
    u, other = user(), user()
    made = insert_threads(agent, u, 10)
    for i, thread_id in enumerate(made):
        agent.update_thread(thread_id, user_id=u, title=f"Trip to Lisbon {i}" if i in (0, 4, 9) else f"Other {i}")
    [theirs] = insert_threads(agent, other, 1)
    agent.update_thread(theirs, user_id=other, title="Lisbon, not yours")
    newest_first = ids(agent.list_threads(user_id=u, limit=100))
    lisbon = [t for t in newest_first if t in {made[0], made[4], made[9]}]
    assert ids(agent.list_threads(user_id=u, title_contains="lisbon")) == lisbon  # past the first read's 3
    assert ids(agent.list_threads(user_id=u, title_contains="LISBON", limit=1)) == lisbon[:1]
    assert page_all(agent, u, limit=2, title_contains="  Lisbon ") == lisbon  # the cursor keeps the filter
    assert agent.list_threads(user_id=u, title_contains="Porto") == []
    assert ids(agent.list_threads(user_id=u, title_contains="")) == newest_first  # empty: no filter
    over_http = outputs(agent.predict(request(action="list_threads", user_id=u, title_contains="lisbon 4")))
    assert ids(over_http["threads"]) == [made[4]]


# -- paging ----------------------------------------------------------------------------------------
def test_paging_lists_every_thread_once_in_order_with_ties_broken_by_thread_id(agent):
    u = user()
    made = insert_threads(agent, u, 11)  # one transaction: on Postgres every updated_at is equal
    listed = page_all(agent, u, limit=3)
    assert listed == ids(agent.list_threads(user_id=u, limit=100))
    assert sorted(listed) == sorted(made) and len(listed) == len(made)
    whole = agent.list_threads(user_id=u, limit=100)
    keys = [(t["updated_at"], t["thread_id"]) for t in whole]
    assert keys == sorted(keys, reverse=True)


def test_paging_while_others_write_neither_skips_nor_repeats(backend_url, make_agent):
    """A writer on another connection keeps creating threads and giving new activity to threads already
    listed while the reader pages: every thread that existed before and was not changed is listed exactly
    once, and nothing is listed twice."""
    reader, writer = make_agent(backend_url), make_agent(backend_url)
    u = user()
    existing = insert_threads(reader, u, 40)
    seen: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()
    written: list[str] = []
    errors: list[BaseException] = []

    def write() -> None:
        try:
            while not stop.is_set():
                written.extend(insert_threads(writer, u, 2, prefix="new"))
                with lock:
                    moved = sorted(seen)[:2]
                for thread_id in moved:
                    touch(writer, thread_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    background = threading.Thread(target=write)
    background.start()
    try:
        listed: list[str] = []
        before = None
        while True:
            page = reader.list_threads(user_id=u, limit=4, before=before)
            if not page:
                break
            listed += ids(page)
            with lock:
                seen.update(ids(page))
            before = page[-1]["cursor"]
            stop.wait(0.01)
    finally:
        stop.set()
        background.join()
    assert not errors
    assert written, "the writer wrote nothing while the reader paged"
    assert len(listed) == len(set(listed)), "a thread was listed twice"
    assert set(existing) <= set(listed), f"skipped: {sorted(set(existing) - set(listed))}"
    # A fresh paging, with nobody writing, lists the new threads and the moved ones too.
    everything = page_all(reader, u, limit=100)
    assert sorted(everything) == sorted(existing + written)


def test_a_thread_id_as_before_pages_after_that_thread(agent):
    u = user()
    insert_threads(agent, u, 5)
    whole = ids(agent.list_threads(user_id=u))
    assert ids(agent.list_threads(user_id=u, before=whole[1])) == whole[2:]
    other = user()
    with pytest.raises(InvalidRequest, match="before"):  # not theirs: a bad position, worded as an unknown id
        agent.list_threads(user_id=other, before=whole[1])


@pytest.mark.parametrize(
    "bad",
    [{"limit": 0}, {"limit": 101}, {"before": "t1.not-base64!"}, {"before": 5}, {"metadata": {"k": 1}}, {"metadata": {"k" * 65: "v"}},
     {"title_contains": 5}, {"title_contains": "x" * 257}],  # fmt: skip
)
def test_bad_listing_arguments_are_invalid_requests(agent, bad):
    with pytest.raises(InvalidRequest):
        agent.list_threads(user_id=user(), **bad)


# -- update_thread -----------------------------------------------------------------------------------
def test_update_thread_sets_title_replaces_metadata_and_keeps_the_activity_order(agent):
    u = user()
    older = outputs(say(agent, "first thread", user_id=u, metadata={"a": "1", "b": "2"}))["thread_id"]
    newer = outputs(say(agent, "second thread", user_id=u))["thread_id"]
    before = agent.get_thread(older, user_id=u)
    changed = agent.update_thread(older, title="  Renamed  ", metadata={"c": "3"}, ttl_seconds=3600, user_id=u)
    assert changed["title"] == "Renamed"
    assert changed["metadata"] == {"c": "3"}  # replaced, not merged
    assert changed["ttl_seconds"] == 3600
    assert changed["updated_at"] == before["updated_at"]
    assert agent.get_thread(older, user_id=u) == changed
    assert ids(agent.list_threads(user_id=u)) == [newer, older]
    # None leaves a field alone.
    assert agent.update_thread(older, title="Again", user_id=u)["metadata"] == {"c": "3"}


@pytest.mark.parametrize(
    "bad",
    [
        {"title": ""},
        {"title": "   "},
        {"title": "x" * 257},
        {"title": "line\nbreak"},
        {"title": 5},
        {"metadata": {f"k{i}": "v" for i in range(17)}},
        {"metadata": {"k" * 65: "v"}},
        {"metadata": {"": "v"}},
        {"metadata": {"k": "v" * 513}},
        {"metadata": {"k": 1}},
        {"metadata": ["k", "v"]},
        {"metadata": {"k": "nul\x00"}},
        {"ttl_seconds": 0},
        {"ttl_seconds": -1},
        {"ttl_seconds": True},
        {"ttl_seconds": float("inf")},
        {"ttl_seconds": "60"},
        # A valid field beside a bad one: nothing of either is written.
        {"title": "fine", "metadata": {"k": "v" * 513}},
    ],
)
def test_an_invalid_update_writes_nothing(agent, bad):
    u = user()
    thread_id = outputs(say(agent, "keep me", user_id=u, metadata={"a": "1"}))["thread_id"]
    before = agent.get_thread(thread_id, user_id=u)
    with pytest.raises(InvalidRequest):
        agent.update_thread(thread_id, user_id=u, **bad)
    assert agent.get_thread(thread_id, user_id=u) == before


def test_the_metadata_limits_are_openais(agent):
    u = user()
    thread_id = outputs(say(agent, "limits", user_id=u))["thread_id"]
    most = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    assert agent.update_thread(thread_id, metadata=most, user_id=u)["metadata"] == most
    with pytest.raises(InvalidRequest):
        say(agent, "too much", user_id=u, metadata={**most, "one": "more"})


def test_another_users_thread_is_not_found_and_is_not_changed(agent):
    owner, stranger = user(), user()
    thread_id = outputs(say(agent, "mine", user_id=owner))["thread_id"]
    before = agent.get_thread(thread_id, user_id=owner)
    with pytest.raises(ThreadNotFound):
        agent.get_thread(thread_id, user_id=stranger)
    with pytest.raises(ThreadNotFound):
        agent.get_thread(thread_id)  # anonymous
    with pytest.raises(ThreadNotFound):
        agent.update_thread(thread_id, title="stolen", user_id=stranger)
    with pytest.raises(ThreadNotFound):
        agent.get_thread("no-such-thread", user_id=owner)
    assert agent.get_thread(thread_id, user_id=owner) == before


# -- actions -----------------------------------------------------------------------------------------
def test_the_catalogue_actions_work_through_predict(agent):
    u = user()
    made = [outputs(say(agent, f"thread {i}", user_id=u))["thread_id"] for i in range(3)]
    first = outputs(agent.predict(request(action="list_threads", user_id=u, limit=2)))
    assert ids(first["threads"]) == made[:0:-1]
    second = outputs(agent.predict(request(action="list_threads", user_id=u, limit=2, before=first["next_before"])))
    assert ids(second["threads"]) == [made[0]] and second["next_before"] is None

    got = outputs(agent.predict(request(action="get_thread", thread_id=made[0], user_id=u)))
    assert got["thread"] == agent.get_thread(made[0], user_id=u)
    updated = outputs(
        agent.predict(request(action="update_thread", thread_id=made[0], user_id=u, title="T", metadata={"k": "v"}))
    )
    assert (updated["thread"]["title"], updated["thread"]["metadata"]) == ("T", {"k": "v"})
    filtered = outputs(agent.predict(request(action="list_threads", user_id=u, metadata={"k": "v"})))
    assert ids(filtered["threads"]) == [made[0]]
    streamed = list(agent.predict_stream(request(action="get_thread", thread_id=made[1], user_id=u)))
    assert streamed[-1].custom_outputs["thread"]["thread_id"] == made[1]


# -- over HTTP -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("catalogue_http")
    port = free_port()
    env = {"AGENT_DATABASE_URL": f"sqlite:///{cwd / 'checkpoints.sqlite'}", "AGENT_MODEL": "offline", "AGENT_TRACING": "false"}
    command = [sys.executable, "-m", "agent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with server_process(command, port=port, health_path="/health", env=env, cwd=cwd) as base_url:
        with httpx.Client(base_url=base_url, timeout=60) as http, openai.OpenAI(
            base_url=base_url, api_key="unused", max_retries=0
        ) as client:
            yield SimpleNamespace(http=http, openai=client)


def _responses(server, **custom_inputs):
    return server.openai.responses.create(model="timetravel-agent", input=[], extra_body={"custom_inputs": custom_inputs})


@pytest.mark.slow
def test_the_catalogue_over_http_with_the_openai_client_and_invocations(server):
    u = user()
    created = server.openai.responses.create(
        model="timetravel-agent",
        input=[{"role": "user", "content": "A trip to Lisbon"}], extra_body={"custom_inputs": {"user_id": u, "metadata": {"app": "web"}}}
    )
    thread_id = created.custom_outputs["thread_id"]
    listed = _responses(server, action="list_threads", user_id=u).custom_outputs
    assert ids(listed["threads"]) == [thread_id]
    assert listed["threads"][0]["title"] == "A trip to Lisbon" and listed["threads"][0]["metadata"] == {"app": "web"}

    response = server.http.post(
        "/invocations",
        json={"input": [], "custom_inputs": {"action": "update_thread", "thread_id": thread_id, "user_id": u, "title": "Lisbon"}},
    )
    assert response.status_code == 200, response.text
    assert response.json()["custom_outputs"]["thread"]["title"] == "Lisbon"
    got = _responses(server, action="get_thread", thread_id=thread_id, user_id=u).custom_outputs["thread"]
    assert got["title"] == "Lisbon"


@pytest.mark.slow
def test_another_users_thread_is_a_404_over_http_and_a_bad_update_a_400(server):
    owner = user()
    thread_id = server.openai.responses.create(
        model="timetravel-agent",
        input=[{"role": "user", "content": "private"}], extra_body={"custom_inputs": {"user_id": owner}}
    ).custom_outputs["thread_id"]
    for action, extra in (("get_thread", {}), ("update_thread", {"title": "stolen"})):
        with pytest.raises(openai.NotFoundError):
            _responses(server, action=action, thread_id=thread_id, user_id=user(), **extra)
        response = server.http.post(
            "/invocations", json={"input": [], "custom_inputs": {"action": action, "thread_id": thread_id, "user_id": user(), **extra}}
        )
        assert response.status_code == 404, response.text
        assert "Traceback" not in response.text
    with pytest.raises(openai.BadRequestError):
        _responses(server, action="update_thread", thread_id=thread_id, user_id=owner, metadata={"k": "v" * 513})
    thread = _responses(server, action="get_thread", thread_id=thread_id, user_id=owner).custom_outputs["thread"]
    assert (thread["title"], thread["metadata"]) == ("private", {})


# -- tt-agent threads ----------------------------------------------------------------------------------
def test_tt_agent_threads_lists_pages_shows_renames_and_updates(tmp_path, make_agent):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    env = {"AGENT_DATABASE_URL": url}
    agent = make_agent(url)
    u = user()
    made = [outputs(say(agent, f"Question number {i}", user_id=u, metadata={"n": str(i)}))["thread_id"] for i in range(3)]
    agent.close()

    listed = run_cli("threads", "--user-id", u, "--json", "--limit", "2", cwd=tmp_path, env=env)
    assert_clean_success(listed)
    first = json.loads(listed.stdout)
    assert ids(first["threads"]) == made[:0:-1]
    rest = run_cli("threads", "--user-id", u, "--json", "--before", first["next_before"], cwd=tmp_path, env=env)
    assert ids(json.loads(rest.stdout)["threads"]) == [made[0]]
    table = run_cli("threads", "--user-id", u, "--metadata", "n=1", cwd=tmp_path, env=env)
    assert_clean_success(table)
    assert made[1] in table.stdout and "Question number 1" in table.stdout and made[0] not in table.stdout

    renamed = run_cli("threads", "rename", made[0], "My first question", "--user-id", u, "--json", cwd=tmp_path, env=env)
    assert_clean_success(renamed)
    assert json.loads(renamed.stdout)["title"] == "My first question"
    updated = run_cli(
        "threads", "update", made[0], "--metadata", "app=cli", "--ttl-seconds", "60", "--user-id", u, "--json", cwd=tmp_path, env=env
    )
    assert_clean_success(updated)
    assert (json.loads(updated.stdout)["metadata"], json.loads(updated.stdout)["ttl_seconds"]) == ({"app": "cli"}, 60)
    shown = run_cli("threads", "show", made[0], "--user-id", u, cwd=tmp_path, env=env)
    assert_clean_success(shown)
    assert "My first question" in shown.stdout and "app=cli" in shown.stdout

    stranger = run_cli("threads", "rename", made[0], "stolen", "--user-id", user(), cwd=tmp_path, env=env)
    assert stranger.returncode == 1 and "was not found" in stranger.stderr and "Traceback" not in stranger.stderr
    bad = run_cli("threads", "update", made[0], "--title", "", "--user-id", u, cwd=tmp_path, env=env)
    assert bad.returncode == 1 and "title" in bad.stderr


def test_tt_agent_threads_in_a_directory_without_a_store_creates_none(tmp_path):
    result = run_cli("threads", cwd=tmp_path)
    assert result.returncode == 1 and "There is no store" in result.stderr
    assert not (tmp_path / ".agent").exists()
