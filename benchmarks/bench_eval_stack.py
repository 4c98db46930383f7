"""Stacked evaluation of a stack's runs against their evaluations one after another.

`CohortTrainer.evaluate_many` (one `vmap`'d forward over `--runs` models per slice of samples,
what a stack of runs does on a device that `stacks_evaluation`) against
`fedhet.training.local.evaluate` called once per model (what it does elsewhere), on the same
`--samples` random inputs of the model's dataset shape, the two alternating, medians of
`--repeats`. `--threads` torch threads (default one); `--device cuda` on a GPU.

    python benchmarks/bench_eval_stack.py [--runs 4] [--models cnn-mnist,mlp] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedhet.models.registry import MODELS
from fedhet.training.cohort import CohortTrainer, EvalJob
from fedhet.training.flat import FlatModel
from fedhet.training.local import evaluate

SHAPES = {"cnn-mnist": (1, 28, 28), "cnn-fednnnn-mnist": (1, 28, 28), "cnn-cifar": (3, 32, 32),
          "cnn-fednnnn-cifar": (3, 32, 32), "mlp": (784,)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def one_model(name: str, args: argparse.Namespace) -> tuple[float, float]:
    """Median seconds of one-by-one and of stacked evaluation of `args.runs` models."""
    device = torch.device(args.device)
    entry = MODELS.get(name)
    torch.manual_seed(0)
    shape = SHAPES[name]
    flat = FlatModel(entry.factory(shape, 10, entry.params()).to(device),
                     channels_last=bool(entry.trait("channels_last", False)))
    x = torch.rand(args.samples, *shape, device=device)
    y = torch.randint(0, 10, (args.samples,), device=device)
    params = [flat.params + 0.01 * torch.randn_like(flat.params) for _ in range(args.runs)]
    cohort = CohortTrainer(flat, x, y)

    def alone() -> None:
        for w in params:
            evaluate(flat, w, None, x, y)

    def stacked() -> None:
        cohort.evaluate_many([EvalJob(w, None, x, y) for w in params])

    times: dict[str, list[float]] = {"alone": [], "stacked": []}
    for fn in (alone, stacked):  # warm-up
        fn()
    for _ in range(args.repeats):
        for label, fn in (("alone", alone), ("stacked", stacked)):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[label].append(time.perf_counter() - t0)
    return statistics.median(times["alone"]), statistics.median(times["stacked"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--models", default="cnn-mnist,cnn-fednnnn-mnist,cnn-cifar,mlp")
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.runs} runs, {args.samples} samples, {args.device}, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print("| model | one by one (s) | stacked (s) | stacked speed-up |")
    print("|---|---|---|---|")
    for name in args.models.split(","):
        a, s = one_model(name, args)
        print(f"| {name} | {a:.3f} | {s:.3f} | {a / s:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
