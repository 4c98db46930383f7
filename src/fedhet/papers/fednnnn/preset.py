"""FedNNNN's study (Nagura et al., §5, Tables 1, 2, 5): five aggregation methods, four scenarios.

Scenarios: IID or non-IID (2 classes per client: `shards` with `ξ = 2`) × balanced (B) or
unbalanced (UB: power-law client sizes, `unbalanced` partition, the server weighting every
client `1/m` because it does not know `D_i`). Methods: FedAvg, FedProx (`μ`), Norm-Norm (`β`,
eq. 8), Momentum (FedAvgM, `γ`, eqs. 10–11), FedNNNN (`β`, `γ`, eqs. 12–13), each with the
Table 5 value for its dataset and scenario. Common settings (Table 1): 100 clients, `C = 1`,
`B = 50`, `E = 5`, `η = 0.05`, plain SGD; MNIST 100 rounds with the Table 3 CNN, CIFAR-10 250
rounds with the Table 4 CNN (BN) and weight decay 5e-4.

Scales: `paper` is the above over seeds 0, 1, 2 (120 runs; the paper does not give its
seeds). `small` and `smoke` run the same 4 × 5 design on the embedded digits data with the
MLP and fewer clients and rounds, using MNIST's Table 5 values: `smoke` about a minute on two
cores, `small` a few minutes.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from fedhet.algorithms import ALGORITHMS
from fedhet.errors import FedhetError
from fedhet.papers.base import PRESETS
from fedhet.runs import PAPER_SEEDS, Preset, RunSpec, with_seeds

SCENARIOS = ("IID-B", "NonIID-B", "IID-UB", "NonIID-UB")
METHODS = ("FedAvg", "FedProx", "Norm-Norm", "Momentum", "FedNNNN")
DATASET_LABEL = {"mnist": "MNIST", "cifar10": "CIFAR10", "digits": "digits"}

TABLE5: dict[tuple[str, str], dict[str, float]] = {
    # (dataset, scenario): FedProx μ, Norm-Norm β, Momentum γ, FedNNNN β and γ
    ("mnist", "IID-B"): {"mu": 0.005, "nn_beta": 1.1, "m_gamma": 0.8, "beta": 0.6, "gamma": 0.7},
    ("cifar10", "IID-B"): {"mu": 0.015, "nn_beta": 0.6, "m_gamma": 0.9, "beta": 0.7, "gamma": 0.8},
    ("mnist", "NonIID-B"): {"mu": 0.015, "nn_beta": 1.0, "m_gamma": 0.9, "beta": 0.7, "gamma": 0.8},
    ("cifar10", "NonIID-B"): {"mu": 0.015, "nn_beta": 0.6, "m_gamma": 0.9, "beta": 0.6, "gamma": 0.7},
    ("mnist", "IID-UB"): {"mu": 0.005, "nn_beta": 1.0, "m_gamma": 0.7, "beta": 0.7, "gamma": 0.7},
    ("cifar10", "IID-UB"): {"mu": 0.005, "nn_beta": 0.7, "m_gamma": 0.9, "beta": 0.8, "gamma": 0.8},
    ("mnist", "NonIID-UB"): {"mu": 0.02, "nn_beta": 0.9, "m_gamma": 0.8, "beta": 0.7, "gamma": 0.8},
    ("cifar10", "NonIID-UB"): {"mu": 0.01, "nn_beta": 0.7, "m_gamma": 0.8, "beta": 0.7, "gamma": 0.6},
}

TABLE2: dict[str, dict[tuple[str, str], float]] = {
    # test accuracy in %, columns as Table 2: (dataset, scenario)
    "FedAvg": dict(zip([(d, s) for s in SCENARIOS for d in ("mnist", "cifar10")],
                       [99.0, 81.3, 98.2, 72.6, 99.1, 83.5, 93.5, 56.6], strict=True)),
    "FedProx": dict(zip([(d, s) for s in SCENARIOS for d in ("mnist", "cifar10")],
                        [99.0, 81.4, 98.1, 74.2, 99.1, 83.2, 87.9, 55.6], strict=True)),
    "Norm-Norm": dict(zip([(d, s) for s in SCENARIOS for d in ("mnist", "cifar10")],
                          [99.1, 81.2, 99.0, 76.7, 99.2, 83.3, 97.1, 55.5], strict=True)),
    "Momentum": dict(zip([(d, s) for s in SCENARIOS for d in ("mnist", "cifar10")],
                         [99.1, 83.1, 99.2, 74.3, 99.1, 84.2, 96.9, 62.0], strict=True)),
    "FedNNNN": dict(zip([(d, s) for s in SCENARIOS for d in ("mnist", "cifar10")],
                        [99.2, 84.7, 99.1, 76.7, 99.2, 84.0, 98.9, 61.9], strict=True)),
}

COMMON = {"sample_fraction": 1.0, "batch_size": 50, "local_epochs": 5, "lr": 0.05, "momentum": 0.0}
PAPER_DATA = {
    "mnist": {"model": "cnn-fednnnn-mnist", "rounds": 100, "weight_decay": 0.0},
    "cifar10": {"model": "cnn-fednnnn-cifar", "rounds": 250, "weight_decay": 5e-4},
}
SCALED = {
    # digits (1,347 training images) with the MLP; MNIST's Table 5 values
    "smoke": {"clients": 10, "rounds": 10},
    "small": {"clients": 50, "rounds": 40},
}


def partition_settings(scenario: str) -> dict[str, Any]:
    """Partition of a scenario: `iid`, `shards` (ξ = 2), or `unbalanced` (power-law sizes) with
    IID or 2-class labels."""
    scenarios: dict[str, dict[str, Any]] = {
        "IID-B": {"partition": "iid"},
        "NonIID-B": {"partition": "shards", "partition.xi": 2},
        "IID-UB": {"partition": "unbalanced", "partition.labels": "iid"},
        "NonIID-UB": {"partition": "unbalanced", "partition.labels": "shards", "partition.xi": 2},
    }
    return scenarios[scenario]


def method_settings(method: str, hp: dict[str, float], unbalanced: bool) -> dict[str, Any]:
    """Algorithm and its Table 5 parameters; uniform server weights `1/m` when unbalanced."""
    methods: dict[str, tuple[str, dict[str, Any]]] = {
        "FedAvg": ("fedavg", {}),
        "FedProx": ("fedprox", {"mu": hp["mu"]}),
        "Norm-Norm": ("norm-norm", {"beta": hp["nn_beta"], "server_momentum": 0.0}),
        "Momentum": ("fedavgm", {"server_momentum": hp["m_gamma"]}),
        "FedNNNN": ("fednnnn", {"beta": hp["beta"], "server_momentum": hp["gamma"]}),
    }
    algorithm, params = methods[method]
    params["weighting"] = "uniform" if unbalanced else "samples"
    if "nwda" in _param_names(algorithm):
        params["nwda"] = True  # N/E diagnostics for Figs. 3, 7–9 and 11–33
    return {"algorithm": algorithm, **{f"algorithm.{k}": v for k, v in params.items()}}


def _param_names(algorithm: str) -> set[str]:
    try:
        return {f.name for f in fields(ALGORITHMS.get(algorithm).params)}
    except FedhetError:
        return set()


def run_specs(
    scale: str, datasets: tuple[str, ...] | None = None, scenarios: tuple[str, ...] = SCENARIOS,
    methods: tuple[str, ...] = METHODS, **overrides: Any,
) -> list[RunSpec]:
    """The study's runs at `scale`, optionally a subset (e.g. MNIST non-IID only) and with
    settings overridden (e.g. `rounds=50`)."""
    datasets = datasets or (("mnist", "cifar10") if scale == "paper" else ("digits",))
    specs = []
    for dataset in datasets:
        table_key = dataset if dataset in PAPER_DATA else "mnist"
        data = PAPER_DATA[dataset] if scale == "paper" else SCALED[scale]
        for scenario in scenarios:
            hp = TABLE5[(table_key, scenario)]
            base = {**COMMON, "dataset": dataset, "clients": 100, **data,
                    **partition_settings(scenario)}
            for method in methods:
                settings = {**base, **method_settings(method, hp, scenario.endswith("-UB")),
                            **overrides}
                name = f"{dataset}_{scenario}_{method}".lower()
                specs.append(RunSpec(name, f"{DATASET_LABEL[dataset]} {scenario}", method, settings))
    return specs


def cli_command(spec: RunSpec, root: str = "runs/fednnnn") -> str:
    """The `fedhet run` command line of one run (for running a subset by hand)."""
    sets = " ".join(f"--set {k}={v}" for k, v in spec.settings.items())
    return f"fedhet run --out {root}/{spec.name} {sets}"


def published_rows() -> list[dict[str, Any]]:
    """Table 2 as `{"group", "label", "metric", "value", "source"}` rows (accuracy in [0, 1])."""
    return [
        {"group": f"{DATASET_LABEL[d]} {s}", "label": method, "metric": "test_accuracy",
         "value": round(acc / 100.0, 4), "source": "FedNNNN Table 2"}
        for method, row in TABLE2.items() for (d, s), acc in row.items()
    ]


@PRESETS.register("fednnnn", doc="FedNNNN §5: 5 methods × IID/non-IID × balanced/unbalanced")
def fednnnn_preset(scale: str) -> Preset:
    def stage(out: Path) -> list[RunSpec]:
        return with_seeds(run_specs(scale), PAPER_SEEDS) if scale == "paper" else run_specs(scale)

    notes = (
        "test_accuracy is the plain-average evaluation model of §4.1 for norm-norm and fednnnn "
        "(test_accuracy_norm: the carried normalised model). "
        + ("MNIST and CIFAR-10 as in Tables 1 and 5." if scale == "paper" else
           "Digits stand-in for MNIST (MLP, MNIST's Table 5 values); not comparable to Table 2.")
    )
    return Preset("fednnnn", scale, [stage], published=published_rows(), notes=notes)


__all__ = ["METHODS", "SCENARIOS", "TABLE2", "TABLE5", "cli_command", "fednnnn_preset", "run_specs"]
