"""`fedhet deploy local --simulation` on a two-node Ray cluster (`ray start --head` and a second
`ray start --address`, one CPU each, no dashboard): the virtual SuperNodes' ClientApp actors
run on both nodes and the run's metrics equal the in-process engine's.

Everything that starts Ray runs inside one private network namespace (`unshare -n`, then
`ip link set lo up`), where 127.0.0.1 is the only address, so no traffic leaves loopback, with
Ray's files in a temp directory of the test's own (`--temp-dir`, `RAY_TMPDIR`); the
namespace's processes are stopped by PID when the test ends. A `--ray-address` where no cluster
answers is one line before Flower starts."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install fedhet[flower-sim])")
pytest.importorskip("ray", reason="Ray is not installed (pip install fedhet[flower-sim])")

from fedhet.deploy.command import _ray_options  # noqa: E402
from fedhet.deploy.launch import LocalFederation  # noqa: E402
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of  # noqa: E402
from fedhet.errors import FedhetError  # noqa: E402
from fedhet.rundir.store import read_checkpoint  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")
BIN = str(Path(sys.executable).parent)
SETTINGS = {"algorithm": "fedavg", "dataset": "digits", "partition": "dirichlet", "clients": 3,
            "rounds": 3, "lr": 0.1, "seed": 3, "local_steps": 4}
PROBE = textwrap.dedent("""
    import json, sys, ray
    from ray._private import state
    ray.init(address=sys.argv[1], logging_level="ERROR")
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    actors = [a["Address"]["NodeID"] for a in state.actors().values()
              if a["ActorClassName"] == "ClientAppActor"]
    print(json.dumps({"nodes": nodes, "actors": actors}))
""")


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _stop_namespace(ns: str, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, every process in the network namespace `ns` (ours alone)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p.name) for p in Path("/proc").iterdir()
                if p.name.isdigit() and _netns(int(p.name)) == ns]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            if not any(_netns(p) == ns for p in pids):
                return
            time.sleep(0.1)


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


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


def test_one_simulation_spread_over_a_two_node_ray_cluster(tmp_path):
    if not _unshare_works():
        pytest.skip("needs `unshare -n` (root) to keep Ray inside a private network namespace")
    ray_tmp = Path(tempfile.mkdtemp(prefix="fhray", dir="/tmp"))  # short: Ray's socket paths
    out = tmp_path / "out"
    sets = " ".join(f"--set {k}={v}" for k, v in SETTINGS.items()
                    if k not in ("algorithm", "dataset", "clients", "rounds"))
    node = "--node-ip-address 127.0.0.1 --num-cpus 1 --num-gpus 0 --object-store-memory 80000000 " \
           "--disable-usage-stats"
    script = f"""
        set -e
        ip link set lo up
        export PATH={BIN}:$PATH RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=1
        ray start --head --port 6379 --include-dashboard=false --temp-dir {ray_tmp} {node} \
            >{ray_tmp}/head.log 2>&1
        ray start --address 127.0.0.1:6379 {node} >{ray_tmp}/worker.log 2>&1
        PYTHONPATH={SRC} python -m fedhet deploy local --simulation --ray-address 127.0.0.1:6379 \
            --client-cpus 1 -a fedavg -d digits -n 3 -r 3 {sets} --out {out}
        python -c '{PROBE}' 127.0.0.1:6379 >{ray_tmp}/probe.json
    """
    # Ray's default temp directory (its address file) and home (its token file) are the test's
    # own: nothing another Ray left on the machine reaches this one
    (ray_tmp / "home").mkdir()
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "RAY_TMPDIR": str(ray_tmp),
           "HOME": str(ray_tmp / "home")}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(["unshare", "-n", "bash", "-c", script], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ns = None
    try:
        own = _netns(os.getpid())
        deadline = time.monotonic() + 10
        while ns in (None, own) and time.monotonic() < deadline and proc.poll() is None:
            ns = _netns(proc.pid)
            time.sleep(0.01)
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if ns is not None and ns != _netns(os.getpid()):
            _stop_namespace(ns)
        logs = {n: (ray_tmp / n).read_text() for n in ("head.log", "worker.log")
                if (ray_tmp / n).exists()}
        probe = (ray_tmp / "probe.json").read_text() if (ray_tmp / "probe.json").exists() else ""
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, f"{stderr[-3000:]}\n{logs}"
    assert ns is not None and not any(
        p.name.isdigit() and _netns(int(p.name)) == ns for p in Path("/proc").iterdir()
    ), "processes of the Ray cluster left running"

    # the virtual nodes' ClientApps ran in actors on both nodes of the cluster
    placed = json.loads(probe)
    assert len(placed["nodes"]) == 2
    assert sorted(placed["actors"]) == sorted(placed["nodes"])

    # off a terminal: one progress line per round; the Flower logs kept in the run directory
    assert "on the Ray cluster at 127.0.0.1:6379" in stdout
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
