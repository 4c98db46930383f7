"""A real two-node Ray cluster on this machine, and fedhet grids driven against it.

Run by tests/test_cluster.py as `unshare -n python tests/cluster_harness.py WORK`: everything
here (both nodes, every driver) lives in one private network namespace, where 127.0.0.1 is the
only address, so no traffic leaves loopback. Each `ray start --block` runs in a process group of
its own; every process Ray starts stays in that group, and the harness ends them by group
(SIGTERM, then SIGKILL), never by name. Every wait is bounded.

Scenarios (each writes its facts into WORK/report.json; the test asserts on them and on the
directories left in WORK):
- `same`: one grid with `--jobs 2` and with `--cluster ray`.
- `lost`: a grid on the cluster stopped with Ctrl-C, started again, its worker node's raylet
  SIGKILLed while one of its runs is part-way, its driver killed with -9 and started again.
- `refused`: a grid asking for more CPUs than a node has; and a grid directory the worker node
  cannot see (it runs in a private mount namespace with an empty tmpfs over WORK/hidden).
- `late` (after `lost`, with the head node alone): a grid in WORK/hidden, and two nodes joining
  while it runs: one that cannot see WORK/hidden and one that can.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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


def wait_for(what: str, condition, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


class Node:
    """One `ray start --block` in a process group of its own."""

    def __init__(self, args: list[str], log: Path, prefix: list[str] | None = None) -> None:
        self.log = log
        self.proc = subprocess.Popen([*(prefix or []), RAY, "start", *args, "--block"],
                                     stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV,
                                     start_new_session=True)
        self.pgid = self.proc.pid

    def started(self, timeout: float = 90.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start ended ({self.proc.returncode}): "
                                   f"{self.log.read_text()[-2000:]}")
            return "Ray runtime started" in self.log.read_text()
        wait_for(f"ray start ({self.log.name})", up, timeout)

    def members(self, comm: str | None = None) -> list[int]:
        """PIDs in this node's process group (with command name `comm`)."""
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
            if int(fields[2]) == self.pgid and (comm is None or name == comm):
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                return
            try:
                wait_for("the node's processes to end", lambda: not self.members(), grace)
                break
            except TimeoutError:
                continue
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
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    if out.returncode:
        raise RuntimeError(f"cannot list the nodes: {out.stderr[-2000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    if len(found) < count:
        raise RuntimeError(f"{len(found)} node(s) alive, expected {count}")
    return found


def driver(work: Path, name: str, grid: Path, out: Path, *flags: str) -> subprocess.Popen:
    """`fedhet compare` in its own process group; its output goes to WORK/<name>.log."""
    log = (work / f"{name}.log").open("w")
    return subprocess.Popen([PY, "-m", "fedhet", "compare", "--config", str(grid), "--out",
                             str(out), *flags], stdout=log, stderr=subprocess.STDOUT,
                            env=ENV, cwd=ROOT, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise


def rounds_done(run: Path) -> int:
    try:
        return int(json.loads((run / "summary.json").read_text())["rounds_done"])
    except (OSError, ValueError, KeyError):
        return 0


def scenario_same(work: Path, address: str, report: dict) -> None:
    grid = work / "same.toml"
    grid.write_text(GRID.format(clients=3, rounds=4))
    local = driver(work, "same-jobs", grid, work / "same-jobs", "--jobs", "2")
    report["same_jobs_rc"] = finish(local, 180)
    t0 = time.monotonic()
    ray = driver(work, "same-ray", grid, work / "same-ray", "--cluster", "ray",
                 "--ray-address", address)
    report["same_ray_rc"] = finish(ray, 180)
    report["same_ray_s"] = time.monotonic() - t0


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
        return subprocess.Popen(
            [PY, "-m", "fedhet", "compare", "--config", str(grid), "--out", str(out), "--cluster",
             "ray"], stdout=(work / f"{log}.log").open("w"), stderr=subprocess.STDOUT,
            env={**ENV, "RAY_ADDRESS": report["address"]}, cwd=ROOT, start_new_session=True)

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

    wait_for("two runs part-way", both_running, 150, 0.05)
    t = time.monotonic()
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

    name = wait_for("a run part-way on the worker node", victim, 150, 0.05)
    report["lost_victim"] = name
    report["lost_victim_round"] = rounds_done(runs / name)
    os.kill(worker.members("raylet")[0], signal.SIGKILL)

    def resubmitted() -> bool:
        alive(proc, "lost-1")
        return "resubmitted" in (work / "lost-1.log").read_text()

    wait_for("the lost run to be resubmitted", resubmitted, 120)

    # 3. the driver killed with -9 once the grid has gone on a little
    before = sum(done().values())
    wait_for("the grid to go on", lambda: sum(done().values()) >= before + 5, 120, 0.05)
    proc.kill()
    proc.wait(10)
    report["killed_at"] = done()
    report["lost_rc"] = finish(compare("lost-2"), 240)
    reference = driver(work, "lost-jobs", grid, work / "lost-jobs", "--jobs", "2")
    report["lost_jobs_rc"] = finish(reference, 240)


def scenario_late(work: Path, address: str, temp: Path, started: list[Node], report: dict) -> None:
    """Nodes that join a running grid: the driver probes each; one that cannot see the grid
    directory gets no run, one that can takes runs. The grid starts on the head node alone."""
    grid = work / "late.toml"
    rounds = report["late_rounds"] = 2 * LOST_ROUNDS  # ~12 s a run: runs are left when the
    # two nodes have joined (~5 s each here, one after the other)
    grid.write_text(GRID.format(clients=6, rounds=rounds).replace(
        "seed = [0, 1, 2, 3]", "seed = [0, 1, 2, 3, 4, 5]"))
    out = work / "hidden" / "late"
    report["late_alive_before"] = len(nodes(address, 1))
    proc = driver(work, "late", grid, out, "--cluster", "ray", "--ray-address", address)

    def started_runs() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the driver ended early: {(work / 'late.log').read_text()}")
        return any(rounds_done(r) >= 3 for r in (out / "runs").iterdir()) \
            if (out / "runs").is_dir() else False

    wait_for("a run part-way on the head node", started_runs, 150, 0.05)
    blind = worker_node(address, temp, work / "node-blind.log", hide=work / "hidden")
    started.append(blind)
    blind.started()  # one at a time: two raylets registering at once on one address time out
    seeing = worker_node(address, temp, work / "node-seeing.log")
    started.append(seeing)
    seeing.started()
    report["late_joined_at"] = {r.name: rounds_done(r) for r in (out / "runs").iterdir()}
    report["late_rc"] = finish(proc, 300)
    report["late_runs"] = {r.name: rounds_done(r) for r in (out / "runs").iterdir()}


def scenario_refused(work: Path, address: str, report: dict) -> None:
    grid = work / "same.toml"
    big = driver(work, "refused-cpus", grid, work / "refused-cpus", "--cluster", "ray",
                 "--ray-address", address, "--cpus-per-run", "2")
    report["refused_cpus_rc"] = finish(big, 120)
    # the worker node sees an empty directory over WORK/hidden (`main`)
    proc = driver(work, "refused-fs", grid, work / "hidden" / "grid", "--cluster", "ray",
                  "--ray-address", address)
    report["refused_fs_rc"] = finish(proc, 180)


def main(work: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    report: dict = {}
    temp = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))  # short: Ray's socket paths
    report["temp_dir"] = str(temp)
    address = report["address"] = f"127.0.0.1:{PORT}"
    started: list[Node] = []
    t0 = time.monotonic()
    try:
        head = Node(["--head", "--node-ip-address", "127.0.0.1", "--port", str(PORT),
                     "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
                     "--temp-dir", str(temp)], work / "node-head.log")
        started.append(head)
        head.started()
        # the worker node lives in a mount namespace of its own where WORK/hidden is an empty
        # tmpfs: a node that does not share that part of the filesystem (`scenario_refused`)
        hidden = work / "hidden"
        hidden.mkdir()
        worker = worker_node(address, temp, work / "node-worker.log", hide=hidden)
        started.append(worker)
        worker.started()
        found = nodes(address, 2)
        worker_id = next(n["id"] for n in found if not n["head"])
        report["cluster_start_s"] = time.monotonic() - t0
        report["pids"] = {"head": head.members(), "worker": worker.members()}
        for step, run in (
            ("same", lambda: scenario_same(work, address, report)),
            ("refused", lambda: scenario_refused(work, address, report)),
            ("lost", lambda: scenario_lost(work, worker, worker_id, report)),
            ("late", lambda: scenario_late(work, address, temp, started, report)),
        ):
            t = time.monotonic()
            try:
                run()
            except Exception as e:  # noqa: BLE001  (reported; the test fails on it)
                report[f"{step}_failed"] = f"{type(e).__name__}: {e}"
            report[f"{step}_s"] = time.monotonic() - t
    finally:
        for node in reversed(started):
            node.stop()
        report["left_running"] = [p for node in started for p in node.members()]
        shutil.rmtree(temp, ignore_errors=True)
        report["total_s"] = time.monotonic() - t0
        (work / "report.json").write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in report.items() if k != "pids"}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
