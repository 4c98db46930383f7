"""Damaged files and hostile arguments: one `error:` line, exit 2, and nothing already saved
changed.

Every file fedhet reads back (a run's config.json, summary.json, metrics.csv, diagnostics.jsonl
and checkpoints; a grid's grid.json and grid.toml; the result files of `paper-scale`; the
campaign's state; plugin files) is damaged in each way a file can be (null, a JSON value of the
wrong kind, not JSON, binary bytes, a torn last line or quoted field, empty, missing) and read by
each command that reads it. Where fedhet can rebuild a file from the checkpoint (a resume), it
does so and says which file it rebuilt; everywhere else the command stops with one line naming
the file, and every file in the directory is as it was (hashed before and after).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_errors import one_error_line

from fedhet.cli import main

RESULTS = Path(__file__).resolve().parents[1] / "results"
SRC = Path(__file__).resolve().parents[1] / "src"


# -- damage ------------------------------------------------------------------------------------
def _torn(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - max(2, len(data.rstrip().rsplit(b"\n", 1)[-1]) // 2) - 1])


DAMAGE: dict[str, Callable[[Path], None]] = {
    "null": lambda p: p.write_text("null"),
    "string": lambda p: p.write_text('"a string"\n'),
    "list": lambda p: p.write_text("[1, 2]\n"),
    "not-json": lambda p: p.write_text('{"a": \n'),
    "binary": lambda p: p.write_bytes(b"\x00\xff\xfe\x80 garbage \x00\n" * 4),
    "torn": _torn,
    "torn-quote": lambda p: p.write_bytes(p.read_bytes() + b'x,"never closed\n'),
    "empty": lambda p: p.write_bytes(b""),
    "header-only": lambda p: p.write_text(p.read_text().split("\n")[0] + "\n"),
    "missing": lambda p: p.unlink(),
}
JSON_DAMAGE = ("null", "string", "list", "not-json", "binary", "torn", "empty")
CSV_DAMAGE = ("null", "binary", "torn", "torn-quote", "empty", "header-only")
JSONL_DAMAGE = ("null", "not-json", "binary", "torn", "empty")


def digest(root: Path) -> dict[str, str]:
    """Every file under `root` and its SHA-256 (the lock file, whose content is the last
    holder's PID, left out)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".fedhet.lock"}


def refused(capsys, argv: list[str], root: Path, new_files: bool = False) -> str:
    """`fedhet ARGV` fails with one error line and leaves every file under `root` as it was
    (with `new_files`, it may have added one: the campaign marks its directory first)."""
    before = digest(root)
    line = one_error_line(capsys, argv)
    after = digest(root)
    if new_files:
        after = {k: v for k, v in after.items() if k in before}
    assert after == before, "a refused command changed a file"
    assert not list(root.rglob(".report.html.*")), "a draft of the report was left behind"
    return line


# -- what is damaged ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A finished BHerd run (it writes diagnostics.jsonl) and a finished two-run grid."""
    root = tmp_path_factory.mktemp("made")
    run, grid = root / "run", root / "grid"
    common = ["-d", "digits", "-r", "2", "-n", "3"]
    assert main(["run", "-a", "bherd", *common, "--out", str(run), "-q"]) == 0
    assert main(["compare", "-a", "fedavg,fedprox", *common, "--out", str(grid)]) == 0
    return {"run": run, "grid": grid}


@pytest.fixture
def copy(made, tmp_path) -> Callable[[str], Path]:
    def copy_of(which: str) -> Path:
        target = tmp_path / which
        shutil.copytree(made[which], target)
        return target
    return copy_of


# -- reading a run: report, resume, config show ------------------------------------------------
@pytest.mark.parametrize("damage", JSON_DAMAGE)
@pytest.mark.parametrize("command", ["report", "resume", "show"])
def test_a_damaged_config_json_is_one_line(capsys, copy, command, damage):
    run = copy("run")
    DAMAGE[damage](run / "config.json")
    argv = {"report": ["report", str(run)], "resume": ["run", "--resume", str(run), "-q"],
            "show": ["config", "show", "--resume", str(run)]}[command]
    line = refused(capsys, argv, run.parent)
    assert "config.json" in line


@pytest.mark.parametrize("damage", [*JSON_DAMAGE, "missing"])
def test_report_of_a_run_with_damaged_summary_json(capsys, copy, damage):
    """A damaged summary.json is one line; a missing one is a run before its first summary
    (reported, its status `missing`)."""
    run = copy("run")
    DAMAGE[damage](run / "summary.json")
    if damage == "missing":
        assert main(["report", str(run)]) == 0
        return
    assert "summary.json" in refused(capsys, ["report", str(run)], run.parent)


@pytest.mark.parametrize("damage", [*CSV_DAMAGE, "missing"])
def test_report_of_a_run_with_damaged_metrics_csv(capsys, copy, damage):
    """A header without rows is no run to report, whatever its header says."""
    run = copy("run")
    DAMAGE[damage](run / "metrics.csv")
    assert "metrics.csv" in refused(capsys, ["report", str(run)], run.parent)


@pytest.mark.parametrize("damage", JSONL_DAMAGE)
def test_report_of_a_run_with_damaged_diagnostics(capsys, copy, damage):
    run = copy("run")
    DAMAGE[damage](run / "diagnostics.jsonl")
    assert "diagnostics.jsonl" in refused(capsys, ["report", str(run)], run.parent)


@pytest.mark.parametrize("file,damage", [
    ("summary.json", "null"), ("summary.json", "binary"), ("summary.json", "torn"),
    ("metrics.csv", "binary"), ("metrics.csv", "torn-quote"), ("metrics.csv", "header-only"),
    ("metrics.csv", "missing"),
])
def test_resume_rebuilds_a_damaged_summary_or_metrics_from_the_checkpoint(capsys, copy, file,
                                                                          damage):
    """A finished run whose summary.json or metrics.csv is damaged is not "already finished":
    the resume writes the file again from the checkpoint and names it (a torn line after whole
    rows is cut, as after a kill)."""
    run = copy("run")
    whole = (run / file).read_bytes()
    DAMAGE[damage](run / file)
    assert main(["run", "--resume", str(run), "-q"]) == 0
    said = capsys.readouterr()
    assert (file in said.out + said.err) or damage == "torn-quote"
    if file == "metrics.csv":
        assert (run / file).read_bytes() == whole
    else:
        assert json.loads((run / file).read_text())["finished"] is True


def test_resume_with_both_checkpoints_damaged_is_one_line(capsys, copy):
    run = copy("run")
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        DAMAGE["binary"](run / name)
    DAMAGE["null"](run / "summary.json")  # so that the resume needs a checkpoint
    before = digest(run)
    assert main(["run", "--resume", str(run), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if line.startswith("error:")] == err[-1:]
    assert "no usable checkpoint" in err[-1] and "Traceback" not in "".join(err)
    assert digest(run) == before


# -- what `config show --resume` says is what `run --resume` says -------------------------------
@pytest.mark.parametrize("flags", [["--set", "lr=0.5"], ["-r", "1"], ["edit"]])
def test_config_show_resume_refuses_what_run_resume_refuses(capsys, copy, flags):
    run = copy("run")
    if flags == ["edit"]:  # config.json edited since the checkpoint
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "lr": 0.5}))
        flags = []
    shown = refused(capsys, ["config", "show", "--resume", str(run), *flags], run.parent)
    said = refused(capsys, ["run", "--resume", str(run), "-q", *flags], run.parent)
    assert shown == said


def test_config_show_resume_shows_a_change_a_resume_may_make(capsys, copy):
    run = copy("run")
    assert main(["config", "show", "--resume", str(run), "-r", "5"]) == 0
    assert any(line.split()[:2] == ["rounds", "5"] for line in capsys.readouterr().out.splitlines())


# -- reading a grid: report, compare ------------------------------------------------------------
@pytest.mark.parametrize("damage", [*JSON_DAMAGE, "missing"])
def test_report_of_a_grid_with_damaged_grid_json(capsys, copy, damage):
    grid = copy("grid")
    DAMAGE[damage](grid / "grid.json")
    assert "grid.json" in refused(capsys, ["report", str(grid)], grid.parent)


def test_report_of_a_grid_whose_manifest_names_a_path_outside_it(capsys, copy):
    grid = copy("grid")
    manifest = json.loads((grid / "grid.json").read_text())
    manifest["runs"][0]["name"] = "../../elsewhere"
    (grid / "grid.json").write_text(json.dumps(manifest))
    assert "plain directory name" in refused(capsys, ["report", str(grid)], grid.parent)


@pytest.mark.parametrize("file,damage", [
    *[("config.json", d) for d in JSON_DAMAGE], *[("summary.json", d) for d in JSON_DAMAGE],
    *[("metrics.csv", d) for d in CSV_DAMAGE],
])
def test_report_of_a_grid_with_a_damaged_run(capsys, copy, file, damage):
    grid = copy("grid")
    DAMAGE[damage](grid / "runs" / "fedavg__seed0" / file)
    line = refused(capsys, ["report", str(grid)], grid.parent)
    assert f"fedavg__seed0/{file}" in line


@pytest.mark.parametrize("damage", JSON_DAMAGE + ("missing",))
def test_compare_again_with_a_damaged_runs_config_json(capsys, copy, damage):
    """A grid run again over a run whose config.json is damaged (or gone, with the run's
    results still there) stops before anything runs; it neither reruns nor replaces it."""
    grid = copy("grid")
    DAMAGE[damage](grid / "runs" / "fedavg__seed0" / "config.json")
    line = refused(capsys, ["compare", "--config", str(grid / "grid.toml"), "--out", str(grid)],
                   grid.parent)
    assert "fedavg__seed0" in line


@pytest.mark.parametrize("damage", ("binary", "torn", "empty", "missing"))
def test_compare_again_with_a_damaged_grid_toml(capsys, copy, damage):
    grid = copy("grid")
    DAMAGE[damage](grid / "grid.toml")
    assert "grid.toml" in refused(capsys, ["compare", "--config", str(grid / "grid.toml"),
                                           "--out", str(grid)], grid.parent)


@pytest.mark.parametrize("damage", ("null", "binary", "torn"))
def test_compare_again_rebuilds_a_runs_damaged_summary(capsys, copy, damage):
    grid = copy("grid")
    summary = grid / "runs" / "fedavg__seed0" / "summary.json"
    DAMAGE[damage](summary)
    assert main(["compare", "--config", str(grid / "grid.toml"), "--out", str(grid)]) == 0
    assert json.loads(summary.read_text())["finished"] is True
    assert f"{summary}" in capsys.readouterr().err  # named, as the grid rewrites it


# -- report: whose directory, whose files --------------------------------------------------------
def test_report_out_never_replaces_or_deletes_a_users_file(capsys, copy, tmp_path):
    run = copy("run")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "fig_mine.png").write_bytes(b"my own figure")
    (out / "notes.txt").write_text("my notes")
    assert main(["report", str(run), "--out", str(out)]) == 0
    drawn = set(json.loads((out / ".fedhet-report.json").read_text())["files"])
    assert "report.html" in drawn and "fig_mine.png" not in drawn
    assert (out / "fig_mine.png").read_bytes() == b"my own figure"
    assert (out / "notes.txt").read_text() == "my notes"
    assert main(["report", str(run), "--out", str(out)]) == 0  # its own files: replaced
    (out / "report.html").write_text("my page now")  # changed by the user: theirs
    line = refused(capsys, ["report", str(run), "--out", str(out)], out)
    assert "report.html" in line


def test_report_removes_only_its_own_unchanged_figures_of_the_last_page(copy, tmp_path):
    run = copy("run")
    out = tmp_path / "page"
    assert main(["report", str(run), "--out", str(out)]) == 0
    record = json.loads((out / ".fedhet-report.json").read_text())
    (out / "fig_gone.png").write_bytes(b"an old figure of fedhet's")
    (out / "fig_edited.png").write_bytes(b"fedhet's, then edited")
    record["files"]["fig_gone.png"] = hashlib.sha256(b"an old figure of fedhet's").hexdigest()
    record["files"]["fig_edited.png"] = hashlib.sha256(b"as fedhet wrote it").hexdigest()
    (out / ".fedhet-report.json").write_text(json.dumps(record))
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert not (out / "fig_gone.png").exists()
    assert (out / "fig_edited.png").read_bytes() == b"fedhet's, then edited"


def test_report_refuses_another_tools_directory(capsys, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model": "resnet18", "epochs": 3, "lr": 0.1}))
    (other / "metrics.csv").write_text("epoch,loss\n1,0.5\n2,0.4\n")
    line = refused(capsys, ["report", str(other)], tmp_path)
    assert "not a fedhet run" in line
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "metrics.csv"]


def test_report_of_a_run_made_before_the_marker_existed(copy):
    """A run without the `.fedhet` marker is fedhet's when its config.json builds as fedhet
    settings."""
    run = copy("run")
    (run / ".fedhet").unlink()
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").exists()
    (run / ".fedhet-report.json").unlink()  # a page an older fedhet drew: its own files still
    assert main(["report", str(run)]) == 0


def test_report_of_a_folder_of_runs_leaves_out_another_tools_directories(capsys, copy):
    run = copy("run")
    other = run.parent / "other"
    other.mkdir()
    (other / "config.json").write_bytes(b"\x00 not even JSON")
    (other / "metrics.csv").write_text("epoch,loss\n1,0.5\n")
    assert main(["report", str(run.parent), "--out", str(run.parent / "page")]) == 0
    assert "left out 1 director" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "metrics.csv"]


# -- paper-scale's result files ----------------------------------------------------------------
@pytest.fixture
def results(tmp_path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(RESULTS / "fednova", out / "fednova")
    return out


@pytest.mark.parametrize("file,damage", [
    *[("synthetic.csv", d) for d in (*CSV_DAMAGE, "missing")],
    *[("synthetic.json", d) for d in JSON_DAMAGE],
])
def test_paper_scale_with_a_damaged_result_file(capsys, results, tmp_path, file, damage):
    DAMAGE[damage](results / "fednova" / file)
    page = tmp_path / "page.md"
    line = refused(capsys, ["paper-scale", "--results", str(results), "--out", str(page)],
                   results)
    assert f"fednova/synthetic.{'json' if damage == 'missing' else file.split('.')[1]}" in line
    assert not page.exists()


# -- plugin files and the campaign's state -------------------------------------------------------
@pytest.mark.parametrize("content", [b"null\n", b"\x00\xff garbage", b"def f(:\n", b"x = (\n"])
def test_a_damaged_plugin_file_is_one_line(capsys, tmp_path, own_registrations, content):
    plugin = tmp_path / "mine.py"
    plugin.write_bytes(content)
    assert "mine.py" in refused(capsys, ["--plugin", str(plugin), "list"], tmp_path)


def test_a_plugin_that_registers_nothing_is_named(capsys, tmp_path, own_registrations):
    plugin = tmp_path / "empty.py"
    plugin.write_text("")
    assert main(["--plugin", str(plugin), "list"]) == 0
    assert "registered no algorithm" in capsys.readouterr().err


# -- arguments that were silently ignored or misread ----------------------------------------------
@pytest.mark.parametrize("argv,said", [
    (["--budget", "100000"], "--budget"), (["--budget", "1e308"], "--budget"),
    (["--budget", "nan"], "--budget"), (["--budget", "5", "--tables", ""], "--tables"),
    (["--budget", "5", "--tables", "bench,,fedsr-mnist"], "--tables"),
    (["--budget", "5", "--set", "lr=0.5"], "--set"), (["--budget", "5", "-a", "fedavg"], "--algorithm"),
    (["--budget", "5", "--jobs", "2"], "--jobs"), (["--budget", "5", "--only", "mnist"], "--only"),
    (["--budget", "5", "--cluster", "ray"], "--cluster"), (["--budget", "5", "--force"], "--force"),
])
def test_reproduce_all_refuses_what_it_would_ignore(capsys, tmp_path, argv, said):
    line = refused(capsys, ["reproduce", "all", "--device", "cpu", "--results", str(tmp_path / "r"),
                            "--cache", str(tmp_path / "cache"), *argv], tmp_path)
    assert said in line


@pytest.mark.parametrize("argv,said", [
    (["--sweep", "lr=0.1,,0.2"], "empty value"), (["--sweep", "lr=0.1,0.2,"], "empty value"),
    (["--sweep", "lr=0.1", "--sweep", "lr=0.2"], "given twice"),
    (["-a", "fedavg,fedprox", "--sweep", "algorithm=fedavg"], "both list"),
    (["-a", "fedavg,,fedprox"], "empty name"),
])
def test_compare_refuses_an_empty_or_repeated_sweep(capsys, tmp_path, argv, said):
    assert said in refused(capsys, ["compare", "-d", "digits", *argv, "--dry-run"], tmp_path)


def test_a_run_file_that_is_a_pipe_is_one_line_not_a_hang(capsys, copy):
    run = copy("run")
    (run / "summary.json").unlink()
    os.mkfifo(run / "summary.json")
    assert "not a regular file" in one_error_line(capsys, ["report", str(run)])


# -- a user's model or algorithm that is wrong: one line before anything is written ----------------
NETS = '''
from torch import nn


def narrow(input_shape, num_classes, **kw):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 3))


def wide(input_shape, num_classes, **kw):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes + 2))


def wide_on_purpose(input_shape, num_classes, **kw):
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes + 2))
    net.extra_outputs = True
    return net


def images_only(input_shape, num_classes, **kw):
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.LazyLinear(num_classes))


def not_a_module(input_shape, num_classes, **kw):
    return 3
'''


@pytest.mark.parametrize("factory,said", [
    ("narrow", "returns 3 scores per sample but dataset 'digits' has 10 classes"),
    ("wide", "returns 12 scores per sample but dataset 'digits' has 10 classes"),
    ("images_only", "fails on the inputs of dataset 'digits' (a batch of shape (2, 64)): RuntimeError"),
    ("not_a_module", "returned an object of type int, not a torch.nn.Module"),
])
def test_a_wrong_model_is_one_line_and_force_keeps_the_good_run(capsys, tmp_path, monkeypatch,
                                                                 own_registrations, factory, said):
    (tmp_path / "nets_dry.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    common = ["-d", "digits", "-r", "2", "-n", "3", "--out", str(out), "-q"]
    assert main(["run", *common]) == 0
    capsys.readouterr()
    # the new run's model is wrong: refused before the good run in --out is touched
    line = refused(capsys, ["run", *common, "--force", "-m", f"nets_dry:{factory}"], tmp_path)
    assert said in line and f"nets_dry:{factory}" in line
    assert pr_finished(out)


REGISTERED = '''
import fedhet
from torch import nn


@fedhet.register_model("takes-spec")
def takes_spec(spec):
    return nn.Linear(64, 10)


@fedhet.register_model("raises-inside")
def raises_inside(input_shape, num_classes, params):
    raise ValueError(f"no layer fits {input_shape}")
'''


def _force_over_a_good_run(capsys, tmp_path: Path, plugin_text: str, module: str, flag: str,
                           name: str, rounds: int = 2) -> tuple[str, Path]:
    """A finished run in tmp_path/run, then `run --force --plugin module.py FLAG NAME` over it,
    refused (every file as it was): its error line, and the run directory."""
    plugin = tmp_path / f"{module}.py"
    plugin.write_text(plugin_text)
    out = tmp_path / "run"
    common = ["-d", "digits", "-r", str(rounds), "-n", "3", "--out", str(out), "-q"]
    assert main(["run", *common]) == 0
    capsys.readouterr()
    line = refused(capsys, ["run", *common, "--force", "--plugin", str(plugin), flag, name],
                   tmp_path)
    return line, out


@pytest.mark.parametrize("model,said", [
    ("takes-spec", "model 'takes-spec': the factory raised TypeError: takes_spec() takes 1 "
                   "positional argument but 3 were given (called as factory(input_shape=(64,), "
                   "num_classes=10, params) for dataset 'digits')"),
    ("raises-inside", "model 'raises-inside': the factory raised ValueError: no layer fits (64,) "
                      "at "),
])
def test_a_registered_model_whose_factory_raises_is_one_line_and_force_keeps_the_good_run(
        capsys, tmp_path, own_registrations, model, said):
    """A factory registered by a plugin is called as factory(input_shape, num_classes, params):
    one that takes other arguments, or raises inside, is one line naming it (and where the
    user's code raised) before the good run in --out is touched."""
    line, out = _force_over_a_good_run(capsys, tmp_path, REGISTERED, "nets_registered", "-m", model)
    assert said in line
    if model == "raises-inside":  # where: the plugin's line, the path shortened as shown
        assert "_registered.py:13 in raises_inside (called as factory(" in line
    assert pr_finished(out)


ALGORITHMS_PLUGIN = '''
import fedhet

FedAvg = fedhet.ALGORITHMS.get("fedavg").factory


@fedhet.register_algorithm("update-without-state")
class UpdateWithoutState(FedAvg):
    def client_update(self, message, ctx):
        return message, None


@fedhet.register_algorithm("init-takes-one")
class InitTakesOne(FedAvg):
    def __init__(self, run):
        super().__init__(None, run)


@fedhet.register_algorithm("init-raises")
class InitRaises(FedAvg):
    def __init__(self, params, run):
        raise KeyError("mu")
'''


@pytest.mark.parametrize("algorithm,said", [
    ("update-without-state",
     "algorithm 'update-without-state': UpdateWithoutState.client_update(self, message, ctx) cannot "
     "be called as client_update(message, ctx, state), the way fedhet calls it"),
    ("init-takes-one", "algorithm 'init-takes-one': InitTakesOne.__init__(self, run) cannot be "
                       "called as __init__(params, run)"),
    ("init-raises", "algorithm 'init-raises': its constructor raised KeyError: 'mu' at "),
])
def test_a_plugin_algorithm_that_breaks_the_protocol_is_one_line_and_force_keeps_the_good_run(
        capsys, tmp_path, own_registrations, algorithm, said):
    """Before anything is written: a method that cannot take the arguments fedhet calls it with,
    or a constructor that raises; as a run over a good one with --force, and as a grid."""
    line, out = _force_over_a_good_run(capsys, tmp_path, ALGORITHMS_PLUGIN, "algos_bad", "-a",
                                       algorithm)
    assert said in line
    assert pr_finished(out)
    if algorithm != "init-raises":  # a grid checks the classes before it builds or writes anything
        grid = tmp_path / "grid"
        plugin = tmp_path / "algos_bad.py"
        line = refused(capsys, ["compare", "--plugin", str(plugin), "-a", f"fedavg,{algorithm}",
                                "-d", "digits", "-n", "3", "-r", "1", "--out", str(grid)], tmp_path)
        assert said in line and not grid.exists()


RAISES_PLUGIN = '''
import fedhet

FedAvg = fedhet.ALGORITHMS.get("fedavg").factory
PARAMS = fedhet.ALGORITHMS.get("fedavg").params


@fedhet.register_algorithm("raises-in-update", PARAMS)
class RaisesInUpdate(FedAvg):
    def client_update(self, message, ctx, state):
        raise RuntimeError("broken client_update")


@fedhet.register_algorithm("raises-in-round-2", PARAMS)
class RaisesInRound2(FedAvg):
    def aggregate(self, state, round, replies):
        if round == 1:
            raise RuntimeError("broken aggregate")
        return super().aggregate(state, round, replies)
'''


def test_force_puts_the_good_run_back_when_the_new_one_fails_before_it_saves_a_round(
        capsys, tmp_path, own_registrations):
    """An algorithm that takes the right arguments but raises in round 1: the run it was to
    replace is back, file for file; one that fails in round 2 has replaced it (its round 1 is
    saved), and nothing is left set aside."""
    line, out = _force_over_a_good_run(capsys, tmp_path, RAISES_PLUGIN, "algos_raise", "-a",
                                       "raises-in-update", rounds=3)
    plugin = tmp_path / "algos_raise.py"
    common = ["-d", "digits", "-r", "3", "-n", "3", "--out", str(out), "-q"]
    assert line.startswith("error: round 1 (ctx.round=0 in client_update's arguments): client 0: ")
    assert "RuntimeError: broken client_update" in line
    assert f"the new run saved no round, so the run that was in {out} is back as it was" in line
    assert pr_finished(out) and not (out / ".fedhet-replaced").exists()
    assert one_error_line(capsys, ["run", *common, "--force", "--plugin", str(plugin), "-a",
                                   "raises-in-round-2"]).startswith(
        "error: round 2 (round=1 in aggregate's arguments): ")
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["algorithm"], summary["status"], summary["rounds_done"]) == \
        ("raises-in-round-2", "failed", 1)
    assert not (out / ".fedhet-replaced").exists()


def test_a_batch_of_runs_puts_back_the_run_a_failed_replacement_was_to_replace(
        tmp_path, own_registrations):
    """`execute_together` hands errors back instead of raising: the failed run's directory
    still gets its old run back, and the good one's replacement stands."""
    from fedhet import plugins
    from fedhet.runs.single import execute, execute_together

    plugin = tmp_path / "algos_raise.py"
    plugin.write_text(RAISES_PLUGIN)
    plugins.load_plugins(str(plugin))
    base = {"dataset": "digits", "rounds": 2, "clients": 3}
    good, bad = tmp_path / "good", tmp_path / "bad"
    for out in (good, bad):
        execute(base, out, log=lambda _: None)
    before = digest(bad)
    results = execute_together([({**base, "seed": 1}, good, False),
                                ({**base, "algorithm": "raises-in-update"}, bad, False)],
                               force=True, log=lambda _: None)
    assert results[0]["finished"] is True and json.loads((good / "summary.json").read_text())["seed"] == 1
    assert isinstance(results[1], Exception) and "broken client_update" in str(results[1])
    assert digest(bad) == before and not (bad / ".fedhet-replaced").exists()
    assert not (good / ".fedhet-replaced").exists()


def test_a_replacement_killed_before_it_saved_keeps_the_run_set_aside(tmp_path):
    """`set_aside` twice (the first replacement killed before it saved a round): the run set
    aside first is the one kept, the killed attempt's files go; `put_back` restores it and
    `clear` removes what is set aside too."""
    from fedhet.rundir import ownership

    out = tmp_path / "run"
    ownership.mark(out, "run")
    (out / "config.json").write_text("old")
    (out / "notes.txt").write_text("mine")  # not fedhet's: never moved or removed
    ownership.set_aside(out, warn=lambda _: None)
    assert sorted(p.name for p in out.iterdir()) == [".fedhet", ".fedhet-replaced", "notes.txt"]
    (out / "config.json").write_text("attempt")
    ownership.set_aside(out, warn=lambda _: None)
    assert (out / ".fedhet-replaced" / "config.json").read_text() == "old"
    assert not (out / "config.json").exists()
    (out / "metrics.csv").write_text("attempt 2")
    ownership.put_back(out)
    assert sorted(p.name for p in out.iterdir()) == [".fedhet", "config.json", "notes.txt"]
    assert (out / "config.json").read_text() == "old"
    ownership.set_aside(out, warn=lambda _: None)
    ownership.clear(out, warn=lambda _: None)
    assert sorted(p.name for p in out.iterdir()) == [".fedhet", "notes.txt"]


def test_every_built_in_algorithm_keeps_the_protocol():
    """The check refuses none of fedhet's own algorithms (it reads only their signatures)."""
    from fedhet.algorithms.base import ALGORITHMS
    from fedhet.engine.dry import check_algorithm

    names = ALGORITHMS.names()
    assert len(names) >= 15
    for name in names:
        check_algorithm(ALGORITHMS.get(name).factory, name)


def test_a_grid_with_a_wrong_model_is_one_line_before_it_writes_anything(
        capsys, tmp_path, monkeypatch, own_registrations):
    (tmp_path / "nets_dry.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    grid = tmp_path / "grid"
    common = ["compare", "-a", "fedavg,fedprox", "-d", "digits", "-n", "3", "-r", "1",
              "--out", str(grid)]
    line = refused(capsys, [*common, "-m", "nets_dry:narrow"], tmp_path)
    assert "returns 3 scores per sample but dataset 'digits' has 10 classes" in line
    assert not grid.exists()
    assert main(common) == 0
    capsys.readouterr()
    before = digest(grid)
    refused(capsys, [*common, "-m", "nets_dry:wide", "--force"], tmp_path)
    assert digest(grid) == before  # --force removed nothing: the new grid failed its dry start


def pr_finished(run: Path) -> bool:
    return json.loads((run / "summary.json").read_text())["finished"] is True


def test_a_model_may_say_its_extra_outputs_are_meant(capsys, tmp_path, monkeypatch, own_registrations):
    (tmp_path / "nets_dry.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(["run", "-d", "digits", "-r", "2", "-n", "3", "--out", str(out), "-q",
                 "-m", "nets_dry:wide_on_purpose"]) == 0
    assert pr_finished(out)


def test_the_dry_start_changes_no_result(tmp_path):
    """The check's forward pass (eval mode, no gradients) leaves a BatchNorm model's run as it
    was: the same metrics with and without it."""
    import fedhet.engine.assembly as assemble_module

    common = ["-d", "digits", "-m", "cnn-fednnnn-cifar", "-r", "2", "-n", "3", "-q"]
    assert main(["run", *common, "--out", str(tmp_path / "a")]) == 0
    real = assemble_module.dry_start
    try:
        assemble_module.dry_start = lambda module, *a: module
        assert main(["run", *common, "--out", str(tmp_path / "b")]) == 0
    finally:
        assemble_module.dry_start = real

    def rows(d: Path) -> list[str]:
        return [",".join(line.split(",")[:3]) for line in (d / "metrics.csv").read_text().splitlines()]

    assert rows(tmp_path / "a") == rows(tmp_path / "b")


def test_an_algorithm_registered_with_no_params_class_is_one_line_at_registration(
        capsys, tmp_path, own_registrations):
    plugin = tmp_path / "alg_none.py"
    plugin.write_text("import fedhet\nfrom fedhet.algorithms.fedavg import FedAvg\n\n"
                      "@fedhet.register_algorithm('alg-none', None, 'doc')\nclass Mine(FedAvg):\n    pass\n")
    line = refused(capsys, ["--plugin", str(plugin), "run", "-a", "alg-none", "-d", "digits",
                            "--out", str(tmp_path / "x")], tmp_path)
    assert "register algorithm 'alg-none': its parameters must be a dataclass class" in line
    assert "got None" in line


def test_a_resume_keeps_the_report_of_the_run(capsys, tmp_path):
    """`fedhet report` leaves its record (`.fedhet-report.json`) in the run directory; a resume
    keeps it and says nothing of temporary files, while a killed writer's temporary is removed."""
    run = tmp_path / "run"
    common = ["-d", "digits", "-n", "3", "-q"]
    assert main(["run", *common, "-r", "2", "--out", str(run)]) == 0
    assert main(["report", str(run)]) == 0
    record = run / ".fedhet-report.json"
    assert record.is_file()
    (run / ".summary.json.x1y2").write_text("{")  # half an atomic write a killed run left
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "-r", "3", "-q"]) == 0
    said = "".join(capsys.readouterr())
    assert record.is_file() and "removed 1 temporary file(s)" in said
    assert not (run / ".summary.json.x1y2").exists()


def test_a_csv_with_pandas_row_index_is_one_line(capsys, tmp_path):
    """pandas' default `to_csv` writes the row index as a first column with no name; read as a
    feature it makes the run diverge (the message said "lower lr"): it is refused instead."""
    pd = pytest.importorskip("pandas")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    frame = pd.DataFrame(x[:300], columns=[f"p{i}" for i in range(64)]).assign(label=y[:300])
    frame.to_csv(tmp_path / "indexed.csv")  # pandas' default: index=True
    frame.to_csv(tmp_path / "plain.csv", index=False)
    line = refused(capsys, ["run", "-d", str(tmp_path / "indexed.csv"), "-r", "1", "-n", "3",
                            "--out", str(tmp_path / "a")], tmp_path)
    assert "its first column '' has no name (values 0, 1, 2, …)" in line and "index=False" in line
    assert main(["run", "-d", str(tmp_path / "plain.csv"), "-r", "1", "-n", "3", "-q",
                 "--out", str(tmp_path / "b")]) == 0


def test_an_unnamed_first_column_is_an_index_whatever_it_holds(capsys, tmp_path):
    """A slice's index (starting at 100) or a shuffled one is still pandas' row index: an
    unnamed first column is refused in one line, not trained on as a feature."""
    pd = pytest.importorskip("pandas")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    frame = pd.DataFrame(x[:600], columns=[f"p{i}" for i in range(64)]).assign(label=y[:600])
    frame.iloc[100:400].to_csv(tmp_path / "sliced_index.csv")
    frame.sample(frac=0.5, random_state=0).to_csv(tmp_path / "shuffled.csv")
    frame.iloc[:300].reset_index().rename(columns={"index": "Unnamed: 0"}).to_csv(
        tmp_path / "named_unnamed.csv", index=False)
    for name in ("sliced_index", "shuffled", "named_unnamed"):
        out = tmp_path / f"run-{name}"
        line = refused(capsys, ["run", "-d", str(tmp_path / f"{name}.csv"), "-r", "1", "-n", "3",
                                "--out", str(out)], tmp_path)
        assert "has no name" in line and "row index" in line and "index=False" in line, line
        assert not out.exists()


# -- user code that raises mid-run ---------------------------------------------------------------
BAD_ALGORITHMS = '''\
from pathlib import Path
from dataclasses import dataclass, replace

import fedhet
from fedhet.algorithms.base import Algorithm
from fedhet.algorithms.fedavg import client_diagnostics, local_sgd_update, mean_delta


@dataclass(frozen=True)
class BadParams:
    boom_round: int = 1


def broken():
    return not Path(__file__).with_name("fixed").exists()  # a file: grid workers see it too


@fedhet.register_algorithm("bad-aggregate", BadParams, "aggregate raises from round 2")
class BadAggregate(Algorithm):
    def client_update(self, message, ctx, state):
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def aggregate(self, state, round, replies):
        if round >= self.params.boom_round and broken():
            raise ValueError("my aggregate is broken")
        acc, delta = mean_delta(replies, "samples")
        return replace(state, w=state.w + delta), client_diagnostics(acc)


@fedhet.register_algorithm("bad-client", BadParams, "client_update raises")
class BadClient(Algorithm):
    def client_update(self, message, ctx, state):
        if broken():
            raise KeyError("missing thing")
        _, _, reply = local_sgd_update(message, ctx)
        return reply, state

    def aggregate(self, state, round, replies):
        acc, delta = mean_delta(replies, "samples")
        return replace(state, w=state.w + delta), client_diagnostics(acc)
'''
RAISES_AT = {"bad-aggregate": ("bad_user.py:26 in aggregate", "ValueError: my aggregate is broken", 2),
             "bad-client": ("bad_user.py:35 in client_update", "KeyError: 'missing thing'", 1)}
SAID = {"bad-aggregate": "round 2 (round=1 in aggregate's arguments): ",
        "bad-client": "round 1 (ctx.round=0 in client_update's arguments): client 0: "}
"""How the error line names the round (and the client) before the place in the user's code."""


@pytest.fixture
def bad_plugin(tmp_path, own_registrations, monkeypatch):
    monkeypatch.setenv("FEDHET_DEBUG", "0")  # restored after the test: --debug sets it
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "bad_user.py"
    plugin.write_text(BAD_ALGORITHMS)
    return plugin


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize("executor", [[], ["--executor", "stacked"], ["--workers", "2"]],
                         ids=["sequential", "stacked", "processes"])
@pytest.mark.parametrize("algorithm", ["bad-aggregate", "bad-client"])
def test_user_code_that_raises_mid_run_is_one_line_and_the_run_resumes_after_the_fix(
        capsys, bad_plugin, monkeypatch, tmp_path, algorithm, executor):
    """Server half or client half, on every executor: exit 2, one line naming the user's file,
    line and exception, `summary.json` marked failed with the round, the rounds before it kept;
    after the fix the resume finishes the run."""
    run = tmp_path / "run"
    where, error, round = RAISES_AT[algorithm]
    line = one_error_line(capsys, ["--plugin", str(bad_plugin), "run", "-a", algorithm,
                                   "-d", "digits", "-n", "3", "-r", "3", "--out", str(run), "-q",
                                   *executor])
    assert line.startswith(f"error: {SAID[algorithm]}{where}: {error}")
    assert f"fedhet run --resume {run}" in line
    summary = summary_of(run)
    assert summary["status"] == "failed" and summary["finished"] is False
    assert summary["failed"]["round"] == round and summary["failed"]["where"] == where
    assert summary["failed"]["user_code"] is True
    assert len((run / "metrics.csv").read_text().splitlines()) == 1 + round  # header, rounds 0…
    (tmp_path / "fixed").write_text("")
    assert main(["run", "--resume", str(run), "-q"]) == 0
    summary = summary_of(run)
    assert summary["status"] == "finished" and summary["rounds_done"] == 3 and "failed" not in summary


def test_debug_shows_the_traceback_of_user_code(capsys, bad_plugin, tmp_path):
    assert main(["--plugin", str(bad_plugin), "run", "-a", "bad-aggregate", "-d", "digits",
                 "-n", "3", "-r", "2", "--out", str(tmp_path / "run"), "-q", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and 'bad_user.py", line 26, in aggregate' in err
    assert err.strip().splitlines()[-1].startswith(
        "error: round 2 (round=1 in aggregate's arguments): bad_user.py:26 in aggregate: ")


LATE_PLUGIN = """\
import fedhet

FedAvg = fedhet.ALGORITHMS.get("fedavg").factory


@fedhet.register_algorithm("breaks-late", fedhet.ALGORITHMS.get("fedavg").params)
class BreaksLate(FedAvg):
    def aggregate(self, state, round, replies):
        if round >= 2:
            raise RuntimeError(f"no aggregate once round >= 2 (got {round})")
        return super().aggregate(state, round, replies)
"""


def test_an_error_in_the_algorithm_names_the_round_as_runs_count_and_as_its_argument(
        capsys, tmp_path, own_registrations, monkeypatch):
    """Runs count rounds from 1, the algorithm's `round` is the index from 0: an aggregate that
    raises once `round >= 2` fails the third round, and the one error line says both."""
    monkeypatch.setenv("FEDHET_DEBUG", "0")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "late_user.py").write_text(LATE_PLUGIN)
    line_no = LATE_PLUGIN.splitlines().index(
        '            raise RuntimeError(f"no aggregate once round >= 2 (got {round})")') + 1
    line = one_error_line(capsys, ["--plugin", "late_user.py", "run", "-a", "breaks-late",
                                   "-d", "digits", "-n", "3", "-r", "4", "--out", "run", "-q"])
    assert line == (
        f"error: round 3 (round=2 in aggregate's arguments): late_user.py:{line_no} in aggregate: "
        "RuntimeError: no aggregate once round >= 2 (got 2); the run is marked failed in "
        "run/summary.json and the rounds before it are kept: fix it, then `fedhet run --resume "
        "run` continues (--debug shows the traceback)")
    summary = summary_of(tmp_path / "run")
    assert (summary["status"], summary["rounds_done"], summary["failed"]["round"]) == ("failed", 2, 3)
    rounds = [int(r.split(",")[0]) for r in (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1:]]
    assert rounds == [0, 1, 2]  # the initial model, then the two rounds that finished


def test_user_code_that_raises_through_the_library_keeps_its_cause(bad_plugin, tmp_path):
    import fedhet

    fedhet.load_plugins(str(bad_plugin))
    with pytest.raises(fedhet.FedhetError, match="bad_user.py:26 in aggregate") as caught:
        fedhet.run("bad-aggregate", "digits", clients=3, rounds=2, out=tmp_path / "run",
                   log=lambda line: None)
    assert isinstance(caught.value.__cause__, ValueError)  # a notebook shows the user's traceback
    assert summary_of(tmp_path / "run")["status"] == "failed"


def test_a_grid_with_user_code_that_raises_marks_those_runs_failed_and_resumes(
        capsys, bad_plugin, monkeypatch, tmp_path):
    grid = tmp_path / "grid"
    argv = ["--plugin", str(bad_plugin), "compare", "-a", "fedavg,bad-aggregate,bad-client",
            "-d", "digits", "-n", "3", "-r", "2", "--jobs", "2", "--out", str(grid)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()  # compare's progress goes to stderr
    assert any(f"bad-aggregate__seed0 failed: {SAID['bad-aggregate']}bad_user.py:26 in aggregate: "
               "ValueError" in line for line in err)
    assert any(f"bad-client__seed0 failed: {SAID['bad-client']}bad_user.py:35 in client_update"
               in line for line in err)
    assert err[-1].startswith("error: 2 of 3 runs failed") and "Traceback" not in "".join(err)
    status = {d.name: summary_of(d)["status"] for d in (grid / "runs").iterdir()}
    assert status == {"fedavg__seed0": "finished", "bad-aggregate__seed0": "failed",
                      "bad-client__seed0": "failed"}
    (tmp_path / "fixed").write_text("")
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    assert {summary_of(d)["status"] for d in (grid / "runs").iterdir()} == {"finished"}


def test_a_failed_run_has_no_accuracy_and_reports_list_it_as_failed(capsys, bad_plugin, tmp_path):
    """A run that fails in its first round records no accuracy (the untrained model's is no
    result): summary.json has none, results.csv's cell is empty, summary.md lists it as failed
    and its table cells are empty, also when the grid is collected again without the error."""
    import csv
    import re

    from fedhet.runs.grid_manifest import read_manifest
    from fedhet.runs.presets import RunSpec
    from fedhet.runs.results import collect

    bad_plugin.write_text(BAD_ALGORITHMS.replace("boom_round: int = 1", "boom_round: int = 0"))
    grid = tmp_path / "grid"
    assert main(["--plugin", str(bad_plugin), "compare", "-a", "fedavg,bad-aggregate", "-d",
                 "digits", "-n", "3", "-r", "2", "--out", str(grid)]) == 2
    summary = summary_of(grid / "runs" / "bad-aggregate__seed0")
    assert summary["status"] == "failed" and summary["rounds_done"] == 0
    assert not {"final_accuracy", "best_accuracy", "best_round", "final_loss"} & set(summary)
    specs = [RunSpec(r["name"], r["group"], r["label"], r["settings"])
             for r in read_manifest(grid)["runs"]]
    for _ in range(2):  # as compare wrote them, then collected again from the run directories
        with (grid / "results.csv").open() as f:
            rows = {r["name"]: r for r in csv.DictReader(f)}
        assert rows["bad-aggregate__seed0"]["status"] == "failed"
        assert rows["bad-aggregate__seed0"]["final_accuracy"] in ("", "nan")
        assert float(rows["fedavg__seed0"]["final_accuracy"]) > 0
        text = (grid / "summary.md").read_text()
        assert "bad-aggregate__seed0 (failed)" in text
        assert re.search(r"\| bad-aggregate \| (failed)? ?\|", text), text
        collect(grid, "again", specs, None)


def test_an_unregistered_class_reading_a_setting_it_was_not_given_says_how(tmp_path,
                                                                         own_registrations):
    """A class handed in without a `Params` dataclass gets none; reading a setting names the fix
    (it failed in a worker as `'NoParams' object has no attribute 'gamma'`)."""
    from dataclasses import replace

    import fedhet
    from fedhet.algorithms.base import Algorithm
    from fedhet.algorithms.fedavg import client_diagnostics, local_sgd_update, mean_delta

    class NoParamsAvgM(Algorithm):
        def client_update(self, message, ctx, state):
            return local_sgd_update(message, ctx)[2], state

        def aggregate(self, state, round, replies):
            acc, delta = mean_delta(replies, "samples")
            return replace(state, w=state.w + self.params.gamma * delta), client_diagnostics(acc)

    with pytest.raises(fedhet.FedhetError, match="no setting 'gamma'.*`Params` dataclass"):
        fedhet.run(NoParamsAvgM, "digits", clients=3, rounds=1, out=tmp_path / "a", log=lambda s: None)

    class BadParamsAvgM(NoParamsAvgM):
        Params = {"gamma": 0.9}

    with pytest.raises(fedhet.FedhetError, match="BadParamsAvgM.Params is .* not a dataclass"):
        fedhet.run(BadParamsAvgM, "digits", clients=3, rounds=1, out=tmp_path / "b")
    assert not (tmp_path / "b").exists()


# -- imports where a user expects them, paths that travel (items 3 and 4) -------------------------
def _fedhet_here(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """The `fedhet` command as a console script runs it: the working directory is not on the
    module path by itself (`python -P`), as it is not for the installed `fedhet`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEDHET_PLUGINS")}
    env.update(OMP_NUM_THREADS="1", FEDHET_CORES="1", PYTHONPATH=str(SRC))
    return subprocess.run([sys.executable, "-P", "-c", "import sys; from fedhet.cli import main; "
                           "sys.exit(main())", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_model_module_in_the_working_directory_runs_and_resumes_from_anywhere(tmp_path):
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (home / "mymodels").mkdir(parents=True)
    elsewhere.mkdir()
    (home / "mymodels" / "__init__.py").write_text("")
    (home / "mymodels" / "nets.py").write_text(
        "from torch import nn\n\n\ndef tiny(input_shape, num_classes, hidden=16):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(),\n"
        "                         nn.Linear(hidden, num_classes))\n")
    made = _fedhet_here(home, "run", "-m", "mymodels.nets:tiny", "-d", "digits", "-n", "3",
                        "-r", "1", "--out", "run", "-q")
    assert made.returncode == 0, made.stderr
    config = json.loads((home / "run" / "config.json").read_text())
    assert config["provenance"]["plugins"]["mymodels.nets"] == str(home / "mymodels" / "nets.py")
    resumed = _fedhet_here(elsewhere, "run", "--resume", str(home / "run"), "-r", "2", "-q")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr == "" and resumed.stdout == ""  # no false "registered no ..." warning
    assert summary_of(home / "run")["rounds_done"] == 2
    (home / "mymodels").rename(home / "moved")
    gone = _fedhet_here(elsewhere, "run", "--resume", str(home / "run"), "-r", "3", "-q")
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1
    assert "no module named 'mymodels'" in gone.stderr
    assert "run from the folder that holds 'mymodels', or put that folder on PYTHONPATH" in gone.stderr


def test_a_grid_with_a_relative_data_file_runs_again_from_another_directory(capsys, tmp_path,
                                                                            monkeypatch):
    pd = pytest.importorskip("pandas")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    pd.DataFrame(x[:300], columns=[f"p{i}" for i in range(64)]).assign(label=y[:300]).to_csv(
        home / "mine.csv", index=False)
    monkeypatch.chdir(home)
    assert main(["compare", "-d", "mine.csv", "-a", "fedavg,fedprox", "-n", "3", "-r", "1",
                 "--out", "grid"]) == 0
    saved = (home / "grid" / "grid.toml").read_text()
    assert f'dataset = "{home / "mine.csv"}"' in saved and "data paths made absolute" in saved
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["compare", "--config", str(home / "grid" / "grid.toml"),
                 "--out", str(home / "grid")]) == 0
    assert "2 runs; results in" in capsys.readouterr().out


# -- small truths (items 5 and 6) ---------------------------------------------------------------
def test_quiet_prints_nothing_but_errors(capsys, tmp_path):
    assert main(["run", "-d", "digits", "-n", "4", "-r", "2", "-q", "--out", str(tmp_path / "a")]) == 0
    assert capsys.readouterr() == ("", "")
    assert summary_of(tmp_path / "a")["finished"] is True


def test_an_algorithm_defined_in_a_script_records_its_file_and_class(tmp_path):
    script = tmp_path / "my_script.py"
    script.write_text(
        "from dataclasses import replace\n\nimport fedhet\nfrom fedhet.algorithms.base import Algorithm\n"
        "from fedhet.algorithms.fedavg import client_diagnostics, local_sgd_update, mean_delta\n\n\n"
        "class ScriptAvg(Algorithm):\n"
        "    def client_update(self, message, ctx, state):\n"
        "        return local_sgd_update(message, ctx)[2], state\n\n"
        "    def aggregate(self, state, round, replies):\n"
        "        acc, delta = mean_delta(replies, 'samples')\n"
        "        return replace(state, w=state.w + delta), client_diagnostics(acc)\n\n\n"
        "fedhet.run(ScriptAvg, 'digits', clients=3, rounds=1, out='run', log=lambda s: None)\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEDHET_CORES": "1", "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    provenance = json.loads((tmp_path / "run" / "config.json").read_text())["provenance"]
    assert provenance["scripts"]["algorithm"] == {
        "name": "scriptavg", "object": "__main__.ScriptAvg", "file": str(script), "line": 8}


def test_fedveca_says_once_when_tau_settles_at_the_bottom_of_its_range(tmp_path):
    import fedhet

    said: list[str] = []
    result = fedhet.run("fedveca", "digits", "iid", clients=5, rounds=6, out=tmp_path / "fv",
                        log=said.append)
    notes = [line for line in said if line.startswith("note: FedVeca's τ settled")]
    assert len(notes) == 1 and "by round 5" in notes[0]
    assert result.summary["notes"] == [notes[0].removeprefix("note: ")]
    for row in result.metrics[3:6]:  # what the note says is so: rounds 3–5 (1-based)
        assert sorted(float(row[f"tau_{i}"]) for i in range(5))[2] == 2


def test_fedavg_makes_no_note(tmp_path):
    import fedhet

    result = fedhet.run("fedavg", "digits", "iid", clients=5, rounds=4, out=tmp_path / "fa",
                        log=lambda line: None)
    assert "notes" not in result.summary


def test_a_csv_run_that_diverges_in_round_1_says_to_check_the_data(capsys, tmp_path):
    pd = pytest.importorskip("pandas")
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    pd.DataFrame(x[:300], columns=[f"p{i}" for i in range(64)]).assign(label=y[:300]).to_csv(
        tmp_path / "mine.csv", index=False)
    assert main(["run", "-d", str(tmp_path / "mine.csv"), "-n", "3", "-r", "2", "--set", "lr=1e6",
                 "-q", "--out", str(tmp_path / "a")]) == 3
    line = capsys.readouterr().err.strip()
    assert "diverged in round 1" in line and "lower lr" in line
    assert "check the data too" in line and "row-index column" in line


# -- the same mistakes from Python: fedhet.run, fedhet.compare with jobs=2, the stacked executor --
@pytest.mark.parametrize("executor", ["sequential", "stacked"])
def test_a_wrong_model_through_the_library_is_one_error_before_anything_is_written(
        tmp_path, executor, own_registrations):
    from torch import nn

    import fedhet

    def narrow(input_shape, num_classes, params):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 3))

    with pytest.raises(fedhet.FedhetError, match="returns 3 scores per sample but dataset "
                       "'digits' has 10 classes"):
        fedhet.run("fedavg", "digits", model=narrow, clients=3, rounds=1, executor=executor,
                   out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_raising_aggregate_through_compare_with_jobs_marks_its_run_failed(bad_plugin, tmp_path):
    import fedhet

    fedhet.load_plugins(str(bad_plugin))
    with pytest.raises(fedhet.FedhetError, match=r"1 of 2 runs failed .*bad_user\.py:26 in "
                       "aggregate: ValueError: my aggregate is broken"):
        fedhet.compare({"dataset": "digits", "clients": 3, "rounds": 2},
                       {"algorithm": ["fedavg", "bad-aggregate"]}, out=tmp_path / "grid", jobs=2,
                       stream=None)
    assert summary_of(tmp_path / "grid" / "runs" / "bad-aggregate__seed0")["status"] == "failed"


def test_a_parameters_class_of_none_through_the_library_is_one_error_at_registration(
        own_registrations):
    import fedhet
    from fedhet.algorithms.fedavg import FedAvg

    with pytest.raises(fedhet.FedhetError, match="register algorithm 'none-params': its "
                       "parameters must be a dataclass class.*got None"):
        fedhet.register_algorithm("none-params", None, "doc")(type("Mine", (FedAvg,), {}))


def test_a_csv_with_pandas_row_index_through_the_library_is_one_error(tmp_path):
    pd = pytest.importorskip("pandas")
    from sklearn.datasets import load_digits

    import fedhet

    x, y = load_digits(return_X_y=True)
    pd.DataFrame(x[:200], columns=[f"p{i}" for i in range(64)]).assign(label=y[:200]).to_csv(
        tmp_path / "indexed.csv")
    with pytest.raises(fedhet.FedhetError, match=r"has no name \(values 0, 1, 2, …\)"):
        fedhet.run("fedavg", str(tmp_path / "indexed.csv"), clients=3, rounds=1,
                   out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_disk_that_fills_while_a_checkpoint_is_written_is_one_line_and_the_run_resumes(
        capsys, tmp_path, monkeypatch):
    """ENOSPC while round 2's checkpoint is written: one line naming the directory and the
    resume; nothing saved is lost, and the resume ends where an uninterrupted run ends."""
    import errno

    import fedhet.rundir.store as store

    common = ["run", "-d", "digits", "-n", "3", "-q"]
    assert main([*common, "-r", "3", "--out", str(tmp_path / "whole")]) == 0
    real, calls = store.atomic_write_bytes, []

    def full(path, data):
        calls.append(path.name)
        if calls.count("checkpoint.pt") == 2 and path.name == "checkpoint.pt":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(store, "atomic_write_bytes", full)
    run = tmp_path / "run"
    line = one_error_line(capsys, [*common, "-r", "3", "--out", str(run)])
    assert f"no room left on the disk to save round 2 in {run} (No space left on device)" in line
    assert f"`fedhet run --resume {run}`" in line and "Traceback" not in line
    monkeypatch.setattr(store, "atomic_write_bytes", real)
    assert main(["run", "--resume", str(run), "-q"]) == 0

    def rows(d: Path) -> list[str]:
        return [",".join(r.split(",")[:3]) for r in (d / "metrics.csv").read_text().splitlines()]

    assert rows(run) == rows(tmp_path / "whole")
