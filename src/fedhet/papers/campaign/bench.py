"""Measure what the campaign's prices assume on one device kind; the result is a committed record.

`measure(device, workloads)` runs each workload for a few rounds with the engine (the paper
settings of a campaign run, its data cut with `dataset.limit_train` on a CPU) and times the
rounds after the first from the run's own round callbacks; `record` writes
`RESULTS/campaign/bench/<kind>.json`: per workload the model, precision, clients stacked, runs
stacked, sample-passes per run-round (`pricing.round_load`) and seconds per (stack) round.

- **CPU** (`CPU_WORKLOADS`, about a minute on one core): one run of each model the tables
  train, at a tenth of the training data.
- **GPU** (`GPU_WORKLOADS`, `benchmarks/gpu_campaign.py`, under five minutes on one H100): the
  FedNNNN CNN and MLP rounds over 100 clients (1 and 4 FedNNNN runs stacked), a FedSR ring
  round with 1 and 8 runs stacked, and BHerd's 5-client CNN with 8 and 20 runs stacked: the
  stacks the plan uses, so no small-batch penalty is assumed.
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.papers.campaign.pricing import kind_of, round_load
from fedhet.papers.campaign.records import Store, now


@dataclass(frozen=True)
class Workload:
    name: str
    settings: dict[str, Any]
    runs: int = 1
    rounds: int = 3


_FEDNNNN_CNN = {"dataset": "mnist", "model": "cnn-fednnnn-mnist", "clients": 100, "partition": "shards",
                "partition.xi": 2, "batch_size": 50, "local_epochs": 5, "lr": 0.05, "algorithm": "fedavg"}
_MLP_RING = {"dataset": "mnist", "model": "mlp", "clients": 20, "batch_size": 32, "lr": 0.01,
             "momentum": 0.5, "partition": "shards", "partition.xi": 2}
_BHERD_CNN = {"dataset": "mnist", "model": "cnn-mnist", "clients": 5, "partition": "half-iid",
              "batch_size": 50, "local_epochs": 1.0, "lr": 0.01, "algorithm": "fedavg", "train_loss": True}
_CIFAR_CNN = {"dataset": "mnist", "model": "cnn-cifar", "clients": 20, "batch_size": 32,
              "lr": 0.01, "local_epochs": 5, "algorithm": "fedavg", "partition": "iid"}
TENTH = {"dataset.limit_train": 6000, "dataset.limit_test": 2000}

CPU_WORKLOADS = (
    Workload("fednnnn-cnn-bf16", {**_FEDNNNN_CNN, **TENTH, "precision": "bf16"}),
    Workload("fednnnn-cnn", {**_FEDNNNN_CNN, **TENTH}),
    Workload("mlp-fedavg-20", {**_MLP_RING, **TENTH, "algorithm": "fedavg", "local_epochs": 5}),
    Workload("mlp-fedsr-ring", {**_MLP_RING, **TENTH, "algorithm": "fedsr", "algorithm.clusters": 5,
                                "algorithm.ring_passes": 5, "local_epochs": 1}),
    Workload("cnn-mnist-5", {**_BHERD_CNN, **TENTH}),
    Workload("cnn-cifar-fashion", {**_CIFAR_CNN, **TENTH}),
)
GPU_WORKLOADS = (
    Workload("fednnnn-cnn-bf16-x1", {**_FEDNNNN_CNN, "precision": "bf16"}),
    Workload("fednnnn-cnn-bf16-x4", {**_FEDNNNN_CNN, "precision": "bf16"}, runs=4),
    Workload("fednnnn-cnn-x1", dict(_FEDNNNN_CNN)),
    Workload("mlp-fedavg-100", {**_MLP_RING, "clients": 100, "algorithm": "fedavg", "local_epochs": 1}),
    Workload("mlp-fedsr-ring-x1", {**_MLP_RING, "algorithm": "fedsr", "algorithm.clusters": 5,
                                   "algorithm.ring_passes": 5, "local_epochs": 1}, rounds=2),
    Workload("mlp-fedsr-ring-x8", {**_MLP_RING, "algorithm": "fedsr", "algorithm.clusters": 5,
                                   "algorithm.ring_passes": 5, "local_epochs": 1}, runs=8, rounds=2),
    Workload("cnn-mnist-5-x8", dict(_BHERD_CNN), runs=8),
    Workload("cnn-mnist-5-x20", dict(_BHERD_CNN), runs=20),
)


@dataclass
class _Clock:
    ends: list[float] = field(default_factory=list)

    def __call__(self, row: dict[str, Any]) -> None:
        self.ends.append(time.perf_counter())


def measure(device: str, workloads: tuple[Workload, ...], data_dir: str | None = None,
            say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Time each workload on `device`; one row per workload (module doc)."""
    # lazy: the engine (torch) loads only when a bench runs
    from fedhet.runs import execute, execute_together

    rows = []
    for w in workloads:
        settings = {**w.settings, "rounds": w.rounds, "device": device, "eval_every": 1}
        if data_dir:
            settings["data_dir"] = data_dir
        if device.startswith("cuda") or w.runs > 1:
            settings["executor"] = "stacked"
        clock = _Clock()
        with tempfile.TemporaryDirectory(prefix="fedhet-bench-") as tmp:
            t0 = time.perf_counter()
            try:
                if w.runs == 1:
                    execute(settings, Path(tmp) / "r0", log=lambda _: None, callbacks=[clock])
                else:
                    items = [({**settings, "seed": s}, Path(tmp) / f"r{s}", False) for s in range(w.runs)]
                    hooks = [[clock]] + [[] for _ in range(w.runs - 1)]
                    outcomes = execute_together(items, log=lambda _: None, callbacks=hooks)
                    errors = [o for o in outcomes if isinstance(o, BaseException)]
                    if errors:
                        raise errors[0]
            except Exception as e:  # noqa: BLE001  (one workload's failure leaves the others)
                say(f"bench {w.name}: not measured ({type(e).__name__}: {e})")
                continue
            wall = time.perf_counter() - t0
        gaps = [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)]
        s_round = statistics.median(gaps) if gaps else wall / max(1, w.rounds)
        load = round_load(settings)
        row = {"workload": w.name, "model": load.model, "precision": settings.get("precision", "fp32"),
               "algorithm": settings.get("algorithm", "fedavg"), "stacked": load.stacked,
               "runs": w.runs, "passes": round(load.passes, 1), "s_per_round": round(s_round, 4),
               "wall_s": round(wall, 2)}
        say(f"bench {w.name}: {s_round:.3f} s a round ({w.runs} run(s), {load.passes:,.0f} "
            "sample-passes each)")
        rows.append(row)
    return rows


def device_name(device: str) -> str:
    # lazy: torch loads only when the device is named
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"one core of {cpu or platform.processor() or 'a CPU'}, torch {torch.__version__}"


def record(store: Store, device: str, rows: list[dict[str, Any]], commit: str) -> Path:
    """Write the kind's bench record (replacing an earlier one of the same kind)."""
    path = store.bench_dir / f"{kind_of(device)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"kind": kind_of(device), "device": device_name(device), "commit": commit, "date": now(),
            "measurements": rows}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path
