"""bf16 against fp32: seconds per round and final accuracy of FedAvg, FedNova and SCAFFOLD.

FedNNNN's MNIST CNN (`cnn-fednnnn-mnist`), real MNIST (`DATA_DIR/mnist/mnist.pkl.gz`, see
benchmarks/bench_fedavg.py for fetching it), 10 clients, Dirichlet(0.5), B = 50, lr `--lr` (0.05),
`--steps` local steps, `--rounds` rounds, `--seeds` seeds, one torch thread, the sequential
executor. For every (algorithm, seed) the fp32 and the bf16 run go back to back (bf16 first
on odd seeds) so the machine's noise hits both; the table gives the median training seconds
per round (`round_time_s`, evaluation excluded) and the final test accuracy, mean ± spread
over the seeds.

`--control` adds a third run per (algorithm, seed): fp32 again, from the initial weights
rounded to bfloat16 and back. Its distance from the plain fp32 run is what a perturbation of
bf16's size does to that algorithm at these settings without any bf16 arithmetic in training;
where bf16's distance from fp32 is no larger, the accuracy change is the algorithm's sensitivity
to rounding, not a loss caused by bf16.

    python benchmarks/bench_precision.py [--rounds 20] [--seeds 3] [--steps 60] [--control]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of


def setting(algorithm: str, precision: str, seed: int, args, eval_every: int) -> dict:
    """The benchmark's run (module docstring), also `precision_sensitivity.py`'s."""
    return {
        "algorithm": algorithm, "dataset": "mnist", "model": "cnn-fednnnn-mnist",
        "partition": "dirichlet", "partition.alpha": 0.5, "clients": 10, "rounds": args.rounds,
        "local_steps": args.steps, "batch_size": 50, "lr": args.lr, "seed": seed,
        "eval_every": eval_every, "workers": 1, "executor": "sequential", "device": "cpu",
        "precision": precision, "data_dir": args.data_dir,
    }


def need_mnist(data_dir: str) -> None:
    if not (Path(data_dir) / "mnist" / "mnist.pkl.gz").exists():
        raise SystemExit(f"{data_dir}/mnist/mnist.pkl.gz missing (see benchmarks/bench_fedavg.py)")


def one_run(algorithm: str, precision: str, seed: int, args) -> tuple[float, float]:
    """Median training seconds per round and final test accuracy; `precision` `fp32-rounded`
    is fp32 from the initial weights rounded to bfloat16 (`--control`)."""
    rounded = precision == "fp32-rounded"
    precision = "fp32" if rounded else precision
    rows: list[dict] = []
    cfg = config_of(setting(algorithm, precision, seed, args, eval_every=args.rounds))
    sim = assemble(cfg, log=lambda _: None, callbacks=[lambda row: rows.append(dict(row))])
    if rounded:
        sim.w0 = sim.w0.to(torch.bfloat16).to(torch.float32)
    sim.run()
    return statistics.median(r["round_time_s"] for r in rows), rows[-1]["test_accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--algorithms", default="fedavg,fednova,scaffold")
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--control", action="store_true",
                    help="also fp32 from bf16-rounded initial weights (module docstring)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    need_mnist(args.data_dir)
    print(f"cnn-fednnnn-mnist, MNIST, 10 clients, {args.steps} steps × B = 50, lr {args.lr}, "
          f"{args.rounds} rounds, {args.seeds} seeds, one thread")
    control = " | fp32 from a bf16-rounded start − fp32 (per seed)" if args.control else ""
    print("| algorithm | fp32 s/round | bf16 s/round | speed-up | fp32 final acc | bf16 final acc | "
          f"bf16 − fp32 (per seed){control} |")
    print("|---|---|---|---|---|---|---|" + ("---|" if args.control else ""))
    for algorithm in args.algorithms.split(","):
        res: dict[str, list[tuple[float, float]]] = {"fp32": [], "bf16": [], "fp32-rounded": []}
        for seed in range(args.seeds):
            order = ("fp32", "bf16") if seed % 2 == 0 else ("bf16", "fp32")
            for precision in order + (("fp32-rounded",) if args.control else ()):
                res[precision].append(one_run(algorithm, precision, seed, args))
                print(f"  {algorithm} seed {seed} {precision}: {res[precision][-1]}", flush=True)
        t32 = statistics.median(t for t, _ in res["fp32"])
        t16 = statistics.median(t for t, _ in res["bf16"])
        a32 = [a for _, a in res["fp32"]]
        a16 = [a for _, a in res["bf16"]]
        diffs = ", ".join(f"{b - a:+.4f}" for a, b in zip(a32, a16, strict=True))
        if args.control:
            rounded = (a for _, a in res["fp32-rounded"])
            diffs += " | " + ", ".join(f"{b - a:+.4f}" for a, b in zip(a32, rounded, strict=True))
        print(f"| {algorithm} | {t32:.2f} | {t16:.2f} | {t32 / t16:.2f}× | "
              f"{statistics.mean(a32):.4f} ± {statistics.pstdev(a32):.4f} | "
              f"{statistics.mean(a16):.4f} ± {statistics.pstdev(a16):.4f} | {diffs} |", flush=True)


if __name__ == "__main__":
    main()
