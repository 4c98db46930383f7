"""Ray's overhead on one machine: a grid with `--jobs 2` against the same grid on Ray.

Run inside a private network namespace (Ray binds the machine's address otherwise):

    unshare -n sh -c 'ip link set lo up; OMP_NUM_THREADS=1 PYTHONPATH=src \\
        python benchmarks/bench_cluster.py --repeat 3'

Each repetition runs, in turn: `compare --jobs 2`; `compare --cluster ray` joining a one-node
Ray started once beforehand with 2 CPUs (`ray start --head --num-cpus 2`); and `compare
--cluster ray` with no address (the driver starts a local Ray for the grid and stops it after).
Each into a fresh directory; wall time of the whole command. Prints each time and the medians;
the overhead is `ray / jobs - 1`. The head is stopped by its process group at the end.
`--phases`: instead, one driver's steps against the running head, timed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = """\
title = "ray overhead: 8 digits runs"
[base]
dataset = "digits"
partition = "dirichlet"
clients = 10
rounds = {rounds}

[axes]
seed = [0, 1, 2, 3, 4, 5, 6, 7]
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - t


PHASES = """
import logging, os, sys, time
t = time.perf_counter()
def mark(what):
    print(f"{time.perf_counter() - t:6.2f} s  {what}", flush=True)
import torch; mark("import torch")
import fedhet.runs.runner; mark("import fedhet's runner")
import ray; mark("import ray")
ray.init(address="127.0.0.1:6379", logging_level=logging.ERROR, log_to_driver=False); mark("ray.init")
from pathlib import Path
from fedhet.runs import raynodes
nodes = raynodes.alive_nodes(ray)
control = Path(sys.argv[1]); (control / "where").mkdir(parents=True, exist_ok=True)
raynodes.check_nodes(ray, nodes, control, os.getcwd()); mark("the file probe")
def first():
    import fedhet.runs.runner
    return os.getpid()
task = ray.remote(first).options(num_cpus=1)
ray.get([task.remote(), task.remote()]); mark("two tasks importing torch and fedhet")
ray.get([task.remote(), task.remote()]); mark("two more tasks (warm workers)")
ray.shutdown(); mark("ray.shutdown")
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--phases", action="store_true",
                    help="instead: where one driver's time goes against the running head")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fb", dir="/tmp"))
    grid = work / "grid.toml"
    grid.write_text(GRID.format(rounds=args.rounds))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    ray = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen([ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
                             "6379", "--num-cpus", "2", "--include-dashboard=false",
                             "--disable-usage-stats", "--temp-dir", str(work / "ray"), "--block"],
                            stdout=(work / "head.log").open("w"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (work / "head.log").read_text():
            if time.monotonic() > deadline or head.poll() is not None:
                sys.exit(f"ray start failed: {(work / 'head.log').read_text()[-2000:]}")
            time.sleep(0.2)
        if args.phases:
            subprocess.run([sys.executable, "-c", PHASES, str(work / "control")], env=env,
                           cwd=ROOT, timeout=600, check=True)
            return
        times: dict[str, list[float]] = {"jobs 2": [], "ray (joined)": [], "ray (local start)": []}
        compare = [sys.executable, "-m", "fedhet", "compare", "--config", str(grid)]
        for i in range(args.repeat):
            for name, extra in (("jobs 2", ["--jobs", "2"]),
                                ("ray (joined)", ["--cluster", "ray", "--ray-address", "127.0.0.1:6379"]),
                                ("ray (local start)", ["--cluster", "ray"])):
                out = work / f"out-{i}-{len(times[name])}-{name.split()[0]}{len(extra)}"
                times[name].append(timed([*compare, "--out", str(out), *extra], env))
                shutil.rmtree(out, ignore_errors=True)
                print(f"{name}: {times[name][-1]:.1f} s", flush=True)
        base = statistics.median(times["jobs 2"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"median {name}: {med:.1f} s ({med / base - 1:+.1%} against jobs 2); "
                  f"all: {', '.join(f'{t:.1f}' for t in ts)}")
    finally:
        try:
            os.killpg(head.pid, signal.SIGTERM)
            head.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
