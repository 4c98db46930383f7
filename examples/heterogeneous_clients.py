"""FedAvg, FedProx, SCAFFOLD, FedAdam and FedYogi on one heterogeneous problem, judged by how
their clients fare: the global model's accuracy on each client's own held-out share, its mean
and its worst decile (`client_eval_fraction`), beside the server's test accuracy.

scikit-learn's digits over 20 clients by Dirichlet(α = 0.1) label skew, 60 rounds, 3 seeds;
the client learning rate is the same for all (0.05); FedProx's μ and the adaptive servers' η
are the values docs/library.md §9 gives. Prints a Markdown table (mean over the seeds, the
range across them) and writes the runs under runs/heterogeneous/.

    python examples/heterogeneous_clients.py
"""

from __future__ import annotations

import statistics

import fedhet

METHODS = {
    "FedAvg": ("fedavg", {}),
    "FedProx (μ = 0.01)": ("fedprox", {"algorithm.mu": 0.01}),
    "SCAFFOLD": ("scaffold", {}),
    "FedAdam (η_s = 0.01)": ("fedadam", {"algorithm.server_lr": 0.01}),
    "FedYogi (η_s = 0.03)": ("fedyogi", {"algorithm.server_lr": 0.03}),
}
COMMON = {"partition.alpha": 0.1, "lr": 0.05, "client_eval_fraction": 0.2, "client_eval_every": 10}
SEEDS = (0, 1, 2)

print("| method | test accuracy | client accuracy, mean | client accuracy, worst 10 % |")
print("|---|---|---|---|")
for label, (algorithm, extra) in METHODS.items():
    rows = []
    for seed in SEEDS:
        r = fedhet.run(algorithm=algorithm, dataset="digits", partition="dirichlet", clients=20,
                       rounds=60, seed=seed, settings={**COMMON, **extra},
                       out=f"runs/heterogeneous/{algorithm}-s{seed}", force=True)
        last = r.metrics[-1]
        rows.append((last["test_accuracy"], last["client_acc_mean"], last["client_acc_worst10"]))
    cells = []
    for k in range(3):
        values = [row[k] for row in rows]
        cells.append(f"{statistics.mean(values):.3f} ({min(values):.3f}–{max(values):.3f})")
    print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
