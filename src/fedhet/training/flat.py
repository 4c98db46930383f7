"""One model whose parameters and gradients live in two flat vectors.

Every `nn.Parameter` of the module is re-pointed to a slice of `FlatModel.params`, and its
`.grad` to a slice of `FlatModel.grad`, so loading a client's weights is one `copy_`, an SGD
step is one fused vector update, and the norms, dot products and Gram matrices of FedNNNN,
BHerd and FedVeca work on the flat vectors directly. Floating-point buffers (BatchNorm
running statistics) get the same treatment in `FlatModel.buffers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


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


class FlatModel:
    """Owns `module` and exposes its parameters as `params` (a flat float32 vector)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
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

    @property
    def dim(self) -> int:
        return self.params.numel()

    def load(self, params: torch.Tensor, buffers: torch.Tensor | None = None) -> None:
        self.params.copy_(params)
        if buffers is not None and buffers.numel():
            self.buffers.copy_(buffers)
