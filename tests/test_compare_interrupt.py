"""Two real `fedhet compare` processes on one `--out`, and Ctrl-C on a running grid.

The processes are started in their own session and sent SIGINT as a process group, as a
terminal does, so the pool workers get it too (and must not die from it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and flock")

GRID = """\
[base]
dataset = "digits"
partition = "iid"
clients = 3
rounds = {rounds}
lr = 0.1

[axes]
seed = [{seeds}]
"""


def _grid(tmp_path: Path, rounds: int, seeds: int) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(GRID.format(rounds=rounds, seeds=", ".join(map(str, range(seeds)))))
    return path


def _compare(grid: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "fedhet", "compare", "--config", str(grid), "--out", str(out),
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )


def _rounds_done(run: Path) -> int:
    try:
        return int(json.loads((run / "summary.json").read_text())["rounds_done"])
    except (OSError, ValueError, KeyError):
        return 0


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"compare ended early ({proc.returncode}): {out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("timed out waiting for the grid to start")
        time.sleep(0.1)


def test_second_compare_on_the_same_out_fails_naming_the_holder(tmp_path):
    grid, out = _grid(tmp_path, rounds=400, seeds=1), tmp_path / "out"
    first = _compare(grid, out, "--jobs", "1")
    try:
        run = out / "runs" / "fedavg__seed0"
        _wait_for(lambda: _rounds_done(run) >= 1, first)
        second = _compare(grid, out, "--jobs", "1", "--force")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2
        assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
        assert f"in use by process {first.pid}" in err and "another fedhet compare" in err
        # the first one's run is untouched and still going
        k = _rounds_done(run)
        _wait_for(lambda: _rounds_done(run) > k, first)
        assert (out / ".fedhet").is_file()
        assert json.loads((out / ".fedhet").read_text())["kind"] == "grid"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


def test_ctrl_c_cancels_queued_runs_stops_running_ones_and_compare_resumes(tmp_path):
    grid, out = _grid(tmp_path, rounds=25, seeds=4), tmp_path / "out"
    proc = _compare(grid, out, "--jobs", "2")
    runs = [out / "runs" / f"fedavg__seed{s}" for s in range(4)]
    started = [r for r in runs[:2]]
    _wait_for(lambda: all(_rounds_done(r) >= 1 for r in started), proc)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    stdout, err = proc.communicate(timeout=60)
    seconds = time.monotonic() - t0
    assert proc.returncode == 130, err
    assert seconds < 10, f"took {seconds:.1f} s to stop"
    assert "Traceback" not in err, err
    assert "2 running run(s) stopped after a saved round" in err, err
    assert "2 queued run(s) cancelled" in err, err
    assert f"fedhet compare --config {grid} --out {out}" in err, err
    for run in runs[2:]:
        assert not run.exists(), f"{run.name} started after Ctrl-C"
    for run in started:
        summary = json.loads((run / "summary.json").read_text())
        assert not summary["finished"] and 1 <= summary["rounds_done"] < 25
        rows = (run / "metrics.csv").read_text().splitlines()
        assert len(rows) == 1 + 1 + summary["rounds_done"]  # header, round 0, the rounds done

    again = _compare(grid, out, "--jobs", "2")
    stdout, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert "4 runs" in stdout
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["finished"] and summary["rounds_done"] == 25
        rounds = [line.split(",")[0] for line in (run / "metrics.csv").read_text().splitlines()[1:]]
        assert rounds == [str(k) for k in range(26)]
