"""10,000 stateful clients: peak memory and seconds per round against 100 clients.

    OMP_NUM_THREADS=1 nice python benchmarks/bench_clients.py --rounds 100

SCAFFOLD (a control variate `c_i` of model size per client), FedSR's MLP (`model=mlp`, 199,210
parameters on MNIST) on MNIST (`data/mnist/mnist.pkl.gz`, docs/DATA), iid, 100 clients a round
with a fixed number of local steps, written to a run directory (a checkpoint every round).
Two runs, each in a fresh process so that its peak RSS is its own:

- `--clients` (10,000) with `sample_fraction = per_round / clients`: every client's state
  would be 0.8 MB, 8 GB for all; the store keeps `client_state_memory_mb` resident;
- `--per-round` (100) clients, all sampled every round: the same work a round.

Prints a Markdown table: the start (building the run: loading MNIST, partitioning), seconds per
round (the run's wall time over its rounds, checkpoints included), peak RSS, the states spilled
and read back, and the state files on disk at the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    """This process's CPU seconds so far (user + system): a measure of the work that the other
    jobs of a shared machine do not stretch, as they stretch the wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process; its figures."""
    from fedhet.engine.assembly import assemble
    from fedhet.engine.client_store import CLIENT_STATES
    from fedhet.engine.config import config_of
    from fedhet.rundir.store import RunStore

    settings: dict[str, Any] = {
        "algorithm": "scaffold", "dataset": "mnist", "model": "mlp", "partition": "iid",
        "clients": args.clients, "sample_fraction": min(1.0, args.per_round / args.clients),
        "rounds": args.rounds, "local_steps": args.local_steps, "batch_size": args.batch_size,
        "lr": 0.05, "device": "cpu", "executor": "sequential", "workers": 1,
        "data_dir": args.data_dir,
    }
    if args.memory_mb is not None:
        settings["client_state_memory_mb"] = args.memory_mb
    out = Path(tempfile.mkdtemp(prefix="bench-clients-", dir=args.tmp))
    try:
        start = time.perf_counter()
        sim = assemble(config_of(settings, "bench_clients"), store=RunStore(out), log=lambda _: None)
        built = time.perf_counter() - start
        rows: list[dict[str, Any]] = []
        sim.callbacks.append(rows.append)
        cpu = _cpu_s()
        summary = sim.run()
        cpu = _cpu_s() - cpu
        kept = sim.side.clients.states
        files = list((out / CLIENT_STATES).iterdir()) if (out / CLIENT_STATES).is_dir() else []
        return {
            "clients": args.clients, "per_round": args.per_round, "rounds": args.rounds,
            "start_s": built, "s_per_round": rows[-1]["wall_time_s"] / args.rounds,
            "cpu_s_per_round": cpu / args.rounds,
            "peak_rss_mb": peak_mb(), "clients_with_state": len(kept),
            "resident_mb": kept.resident_bytes / 2**20, "spills": kept.spills, "loads": kept.loads,
            "files": len(files), "files_mb": sum(p.stat().st_size for p in files) / 2**20,
            "final_accuracy": summary["final_accuracy"],
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--memory-mb", type=float, default=None,
                        help="client_state_memory_mb (default: the engine's)")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--tmp", default=None, help="where the run directories go")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    results = []
    for clients in (args.clients, args.per_round):
        cmd = [sys.executable, __file__, "--one", "--clients", str(clients),
               "--per-round", str(args.per_round), "--rounds", str(args.rounds),
               "--local-steps", str(args.local_steps), "--batch-size", str(args.batch_size),
               "--data-dir", args.data_dir]
        cmd += ["--memory-mb", str(args.memory_mb)] if args.memory_mb is not None else []
        cmd += ["--tmp", args.tmp] if args.tmp else []
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"# {results[-1]}", file=sys.stderr)
    print("| clients | a round | start s | s/round | CPU s/round | peak RSS MB | with state "
          "| resident MB | spilled | read back | files (MB) | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['clients']:,} | {r['per_round']} | {r['start_s']:.1f} | {r['s_per_round']:.2f} "
              f"| {r['cpu_s_per_round']:.2f} "
              f"| {r['peak_rss_mb']:.0f} | {r['clients_with_state']:,} | {r['resident_mb']:.0f} "
              f"| {r['spills']:,} | {r['loads']:,} | {r['files']:,} ({r['files_mb']:.0f}) "
              f"| {r['final_accuracy']:.4f} |")
    wall = results[0]["s_per_round"] / results[1]["s_per_round"]
    cpu = results[0]["cpu_s_per_round"] / results[1]["cpu_s_per_round"]
    print(f"\nper round, {args.clients:,} clients / {args.per_round}: {wall:.2f}× the wall time, "
          f"{cpu:.2f}× the CPU time")


if __name__ == "__main__":
    main()
