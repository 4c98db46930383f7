"""The command line as researchers use it: did-you-mean, names in any case, kebab
settings, `config show`, `list`'s engine settings, shipped files by name, a missing `--out`,
progress in a log file and the Ctrl-C line. Every run here is digits with 1–3 rounds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_errors import one_error_line

from fedhet.api import new_run_dir
from fedhet.cli import main
from fedhet.runs import show
from fedhet.runs.progress import RoundLines

SRC = str(Path(__file__).resolve().parent.parent / "src")
SMALL = ["-n", "3", "-r", "1", "-p", "iid"]


def fedhet(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "fedhet", *args], capture_output=True, text=True,
                          cwd=cwd, env=environ, timeout=120)


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["-a", "fedavgg"], "unknown algorithm 'fedavgg' (did you mean 'fedavg'"),
        (["-a", "fedporx"], "(did you mean 'fedprox'?)"),
        (["-d", "fashion"], "unknown dataset 'fashion' (did you mean 'fashion-mnist'?)"),
        (["-p", "dirichelt"], "unknown partition 'dirichelt' (did you mean 'dirichlet'?)"),
        (["-m", "cnn-mnst"], "(did you mean 'cnn-mnist'"),
        (["--set", "learning_rate=0.1"], "unknown setting 'learning_rate' (did you mean 'lr'?)"),
        (["--set", "lcoal_epochs=2"], "(did you mean 'local_epochs'"),
        (["-a", "fedprox", "--set", "mu=0.1"], "unknown setting 'mu' (did you mean 'algorithm.mu'?)"),
        (["-a", "fedprox", "--set", "algorithm.muu=0.1"],
         "unknown parameter algorithm.muu (did you mean 'mu'?)"),
        (["--set", "partition.aplha=0.1"], "unknown parameter partition.aplha (did you mean 'alpha'?)"),
    ],
)
def test_a_mistyped_name_gets_the_nearest_one(capsys, argv, hint):
    line = one_error_line(capsys, ["config", "show", *argv])
    assert hint in line, line


@pytest.mark.parametrize("argv", [["-a", "fedavg", "--set", "mu=0.01"], ["--set", "mu=0.01"],
                                  ["--set", "mu=0.01", "--set", "algorithm=fedavg"]])
def test_a_suggestion_names_only_settings_the_chosen_algorithm_has(capsys, argv):
    """fedavg (also as the default, and named after the mistake) has no `mu`: the line does not
    suggest `algorithm.mu`, which would be refused next, but says which algorithms have it."""
    line = one_error_line(capsys, ["config", "show", *argv])
    assert "unknown setting 'mu'" in line and "did you mean 'algorithm.mu'" not in line, line
    assert "fedavg has no parameter mu" in line and "fedprox" in line, line


@pytest.mark.parametrize(
    ("argv", "hint"),
    [(["rnu"], "(did you mean 'run'?)"), (["run", "--device", "cdua"], "(did you mean 'cuda'?)"),
     (["compare", "--executor", "stack"], "(did you mean 'stacked'?)"),
     (["config", "shwo"], "(did you mean 'show'?)")],
)
def test_a_mistyped_command_or_choice_gets_the_nearest_one(capsys, argv, hint):
    line = one_error_line(capsys, argv)
    assert "invalid choice" in line and hint in line, line


def test_a_name_far_from_all_gets_the_list_only(capsys):
    line = one_error_line(capsys, ["config", "show", "-a", "zzzzzz"])
    assert "did you mean" not in line and "choose one of: bherd" in line


def test_names_in_any_case_and_settings_in_kebab_case(capsys, tmp_path):
    assert main(["config", "show", "--json", "-a", "FedProx", "-p", "IID", "-d", "DIGITS",
                 "--set", "local-epochs=2", "--set", "algorithm.mu=0.5"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"]["algorithm"]["value"] == "fedprox"
    assert shown["run"]["partition"]["value"] == "iid" and shown["run"]["dataset"]["value"] == "digits"
    assert shown["run"]["local_epochs"] == {"value": 2.0, "source": "flag --set",
                                           "note": shown["run"]["local_epochs"]["note"]}
    assert main(["config", "show", "--json", "-m", "Auto", "-d", "Synthetic", "--set",
                 "lr-schedule=Cosine", "-a", "bherd-scaffold", "--set", "algorithm.option=i"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"]["model"]["value"] == "logreg" and shown["run"]["lr_schedule"]["value"] == "cosine"
    assert shown["algorithm bherd-scaffold"]["algorithm.option"]["value"] == "I"
    line = one_error_line(capsys, ["config", "show", "--set", "batch_order=fixd"])
    assert "batch_order must be one of reshuffle, fixed, got 'fixd' (did you mean 'fixed'?)" in line
    out = tmp_path / "run"
    assert main(["run", "-a", "FedAvg", "--set", "batch-size=16", *SMALL, "--out", str(out), "-q"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["algorithm"] == "fedavg" and config["batch_size"] == 16


def test_config_show_names_every_setting_and_its_source(capsys, tmp_path):
    run_file = tmp_path / "my_run.toml"
    run_file.write_text('rounds = 7\nlr = 0.2\n[algorithm]\nname = "fedprox"\nmu = 0.01\n')
    assert main(["config", "show", "--config", str(run_file), "-r", "3", "--set", "lr=0.3",
                 "--device", "cpu", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown) == ["run", "algorithm fedprox", "dataset digits", "partition dirichlet",
                           "model mlp", "runtime", "plan (on this machine)"]
    run = shown["run"]
    assert (run["rounds"]["value"], run["rounds"]["source"]) == (3, "flag --rounds")  # flag wins
    assert (run["lr"]["value"], run["lr"]["source"]) == (0.3, "flag --set")  # --set last
    assert run["algorithm"]["source"] == f"file {run_file}"
    assert (run["seed"]["value"], run["seed"]["source"]) == (0, "default")
    assert run["model"] == {"value": "mlp", "source": "default (auto for digits)",
                            "note": run["model"]["note"]}
    assert shown["algorithm fedprox"]["algorithm.mu"]["source"] == f"file {run_file}"
    assert shown["algorithm fedprox"]["algorithm.weighting"]["source"] == "default"
    assert shown["runtime"]["device"] == {"value": "cpu", "source": "flag --device",
                                          "note": shown["runtime"]["device"]["note"]}
    # every setting a run has is shown once
    from fedhet.engine.config import config_of

    flat = config_of({"algorithm": "fedprox"}).flat()
    settings = {title: rows for title, rows in shown.items() if not title.startswith("plan")}
    assert sorted(k for s in settings.values() for k in s) == sorted(flat)
    assert list(shown["plan (on this machine)"]) == ["device", "executor", "workers", "backend"]
    # the text form: aligned, each row "key value source  # meaning"
    assert main(["config", "show", "--config", str(run_file)]) == 0
    text = capsys.readouterr().out
    assert "  rounds " in text and f"file {run_file}" in text and "# communication rounds K" in text


def test_config_show_of_a_resume_reads_the_run_directory(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--set", "lr=0.07", *SMALL, "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    assert main(["config", "show", "--resume", str(out), "-r", "4", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    assert (run["lr"]["value"], run["lr"]["source"]) == (0.07, f"file {out / 'config.json'}")
    assert (run["rounds"]["value"], run["rounds"]["source"]) == (4, "flag --rounds")


def test_config_show_takes_another_section(capsys):
    """The extension point: a section function registered with `add_section` is printed after
    the others, with the built run in hand."""

    def plan(shown: show.Shown) -> show.Section:
        return show.Section("plan", [show.Row("clients x rounds", shown.cfg.clients * shown.cfg.rounds,
                                              "computed")])

    show.add_section(plan)
    try:
        assert main(["config", "show", "-n", "4", "-r", "5"]) == 0
    finally:
        show.SECTIONS.remove(plan)
    *_, title, row = capsys.readouterr().out.rstrip().splitlines()
    assert title == "plan:" and row.split()[-4:] == ["x", "rounds", "20", "computed"]


def test_a_dotted_key_beside_its_table_says_how_to_fix_it(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('algorithm = "fedprox"\nalgorithm.mu = 0.01\n')
    line = one_error_line(capsys, ["run", "--config", str(bad), "--out", str(tmp_path / "o")])
    assert "Cannot overwrite a value" in line
    assert '[algorithm] name = "fedprox"' in line and "[algorithm_params]" in line
    header = tmp_path / "header.toml"
    header.write_text('rounds = 2\nalgorithm = "fedprox"\n\n[algorithm]\nmu = 0.01\n')
    line = one_error_line(capsys, ["run", "--config", str(header), "--out", str(tmp_path / "o")])
    assert "line 2 gives algorithm a value, so line 4 cannot also make it a table ([algorithm])" in line
    assert 'remove line 2 and write name = "fedprox" as the table\'s first line' in line
    grid = tmp_path / "grid.toml"
    grid.write_text('[base]\nalgorithm = "fedprox"\nalgorithm.mu = 0.01\n')
    line = one_error_line(capsys, ["compare", "--config", str(grid), "--out", str(tmp_path / "o")])
    assert line.startswith(f"error: grid file {grid} is not valid TOML") and '"algorithm.mu" = ...' in line
    twice = tmp_path / "twice.toml"
    twice.write_text("lr = 0.1\nrounds = 2\nlr = 0.2\n")
    line = one_error_line(capsys, ["run", "--config", str(twice), "--out", str(tmp_path / "o")])
    assert "lr is given twice (line 3 repeats it)" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_settings_file_that_is_not_one_is_one_line(capsys, tmp_path, command):
    what = "config file" if command == "run" else "grid file"
    binary = tmp_path / "b.toml"
    binary.write_bytes(bytes(range(128, 256)))
    line = one_error_line(capsys, [command, "-c", str(binary), "--out", str(tmp_path / "o")])
    assert line == f"error: {what} {binary} is not a text file (TOML is UTF-8 text)"
    line = one_error_line(capsys, [command, "-c", str(tmp_path), "--out", str(tmp_path / "o")])
    assert line == f"error: {what} {tmp_path} is a directory; give a .toml file"
    assert not (tmp_path / "o").exists()


def test_shipped_files_resolve_by_name_from_any_directory(tmp_path, capsys, monkeypatch):
    r = fedhet("config", "show", "--config", "run-fedprox-dirichlet", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["algorithm fedprox"]["algorithm.mu"]["source"] == \
        "file run-fedprox-dirichlet"
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--config", "grid-digits", "--set", "rounds=1", "--set", "seed=0",
                 "-n", "3", "--out", "g", "-j", "1"]) == 0
    assert "6 runs" in capsys.readouterr().out  # 3 methods × 2 partitions, one seed
    cfg = json.loads(next((tmp_path / "g" / "runs").glob("*/config.json")).read_text())
    assert cfg["rounds"] == 1 and cfg["clients"] == 3 and cfg["seed"] == 0
    line = one_error_line(capsys, ["run", "--config", "grid-digits"])
    assert "is a grid ([axes])" in line and "fedhet compare --config grid-digits" in line
    line = one_error_line(capsys, ["run", "--config", "run-fedavg-digit"])
    assert "(did you mean 'run-fedavg-digits'?)" in line


def test_every_shipped_run_file_builds():
    from fedhet.configs import is_grid, shipped
    from fedhet.engine.config import config_of
    from fedhet.engine.toml_files import read_toml

    runs = {n: p for n, p in shipped().items() if not is_grid(p)}
    assert len(runs) >= 3
    for name, path in runs.items():
        cfg = config_of(read_toml(path.read_text(), name), name)
        assert cfg.dataset == "digits", name  # embedded: they run anywhere


def test_shipped_configs_are_package_data():
    import tomllib

    pyproject = tomllib.loads((Path(SRC).parent / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-data"]["fedhet.configs"] == ["*.toml"]
    from fedhet.configs import HERE

    assert (HERE / "__init__.py").is_file() and HERE.parent.name == "fedhet"


def test_list_shows_the_engine_settings_and_shipped_files(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for needle in ("lr=0.05", "batch_size=32", "local_epochs=1.0", "client learning rate η",
                   "communication rounds K", "grid-digits", "run-fedprox-dirichlet"):
        assert needle in out, needle


def test_run_without_out_makes_a_new_directory_each_time(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    named = []
    for argv in (["--config", "run-fedavg-digits", *SMALL], SMALL):  # a shipped file, then flags
        assert main(["run", *argv]) == 0
        captured = capsys.readouterr()
        named.append(captured.err.split("run directory: ")[1].split()[0])
        assert f"results in {named[-1]}" in captured.out
    assert named[0] != named[1] and all(n.startswith("runs/fedavg-digits-") for n in named)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(Path(n).name for n in named)
    lrs = [json.loads((tmp_path / n / "config.json").read_text())["lr"] for n in named]
    assert lrs == [0.1, 0.05]  # run-fedavg-digits' own, then the default


def test_new_run_dir_never_reuses_a_path(tmp_path, monkeypatch):
    monkeypatch.setattr("time.strftime", lambda fmt: "20260101-000000")
    a = new_run_dir("fedavg-digits", tmp_path)
    a.mkdir()
    b = new_run_dir("fedavg-digits", tmp_path)
    b.mkdir()
    assert a.name == "fedavg-digits-20260101-000000" and b.name == a.name + "-2"
    assert new_run_dir("fedavg-digits", tmp_path).name == a.name + "-3"


def test_progress_lines_in_a_log_file(tmp_path, capsys):
    assert main(["run", "-n", "3", "-r", "3", "--out", str(tmp_path / "a")]) == 0  # stdout: no tty
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("round ")]
    assert [ln.split()[1] for ln in lines] == ["1/3", "2/3", "3/3"]
    for ln in lines:
        assert " acc 0." in ln and " loss " in ln and " s/round" in ln and " ETA " in ln
    assert main(["run", "-n", "3", "-r", "2", "--out", str(tmp_path / "b"), "-q"]) == 0
    assert "round 1/2" not in capsys.readouterr().out


def test_round_lines_every_tenth_or_every_few_seconds():
    import io

    def printed(total: int, every: float) -> list[int]:
        stream = io.StringIO()
        lines = RoundLines(total, stream, every=every)
        for k in range(1, total + 1):
            lines({"round": k, "test_accuracy": 0.5, "test_loss": 1.0, "wall_time_s": 0.1 * k,
                   "round_time_s": 0.1, "eval_time_s": 0.0})
        return [int(ln.split()[1].split("/")[0]) for ln in stream.getvalue().splitlines()]

    assert printed(100, float("inf")) == [1, *range(10, 101, 10)]
    assert printed(5, 0.0) == [1, 2, 3, 4, 5]
    stream = io.StringIO()
    RoundLines(10, stream, every=0.0)({"round": 4, "test_accuracy": 0.25, "test_loss": 2.0,
                                       "wall_time_s": 9.0, "round_time_s": 1.5, "eval_time_s": 0.5})
    assert stream.getvalue() == "round 4/10  acc 0.2500  loss 2.0000  2.00 s/round  ETA 12s\n"


def test_grid_progress_lines_in_a_log_file(tmp_path, monkeypatch):
    import io

    from fedhet.runs.comparison import compare
    from fedhet.runs.grid_document import GridChanges

    monkeypatch.setenv("FEDHET_PROGRESS_SECONDS", "0")
    stream = io.StringIO()
    compare(None, tmp_path / "g", jobs=1, stream=stream,
            changes=GridChanges({"clients": 3, "rounds": 2}, {"algorithm": ["fedavg", "fedprox"]}))
    status = [ln for ln in stream.getvalue().splitlines() if " rounds] " in ln]
    assert any(ln.startswith("[0/2 runs, 1/4 rounds]") and "fedavg__seed0 round 1/2 acc 0." in ln
               and " loss " in ln for ln in status), status
    assert any(" s/round, ETA " in ln for ln in status), status


def _sigint_state(pid: int) -> str:
    """How each thread of process `pid` treats SIGINT (`/proc/PID/task/*/status`): blocked,
    ignored, pending; for the message of a run that did not stop."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            fields = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines()
                          if ":\t" in line)
        except OSError:
            continue
        bit = 1 << (signal.SIGINT - 1)
        flags = [k for k in ("SigBlk", "SigIgn", "SigPnd", "ShdPnd") if int(fields.get(k, "0"), 16) & bit]
        out.append(f"{fields.get('Name', '?').strip()}[{task.name}]: {','.join(flags) or 'caught'}")
    return "; ".join(out)


def test_ctrl_c_names_the_run_directory(tmp_path):
    # The run starts with SIGINT at its default, as a foreground command does: a test suite
    # started in the background by a non-interactive shell (`pytest … &`) has SIGINT ignored,
    # and a child inherits that through exec, so its Ctrl-C would be lost (it was: the run went
    # on, SigIgn in /proc). 100,000 rounds: the run's lines fill the pipe long before it could
    # end, so should the Ctrl-C be lost the run cannot finish (exit 0) and hide it.
    out = tmp_path / "my run"
    p = subprocess.Popen(
        [sys.executable, "-m", "fedhet", "run", "-n", "3", "-r", "100000", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "FEDHET_PROGRESS_SECONDS": "0"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    state = ""
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("round 2/"):
                before = _sigint_state(p.pid)
                p.send_signal(signal.SIGINT)
                break
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # the run goes on: say why, then stop it below
            state = f"the run did not stop; before Ctrl-C: {before}; 60 s after: {_sigint_state(p.pid)}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert not state, state
    assert p.returncode == 130
    assert err.strip() == f"interrupted; continue with `fedhet run --resume '{out}'`"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without a GPU")
def test_device_cuda_without_a_gpu_suggests_the_flag(capsys, tmp_path):
    line = one_error_line(capsys, ["run", "--device", "cuda", *SMALL, "--out", str(tmp_path / "o")])
    assert "--device cpu" in line and "--set device" not in line
