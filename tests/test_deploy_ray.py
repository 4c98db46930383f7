"""`fedhet deploy local --simulation` on a two-node Ray cluster (one CPU each, no dashboard): the
virtual SuperNodes' ClientApp actors run on both nodes and the run's metrics equal the
in-process engine's.

The cluster is the cluster harness's (tests/cluster_harness.py, its `sim` scenario: the same
two nodes the `--cluster ray` tests use, started once a session inside a private network
namespace, where 127.0.0.1 is the only address, with Ray's files in a temp directory of its
own; the `cluster` fixture waits for its report). A `--ray-address` where no cluster answers is
one line before Flower starts."""

from __future__ import annotations

import csv
import math
import subprocess
import time

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install fedhet[flower-sim])")
pytest.importorskip("ray", reason="Ray is not installed (pip install fedhet[flower-sim])")

from cluster_harness import SIM_SETTINGS, harness_output  # noqa: E402

from fedhet.deploy.command import _ray_options  # noqa: E402
from fedhet.deploy.launch import LocalFederation  # noqa: E402
from fedhet.engine.assembly import assemble  # noqa: E402
from fedhet.engine.config import config_of  # noqa: E402
from fedhet.errors import FedhetError  # noqa: E402
from fedhet.rundir.store import read_checkpoint  # noqa: E402

SETTINGS = SIM_SETTINGS  # the harness's `sim` run


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_unshare = pytest.mark.skipif(
    not _unshare_works(), reason="needs `unshare -n` (root) to keep Ray inside a private network namespace")


def test_ray_flags_are_checked_and_the_address_is_chosen(monkeypatch):
    with pytest.raises(FedhetError, match="--ray-address, --client-gpus apply only with --simulation"):
        _ray_options(False, "127.0.0.1:6379", None, 0.5)
    with pytest.raises(FedhetError, match="--client-cpus applies only with --simulation"):
        _ray_options(False, None, 2, None)
    with pytest.raises(FedhetError, match="--client-cpus must be a whole number"):
        _ray_options(True, None, 0.5, None)
    with pytest.raises(FedhetError, match="--client-gpus must be a share"):
        _ray_options(True, None, None, -1.0)
    assert _ray_options(True, None, None, 0.25) == {
        "ray_address": None, "cpus_per_node": 1, "gpus_per_node": 0.25}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # no address: a private one-node Ray, never a cluster found on the machine
    assert LocalFederation(2, simulation=True).env["RAY_ADDRESS"] == "local"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert LocalFederation(2, simulation=True).env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert LocalFederation(2, simulation=True, ray_address="auto").env["RAY_ADDRESS"] == "auto"


@needs_unshare
def test_one_simulation_spread_over_a_two_node_ray_cluster(cluster):
    # the cluster harness's `sim` scenario ran `fedhet deploy local --simulation --ray-address`
    # on its two-node cluster (`cluster_harness.scenario_sim`) and then asked Ray where the
    # ClientApp actors were; the harness's report holds that, and fails if anything it started
    # in its namespace was left running
    work, report = cluster
    assert "sim_failed" not in report, harness_output(work)
    stdout, stderr = ((work / f"sim.{n}").read_text() for n in ("out", "err"))
    assert report["sim_rc"] == 0, f"{stderr[-3000:]}\n{harness_output(work)}"
    out = work / "sim"

    # the virtual nodes' ClientApps ran in actors on both nodes of the cluster
    placed = report["sim_placed"]
    assert len(placed["nodes"]) == 2
    assert sorted(placed["actors"]) == sorted(placed["nodes"])

    # off a terminal: one progress line per round; the Flower logs kept in the run directory
    assert f"on the Ray cluster at {report['address']}" in stdout
    for k in (1, 2, 3):
        assert f"fedhet: round {k}/3: accuracy " in stdout, stdout
    assert (out / "flower-logs" / "superlink.log").exists()

    # the same metrics as the in-process engine (time columns aside)
    local = assemble(config_of(SETTINGS), store=None, log=lambda _: None)
    rows: list[dict] = []
    local.callbacks.append(rows.append)
    local.run()
    with (out / "metrics.csv").open() as f:
        remote = list(csv.DictReader(f))[1:]
    assert len(remote) == len(rows) == 3
    for mine, theirs in zip(remote, rows, strict=True):
        for key in ("round", "test_accuracy", "test_loss"):
            assert math.isclose(float(mine[key]), float(theirs[key]), rel_tol=0, abs_tol=1e-6), key
    w = read_checkpoint(out / "checkpoint.pt")["server"]["w"]
    assert torch.allclose(w, local.final_state.w, atol=1e-6, rtol=0)


def test_an_address_where_no_cluster_answers_is_one_line_before_flower_starts(tmp_path, capsys,
                                                                              monkeypatch):
    import socket

    from fedhet.cli import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the socket is
    t = time.monotonic()
    argv = ["deploy", "local", "--simulation", "--ray-address", f"127.0.0.1:{port}", "-a", "fedavg",
            "-d", "digits", "-n", "2", "-r", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: --ray-address 127.0.0.1:{port}: no Ray cluster answers there"), err
    assert time.monotonic() - t < 60
    assert not (tmp_path / "out" / "metrics.csv").exists()
