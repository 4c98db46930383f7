"""Shared test settings: slow tests run only with FEDHET_SLOW=1; one torch thread per test run."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import tempfile
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
# `--workers auto` is 1 in every test whatever the machine's cores (a test that patches client
# code to record into this process would see nothing from worker processes); the tests of
# `auto` set FEDHET_CORES themselves (tests/test_workers.py)
os.environ["FEDHET_CORES"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the tests that read the cluster harness's report run last: the harness (minutes of Ray
    # nodes and grids, tests/cluster_harness.py) runs meanwhile, beside the other tests (under
    # pytest-xdist, on one worker: `pytest_xdist_make_scheduler`, below)
    items.sort(key=lambda item: "cluster" in getattr(item, "fixturenames", ()))
    if os.environ.get("FEDHET_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: set FEDHET_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# -- the cluster harness: started once a session ----------------------------------------------
# One process (`pytest` alone, or `pytest -n 0`): started when the tests are collected, stopped
# when the session ends. pytest-xdist (`-n 2`): the controller owns it. It names a directory
# of its own to every worker (`workerinput`); a worker that collected a test reading the report
# says so there (`wanted`) before it tells the controller that collection is done; the
# controller then starts the harness in SHARED/cluster, and a worker's `cluster` fixture waits
# for the controller's verdict (`cluster_harness.DONE`) once the harness has ended.

_HARNESS: list = []
"""The cluster harness (`cluster_harness.Background`) once started: at most one a session, in
the process that runs it (pytest alone, or xdist's controller)."""

_SHARED_KEY = "fedhet_shared"
"""`workerinput` key: the directory xdist's controller made for its workers (`wanted`,
`units.json`, and the harness's work directory `cluster`)."""


def _unit(item: pytest.Item) -> str | None:
    """The unit of work `item` goes to a worker with, under `make test` (`--dist loadgroup`,
    `pytest_xdist_make_scheduler`): "cluster" for the tests that wait for the cluster harness
    (one worker waits, the other goes on), its module for a test using a module-scoped fixture
    (made once, not once a worker), None for one on its own."""
    if "cluster" in getattr(item, "fixturenames", ()):
        return "cluster"
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d and d[-1].scope in ("class", "module", "package") for d in defs.values()):
        return item.nodeid.split("::")[0]
    return None


def _wanted(session: pytest.Session) -> bool:
    """Does a test to run read the harness's report, with Ray installed (those tests are skipped
    without it)?"""
    return any("cluster" in getattr(item, "fixturenames", ()) for item in session.items) \
        and importlib.util.find_spec("ray") is not None and not session.config.option.collectonly


def _start_harness(config: pytest.Config, work: Path | None = None):  # noqa: ANN202
    from cluster_harness import Background

    if work is None:
        factory = getattr(config, "_tmp_path_factory", None)
        work = factory.mktemp("cluster") if factory else Path(tempfile.mkdtemp(prefix="fedhet-cluster-"))
    _HARNESS.append(Background(work))
    return _HARNESS[-1]


@pytest.hookimpl(tryfirst=True)  # a worker: before xdist tells the controller it has collected
def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the cluster harness now, in the background, when a test to run reads its report
    (under xdist: ask the controller to, and tell it the units of work)."""
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None:
        if _wanted(session) and not _HARNESS:
            _start_harness(session.config)
        return
    shared = Path(workerinput[_SHARED_KEY])
    units = {item.nodeid: unit for item in session.items if (unit := _unit(item))}
    mine = shared / f"units.{workerinput['workerid']}"
    mine.write_text(json.dumps(units))
    mine.replace(shared / "units.json")  # whole, whichever worker writes it last
    if _wanted(session):
        (shared / "wanted").touch()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001  (xdist's controller, for each worker)
    if not hasattr(node.config, "_fedhet_shared"):
        node.config._fedhet_shared = node.config._tmp_path_factory.mktemp("xdist")
        (node.config._fedhet_shared / "cluster").mkdir()
    node.workerinput[_SHARED_KEY] = str(node.config._fedhet_shared)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:  # noqa: ANN001
    """xdist's controller, as each worker has collected: start the harness once, if wanted."""
    shared = node.config._fedhet_shared
    if not _HARNESS and (shared / "wanted").exists():
        _start_harness(node.config, shared / "cluster")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    """`--dist loadgroup` (`make test`): xdist's load-group scheduling with the units of
    `_unit`, handed out in collection order (the cluster's unit last), each to whichever worker
    has run out. (xdist 3.8 groups `xdist_group`-marked tests by rewriting their node IDs, which
    pytest 9.2's structured IDs ignore: pytest-xdist issue #1386; the units are made here
    instead, from the node IDs a worker wrote to the shared directory.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Units(LoadGroupScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # workers wrote it before they said they had collected
                path = config._fedhet_shared / "units.json"
                self.units = json.loads(path.read_text()) if path.exists() else {}
            return self.units.get(nodeid) or super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # biggest unit first would put the cluster's first
    return Units(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for harness in _HARNESS:  # a session that ends first (-x, Ctrl-C) stops it
        harness.stop()


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> tuple[Path, dict]:
    """The cluster harness's work directory and report, once it has run (it is started when the
    tests are collected; tests/cluster_harness.py and tests/test_cluster.py)."""
    from cluster_harness import wait_result

    workerinput = getattr(pytestconfig, "workerinput", None)
    if workerinput is not None:  # the controller runs it (and says when it is done)
        return wait_result(Path(workerinput[_SHARED_KEY]) / "cluster")
    harness = _HARNESS[0] if _HARNESS else _start_harness(pytestconfig)
    return harness.result()


@pytest.fixture(autouse=True)
def _sigint_left_as_found():
    """Every test leaves SIGINT as it found it, its handler and the signal mask: child processes
    inherit an ignored or blocked SIGINT through exec, and a later test's `fedhet run` would then
    not stop on Ctrl-C. A test that leaks one fails (and the state is put back)."""
    handler = signal.getsignal(signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    leaked = []
    if signal.getsignal(signal.SIGINT) != handler:
        leaked.append(f"the SIGINT handler ({signal.getsignal(signal.SIGINT)!r}, was {handler!r})")
        signal.signal(signal.SIGINT, handler)
    now = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if now != mask:
        leaked.append(f"the signal mask ({sorted(now)}, was {sorted(mask)})")
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if leaked:
        pytest.fail("the test changed " + " and ".join(leaked), pytrace=False)


@pytest.fixture
def own_registrations():
    """Components a test registers (a plugin it loads, a class it hands in) are gone after it:
    each registry's entries and resolved names are restored, so tests that register the same
    name (`my-avgm`) in one process do not meet."""
    # the registries fill when their packages are imported: only the fixture needs them
    from fedhet import plugins
    from fedhet.components import _LIVE, REGISTRIES
    from fedhet.data.partition import PARTITIONS
    from fedhet.metrics import METRICS

    registries = [*REGISTRIES.values(), PARTITIONS, METRICS]
    saved = [(dict(r._entries), dict(r._resolved)) for r in registries]
    live, loaded = dict(_LIVE), dict(plugins._LOADED)
    yield
    plugins._LOADED.clear()
    plugins._LOADED.update(loaded)
    for registry, (entries, resolved) in zip(registries, saved, strict=True):
        registry._entries.clear()
        registry._entries.update(entries)
        registry._resolved.clear()
        registry._resolved.update(resolved)
    _LIVE.clear()
    _LIVE.update(live)
