"""A real deployment on 127.0.0.1 survives its clients: a SuperNode killed with SIGKILL mid-run
is a dropped client for the rounds it misses and rejoins when started again (the model equals
the in-process engine's with that client offline in exactly those rounds); a killed SuperLink
ends `fedhet deploy local` with one line and leaves no process of the deployment behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install fedhet[flower])")

from fedhet.deploy.launch import LocalFederation  # noqa: E402
from fedhet.deploy.process_tree import alive, children, named_descendants, stop_tree  # noqa: E402
from fedhet.deploy.project import write_app  # noqa: E402
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of  # noqa: E402
from fedhet.engine.faults import DROPPED, OK, FaultModel  # noqa: E402
from fedhet.procs import process_table  # noqa: E402
from fedhet.rundir.store import read_checkpoint  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")
SETTINGS = {"algorithm": "fedavg", "dataset": "digits", "partition": "dirichlet", "clients": 2,
            "rounds": 10, "lr": 0.1, "seed": 3, "local_steps": 4}


def _rows(out: Path) -> list[dict[str, str]]:
    path = out / "metrics.csv"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_killed_supernode_is_dropped_for_the_rounds_it_misses_and_rejoins(tmp_path):
    out = tmp_path / "out"
    seen: list[str] = []
    result: dict[str, Any] = {}
    with LocalFederation(2, workdir=tmp_path / "fed") as fed:
        write_app(tmp_path / "app", SETTINGS, out, round_timeout=120, node_wait_timeout=120,
                  fast_pulls=True, node_events=fed.events_file)
        def run() -> None:
            try:
                result["summary"] = fed.run(tmp_path / "app", out, timeout=240, echo=seen.append)
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                result["error"] = e

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        _wait(lambda: len(_rows(out)) >= 2 or not thread.is_alive(), 180, "round 1")
        victim = fed.nodes[1].pid
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: any(f"SuperNode 1 (PID {victim}) died" in s for s in seen)
              or not thread.is_alive(), 30, "the watchdog's line")
        fed.start_node(1)  # started again by hand: the same partition, a new Flower node
        thread.join(timeout=240)
        assert not thread.is_alive(), "the run did not end"
        pids = fed.all_pids()
    assert "error" not in result, result.get("error")
    assert result["summary"]["finished"] and result["summary"]["rounds_done"] == 10

    died = [s for s in seen if f"SuperNode 1 (PID {victim}) died" in s]
    assert len(died) == 1 and "killed by SIGKILL" in died[0] and "during round" in died[0]
    assert "flower-supernode --insecure --superlink 127.0.0.1:" in died[0]

    # the drop: a block of rounds from the kill to the rejoin, as deploy.json records them
    events = json.loads((out / "deploy.json").read_text())["node_events"]
    assert [(e["client"], e["event"]) for e in events] == [(1, "dropped"), (1, "rejoined")]
    first, back = events[0]["round"], events[1]["round"]
    assert 2 <= first < back <= 10
    dropped = [float(r["clients_dropped"]) for r in _rows(out)]
    assert dropped == [0.0 if k < first or k >= back else 1.0 for k in range(11)]
    assert any(f"round {back}: client 1 rejoined" in s for s in seen), seen
    # the launcher told the server app at once: no wait for two missed heartbeats (20 s)
    assert any(s.startswith(f"fedhet: round {first}: dropped client 1 (SuperNode ") and
               "its SuperNode died" in s for s in seen), seen

    # the same model as the in-process engine with client 1 offline in exactly those rounds
    class Offline(FaultModel):
        def outcome(self, client_id: int, round: int) -> str:
            return DROPPED if client_id == 1 and first <= round + 1 < back else OK

    local = assemble(config_of(SETTINGS), store=None, log=lambda _: None)
    local.parts.faults = Offline.from_config(config_of(SETTINGS))
    local.run()
    remote = read_checkpoint(out / "checkpoint.pt")["server"]["w"]
    assert torch.allclose(remote, local.final_state.w, atol=1e-6, rtol=0)
    time.sleep(0.5)
    assert not [p for p in pids if alive(p)], "Flower processes left running"


def test_a_killed_superlink_ends_deploy_local_and_leaves_nothing_running(tmp_path):
    cmd = [sys.executable, "-m", "fedhet", "deploy", "local", "-a", "fedavg", "-d", "digits",
           "-n", "1", "-r", "200", "--set", "lr=0.1", "--out", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": SRC, "FLWR_TELEMETRY_ENABLED": "0"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: len(_rows(tmp_path / "out")) >= 2 or proc.poll() is not None, 180, "round 1")
        assert proc.poll() is None, proc.communicate()
        table = process_table()
        deployment = set(children(proc.pid))
        sessions = {table[p][1] for p in deployment if p in table} - {os.getsid(0)}
        superlink = named_descendants(proc.pid, "flower-superlink")  # not a fork of it
        assert len(superlink) == 1 and any("flwr-serverapp" in _cmdline(p) for p in deployment)
        os.kill(superlink[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            stop_tree(proc)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: SuperLink (PID {superlink[0]}) died with killed by SIGKILL")
    time.sleep(0.5)
    left = [p for p, (_, sid, _) in process_table().items()
            if alive(p) and (p in deployment or sid in sessions)]
    assert not left, [(p, _cmdline(p)) for p in left]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
