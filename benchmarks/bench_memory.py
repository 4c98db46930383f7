"""Peak resident memory of a round with many clients (the streaming-aggregation check).

    python benchmarks/bench_memory.py --algorithm scaffold --clients 1000 --rounds 2

digits, iid, FedSR's MLP (55,210 parameters), one local step of batch 2 per client, so the
memory is that of the messages and client states, not of training. Prints the peak RSS before
the run (data, model, imports) and after it.
"""

from __future__ import annotations

import argparse
import resource
import time

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    settings = {
        "algorithm": args.algorithm, "dataset": "digits", "partition": "iid",
        "clients": args.clients, "rounds": args.rounds, "local_steps": 1, "batch_size": 2,
        "model": "mlp", "eval_every": args.rounds, "workers": 1,  # this process's RSS is all of it
    }
    cfg = config_of(settings, "bench_memory")
    sim = assemble(cfg, store=None, log=lambda _: None)
    before = peak_mb()
    start = time.perf_counter()
    sim.run()
    print(f"{args.algorithm}, {args.clients} clients, d={sim.side.model.dim}: peak RSS {before:.0f} MB "
          f"before the run, {peak_mb():.0f} MB after ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
