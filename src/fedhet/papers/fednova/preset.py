"""FedNova (Wang et al., NeurIPS 2020): logistic regression on Synthetic(1, 1) with stragglers.

The paper's synthetic experiment: the FedProx generator's Synthetic(1, 1) federated dataset,
each generated user one client (the natural partition), a multinomial logistic regression,
and heterogeneous local work: every round each client draws its number of local epochs
`E_i ~ U{2, …, 5}` (RunConfig `epochs_min`/`epochs_max`), so `τ_i = ⌊E_i D_i / B⌋` differs
across clients and rounds. FedAvg then minimises the surrogate objective `Σ τ_i p_i F_i / τ̄`
(seed summary, eq. 3), FedNova the true one (eq. 8); FedProx is the third method.

Our seed is a summary without the paper's hyperparameters or numbers, so these are choices:
`η = 0.05`, `B = 20`, FedProx `μ = 1` (FedProx's best value on its synthetic data), 30 users
(`paper`), with per-user samples capped at smaller scales so `smoke` takes about a minute on
two cores. The paper reports curves (training loss, test accuracy), no table, so `published`
is empty: compare the shapes (FedNova's training loss below FedAvg's) in the report.
"""

from __future__ import annotations

from pathlib import Path

from fedhet.papers.base import PRESETS
from fedhet.runs import Preset, RunSpec

METHODS = (
    ("FedAvg", {"algorithm": "fedavg"}),
    ("FedNova", {"algorithm": "fednova"}),
    ("FedProx (mu=1)", {"algorithm": "fedprox", "algorithm.mu": 1.0}),
)
GROUP = "Synthetic(1,1), E_i~U[2,5]"

SCALE_SETTINGS = {
    # scale: (users, max samples per user, rounds, seeds)
    "smoke": (10, 150, 15, (0,)),
    "small": (30, 1000, 100, (0, 1, 2)),
    "paper": (30, 0, 300, (0, 1, 2)),
}


def runs(scale: str) -> list[RunSpec]:
    users, cap, rounds, seeds = SCALE_SETTINGS[scale]
    base = {
        "dataset": "synthetic", "dataset.alpha": 1.0, "dataset.beta": 1.0,
        "dataset.users": users, "dataset.max_samples": cap, "partition": "natural",
        "clients": users, "model": "logreg", "rounds": rounds, "lr": 0.05, "batch_size": 20,
        "epochs_min": 2, "epochs_max": 5, "train_loss": True,
    }
    out = []
    for label, method in METHODS:
        for seed in seeds:
            name = f"{method['algorithm']}__seed{seed}"
            out.append(RunSpec(name, GROUP, label, {**base, **method, "seed": seed}))
    return out


@PRESETS.register("fednova", doc="FedNova: FedAvg vs FedNova vs FedProx, Synthetic(1,1), E_i~U[2,5]")
def fednova_preset(scale: str) -> Preset:
    def stage(out: Path) -> list[RunSpec]:
        return runs(scale)

    return Preset(
        paper="fednova", scale=scale, stages=[stage], published=[], target_accuracy=0.75,
        notes=(
            "FedNova's synthetic experiment: Synthetic(1,1), natural partition, logistic "
            "regression, E_i ~ U[2,5] local epochs per client and round. The paper reports "
            "curves only; look at training loss vs round in report.html."
        ),
    )
