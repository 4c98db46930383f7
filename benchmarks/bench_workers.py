"""Where `--workers 2` starts to pay: one process vs two over a sweep of a round's work.

Each point is FedAvg with an MLP on random MNIST-shaped data (nothing is downloaded), IID,
`m` clients of `n` samples each, all sampled every round, E = 1, B = 32; its estimated work is
`Simulation.round_cost` (`m · τ(B·d + STEP_COST)` multiply-adds) and `rounds ×` that, the figures
`--workers auto` compares with `AUTO_MIN_WORK` and `AUTO_MIN_RUN_WORK`. Every point runs with 1
and with 2 workers, `--repeat` times in alternating order; the table gives the medians of

- s/round: the median training time of rounds 2.. (the pool is forked in round 1);
- run s: the whole `Simulation.run` (pool start and evaluation included), what a user waits for;

and the cores other processes kept busy meanwhile, on average (0 on an idle machine; anything
near a core skews the ratios).

    OMP_NUM_THREADS=1 python benchmarks/bench_workers.py [--rounds 5] [--repeat 3]
        [--points 4x32:200,20x150:200] [--workers 2] [--demo] [--out table.md]

`--demo` adds `make demo`'s training (FedAvg then FedNova on digits, 30 rounds each, the
settings of `fedhet.runs.demo`) as a last row, its runs in a scratch directory.

A point is `CLIENTSxSAMPLES:HIDDEN`. Run it with one thread per process (`OMP_NUM_THREADS=1`),
on a machine with at least `--workers` cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedhet.data.base import Dataset
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.workers import AUTO_MIN_RUN_WORK, AUTO_MIN_WORK, usable_cores
from fedhet.rundir.store import RunStore
from fedhet.runs.demo import DEMO_ALGORITHMS, DEMO_SETTINGS
from fedhet.runs.results import git_commit

POINTS = "4x32:200,10x150:200,20x150:200,100x60:200,20x300:200,20x600:16,40x300:200,20x600:200,"\
         "400x60:200,100x600:16,100x600:200"


def dataset(samples: int, seed: int = 0) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    return Dataset(
        name="random", x_train=torch.randn(samples, 1, 28, 28, generator=gen),
        y_train=torch.randint(0, 10, (samples,), generator=gen),
        x_test=torch.randn(200, 1, 28, 28, generator=gen),
        y_test=torch.randint(0, 10, (200,), generator=gen), num_classes=10,
    )


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process and its reaped
    children): their difference over a point is what others used (Linux; else zeros)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle, iowait
    own = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
              for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return busy, own


def one(clients: int, samples: int, hidden: int, workers: int, rounds: int) -> tuple[float, float, float]:
    """(s/round after the first, whole run s, estimated work) of one run."""
    cfg = config_of({
        "algorithm": "fedavg", "dataset": "digits", "model": "mlp", "model.hidden": hidden,
        "partition": "iid", "clients": clients, "batch_size": 32, "lr": 0.01, "rounds": rounds,
        "eval_every": rounds, "executor": "sequential", "workers": workers,
    })
    rows: list[dict] = []
    sim = assemble(cfg, data=dataset(clients * samples), log=lambda _: None, callbacks=[rows.append])
    t0 = time.perf_counter()
    sim.run()
    total = time.perf_counter() - t0
    times = [r["round_time_s"] for r in rows]
    return statistics.median(times[1:]), total, sim.side.round_cost


def demo(workers: int, rounds: int) -> tuple[float, float, float]:
    """(s/round, whole demo s, a round's estimated work) of the demo's runs with `workers`."""
    per, total = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in DEMO_ALGORITHMS:
            rows: list[dict] = []
            cfg = config_of({**DEMO_SETTINGS, "algorithm": name, "rounds": rounds, "workers": workers})
            sim = assemble(cfg, store=RunStore(Path(tmp) / name), log=lambda _: None, callbacks=[rows.append])
            t0 = time.perf_counter()
            sim.run()
            total += time.perf_counter() - t0
            per += [r["round_time_s"] for r in rows][1:]
    return statistics.median(per), total, sim.side.round_cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--points", default=POINTS, help="CLIENTSxSAMPLES:HIDDEN,...")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--demo", action="store_true", help="also time make demo's training")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    w = args.workers
    lines = [
        f"commit {git_commit()}; {usable_cores()} usable cores, 1 torch thread per process; "
        f"{args.rounds} rounds, medians of {args.repeat}; AUTO_MIN_WORK {AUTO_MIN_WORK:.0e}, "
        f"AUTO_MIN_RUN_WORK {AUTO_MIN_RUN_WORK:.0e}",
        "",
        f"| m×n, hidden | round work | run work | 1 worker s/round | {w} workers s/round | speed-up | "
        f"1 worker run s | {w} workers run s | speed-up | others' cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    points = [p for p in args.points.split(",") if p] + (["demo"] if args.demo else [])
    for point in points:
        shape, _, hidden = point.partition(":")
        clients, _, samples = shape.partition("x")
        busy0, own0, t0 = *busy_seconds(), time.perf_counter()
        res: dict[int, list[tuple[float, float, float]]] = {1: [], w: []}
        for r in range(args.repeat):
            for k in ((1, w) if r % 2 == 0 else (w, 1)):
                if point == "demo":
                    res[k].append(demo(k, 30))
                else:
                    res[k].append(one(int(clients), int(samples), int(hidden or 200), k, args.rounds))
        per = {k: statistics.median(x[0] for x in v) for k, v in res.items()}
        run = {k: statistics.median(x[1] for x in v) for k, v in res.items()}
        busy1, own1 = busy_seconds()
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (time.perf_counter() - t0)
        work = res[1][0][2]
        name = "demo (2 runs × 30 rounds)" if point == "demo" else \
            f"{clients}×{samples}, {hidden or 200}"
        rounds = 30 if point == "demo" else args.rounds
        line = (f"| {name} | {work:.1e} | {rounds * work:.1e} | {per[1]:.3f} | {per[w]:.3f} | "
                f"{per[1] / per[w]:.2f}x | {run[1]:.2f} | {run[w]:.2f} | {run[1] / run[w]:.2f}x | "
                f"{others:.2f} |")
        print(line, flush=True)
        lines.append(line)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
