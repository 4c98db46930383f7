"""`fedhet compare` changed on the command line, as Hydra's multirun: setting flags and `--set`
fix a setting in every run (replacing the grid's value and its axis), `--sweep` makes axes, and
a grid can be written with no file at all; the grid machinery (duplicate cells, lock, resume)
is the same. Digits, 3 clients, 1 round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_errors import one_error_line

from fedhet.cli import main
from fedhet.runs.grid import load_grid

SWEEP = ["compare", "-a", "fedavg,FedProx", "-d", "digits", "-n", "3", "-r", "1",
         "--sweep", "lr=0.01,0.1", "--sweep", "seed=0,1", "-j", "1"]


def configs(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/config.json")}


def test_a_sweep_on_the_command_line_with_no_grid_file(tmp_path, capsys):
    out = tmp_path / "g"
    assert main([*SWEEP, "--out", str(out)]) == 0
    assert "8 runs" in capsys.readouterr().out
    runs = configs(out)
    assert sorted(runs) == sorted(f"{a}__lr={lr}__seed{s}" for a in ("fedavg", "fedprox")
                                  for lr in ("0.01", "0.1") for s in (0, 1))
    assert {(c["algorithm"], c["lr"], c["seed"]) for c in runs.values()} == {
        (a, lr, s) for a in ("fedavg", "fedprox") for lr in (0.01, 0.1) for s in (0, 1)}
    assert all(c["rounds"] == 1 and c["clients"] == 3 for c in runs.values())
    assert (out / ".fedhet").exists() and (out / "results.csv").is_file()
    # the grid it ran is saved as TOML: the same runs, and running that resumes (nothing reruns)
    assert [s.name for s in load_grid(out / "grid.toml").specs] == \
        [r["name"] for r in json.loads((out / "grid.json").read_text())["runs"]]
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/metrics.csv")}
    assert main(["compare", "-c", str(out / "grid.toml"), "--out", str(out), "-j", "1"]) == 0
    assert main([*SWEEP, "--out", str(out)]) == 0
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/metrics.csv")}


def test_set_overrides_a_grid_file_and_replaces_its_axis(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 3\nrounds = 5\nlr = 0.05\n'
                    '[axes]\nalgorithm = ["fedavg", "fedprox"]\nseed = [0, 1, 2]\n')
    out = tmp_path / "g"
    assert main(["compare", "-c", str(grid), "--set", "rounds=1", "--set", "seed=0", "--out",
                 str(out), "-j", "1"]) == 0
    runs = configs(out)
    assert sorted(runs) == ["fedavg__seed0", "fedprox__seed0"]
    assert all(c["rounds"] == 1 and c["lr"] == 0.05 for c in runs.values())
    saved = (out / "grid.toml").read_text()
    assert saved.startswith(f"# the grid {grid} with --set rounds, --set seed")
    # --sweep replaces the grid's axis of that setting, and a flag fixes one in every run
    out2 = tmp_path / "g2"
    assert main(["compare", "-c", str(grid), "-r", "1", "--sweep", "seed=3", "--sweep",
                 "lr=0.1,0.2", "--out", str(out2), "-j", "1"]) == 0
    assert {(c["algorithm"], c["seed"], c["lr"]) for c in configs(out2).values()} == {
        (a, 3, lr) for a in ("fedavg", "fedprox") for lr in (0.1, 0.2)}
    capsys.readouterr()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--sweep", "momentum=0.5,0.50"], "duplicate runs, the same cell twice"),
        (["--sweep", "lr=0.1,0.10"], "--sweep lr is given twice"),
        (["--set", "batch-size=0"], "error: --set batch_size: batch_size must be ≥ 1"),
        (["--sweep", "local-epochs=1,x"], "error: --sweep local_epochs: local_epochs must be a number"),
        (["--set", "learning_rate=0.1"], "(did you mean 'lr'?)"),
        (["--sweep", "lr"], "--sweep expects key=value1,value2"),
        (["--set", "seed=1"], "--sweep seed and --set seed both set seed"),
    ],
)
def test_command_line_grid_mistakes_are_one_line(tmp_path, capsys, extra, needle):
    out = tmp_path / "g"
    assert needle in one_error_line(capsys, [*SWEEP, *extra, "--out", str(out)])
    assert not (out / "runs").exists()


def test_compare_needs_a_grid_and_makes_its_own_directory(tmp_path, capsys, monkeypatch):
    assert main(["compare"]) == 2
    assert "compare needs a grid: --config GRID.toml" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "-a", "fedavg,fedprox", "-n", "3", "-r", "1", "-j", "1"]) == 0
    named = capsys.readouterr().err.split("grid directory: ")[1].split()[0]
    assert named.startswith("runs/fedavg+fedprox-digits-")
    assert sorted(configs(tmp_path / named)) == ["fedavg__seed0", "fedprox__seed0"]


def test_ctrl_c_names_the_command_with_the_directory_it_made(tmp_path):
    """Without --out, the line after Ctrl-C is the command that resumes: the same flags and the
    directory `compare` made."""
    import os
    import signal
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parent.parent / "src")
    argv = ["compare", "-a", "fedavg,fedprox", "-n", "3", "-r", "300", "-j", "1"]
    p = subprocess.Popen(
        [sys.executable, "-m", "fedhet", *argv], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1", "FEDHET_PROGRESS_SECONDS": "0"},
    )
    try:
        assert p.stderr is not None
        made = p.stderr.readline().removeprefix("grid directory: ").strip()
        for line in p.stderr:
            if " round 2/300 " in line:
                p.send_signal(signal.SIGINT)
                break
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 130 and made.startswith("runs/fedavg+fedprox-digits-")
    last = err.strip().splitlines()[-1]
    assert last.endswith(f"run `fedhet {' '.join(argv)} --out {made}` to resume"), last
    assert (tmp_path / made / "runs" / "fedavg__seed0" / "config.json").is_file()


def test_dry_run_lists_the_runs_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "-c", "grid-digits", "--set", "rounds=5", "--sweep", "seed=0",
                 "--dry-run"]) == 0
    title, *rows, shared = capsys.readouterr().out.strip().splitlines()
    assert title == "FedAvg vs FedAvgM on digits: 6 runs (dry run: nothing is run or written)"
    assert rows[-1].split() == ["fedavg__partition=dirichlet__partition.alpha=0.3__seed0",
                                "algorithm=fedavg", "partition=dirichlet", "partition.alpha=0.3"]
    assert shared.startswith("shared: dataset=digits clients=10 rounds=5 lr=0.05 ")
    assert list(tmp_path.iterdir()) == []
    assert main(["compare", "-a", "fedavg,fedavgg", "--dry-run"]) == 2  # checked like a real run
    assert "(did you mean 'fedavg'" in capsys.readouterr().err


def test_a_grid_files_relative_paths_are_relative_to_the_file(tmp_path, capsys, monkeypatch):
    """`dataset`, `dataset.test` and `partition.path` in a grid file name files beside it, from
    whichever directory the grid is run; the saved grid.toml and the runs record them absolute.
    A path given on the command line stays relative to the current directory."""
    import numpy as np
    from sklearn.datasets import load_digits

    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    x, y = load_digits(return_X_y=True)
    header = ",".join([*(f"p{i}" for i in range(64)), "label"])
    for name, rows in (("train", slice(0, 400)), ("test", slice(400, 500))):
        np.savetxt(project / "data" / f"{name}.csv", np.column_stack([x[rows], y[rows]]),
                   delimiter=",", header=header, comments="", fmt="%g")
    (project / "parts.json").write_text(json.dumps({"0": list(range(0, 200)),
                                                    "1": list(range(200, 400))}))
    (project / "grid.toml").write_text(
        '[base]\ndataset = "data/train.csv"\n"dataset.test" = "data/test.csv"\nclients = 2\n'
        'rounds = 1\npartition = "file"\n"partition.path" = "parts.json"\n'
        '[axes]\nalgorithm = ["fedavg"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["compare", "-c", str(project / "grid.toml"), "--out", "g"]) == 0, \
        capsys.readouterr().err
    (config,) = configs(elsewhere / "g").values()
    assert config["dataset"] == str(project / "data" / "train.csv")
    assert config["dataset_params"]["test"] == str(project / "data" / "test.csv")
    assert config["partition_params"]["path"] == str(project / "parts.json")
    saved = (elsewhere / "g" / "grid.toml").read_text()
    assert str(project / "data" / "train.csv") in saved and str(project / "parts.json") in saved


MY_NET = '''
from dataclasses import dataclass

from torch import nn

import fedhet


@dataclass(frozen=True)
class NetParams:
    hidden: int = 8


@fedhet.register_model("my-net", NetParams, "a small MLP of the user's")
def my_net(input_shape, num_classes, params):
    n = 1
    for d in input_shape:
        n *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(n, params.hidden), nn.ReLU(),
                         nn.Linear(params.hidden, num_classes))
'''


def _fedhet(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`fedhet ARGS` in a fresh process (no plugin loaded, nothing registered)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "fedhet", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_a_saved_grid_records_its_plugins_and_loads_them_again(tmp_path):
    """`--plugin` once: the saved grid.toml records it, so `compare -c that/grid.toml` from
    another folder finds the model; a grid naming a component no plugin gave says `--plugin`."""
    proj, other = tmp_path / "proj", tmp_path / "other"
    proj.mkdir()
    other.mkdir()
    (proj / "my_nets.py").write_text(MY_NET)
    done = _fedhet("--plugin", "my_nets.py", "compare", "-a", "fedavg", "-m", "my-net", "-d",
                   "digits", "-n", "3", "-r", "1", "--out", "runs/g", cwd=proj)
    assert done.returncode == 0, done.stderr
    assert str(proj / "my_nets.py") in (proj / "runs" / "g" / "grid.toml").read_text()
    done = _fedhet("compare", "-c", "../proj/runs/g/grid.toml", "--out", "newg", "-r", "2", cwd=other)
    assert done.returncode == 0, done.stderr
    (config,) = configs(other / "newg").values()
    assert config["model"] == "my-net" and config["rounds"] == 2
    assert str(proj / "my_nets.py") in (other / "newg" / "grid.toml").read_text()
    (other / "bare.toml").write_text('[base]\nmodel = "my-net"\nclients = 3\nrounds = 1\n'
                                     '[axes]\nalgorithm = ["fedavg"]\n')
    done = _fedhet("compare", "-c", "bare.toml", "--out", "bare", cwd=other)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and not (other / "bare").exists(), done.stderr
    assert "unknown model 'my-net'" in lines[0] and "--plugin" in lines[0], lines[0]


def test_compare_resume_extends_a_finished_grid(tmp_path, capsys):
    """`compare --resume DIR -r N` continues every run of a finished grid to N rounds (its
    rounds so far kept, as `run --resume -r N` does); a change a resume cannot make is one line,
    and changing the rounds without --resume says how to extend."""
    grid = tmp_path / "g"
    assert main(["compare", "-a", "fedavg,fedprox", "-d", "digits", "-n", "3", "-r", "2",
                 "--out", str(grid)]) == 0
    before = {n: (grid / "runs" / n / "metrics.csv").read_text().splitlines()
              for n in ("fedavg__seed0", "fedprox__seed0")}
    capsys.readouterr()
    line = one_error_line(capsys, ["compare", "-a", "fedavg,fedprox", "-d", "digits", "-n", "3",
                                   "-r", "4", "--out", str(grid)])
    assert "other settings (rounds)" in line and f"fedhet compare --resume {grid} -r 4" in line
    line = one_error_line(capsys, ["compare", "--resume", str(grid), "--set", "lr=0.5"])
    assert "lr" in line and "a resume may change only" in line, line
    capsys.readouterr()
    assert main(["compare", "--resume", str(grid), "-r", "4"]) == 0, capsys.readouterr().err
    for name, rows in before.items():
        summary = json.loads((grid / "runs" / name / "summary.json").read_text())
        assert summary["finished"] and summary["rounds_done"] == 4
        now = (grid / "runs" / name / "metrics.csv").read_text().splitlines()
        assert now[: len(rows)] == rows and len(now) == len(rows) + 2
    assert all(r["settings"]["rounds"] == 4 for r in json.loads((grid / "grid.json").read_text())["runs"])
    assert "rounds = 4" in (grid / "grid.toml").read_text()
    assert main(["compare", "--resume", str(grid)]) == 0  # finished: nothing to do
    import fedhet

    rows = fedhet.compare(base={"rounds": 5}, config=grid / "grid.toml", out=grid, extend=True)
    assert [r["rounds_done"] for r in rows] == [5, 5]


@pytest.mark.parametrize(("methods", "suggested"), [("fedprox,fedavg", True), ("fedavg,fedavgm", False)])
def test_a_grids_suggestion_names_only_parameters_its_methods_have(tmp_path, capsys, methods,
                                                                   suggested):
    line = one_error_line(capsys, ["compare", "-a", methods, "--set", "mu=0.1", "--out",
                                   str(tmp_path / "g")])
    assert ("did you mean 'algorithm.mu'" in line) is suggested, line
    assert suggested or "fedavg and fedavgm have no parameter mu" in line, line
