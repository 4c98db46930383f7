"""A quick look at FedNNNN's NWDA on the embedded digits data (a stand-in for MNIST).

Runs FedAvg, Norm-Norm, Momentum and FedNNNN (the `fednnnn` preset's `small` settings: 30
clients here, C = 1, B = 50, E = 5, η = 0.05, MNIST's Table 5 values, NWDA logging on) on IID
and Dirichlet(0.1) partitions, with a small conv net so that the conv/fc split of Figs. 8–9
exists on 8×8 images, then draws the study's figures (of the first seed) and prints a table:
mean ± std over the seeds (sample std) of the final and best test accuracy.

    PYTHONPATH=src python benchmarks/fednnnn_digits.py [OUT] [SEEDS]   # ~3 min per seed on one core

SEEDS is a comma-separated list (default `0`); the runs go to `OUT/seed<s>/<partition>/<run>`.
Seed 2 stops: no Dirichlet(0.1) draw gives all 30 clients 10 samples; docs/fednnnn.md uses 0,1,3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torch import nn

from fedhet.models.registry import MODELS
from fedhet.papers.fednnnn.plots import plot_study
from fedhet.papers.fednnnn.preset import run_specs
from fedhet.reports.seeds import Stat
from fedhet.runs.single import execute

METHODS = ("FedAvg", "Norm-Norm", "Momentum", "FedNNNN")
PARTITIONS = {"iid": {}, "dirichlet0.1": {"partition": "dirichlet", "partition.alpha": 0.1}}


@MODELS.register("digits-convnet", doc="benchmark only: 2 conv (8, 16) + 2 fc on 8×8 digits")
def digits_convnet(input_shape, num_classes, params):
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, num_classes),
    )


def main(root: Path, seeds: list[int]) -> None:
    table: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for seed in seeds:
        for spec in run_specs("small", scenarios=("IID-B",), methods=METHODS, rounds=30, clients=30,
                              model="digits-convnet"):
            for part, extra in PARTITIONS.items():
                s = execute({**spec.settings, **extra, "seed": seed}, root / f"seed{seed}" / part / spec.name,
                            force=True, log=lambda _: None)
                table.setdefault((part, spec.label), []).append((s["final_accuracy"], s["best_accuracy"]))
    for path in plot_study(root / f"seed{seeds[0]}"):
        print(path)
    print(f"n = {len(seeds)} seed(s): {seeds}")
    print("| partition | method | final acc | best acc |")
    print("|---|---|---|---|")
    for (part, method), vals in table.items():
        final, best = (Stat(tuple(v[j] for v in vals)).text("{:.3f}") for j in (0, 1))
        print(f"| {part} | {method} | {final} | {best} |")
    (root / "table.json").write_text(json.dumps({f"{p}/{m}": v for (p, m), v in table.items()}))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fednnnn_digits"),
         [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "0").split(",")])
