"""Samples per second of a CNN round on one CPU core: this checkout, another one, a bare loop.

The papers' CNN workloads, one round of FedAvg each (10 clients × `--steps` local steps ×
B = 50, random tensors of the dataset's shape, IID split, lr 0.01):

- `fednnnn`: FedNNNN's MNIST CNN (`cnn-fednnnn-mnist`, 28×28);
- `fedveca`: FedVeca/BHerd's MNIST CNN (`cnn-mnist`, 28×28);
- `fedsr`: FedSR's CIFAR CNN (`cnn-cifar`, 3×32×32).

Contestants, each a worker process of its own (one torch thread, `OMP_NUM_THREADS=1`) that
runs one round per request, so the machine's noise hits them alike: they alternate round by
round and the medians are compared (the first round of each is a warm-up and dropped):

- `fedhet`: this checkout's engine (sequential executor, fp32);
- `fedhet-bf16` (`--bf16`): the same with `precision=bf16`;
- `base`: the engine of another checkout (`--base DIR`, e.g. a worktree of `main`:
  `git worktree add --detach /tmp/perf-base main`), the same settings;
- `bare-cl`: a hand-written PyTorch loop over the same model in channels-last memory format
  (`model.to(memory_format=torch.channels_last)`, the data converted once), `torch.optim.SGD`,
  the same steps per client and batch size, averaging the clients' weights;
- `bare-cl-kept`: the channels-last loop in a process whose allocator keeps freed memory as
  fedhet's runs do (`fedhet.training.allocator.keep_freed_memory`), so that the engine's own
  cost shows apart from the allocator's (`bare-cl` runs under glibc's own thresholds, as a
  hand-written script does);
- `bare`: the same loop in the default (NCHW) memory format.
- `stacked` (`--stacked`): this checkout with the stacked executor.

    python benchmarks/bench_cnn.py --base /tmp/perf-base [--rounds 6] [--only fednnnn]
    python benchmarks/bench_cnn.py --bf16 --no-bare --only fednnnn   # bf16 against fp32

Each row also gives the median minor page faults of a round (the kernel zero-filling fresh
pages, `getrusage`), the cost `keep_freed_memory` removes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = {
    "fednnnn": ("cnn-fednnnn-mnist", (28, 28)),
    "fedveca": ("cnn-mnist", (28, 28)),
    "fedsr": ("cnn-cifar", (3, 32, 32)),
}
CLIENTS, BATCH, LR = 10, 50, 0.01


def _data(shape: tuple[int, ...], n: int):
    import torch

    g = torch.Generator().manual_seed(0)
    return (torch.rand(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g),
            torch.rand(500, *shape, generator=g), torch.randint(0, 10, (500,), generator=g))


def _engine_round(model: str, shape: tuple[int, ...], steps: int, executor: str, precision: str):
    """A function running one engine round (with the checkout on `sys.path`)."""
    from fedhet.data.base import Dataset
    from fedhet.engine.assembly import assemble
    from fedhet.engine.config import config_of
    from fedhet.engine.simulation import sample_clients

    x, y, xt, yt = _data(shape, CLIENTS * steps * BATCH)
    settings = {"algorithm": "fedavg", "model": model, "partition": "iid", "clients": CLIENTS,
                "rounds": 1000, "local_epochs": 1, "batch_size": BATCH, "lr": LR,
                "eval_every": 10_000, "workers": 1, "executor": executor, "device": "cpu"}
    if precision != "fp32":
        settings["precision"] = precision
    sim = assemble(config_of(settings), data=Dataset("random", x, y, xt, yt, 10), log=lambda _: None)
    state = [sim.side.algorithm.init(sim.w0), 0]

    def one() -> None:
        k = state[1]
        clients = sample_clients(sim.parts.loop, CLIENTS, k)
        state[0], _ = sim.parts.runner(sim.round_context(), state[0], k, clients)
        state[1] += 1

    return one


def _bare_round(model: str, shape: tuple[int, ...], steps: int, channels_last: bool):
    """A function running one round of the hand-written loop."""
    import torch
    from bench_fedavg import bare_round  # this folder (the worker runs this file)

    from fedhet.models.registry import build_model
    from fedhet.registry import NoParams

    x, y, _, _ = _data(shape, CLIENTS * steps * BATCH)
    torch.manual_seed(0)
    net = build_model(model, shape, 10, NoParams())
    image = net.image
    x = x.reshape(len(x), *image)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
        if image[0] == 1:  # an N1HW tensor keeps NCHW strides under contiguous(): restride it
            x = x.reshape(len(x), image[1], image[2], 1).permute(0, 3, 1, 2)
    w_global = [p.detach().clone() for p in net.parameters()]
    gen = torch.Generator().manual_seed(0)
    per = steps * BATCH
    clients = [torch.arange(c * per, (c + 1) * per) for c in range(CLIENTS)]

    def one() -> None:  # equal clients of `steps` batches: FedAvg's average is the plain mean
        avg = bare_round(net, x, y, clients, w_global, LR, BATCH, gen)
        for g, a in zip(w_global, avg, strict=True):
            g.copy_(a)

    return one


def worker(spec: dict) -> None:
    """Serve rounds: one line in, one line out (`{"s": seconds}`), until stdin closes."""
    import torch

    torch.set_num_threads(1)
    model, shape = WORKLOADS[spec["workload"]]
    kind = spec["kind"]
    if kind == "bare-cl-kept":
        from fedhet.training.allocator import keep_freed_memory

        keep_freed_memory()
    if kind.startswith("bare"):
        one = _bare_round(model, shape, spec["steps"], kind.startswith("bare-cl"))
    else:
        one = _engine_round(model, shape, spec["steps"], spec["executor"], spec["precision"])
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        one()
        s = time.perf_counter() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        print(json.dumps({"s": s, "faults": faults}), flush=True)


class Contestant:
    def __init__(self, name: str, src: Path, spec: dict) -> None:
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.times: list[float] = []
        self.faults: list[int] = []

    def ready(self) -> None:
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"{self.name}: the worker failed to start")

    def round(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"{self.name}: the worker died")
        got = json.loads(line)
        self.times.append(got["s"])
        self.faults.append(got["faults"])
        return got["s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--base", default="", help="another checkout to compare (its src/ is used)")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds per contestant (+1 warm-up)")
    ap.add_argument("--steps", type=int, default=60, help="local steps per client")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--bf16", action="store_true", help="also time this checkout in bf16")
    ap.add_argument("--no-bare", action="store_true", help="skip both bare loops and the base")
    ap.add_argument("--stacked", action="store_true", help="also time the stacked executor")
    ap.add_argument("--no-bare-nchw", action="store_true", help="skip the NCHW bare loop")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    here = Path(__file__).resolve().parents[1] / "src"
    samples = CLIENTS * args.steps * BATCH
    print(f"one CPU thread per contestant; {CLIENTS} clients × {args.steps} steps × B = {BATCH} "
          f"= {samples} samples per round; medians of {args.rounds} alternating rounds")
    print("| workload | model | contestant | s/round | samples/s | faults/round | vs base | vs bare-cl "
          "| vs bare-cl-kept |")
    print("|---|---|---|---|---|---|---|---|---|")
    for wl in args.only.split(","):
        spec = {"workload": wl, "steps": args.steps, "executor": "sequential", "precision": "fp32"}
        runners = [Contestant("fedhet", here, {**spec, "kind": "engine"})]
        if args.bf16:
            runners.append(Contestant("fedhet-bf16", here, {**spec, "kind": "engine", "precision": "bf16"}))
        if args.base and not args.no_bare:
            runners.append(Contestant("base", Path(args.base).resolve() / "src", {**spec, "kind": "engine"}))
        if not args.no_bare:
            runners.append(Contestant("bare-cl", here, {**spec, "kind": "bare-cl"}))
            runners.append(Contestant("bare-cl-kept", here, {**spec, "kind": "bare-cl-kept"}))
        if not (args.no_bare_nchw or args.no_bare):
            runners.append(Contestant("bare", here, {**spec, "kind": "bare"}))
        if args.stacked:
            runners.append(Contestant("stacked", here, {**spec, "kind": "engine", "executor": "stacked"}))
        for r in runners:
            r.ready()
        for k in range(args.rounds + 1):
            for r in runners if k % 2 == 0 else reversed(runners):
                r.round()
        med = {r.name: statistics.median(r.times[1:]) for r in runners}
        faults = {r.name: statistics.median(r.faults[1:]) for r in runners}
        for r in runners:
            r.close()
        for r in runners:
            m = med[r.name]
            vs_base = f"{med['base'] / m:.2f}×" if "base" in med else "–"
            vs_bare = f"{med['bare-cl'] / m:.2f}×" if "bare-cl" in med else "–"
            vs_kept = f"{med['bare-cl-kept'] / m:.2f}×" if "bare-cl-kept" in med else "–"
            print(f"| {wl} | {WORKLOADS[wl][0]} | {r.name} | {m:.3f} | {samples / m:,.0f} | "
                  f"{faults[r.name]:,.0f} | {vs_base} | {vs_bare} | {vs_kept} |", flush=True)


if __name__ == "__main__":
    main()
