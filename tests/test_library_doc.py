"""docs/library.md runs as written: every code block, in order, in an empty directory.

A ```python block whose first line is `# file: NAME` is written to NAME; every other ```python
block runs in one namespace (as cells of a notebook would); each ```bash block runs through
bash with this interpreter's `fedhet` first on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "library.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_page_has_python_file_and_shell_blocks():
    kinds = [kind for kind, _ in blocks()]
    assert kinds.count("python") >= 8 and kinds.count("bash") >= 2
    assert any(code.startswith("# file: ") for _, code in blocks())


def test_every_code_block_of_the_library_page_runs(tmp_path, monkeypatch, own_registrations):
    # as in a fresh process: no component another test's plugin or script registered (a
    # session-wide plugin also names its algorithm `my-avgm`); `own_registrations` restores them
    from fedhet import plugins
    from fedhet.components import REGISTRIES
    from fedhet.metrics import METRICS

    for registry in (*REGISTRIES.values(), METRICS):
        for entry in list(registry):
            if entry.source != "fedhet":
                registry.unregister(entry.name)
    plugins._LOADED.clear()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    namespace: dict = {"__name__": "__library_doc__"}
    for i, (kind, code) in enumerate(blocks()):
        if kind == "python" and code.startswith("# file: "):
            name = code.split("\n", 1)[0].removeprefix("# file: ").strip()
            (tmp_path / name).write_text(code)
        elif kind == "python":
            exec(compile(code, f"{DOC.name} block {i}", "exec"), namespace)
        else:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=300)
            if done.returncode:
                pytest.fail(f"block {i} failed:\n{code}\n{done.stdout}\n{done.stderr}")
    assert (tmp_path / "grid.png").stat().st_size > 0
    assert (tmp_path / "runs" / "cli-avgm-report").is_dir()
