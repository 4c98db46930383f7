"""`--cluster ray` on a real two-node Ray cluster (tests/cluster_harness.py).

One harness run, inside a private network namespace, starts the cluster once and drives every
grid below against it; these tests read what it reports and the directories it leaves:
a grid on the cluster equals the same grid with `--jobs`; a worker node lost part-way (its
raylet SIGKILLed) and then the driver killed with -9 lose nothing; a cluster without what a
grid needs is refused in one line; nodes that join a running grid get runs only once their
file probe passed; a driver without an address starts a private local Ray (never the address
a stale file names), and one killed with -9 leaves none of its Ray's processes once it is
started again. Without a cluster: bad addresses and resource shares, a closed port, a head that
never answers and Ctrl-C while joining, each one line in bounded time.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_errors import one_error_line
from cluster_harness import harness_output

from fedhet.cli import main
from fedhet.errors import FedhetError
from fedhet.rundir.store import TIME_COLUMNS
from fedhet.runs.raynodes import check_resources

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed (pip install 'fedhet[cluster]')")


# `cluster`: the harness's work directory and report (tests/conftest.py starts the harness, in a
# private network namespace, as soon as the tests are collected; the fixture waits for it)


def metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in csv.DictReader(f)]


def summary(run: Path) -> dict:
    s = json.loads((run / "summary.json").read_text())
    return {k: v for k, v in s.items() if "time" not in k}


def same_runs(a: Path, b: Path) -> list[str]:
    """The run names of grid directories `a` and `b`, asserting they hold the same runs with the
    same files, config, metrics (time columns aside) and summary."""
    names = sorted(p.name for p in (a / "runs").iterdir())
    assert names == sorted(p.name for p in (b / "runs").iterdir())
    for name in names:
        ra, rb = a / "runs" / name, b / "runs" / name
        assert sorted(p.name for p in ra.iterdir()) == sorted(p.name for p in rb.iterdir())
        ca, cb = (json.loads((r / "config.json").read_text()) for r in (ra, rb))
        # provenance names the checkout's commit as each run saw it: a commit made while the
        # harness runs differs between the two grids without the runs differing
        assert ca.pop("provenance").keys() == cb.pop("provenance").keys()
        assert ca == cb, name
        assert metrics(ra) == metrics(rb), name
        assert summary(ra) == summary(rb), name
    return names


def log(work: Path, name: str) -> str:
    return (work / f"{name}.log").read_text()


@needs_ray
def test_a_grid_on_the_cluster_equals_the_grid_with_jobs(cluster):
    work, report = cluster
    assert "same_failed" not in report, harness_output(work)
    assert report["same_jobs_rc"] == 0, log(work, "same-jobs")
    assert report["same_ray_rc"] == 0, log(work, "same-ray")
    names = same_runs(work / "same-jobs", work / "same-ray")
    assert len(names) == 4 and all(json.loads((work / "same-ray" / "runs" / n / "summary.json")
                                              .read_text())["rounds_done"] == 4 for n in names)
    text = log(work, "same-ray")
    assert "cluster: 2 Ray node(s), 2 unit(s) at a time (1 CPU, 0 GPU each)" in text
    assert text.count(" on ") >= 4  # each finished run names its node
    assert not (work / "same-ray" / ".cluster").exists()  # the control files are cleaned up


@needs_ray
def test_a_lost_node_and_a_killed_driver_lose_nothing(cluster):
    work, report = cluster
    assert "lost_failed" not in report, harness_output(work)
    first, second = log(work, "lost-1"), log(work, "lost-2")
    victim, at = report["lost_victim"], report["lost_victim_round"]
    assert at >= 3
    # the lost run was resubmitted and resumed from its checkpoint, not from round 0
    line = next(x for x in first.splitlines() if "resubmitted" in x)
    assert victim in line
    resumed = int(line.split(f"{victim} (from round ")[1].split(")")[0])
    assert resumed >= at
    # the driver was killed -9 part-way; started again it finished the grid
    assert report["lost_rc"] == 0, second
    assert any(0 < k < report["lost_rounds"] for k in report["killed_at"].values()), report["killed_at"]
    assert report["lost_jobs_rc"] == 0, log(work, "lost-jobs")
    names = same_runs(work / "lost-jobs", work / "lost")
    assert len(names) == 4
    for name in names:  # every round once, in order: resumed exactly, nothing repeated
        rounds = [int(r["round"]) for r in metrics(work / "lost" / "runs" / name)]
        assert rounds == list(range(report["lost_rounds"] + 1))


@needs_ray
def test_ctrl_c_on_the_cluster_stops_at_saved_rounds_and_resumes_exactly(cluster):
    work, report = cluster
    assert "lost_failed" not in report, harness_output(work)
    first = log(work, "lost-0")
    assert report["stop_rc"] == 130, first
    last = first.strip().splitlines()[-1]
    assert last.startswith("interrupted: 2 running run(s) stopped after a saved round")
    assert "2 queued run(s) cancelled" in last
    stopped = report["stopped_at"]
    # queued: untouched
    assert len(stopped) == 2 and all(0 < k < report["lost_rounds"] for k in stopped.values())
    for name, k in stopped.items():  # each stopped after the round it had saved last
        assert f"{name} at round {k}" in last
    assert report["stop_exit_s"] < 60  # a round of digits takes well under a second
    # the same command resumed them: the grid's runs end equal to an undisturbed grid's (the
    # lost-node test checks every run's metrics, round by round)


@needs_ray
def test_a_cluster_without_what_the_grid_needs_is_refused_in_one_line(cluster):
    work, report = cluster
    assert "refused_failed" not in report, harness_output(work)
    assert report["refused_cpus_rc"] == 2
    text = log(work, "refused-cpus").strip().splitlines()
    assert text[-1].startswith("error: no node of the Ray cluster has the 2 CPU and 0 GPU")
    assert report["refused_fs_rc"] == 2
    last = log(work, "refused-fs").strip().splitlines()[-1]
    assert last.startswith("error: Ray node ") and "cannot use the grid directory" in last
    assert "shared filesystem" in last
    assert not (work / "hidden" / "grid" / "runs").exists()  # nothing ran


@needs_ray
def test_nodes_that_join_a_running_grid_are_probed_before_they_get_runs(cluster):
    """Two nodes join while a grid runs on the head alone: the one that cannot see the grid
    directory is named in one line and gets no run; the one that can takes runs."""
    work, report = cluster
    assert "late_failed" not in report, harness_output(work)
    text = log(work, "late")
    assert report["late_alive_before"] == 1 and report["late_rc"] == 0, text
    assert "cluster: 1 Ray node(s), 1 unit(s) at a time" in text
    seeds = report["late_seeds"]
    assert sorted(report["late_runs"].values()) == [report["late_rounds"]] * seeds, report["late_runs"]
    assert any(k < report["late_rounds"] for k in report["late_joined_at"].values())  # joined mid-grid
    refused = [x for x in text.splitlines() if x.startswith("cluster: no run goes to node ")]
    assert len(refused) == 1, text
    blind = refused[0].removeprefix("cluster: no run goes to node ").split(": ")[0]
    assert f"cannot read {work / 'hidden' / 'late' / '.cluster' / 'probe'}" in refused[0]
    assert "mount the grid directory at the same path" in refused[0]
    joined = [x for x in text.splitlines() if x.endswith(" joined; runs go there too")]
    assert len(joined) == 1, text
    seeing = joined[0].removeprefix("cluster: node ").removesuffix(" joined; runs go there too")
    placed = [x.rsplit(" on ", 1)[1] for x in text.splitlines() if "] fedavg__seed" in x and ": final " in x]
    assert len(placed) == seeds and blind not in placed and seeing in placed, text


@pytest.mark.parametrize(("argv", "message"), [
    (["--ray-address", "auto"], "--ray-address: options of --cluster ray; add --cluster ray"),
    (["--cluster", "ray", "--jobs", "2"], "--jobs sets local processes"),
])
def test_cluster_flags_misused_are_one_line(tmp_path, capsys, argv, message):
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 2\nrounds = 1\n')
    assert main(["compare", "--config", str(grid), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "o").exists()


def test_cuda_runs_without_a_gpu_share_are_refused_before_ray_starts(tmp_path, capsys,
                                                                      monkeypatch):
    from fedhet.runs import cluster

    def no_ray(options):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(cluster, "connect", no_ray)
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 2\nrounds = 1\n[axes]\nseed = [0, 1]\n')
    argv = ["compare", "--config", str(grid), "--out", str(tmp_path / "o"), "--cluster", "ray",
            "--device", "cuda"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 run(s) ask for device=cuda" in err[0] and "--gpus-per-run" in err[0]
    assert not list((tmp_path / "o" / "runs").glob("*/config.json"))  # nothing ran


def test_capacity_counts_units_per_node_with_gpu_shares():
    from fedhet.runs.cluster import ClusterOptions
    from fedhet.runs.raynodes import capacity

    nodes = [{"Resources": {"CPU": 16.0, "GPU": 4.0}}, {"Resources": {"CPU": 8.0}},
             {"Resources": {"CPU": 0.0, "GPU": 0.0}}]  # e.g. a head started with --num-cpus 0
    assert capacity(nodes, ClusterOptions()) == 16 + 8
    assert capacity(nodes, ClusterOptions(cpus_per_run=3)) == 5 + 2
    # 0.25 of a GPU: 16 on the GPU node's 4 GPUs, limited by its 16 CPUs; none elsewhere
    assert capacity(nodes, ClusterOptions(gpus_per_run=0.25)) == 16
    assert capacity(nodes, ClusterOptions(cpus_per_run=2, gpus_per_run=0.25)) == 8
    assert capacity(nodes, ClusterOptions(gpus_per_run=0.3)) == 13  # ⌊4 / 0.3⌋
    assert capacity([{"Resources": {"CPU": 64.0, "GPU": 1.0}}], ClusterOptions(gpus_per_run=0.1)) == 10
    with pytest.raises(FedhetError, match="no node of the Ray cluster has the 1 CPU and 8 GPU"):
        check_resources(nodes, ClusterOptions(gpus_per_run=8))


def test_node_labels_are_host_names_made_unique():
    from fedhet.runs.raynodes import node_labels

    nodes = [{"NodeID": "aa11" * 7, "NodeManagerHostname": "gpu1"},
             {"NodeID": "bb22" * 7, "NodeManagerHostname": "cpu"},
             {"NodeID": "cc33" * 7, "NodeManagerHostname": "cpu"}]
    assert node_labels(nodes) == {"aa11" * 7: "gpu1", "bb22" * 7: "cpu:bb22bb", "cc33" * 7: "cpu:cc33cc"}


def test_a_retried_job_resumes_what_its_lost_task_began(tmp_path):
    from fedhet.runs.jobs import Job
    from fedhet.runs.raytask import refreshed

    job = Job("r", {"dataset": "digits"}, str(tmp_path / "r"), resume=False)
    assert refreshed(job) is job  # nothing there yet: a fresh start
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text("{}")
    assert refreshed(job).resume and refreshed(job).settings == job.settings
    again = Job("r", {}, str(tmp_path / "r"), resume=True)
    assert refreshed(again) is again


ID = {name: f"{i + 1:x}" * 56 for i, name in enumerate(["head", "good", "blind", "slow"])}
"""Node ids (Ray checks they are 56 hex digits) of the stand-in nodes, by host name."""


class _ProbeRay:
    """A stand-in Ray for `Members`: the `alive` nodes (host names) and each probe's answer by
    host name (None: not answered yet)."""

    class exceptions:  # noqa: N801 - Ray's name
        RayError = RuntimeError

    def __init__(self, alive: list[str], answers: dict[str, dict | None]) -> None:
        self.alive, self.answers, self.sent, self.cancelled = alive, answers, [], []
        self.host = {v: k for k, v in ID.items()}

    def nodes(self) -> list[dict]:
        return [{"NodeID": ID[n], "Alive": True, "NodeManagerHostname": n} for n in self.alive]

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, scheduling_strategy=None, **_):
                node = ray.host[scheduling_strategy.node_id]

                class Bound:
                    def remote(self, *args):
                        ray.sent.append(node)
                        return ("probe", node)
                return Bound()
        return Task()

    def wait(self, refs, num_returns, timeout):
        ready = [r for r in refs if self.answers.get(r[1]) is not None]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        return self.answers[ref[1]]

    def cancel(self, ref, force):
        self.cancelled.append(ref[1])


@needs_ray
def test_a_node_that_joins_is_probed_and_kept_from_runs_until_it_answers_yes(tmp_path):
    from fedhet.runs.raynodes import Members

    ray = _ProbeRay(["head"], {})
    notes: list[str] = []
    members = Members(ray, ray.nodes(), tmp_path, "token", str(tmp_path), notes.append)
    assert members.selector() is None and not members.nowhere()  # Ray places runs freely
    ray.alive = ["head", "good", "blind"]
    ray.answers = {"good": None, "blind": None}
    assert [n["NodeManagerHostname"] for n in members.look()] == ["head"]
    assert sorted(ray.sent) == ["blind", "good"]
    assert members.selector() == {"ray.io/node-id": f"in({ID['head']})"}  # off the unprobed
    ray.answers = {"good": {"ok": True}, "blind": {"ok": False, "why": "cannot read /g/probe"}}
    assert [n["NodeManagerHostname"] for n in members.look()] == ["head", "good"]
    assert sorted(ray.sent) == ["blind", "good"]  # each probed once
    assert members.selector() == {"ray.io/node-id": f"in({ID['head']},{ID['good']})"}
    assert notes == ["cluster: node good joined; runs go there too",
                     "cluster: no run goes to node blind: cannot read /g/probe; every node must "
                     "mount the grid directory at the same path (docs/cluster.md)"]
    ray.alive = ["blind"]  # the usable nodes lost: nowhere to place runs until one joins
    members.look()
    assert members.nowhere() and len(notes) == 2
    # a node one of whose tasks found it unusable stays refused when its probe then says yes
    ray.alive, ray.answers = ["blind", "slow"], {"slow": None}
    members.look()
    members.refuse(ID["slow"], "cannot read /g/probe")
    ray.answers = {"slow": {"ok": True}}
    assert members.look() == [] and ID["slow"] not in members.usable and len(notes) == 3


@needs_ray
def test_a_probe_that_never_answers_refuses_its_node(tmp_path, monkeypatch):
    from fedhet.runs import raynodes

    ray = _ProbeRay(["head", "slow"], {"slow": None})
    notes: list[str] = []
    members = raynodes.Members(ray, ray.nodes()[:1], tmp_path, "t", str(tmp_path), notes.append)
    members.look()
    assert not ray.cancelled and not notes
    monkeypatch.setattr(raynodes, "PROBE_TIMEOUT_S", -1.0)
    members.look()
    assert ray.cancelled == ["slow"] and ID["slow"] in members.refused
    assert notes[0].startswith("cluster: no run goes to node slow: it did not answer the file probe")


@needs_ray
def test_ctrl_c_while_the_nodes_are_probed_stops_without_waiting_for_them(tmp_path):
    """A node that does not answer its probe holds the driver at most `PROBE_TIMEOUT_S`, and
    Ctrl-C not at all: the probes are cancelled and the driver stops."""
    import threading

    from fedhet.runs import cluster, raylink

    ray = _ProbeRay(["head", "slow"], {"head": {"ok": True}, "slow": None})
    requested = threading.Event()
    threading.Timer(0.3, requested.set).start()
    t = time.monotonic()
    with pytest.raises(raylink.Stopped):
        cluster.check_nodes(ray, ray.nodes(), tmp_path, str(tmp_path), requested)
    assert time.monotonic() - t < 5 and ray.cancelled == ["slow"]


@needs_ray
def test_a_task_on_a_node_that_cannot_use_the_grid_touches_nothing_and_is_requeued(
        tmp_path, monkeypatch):
    """A node joined between two looks and got a task: the task's own probe fails, its runs go
    back to the front of the queue (not counted as a try) and the node is refused."""
    from types import SimpleNamespace

    import ray

    from fedhet.runs import cluster
    from fedhet.runs.jobs import Job

    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: ID["blind"]))
    control = tmp_path / ".cluster"
    control.mkdir()
    (control / "probe").write_text("another grid's token\n")
    unit = [Job("r", {"dataset": "digits", "rounds": 1}, str(tmp_path / "runs" / "r"), resume=False)]
    results = cluster.run_task(unit, str(control), str(tmp_path), 1, 0.0, "token")
    assert results == [{"name": "r", "misplaced": f"{control / 'probe'} holds another grid's marker",
                        "at": ID["blind"]}]
    assert not (tmp_path / "runs").exists() and not (control / "where").exists()

    class Done:
        exceptions = ray.exceptions

        def get(self, ref):
            return results

    notes: list[str] = []
    members = cluster.Members(_ProbeRay(["head", "blind"], {}), [{"NodeID": ID["head"]}],
                              control, "token", str(tmp_path), notes.append)
    queue, attempts = cluster.deque([["other"]]), {id(unit): 1}
    progress = SimpleNamespace(note=notes.append, where={})
    assert cluster._results(Done(), "ref", unit, attempts, queue, False, progress, members,
                            control) == []
    assert list(queue) == [unit, ["other"]] and attempts[id(unit)] == 0
    assert ID["blind"] in members.refused
    assert notes[-1].startswith(f"cluster: no run goes to node {ID['blind'][:8]}: ")


def test_cluster_options_are_checked():
    from fedhet.runs.cluster import ClusterOptions

    with pytest.raises(FedhetError, match="--cpus-per-run must be > 0"):
        ClusterOptions(cpus_per_run=0)
    with pytest.raises(FedhetError, match="--cluster dask: unknown"):
        ClusterOptions(kind="dask")


def test_a_preset_joins_ray_once_for_all_its_stages(tmp_path, monkeypatch):
    """`reproduce --cluster ray` on a two-stage preset (FedVeca: its runs, then the fair
    baselines that read them) connects to Ray once and closes it once, after the last stage;
    a grid alone still connects and closes per call. Ray and the cluster driver are stand-ins
    here that run each unit in this process (the real cluster is the harness above)."""
    from fedhet.runs import cluster, processes

    calls: list[str] = []

    class FakeRay:
        up = False

        def is_initialized(self) -> bool:
            return self.up

        def shutdown(self) -> None:
            calls.append("shutdown")
            self.up = False

    fake = FakeRay()

    class Link:
        ray = fake

        def close(self) -> None:
            fake.shutdown()

    def connect(options, requested):
        calls.append("connect")
        fake.up = True
        return Link()

    def drive(ray, units, options, runs_dir, requested, hard, tally, progress):
        assert ray is fake and fake.up
        calls.append(f"drive {sum(len(u) for u in units)}")
        for unit in units:
            for result in processes.run_unit(unit):
                tally.add(result, progress, 0.0)

    monkeypatch.setattr(cluster, "import_ray", lambda: fake)
    monkeypatch.setattr(cluster, "connect", connect)
    monkeypatch.setattr(cluster, "_drive", drive)
    out = tmp_path / "fedveca"
    assert main(["reproduce", "fedveca", "--scale", "smoke", "--cluster", "ray", "--out", str(out)]) == 0
    assert [c.split()[0] for c in calls] == ["connect", "drive", "drive", "shutdown"], calls
    assert json.loads((out / "runs" / "logreg-digits-case3" / "protocol.json").read_text())["tau_all"] > 0
    calls.clear()
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 2\nrounds = 1\n')
    assert main(["compare", "--config", str(grid), "--out", str(tmp_path / "o"), "--cluster", "ray"]) == 0
    assert calls == ["connect", "drive 1", "shutdown"]


@needs_ray
def test_without_an_address_the_driver_starts_its_own_ray_and_a_killed_one_leaves_nothing(cluster):
    """Ray's address file names a dead cluster: a driver without an address starts a private
    local Ray instead (a one-node cluster, not the harness's two nodes). Killed with -9
    part-way and started again, it ends the processes of the first driver's Ray and finishes."""
    work, report = cluster
    assert "local_failed" not in report, harness_output(work)
    assert report["local_rc"] == 0, log(work, "local-1")
    for name in ("local-0", "local-1"):
        assert "cluster: 1 Ray node(s), 2 unit(s) at a time" in log(work, name), log(work, name)
    assert report["local_recorded"] >= 3  # the GCS, the raylet and Ray's agents, at least
    assert report["local_left_after_restart"] == [], report["local_left_after_kill"]
    assert sorted(report["local_runs"].values()) == [report["lost_rounds"]] * 2
    assert report["local_stale_kept"]  # read by no one, written by no one
    assert report["local_temp_left"] == []  # both drivers' private temp directories removed
    assert not (work / "local" / ".cluster").exists()


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--ray-address", "127.0.0.1:99999"], {}, "--ray-address '127.0.0.1:99999': the port must be"),
    (["--ray-address", "head-node"], {}, "--ray-address 'head-node': expected HOST:PORT"),
    (["--cpus-per-run", "1e-9"], {}, "--cpus-per-run 1e-09: Ray counts resources in steps of 0.0001"),
    (["--gpus-per-run", "0.33333"], {}, "--gpus-per-run 0.33333: Ray counts resources in steps"),
    (["--cpus-per-run", "1e300"], {}, "--cpus-per-run 1e+300: expected a number of CPUs/GPUs"),
    ([], {"RAY_ADDRESS": "10.0.0.1:0"}, "RAY_ADDRESS '10.0.0.1:0': the port must be"),
])
def test_bad_addresses_and_shares_are_one_line_before_ray_is_touched(
        tmp_path, capsys, monkeypatch, argv, env, message):
    from fedhet.runs import cluster

    monkeypatch.setattr(cluster, "import_ray", lambda: pytest.fail("Ray must not be touched"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 2\nrounds = 1\n')
    line = one_error_line(capsys, ["compare", "--config", str(grid), "--out", str(tmp_path / "o"),
                                   "--cluster", "ray", *argv])
    assert message in line
    assert not list((tmp_path / "o").glob("runs/*/config.json"))


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


@needs_ray
@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_closed_port_is_one_line_naming_it_at_once(tmp_path, capsys, monkeypatch, via):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    address = f"127.0.0.1:{_closed_port()}"
    argv = ["--ray-address", address] if via == "flag" else []
    if via == "env":
        monkeypatch.setenv("RAY_ADDRESS", address)
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 2\nrounds = 1\n')
    t = time.monotonic()
    line = one_error_line(capsys, ["compare", "--config", str(grid), "--out", str(tmp_path / "o"),
                                   "--cluster", "ray", *argv])
    assert time.monotonic() - t < 60
    source = "--ray-address" if via == "flag" else "RAY_ADDRESS"
    assert line.startswith(f"error: no Ray cluster answers at {address} ({source}): ")
    assert "ray start --head" in line
    assert ("unset RAY_ADDRESS" in line) == (via == "env")


SILENT_HEAD = r"""
import json, os, signal, socket, subprocess, sys, threading, time
subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(16)
port = server.getsockname()[1]
accepted = []
def serve():  # accepts, never answers: a head that does not respond
    while True:
        conn, _ = server.accept()
        accepted.append(conn)
threading.Thread(target=serve, daemon=True).start()
driver = ("import sys; from fedhet.runs import raylink; raylink.JOIN_TIMEOUT_S = 5.0; "
          "from fedhet.cli import main; sys.exit(main(sys.argv[1:]))")
argv = [sys.executable, "-c", driver, "compare", "--config", sys.argv[1], "--out", sys.argv[2],
        "--cluster", "ray", "--ray-address", f"127.0.0.1:{port}"]
facts = {"port": port}
for case in ("timeout", "ctrl-c"):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    t = time.monotonic()
    try:
        if case == "ctrl-c":
            before = len(accepted)
            while len(accepted) < before + 2 and time.monotonic() - t < 120:
                time.sleep(0.05)  # the TCP probe, then ray.init: the driver is joining
            facts["joining"] = len(accepted) >= before + 2
            os.killpg(proc.pid, signal.SIGINT)
            t = time.monotonic()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    facts[case] = {"rc": proc.returncode, "s": time.monotonic() - t, "out": out}
print(json.dumps(facts))
"""


@needs_ray
def test_a_head_that_never_answers_is_one_line_in_bounded_time_and_ctrl_c_stops_at_once(tmp_path):
    """A port that accepts the connection but never answers (a hung head): the join gives up
    after its bound (5 s here) with one line naming the address; Ctrl-C while the driver waits
    on it ends the driver at once. Inside a private network namespace (a joining driver binds
    ports), Ray's files in a temp directory of the test."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30).returncode:
        pytest.skip("needs `unshare -n` (root) to keep Ray inside a private network namespace")
    grid = tmp_path / "g.toml"
    grid.write_text('[base]\ndataset = "digits"\nclients = 2\nrounds = 1\n')
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(["unshare", "-n", sys.executable, "-c", SILENT_HEAD, str(grid),
                           str(tmp_path / "o")], capture_output=True, text=True, env=env,
                          timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    address = f"127.0.0.1:{facts['port']}"
    timeout = facts["timeout"]
    errors = [x for x in timeout["out"].splitlines() if x.startswith("error: ")]
    assert timeout["rc"] == 2 and timeout["s"] < 60, timeout
    assert errors == [f"error: joining the Ray cluster at {address} (--ray-address): no answer "
                      "within 5 s; check that the cluster is healthy (`ray status` on its head) "
                      "and reachable from here"], timeout["out"]
    stopped = facts["ctrl-c"]
    assert facts["joining"] and stopped["rc"] == 130 and stopped["s"] < 10, stopped
    assert "1 queued run(s) cancelled; run `fedhet compare" in stopped["out"], stopped["out"]
    assert not list((tmp_path / "o").glob("runs/*/config.json"))


def test_reap_ends_what_a_dead_drivers_local_ray_left_and_nothing_else(tmp_path, monkeypatch):
    """Records of private local Rays (`fhray-*/fedhet-driver.json` under `$RAY_TMPDIR`): the
    processes of one whose driver is gone are ended and its directory removed; one whose driver
    runs, and one still being started (no record yet), are left alone."""
    from fedhet import procs
    from fedhet.runs import raylink

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))

    def start_of(pid: int) -> int:
        start = procs.start_time(pid)
        assert start is not None
        return start

    gone = subprocess.Popen(["true"])
    gone.wait()
    left = subprocess.Popen(["sleep", "60"])  # what the dead driver's Ray left running
    other = subprocess.Popen(["sleep", "60"])  # a running driver's Ray
    try:
        for name, driver, proc in (("fhray-dead", [gone.pid, 1], left),
                                   ("fhray-live", [os.getpid(), start_of(os.getpid())], other)):
            (tmp_path / name).mkdir()
            (tmp_path / name / raylink.RECORD).write_text(json.dumps(
                {"driver": driver, "processes": {str(proc.pid): start_of(proc.pid)}}))
        (tmp_path / "fhray-starting").mkdir()
        assert raylink.reap() == [left.pid]
        assert left.wait(10) == -signal.SIGTERM and other.poll() is None
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fhray-live", "fhray-starting"]
    finally:
        for proc in (left, other):
            proc.kill()
            proc.wait(10)


class _MemoryRay:
    """A Ray stand-in for the driver loop (`cluster._drive`): one node with room for three
    units; a task runs its jobs in this process, unless more than `slots` tasks were in flight
    when it started: then `get` raises `OutOfMemoryError`, as when Ray's memory monitor kills
    a worker (`slots=0`: every task is killed)."""

    class exceptions:  # noqa: N801  (shaped as `ray.exceptions`)
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

        class TaskCancelledError(RayError):
            pass

        class OutOfMemoryError(RayError):
            pass

    def __init__(self, slots: int) -> None:
        self.slots, self.live, self.started = slots, 0, []

    def nodes(self) -> list[dict]:
        return [{"NodeID": "n0" * 20, "Alive": True, "NodeManagerHostname": "vm",
                 "Resources": {"CPU": 3.0}}]

    def remote(self, fn):  # noqa: ANN001  (`ray.remote(run_task)`: the task is this object)
        return self

    def options(self, **_kw):  # noqa: ANN003
        return _Placed(self)

    def start(self, jobs):  # noqa: ANN001
        self.live += 1
        self.started.append(self.live)
        return _Ref(jobs, killed=self.live > self.slots)

    def wait(self, refs, num_returns, timeout):  # noqa: ANN001
        return list(refs), []

    def get(self, ref):  # noqa: ANN001
        from fedhet.runs import processes

        self.live -= 1
        if ref.killed:
            raise self.exceptions.OutOfMemoryError("Task was killed due to the node running low "
                                                   "on memory.")
        return [processes.run_job(job) for job in ref.jobs]

    def cancel(self, ref, force=False):  # noqa: ANN001
        pass


class _Ref:
    def __init__(self, jobs: list, killed: bool) -> None:
        self.jobs, self.killed = jobs, killed


class _Placed:
    def __init__(self, ray: _MemoryRay) -> None:
        self.ray = ray

    def remote(self, jobs, *_a):  # noqa: ANN001, ANN002
        return self.ray.start(jobs)


class _Members:
    labels: dict = {}  # noqa: RUF012

    def __init__(self, *_a) -> None:  # noqa: ANN002
        pass

    def look(self):
        return _MemoryRay(3).nodes()

    def nowhere(self) -> bool:
        return False

    def selector(self):
        return None


def _memory_grid(tmp_path: Path, monkeypatch, slots: int):  # noqa: ANN001
    """Three small runs through the driver loop on a `_MemoryRay` with `slots`."""
    import io
    import threading

    from fedhet.runs import cluster
    from fedhet.runs.cluster import ClusterOptions
    from fedhet.runs.grid_status import Outcomes, Progress
    from fedhet.runs.jobs import plan_jobs
    from fedhet.runs.presets import RunSpec

    ray = _MemoryRay(slots)
    monkeypatch.setattr(cluster, "check_nodes", lambda *a: "token")
    monkeypatch.setattr(cluster, "Members", _Members)
    specs = [RunSpec(f"s{seed}", "all", "fedavg", {"dataset": "digits", "clients": 3, "rounds": 1,
                                                    "seed": seed}) for seed in range(3)]
    runs = tmp_path / "g" / "runs"
    jobs, _ = plan_jobs(specs, runs, force=False)
    stream = io.StringIO()
    tally, progress = Outcomes(), Progress(3, 0, jobs, stream)
    cluster._drive(ray, [[j] for j in jobs], ClusterOptions(cpus_per_run=1.0), runs,
                   threading.Event(), [], tally, progress)
    return ray, tally, stream.getvalue()


def test_runs_killed_for_memory_run_fewer_at_once_and_finish(tmp_path, monkeypatch):
    """Ray's memory monitor kills tasks while three run at once: the driver says so in one line
    each time, runs fewer at once (3 → 2 → 1) and retries them, without counting those kills
    against the runs; every run finishes."""
    ray, tally, said = _memory_grid(tmp_path, monkeypatch, slots=1)
    assert tally.errors == {}, tally.errors
    assert all(json.loads((tmp_path / "g" / "runs" / f"s{i}" / "summary.json").read_text())["finished"]
               for i in range(3))
    notes = [ln for ln in said.splitlines() if "OutOfMemoryError" in ln]
    assert notes and all("at most" in ln and "at a time" in ln and "resubmitted" in ln
                         for ln in notes), said
    assert "at most 1 unit(s) at a time" in said, said
    assert ray.started[:3] == [1, 2, 3] and ray.started[3:] == [1, 1]  # then one at a time


def test_runs_killed_for_memory_even_one_at_a_time_give_up_in_one_line(tmp_path, monkeypatch):
    from fedhet.runs.cluster import MAX_ATTEMPTS

    ray, tally, _ = _memory_grid(tmp_path, monkeypatch, slots=0)
    assert sorted(tally.errors) == ["s0", "s1", "s2"]
    assert all("OutOfMemoryError" in e and f"lost {MAX_ATTEMPTS} times" in e
               for e in tally.errors.values()), tally.errors
