"""The command line: a run end to end, and bad input (one line, exit 2, nothing overwritten)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def fedhet(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedhet", *args], capture_output=True, text=True, cwd=cwd,
        timeout=120,
    )


def test_run_writes_config_metrics_summary(tmp_path: Path):
    out = tmp_path / "run"
    r = fedhet("run", "-a", "fedavg", "-d", "digits", "-p", "iid", "-n", "5", "-r", "3",
               "--set", "lr=0.1", "--set", "model.hidden=32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "results in" in r.stdout and r.stderr == ""  # no progress bar without a terminal
    config = json.loads((out / "config.json").read_text())
    assert config["lr"] == 0.1 and config["model_params"] == {"hidden": 32}
    assert config["partition"] == "iid" and config["model"] == "mlp"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["rounds_done"] == 3
    assert len((out / "metrics.csv").read_text().strip().splitlines()) == 1 + 4


def test_cli_fedavg_learns_digits_dirichlet(tmp_path: Path):
    """End to end from the command line: digits, 10 clients, Dirichlet 0.5, FedAvg above 90 %."""
    out = tmp_path / "run"
    r = fedhet("run", "-a", "fedavg", "-d", "digits", "-p", "dirichlet", "-n", "10", "-r", "30",
               "--set", "partition.alpha=0.5", "--set", "lr=0.1", "--set", "local_epochs=2",
               "--out", str(out))
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_accuracy"] > 0.90
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    for col in ("round", "test_loss", "test_accuracy", "wall_time_s", "uplink_bytes", "downlink_bytes"):
        assert col in header


def test_config_file_and_set_override(tmp_path: Path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('algorithm = "fedavgm"\nrounds = 2\nclients = 4\n[algorithm_params]\ngamma = 0.5\n')
    r = fedhet("run", "--config", str(cfg), "--set", "algorithm.gamma=0.25", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["algorithm"] == "fedavgm" and config["algorithm_params"]["server_momentum"] == 0.25


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-a", "fedmagic"], "unknown algorithm 'fedmagic'; choose one of"),
        (["-d", "imagenet"], "unknown dataset 'imagenet'"),
        (["-p", "zebra"], "unknown partition 'zebra'"),
        (["-m", "resnet999"], "unknown model 'resnet999'"),
        (["--set", "partition.alpha=0"], "partition.alpha must be > 0"),
        (["--set", "partition.alpha=-1"], "partition.alpha must be > 0"),
        (["-n", "5000"], "5000 clients but only"),
        (["--set", "lr=-1"], "lr must be a positive number"),
        (["--set", "lr=abc"], "lr must be a number"),
        (["--set", "nosuchthing=1"], "unknown setting 'nosuchthing'"),
        (["--set", "algorithm.gamma=0.5"], "unknown parameter algorithm.gamma"),
        (["--set", "sample_fraction=2"], "sample_fraction must be in (0, 1]"),
        (["--config", "/nonexistent.toml"], "config file /nonexistent.toml not found"),
        (["-d", "digits", "-p", "shards", "--set", "partition.xi=11"], "xi"),
        (["-d", "mnist", "--data-dir", "/nonexistent-data"], "train-images-idx3-ubyte.gz"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], needle: str):
    out = tmp_path / "run"
    r = fedhet("run", *args, "-r", "1", "--out", str(out))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not out.exists()


def test_existing_out_is_not_overwritten(tmp_path: Path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    r = fedhet("run", "-r", "1", "--out", str(out))
    assert r.returncode == 2 and "--resume" in r.stderr and "--force" in r.stderr
    assert (out / "precious.txt").read_text() == "keep me"
    r = fedhet("run", "-r", "1", "--out", str(out), "--force")  # not fedhet's: refused
    assert r.returncode == 2 and "not created by fedhet" in r.stderr
    assert (out / "precious.txt").read_text() == "keep me"


def test_force_replaces_a_run_but_keeps_what_fedhet_did_not_write(tmp_path: Path):
    out = tmp_path / "run"
    assert fedhet("run", "-r", "1", "--out", str(out)).returncode == 0
    (out / "notes.txt").write_text("mine")
    first = (out / "metrics.csv").read_text()
    r = fedhet("run", "-r", "2", "--out", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert (out / "notes.txt").read_text() == "mine" and "notes.txt" in r.stdout + r.stderr
    assert (out / "metrics.csv").read_text() != first


def test_invalid_force_run_keeps_old_results(tmp_path: Path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    r = fedhet("run", "-r", "1", "--set", "partition.alpha=-2", "--out", str(out), "--force")
    assert r.returncode == 2 and (out / "precious.txt").exists()


def test_list_shows_parameters():
    r = fedhet("list")
    assert r.returncode == 0
    assert "fedavgm" in r.stdout and "dirichlet" in r.stdout
    assert "server_momentum=0.9 (formerly gamma)" in r.stdout


def test_an_error_line_reaches_stderr_in_one_write(monkeypatch):
    """The error line and its newline go out in one write, so another thread's log on the same
    stream (Ray's C++ logger) cannot land between them and glue itself onto the line."""
    import io
    import sys

    from fedhet.cli import main

    writes: list[str] = []

    class Recorder(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return super().write(text)

    monkeypatch.setattr(sys, "stderr", Recorder())
    assert main(["run", "--set", "rounds=-1"]) != 0
    errors = [w for w in writes if w.startswith("error: ")]
    assert len(errors) == 1 and errors[0].endswith("\n") and errors[0].count("\n") == 1
