"""`fedhet compare` grids: expansion, line-numbered errors, the parallel end-to-end run, results,
skipping and resuming; `fedhet reproduce` on a preset; progress and TensorBoard options."""

from __future__ import annotations

import csv
import io
import json
import math
import textwrap
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.errors import FedhetError
from fedhet.papers.base import PRESETS
from fedhet.runs.comparison import compare
from fedhet.runs.grid import load_grid
from fedhet.runs.grid_status import Progress
from fedhet.runs.jobs import Job
from fedhet.runs.presets import Preset, RunSpec
from fedhet.runs.results import summary_tables, to_target

SMOKE = """\
title = "smoke"
target_accuracy = 0.3

[base]
dataset = "digits"
partition = "iid"
clients = 4
rounds = 3
lr = 0.1

[axes]
algorithm = ["fedavg", "fedavgm"]
seed = [0, 1]
"""


def write(tmp_path: Path, text: str, name: str = "grid.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


# -- expansion -------------------------------------------------------------------------------
def test_axes_variants_and_bundles_expand_to_the_cross_product(tmp_path):
    grid = load_grid(write(tmp_path, """
        [base]
        dataset = "digits"
        rounds = 2
        [axes]
        algorithm = ["fedavg"]
        partition = ["iid", { partition = "dirichlet", "partition.alpha" = 0.3 }]
        seed = [0, 1, 2]
        [[variant]]
        algorithm = "fedavgm"
        label = "Momentum"
        "algorithm.gamma" = [0.5, 0.9]
    """))
    assert len(grid.specs) == (1 + 2) * 2 * 3
    assert len({s.name for s in grid.specs}) == len(grid.specs)
    labels = {s.label for s in grid.specs}
    assert labels == {"fedavg", "Momentum (gamma=0.5)", "Momentum (gamma=0.9)"}
    groups = {s.group for s in grid.specs}
    assert groups == {"partition=iid", "partition=dirichlet, partition.alpha=0.3"}
    iid = [s for s in grid.specs if s.settings["partition"] == "iid"]
    assert all("partition.alpha" not in s.settings for s in iid)
    momentum = [s for s in grid.specs if s.settings["algorithm"] == "fedavgm"]
    assert {s.settings["algorithm.gamma"] for s in momentum} == {0.5, 0.9}


# -- bad input names the line ----------------------------------------------------------------
BAD = [
    ("unknown algorithm", 'algorithm = ["fedavg", "fedavgg"]', "axes", "choose one of: "),
    ("unknown setting", "roundz = 3", "base", "valid settings:"),
    ("wrong type", 'lr = ["fast"]', "axes", "must be a number"),
    ("bad choice", 'lr_schedule = "cos"', "base", "must be one of constant, cosine"),
    ("not a list", "clients = 3", "axes", "must be a non-empty list"),
]


@pytest.mark.parametrize(("what", "line", "table", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_grid_names_file_line_and_choices(tmp_path, what, line, table, expected):
    body = {"base": ['dataset = "digits"', "rounds = 2"], "axes": ["seed = [0]"]}
    body[table].append(line)
    text = "# a grid\n[base]\n" + "\n".join(body["base"]) + "\n\n[axes]\n" + "\n".join(body["axes"]) + "\n"
    path = write(tmp_path, text)
    lineno = text.splitlines().index(line) + 1
    with pytest.raises(FedhetError) as err:
        compare(path, tmp_path / "out", jobs=1)
    assert f"grid.toml:{lineno}:" in str(err.value) and expected in str(err.value)
    if what == "unknown algorithm":
        assert {"central", "fedavg", "fedavgm"} <= set(str(err.value).split(": ")[-1].split(", "))
    assert not (tmp_path / "out").exists()


def test_unknown_algorithm_parameter_in_variant_names_its_line(tmp_path):
    path = write(tmp_path, """\
        [base]
        dataset = "digits"
        [[variant]]
        algorithm = "fedavg"
        [[variant]]
        algorithm = "fedavgm"
        "algorithm.mu" = 0.1
    """)
    expected = r"grid.toml:7: unknown parameter algorithm.mu; valid parameters: server_momentum"
    with pytest.raises(FedhetError, match=expected):
        load_grid(path)


def test_unknown_top_level_key_lists_valid_keys(tmp_path):
    path = write(tmp_path, '[base]\ndataset = "digits"\n\n[axis]\nseed = [0]\n')
    with pytest.raises(FedhetError, match=r"grid.toml:4: unknown grid key 'axis'; valid keys: title"):
        load_grid(path)


def test_value_valid_alone_but_not_for_the_run_names_its_line(tmp_path):
    path = write(tmp_path, """\
        [base]
        dataset = "digits"
        [axes]
        algorithm = ["fedavgm"]
        "algorithm.gamma" = [0.5, 1.5]
    """)
    expected = r"grid.toml:5: algorithm.server_momentum \(γ\) must be in \[0, 1\)"
    with pytest.raises(FedhetError, match=expected):
        load_grid(path)


# -- tables -----------------------------------------------------------------------------------
def test_to_target_reads_first_round_and_communication_there():
    metrics = {"round": [0, 1, 2, 3], "test_accuracy": [0.1, 0.5, 0.7, 0.9],
               "cum_bytes": [math.nan, 100, 200, 300], "cum_model_transfers": [math.nan, 2, 4, 6]}
    assert to_target(metrics, 0.7) == {"rounds_to_target": 2, "bytes_to_target": 200,
                                       "transfers_to_target": 4}
    assert math.isnan(to_target(metrics, 0.95)["rounds_to_target"])


def test_summary_is_mean_and_std_over_seeds_with_best_in_bold():
    rows = [
        {"label": "A", "group": "g", "final_accuracy": 0.80, "best_accuracy": 0.8, "wall_time_s": 1},
        {"label": "A", "group": "g", "final_accuracy": 0.90, "best_accuracy": 0.9, "wall_time_s": 1},
        {"label": "B", "group": "g", "final_accuracy": 0.95, "best_accuracy": 0.95, "wall_time_s": 2},
    ]
    final = summary_tables(rows, None)[0]
    assert final.rows[0] == ("A", [f"85.00 ± {100 * 0.0707106781:.2f}"])
    assert final.rows[1] == ("B", ["95.00"])
    assert final.best == {(1, 0)}


# -- end to end -------------------------------------------------------------------------------
def test_two_algorithm_two_seed_grid_end_to_end_skips_and_resumes(tmp_path):
    path = write(tmp_path, SMOKE)
    out = tmp_path / "out"
    log = io.StringIO()
    rows = compare(path, out, jobs=2, stream=log)
    assert len(rows) == 4 and all(r["status"] == "finished" for r in rows)
    assert log.getvalue().count("\n") == 4 and "[4/4]" in log.getvalue()
    table = read_csv(out / "results.csv")
    assert {(r["algorithm"], r["seed"]) for r in table} == {
        (a, s) for a in ("fedavg", "fedavgm") for s in ("0", "1")
    }
    for r in table:
        metrics = read_csv(out / "runs" / r["name"] / "metrics.csv")
        assert float(r["final_accuracy"]) == float(metrics[-1]["test_accuracy"])
        assert float(r["final_accuracy"]) > float(metrics[0]["test_accuracy"]) + 0.1  # it learns
    summary = (out / "summary.md").read_text()
    assert "| fedavg |" in summary and "| fedavgm |" in summary and "±" in summary and "**" in summary

    # a second call skips the finished runs; a partial run (last checkpoint lost) is resumed
    victim = out / "runs" / table[0]["name"]
    expected = (victim / "metrics.csv").read_text().splitlines()
    (victim / "checkpoint.prev.pt").replace(victim / "checkpoint.pt")
    s = json.loads((victim / "summary.json").read_text())
    (victim / "summary.json").write_text(json.dumps({**s, "finished": False}))
    log = io.StringIO()
    compare(path, out, jobs=2, stream=log)
    assert log.getvalue().count("\n") == 1 and table[0]["name"] in log.getvalue()
    strip = [",".join(line.split(",")[:-3]) for line in expected]  # time columns are last
    again = (victim / "metrics.csv").read_text().splitlines()
    assert [",".join(line.split(",")[:-3]) for line in again] == strip


def test_changed_settings_in_an_existing_out_are_refused(tmp_path):
    out = tmp_path / "out"
    grid = write(tmp_path, SMOKE.replace('["fedavg", "fedavgm"]', '["fedavg"]').replace("[0, 1]", "[0]"))
    compare(grid, out, jobs=1, stream=io.StringIO())
    write(tmp_path, SMOKE.replace('["fedavg", "fedavgm"]', '["fedavg"]').replace("[0, 1]", "[0]")
          .replace("lr = 0.1", "lr = 0.2"))
    with pytest.raises(FedhetError, match="other settings \\(lr\\).*--force"):
        compare(grid, out, jobs=1, stream=io.StringIO())


# -- reproduce --------------------------------------------------------------------------------
def _tiny(scale: str) -> Preset:
    """Two stages; the second reads the first's output."""
    base = {"dataset": "digits", "partition": "iid", "clients": 3, "rounds": 2, "lr": 0.1}

    def first(out: Path) -> list[RunSpec]:
        return [RunSpec("fedavg", "digits", "FedAvg", {**base, "algorithm": "fedavg"})]

    def second(out: Path) -> list[RunSpec]:
        done = json.loads((out / "runs" / "fedavg" / "summary.json").read_text())["rounds_done"]
        return [RunSpec("central", "digits", "Central",
                        {**base, "algorithm": "central", "rounds": done + 1})]

    published = [{"group": "digits", "label": "FedAvg", "metric": "accuracy", "value": 97.5,
                  "source": "Table 9"}]
    return Preset("tiny-test", scale, [first, second], published, target_accuracy=0.2)


def test_reproduce_runs_stages_in_order_and_puts_published_beside_ours(tmp_path, capsys):
    out = tmp_path / "rep"
    with PRESETS.added("tiny-test", _tiny):
        assert main(["reproduce", "tiny-test", "--scale", "smoke", "--out", str(out), "--jobs", "1"]) == 0
    assert "tiny-test" not in PRESETS
    table = {r["name"]: r for r in read_csv(out / "results.csv")}
    assert table["central"]["rounds_done"] == "3"  # stage 2 saw stage 1's summary
    report = (out / "report.md").read_text()
    ours = f"{100 * float(table['fedavg']['final_accuracy']):.2f}"
    assert "| digits | FedAvg | final_accuracy | 97.5 | " + ours + " | Table 9 |" in report
    assert (out / "report.html").exists()


def test_reproduce_unknown_paper_lists_presets(tmp_path, capsys):
    assert main(["reproduce", "fedavgg", "--out", str(tmp_path / "x")]) == 2
    assert "choose one of:" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_fednova_preset_resolves_at_every_scale():
    from fedhet.papers.reproduce import _check_specs, load_preset

    for scale in ("smoke", "small", "paper"):
        preset = load_preset("fednova", scale)
        specs = [s for stage in preset.stages for s in stage(Path("unused"))]
        _check_specs("fednova", specs)
        assert {s.settings["algorithm"] for s in specs} == {"fedavg", "fednova", "fedprox"}
        assert all(s.settings["epochs_min"] == 2 and s.settings["epochs_max"] == 5 for s in specs)


# -- progress and TensorBoard ---------------------------------------------------------------------
class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_shows_runs_accuracy_and_eta(tmp_path):
    run = tmp_path / "a"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"rounds_done": 2, "final_accuracy": 0.5}))
    job = Job("a", {"rounds": 10}, str(run), resume=False)
    stream = FakeTTY()
    progress = Progress(3, 1, [job], stream)
    for done in (3, 5):  # the rate is measured between observed rounds
        (run / "summary.json").write_text(json.dumps({"rounds_done": done, "final_accuracy": 0.625}))
        progress.last = 0.0
        progress.tick()
    line = stream.getvalue().split("\r")[-1]
    assert "[1/3 runs]" in line and "a r5 0.625" in line and "ETA" in line and "ETA ?" not in line


def test_progress_in_a_log_counts_the_eta_from_the_first_finished_round(tmp_path):
    """Written to a log (a line every minute), the first line after the first finished rounds
    has an ETA: the rate is measured from the first round seen finished, not from the first
    line written."""
    import time

    run = tmp_path / "a"
    run.mkdir()
    job = Job("a", {"rounds": 10}, str(run), resume=False)
    stream = io.StringIO()
    progress = Progress(1, 0, [job], stream)
    progress.every = 60.0  # no line before a minute has passed
    for done in (1, 2, 3):
        (run / "summary.json").write_text(json.dumps({"rounds_done": done, "final_accuracy": 0.5}))
        progress.tick()
        time.sleep(0.6)
    assert stream.getvalue() == ""
    progress.last_log -= 60.0  # a minute has passed: the line is due
    progress.tick()
    line = stream.getvalue().strip()
    assert "[0/1 runs, 3/10 rounds]" in line and "ETA ?" not in line and "ETA " in line, line


def test_tensorboard_flag_without_the_package_is_a_clear_error(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    out = tmp_path / "run"
    code = main(["run", "-a", "fedavg", "-d", "digits", "-r", "1", "--out", str(out), "--tensorboard"])
    assert code == 2 and "pip install 'fedhet[tensorboard]'" in capsys.readouterr().err
    assert not out.exists()


def test_tensorboard_logs_each_round(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert main(["run", "-a", "fedavg", "-d", "digits", "-n", "3", "-r", "2", "--out", str(out),
                 "--tensorboard", "-q"]) == 0
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("test_accuracy")]
    assert steps == [1, 2]


def test_names_in_any_case_and_kebab_keys_in_a_grid(tmp_path):
    """A grid may spell names in any case and settings in kebab case; the runs are named and
    configured as with the registered spelling, and two spellings of one method are one cell."""
    grid = load_grid(write(tmp_path, """
        [base]
        dataset = "Digits"
        local-epochs = 2
        [axes]
        algorithm = ["FedAvg", "fedprox"]
        partition = ["IID"]
    """))
    assert [s.name for s in grid.specs] == ["fedavg__seed0", "fedprox__seed0"]
    assert grid.specs[0].settings == {"dataset": "digits", "local_epochs": 2, "algorithm": "fedavg",
                                      "partition": "iid"}
    with pytest.raises(FedhetError, match="duplicate runs, the same cell twice"):
        load_grid(write(tmp_path, '[axes]\nalgorithm = ["FedAvg", "fedavg"]\n', "dup.toml"))


def test_every_shipped_grid_loads_and_resolves():
    """The grids shipped in the package (documented study and tuning commands) stay valid."""
    from fedhet.configs import is_grid, shipped
    from fedhet.engine.config import config_of
    from fedhet.runs.grid import load_grid

    grids = [p for p in shipped().values() if is_grid(p)]
    assert len(grids) >= 5
    for path in grids:
        specs = load_grid(path).specs
        assert specs, path
        for spec in specs:
            config_of(spec.settings, str(path))
