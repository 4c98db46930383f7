"""CONTRIBUTING.md runs as written: its algorithm, dataset, model and paper examples in an empty
directory, and its test commands name tests that exist.

A ```python block whose first line is `# file: NAME` is written to NAME (folders made); every
other ```python block runs in one namespace; each ```bash block runs through bash with this
interpreter's `fedhet` first on PATH; each ```console line that runs pytest is collected (not
run: the covered-algorithm tests take minutes) from the repository root, with its `-k` dropped
(the example's algorithm is a plugin of the empty directory, not a module of the tree)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "CONTRIBUTING.md"
BLOCK = re.compile(r"^```(python|bash|console)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_page_walks_an_algorithm_a_dataset_a_model_and_a_paper_and_is_linked():
    text = DOC.read_text()
    for heading in ("## Adding an algorithm", "## Adding a dataset", "## Adding a model",
                    "## Adding a paper"):
        assert heading in text
    files = [code.split("\n", 1)[0] for kind, code in blocks() if code.startswith("# file: ")]
    assert files == ["# file: halfavg.py", "# file: blobs.py", "# file: tinynet.py",
                     "# file: papers/toypaper/__init__.py", "# file: papers/toypaper/preset.py",
                     "# file: papers/toypaper/paper.py"]
    assert "(CONTRIBUTING.md)" in (ROOT / "README.md").read_text()


def test_every_example_of_the_contributing_page_runs(tmp_path, monkeypatch, own_registrations):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), "OMP_NUM_THREADS": "1"}
    env.pop("FEDHET_PAPERS", None)
    namespace: dict = {"__name__": "__contributing_doc__"}
    for i, (kind, code) in enumerate(blocks()):
        if kind == "python" and code.startswith("# file: "):
            target = tmp_path / code.split("\n", 1)[0].removeprefix("# file: ").strip()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code)
        elif kind == "python":
            exec(compile(code, f"{DOC.name} block {i}", "exec"), namespace)
        elif kind == "bash":
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=300)
            if done.returncode:
                pytest.fail(f"block {i} failed:\n{code}\n{done.stdout}\n{done.stderr}")
    assert (tmp_path / "runs" / "mine" / "metrics.csv").stat().st_size > 0
    assert (tmp_path / "runs" / "toy" / "results.csv").stat().st_size > 0


def _pytest_commands() -> list[list[str]]:
    commands = []
    for kind, code in blocks():
        if kind != "console":
            continue
        for line in code.splitlines():
            argv = shlex.split(line)
            if argv[:3] == ["python", "-m", "pytest"]:
                if "-k" in argv:
                    at = argv.index("-k")
                    del argv[at:at + 2]
                commands.append(argv[3:])
    return commands


def test_the_pages_test_commands_name_tests_that_exist():
    commands = _pytest_commands()
    assert len(commands) >= 6
    for argv in commands:
        files = [a for a in argv if a.startswith("tests/")]
        assert files and all((ROOT / f).is_file() for f in files), argv
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                               "-p", "no:cacheprovider", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
