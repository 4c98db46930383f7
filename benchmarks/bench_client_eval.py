"""Per-client evaluation: one pass over every client's held-out share against a loop of
per-client evaluations (`fedhet.engine.client_eval`).

    python benchmarks/bench_client_eval.py --model mlp --clients 1000
    python benchmarks/bench_client_eval.py --model cnn-mnist --clients 100

Assembles FedAvg on `--dataset` (default MNIST, which must be in `data/`; `digits` works
offline) over `--clients` Dirichlet clients with `client_eval_fraction` 0.2, checks that both
ways give every client the same accuracy, and prints the best of `--repeats` seconds of each,
beside one evaluation of the test set.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import fedhet
from fedhet.engine.client_eval import client_accuracies
from fedhet.training.local import evaluate


def best_of(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = fedhet.config_of({"algorithm": "fedavg", "dataset": args.dataset, "model": args.model,
                            "clients": args.clients, "rounds": 1, "client_eval_fraction": 0.2})
    sim = fedhet.assemble(cfg, log=lambda _: None)
    side, held = sim.side, sim.parts.evaluator.held_out
    assert held is not None
    w, x, y = side.model.params.clone(), side.data.x_train, side.data.y_train

    def one_pass() -> dict[int, float]:
        return client_accuracies(side.model, w, sim.buffers, x, y, held)

    def loop() -> dict[int, float]:
        out = {}
        for client, share in zip(held.clients, [s for s in side.held_out if len(s)], strict=True):
            rows = torch.from_numpy(share)
            out[client] = evaluate(side.model, w, sim.buffers, x[rows], y[rows])[1]
        return out

    a, b = one_pass(), loop()
    assert all(abs(a[c] - b[c]) < 1e-12 for c in a), "the two ways disagree"
    print(f"{args.model} on {args.dataset}: {len(held.indices)} held-out samples, "
          f"{len(held.clients)} clients")
    one, many = best_of(one_pass, args.repeats), best_of(loop, args.repeats)
    test = best_of(lambda: evaluate(side.model, w, sim.buffers, side.data.x_test,
                                    side.data.y_test), args.repeats)
    print(f"one pass {one:.3f} s, loop {many:.3f} s ({many / one:.2f}x); "
          f"test set ({len(side.data.y_test)}) {test:.3f} s")


if __name__ == "__main__":
    main()
