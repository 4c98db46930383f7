"""Milliseconds per stacked local step (`CohortTrainer.sgd_many`), the stacked executor's unit.

Two figures per model and device:

- **host**: a step whose arithmetic is negligible, so the time is what the step costs to
  issue: Python, autograd and dispatch, index gathers, the chain's updates. It bounds how fast
  any stacked step can run, whatever the device. Measured on the model's miniature (`mini`:
  the same layers in the same order at the smallest input the model takes, every hidden layer
  at most `MINI_WIDTH` wide, units or channels, the classes kept: a few hundred parameters),
  1 and 4 rows, mini-batches of one sample; the full-size model's one-sample step (`B=1`
  columns) adds the arithmetic of its weights (the FedNNNN CNN's 431k-parameter gradient and
  two convolutions of 20 and 50 channels are not negligible on a CPU). MOON's models keep their
  widths (their projection head is what MOON's objective reads).
  Beside them, `eager PyTorch`: the miniature's step as a plain module and optimizer
  (`eager_ms`), the floor the layers' own kernels set on this device.
- **ops**: the ATen operations one such step dispatches (`torch.profiler`), the device-free
  measure of that cost (each is a kernel launch on a GPU);
- **per row**: steps at the papers' mini-batch (`B`) with 1, 8 and 32 rows stacked: the
  milliseconds of one step divided by the rows, i.e. what each stacked client costs; and the
  same step of one client on the sequential executor (`LocalTrainer.sgd`, eager PyTorch).

Random data of MNIST's shape; every figure is the median over `--repeats` timings of `--steps`
steps each, after one warm-up, in this process's CPU time on a CPU (`time.process_time`: what
other processes on a shared machine take is not counted) and in wall time on a GPU.
`--path both` times the stacked program and the general `torch.func` (vmap) path on the same
models in one run, so their ratio is measured under the same conditions. MOON's models
(`moon-mlp`, `moon-cnn`) step with MOON's objective (`ContrastiveLoss`, each row with frozen
global and previous models of its own), on the program through its rows form.

    python benchmarks/bench_step.py [--models mlp,cnn-fednnnn-mnist,cnn-mnist] [--device cpu]
        [--threads 1] [--steps 50] [--repeats 5] [--path auto|vmap|both] [--rows 1,8,32]
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.moon import ContrastiveLoss
from fedhet.models.moon import ProjectionNet
from fedhet.models.registry import MODELS, build_model
from fedhet.models.sequence import ImageView
from fedhet.training.allocator import keep_freed_memory
from fedhet.training.cohort import CohortTrainer, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.local import BatchSchedule, LocalTrainer
from fedhet.training.program import layer_sequence
from fedhet.training.steps import SGDConfig

PAPER_B = {"mlp": 50, "cnn-fednnnn-mnist": 50, "cnn-mnist": 50, "moon-mlp": 50, "moon-cnn": 50}
"""The mini-batch the papers use with each model (FedSR's MLP, FedNNNN's and BHerd's CNNs; MOON's
models as FedSR's MNIST runs)."""


def make(model_name: str, device: str, samples: int = 4096) -> tuple[CohortTrainer, FlatModel]:
    if device == "cpu":
        keep_freed_memory()  # as the engine does for clients on a CPU (assemble_clients)
    torch.manual_seed(0)
    module = build_model(model_name, (1, 28, 28), 10, MODELS.get(model_name).params()).to(device)
    flat = FlatModel(module, channels_last=bool(MODELS.get(model_name).trait("channels_last")))
    x = torch.rand(samples, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (samples,), device=device)
    return CohortTrainer(flat, x, y, log=lambda s: None), flat


MINI_WIDTH = 8
"""The widest hidden layer of a miniature (units of a linear layer, channels of a convolution)."""


class Narrow(nn.Module):
    """A sequence of layers (`net`) on samples viewed as `image` first (when not None)."""

    def __init__(self, steps: list[nn.Module], image: tuple[int, int, int] | None) -> None:
        super().__init__()
        self.image = image
        self.net = nn.Sequential(*steps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x if self.image is None else x.reshape(len(x), *self.image))

    def stacked_layers(self) -> list[nn.Module | ImageView]:
        return ([] if self.image is None else [ImageView(self.image)]) + [self.net]


def narrowed(module: nn.Module, sample: tuple[int, ...], width: int = MINI_WIDTH) -> nn.Module | None:
    """`module`'s layers in order with every hidden linear layer and convolution at most `width`
    wide (the last linear layer keeps its outputs, the classes), on samples of shape `sample`;
    None for a model that is not a plain sequence (`layer_sequence`) or that taps a part (MOON)."""
    steps = layer_sequence(module)
    if steps is None or callable(getattr(module, "stacked_tap", None)):
        return None
    last = max(k for k, s in enumerate(steps) if isinstance(s, nn.Linear))
    image = None
    out: list[nn.Module] = []
    h = torch.zeros(2, *sample)
    for k, step in enumerate(steps):
        if isinstance(step, ImageView):
            if k:
                return None
            image, h = step.shape, h.reshape(2, *step.shape)
            continue
        if isinstance(step, nn.Conv2d):
            if step.groups != 1:
                return None
            new: nn.Module = nn.Conv2d(h.shape[1], min(step.out_channels, width), step.kernel_size,
                                       step.stride, step.padding, step.dilation,
                                       bias=step.bias is not None)
        elif isinstance(step, nn.Linear):
            new = nn.Linear(h.shape[-1], step.out_features if k == last else min(step.out_features, width),
                            bias=step.bias is not None)
        else:
            new = copy.deepcopy(step)
        out.append(new)
        h = new(h)
    return Narrow(out, image)


def mini(model_name: str, device: str) -> tuple[CohortTrainer, FlatModel]:
    """The model's miniature (module doc): its layers `narrowed` on the smallest square input
    it builds and runs on, of 4, 8, …, 28 pixels."""
    spec = MODELS.get(model_name)
    fields = getattr(spec.params, "__dataclass_fields__", {})
    params = spec.params(hidden=8) if "hidden" in fields else spec.params()
    for side in (4, 8, 12, 16, 20, 24, 28):
        torch.manual_seed(0)
        try:
            module = build_model(model_name, (1, side, side), 10, params)
            with torch.no_grad():
                module(torch.rand(2, 1, side, side))
        except Exception:  # noqa: BLE001  (too small for this model: try a larger input)
            continue
        module = (narrowed(module, (1, side, side)) or module).to(device)
        flat = FlatModel(module, channels_last=bool(spec.trait("channels_last")))
        x = torch.rand(256, 1, side, side, device=device)
        y = torch.randint(0, 10, (256,), device=device)
        return CohortTrainer(flat, x, y, log=lambda s: None), flat
    raise SystemExit(f"{model_name}: no input of 4 to 28 pixels builds")


def _clock(cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def _schedule(n: int, batch: int, steps: int, seed: int) -> BatchSchedule:
    return BatchSchedule(torch.arange(n), batch, steps, np.random.default_rng(seed))


def _loss(flat: FlatModel, row: int) -> ContrastiveLoss | None:
    """MOON's objective for the MOON models (`moon-*`), with this row's own frozen global and
    previous models; None (the model's cross-entropy) for the others."""
    if not isinstance(flat.module, ProjectionNet):
        return None
    g = torch.Generator().manual_seed(row)
    glob = flat.params + 0.01 * torch.randn(flat.params.shape, generator=g).to(flat.params.device)
    prev = flat.params + 0.01 * torch.randn(flat.params.shape, generator=g).to(flat.params.device)
    return ContrastiveLoss(flat.layers, glob, prev, mu=1.0, temperature=0.5)


def time_steps(cohort: CohortTrainer, flat: FlatModel, rows: int, batch: int, steps: int,
               momentum: float = 0.0) -> float:
    """Seconds for `steps` stacked steps of `rows` clients at mini-batch `batch`."""
    n = len(cohort.y)
    cfg = SGDConfig(lr=0.01, momentum=momentum)
    jobs = [SGDJob(flat.params.clone(), _schedule(n, batch, steps, r), cfg, loss=_loss(flat, r))
            for r in range(rows)]
    cuda = cohort.x.is_cuda
    start = _clock(cuda)
    cohort.sgd_many(jobs)
    elapsed = _clock(cuda) - start
    errors = [j.error for j in jobs if j.error is not None]
    if errors:
        raise errors[0]
    return elapsed


def median_ms(cohort, flat, rows, batch, steps, repeats) -> float:
    time_steps(cohort, flat, rows, batch, 3)  # warm-up
    return statistics.median(time_steps(cohort, flat, rows, batch, steps) * 1000 / steps
                             for _ in range(repeats))


def ops_per_step(cohort: CohortTrainer, flat: FlatModel, rows: int, steps: int = 10) -> float:
    """ATen operations dispatched per stacked step (`torch.profiler`)."""
    from torch.profiler import ProfilerActivity, profile

    time_steps(cohort, flat, rows, 1, 2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        time_steps(cohort, flat, rows, 1, steps)
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / steps


def sequential_ms(cohort: CohortTrainer, flat: FlatModel, batch: int, steps: int, repeats: int) -> float:
    """One client's step on the sequential executor (`LocalTrainer.sgd`), for comparison."""
    trainer = LocalTrainer(flat, cohort.x, cohort.y)
    n = len(cohort.y)
    w0 = flat.params.clone()

    def once(k: int) -> float:
        start = _clock(cohort.x.is_cuda)
        trainer.sgd(w0, _schedule(n, batch, k, 0), SGDConfig(lr=0.01), loss_fn=_loss(flat, 0))
        return _clock(cohort.x.is_cuda) - start

    once(3)
    return statistics.median(once(steps) * 1000 / steps for _ in range(repeats))


def eager_ms(cohort: CohortTrainer, flat: FlatModel, steps: int, repeats: int) -> float:
    """The same step written as plain PyTorch: one `nn.Module` (a copy of the model), one
    sample, `cross_entropy(...).backward()` and `torch.optim.SGD`. On the miniature it is the
    floor PyTorch itself sets for these layers on this device, whatever a framework adds.
    NaN for MOON's models (their step carries MOON's objective, not this one)."""
    if isinstance(flat.module, ProjectionNet):
        return float("nan")
    module = copy.deepcopy(flat.module)
    x, y = cohort.x[:1], cohort.y[:1]
    if flat.channels_last and x.dim() == 4:
        module = module.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)

    def once(k: int) -> float:
        start = _clock(x.is_cuda)
        for _ in range(k):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(module(x), y).backward()
            opt.step()
        return _clock(x.is_cuda) - start

    once(3)
    return statistics.median(once(steps) * 1000 / steps for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mlp,cnn-fednnnn-mnist,cnn-mnist")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--path", choices=("auto", "vmap", "both"), default="both",
                    help="vmap: the general torch.func path even where the stacked program "
                    "applies; both: each model on both paths")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}, {args.threads} thread(s), "
          f"path {args.path}")
    print("| model | path | host ms/step, 1 row | host ms/step, 4 rows | host ms/step, eager PyTorch | "
          "ms/step, 1 row, B=1 | "
          "ms/step, 4 rows, B=1 | ops/step, 4 rows | " +
          " | ".join(f"ms/step/row, {r} rows" for r in rows) + " | ms/step, sequential |")
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(rows) + "---|")
    for model_name in args.models.split(","):
        for path in ("auto", "vmap") if args.path == "both" else (args.path,):
            cohort, flat = make(model_name, args.device)
            if path == "vmap":
                if cohort.program is None:
                    continue
                cohort.program = None
            used = "program" if cohort.program is not None else "vmap"
            small, small_flat = mini(model_name, args.device)
            if path == "vmap":
                small.program = None
            host = [median_ms(small, small_flat, r, 1, args.steps, args.repeats) for r in (1, 4)]
            eager = eager_ms(small, small_flat, args.steps, args.repeats)
            one = median_ms(cohort, flat, 1, 1, args.steps, args.repeats)
            four = median_ms(cohort, flat, 4, 1, args.steps, args.repeats)
            ops = ops_per_step(cohort, flat, 4)
            b = PAPER_B.get(model_name, 32)
            per_row = [median_ms(cohort, flat, r, b, max(5, args.steps // r), args.repeats) / r
                       for r in rows]
            seq = sequential_ms(cohort, flat, b, args.steps, args.repeats)
            print(f"| {model_name} (B={b}) | {used} | {host[0]:.2f} | {host[1]:.2f} | {eager:.2f} | "
                  f"{one:.2f} | {four:.2f} | {ops:.0f} | "
                  + " | ".join(f"{v:.2f}" for v in per_row) + f" | {seq:.2f} |", flush=True)

if __name__ == "__main__":
    main()
