"""Stacked runs against the same runs one by one (`fedhet.engine.stacked_runs.run_together`).

    python benchmarks/bench_stacked_runs.py --runs 3 --rounds 5 --repeats 3            # CPU
    python benchmarks/bench_stacked_runs.py --runs 8 --device cuda --clients 100 ...   # one GPU

Builds `--runs` simulations that differ only in seed (stacked executor), runs them one after
another and then as one stack, `--repeats` times each, and prints the median seconds per run of
each and their ratio. The first repeat also prints the largest relative difference between a
run's final test loss alone and in the stack (float32 rounding: a stacked matrix product may
round differently with another number of matrices in the stack). Data: `--dataset` (default
`mnist-even-odd` with the SVM: MNIST must be in `data/`, see DATA.md; `digits` works offline
with `--model mlp`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import Simulation
from fedhet.engine.stacked_runs import run_together


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--dataset", default="mnist-even-odd")
    ap.add_argument("--model", default="svm")
    ap.add_argument("--algorithm", default="fedavg")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = {"dataset": args.dataset, "model": args.model, "algorithm": args.algorithm,
            "partition": "half-iid" if args.dataset == "mnist-even-odd" else "dirichlet",
            "clients": args.clients, "rounds": args.rounds, "lr": 0.01, "batch_size": 50,
            "local_epochs": 1, "executor": "stacked", "device": args.device, "eval_every": args.rounds}

    def sims() -> list[Simulation]:
        return [assemble(config_of({**base, "seed": s}), store=None, log=lambda _: None)
                for s in range(args.runs)]

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    alone_t, together_t = [], []
    for r in range(args.repeats):
        group = sims()
        sync()
        t0 = time.perf_counter()
        alone = [s.run() for s in group]
        sync()
        alone_t.append((time.perf_counter() - t0) / args.runs)
        group = sims()
        sync()
        t0 = time.perf_counter()
        together = run_together(group)
        sync()
        together_t.append((time.perf_counter() - t0) / args.runs)
        if r == 0:
            diff = max(abs(a["final_loss"] - b["final_loss"]) / abs(a["final_loss"])
                       for a, b in zip(alone, together, strict=True))
            print(f"largest relative difference of a final loss, alone vs in the stack: {diff:.1e}")
    a, b = statistics.median(alone_t), statistics.median(together_t)
    print(f"{args.runs} runs of {args.algorithm}/{args.model} on {args.dataset}, {args.clients} "
          f"clients, {args.rounds} rounds, device {args.device}: median {a:.3f} s/run one by one, "
          f"{b:.3f} s/run as a stack, {a / b:.2f}x")


if __name__ == "__main__":
    main()
