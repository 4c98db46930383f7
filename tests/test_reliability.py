"""Fault injection: bad input, dangerous --force targets, concurrent writers, corrupted and
tampered checkpoints, changed settings on resume, divergence, a full disk, kill -9 while a
checkpoint is written. Every case must end in one clear line (or an exact resume), never a
traceback, a silent wrong result, or a lost file."""

from __future__ import annotations

import csv
import errno
import io
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedhet.cli import EXIT_DIVERGED, main
from fedhet.rundir import ownership as rundir
from fedhet.rundir.store import MAGIC, TIME_COLUMNS, RunStore
from fedhet.runs.single import execute

QUICK = ["run", "-r", "2", "-n", "4"]


def cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- bad input: one line, exit 2, nothing created ------------------------------------------------
BAD_INPUTS = [
    (["--seed", "-5"], "--seed"),
    (["--seed", "1e23"], "--seed"),
    (["--set", "seed=4294967296"], "seed"),
    (["--set", "lr=-1"], "lr"),
    (["--set", "lr=nan"], "lr"),
    (["--set", "momentum=1"], "momentum"),
    (["--set", "nonsense=1"], "unknown setting"),
    (["--set", "lr"], "key=value"),
    (["-n", "0"], "clients"),
    (["-r", "0"], "rounds"),
    (["-a", "nosuch"], "nosuch"),
    (["--set", "batch_size=0"], "batch_size"),
    (["--set", "sample_fraction=0"], "sample_fraction"),
    (["--set", "client_steps=[1,2]"], "client_steps"),
    (["-r", "100000000000000000000000"], "--rounds must be at most 1,000,000"),
    (["-r", "1000001"], "--rounds must be at most"),
    (["--set", "local_epochs=1e23"], "local_epochs"),
    (["--set", "epochs_min=1", "--set", "epochs_max=100000"], "epochs_max"),
    (["--set", "local_steps=100000000000"], "local_steps"),
    (["--set", "client_steps=[1,1,1,99999999999]"], "client_steps"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_INPUTS)
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, capsys, args, needle):
    out = tmp_path / "run"
    code, err = cli(capsys, *QUICK, *args, "--out", str(out))
    assert code == 2 and needle in one_line(err)
    assert not out.exists()


def test_absurd_rounds_in_a_settings_file_are_one_line(tmp_path, capsys):
    """TOML reads `1e23` as a float that is a whole number: the bound, not a run for ever."""
    (tmp_path / "run.toml").write_text("rounds = 1e23\nclients = 3\n")
    out = tmp_path / "run"
    code, err = cli(capsys, "run", "--config", str(tmp_path / "run.toml"), "--out", str(out))
    assert code == 2 and "--rounds must be at most 1,000,000" in one_line(err)
    assert not out.exists()


@pytest.mark.parametrize("text", ["", "# nothing yet\n", 'title = "empty"\n[base]\n[axes]\n'])
def test_an_empty_grid_file_is_one_line_not_a_default_run(tmp_path, capsys, text):
    (tmp_path / "grid.toml").write_text(text)
    out = tmp_path / "grid"
    code, err = cli(capsys, "compare", "-c", str(tmp_path / "grid.toml"), "--out", str(out))
    assert code == 2 and "sets no runs" in one_line(err)
    assert not out.exists()


BAD_PLACES = [
    (lambda p: p / "file.txt" / "run", "Not a directory"),
    (lambda p: Path("/proc/fedhet-test/run"), "/proc"),
]


@pytest.mark.parametrize(("where", "needle"), BAD_PLACES)
def test_unusable_out_is_one_line(tmp_path, capsys, where, needle):
    (tmp_path / "file.txt").write_text("x")
    code, err = cli(capsys, *QUICK, "--out", str(where(tmp_path)))
    assert code == 2 and needle in one_line(err)


def test_full_disk_is_one_line_and_the_last_checkpoint_survives(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main([*QUICK, "--out", str(out)]) == 0
    before = (out / "checkpoint.pt").read_bytes()
    import fedhet.rundir.store as store

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "checkpoint.pt"))

    monkeypatch.setattr(store, "atomic_write_bytes", full)
    code, err = cli(capsys, "run", "--resume", str(out), "-r", "4")
    assert code == 2 and "No space left" in one_line(err)
    assert (out / "checkpoint.pt").read_bytes() == before


# -- --force never deletes what fedhet did not write -------------------------------------------
@pytest.mark.parametrize("target", ["cwd", "parent", "home", "root"])
def test_force_refuses_dangerous_targets(tmp_path, capsys, monkeypatch, target):
    work = tmp_path / "work" / "deeper"
    work.mkdir(parents=True)
    (work / "thesis.tex").write_text("years of work")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "work"))
    rundir.mark(work, "run")  # even a marked directory is refused at these places
    rundir.mark(tmp_path / "work", "run")
    out = {"cwd": ".", "parent": "..", "home": str(tmp_path / "work"), "root": "/"}[target]
    code, err = cli(capsys, *QUICK, "--out", out, "--force")
    assert code == 2 and "refusing" in one_line(err)
    assert (work / "thesis.tex").read_text() == "years of work"


def test_force_refuses_a_directory_fedhet_did_not_make(tmp_path, capsys):
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "thesis.tex").write_text("keep")
    code, err = cli(capsys, *QUICK, "--out", str(folder), "--force")
    assert code == 2 and "not created by fedhet" in one_line(err)
    assert (folder / "thesis.tex").read_text() == "keep"


def test_clear_removes_only_fedhet_files(tmp_path):
    out = tmp_path / "run"
    execute({"rounds": 1, "clients": 3}, out, log=lambda _: None)
    (out / "mine.txt").write_text("mine")
    (out / "mydir").mkdir()
    warnings: list[str] = []
    rundir.clear(out, warnings.append)
    assert sorted(p.name for p in out.iterdir()) == [rundir.MARKER, rundir.LOCK, "mine.txt", "mydir"]
    assert "mine.txt" in warnings[0] and "mydir" in warnings[0]


# -- one writer per directory -----------------------------------------------------------------
def _hold_lock(path: str, ready, release) -> None:
    with rundir.exclusive(Path(path)):
        ready.set()
        release.wait(30)


def test_second_writer_is_refused_with_the_holders_pid(tmp_path, capsys):
    out = tmp_path / "run"
    execute({"rounds": 1, "clients": 3}, out, log=lambda _: None)
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(out), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        for args in (["run", "--resume", str(out), "-r", "3"], [*QUICK, "--out", str(out), "--force"]):
            code, err = cli(capsys, *args)
            assert code == 2 and f"process {holder.pid}" in one_line(err)
    finally:
        release.set()
        holder.join()
    assert main(["run", "--resume", str(out), "-r", "2"]) == 0  # the lock died with its holder


# -- checkpoints: verified, and never code -----------------------------------------------------
@pytest.fixture
def finished(tmp_path) -> Path:
    out = tmp_path / "run"
    execute({"rounds": 3, "clients": 4, "algorithm": "scaffold"}, out, log=lambda _: None)
    return out


def flip_bytes(path: Path, count: int = 400) -> None:
    data = bytearray(path.read_bytes())
    start = len(data) // 3
    for i in range(start, start + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_fall_back_to_the_previous_checkpoint(finished):
    flip_bytes(finished / "checkpoint.pt")
    warnings: list[str] = []
    ckpt = RunStore(finished).load_checkpoint(warn=warnings.append)
    assert ckpt is not None and ckpt["round"] == 2
    assert "checksum mismatch" in warnings[0]


def test_both_checkpoints_corrupt_is_one_line(finished, capsys):
    flip_bytes(finished / "checkpoint.pt")
    flip_bytes(finished / "checkpoint.prev.pt")
    code, err = cli(capsys, "run", "--resume", str(finished), "-r", "5")
    assert code == 2 and "no usable checkpoint" in one_line(err)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_checkpoint_cannot_run_code(finished, monkeypatch):
    """A well-formed header and digest over a pickle that would call os.system: refused."""
    import hashlib

    monkeypatch.chdir(finished)
    payload = io.BytesIO()
    torch.save({"round": 3, "evil": _Exploit()}, payload, pickle_module=pickle)
    data = payload.getvalue()
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (finished / name).write_bytes(MAGIC + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
    with pytest.raises(Exception, match="unreadable"):
        RunStore(finished).load_checkpoint(warn=lambda _: None)
    assert not (finished / "pwned").exists()


# -- resume only under the run's own settings --------------------------------------------------
def test_edited_config_is_refused_listing_the_keys(finished, capsys):
    config = json.loads((finished / "config.json").read_text())
    config.update(clients=5, lr=0.9)
    (finished / "config.json").write_text(json.dumps(config))
    (finished / "summary.json").unlink()  # not finished, so the resume must look
    code, err = cli(capsys, "run", "--resume", str(finished))
    line = one_line(err)
    assert code == 2 and "clients" in line and "lr" in line


def test_edited_config_of_a_finished_run_is_compared_first(finished, capsys):
    """Not "already finished": the edit is refused as for an unfinished run, nothing changes."""
    config = json.loads((finished / "config.json").read_text())
    (finished / "config.json").write_text(json.dumps({**config, "lr": 0.9}))
    before = {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()}
    code, err = cli(capsys, "run", "--resume", str(finished))
    assert code == 2 and "lr" in one_line(err) and "already finished" not in err
    assert {p.name: p.read_bytes() for p in finished.iterdir() if p.is_file()} == before


def test_a_finished_run_whose_config_asks_more_rounds_continues(finished, capsys):
    config = json.loads((finished / "config.json").read_text())
    (finished / "config.json").write_text(json.dumps({**config, "rounds": 4}))
    assert main(["run", "--resume", str(finished)]) == 0
    rows = list(csv.DictReader((finished / "metrics.csv").open()))
    assert [r["round"] for r in rows] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("flags", [["--force"], ["--out", "OTHER"]])
def test_resume_refuses_force_and_another_out(finished, capsys, flags):
    other = finished.parent / "other"
    flags = [str(other) if f == "OTHER" else f for f in flags]
    before = (finished / "metrics.csv").read_bytes()
    code, err = cli(capsys, "run", "--resume", str(finished), *flags, "-r", "5")
    line = one_line(err)
    assert code == 2 and flags[0] in line
    assert (finished / "metrics.csv").read_bytes() == before and not other.exists()


def test_resume_with_out_naming_the_same_directory_is_fine(finished, capsys):
    assert main(["run", "--resume", str(finished), "--out", f"{finished}/", "-r", "4"]) == 0
    assert json.loads((finished / "summary.json").read_text())["rounds_done"] == 4


@pytest.mark.parametrize(("flags", "needle"), [
    (["--set", "lr=0.9"], "lr"), (["-n", "7"], "clients"), (["-r", "2"], "rounds"),
])
def test_resume_refuses_flags_that_change_the_run(finished, capsys, flags, needle):
    code, err = cli(capsys, "run", "--resume", str(finished), *flags)
    assert code == 2 and needle in one_line(err)


def test_resume_may_add_rounds_and_says_so(finished, capsys):
    code = main(["run", "--resume", str(finished), "-r", "5"])
    out = capsys.readouterr().out
    assert code == 0 and "rounds 3 → 5" in out
    rows = list(csv.DictReader((finished / "metrics.csv").open()))
    assert [r["round"] for r in rows] == ["0", "1", "2", "3", "4", "5"]
    assert json.loads((finished / "config.json").read_text())["rounds"] == 5


def test_resume_refuses_more_rounds_under_a_cosine_schedule(tmp_path, capsys):
    out = tmp_path / "run"
    execute({"rounds": 2, "clients": 3, "lr_schedule": "cosine"}, out, log=lambda _: None)
    code, err = cli(capsys, "run", "--resume", str(out), "-r", "4")
    assert code == 2 and "rounds" in one_line(err)


def test_orphaned_temporary_files_are_removed_on_resume(finished, capsys):
    (finished / "summary.json").unlink()
    for name in (".checkpoint.pt.abc123", ".summary.json.xyz", ".metrics.csv.q1"):
        (finished / name).write_bytes(b"partial")
    (finished / ".my-hidden-note").write_text("not ours")
    assert main(["run", "--resume", str(finished)]) == 0
    names = {p.name for p in finished.iterdir()}
    assert not {".checkpoint.pt.abc123", ".summary.json.xyz", ".metrics.csv.q1"} & names
    assert ".my-hidden-note" in names


# -- divergence is loud ------------------------------------------------------------------------
def _strict(text: str) -> dict:
    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("lr", ["1e6", "1e300"])
def test_divergence_stops_the_run_with_its_own_exit_code(tmp_path, capsys, lr):
    out = tmp_path / "run"
    code, err = cli(capsys, *QUICK, "--set", f"lr={lr}", "--out", str(out))
    line = one_line(err)
    assert code == EXIT_DIVERGED and "round 1" in line and "client" in line
    summary = _strict((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["finished"] is False
    assert summary["diverged"]["round"] == 1 and summary["diverged"]["client"] is not None
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["round"] for r in rows] == ["0"]  # no row of NaNs was written


# -- metrics grow by appending; checkpoints hold state only ------------------------------------
def test_checkpoint_holds_state_and_compact_metrics_not_diagnostics(finished):
    """No pickled history: the metrics rows only as `MetricsHistory` (sealed compressed blocks,
    `tests/test_resume.py` bounds their size), diagnostics records only as a count."""
    ckpt = RunStore(finished).load_checkpoint()
    assert "rows" not in ckpt and "records" not in ckpt and ckpt["config"]["algorithm"] == "scaffold"
    assert set(ckpt["metrics"]) == {"version", "blocks", "tail"} and isinstance(ckpt["diag_records"], int)
    assert all(isinstance(line, str) for line in ckpt["metrics"]["tail"])


def test_metrics_are_appended_not_rewritten(tmp_path, monkeypatch):
    import fedhet.rundir.store as store

    rewrites: list[str] = []
    real = store.atomic_write_text
    monkeypatch.setattr(store, "atomic_write_text",
                        lambda path, text: (rewrites.append(Path(path).name), real(path, text)))
    execute({"rounds": 6, "clients": 3}, tmp_path / "run", log=lambda _: None)
    assert rewrites.count("metrics.csv") <= 2  # the header, and once more when round 1 adds columns
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert len(rows) == 7 and all(r["test_accuracy"] for r in rows)


# -- kill -9 while a checkpoint is being written -----------------------------------------------
SETTINGS = {"algorithm": "scaffold", "clients": 5, "rounds": 5, "lr": 0.1}


def _die_during_third_checkpoint(out: str) -> None:
    import fedhet.rundir.store as store

    real, calls = store.atomic_write_bytes, []

    def dying(path: Path, data: bytes) -> None:
        if Path(path).name == "checkpoint.pt":
            calls.append(1)
            if len(calls) == 3:  # half a temporary file, then SIGKILL
                (Path(path).parent / f".{Path(path).name}.dying").write_bytes(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
        real(path, data)

    store.atomic_write_bytes = dying
    execute(SETTINGS, Path(out), log=lambda _: None)


def _without_time(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in csv.DictReader(f)]


def test_kill_during_checkpoint_write_resumes_exactly(tmp_path):
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    proc = multiprocessing.get_context("fork").Process(
        target=_die_during_third_checkpoint, args=(str(killed),)
    )
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    assert (killed / ".checkpoint.pt.dying").exists()
    execute(None, killed, resume=True, log=lambda _: None)
    execute(SETTINGS, reference, log=lambda _: None)
    assert _without_time(killed / "metrics.csv") == _without_time(reference / "metrics.csv")
    assert not (killed / ".checkpoint.pt.dying").exists()


def test_two_processes_on_one_run_directory(tmp_path):
    """Real processes: the second `fedhet run` on a busy directory fails at once, naming the PID."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedhet", "run", "-r", "400", "-n", "3", "--out", str(out)]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "summary.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run([*cmd[:-2], "--resume", str(out)], capture_output=True, text=True)
        assert second.returncode == 2 and f"process {first.pid}" in one_line(second.stderr)
    finally:
        first.kill()
        first.wait()


def test_a_client_that_raises_is_dropped_but_all_failing_stops_the_run(tmp_path, capsys, monkeypatch):
    from fedhet.algorithms.fedavg import FedAvg

    real = FedAvg.client_update

    def flaky(self, message, ctx, state):
        if ctx.client_id == 1 or fail_all:
            raise ValueError(f"client {ctx.client_id} broke")
        return real(self, message, ctx, state)

    monkeypatch.setattr(FedAvg, "client_update", flaky)
    fail_all = False
    assert main([*QUICK, "--out", str(tmp_path / "one")]) == 0
    rows = list(csv.DictReader((tmp_path / "one" / "metrics.csv").open()))
    assert [r["clients_failed"] for r in rows[1:]] == ["1.0", "1.0"]
    assert "client 1 failed" in capsys.readouterr().out
    fail_all = True
    code, err = cli(capsys, *QUICK, "--out", str(tmp_path / "all"))
    assert code == 2 and "every client that ran in round 1 failed" in one_line(err)


def test_a_diverged_cell_fails_the_grid_and_reports_no_accuracy(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 3\nrounds = 2\n[axes]\nlr = [0.05, 1e6]\n')
    code, err = cli(capsys, "compare", "-c", str(grid), "-o", str(tmp_path / "g"), "-j", "1")
    assert code == 2 and "diverged in round 1" in one_line(err.splitlines()[-1] + "\n")
    rows = {r["name"]: r for r in csv.DictReader((tmp_path / "g" / "results.csv").open())}
    bad = rows["fedavg__lr=1e+06__seed0"]
    assert bad["status"] == "diverged" and bad["final_accuracy"] == ""
    assert "fedavg__lr=1e+06__seed0 (diverged)" in (tmp_path / "g" / "summary.md").read_text()


def test_device_and_executor_flags_reach_every_run_and_a_resume_may_change_them(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*QUICK, "--executor", "stacked", "--device", "cpu", "--out", str(out)]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["executor"], saved["device"]) == ("stacked", "cpu")
    assert main(["run", "--resume", str(out), "-r", "3", "--executor", "sequential"]) == 0
    assert "executor stacked → sequential" in capsys.readouterr().out
    grid = tmp_path / "grid.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 3\nrounds = 1\n[axes]\nseed = [0, 1]\n')
    assert main(["compare", "-c", str(grid), "-o", str(tmp_path / "g"), "-j", "1",
                 "--executor", "stacked"]) == 0
    configs = [json.loads(p.read_text()) for p in (tmp_path / "g" / "runs").glob("*/config.json")]
    assert len(configs) == 2 and {c["executor"] for c in configs} == {"stacked"}
    # a second call on another executor is the same grid: nothing to redo, no settings clash
    assert main(["compare", "-c", str(grid), "-o", str(tmp_path / "g"), "-j", "1",
                 "--executor", "sequential"]) == 0
