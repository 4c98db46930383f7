"""Rounds of ring and edge topologies walked as chains against the same rounds in lockstep.

    python benchmarks/bench_rings.py --rounds 1 --repeats 3                  # CPU, MNIST
    python benchmarks/bench_rings.py --device cuda --runs 8 ...               # one GPU

FedSR's MNIST settings (Table II: 20 devices, the MLP, batch 32, momentum 0.5; FedSR: one local
epoch a hop, 5 edges of 4 devices, R = 5 passes; ring-optimization: one ring of the 20
devices, 5 local epochs a hop; HierFAVG: 5 edges, κ2 = 5 edge averages of one local epoch),
the paper's partition (`shards`, ξ = 2). For each algorithm it times `--rounds` rounds of
`--runs` seeds (one stack of runs when > 1), in this process's CPU time on a CPU and in wall
time on a GPU, with (a) `sequential`: the sequential executor,
(b) `lockstep`: the stacked executor with one executor call per ring hop or edge iteration
(`client_chains` switched off), (c) `chains`: the stacked executor with each ring's walk and
each edge as one chain, a round in one stacked call (on CUDA its steps replayed from a
captured graph), (d) `chains-eager`: (c) with the graphs off (`FEDHET_CUDA_GRAPHS=0`; the same
as (c) on a CPU); `--repeats` times each, and prints the median seconds per round, the ratios,
and the relative differences of the final weights. MNIST must be in `--data-dir` (DATA.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.engine.stacked_runs import run_together

ALGORITHMS = {
    "fedsr": {"algorithm": "fedsr", "algorithm.clusters": 5, "algorithm.ring_passes": 5,
              "local_epochs": 1},
    "ring": {"algorithm": "ring", "local_epochs": 5},
    "hierfavg": {"algorithm": "hierfavg", "algorithm.clusters": 5, "algorithm.kappa2": 5,
                 "local_epochs": 1},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithms", default="fedsr,ring,hierfavg")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--modes", default="sequential,lockstep,chains")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = {"dataset": args.dataset, "data_dir": args.data_dir, "model": "mlp", "clients": 20,
            "batch_size": 32, "lr": 0.01, "momentum": 0.5, "partition": "shards",
            "partition.xi": 2, "rounds": args.rounds, "device": args.device,
            "eval_every": 10**6, "workers": 1}

    def clock() -> float:
        """Wall time on a GPU (synchronised); on a CPU this process's CPU time, all its
        threads (what other processes on a shared machine take is not counted)."""
        if args.device == "cuda":
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.process_time()

    for name in args.algorithms.split(","):
        settings = {**base, **ALGORITHMS[name]}
        times: dict[str, list[float]] = {}
        finals: dict[str, torch.Tensor] = {}
        for _ in range(args.repeats):
            for mode in args.modes.split(","):
                executor = "sequential" if mode == "sequential" else "stacked"
                os.environ["FEDHET_CUDA_GRAPHS"] = "0" if mode == "chains-eager" else "1"
                sims = [assemble(config_of({**settings, "executor": executor, "seed": s}),
                                 store=None, log=print) for s in range(args.runs)]
                if mode == "lockstep":
                    for sim in sims:
                        sim.side.executor.chains = None  # rings hop by hop
                t0 = clock()
                _run(sims)
                times.setdefault(mode, []).append((clock() - t0) / args.rounds)
                finals[mode] = sims[0].final_state.w.detach().cpu()
        med = {m: statistics.median(v) for m, v in times.items()}
        line = ", ".join(f"{m} {s:.2f} s" for m, s in med.items())
        print(f"{name} ({args.runs} run(s), {args.device}): seconds a round: {line}")
        if "chains" in med:
            for m in med:
                if m != "chains":
                    print(f"  chains / {m}: {med['chains'] / med[m]:.2f}")
        for mode in finals:
            if mode != "sequential" and "sequential" in finals:
                a, b = finals["sequential"], finals[mode]
                print(f"  {mode} vs sequential weights: relative difference "
                      f"{float((b - a).norm() / a.norm()):.1e}")
        if "lockstep" in finals and "chains" in finals:
            a, b = finals["lockstep"], finals["chains"]
            print(f"  chains vs lockstep weights: relative difference {float((b - a).norm() / a.norm()):.1e}")


def _run(sims: list[Simulation]) -> None:
    if len(sims) == 1:
        sims[0].run()
        return
    for outcome in run_together(sims):
        if isinstance(outcome, BaseException):
            raise outcome


if __name__ == "__main__":
    main()
