"""Seconds `dirichlet` takes to split MNIST's 60,000 training labels, by clients and α.

    PYTHONPATH=src python benchmarks/bench_partition.py --data-dir data
    PYTHONPATH=src python benchmarks/bench_partition.py --data-dir data --method redraw

Each cell is the median of `--repeats` calls of `partition_dataset` (the call a run makes, seeds
0, 1, 2) on the labels loaded once; `min_size` is 10, or `⌊N/n⌋` where 10 cannot fit (10,000
clients). It also prints the smallest and largest client and the mean share of a client's most
frequent label (1: every client holds one label). Without the MNIST file (docs: DATA.md) it uses a
synthetic label vector with MNIST's class counts, and says so. A cell whose rule gives up
(`redraw` after `max_tries` draws) shows the seconds it took to give up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from fedhet.data.base import Dataset
from fedhet.data.partition import PARTITIONS, partition_dataset
from fedhet.data.registry import DATASETS, load_dataset
from fedhet.errors import FedhetError

MNIST_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def mnist_labels(data_dir: str) -> tuple[Dataset, str]:
    """MNIST as `fedhet run -d mnist` loads it, or a stand-in with MNIST's class counts."""
    try:
        return load_dataset("mnist", DATASETS.params("mnist"), data_dir), "MNIST training labels"
    except FedhetError as e:
        print(f"MNIST not found ({e}); using synthetic labels with MNIST's class counts")
    y = np.random.default_rng(0).permutation(np.repeat(np.arange(10), MNIST_COUNTS))
    n = len(y)
    data = Dataset("mnist-counts", torch.zeros(n, 1), torch.from_numpy(y), torch.zeros(1, 1),
                   torch.zeros(1, dtype=torch.int64), num_classes=10)
    return data, "synthetic labels, MNIST's class counts"


def cell(data: Dataset, clients: int, alpha: float, method: str, repeats: int) -> str:
    n = len(data.split_labels)
    min_size = min(10, n // clients)
    params = PARTITIONS.params("dirichlet", {"alpha": alpha, "min_size": min_size, "method": method})
    seconds, parts = [], None
    for seed in range(repeats):
        start = time.perf_counter()
        try:
            parts = partition_dataset(data, "dirichlet", clients, params, seed)
        except FedhetError:
            parts = None
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    if parts is None:
        return f"| {clients:,} | {alpha} | {min_size} | {median:.3f} | gave up | | |"
    labels = data.split_labels
    sizes = np.array([len(p) for p in parts])
    top = np.mean([np.bincount(labels[p]).max() / len(p) for p in parts if len(p)])
    return (f"| {clients:,} | {alpha} | {min_size} | {median:.3f} | {sizes.min()} | {sizes.max()} "
            f"| {top:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--method", default="auto", choices=["auto", "floor", "redraw"])
    ap.add_argument("--clients", default="100,1000,10000")
    ap.add_argument("--alphas", default="0.01,0.1,1")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    data, what = mnist_labels(args.data_dir)
    print(f"dirichlet, method={args.method}, {len(data.split_labels):,} {what}, median of {args.repeats}")
    print("| clients | α | min_size | seconds | smallest | largest | top-label share |")
    print("|---|---|---|---|---|---|---|")
    for clients in (int(c) for c in args.clients.split(",")):
        for alpha in (float(a) for a in args.alphas.split(",")):
            print(cell(data, clients, alpha, args.method, args.repeats), flush=True)


if __name__ == "__main__":
    main()
