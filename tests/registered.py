"""The cases of the tests that cover every registered algorithm (tests/test_executors.py,
test_devices.py, test_states.py, test_workers.py, test_flower.py, test_report.py), built from the
registry: an algorithm the hand-written cases of a test do not name gets the case
`{"algorithm": name, **example}`, `example` being the settings it declared when it registered
(`@ALGORITHMS.register(name, Params, doc, example={...})`, `fedhet.algorithms.base.ALGORITHMS`).
A new algorithm is so covered without editing a test; where its case fails, `explained` says
what to add and where (CONTRIBUTING.md, "Adding an algorithm")."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from fedhet.algorithms.base import ALGORITHMS


def example(name: str) -> dict[str, Any]:
    """The settings algorithm `name` declared that a small run of it needs (`{}` if none)."""
    return dict(ALGORITHMS.get(name).trait("example", {}))


def shipped() -> list[str]:
    """fedhet's own algorithms (not those a plugin or another test registered)."""
    return sorted(entry.name for entry in ALGORITHMS if entry.source == "fedhet")


def every_algorithm(cases: Mapping[str, Mapping[str, Any]], *, names: Callable[[], list[str]] = shipped,
                    ) -> dict[str, dict[str, Any]]:
    """`cases` (`{case: settings}`, a case's algorithm is its `"algorithm"` or its key) and a
    case from the registry for each algorithm of `names()` they do not name."""
    named = {case.get("algorithm", key) for key, case in cases.items()}
    built = {name: {"algorithm": name, **example(name)} for name in names() if name not in named}
    return {**{k: dict(v) for k, v in cases.items()}, **built}


def from_registry(case: str, cases: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether `case` is one `every_algorithm` built (not written in the test)."""
    return case in ALGORITHMS and case not in cases


@contextmanager
def explained(case: str, test_file: str, hand_written: Mapping[str, Mapping[str, Any]]) -> Iterator[None]:
    """Around a run of `case`: when it is a case built from the registry and the run fails, the
    test fails with one message saying what to add and where."""
    try:
        yield
    except Exception as e:
        if not from_registry(case, hand_written):
            raise
        pytest.fail(
            f"algorithm {case!r} has no case of its own in {test_file}, so it ran with the test's "
            f"BASE settings and its registered example {example(case)!r}, and failed: "
            f"{type(e).__name__}: {e}. Declare the settings a small run of it needs when it "
            f"registers (`@ALGORITHMS.register({case!r}, Params, doc, example={{'model': ...}})`), "
            f"or add a case for it to {test_file} (CONTRIBUTING.md, \"Adding an algorithm\")",
            pytrace=False,
        )
