"""`fedhet reproduce all` (experiments/campaign.py): budgeted sittings that stop before the budget
ends and continue where they stopped, at smoke scale on the CPU (FedNova's 3-run smoke preset)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from fedhet.experiments import campaign as cp
from fedhet.experiments import paper_results as pr

TINY = cp.Table("fednova-smoke", "fednova", "synthetic", "FedNova smoke", ("synthetic",), 1.0,
                algorithm_of=lambda r: str(r.config["algorithm"]))
"""3 runs × 15 rounds; prior 1 s per run-round, so one run is estimated at 15 s."""


class FakeClock(cp.Campaign):
    """A campaign whose clock moves only when a chunk runs (`chunk_s` per chunk)."""

    chunk_s = 20.0

    def _run_chunk(self, chunk, runs_dir):  # noqa: ANN001, ANN202
        errors = super()._run_chunk(chunk, runs_dir)
        self.now[0] += self.chunk_s
        return errors


def _sitting(tmp: Path, budget: float, steps=("fednova-smoke",), cls=FakeClock, **kw) -> cp.Campaign:  # noqa: ANN001
    now = [0.0]
    c = cls("smoke", "cpu", budget, tmp / "runs", tmp / "results", batch_runs=1, steps=steps,
            tables=(TINY,), stream=io.StringIO(), clock=lambda: now[0], **kw)
    c.now = now
    return c


def test_stops_before_the_budget_and_continues_next_sitting(tmp_path: Path) -> None:
    # budget 1 min, 10 s margin: 50 s. Run 1 (est. 15 s) runs and takes 20 s; run 2 (est. 20 s,
    # measured) fits in the 30 s left; run 3 (20 s) does not fit in 10 s: not started
    first = _sitting(tmp_path, 1.0)
    state = first.run()
    assert state["steps"]["fednova-smoke"]["status"] == "pending"
    assert state["steps"]["fednova-smoke"]["s_per_run_round"] == pytest.approx(20 / 15)
    assert "stopping here" in first.stream.getvalue()
    runs = tmp_path / "runs" / "fednova-smoke" / "runs"
    finished = sorted(d.name for d in runs.iterdir() if pr.is_finished(d))
    assert len(finished) == 2 and len(list(runs.iterdir())) == 2  # the third never started
    csv_path = tmp_path / "results" / "fednova" / "synthetic.csv"
    meta = pr.read_meta(csv_path.with_suffix(".json"))
    assert meta["complete"] is False and meta["runs"] == 2 and meta["scale"] == "smoke"
    assert len(pr.read_results(csv_path)) == 2

    second = _sitting(tmp_path, 1.0)
    state = second.run()
    assert state["steps"]["fednova-smoke"]["status"] == "done" and len(state["sittings"]) == 2
    curves = pr.read_results(csv_path)
    assert {a for _, a in curves} == {"fedavg", "fednova", "fedprox"}
    for by_seed in curves.values():
        assert by_seed[0]["round"] == [float(r) for r in range(16)]
    meta = pr.read_meta(csv_path.with_suffix(".json"))
    assert meta["complete"] is True and meta["runs"] == 3
    assert "reproduce all --scale smoke --device cpu" in meta["command"]

    third = _sitting(tmp_path, 1.0)  # nothing left: nothing runs
    third.run()
    assert "every step finished" in third.stream.getvalue()
    assert "runs 1-1" not in third.stream.getvalue()


def test_a_batch_is_cut_to_the_runs_that_fit(tmp_path: Path) -> None:
    # 3 runs in one batch: 45 s estimated, 35 s left (budget 45 s, 10 s margin): the first two
    # (30 s) run as one batch; they take 30 s, so the last (15 s) does not fit in the 5 s left
    class Slower(FakeClock):
        chunk_s = 30.0

    c = _sitting(tmp_path, 0.75, cls=Slower)
    c.batch_runs = 3
    state = c.run()
    assert "runs 1-2 of 3" in c.stream.getvalue()
    assert state["steps"]["fednova-smoke"]["status"] == "pending"
    runs = tmp_path / "runs" / "fednova-smoke" / "runs"
    assert sum(pr.is_finished(d) for d in runs.iterdir()) == 2 and len(list(runs.iterdir())) == 2


def test_a_step_that_cannot_finish_is_not_started(tmp_path: Path) -> None:
    # the benchmark comes first and is estimated at a minute: with 50 s it is not started, and
    # the tables after it wait (the order is fixed)
    c = _sitting(tmp_path, 1.0, steps=("bench", "fednova-smoke"))
    state = c.run()
    assert state["steps"]["bench"]["status"] == "pending"
    assert state["steps"]["fednova-smoke"] == {"status": "pending", "minutes": 0.0}
    assert not (tmp_path / "runs" / "fednova-smoke").exists()
    assert not (tmp_path / "results" / "bench").exists()


def test_a_run_cut_short_by_the_budget_resumes(tmp_path: Path) -> None:
    # a measured speed that says the run fits (15 rounds × 1e-4 s), but only 0.01 s (real) left:
    # the alarm stops it (the fake clock stands still, so each run gets 0.01 s: far less than
    # 15 rounds take, however idle the machine)
    now = [0.0]
    c = cp.Campaign("smoke", "cpu", 10 / 60 + 0.01 / 60, tmp_path / "runs", tmp_path / "results",
             batch_runs=1, steps=("fednova-smoke",), tables=(TINY,), stream=io.StringIO(),
             clock=lambda: now[0])
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "campaign.json").write_text(json.dumps(
        {"steps": {"fednova-smoke": {"status": "pending", "minutes": 0.0, "s_per_run_round": 1e-4}},
         "sittings": []}))
    state = c.run()
    assert state["steps"]["fednova-smoke"]["status"] == "pending"
    # the alarm stopped the first run (after a saved round, or before its first one when it
    # came that early): nothing finished
    runs = tmp_path / "runs" / "fednova-smoke" / "runs"
    assert not any(pr.is_finished(d) for d in runs.iterdir()) if runs.exists() else True
    assert "stopped at the budget" in c.stream.getvalue()
    state = _sitting(tmp_path, 5.0, cls=cp.Campaign).run()
    assert state["steps"]["fednova-smoke"]["status"] == "done"
    curves = pr.read_results(tmp_path / "results" / "fednova" / "synthetic.csv")
    assert len(curves) == 3
    for by_seed in curves.values():
        assert by_seed[0]["round"] == [float(r) for r in range(16)]


def test_cli_reproduce_all_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedhet.cli import main

    assert main(["reproduce", "all", "--scale", "smoke", "--device", "cpu", "--budget", "0.1",
                 "--out", str(tmp_path / "c"), "--results", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "bench: needs about" in err and "run the same command again" in err
    assert main(["reproduce", "all", "--tables", "nope", "--budget", "1",
                 "--out", str(tmp_path / "c")]) == 2
    assert "unknown campaign step 'nope'" in capsys.readouterr().err
    assert main(["reproduce", "fednova", "--budget", "1"]) == 2
    if not __import__("torch").cuda.is_available():
        assert main(["reproduce", "all", "--budget", "1", "--out", str(tmp_path / "c")]) == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err
    assert main(["reproduce", "all", "--out", str(tmp_path / "c")]) == 2
    assert "needs --budget" in capsys.readouterr().err


def test_the_campaign_imports_no_optional_package() -> None:
    """The GPU machine has torch, numpy, sklearn and matplotlib only: building the campaign's
    tables (every preset, the runner, the page's estimates) imports no flwr, ray or tensorboard."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fedhet.experiments import campaign, paper_scale\n"
        "[campaign.estimate_run_rounds(t, 'paper') for t in campaign.TABLES]\n"
        "import fedhet.experiments.runner, fedhet.experiments.reproduce\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "bad = sorted(top & {'flwr', 'ray', 'tensorboard', 'matplotlib'})\n"
        "print(bad)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
