"""An earlier release's spellings (docs/cli.md, migration): `executor = "batched"` is `stacked`,
`--batch-runs` is `--stack-runs`, `fedhet.compare(batch_runs=)` is `stack_runs=`. From a user
each runs as the new spelling with one line that says so; from a run's record it reads as the
new spelling without a word, so such a run resumes exactly."""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path

import pytest
import torch

import fedhet
from fedhet.cli import build_parser, main, parse
from fedhet.engine import RunConfig, build, canonical_config, config_of, current_record
from fedhet.engine import parse as parse_settings
from fedhet.errors import FedhetDeprecationWarning, FedhetError
from fedhet.rundir import read_config, read_metrics
from fedhet.rundir.store import MAGIC, read_checkpoint

QUICK = ["run", "-r", "2", "-n", "4"]
NOTE = "executor 'batched' is now 'stacked'; the old spelling goes in the next release (docs/cli.md)"


def steps(run: Path) -> list[dict]:
    """A run's metrics rows without the clock's columns."""
    return [{k: v for k, v in row.items() if not k.endswith("time_s")}
            for row in read_metrics(run / "metrics.csv")]


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: ")]


# -- from a user: the new spelling, and one line that says so -----------------------------------
@pytest.mark.parametrize("make", [
    lambda value: RunConfig(executor=value),
    lambda value: config_of({"executor": value}),
    lambda value: config_of({"executor": value.title()}),
    lambda value: build(parse_settings([f"executor={value}"], "--set")),
], ids=["RunConfig", "settings", "any-case", "--set"])
def test_an_old_executor_value_is_the_new_one_with_one_warning_at_the_callers_line(make):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = make("batched")
    assert cfg.executor == "stacked"
    said = [w for w in caught if issubclass(w.category, FedhetDeprecationWarning)]
    assert len(said) == 1 and "\n" not in str(said[0].message)
    assert str(said[0].message) == NOTE
    assert said[0].filename == __file__  # the user's line, not fedhet's
    assert issubclass(FedhetDeprecationWarning, FutureWarning)  # shown by default
    assert fedhet.FedhetDeprecationWarning is FedhetDeprecationWarning  # a user may filter it
    assert cfg == make("stacked")


def test_the_new_spelling_says_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_of({"executor": "stacked"}).executor == "stacked"
        assert RunConfig(executor="sequential").executor == "sequential"


@pytest.mark.parametrize("old", [
    ["--executor", "batched"],
    ["--set", "executor=batched"],
    ["--config", "{toml}"],
], ids=["flag", "--set", "settings-file"])
def test_the_cli_runs_an_old_executor_spelling_as_the_new_one_and_notes_it_once(
        tmp_path, capsys, old):
    toml = tmp_path / "run.toml"
    toml.write_text('executor = "batched"\n')
    old = [a.replace("{toml}", str(toml)) for a in old]
    assert main([*QUICK, "--executor", "stacked", "--out", str(tmp_path / "new")]) == 0
    assert notes(capsys.readouterr().err) == []
    assert main([*QUICK, *old, "--out", str(tmp_path / "old")]) == 0
    said = notes(capsys.readouterr().err)
    assert said == [f"note: {NOTE}"]
    assert read_config(tmp_path / "old")["executor"] == "stacked"
    assert steps(tmp_path / "old") == steps(tmp_path / "new")
    new = {k: v for k, v in read_config(tmp_path / "new").items() if k != "provenance"}
    assert {k: v for k, v in read_config(tmp_path / "old").items() if k != "provenance"} == new


def test_an_old_spelling_in_a_failing_command_ends_its_error_line(tmp_path, capsys):
    code = main([*QUICK, "--executor", "batched", "--workers", "2", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: --workers 2 runs the sequential executor")
    assert err[0].endswith(f"; note: {NOTE}")


def test_batch_runs_is_stack_runs_on_every_command_that_takes_it():
    for verb in (["compare", "-c", "grid-digits"], ["reproduce", "fedavg"],
                 ["campaign", "plan"], ["campaign", "run", "--budget", "1"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            args = parse([*verb, "--batch-runs", "3"])
        assert args.stack_runs == 3, verb
        assert [str(w.message) for w in caught] == [
            "`--batch-runs` is now `--stack-runs`; the old spelling goes in the next release "
            "(docs/cli.md)"]
        assert parse([*verb, "--stack-runs", "3"]).stack_runs == 3
    help_text = build_parser()._subparsers._group_actions[0].choices["compare"].format_help()
    assert "--stack-runs" in help_text and "--batch-runs" not in help_text



@pytest.mark.parametrize(("module", "runner", "argv"), [
    ("fedhet.papers.bherd.readings", "run_study", ["run", "--seeds", "0"]),
    ("fedhet.papers.fedveca.study", "run_part", ["--parts", "cases", "--seeds", "0"]),
], ids=["bherd-readings", "fedveca-study"])
def test_the_research_scripts_take_batch_runs_as_stack_runs_with_the_note(module, runner, argv, monkeypatch):
    """`python -m fedhet.papers.bherd.readings run --batch-runs N` (and FedVeca's study) runs as
    `--stack-runs N`, with the same one-line warning as the CLI's flags."""
    import importlib

    script = importlib.import_module(module)
    got: list[int] = []

    def ran(*args, stack_runs=None, **kwargs):  # run_study takes it by name, run_part third
        got.append(args[2] if stack_runs is None else stack_runs)

    monkeypatch.setattr(script, runner, ran)
    with pytest.warns(FedhetDeprecationWarning, match="`--batch-runs` is now `--stack-runs`"):
        script.main([*argv, "--batch-runs", "3"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        script.main([*argv, "--stack-runs", "4"])
    assert got == [3, 4]

GRID = ('[base]\ndataset = "digits"\npartition = "dirichlet"\nclients = 5\nrounds = 2\n'
        'model = "logreg"\nlocal_epochs = 1\nlr = 0.1\n[axes]\nseed = [0, 1, 2]\n')


def test_compare_with_batch_runs_writes_what_stack_runs_writes_and_notes_it(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    common = ["compare", "-c", str(grid), "-j", "1", "--device", "cpu"]
    assert main([*common, "--stack-runs", "2", "-o", str(tmp_path / "new")]) == 0
    assert notes(capsys.readouterr().err) == []
    assert main([*common, "--batch-runs", "2", "-o", str(tmp_path / "old")]) == 0
    assert notes(capsys.readouterr().err) == [
        "note: `--batch-runs` is now `--stack-runs`; the old spelling goes in the next release "
        "(docs/cli.md)"]
    runs = sorted(p.name for p in (tmp_path / "new" / "runs").iterdir())
    assert runs == sorted(p.name for p in (tmp_path / "old" / "runs").iterdir()) and len(runs) == 3
    for name in runs:
        assert steps(tmp_path / "old" / "runs" / name) == steps(tmp_path / "new" / "runs" / name)


def test_a_grid_over_worker_processes_notes_an_old_spelling_once(tmp_path, capfd):
    """Given once, the old spelling is read by the grid, each run's settings and each worker
    process: the command still says it in one line, and no worker prints Python's warning."""
    assert main(["compare", "-a", "fedavg", "-d", "digits", "-n", "4", "-r", "2", "--sweep",
                 "seed=0,1", "--set", "executor=batched", "-j", "2", "-o", str(tmp_path)]) == 0
    err = capfd.readouterr().err
    assert notes(err) == [f"note: {NOTE}"] and "Warning" not in err, err
    assert {read_config(r)["executor"] for r in (tmp_path / "runs").iterdir()} == {"stacked"}


def test_the_api_takes_batch_runs_as_stack_runs_with_a_warning(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(fedhet.api, "run_grid", lambda *a, **kw: seen.append(kw) or [])
    fedhet.compare(sweeps={"seed": [0, 1]}, out=tmp_path / "a", stack_runs=3)
    with pytest.warns(FedhetDeprecationWarning, match="`batch_runs` is now `stack_runs`") as said:
        fedhet.compare(sweeps={"seed": [0, 1]}, out=tmp_path / "b", batch_runs=3)
    assert said[0].filename == __file__
    assert seen[0]["stack_runs"] == seen[1]["stack_runs"] == 3
    with pytest.raises(FedhetError, match="give stack_runs alone"):
        fedhet.compare(sweeps={"seed": [0, 1]}, out=tmp_path / "c", stack_runs=2, batch_runs=3)


def test_the_api_runs_executor_batched_as_stacked(tmp_path):
    settings = {"rounds": 2, "clients": 4, "log": lambda _: None}
    new = fedhet.run(out=tmp_path / "new", executor="stacked", **settings)
    with pytest.warns(FedhetDeprecationWarning, match="executor 'batched' is now 'stacked'"):
        old = fedhet.run(out=tmp_path / "old", executor="batched", **settings)
    assert old.config["executor"] == new.config["executor"] == "stacked"
    assert steps(tmp_path / "old") == steps(tmp_path / "new")


# -- from a record: read as the new spelling, silently ------------------------------------------
def spelt_as_before(run: Path) -> None:
    """Rewrite `run`'s config.json and checkpoints as a release that said `batched` wrote them."""
    config = json.loads((run / "config.json").read_text())
    assert config["executor"] == "stacked"
    (run / "config.json").write_text(json.dumps({**config, "executor": "batched"}, indent=2))
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        if not (run / name).exists():
            continue
        payload = read_checkpoint(run / name)
        payload["config"] = {**payload["config"], "executor": "batched"}
        buf = io.BytesIO()
        torch.save(payload, buf)
        data = buf.getvalue()
        (run / name).write_bytes(MAGIC + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        assert read_checkpoint(run / name)["config"]["executor"] == "batched"


def test_a_record_spelt_batched_reads_as_stacked_without_a_word():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saved = canonical_config({"executor": "batched", "rounds": 3})
        assert current_record({"executor": "batched", "lr": 0.1}) == {"executor": "stacked",
                                                                       "lr": 0.1}
    assert saved == canonical_config({"executor": "stacked", "rounds": 3})
    assert saved["executor"] == "stacked"


def test_a_run_written_with_executor_batched_resumes_under_stacked_exactly(tmp_path, capsys):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main([*QUICK, "-r", "4", "--executor", "stacked", "--out", str(whole)]) == 0
    assert main([*QUICK, "--executor", "stacked", "--out", str(cut)]) == 0
    spelt_as_before(cut)
    capsys.readouterr()
    assert main(["run", "--resume", str(cut), "-r", "4", "--executor", "stacked"]) == 0
    err = capsys.readouterr().err
    assert "error" not in err and notes(err) == [] and "executor" not in err, err
    assert steps(cut) == steps(whole) and [r["round"] for r in steps(cut)] == [0, 1, 2, 3, 4]


def test_a_grid_whose_runs_say_batched_resumes_and_counts_them_done(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.replace("rounds = 2", "rounds = 3"))
    common = ["compare", "-c", str(grid), "-j", "1", "--device", "cpu", "-o", str(tmp_path / "g")]
    assert main([*common, "--executor", "stacked"]) == 0
    runs = sorted((tmp_path / "g" / "runs").iterdir())
    before = {r.name: steps(r) for r in runs}
    for r in runs:
        spelt_as_before(r)
    (runs[0] / "summary.json").unlink()  # unfinished: resumed from its checkpoint
    capsys.readouterr()
    assert main([*common, "--executor", "stacked"]) == 0
    err = capsys.readouterr().err
    assert "other settings" not in err and notes(err) == [], err
    assert {r.name: steps(r) for r in runs} == before
