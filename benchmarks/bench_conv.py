"""A stacked convolution two ways: one grouped convolution against im2col + one stacked matmul.

The stacked program (`fedhet.training.program`) runs a convolution for `R` rows of weights as
one grouped convolution: the rows' activations side by side as channels, `(B, R·C, H, W)`,
their kernels `(R·O, C, k, k)`, `groups = R`. The other way is im2col: unfold each row's
patches, `(R, C·k·k, B·L)`, and multiply by the row's kernel matrix `(R, O, C·k·k)` in one
stacked matmul (`bmm`). Which is faster depends on the device's kernels (a grouped convolution
may run as `R` small ones; im2col writes the patches out), so it is measured, not assumed.

For each convolution of the models (`--models`; shapes read from a forward pass on one
sample) and each row count, this times the forward and backward of both (the weight and, past
the first layer, the input gradient), channels-last and not for the grouped one, at the
papers' mini-batch. CPU time on a CPU (this process only), wall time on a GPU; median of
`--repeats`.

    python benchmarks/bench_conv.py [--models cnn-fednnnn-mnist,cnn-mnist] [--device cpu]
        [--rows 1,8,32] [--batch 50] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedhet.models.registry import MODELS, build_model

Conv = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


Shape = tuple[int, int, int, int, int, bool]
"""`(C_in, C_out, k, padding, H, first)` of a convolution (`first`: it sees the data, so no
input gradient)."""


def conv_shapes(model_name: str) -> list[Shape]:
    """The `Shape` of each convolution of the model on a 28×28 sample."""
    module = build_model(model_name, (1, 28, 28), 10, MODELS.get(model_name).params())
    shapes: list[Shape] = []

    def record(layer: nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        assert isinstance(layer, nn.Conv2d)
        pad = layer.padding if isinstance(layer.padding, tuple) else (0,)
        shapes.append((layer.in_channels, layer.out_channels, layer.kernel_size[0], int(pad[0]),
                       inputs[0].shape[-1], not shapes))

    hooks = [m.register_forward_hook(record) for m in module.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        module(torch.rand(1, 1, 28, 28))
    for h in hooks:
        h.remove()
    return shapes


def grouped(channels_last: bool, pad: int = 0) -> Conv:
    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        rows = w.shape[0]  # x: (B, R·C, H, W)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.conv2d(x, w.reshape(-1, *w.shape[2:]), b.reshape(-1), padding=pad, groups=rows)
    return run


def im2col(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, pad: int = 0) -> torch.Tensor:
    """The same convolution as `grouped` from the same `(B, R·C, H, W)` activations, back in
    that layout: unfold, one `baddbmm` per stack, fold the rows back as channels."""
    rows, out_c, in_c, k, _ = w.shape
    size, _, h, _ = x.shape
    cols = F.unfold(x, k, padding=pad)  # (B, R·C·k·k, L)
    side = h + 2 * pad - k + 1
    cols = cols.view(size, rows, in_c * k * k, side * side).permute(1, 2, 0, 3)
    y = torch.baddbmm(b.unsqueeze(2), w.reshape(rows, out_c, -1),
                      cols.reshape(rows, in_c * k * k, size * side * side))
    return y.view(rows, out_c, size, side, side).permute(2, 0, 1, 3, 4).reshape(
        size, rows * out_c, side, side)


def time_conv(way: str, rows: int, batch: int, shape: Shape, device: str, repeats: int) -> float:
    in_c, out_c, k, pad, h, first = shape
    conv: Conv = {"grouped, channels-last": grouped(True, pad), "grouped": grouped(False, pad),
                  "im2col": lambda x, w, b: im2col(x, w, b, pad)}[way]
    d = out_c * in_c * k * k
    stack = torch.randn(rows, d + out_c + 3, device=device) * 0.05  # rows of a wider stack
    x0 = torch.randn(batch, rows * in_c, h, h, device=device)
    cuda = device.startswith("cuda")

    def once() -> float:
        w = stack[:, :d].view(rows, out_c, in_c, k, k).detach().requires_grad_()
        b = stack[:, d:d + out_c].detach().requires_grad_()
        x = x0 if first else x0.detach().requires_grad_()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter() if cuda else time.process_time()
        y = conv(x, w, b)
        torch.autograd.grad(y.square().sum(), [w, b] if first else [w, b, x])
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() if cuda else time.process_time()) - start

    for _ in range(3):
        once()
    return statistics.median(once() for _ in range(repeats)) * 1000


def check_equal(device: str) -> None:
    """im2col gives the grouped convolution's output (before any timing is trusted)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 4, 2, 5, 5, generator=g).to(device)
    b = torch.randn(3, 4, generator=g).to(device)
    x = torch.randn(2, 6, 12, 12, generator=g).to(device)
    if not all(torch.allclose(im2col(x, w, b, p), grouped(False, p)(x, w, b), rtol=1e-4, atol=1e-4)
               for p in (0, 2)):
        raise SystemExit("im2col disagrees with the grouped convolution")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn-fednnnn-mnist,cnn-mnist")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    check_equal(args.device)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}, {args.threads} thread(s), "
          f"B={args.batch}, forward + backward, ms")
    ways = ("grouped, channels-last", "grouped", "im2col")
    print("| model | convolution | rows | " + " | ".join(ways) + " |")
    print("|---|---|---|" + "---|" * len(ways))
    for model_name in args.models.split(","):
        for shape in conv_shapes(model_name):
            in_c, out_c, k, pad, h, _ = shape
            for rows in (int(r) for r in args.rows.split(",")):
                ms = [time_conv(way, rows, args.batch, shape, args.device, args.repeats)
                      for way in ways]
                print(f"| {model_name} | {in_c}→{out_c}, {k}×{k} pad {pad} on {h}×{h} | {rows} | "
                      + " | ".join(f"{v:.2f}" for v in ms) + " |", flush=True)


if __name__ == "__main__":
    main()
