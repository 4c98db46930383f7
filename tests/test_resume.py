"""Resume: a run killed with SIGKILL continues to the same metrics; checkpoints are atomic and a
corrupt or truncated checkpoint falls back to the previous good one."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.errors import FedhetError
from fedhet.rundir.store import (
    TIME_COLUMNS,
    MetricsHistory,
    RunStore,
    atomic_write_bytes,
    csv_table,
    format_value,
    read_checkpoint,
)
from fedhet.runs.single import execute

SETTINGS = {
    "algorithm": "fedavgm", "dataset": "digits", "partition": "dirichlet", "clients": 8,
    "rounds": 6, "lr": 0.1, "local_epochs": 2, "epochs_min": 1, "epochs_max": 3,
}


def metrics_without_time(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in csv.DictReader(f)]


def _child(out: str) -> None:
    execute(SETTINGS, Path(out), log=lambda _: None)


def rounds_done(out: Path) -> int:
    try:
        return json.loads((out / "summary.json").read_text())["rounds_done"]
    except (OSError, ValueError, KeyError):
        return 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """(a run killed with SIGKILL after ≥ 2 rounds, the same run uninterrupted)."""
    import sklearn.datasets  # noqa: F401  (imported once here, not in the child and again after)

    root = tmp_path_factory.mktemp("resume")
    killed = root / "killed"
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(str(killed),))
    proc.start()
    deadline = time.monotonic() + 60
    while rounds_done(killed) < 2 and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    assert 2 <= rounds_done(killed) < SETTINGS["rounds"], "the run was not killed mid-way"
    reference = root / "reference"
    execute(SETTINGS, reference, log=lambda _: None)
    return killed, reference


def test_resume_after_sigkill_gives_identical_metrics(runs, tmp_path, capsys):
    killed, reference = runs
    work = tmp_path / "run"
    shutil.copytree(killed, work)
    assert main(["run", "--resume", str(work)]) == 0
    assert json.loads((work / "summary.json").read_text())["finished"] is True
    got = metrics_without_time(work / "metrics.csv")
    assert len(got) == SETTINGS["rounds"] + 1
    assert got == metrics_without_time(reference / "metrics.csv")


def test_truncated_checkpoint_falls_back_to_previous(runs, tmp_path):
    killed, reference = runs
    work = tmp_path / "run"
    shutil.copytree(killed, work)
    ckpt = work / "checkpoint.pt"
    assert (work / "checkpoint.prev.pt").exists()
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    messages: list[str] = []
    execute(None, work, resume=True, log=messages.append)
    warning = " ".join(messages)
    assert "checkpoint.pt is unreadable" in warning and "resuming from checkpoint.prev.pt" in warning
    assert metrics_without_time(work / "metrics.csv") == metrics_without_time(reference / "metrics.csv")


def test_garbage_checkpoint_falls_back_and_both_bad_is_a_clear_error(runs, tmp_path):
    killed, _ = runs
    work = tmp_path / "run"
    shutil.copytree(killed, work)
    (work / "checkpoint.pt").write_bytes(b"not a checkpoint at all")
    store = RunStore(work)
    warnings: list[str] = []
    payload = store.load_checkpoint(warn=warnings.append)
    assert payload is not None and payload["round"] >= 1 and warnings
    (work / "checkpoint.prev.pt").write_bytes(b"")
    with pytest.raises(FedhetError, match="no usable checkpoint.*--force"):
        store.load_checkpoint(warn=warnings.append)


def test_a_damaged_checkpoint_is_never_rotated_over_the_good_previous_one(tmp_path):
    store = RunStore(tmp_path)
    store.save_checkpoint({"round": 1})
    store.save_checkpoint({"round": 2})
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:-7])  # torn: the resume falls back to round 1
    resumed = RunStore(tmp_path)
    warnings: list[str] = []
    assert resumed.load_checkpoint(warn=warnings.append)["round"] == 1 and warnings
    resumed.save_checkpoint({"round": 2})  # the resumed run's next save
    assert read_checkpoint(tmp_path / "checkpoint.prev.pt")["round"] == 1  # still the fallback
    assert read_checkpoint(ckpt)["round"] == 2
    resumed.save_checkpoint({"round": 3})  # whole files rotate as before
    assert read_checkpoint(tmp_path / "checkpoint.prev.pt")["round"] == 2


def test_checkpoints_rotate_and_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    store.save_checkpoint({"round": 1})
    store.save_checkpoint({"round": 2})
    assert store.load_checkpoint()["round"] == 2
    ckpt_before = (tmp_path / "checkpoint.pt").read_bytes()

    def crash(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        atomic_write_bytes(tmp_path / "checkpoint.pt", b"half-written")
    assert (tmp_path / "checkpoint.pt").read_bytes() == ckpt_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


def test_resuming_a_finished_run_changes_nothing(runs, tmp_path):
    _, reference = runs
    work = tmp_path / "run"
    shutil.copytree(reference, work)
    before = (work / "metrics.csv").read_text()
    execute(None, work, resume=True, log=lambda _: None)
    assert (work / "metrics.csv").read_text() == before


def test_killed_between_last_checkpoint_and_summary_finishes_on_resume(runs, tmp_path):
    _, reference = runs
    work = tmp_path / "run"
    shutil.copytree(reference, work)
    summary = json.loads((work / "summary.json").read_text())
    (work / "summary.json").write_text(json.dumps({**summary, "finished": False}))
    execute(None, work, resume=True, log=lambda _: None)
    assert json.loads((work / "summary.json").read_text())["finished"] is True
    assert metrics_without_time(work / "metrics.csv") == metrics_without_time(reference / "metrics.csv")


def test_run_files_get_the_usual_permissions(runs):
    _, reference = runs
    assert (reference / "metrics.csv").stat().st_mode & 0o044 == 0o044 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- metrics.csv damaged under a checkpoint: rebuilt from it, never a hole ---------------------
def _damage(path: Path, how: str) -> None:
    text = path.read_text()
    if how == "torn":  # cut in the middle of its second row
        lines = text.splitlines(keepends=True)
        path.write_text(lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])
    elif how == "cut":  # only its first rounds left
        path.write_text("".join(text.splitlines(keepends=True)[:2]))
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["torn", "cut", "deleted"])
def test_damaged_metrics_are_rebuilt_from_the_checkpoint(runs, tmp_path, capsys, how):
    killed, reference = runs
    work = tmp_path / "run"
    shutil.copytree(killed, work)
    done = RunStore(work).load_checkpoint()["round"]
    before = (work / "metrics.csv").read_text().splitlines()[: done + 2]  # header, rounds 0..done
    _damage(work / "metrics.csv", how)
    assert main(["run", "--resume", str(work)]) == 0
    assert "rebuilt" in capsys.readouterr().out
    got = metrics_without_time(work / "metrics.csv")
    assert [r["round"] for r in got] == [str(k) for k in range(SETTINGS["rounds"] + 1)]
    assert got == metrics_without_time(reference / "metrics.csv")
    # the rows the checkpoint covered come back as they were written, time columns included
    assert (work / "metrics.csv").read_text().splitlines()[: done + 2] == before


def test_damaged_metrics_and_more_rounds_match_a_longer_uninterrupted_run(runs, tmp_path):
    killed, _ = runs
    work, longer = tmp_path / "run", tmp_path / "longer"
    shutil.copytree(killed, work)
    (work / "metrics.csv").unlink()
    assert main(["run", "--resume", str(work), "-r", "8"]) == 0
    execute({**SETTINGS, "rounds": 8}, longer, log=lambda _: None)
    got = metrics_without_time(work / "metrics.csv")
    assert len(got) == 9 and got == metrics_without_time(longer / "metrics.csv")


def test_a_checkpoint_without_the_history_refuses_a_damaged_file(runs, tmp_path, capsys):
    """A checkpoint written before fedhet kept the rows cannot rebuild them: one line."""
    killed, _ = runs
    work = tmp_path / "run"
    shutil.copytree(killed, work)
    store = RunStore(work)
    old = {k: v for k, v in store.load_checkpoint().items() if k not in ("metrics", "diag_records")}
    (work / "checkpoint.prev.pt").unlink()
    store.save_checkpoint(old)
    (work / "metrics.csv").unlink()
    assert main(["run", "--resume", str(work)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "too old to rebuild" in err and "--force" in err
    assert not (work / "metrics.csv").exists()


def test_the_history_is_compact_exact_and_never_re_encoded():
    history = MetricsHistory()
    rows = [{"round": k, "test_loss": 1 / (k + 1), "test_accuracy": float("nan") if k % 7 else 0.5,
             "uplink_bytes": 4 * k, **{f"tau_{i}": float(k % 5 + i) for i in range(30)}}
            for k in range(300)]
    history.sync(rows[:200])
    sealed = history.state()["blocks"]
    history.sync(rows)
    state = history.state()
    assert all(a is b for a, b in zip(sealed, state["blocks"], strict=False))  # sealed once
    back = MetricsHistory.from_state(state).rows()
    assert len(back) == 300 and [type(r["round"]) for r in back] == [int] * 300
    assert json.dumps(back) == json.dumps(rows)  # NaN, ints and floats exactly
    csv_bytes = len(csv_table(rows, format_value, float("nan"))[0])
    stored = sum(map(len, state["blocks"])) + sum(map(len, state["tail"]))
    assert stored < 0.75 * csv_bytes, (stored, csv_bytes)  # ~0.6: the float digits do not compress


def test_missing_diagnostics_records_are_named(tmp_path, capsys):
    out = tmp_path / "run"
    settings = {"algorithm": "bherd", "clients": 3, "rounds": 3, "local_steps": 2}
    execute(settings, out, log=lambda _: None)
    records = (out / "diagnostics.jsonl").read_text().splitlines()
    assert len(records) == 3
    (out / "diagnostics.jsonl").write_text(records[0] + "\n")
    assert main(["run", "--resume", str(out), "-r", "4"]) == 0
    assert "lacks 2 of the 3 records" in capsys.readouterr().out
