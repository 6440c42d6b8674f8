"""How the suite is spread over pytest-xdist workers: a plugin, loaded by `tests/conftest.py`.

Most of the suite's time is servers, subprocesses and databases that a module starts once and then
only reads (a `tt-agent serve` process, a logged MLflow model, a built documentation site). Under
xdist's default `--dist load`, a module's tests are dealt out to every worker, and each worker
starts the module's server again. `scripts/test.sh` runs with `--dist loadgroup`, and this plugin
puts each such module into one group (`xdist_group`), so it runs on one worker and starts its
servers once; every other test stays a unit of its own, free to go to whichever worker is idle.

The group of a test is its module when it uses a fixture of module, class, package or session
scope defined in the module itself (a conftest's session fixture, such as the session's Postgres
database, is per worker anyway and does not count). An explicit `xdist_group` mark wins, and
without `--dist loadgroup` the marks change nothing.

The order: xdist hands out the units in collection order (`scripts/test.sh` passes
`--no-loadscope-reorder`: xdist's own reordering sorts by number of tests, which says nothing about
time). Under loadgroup this plugin moves the units that start processes (the groups, and the tests
marked `slow`) before the in-process tests, and before those the few units marked `longest` (each
a minute or more of one worker), keeping the collection order within each kind: the long units
start first, and the short ones fill the workers at the end instead of one long test ending the
run alone. (Until 2026-12-06 the sort ran on the controller only, where it changes nothing: the
workers' collection, in pytest's order, was scheduled, and tests/web/'s module, a minute of one
worker, started when the others had nearly finished and ran alone for the run's last 40 s.)
"""

from __future__ import annotations

import pytest

_SHARED_SCOPES = {"module", "class", "package", "session"}


def module_group(item: pytest.Item) -> str | None:
    """The module's node id when `item` uses a fixture wider than a function defined in its module, else None."""
    module_id = item.nodeid.split("::", 1)[0]
    # `_fixtureinfo` is where pytest keeps a test's fixture closure; plugins such as pytest-xdist read it too.
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        for definition in definitions:
            if definition.scope in _SHARED_SCOPES and definition.baseid == module_id:
                return module_id
    return None


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist declares the mark itself; without xdist (`-p no:xdist`), --strict-markers needs it declared.
    config.addinivalue_line("markers", "xdist_group(name): run the tests of one group on one pytest-xdist worker")
    config.addinivalue_line(
        "markers", "longest: one of the suite's longest units (a minute or more of one worker); scheduled first"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: xdist reads the marks in its own hook of the same name, to append `@group` to the node ids.
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := module_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if _loadgroup(config):
        # A stable sort: within each kind, pytest's order (which keeps a module's fixtures together) stays.
        items.sort(key=lambda item: (item.get_closest_marker("longest") is None, not starts_processes(item)))


def _loadgroup(config: pytest.Config) -> bool:
    # The order that counts is the workers': the controller schedules the collection they send. xdist sets a
    # worker's `dist` to "no" and keeps what it was in `loadgroup` (xdist/remote.py), so `dist` alone left
    # the workers' order as collected.
    return config.getoption("dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False)


def starts_processes(item: pytest.Item) -> bool:
    """Whether the test is one of the long kind: in a group, or marked `slow`."""
    return item.get_closest_marker("xdist_group") is not None or item.get_closest_marker("slow") is not None
