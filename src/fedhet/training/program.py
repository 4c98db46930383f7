"""A stacked program: a model's forward for `R` rows of weights as a few stacked operations.

The general stacked gradient (`CohortTrainer.gradients`) maps `grad(functional_call(...))` over
the rows with `torch.func.vmap`: every operation of the forward and backward goes through
vmap's batching rules, a few hundred dispatches a step whatever the arithmetic. A model whose
forward is a plain sequence of known layers needs none of that. `StackedProgram.of(model)`
reads the sequence (`layer_sequence`) and runs it for the stack `w` of shape `(R, d)` with one
operation per layer, the rows kept apart by the operations themselves:

- `Linear` (`y = W x + b` per row) is one stacked matmul, `baddbmm(b, W, x)` over
  feature-major `(R, in, B)` activations (so each weight's gradient comes out in its own
  layout and goes into the rows' gradient vector as one plain copy);
- `Conv2d` is one grouped convolution: the rows' activations lie side by side as channels,
  `(B, R·C, H, W)` (channels-last where the model asks for it), and the rows' kernels
  `(R·C_out, C_in, k, k)` with `groups = R·groups`, so row `r` sees only its own channels;
- element-wise activations and pooling apply as they are (they act per channel);
- `Flatten` moves the image activations to `(R, C·H·W, B)` in the model's own (C, H, W) order.

The loss is the model's cross-entropy (a model with a `loss` or `predict` of its own is not a
program), the mean over each row's mini-batch, or a replacement objective with a rows form
(`StackableLoss.on_program`: MOON's `CE + μ ℓ_con`) reading the representation the model taps
(`stacked_tap`, e.g. MOON's projection `z`, returned by `forward_tapped` beside the logits);
the rows' losses are summed and differentiated once by autograd, which gives each row the
gradient of its own loss, since no row's loss depends on another row's weights:
`∂(Σ_r ℓ_r)/∂w_r = ∂ℓ_r/∂w_r`.

A sequence is what the module's forward does when `layer_sequence` can read it: an
`nn.Sequential` of known layers, or a module that lists its steps in `stacked_layers()` (the
seeds' MLP and convolutional networks do; `ImageView` stands for a reshape of each sample).
`StackedProgram.of` then checks the program against the module's own forward on two samples
and keeps it only if they agree; anything else (BatchNorm, dropout, a custom loss, a layer
not listed here) returns None and the executor uses the general vmap path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from fedhet.models.sequence import ImageView
from fedhet.training.flat import FlatModel
from fedhet.training.losses import StackableLoss

ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity)
"""Parameter-free layers that act on each value alone: they apply to any stacked layout."""
CHANNELWISE = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
"""Parameter-free layers that act on each channel's image alone: they apply to the stacked
`(B, R·C, H, W)` layout as they are."""

Step = nn.Module | ImageView


def layer_sequence(module: nn.Module) -> list[Step] | None:
    """The steps `module`'s forward takes, in order, or None when they cannot be read: an
    `nn.Sequential` is its children's sequences; a module with `stacked_layers()` lists its own
    steps (each a layer, an `nn.Sequential` or an `ImageView`); a layer is itself."""
    if isinstance(module, nn.Sequential):
        steps: list[Step] = []
        for child in module:
            inner = layer_sequence(child)
            if inner is None:
                return None
            steps += inner
        return steps
    listed = getattr(module, "stacked_layers", None)
    if callable(listed):
        steps = []
        for part in listed():
            inner = [part] if isinstance(part, ImageView) else layer_sequence(part)
            if inner is None:
                return None
            steps += inner
        return steps
    if isinstance(module, (nn.Linear, nn.Conv2d, nn.Flatten, *ELEMENTWISE, *CHANNELWISE)):
        return [module]
    return None


@dataclass(frozen=True)
class _Op:
    kind: str
    """`linear`, `conv`, `pointwise` (element- or channel-wise), `flatten` or `image`."""
    module: nn.Module | None = None
    weight: int = -1
    """Index of the weight among the model's parameter layers (`FlatModel.layers`)."""
    bias: int = -1
    image: tuple[int, int, int] = (0, 0, 0)


def _tap(module: nn.Module, steps: list[Step]) -> int | None:
    """The number of leading steps whose output is the part `module.stacked_tap()` names
    (`fedhet.models.sequence`), or None when it names none of the sequence's parts."""
    named = getattr(module, "stacked_tap", None)
    if not callable(named):
        return None
    part = layer_sequence(named())
    if not part:
        return None
    last = next((k for k, step in enumerate(steps) if step is part[-1]), None)
    return None if last is None else last + 1


class StackedProgram:
    """The stacked forward and gradient of a sequence of known layers (module docstring)."""

    def __init__(self, model: FlatModel, ops: list[_Op], tap: int | None = None) -> None:
        self.model = model
        self.ops = ops
        self.tap = tap
        """How many ops give the model's tapped representation (`stacked_tap`), or None."""
        self.slices = [(layer.start, layer.stop, layer.shape) for layer in model.layers]
        self.starts_on_images = ops[0].kind == "conv" or (
            ops[0].kind == "pointwise" and isinstance(ops[0].module, CHANNELWISE))
        """The first layer takes images: samples `(C, H, W)` go in as `(B, R·C, H, W)`."""
        self.image_input = self.starts_on_images or ops[0].kind == "image"
        """The samples are gathered batch-first, `(B, R, *sample)` (`gather`)."""
        self.channels_last = model.channels_last

    @classmethod
    def of(cls, model: FlatModel, sample_shape: Sequence[int]) -> StackedProgram | None:
        """The program of `model`, or None when its forward is not a sequence of known layers
        (module docstring), it trains with its own loss, it holds buffers (BatchNorm), or the
        program disagrees with the module's forward on a probe of two samples."""
        module = model.module
        if getattr(module, "loss", None) is not None or getattr(module, "predict", None) is not None \
                or model.buffers.numel():
            return None
        steps = layer_sequence(module)
        if not steps:
            return None
        names = {id(m): n for n, m in module.named_modules()}
        index = {layer.name: k for k, layer in enumerate(model.layers)}
        ops: list[_Op] = []
        used: set[int] = set()
        for step in steps:
            if isinstance(step, ImageView):
                ops.append(_Op("image", image=step.shape))
                continue
            if isinstance(step, nn.Linear | nn.Conv2d):
                if isinstance(step, nn.Conv2d) and step.padding_mode != "zeros":
                    return None
                prefix = names.get(id(step))
                w = index.get(f"{prefix}.weight" if prefix else "weight", -1)
                b = index.get(f"{prefix}.bias" if prefix else "bias", -1)
                if w < 0 or (step.bias is not None and b < 0):
                    return None
                used |= {w, b} - {-1}
                ops.append(_Op("linear" if isinstance(step, nn.Linear) else "conv", step, w, b))
            elif isinstance(step, nn.Flatten):
                if step.start_dim != 1 or step.end_dim != -1:
                    return None
                ops.append(_Op("flatten"))
            else:
                ops.append(_Op("pointwise", step))
        if used != set(range(len(model.layers))):
            return None  # a parameter the sequence does not use: not the module's forward
        program = cls(model, ops, _tap(module, steps))
        return program if program._agrees(sample_shape) else None

    # -- the forward ---------------------------------------------------------------------
    def forward(self, leaves: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Logits `(R, K, B)` of the rows' weights `leaves` (one `(R, *shape)` tensor per
        parameter layer) on their own samples `x`: `(B, R, *sample)` when the program starts
        on images (`image_input`), else `(R, B, *sample)`."""
        return self.forward_tapped(leaves, x)[0]

    def forward_tapped(
        self, leaves: Sequence[torch.Tensor], x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward`'s logits and the tapped representation `(R, F, B)` (the output of the
        module's `stacked_tap()` part; None without one).

        Activations are images `(B, R·C, H, W)` or feature-major vectors `(R, F, B)`: a linear
        layer is then `W x + b` per row (`baddbmm`), whose weight gradient `∂ℓ/∂y xᵀ` comes out
        in the weight's own `(out, in)` order, row after row."""
        rows = leaves[0].shape[0] if leaves else 1
        size = x.shape[0] if self.image_input else x.shape[1]
        if self.starts_on_images:
            h, mode = self._as_image(x.reshape(size, rows * x.shape[2], *x.shape[3:])), "image"
        elif self.image_input:
            h, mode = x, "samples"  # (B, R, *sample), until the image view
        else:
            h, mode = x.reshape(rows, size, -1).transpose(1, 2), "vectors"
        tapped = None
        for k, op in enumerate(self.ops):
            if k == self.tap:
                assert mode == "vectors"
                tapped = h
            if op.kind == "image":
                c, hh, ww = op.image
                if mode == "vectors":  # (R, F, B) → (B, R, F)
                    h = h.permute(2, 0, 1)
                h, mode = self._as_image(h.reshape(size, rows * c, hh, ww)), "image"
            elif op.kind == "conv":
                m = op.module
                assert isinstance(m, nn.Conv2d) and mode == "image"
                weight = leaves[op.weight]
                bias = leaves[op.bias].reshape(-1) if op.bias >= 0 else None
                h = F.conv2d(h, weight.reshape(-1, *weight.shape[2:]), bias, m.stride, m.padding,
                             m.dilation, m.groups * rows)
            elif op.kind == "pointwise":
                assert op.module is not None
                assert mode == "image" or not isinstance(op.module, CHANNELWISE)
                h = op.module(h)
            elif op.kind == "flatten":
                if mode != "vectors":  # (B, R·C, H, W) → (R, C·H·W, B), each row's (C, H, W) order
                    h, mode = h.reshape(size, rows, -1).permute(1, 2, 0), "vectors"
            else:  # linear: W x + b per row
                assert mode == "vectors"
                weight = leaves[op.weight]
                if op.bias >= 0:
                    h = torch.baddbmm(leaves[op.bias].unsqueeze(2), weight, h)
                else:
                    h = torch.bmm(weight, h)
        assert mode == "vectors"
        return h, (h if self.tap == len(self.ops) else tapped)

    def _as_image(self, h: torch.Tensor) -> torch.Tensor:
        """`h` in channels-last order where the model asks for it, with channels-last strides
        even where one channel makes both orders contiguous (`to`, not `contiguous`, which
        would keep the NCHW strides there): oneDNN and cuDNN pick a convolution's output order
        from its input's strides, so a first layer of one input channel would otherwise hand
        every later layer NCHW activations."""
        return h.to(memory_format=torch.channels_last) if self.channels_last else h

    def leaves(self, w: torch.Tensor) -> list[torch.Tensor]:
        """The per-layer views `(R, *shape)` of the stack `w` `(R, d)`."""
        rows = w.shape[0]
        return [w[:, a:b].view(rows, *shape) for a, b, shape in self.slices]

    def gather(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """The rows' samples for index batches `batch` `(R, B)`, in the program's input layout."""
        return x[batch.t()] if self.image_input else x[batch]

    # -- the gradient --------------------------------------------------------------------
    def runs(self, loss: StackableLoss) -> bool:
        """Whether a replacement objective runs on this program: it has a rows form
        (`StackableLoss.on_program`) and the model taps the representation it reads."""
        return loss.on_program and self.tap is not None

    def gradients(
        self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch: torch.Tensor,
        loss: StackableLoss | None = None, frozen: tuple[torch.Tensor, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mini-batch gradients `(R, d)` and losses `(R,)` (float32) of the stacked weights `w`
        on index batches `batch` `(R, B)`: `∇ℓ_r(w_r)`, `ℓ_r = (1/B) Σ_j CE(f(w_r; x_rj), y_rj)`;
        with `loss` (where `runs(loss)`), its objective `loss.rows_loss` instead, whose targets
        come from the rows' `frozen` stacks `(R, d)` (`loss.rows_targets`, no gradient)."""
        rows, size = batch.shape
        leaves = [t.detach().requires_grad_() for t in self.leaves(w)]
        samples, labels = self.gather(x, batch), y[batch]
        with torch.enable_grad(), self.model.passes():
            if loss is None:
                logits = self.forward(leaves, samples)  # (R, K, B)
                losses = F.cross_entropy(logits, labels, reduction="none").mean(dim=1)
            else:
                with torch.no_grad():
                    targets = loss.rows_targets(partial(self._represent, samples), *frozen)
                logits, tapped = self.forward_tapped(leaves, samples)
                assert tapped is not None
                losses = loss.rows_loss(logits, tapped, labels, targets)
        grads = torch.autograd.grad(losses.sum(), leaves)
        return torch.cat([layer.reshape(rows, -1) for layer in grads], dim=1), losses.detach().float()

    def _represent(self, samples: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The tapped representation `(R, F, B)` of the stack `w` `(R, d)` on `samples`."""
        tapped = self.forward_tapped(self.leaves(w), samples)[1]
        assert tapped is not None
        return tapped

    def scores(
        self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed cross-entropy `(R,)` and number correct `(R,)` of each row's model on the
        same samples `(x, y)` (an evaluation: no gradient, float32)."""
        rows = w.shape[0]
        shared = x.unsqueeze(1).expand(len(x), rows, *x.shape[1:]) if self.image_input \
            else x.unsqueeze(0).expand(rows, *x.shape)
        logits = self.forward(self.leaves(w), shared)  # (R, K, B)
        loss = F.cross_entropy(logits, y.expand(rows, len(y)), reduction="none").sum(dim=1)
        return loss, (logits.argmax(dim=1) == y).sum(dim=1)

    def _agrees(self, sample_shape: Sequence[int]) -> bool:
        """Whether the program's logits equal the module's forward on a random probe of two
        samples (the model's own weights as a stack of one, float32; torch's random state is
        left alone)."""
        module = self.model.module
        params = self.model.params
        probe = torch.rand(2, *sample_shape, generator=torch.Generator().manual_seed(0))
        probe = probe.to(params.device)  # drawn on the CPU from its own generator: no global state
        with torch.no_grad():
            was_training = module.training
            module.train()
            try:
                expected = module(probe)
                x = probe.unsqueeze(1) if self.image_input else probe.unsqueeze(0)
                got = self.forward(self.leaves(params.unsqueeze(0)), x)
            except (RuntimeError, ValueError, TypeError, AssertionError):
                return False
            finally:
                module.train(was_training)
        if got.dim() != 3 or got.shape[0] != 1 or got[0].t().shape != expected.shape:
            return False
        return bool(torch.allclose(got[0].t(), expected, rtol=1e-4, atol=1e-5))


__all__ = ["CHANNELWISE", "ELEMENTWISE", "StackedProgram", "layer_sequence"]
