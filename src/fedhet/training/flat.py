"""One model whose parameters and gradients live in two flat vectors.

Every `nn.Parameter` of the module is re-pointed to a slice of `FlatModel.params`, and its
`.grad` to a slice of `FlatModel.grad`, so loading a client's weights is one `copy_`, an SGD
step is one fused vector update, and the norms, dot products and Gram matrices of FedNNNN,
BHerd and FedVeca work on the flat vectors directly. Floating-point buffers (BatchNorm
running statistics) get the same treatment in `FlatModel.buffers`.

How the module computes travels with it: `channels_last` (a convolutional model's registry
trait) makes every 2-D convolution see its input in channels-last memory order, so oneDNN runs
the convolutions, ReLUs and poolings on NHWC blocks, several times faster on a CPU than NCHW
(benchmarks/RESULTS.md); the weights stay where they are, in the flat vector's order (a
convolution reorders its small weight itself), so the layout the algorithms see is unchanged
and only the float rounding of the passes differs. `precision` is the context the local passes
run in (`fedhet.training.precision`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from fedhet.training.precision import passes


@dataclass(frozen=True)
class Layer:
    """A named slice of the flat parameter vector (`kind` is `conv`, `fc`, `norm` or `other`)."""

    name: str
    start: int
    stop: int
    shape: tuple[int, ...]
    kind: str


def _kind(module: nn.Module) -> str:
    if isinstance(module, nn.modules.conv._ConvNd):
        return "conv"
    if isinstance(module, nn.Linear):
        return "fc"
    if isinstance(module, nn.modules.batchnorm._NormBase | nn.LayerNorm | nn.GroupNorm):
        return "norm"
    return "other"


def _channels_last(_module: nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook of a 2-D convolution: its input `(N, C, H, W)` in channels-last order.

    Written with views and a plain `contiguous()` so that it runs under `torch.func.vmap`
    (which refuses `contiguous(memory_format=...)`); a one-channel input gets channels-last
    strides by a view alone (`(N, H, W, 1)` permuted), as an `N1HW` tensor counts as contiguous
    in both orders and would otherwise keep the NCHW strides oneDNN reads its order from."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return None
    n, c, h, w = x.shape
    if c == 1:
        x = x.reshape(n, h, w, 1).permute(0, 3, 1, 2)
    else:
        x = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    return (x, *args[1:])


class FlatModel:
    """Owns `module` and exposes its parameters as `params` (a flat float32 vector).

    `channels_last`: run its 2-D convolutions on channels-last inputs (module docstring);
    `precision`: `fp32`, `bf16` or `tf32`, the context of the local passes (`passes`)."""

    def __init__(
        self, module: nn.Module, channels_last: bool = False, precision: str = "fp32"
    ) -> None:
        self.module = module
        self.channels_last = channels_last
        self.precision = precision
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        total = sum(p.numel() for _, p in named)
        device = named[0][1].device if named else torch.device("cpu")
        self.params = torch.empty(total, device=device)
        self.grad = torch.zeros(total, device=device)
        kinds = {name: _kind(m) for name, m in module.named_modules()}
        layers, offset = [], 0
        for name, p in named:
            n = p.numel()
            self.params[offset : offset + n].copy_(p.detach().flatten())
            p.data = self.params[offset : offset + n].view_as(p)
            p.grad = self.grad[offset : offset + n].view_as(p)
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            layers.append(Layer(name, offset, offset + n, tuple(p.shape), kinds.get(owner, "other")))
            offset += n
        self.layers: tuple[Layer, ...] = tuple(layers)
        bufs = [b for _, b in module.named_buffers() if b.is_floating_point()]
        self.buffers = torch.empty(sum(b.numel() for b in bufs), device=device)
        offset = 0
        for b in bufs:
            n = b.numel()
            self.buffers[offset : offset + n].copy_(b.flatten())
            b.data = self.buffers[offset : offset + n].view_as(b)
            offset += n
        self.passes: Callable[[], AbstractContextManager] = passes(precision, device)
        """`with model.passes(): loss = …`: the local forward (and loss) in `precision`."""
        if channels_last:
            for m in module.modules():
                if isinstance(m, nn.Conv2d):
                    m.register_forward_pre_hook(_channels_last)

    @property
    def dim(self) -> int:
        return self.params.numel()

    def load(self, params: torch.Tensor, buffers: torch.Tensor | None = None) -> None:
        self.params.copy_(params)
        if buffers is not None and buffers.numel():
            self.buffers.copy_(buffers)
