"""How far a bf16-sized perturbation moves an fp32 run: is a bf16 change noise or a loss?

Runs `--algorithm` in fp32 from the initial weights `w0 ⊙ (1 + rel·ε)`, ε ~ N(0, 1) drawn with
each of `--draws` seeds (`rel` 0.004 ≈ bfloat16's relative rounding), then once in bf16 from the
unperturbed start, and prints each run's test accuracy per round and the server control
variate's norm `‖c‖` at the end (SCAFFOLD; 0 for the others). The setting is
`benchmarks/bench_precision.py`'s (FedNNNN's MNIST CNN, real MNIST, 10 clients,
Dirichlet(0.5), B = 50), one thread, the sequential executor. benchmarks/RESULTS.md
("Mixed precision") reads SCAFFOLD's spread at lr 0.05 and 0.02 with it:

    python benchmarks/precision_sensitivity.py --algorithm scaffold --seed 2 --lr 0.05
"""

from __future__ import annotations

import argparse

import torch
from bench_precision import need_mnist, setting  # this folder: `python benchmarks/...`

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of


def one_run(args: argparse.Namespace, precision: str, draw: int | None) -> str:
    cfg = config_of(setting(args.algorithm, precision, args.seed, args, eval_every=1))
    rows: list[dict] = []
    sim = assemble(cfg, log=lambda _: None, callbacks=[lambda row: rows.append(dict(row))])
    if draw is not None:
        g = torch.Generator().manual_seed(draw)
        sim.w0 = sim.w0 * (1 + args.rel * torch.randn(sim.w0.shape, generator=g))
    sim.run()
    curve = " ".join(f"{r['test_accuracy']:.3f}" for r in rows)
    return f"{curve}  ‖c‖ {rows[-1].get('c_norm', 0.0):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algorithm", default="scaffold")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--rel", type=float, default=0.004)
    ap.add_argument("--data-dir", default="data")
    args = ap.parse_args()
    torch.set_num_threads(1)
    need_mnist(args.data_dir)
    print(f"{args.algorithm}, seed {args.seed}, lr {args.lr}, {args.rounds} rounds × {args.steps} "
          f"steps; test accuracy per round")
    print(f"fp32           {one_run(args, 'fp32', None)}", flush=True)
    for draw in range(1, args.draws + 1):
        print(f"fp32 draw {draw}    {one_run(args, 'fp32', draw)}", flush=True)
    print(f"bf16           {one_run(args, 'bf16', None)}", flush=True)


if __name__ == "__main__":
    main()
