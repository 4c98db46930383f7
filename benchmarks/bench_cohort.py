"""Seconds per round of the sequential and stacked executors (the cohort-engine workloads).

Workloads (random data of the right shape, so nothing is downloaded; `--full` for the sizes
below, small defaults otherwise):

- `fedavg-mlp`: FedAvg, MLP 784-200-200-10, MNIST-shaped, 100 clients, Dirichlet(0.5), E=1, B=32;
- `fednnnn-cnn`: FedNNNN, its Table-3 MNIST CNN (`cnn-fednnnn-mnist`), 100 clients, E=5, B=50;
- `bn-cnn`: FedAvg, the BatchNorm CNN `cnn-fednnnn-cifar` on random 32x32x3 data;
- `mlp-1000`: FedAvg, MLP, 1000 clients x 60 samples, E=1, B=32;
- `svm`: FedAvg, squared-hinge SVM on 784 features, 5 clients x 240 local steps, B=32;
- `fedveca-svm`, `bherd-svm`: the same SVM setting under FedVeca (its per-step β, δ estimates
  and full gradients) and BHerd (α = 0.5: per-step gradient store, Gram matrix, herding).

Each workload runs on every executor and device found (CPU; CUDA when torch sees a GPU); the
figure is the median of the per-round training times (`round_time_s`, evaluation excluded),
the first round dropped as warm-up when more than one is run.

    python benchmarks/bench_cohort.py [--rounds 3] [--full] [--only svm,fedavg-mlp]
        [--devices cpu,cuda] [--threads 1] [--workers 2] [--out table.md]

`--workers N` adds, on CPU, the sequential executor spread over N processes
(`fedhet.engine.workers`) and its speed-up over one process.

On a CPU shared with other jobs, `--threads 1` avoids the intra-op threads waiting on each other
(with 2 threads on a loaded 2-core machine every figure was 10-20x slower).
"""

from __future__ import annotations

import argparse
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedhet.data.base import Dataset
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.runs.results import git_commit


@dataclass
class Workload:
    name: str
    settings: dict[str, Any]
    shape: tuple[int, ...]
    classes: int
    samples: int
    """Training samples in all (small size)."""
    full_samples: int
    full: dict[str, Any] = field(default_factory=dict)
    """Settings that change at full size."""


WORKLOADS = [
    Workload(
        "fedavg-mlp", {"algorithm": "fedavg", "model": "mlp", "clients": 20, "batch_size": 32,
                       "partition": "dirichlet", "partition_params": {"alpha": 0.5}, "lr": 0.01},
        (1, 28, 28), 10, 3000, 60000, {"clients": 100},
    ),
    Workload(
        "fednnnn-cnn", {"algorithm": "fednnnn", "model": "cnn-fednnnn-mnist", "clients": 10,
                        "batch_size": 50, "local_epochs": 1.0, "partition": "iid", "lr": 0.01},
        (1, 28, 28), 10, 1000, 60000, {"clients": 100, "local_epochs": 5.0},
    ),
    Workload(
        "bn-cnn", {"algorithm": "fedavg", "model": "cnn-fednnnn-cifar", "clients": 10,
                   "batch_size": 50, "partition": "iid", "lr": 0.01},
        (3, 32, 32), 10, 1000, 50000, {"clients": 100},
    ),
    Workload(
        "mlp-1000", {"algorithm": "fedavg", "model": "mlp", "clients": 200, "batch_size": 32,
                     "partition": "iid", "lr": 0.01},
        (1, 28, 28), 10, 200 * 60, 1000 * 60, {"clients": 1000},
    ),
    Workload(
        "svm", {"algorithm": "fedavg", "model": "svm", "clients": 5, "batch_size": 32,
                "local_steps": 240, "partition": "iid", "lr": 0.01},
        (784,), 2, 5 * 1200, 5 * 1200,
    ),
    Workload(
        "fedveca-svm", {"algorithm": "fedveca", "model": "svm", "clients": 5, "batch_size": 32,
                        "local_steps": 240, "partition": "iid", "lr": 0.01},
        (784,), 2, 5 * 1200, 5 * 1200,
    ),
    Workload(
        "bherd-svm", {"algorithm": "bherd", "model": "svm", "clients": 5, "batch_size": 32,
                      "local_steps": 240, "partition": "iid", "lr": 0.01},
        (784,), 2, 5 * 1200, 5 * 1200,
    ),
]


def random_dataset(w: Workload, samples: int, seed: int = 0) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    test = max(200, samples // 10)
    return Dataset(
        name=w.name,
        x_train=torch.randn(samples, *w.shape, generator=gen),
        y_train=torch.randint(0, w.classes, (samples,), generator=gen),
        x_test=torch.randn(test, *w.shape, generator=gen),
        y_test=torch.randint(0, w.classes, (test,), generator=gen),
        num_classes=w.classes,
    )


def seconds_per_round(
    w: Workload, executor: str, device: str, rounds: int, full: bool, workers: int = 1
) -> float:
    values = {**w.settings, **(w.full if full else {}), "rounds": rounds, "executor": executor,
              "device": device, "dataset": "digits", "eval_every": rounds, "workers": workers}
    cfg = config_of(values)
    data = random_dataset(w, w.full_samples if full else w.samples)
    rows: list[dict] = []
    sim = assemble(cfg, data=data, log=lambda _: None, callbacks=[rows.append])
    sim.run()
    times = [r["round_time_s"] for r in rows]
    return statistics.median(times[1:] if len(times) > 1 else times)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text()
        cpu = next(line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line)
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu}, {torch.get_num_threads()} torch threads{gpu}; torch {torch.__version__}"



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="the full sizes of the module doc (slow on a CPU)")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--devices", default="", help="cpu,cuda (default: cpu, and cuda if available)")
    ap.add_argument("--out", default="", help="also write the markdown table here")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's)")
    ap.add_argument("--workers", type=int, default=1, help="also time N worker processes on CPU")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n for n in args.only.split(",") if n]
    devices = [d for d in args.devices.split(",") if d] or (
        ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    )
    lines = [
        f"commit {git_commit()}; {machine()}; {args.rounds} rounds, {'full' if args.full else 'small'} sizes",
        "",
        "| workload | device | sequential s/round | stacked s/round | speed-up |"
        + (f" {args.workers} workers s/round | speed-up |" if args.workers > 1 else ""),
        "|---|---|---|---|---|" + ("---|---|" if args.workers > 1 else ""),
    ]
    print("\n".join(lines), flush=True)
    for w in WORKLOADS:
        if names and w.name not in names:
            continue
        for device in devices:
            seq = seconds_per_round(w, "sequential", device, args.rounds, args.full)
            bat = seconds_per_round(w, "stacked", device, args.rounds, args.full)
            line = f"| {w.name} | {device} | {seq:.3f} | {bat:.3f} | {seq / bat:.2f}x |"
            if args.workers > 1 and device == "cpu":
                par = seconds_per_round(w, "sequential", device, args.rounds, args.full, args.workers)
                line += f" {par:.3f} | {seq / par:.2f}x |"
            print(line, flush=True)
            lines.append(line)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
