"""The core runs with nothing but torch, NumPy, scikit-learn and Matplotlib (and what they
require): `import fedhet`, `python -m fedhet run` and `list` from a checkout
(`PYTHONPATH=src`) on a machine without tqdm, Flower, Ray or TensorBoard, as a GPU machine
with its own CUDA torch is. A child process refuses every other third-party import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

CORE = ("torch", "numpy", "scikit-learn", "matplotlib")
"""The distributions the core may use: a machine with only these (and their requirements)."""

CHILD = r"""
import importlib.abc, importlib.metadata as md, json, re, runpy, sys

core, out = json.loads(sys.argv[1]), sys.argv[2]

def closure(names):
    seen, todo = set(), [n.lower() for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req or "extra==" in req:
                continue
            todo.append(re.split(r"[ ;<>=!~\[(]", req.strip(), maxsplit=1)[0].lower())
    return seen

allowed_dists = {d.replace("_", "-") for d in closure(core)}
allowed = set(sys.stdlib_module_names) | {"fedhet", "_distutils_hack"}
for top, dists in md.packages_distributions().items():
    if any(d.lower().replace("_", "-") in allowed_dists for d in dists):
        allowed.add(top)
blocked = []

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in allowed and not top.startswith("_"):
            blocked.append(top)
            raise ModuleNotFoundError(f"No module named {top!r} (test_optional_imports)", name=top)
        return None

sys.meta_path.insert(0, Block())
for name in ("tqdm", "flwr", "ray", "tensorboard"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the blocker let {name} through")

import fedhet  # noqa: E402
from fedhet.cli import main  # noqa: E402

sys.argv = ["fedhet", "run", "-a", "fedavg", "-d", "digits", "-n", "3", "-r", "2",
            "--workers", "1", "--out", out]
try:
    runpy.run_module("fedhet", run_name="__main__")
except SystemExit as e:
    assert e.code == 0, e.code
assert main(["list"]) == 0
print("BLOCKED " + json.dumps(sorted(set(blocked))))
"""


def test_the_core_runs_without_any_optional_extra(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "FEDHET_CORES": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(CORE), str(out)], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final accuracy" in proc.stdout and "\nalgorithms (--algorithm" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] is True and summary["rounds_done"] == 2
    blocked = json.loads(proc.stdout.rsplit("BLOCKED ", 1)[1])
    assert {"tqdm", "flwr", "ray", "tensorboard"} <= set(blocked)


def test_without_tqdm_the_progress_is_a_plain_line_per_round(tmp_path, monkeypatch, capsys):
    import fedhet.engine.callbacks as callbacks
    from fedhet.runs.single import execute

    monkeypatch.setattr(callbacks, "tqdm", None)
    execute({"rounds": 2, "clients": 3, "workers": 1}, tmp_path / "run", progress=True,
            log=lambda _: None)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(" acc=")[0] for line in lines] == ["round 1/2", "round 2/2"]
    assert all("loss=" in line for line in lines)
