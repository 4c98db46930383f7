"""Shared test settings: slow tests run only with FEDHET_SLOW=1; one torch thread per test run."""

from __future__ import annotations

import importlib.util
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
# when the session ends. pytest-xdist (`-n 2`): the controller owns it. It names a work
# directory to every worker (`workerinput`); a worker that collected a test reading the report
# says so there (`wanted`) before it tells the controller that collection is done; the
# controller then starts the harness in that directory, and a worker's `cluster` fixture waits
# for the controller's verdict (`cluster_harness.DONE`) once the harness has ended.

_HARNESS: list = []
"""The cluster harness (`cluster_harness.Background`) once started: at most one a session, in
the process that runs it (pytest alone, or xdist's controller)."""

_WORK_KEY = "fedhet_cluster_work"
"""`workerinput` key: the harness's work directory, made by xdist's controller."""


def _wanted(session: pytest.Session) -> bool:
    """Does a test to run read the harness's report, with Ray installed (those tests are skipped
    without it)?"""
    return bool(_cluster_tests(session)) and importlib.util.find_spec("ray") is not None \
        and not session.config.option.collectonly


def _cluster_tests(session: pytest.Session) -> list[str]:
    return [item.nodeid for item in session.items if "cluster" in getattr(item, "fixturenames", ())]


def _work_dir(config: pytest.Config) -> Path:
    factory = getattr(config, "_tmp_path_factory", None)
    return factory.mktemp("cluster") if factory else Path(tempfile.mkdtemp(prefix="fedhet-cluster-"))


def _start_harness(config: pytest.Config, work: Path | None = None):  # noqa: ANN202
    from cluster_harness import Background

    _HARNESS.append(Background(work or _work_dir(config)))
    return _HARNESS[-1]


@pytest.hookimpl(tryfirst=True)  # a worker: before xdist tells the controller it has collected
def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the cluster harness now, in the background, when a test to run reads its report
    (under xdist: ask the controller to)."""
    if not _wanted(session):
        return
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is not None:  # the tests that wait for it, for the controller's scheduler
        work = Path(workerinput[_WORK_KEY])
        mine = work / f"wanted.{workerinput['workerid']}"
        mine.write_text("\n".join(_cluster_tests(session)))
        mine.replace(work / "wanted")  # whole, whichever worker writes it last
    elif not _HARNESS:
        _start_harness(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001  (xdist's controller, for each worker)
    if not hasattr(node.config, "_fedhet_cluster_work"):
        node.config._fedhet_cluster_work = _work_dir(node.config)
    node.workerinput[_WORK_KEY] = str(node.config._fedhet_cluster_work)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:  # noqa: ANN001
    """xdist's controller, as each worker has collected: start the harness once, if wanted."""
    work = node.config._fedhet_cluster_work
    if not _HARNESS and (work / "wanted").exists():
        _start_harness(node.config, work)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    """`--dist loadgroup` (`make test`): xdist's load-group scheduling, each test a unit of its
    own, with the tests that wait for the cluster harness one unit (one worker waits, the other
    goes on), handed out in collection order, so that unit comes last. (xdist 3.8 groups
    `xdist_group`-marked tests by rewriting their node IDs, which pytest 9.2's structured IDs
    ignore: pytest-xdist issue #1386; the cluster group is made here instead, from the node IDs
    a worker wrote to the harness's work directory.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class WithClusterGroup(LoadGroupScheduling):
        cluster: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.cluster is None:  # workers wrote it before they said they had collected
                wanted = config._fedhet_cluster_work / "wanted"
                self.cluster = set(wanted.read_text().splitlines()) if wanted.exists() else set()
            return "cluster" if nodeid in self.cluster else super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # biggest unit first would put the cluster's first
    return WithClusterGroup(config, log)


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
        return wait_result(Path(workerinput[_WORK_KEY]))
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

    registries = [*REGISTRIES.values(), PARTITIONS]
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
