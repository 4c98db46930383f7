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
    # nodes and grids, tests/cluster_harness.py) runs meanwhile, beside the other tests
    items.sort(key=lambda item: "cluster" in getattr(item, "fixturenames", ()))
    if os.environ.get("FEDHET_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow test: set FEDHET_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


_HARNESS: list = []
"""The cluster harness (`cluster_harness.Background`) once started: at most one a session."""


def _start_harness(config: pytest.Config):  # noqa: ANN202
    from cluster_harness import Background

    factory = getattr(config, "_tmp_path_factory", None)
    work = factory.mktemp("cluster") if factory else Path(tempfile.mkdtemp(prefix="fedhet-cluster-"))
    _HARNESS.append(Background(work))
    return _HARNESS[-1]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the cluster harness now, in the background, when a test to run reads its report
    and Ray is installed (those tests are skipped without it)."""
    wanted = any("cluster" in getattr(item, "fixturenames", ()) for item in session.items)
    if wanted and not _HARNESS and importlib.util.find_spec("ray") is not None \
            and not session.config.option.collectonly:
        _start_harness(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for harness in _HARNESS:  # a session that ends first (-x, Ctrl-C) stops it
        harness.stop()


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> tuple[Path, dict]:
    """The cluster harness's work directory and report, once it has run (it is started when the
    tests are collected; tests/cluster_harness.py and tests/test_cluster.py)."""
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
