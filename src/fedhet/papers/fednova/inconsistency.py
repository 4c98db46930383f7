"""FedNova's objective-inconsistency case (fednova-summary.txt eq. 3) at a paper-like scale.

`m` clients with local objectives `F_i(x) = ½‖x − e_i‖²` and equal weights `p_i = 1/m` (eq. 3),
client `i` running `τ_i` local gradient steps each round. The true optimum is
`x* = (1/m) Σ e_i`; FedAvg converges instead to `x̃* = Σ τ_i e_i / Σ τ_j`, the optimum of the
surrogate `F̃ = Σ (τ_i/Στ) F_i`; FedNova (eq. 8) to `x*`. The runs go through the real engine
(`Simulation`, the registered algorithms).

How the curves are read: client `i` holds one sample, the row `e_i`, so the engine's training
loss is `F(x)`. The test set holds `e_i` repeated `τ_i` times, so the engine's test loss is
`F̃(x)`. Both are quadratics with identity Hessian, so `‖x − x*‖ = √(2(F(x) − F(x*)))` and
`‖x − x̃*‖ = √(2(F̃(x) − F̃(x̃*)))`: the exported columns `dist_true` and `dist_surrogate`.

The summary gives no sizes, so these are **[choice]**s: `m = 30` (the clients of the paper's
synthetic experiment), `d = 10`, `e_i ~ N(0, I)` and `τ_i ~ U{1, …, 10}` drawn once per seed
(fixed over rounds, as in eq. 3), `η = 0.01` (small, so the `O(η)` shift of the exact fixed
points stays far below `‖x* − x̃*‖`), 500 rounds, seeds 0–9; FedProx with `μ = 1` as the third
method (the summary: FedProx is biased too).

    PYTHONPATH=src python -m fedhet.papers.fednova.inconsistency --out results/fednova
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhet import provenance
from fedhet.data import Dataset
from fedhet.engine import assemble, config_of
from fedhet.models import MODELS
from fedhet.papers import paper_results
from fedhet.registry import NoParams
from fedhet.rundir import RunStore, read_metrics
from fedhet.runs import git_commit

MODEL = "fednova-quadratic"
METHODS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fedavg", {}), ("fednova", {}), ("fedprox", {"algorithm.mu": 1.0}),
)
LABELS = {"fedavg": "fedavg", "fednova": "fednova", "fedprox": "fedprox[mu=1]"}
SETTING = "quadratic"


class HalfSquare(nn.Module):
    """One parameter vector `x`; the loss of a batch of rows `e` is `½ mean ‖x − e‖²`."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(dim))

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return self.x - e

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * out.pow(2).sum(1).mean()

    def predict(self, out: torch.Tensor) -> torch.Tensor:
        return torch.zeros(out.shape[0], dtype=torch.long)


def problem(seed: int, clients: int = 30, dim: int = 10, tau_max: int = 10) -> tuple[torch.Tensor, list[int]]:
    """The seed's `e_i` (rows) and `τ_i`."""
    rng = np.random.default_rng(seed)
    e = torch.from_numpy(rng.standard_normal((clients, dim))).float()
    tau = [int(t) for t in rng.integers(1, tau_max + 1, size=clients)]
    return e, tau


def dataset(e: torch.Tensor, tau: list[int]) -> Dataset:
    """Train: one row `e_i` per client; test: `e_i` repeated `τ_i` times (the surrogate)."""
    test = torch.cat([e[i].repeat(t, 1) for i, t in enumerate(tau)])
    parts = [np.array([i]) for i in range(len(e))]
    return Dataset("fednova-quadratic", e.clone(), torch.zeros(len(e), dtype=torch.long), test,
                   torch.zeros(len(test), dtype=torch.long), num_classes=1, natural_partition=parts)


def optima(e: torch.Tensor, tau: list[int]) -> tuple[float, float, float]:
    """`F(x*)`, `F̃(x̃*)` and `‖x* − x̃*‖`."""
    e64 = e.double()
    w = torch.tensor(tau, dtype=torch.float64) / sum(tau)
    x_true, x_sur = e64.mean(0), w @ e64
    f_true = 0.5 * (e64 - x_true).pow(2).sum(1).mean().item()
    f_sur = 0.5 * (w * (e64 - x_sur).pow(2).sum(1)).sum().item()
    return f_true, f_sur, (x_true - x_sur).norm().item()


def run_one(algorithm: str, extra: dict, seed: int, rounds: int, lr: float, out: Path,
            clients: int = 30, dim: int = 10) -> Path:
    """One run through the engine into `out` (config.json, metrics.csv, summary.json)."""
    e, tau = problem(seed, clients, dim)
    values = {"algorithm": algorithm, "dataset": "digits", "partition": "natural", "model": MODEL,
              "clients": clients, "rounds": rounds, "lr": lr, "batch_size": 1,
              "client_steps": tau, "seed": seed, "train_loss": True, "device": "cpu",
              "executor": "sequential", "workers": 1, **extra}
    store = RunStore(out, provenance.of_run)
    out.mkdir(parents=True, exist_ok=True)
    with MODELS.added(MODEL, lambda shape, classes, params: HalfSquare(shape[0]), NoParams,
                      "FedNova eq. 3: ½‖x − e‖²"):
        cfg = config_of(values)
        store.write_config(cfg.to_dict())
        sim = assemble(cfg, store=store, data=dataset(e, tau), log=lambda _: None)
        store.write_summary(sim.run())
    return out


def rows_of(run_dir: Path, algorithm: str, seed: int, clients: int, dim: int) -> list[dict]:
    """The contract's rows of one run, with `dist_true` and `dist_surrogate` (module doc)."""
    e, tau = problem(seed, clients, dim)
    f_true, f_sur, gap = optima(e, tau)
    out = []
    for m in read_metrics(run_dir / "metrics.csv"):
        out.append({
            "setting": SETTING, "algorithm": LABELS[algorithm], "seed": seed, "round": int(m["round"]),
            "test_accuracy": math.nan, "test_loss": m["test_loss"], "train_loss": m["train_loss"],
            "dist_true": math.sqrt(max(0.0, 2 * (m["train_loss"] - f_true))),
            "dist_surrogate": math.sqrt(max(0.0, 2 * (m["test_loss"] - f_sur))),
            "optima_gap": gap,
        })
    return out


def run_all(out_dir: Path, seeds: list[int], rounds: int = 500, lr: float = 0.01,
            clients: int = 30, dim: int = 10, command: str = "", device: str = "cpu") -> Path:
    """Every method × seed; writes `out_dir/inconsistency.csv` and `.json`."""
    commit = git_commit()  # the code the runs are made with (HEAD when they start)
    t0 = time.perf_counter()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm, extra in METHODS:
            for seed in seeds:
                d = run_one(algorithm, extra, seed, rounds, lr, Path(tmp) / f"{algorithm}_{seed}",
                            clients, dim)
                rows += rows_of(d, algorithm, seed, clients, dim)
    csv_path = out_dir / "inconsistency.csv"
    paper_results.write_rows(csv_path, rows, ("dist_true", "dist_surrogate", "optima_gap"), digits=6)
    paper_results.write_meta(
        out_dir / "inconsistency.json", "inconsistency", "fednova", command, device,
        (time.perf_counter() - t0) / 60, seeds, commit=commit, rounds=rounds, lr=lr, clients=clients,
        dim=dim,
    )
    return csv_path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/fednova")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--rounds", type=int, default=500)
    p.add_argument("--device-label", default="cpu: 2-core VM",
                   help="the machine, as the page shows it")
    a = p.parse_args(argv)
    cmd = ("PYTHONPATH=src python -m fedhet.papers.fednova.inconsistency "
           f"--out {a.out} --seeds {a.seeds} --rounds {a.rounds}")
    torch.set_num_threads(1)
    print(run_all(Path(a.out), list(range(a.seeds)), a.rounds, command=cmd, device=a.device_label))


if __name__ == "__main__":
    main()
