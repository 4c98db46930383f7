"""Evaluation's share of a paper-scale round, before and after the fast path, on one CPU core.

For each campaign table (`fedhet.papers.campaign.TABLES`) its first paper-scale run says
what a round computes (`campaign.pricing.round_load`: samples trained, samples evaluated: the test set
every round, the whole training set with `train_loss`, FedVeca's and BHerd's). This script
measures, on one core, the training and the evaluation throughput of the table's model in
two checkouts (this one, and `--base`, e.g. a worktree of `main`), each in its own worker
process, alternating, medians of `--repeats`:

- training: `LocalTrainer.sgd` over 20 mini-batches of the run's batch size;
- evaluation: `fedhet.training.local.evaluate` over 4,096 samples with its default batch.

The share is `eval / (train + eval)` with each time = samples / throughput (random inputs of
the dataset's shape; a paper-scale round itself takes minutes to hours on this CPU).

    python benchmarks/eval_share.py --base /tmp/perf-base [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

INPUT_SHAPES = {"mnist": ((28, 28), 10), "fashion-mnist": ((28, 28), 10)}
"""Input shape and classes of the campaign's datasets."""


def _measure(model: str, shape: list[int], classes: int, batch: int) -> dict[str, float]:
    import numpy as np
    import torch

    from fedhet.models.registry import MODELS
    from fedhet.training.flat import FlatModel
    from fedhet.training.local import LocalTrainer, SGDConfig, evaluate

    entry = MODELS.get(model)
    torch.manual_seed(0)
    net = entry.factory(tuple(shape), classes, entry.params())
    try:  # this checkout: the model's trait, as the engine builds it
        flat = FlatModel(net, channels_last=bool(entry.trait("channels_last", False)))
    except TypeError:  # the base checkout: no memory-format setting
        flat = FlatModel(net)
    n = 4096
    x, y = torch.rand(n, *shape), torch.randint(0, classes, (n,))
    trainer = LocalTrainer(flat, x, y)
    steps = 20
    batches = list(trainer.batches(torch.arange(n), batch, steps, np.random.default_rng(0)))
    trainer.sgd(flat.params.clone(), batches[:2], SGDConfig(0.01))  # warm-up
    evaluate(flat, flat.params, None, x[:512], y[:512])
    t0 = time.perf_counter()
    trainer.sgd(flat.params.clone(), batches, SGDConfig(0.01))
    train = steps * batch / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    evaluate(flat, flat.params, None, x, y)
    return {"train": train, "eval": n / (time.perf_counter() - t0)}


def worker() -> None:
    import torch

    torch.set_num_threads(1)
    for line in sys.stdin:
        print(json.dumps(_measure(**json.loads(line))), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base", required=False, default="")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    from fedhet.papers.campaign import TABLES
    from fedhet.papers.campaign.pricing import round_load
    from fedhet.papers.campaign.tables import first_stage

    here = Path(__file__).resolve().parents[1] / "src"
    sides = {"after": here}
    if args.base:
        sides["before"] = Path(args.base).resolve() / "src"
    procs = {
        k: subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"})
        for k, src in sides.items()
    }
    print("| table | model | samples trained / evaluated per round | side | train samples/s | "
          "eval samples/s | eval share of a round |")
    print("|---|---|---|---|---|---|---|")
    for t in TABLES:
        spec = first_stage(t, "paper")[0].settings
        w = round_load(spec)
        shape, classes = INPUT_SHAPES[str(spec.get("dataset", "mnist"))]
        job = {"model": w.model, "shape": list(shape), "classes": classes,
               "batch": int(spec.get("batch_size", 32))}
        got: dict[str, list[dict[str, float]]] = {k: [] for k in procs}
        for r in range(args.repeats):
            for k in (list(procs) if r % 2 == 0 else list(procs)[::-1]):
                procs[k].stdin.write(json.dumps(job) + "\n")
                procs[k].stdin.flush()
                got[k].append(json.loads(procs[k].stdout.readline()))
        for k in ("before", "after"):
            if k not in got:
                continue
            train = statistics.median(m["train"] for m in got[k])
            ev = statistics.median(m["eval"] for m in got[k])
            t_train, t_eval = w.trained / train, w.evaluated / ev
            print(f"| {t.key} | {w.model} | {w.trained:,.0f} / {w.evaluated:,.0f} | {k} | "
                  f"{train:,.0f} | {ev:,.0f} | {t_eval / (t_train + t_eval):.1%} |", flush=True)
    for p in procs.values():
        p.stdin.close()
        p.wait()


if __name__ == "__main__":
    main()
