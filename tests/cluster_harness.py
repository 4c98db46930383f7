"""A real two-node Ray cluster on this machine, and fedhet grids driven against it.

Run as `unshare -n python tests/cluster_harness.py WORK` (`Background`, below, started by
tests/conftest.py as soon as the session's tests are collected, so the harness runs while
the other tests do; tests/test_cluster.py's `cluster` fixture waits for its report): everything
here (both nodes, every driver) lives in one private network namespace, where 127.0.0.1 is the
only address, so no traffic leaves loopback. Ray's files go to a private temp directory
(`--temp-dir`, and `RAY_TMPDIR` for every process), so an address file another Ray left in
/tmp/ray cannot reach a driver here; `HOME` is private too (Ray's token file). The cluster runs
with Ray's token authentication on (`RAY_AUTH_MODE=token`, a fresh `RAY_AUTH_TOKEN`).

Each `ray start --block` and each driver runs in a process group of its own; every process
Ray starts stays in that group, and the harness ends them by group (SIGTERM, then SIGKILL),
never by name: when it finishes, fails, or is stopped by a signal (SIGTERM, SIGINT, SIGHUP;
the test also asks the kernel to send SIGTERM when the test process dies, and ends whatever
is left in the namespace by PID). Every wait is bounded on its own, and the harness says on
stdout what it starts and waits for, so a harness that is stopped shows where it stood.

Scenarios (each writes its facts into WORK/report.json; the test asserts on them and on the
directories left in WORK):
- `same`: one grid with `--jobs 2` and with `--cluster ray`.
- `refused`: a grid asking for more CPUs than a node has; and a grid directory the worker node
  cannot see (it runs in a private mount namespace with an empty tmpfs over WORK/hidden).
- `sim`: `fedhet deploy local --simulation` on the cluster (tests/test_deploy_ray.py): Flower's
  simulation runtime with one ClientApp actor (one CPU) on each node, then which node holds each.
- `lost`: a grid on the cluster stopped with Ctrl-C, started again, its worker node's raylet
  SIGKILLed while one of its runs is part-way, its driver killed with -9 and started again.
- `local`: a grid with no address while Ray's address file names a dead cluster: the driver
  starts a private local Ray; killed with -9 part-way and started again, it ends what was left
  of the first driver's Ray and finishes the grid.
- `late` (after `lost`, with the head node alone): a grid in WORK/hidden, and two nodes joining
  while it runs: one that cannot see WORK/hidden and one that can.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
RAY = str(Path(PY).parent / "ray")
PORT = 6379

GRID = """\
[base]
dataset = "digits"
partition = "iid"
clients = {clients}
rounds = {rounds}
lr = 0.1

[axes]
seed = [0, 1, 2, 3]
"""

SIM_SETTINGS = {"algorithm": "fedavg", "dataset": "digits", "partition": "dirichlet", "clients": 3,
                "rounds": 3, "lr": 0.1, "seed": 3, "local_steps": 4}
"""The `sim` scenario's run (tests/test_deploy_ray.py runs the same in-process to compare)."""

SIM_PROBE = textwrap.dedent("""
    import json, sys, ray
    from ray._private import state
    ray.init(address=sys.argv[1], logging_level="ERROR")
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    actors = [a["Address"]["NodeID"] for a in state.actors().values()
              if a["ActorClassName"] == "ClientAppActor"]
    print(json.dumps({"nodes": nodes, "actors": actors}))
""")
"""The cluster's alive nodes and the node of every ClientApp actor Flower's simulation made."""

LOST_ROUNDS = 240
"""Rounds of each run of the lost-node grid: a digits round takes ~25 ms on an idle core, so a
run picked with at least 160 rounds to go (`< LOST_ROUNDS // 3`) is still running seconds after
its node is killed (at 40 rounds it could finish first, and no run was lost)."""

ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT / "src"),
    "OMP_NUM_THREADS": "1",
    # a lost node is noticed in seconds, not Ray's default half minute
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
ENV.pop("RAY_ADDRESS", None)
for _key in [k for k in ENV if k.startswith("RAY_AUTH")]:
    ENV.pop(_key)

T0 = time.monotonic()
STARTED: list = []
"""Everything started here that must be stopped: `Node`s and driver `Popen`s."""


def say(message: str) -> None:
    """One line of progress on stdout (the test keeps it and shows it when a test fails)."""
    print(f"[{time.monotonic() - T0:6.1f} s] {message}", flush=True)


def wait_for(what: str, condition, timeout: float, step: float = 0.2):
    say(f"waiting (at most {timeout:.0f} s) for {what}")
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def group_members(pgid: int, comm: str | None = None) -> list[int]:
    """Live PIDs (zombies left out) in process group `pgid` (with command name `comm`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid and (comm is None or name == comm):
            pids.append(int(entry.name))
    return pids


def stop_group(pgid: int, what: str) -> None:
    """SIGTERM, then SIGKILL, process group `pgid`, each bounded."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if not group_members(pgid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
    if group_members(pgid):
        say(f"{what}: processes {group_members(pgid)} outlived SIGKILL")


def stop_everything() -> None:
    """Stop every driver and node started here (newest first); safe to call twice."""
    while STARTED:
        item = STARTED.pop()
        if isinstance(item, subprocess.Popen):
            stop_group(item.pid, f"driver {item.pid}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                item.wait(5)
        else:
            item.stop()


def _on_signal(signum: int, _frame) -> None:
    say(f"harness: signal {signal.Signals(signum).name}; stopping what it started")
    raise SystemExit(128 + signum)  # unwinds through main's `finally` (and `atexit`)


class Node:
    """One `ray start --block` in a process group of its own."""

    def __init__(self, args: list[str], log: Path, prefix: list[str] | None = None) -> None:
        self.log = log
        say(f"starting a Ray node ({log.name})")
        self.proc = subprocess.Popen([*(prefix or []), RAY, "start", *args, "--block"],
                                     stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV,
                                     start_new_session=True)
        self.pgid = self.proc.pid
        STARTED.append(self)

    def started(self, timeout: float = 150.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start ended ({self.proc.returncode}): "
                                   f"{self.log.read_text()[-2000:]}")
            return "Ray runtime started" in self.log.read_text()
        wait_for(f"ray start ({self.log.name})", up, timeout)

    def members(self, comm: str | None = None) -> list[int]:
        """Live PIDs in this node's process group (with command name `comm`)."""
        return group_members(self.pgid, comm)

    def stop(self) -> None:
        say(f"stopping the Ray node of {self.log.name}")
        stop_group(self.pgid, self.log.name)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def worker_node(address: str, temp: Path, log: Path, hide: Path | None = None) -> Node:
    """A `--num-cpus 1` node joining the head at `address`; with `hide`, in a mount namespace
    of its own where `hide` is an empty tmpfs (a node that does not share that directory)."""
    prefix = (["unshare", "-m", "sh", "-c", f'mount -t tmpfs none {hide} && exec "$0" "$@"']
              if hide else None)
    return Node(["--address", address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                 "--disable-usage-stats", "--temp-dir", str(temp)], log, prefix=prefix)


def nodes(address: str, count: int) -> list[dict]:
    """The cluster's alive nodes once there are `count` of them: `{"id", "head"}` each."""
    code = f"""
import json, time, ray
ray.init(address={address!r}, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + 60
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= {count} or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps([{{"id": n["NodeID"], "head": "node:__internal_head__" in n["Resources"]}}
                  for n in alive]))
"""
    say(f"listing the cluster's nodes (expecting {count})")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=ENV, timeout=150)
    if out.returncode:
        raise RuntimeError(f"cannot list the nodes: {out.stderr[-2000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if len(found) < count:
        raise RuntimeError(f"{len(found)} node(s) alive, expected {count}")
    return found


def driver(work: Path, name: str, grid: Path, out: Path, *flags: str,
           env: dict | None = None) -> subprocess.Popen:
    """`fedhet compare` in its own process group; its output goes to WORK/<name>.log."""
    log = (work / f"{name}.log").open("w")
    say(f"driver {name}: fedhet compare {' '.join(flags)}")
    proc = subprocess.Popen([PY, "-m", "fedhet", "compare", "--config", str(grid), "--out",
                             str(out), *flags], stdout=log, stderr=subprocess.STDOUT,
                            env=env or ENV, cwd=ROOT, start_new_session=True)
    proc.name = name
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """The driver's exit status once it ends (at most `timeout` s: else it is stopped, and
    `TimeoutError` names it)."""
    name = getattr(proc, "name", proc.pid)
    say(f"waiting (at most {timeout:.0f} s) for driver {name} to end")
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc.pid, f"driver {name}")
        raise TimeoutError(f"driver {name} did not end within {timeout:.0f} s") from None
    say(f"driver {name} ended: {rc}")
    return rc


def rounds_done(run: Path) -> int:
    try:
        return int(json.loads((run / "summary.json").read_text())["rounds_done"])
    except (OSError, ValueError, KeyError):
        return 0


def scenario_same(work: Path, address: str, report: dict) -> None:
    grid = work / "same.toml"
    grid.write_text(GRID.format(clients=3, rounds=4))
    local = driver(work, "same-jobs", grid, work / "same-jobs", "--jobs", "2")
    report["same_jobs_rc"] = finish(local, 240)
    t0 = time.monotonic()
    ray = driver(work, "same-ray", grid, work / "same-ray", "--cluster", "ray",
                 "--ray-address", address)
    report["same_ray_rc"] = finish(ray, 240)
    report["same_ray_s"] = time.monotonic() - t0


def scenario_sim(work: Path, address: str, report: dict) -> None:
    """Flower's simulation runtime on the cluster: `fedhet deploy local --simulation
    --ray-address` with one CPU a ClientApp, so one actor on each node; its stdout and stderr in
    WORK/sim.out and WORK/sim.err, its run in WORK/sim, then where Ray placed the actors."""
    sets = [a for k, v in SIM_SETTINGS.items() if k not in ("algorithm", "dataset", "clients",
                                                             "rounds") for a in ("--set", f"{k}={v}")]
    s = SIM_SETTINGS
    say("driver sim: fedhet deploy local --simulation")
    with (work / "sim.out").open("w") as out, (work / "sim.err").open("w") as err:
        proc = subprocess.Popen(
            [PY, "-m", "fedhet", "deploy", "local", "--simulation", "--ray-address", address,
             "--client-cpus", "1", "-a", s["algorithm"], "-d", s["dataset"], "-n", str(s["clients"]),
             "-r", str(s["rounds"]), *sets, "--out", str(work / "sim")],
            stdout=out, stderr=err, env={**ENV, "FLWR_TELEMETRY_ENABLED": "0"}, cwd=ROOT,
            start_new_session=True)
    proc.name = "sim"
    STARTED.append(proc)
    report["sim_rc"] = finish(proc, 300)
    say("listing the ClientApp actors' nodes")
    probe = subprocess.run([PY, "-c", SIM_PROBE, address], capture_output=True, text=True,
                           env=ENV, timeout=150)
    if probe.returncode:
        raise RuntimeError(f"the actor probe failed: {probe.stderr[-2000:]}")
    report["sim_placed"] = json.loads(probe.stdout.strip().splitlines()[-1])


def scenario_lost(work: Path, worker: Node, worker_id: str, report: dict) -> None:
    """One grid through three faults, each followed by the same command again: Ctrl-C (SIGINT to
    the driver's process group, as a terminal sends it) while two runs are part-way and two are
    queued; the worker node's raylet SIGKILLed while one of its runs is part-way; the driver
    killed with -9. Then the same grid with `--jobs 2`, undisturbed, as the reference."""
    grid = work / "lost.toml"
    grid.write_text(GRID.format(clients=6, rounds=LOST_ROUNDS))
    report["lost_rounds"] = LOST_ROUNDS
    out = work / "lost"
    runs = out / "runs"

    def compare(log: str) -> subprocess.Popen:  # the cluster's address from $RAY_ADDRESS
        return driver(work, log, grid, out, "--cluster", "ray",
                      env={**ENV, "RAY_ADDRESS": report["address"]})

    def alive(proc: subprocess.Popen, log: str) -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"the driver ended early: {(work / f'{log}.log').read_text()}")

    def done() -> dict[str, int]:
        return {r.name: rounds_done(r) for r in runs.iterdir()} if runs.is_dir() else {}

    # 1. Ctrl-C with two runs part-way
    proc = compare("lost-0")

    def both_running() -> bool:
        alive(proc, "lost-0")
        return sum(3 <= k < LOST_ROUNDS * 3 // 4 for k in done().values()) >= 2

    wait_for("two runs part-way", both_running, 240, 0.05)
    t = time.monotonic()
    say("Ctrl-C (SIGINT to the driver's process group)")
    os.killpg(proc.pid, signal.SIGINT)
    report["stop_rc"] = finish(proc, 90)
    report["stop_exit_s"] = time.monotonic() - t
    report["stopped_at"] = done()

    # 2. the worker node lost while one of its runs is part-way (and has gone on since the restart)
    proc = compare("lost-1")
    restart = done()

    def victim() -> str | None:
        alive(proc, "lost-1")
        where = out / ".cluster" / "where"
        for entry in where.iterdir() if where.is_dir() else []:
            try:
                on_worker = entry.read_text().strip() == worker_id
            except OSError:
                continue
            k = rounds_done(runs / entry.name)
            if on_worker and max(3, restart.get(entry.name, 0) + 2) <= k < LOST_ROUNDS // 3:
                return entry.name
        return None

    name = wait_for("a run part-way on the worker node", victim, 240, 0.05)
    report["lost_victim"] = name
    report["lost_victim_round"] = rounds_done(runs / name)
    say(f"killing the worker node's raylet with -9 ({name} at round {report['lost_victim_round']})")
    os.kill(worker.members("raylet")[0], signal.SIGKILL)

    def resubmitted() -> bool:
        alive(proc, "lost-1")
        return "resubmitted" in (work / "lost-1.log").read_text()

    wait_for("the lost run to be resubmitted", resubmitted, 180)

    # 3. the driver killed with -9 once the grid has gone on a little
    before = sum(done().values())
    wait_for("the grid to go on", lambda: sum(done().values()) >= before + 5, 180, 0.05)
    say("killing driver lost-1 with -9")
    proc.kill()
    proc.wait(10)
    report["killed_at"] = done()
    report["lost_rc"] = finish(compare("lost-2"), 300)
    reference = driver(work, "lost-jobs", grid, work / "lost-jobs", "--jobs", "2")
    report["lost_jobs_rc"] = finish(reference, 300)


def scenario_late(work: Path, address: str, temp: Path, report: dict) -> None:
    """Nodes that join a running grid: the driver probes each; one that cannot see the grid
    directory gets no run, one that can takes runs. The grid starts on the head node alone."""
    grid = work / "late.toml"
    rounds = report["late_rounds"] = 2 * LOST_ROUNDS  # ~12 s a run on an idle core: the head
    # alone is on its second run at most when the two nodes have joined (~5 s each here, one
    # after the other), and two runs at least are left for them
    report["late_seeds"] = 4
    grid.write_text(GRID.format(clients=6, rounds=rounds))
    out = work / "hidden" / "late"
    report["late_alive_before"] = len(nodes(address, 1))
    proc = driver(work, "late", grid, out, "--cluster", "ray", "--ray-address", address)

    def started_runs() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the driver ended early: {(work / 'late.log').read_text()}")
        return any(rounds_done(r) >= 3 for r in (out / "runs").iterdir()) \
            if (out / "runs").is_dir() else False

    wait_for("a run part-way on the head node", started_runs, 240, 0.05)
    blind = worker_node(address, temp, work / "node-blind.log", hide=work / "hidden")
    blind.started()  # one at a time: two raylets registering at once on one address time out
    seeing = worker_node(address, temp, work / "node-seeing.log")
    seeing.started()
    report["late_joined_at"] = {r.name: rounds_done(r) for r in (out / "runs").iterdir()}
    report["late_rc"] = finish(proc, 400)
    report["late_runs"] = {r.name: rounds_done(r) for r in (out / "runs").iterdir()}


def scenario_refused(work: Path, address: str, report: dict) -> None:
    grid = work / "same.toml"
    big = driver(work, "refused-cpus", grid, work / "refused-cpus", "--cluster", "ray",
                 "--ray-address", address, "--cpus-per-run", "2")
    report["refused_cpus_rc"] = finish(big, 180)
    # the worker node sees an empty directory over WORK/hidden (`main`)
    proc = driver(work, "refused-fs", grid, work / "hidden" / "grid", "--cluster", "ray",
                  "--ray-address", address)
    report["refused_fs_rc"] = finish(proc, 240)


def scenario_local(work: Path, temp: Path, report: dict) -> None:
    """No address, while Ray's address file (`$RAY_TMPDIR/ray/ray_current_cluster`) names a dead
    cluster: the driver starts a private local Ray. It is killed with -9 part-way; the same
    command again ends what is left of the first driver's Ray (its record in the grid's control
    directory) and finishes the grid."""
    stale = temp / "ray" / "ray_current_cluster"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("127.0.0.1:1")
    grid = work / "local.toml"
    grid.write_text(GRID.format(clients=6, rounds=LOST_ROUNDS).replace(
        "seed = [0, 1, 2, 3]", "seed = [0, 1]"))
    out = work / "local"
    first = driver(work, "local-0", grid, out, "--cluster", "ray")

    def part_way() -> bool:
        if first.poll() is not None:
            raise RuntimeError(f"the driver ended early: {(work / 'local-0.log').read_text()}")
        runs = out / "runs"
        return runs.is_dir() and any(rounds_done(r) >= 3 for r in runs.iterdir())

    wait_for("a run part-way on the driver's local Ray", part_way, 240, 0.05)
    record = next(temp.glob("fhray-*/fedhet-driver.json"))  # the driver's private Ray's record
    procs = {int(p): s for p, s in json.loads(record.read_text())["processes"].items()}
    report["local_recorded"] = len(procs)
    report["local_temp_dir"] = str(record.parent)
    say("killing driver local-0 with -9")
    first.kill()
    first.wait(10)
    time.sleep(1)
    report["local_left_after_kill"] = [p for p, s in procs.items() if _same(p, s)]
    report["local_rc"] = finish(driver(work, "local-1", grid, out, "--cluster", "ray"), 400)
    report["local_left_after_restart"] = [p for p, s in procs.items() if _same(p, s)]
    report["local_runs"] = {r.name: rounds_done(r) for r in (out / "runs").iterdir()}
    report["local_stale_kept"] = stale.read_text() == "127.0.0.1:1"
    report["local_temp_left"] = sorted(p.name for p in temp.glob("fhray-*"))


def _same(pid: int, start: int) -> bool:
    """Is process `pid` alive (not a zombie) and the one that started at `start`?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0] != "Z" and int(fields[19]) == start


def main(work: Path) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    atexit.register(stop_everything)
    say(f"harness: Ray in a private network namespace, work directory {work}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    report: dict = {}
    temp = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))  # short: Ray's socket paths
    home = work / "home"
    home.mkdir()
    # Ray's files, its address file and its token file in places of the harness's own; token
    # authentication on for every node and driver
    ENV.update({"RAY_TMPDIR": str(temp), "HOME": str(home), "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": uuid.uuid4().hex})
    report["temp_dir"] = str(temp)
    address = report["address"] = f"127.0.0.1:{PORT}"
    try:
        head = Node(["--head", "--node-ip-address", "127.0.0.1", "--port", str(PORT),
                     "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
                     "--temp-dir", str(temp)], work / "node-head.log")
        head.started()
        # the worker node lives in a mount namespace of its own where WORK/hidden is an empty
        # tmpfs: a node that does not share that part of the filesystem (`scenario_refused`)
        hidden = work / "hidden"
        hidden.mkdir()
        worker = worker_node(address, temp, work / "node-worker.log", hide=hidden)
        worker.started()
        found = nodes(address, 2)
        worker_id = next(n["id"] for n in found if not n["head"])
        report["cluster_start_s"] = time.monotonic() - T0
        report["pids"] = {"head": head.members(), "worker": worker.members()}
        for step, run in (
            ("same", lambda: scenario_same(work, address, report)),
            ("refused", lambda: scenario_refused(work, address, report)),
            ("sim", lambda: scenario_sim(work, address, report)),
            ("lost", lambda: scenario_lost(work, worker, worker_id, report)),
            ("local", lambda: scenario_local(work, temp, report)),
            ("late", lambda: scenario_late(work, address, temp, report)),
        ):
            say(f"scenario {step}")
            t = time.monotonic()
            try:
                run()
            except Exception as e:  # noqa: BLE001  (reported; the test fails on it)
                report[f"{step}_failed"] = f"{type(e).__name__}: {e}"
                say(f"scenario {step} failed: {report[f'{step}_failed']}")
            report[f"{step}_s"] = time.monotonic() - t
            say(f"scenario {step} done in {report[f'{step}_s']:.1f} s")
    finally:
        nodes_started = [n for n in STARTED if isinstance(n, Node)]
        groups = [n.pgid for n in nodes_started] + [d.pid for d in STARTED
                                                     if isinstance(d, subprocess.Popen)]
        stop_everything()
        report["left_running"] = [p for g in groups for p in group_members(g)]
        shutil.rmtree(temp, ignore_errors=True)
        report["total_s"] = time.monotonic() - T0
        (work / "report.json").write_text(json.dumps(report, indent=1))
        say("harness: done " + json.dumps({k: v for k, v in report.items() if k != "pids"}))


# -- the test process's side: start the harness, watch it, stop it ----------------------------
STALL_S = 480.0
"""The harness is stopped when it has printed nothing for this long: each of its waits is
bounded on its own (the longest, a driver finishing a grid, at 400 s) and it says what it waits
for, so silence this long means it hangs where its last line says."""


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM when the test process dies
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _in_namespace(ns: str) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and _netns(int(p.name)) == ns and _alive(int(p.name))]


def _end_namespace(ns: str) -> list[int]:
    """SIGKILL by PID whatever still runs in the harness's network namespace (only what the
    harness started lives there); returns what was found."""
    left = _in_namespace(ns)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _in_namespace(ns) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def harness_output(work: Path, lines: int = 60) -> str:
    """The harness's last `lines` lines of progress, for a failing test's message."""
    try:
        text = (work / "harness.log").read_text()
    except OSError:
        return "(no harness output)"
    return "harness output (last lines):\n" + "\n".join(text.splitlines()[-lines:])


class Background:
    """The harness in its own network namespace, started from the test process (in the thread
    that lives as long as that process: the harness gets SIGTERM when the process dies) and
    watched by a thread of its own: it streams its progress to WORK/harness.log and is stopped
    (SIGTERM, then what is left in its namespace SIGKILLed by PID) when it stalls for
    `STALL_S` or when `stop` is called (the session ends before a test asked for its report)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.own = _netns(os.getpid())
        self.ns: str | None = None
        self.stalled = False
        self.leftovers: list[int] = []
        self.stopping = threading.Event()
        with (work / "harness.log").open("w") as out:
            self.proc = subprocess.Popen(["unshare", "-n", PY, str(Path(__file__).resolve()),
                                          str(work)], stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        self.thread = threading.Thread(target=self._watch, name="cluster-harness", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        log = self.work / "harness.log"
        try:
            size, quiet_since = -1, time.monotonic()
            while self.proc.poll() is None and not self.stopping.is_set():
                if self.ns in (None, self.own):
                    self.ns = _netns(self.proc.pid)
                now = log.stat().st_size
                if now != size:
                    size, quiet_since = now, time.monotonic()
                elif time.monotonic() - quiet_since > STALL_S:
                    self.stalled = True
                    break
                self.stopping.wait(0.5)
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()  # the harness stops what it started
                try:
                    self.proc.wait(90)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            self.leftovers = _end_namespace(self.ns) if self.ns not in (None, self.own) else []
            # the verdict, for pytest-xdist's workers (`wait_result`): written last, at once
            done = {"stalled": self.stalled, "stopped": self.stopping.is_set(),
                    "returncode": self.proc.returncode, "leftovers": self.leftovers}
            tmp = self.work / f"{DONE}.tmp"
            tmp.write_text(json.dumps(done))
            tmp.replace(self.work / DONE)

    def stop(self) -> None:
        """Stop the harness now if it still runs (bounded: SIGTERM, 90 s, then SIGKILL)."""
        self.stopping.set()
        self.thread.join(120)

    def result(self) -> tuple[Path, dict]:
        """Once the harness has ended: its work directory and report (`AssertionError` if it
        stalled, reported nothing or left processes running)."""
        self.thread.join()
        return verdict(self.work, {"stalled": self.stalled, "stopped": self.stopping.is_set(),
                                   "returncode": self.proc.returncode,
                                   "leftovers": self.leftovers})


DONE = "harness-done.json"
"""Written into the work directory by `Background` once the harness has ended and what it left
in its namespace is gone: `{"stalled", "stopped", "returncode", "leftovers"}`."""

WAIT_S = 3600.0
"""How long a pytest-xdist worker waits for `DONE` (`wait_result`): the harness runs minutes,
each of its waits bounded, and the process watching it stops it after `STALL_S` of silence."""


def verdict(work: Path, done: dict) -> tuple[Path, dict]:
    """The harness's work directory and report, given how it ended (`AssertionError` if it
    stalled, was stopped first, reported nothing or left processes running)."""
    assert not done["stalled"], (f"the harness printed nothing for {STALL_S:.0f} s\n"
                                 f"{harness_output(work)}")
    assert not done["stopped"], "the harness was stopped before it finished"
    report_path = work / "report.json"
    assert report_path.exists(), (f"the harness reported nothing ({done['returncode']})\n"
                                  f"{harness_output(work)}")
    report = json.loads(report_path.read_text())
    assert report["left_running"] == [] and done["leftovers"] == [], (
        f"the harness left processes running: {report['left_running']}, {done['leftovers']}\n"
        f"{harness_output(work)}")
    return work, report


def wait_result(work: Path, timeout: float = WAIT_S) -> tuple[Path, dict]:
    """`Background.result` from another process (a pytest-xdist worker; the controller runs the
    harness in `work`): polls for `DONE`, at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (work / DONE).exists():
        assert time.monotonic() < deadline, (f"the harness was not done after {timeout:.0f} s\n"
                                             f"{harness_output(work)}")
        time.sleep(0.5)
    return verdict(work, json.loads((work / DONE).read_text()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
