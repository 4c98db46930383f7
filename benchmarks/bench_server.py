"""Milliseconds and ATen operations of one round boundary: a server's `aggregate` over `m`
client replies, each reply's vectors summed one at a time or in stacked blocks
(`fedhet.algorithms.base.WeightedMean`).

Two sizes per algorithm:

- **host**: vectors of 64 values, so the time is what the aggregate costs to issue (Python and
  one dispatch per operation; each operation is a kernel launch on a GPU);
- **model**: vectors of the FedNNNN CNN's 431,080 parameters (`--dim`), the papers' size.

Modes: `one-by-one` (`WeightedMean.block_bytes = 0`: each reply added to the float64 sum as
it comes, two operations a vector; what a CPU runs, `WeightedMean.blocks_on_cpu`), `blocks`
(the accelerator's default: replies stacked and summed by one matrix–vector product per block
of `WeightedMean.block_bytes`, 64 MiB), and `blocks-16MiB` (blocks a quarter as large, the
alternative the choice was measured against). Random replies; the
median over `--repeats` timings after one warm-up, in this process's CPU time on a CPU (other
processes on a shared machine are not counted) and in wall time on a GPU.

    python benchmarks/bench_server.py [--algorithms fedavg,fednnnn,scaffold,fednova,bherd]
        [--clients 100] [--dim 431080] [--device cpu] [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from fedhet.algorithms.base import ALGORITHMS, Message, Reply, RunInfo, WeightedMean
from fedhet.training.allocator import keep_freed_memory
from fedhet.training.flat import Layer

MODES = {"one-by-one": 0, "blocks": WeightedMean.block_bytes, "blocks-16MiB": 16 << 20}


def replies(m: int, d: int, device: str) -> list[Reply]:
    """`m` replies carrying every vector the servers read, of `d` values each."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(m):
        tensors = {k: torch.randn(d, generator=g).to(device) for k in ("delta", "delta_c", "d", "G")}
        tensors["kept"] = torch.tensor([0, 1], dtype=torch.int32, device=device)
        scalars = {"num_samples": float(100 + i), "steps": 60.0, "train_loss": 1.0, "a": 59.0,
                   "lr": 0.01, "kept_steps": 30.0, "herd_dist": 0.5, "loss_sum": 3.0}
        out.append(Reply(i, Message(tensors, scalars)))
    return out


def server(name: str, m: int, d: int, device: str):
    half = d // 2
    layers = (Layer("conv.weight", 0, half, (half,), "conv"),
              Layer("fc.weight", half, d, (d - half,), "fc"))
    run = RunInfo(num_clients=m, rounds=10, lr=0.01, momentum=0.0, weight_decay=0.0, seed=0,
                  dim=d, layers=layers)
    algorithm = ALGORITHMS.get(name).factory(ALGORITHMS.params(name, {}), run)
    return algorithm, algorithm.init(torch.zeros(d, device=device))


def clock(cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def measure(name: str, m: int, d: int, device: str, repeats: int) -> dict[str, tuple[float, float]]:
    """`{mode: (milliseconds, ATen operations)}` of one aggregate."""
    from torch.profiler import ProfilerActivity, profile

    algorithm, state = server(name, m, d, device)
    given = replies(m, d, device)
    cuda = device.startswith("cuda")
    out = {}
    WeightedMean.blocks_on_cpu = True  # measure the blocks on a CPU too (off in runs there)
    for mode, block in MODES.items():
        WeightedMean.block_bytes = block
        algorithm.aggregate(state, 0, iter(given))  # warm-up
        times = []
        for _ in range(repeats):
            start = clock(cuda)
            algorithm.aggregate(state, 0, iter(given))
            times.append(clock(cuda) - start)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            algorithm.aggregate(state, 0, iter(given))
        ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
        out[mode] = (statistics.median(times) * 1000, ops)
    WeightedMean.block_bytes = MODES["blocks"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", default="fedavg,fednnnn,scaffold,fednova,bherd")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--dim", type=int, default=431_080)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cpu":
        keep_freed_memory()  # as the engine does when clients train on the CPU
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}, {args.threads} thread(s), "
          f"{args.clients} replies")
    columns = [f"{m} ms" for m in MODES] + [f"{m} ops" for m in MODES]
    print("| algorithm | size | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * 2 * len(MODES))
    for algo in args.algorithms.split(","):
        for size, d in (("host (d=64)", 64), (f"model (d={args.dim:,})", args.dim)):
            r = measure(algo, args.clients, d, args.device, args.repeats)
            print(f"| {algo} | {size} | " + " | ".join(f"{r[m][0]:.2f}" for m in MODES) + " | "
                  + " | ".join(f"{r[m][1]:.0f}" for m in MODES) + " |", flush=True)


if __name__ == "__main__":
    main()
