"""The public API is typed for mypy (and so for an IDE): a name reached through `fedhet`,
`fedhet.engine` or `fedhet.runs` is the real object, not `Any`, so a wrong argument is an error
where it is written (skipped where mypy is not installed: `pip install -e .[dev]` brings it);
and the CI's baseline of mypy errors (.ci/mypy_check.py) lets none in and only shrinks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SNIPPET = """
import fedhet
from fedhet.engine import RunConfig
from fedhet.runs import execute

RunConfig(lr="fast", nonsense=1)
fedhet.RunConfig(rounds="ten")
fedhet.run(algorithm="fedavg", rounds="ten")
execute({}, "runs/x", resumed=True)
fedhet.no_such_name
ok: float = fedhet.open_run("runs/x").final_accuracy
"""


def test_mypy_sees_the_real_objects_behind_the_public_surfaces(tmp_path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "user_code.py"
    snippet.write_text(textwrap.dedent(SNIPPET))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "--no-pretty", "--no-error-summary",
         "--hide-error-context", str(snippet)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    errors = [line.split(": error: ", 1)[1] for line in done.stdout.splitlines() if ": error: " in line]
    expected = [
        'Argument "lr" to "RunConfig" has incompatible type "str"; expected "float"  [arg-type]',
        'Unexpected keyword argument "nonsense" for "RunConfig"  [call-arg]',
        'Argument "rounds" to "RunConfig" has incompatible type "str"; expected "int"  [arg-type]',
        'Argument "rounds" to "run" has incompatible type "str"; expected "int"  [arg-type]',
        'Unexpected keyword argument "resumed" for "execute"; did you mean "resume"?  [call-arg]',
        'Argument 2 to "execute" has incompatible type "str"; expected "Path"  [arg-type]',
        'Module has no attribute "no_such_name"  [attr-defined]',
    ]
    assert sorted(errors) == sorted(expected), done.stdout + done.stderr


def _checker():
    spec = importlib.util.spec_from_file_location("mypy_check", ROOT / ".ci" / "mypy_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_baseline_counts_errors_by_file_and_message_not_by_line():
    check = _checker()
    output = (
        "src/fedhet/a.py:3: error: Name \"x\" already defined on line 1  [no-redef]\n"
        "src/fedhet/a.py:9: note: see here\n"
        "src/fedhet/a.py:12: error: Name \"x\" already defined on line 7  [no-redef]\n"
        "src/fedhet/b.py:4:5: error: Incompatible types  [assignment]\n"
    )
    assert check.errors(output) == Counter({
        'src/fedhet/a.py: Name "x" already defined on line N  [no-redef]': 2,
        "src/fedhet/b.py: Incompatible types  [assignment]": 1,
    })


def test_a_new_error_fails_a_fixed_one_asks_to_shrink_and_the_public_api_allows_none():
    check = _checker()
    baseline = Counter({"src/fedhet/a.py: E  [x]": 2, "src/fedhet/b.py: F  [y]": 1,
                        "src/fedhet/api.py: G  [z]": 1})
    assert check.compare(baseline, baseline) == (["src/fedhet/api.py: G  [z]"], [])
    found = Counter({"src/fedhet/a.py: E  [x]": 3})
    new, fixed = check.compare(found, baseline)
    assert new == ["src/fedhet/a.py: E  [x]"]  # a third where two were known
    assert fixed == ["src/fedhet/api.py: G  [z]", "src/fedhet/b.py: F  [y]"]
    assert check.PUBLIC[:1] == ("src/fedhet/__init__.py",)
