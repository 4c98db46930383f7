"""Damaged files and hostile arguments: one `error:` line, exit 2, and nothing already saved
changed (issue 33, item 5).

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
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_errors import one_error_line

from fedhet.cli import main

RESULTS = Path(__file__).resolve().parents[1] / "results"


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
    import fedhet.engine.assemble as assemble_module

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
    assert "its first column '' has no name and counts 0, 1, 2" in line and "index=False" in line
    assert main(["run", "-d", str(tmp_path / "plain.csv"), "-r", "1", "-n", "3", "-q",
                 "--out", str(tmp_path / "b")]) == 0
