"""Client sizes of `dirichlet` with `balance=none` and `balance=niid-bench` on real labels.

    PYTHONPATH=src python benchmarks/dirichlet_balance.py --dataset mnist --data-dir data \\
        --clients 10 --alpha 0.5 --seeds 50

For each seed 0..S-1 it draws the partition exactly as `fedhet run --seed s` does (same data
path: `federate()`), and prints the mean over seeds of the largest and smallest client and of the
size CV (population std / mean of the client sizes), with the spread over seeds. `--method`
(default `redraw`, the rule docs/partitions.md's table was measured with) picks the
`balance=none` rule; `niid-bench` always redraws.
"""

from __future__ import annotations

import argparse

import numpy as np

from fedhet.engine.config import config_of
from fedhet.engine.federation import federate


def sizes(
    dataset: str, data_dir: str, clients: int, alpha: float, balance: str, method: str, seed: int
) -> np.ndarray:
    cfg = config_of({
        "dataset": dataset, "data_dir": data_dir, "clients": clients, "seed": seed,
        "partition": "dirichlet", "partition.alpha": alpha, "partition.balance": balance,
        "partition.method": "redraw" if balance == "niid-bench" else method,
    })
    return np.array([len(p) for p in federate(cfg, cache=True).parts])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--method", default="redraw", choices=["floor", "redraw"])
    args = ap.parse_args()
    print(f"{args.dataset}, {args.clients} clients, α={args.alpha}, seeds 0..{args.seeds - 1}")
    print(f"{'balance':<11} {'largest':>17} {'smallest':>17} {'size CV':>15}")
    for balance in ("none", "niid-bench"):
        runs = np.stack([sizes(args.dataset, args.data_dir, args.clients, args.alpha, balance,
                               args.method, s) for s in range(args.seeds)])
        big, small, cv = runs.max(axis=1), runs.min(axis=1), runs.std(axis=1) / runs.mean(axis=1)
        print(f"{balance:<11} {big.mean():>8.0f} ± {big.std():>5.0f}  {small.mean():>8.0f} ± "
              f"{small.std():>5.0f}  {cv.mean():>7.3f} ± {cv.std():.3f}   (N = {runs[0].sum()})")


if __name__ == "__main__":
    main()
