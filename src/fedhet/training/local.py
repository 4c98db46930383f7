"""Local computation on one client: mini-batch streams, gradients, SGD, full gradients.

`LocalTrainer` is built once per worker around one `FlatModel` and the dataset tensors; a
client is only an index array into those tensors (docs/design.md). The SGD loop follows docs/spec.md:
`w^(λ+1) = w^λ − η d^λ`, where `d^λ` is the mini-batch gradient `g^λ` at the current local model
after the chain of `fedhet.training.steps` (weight decay, the algorithm's transforms such as
FedProx's proximal term or SCAFFOLD's correction, heavy-ball momentum in PyTorch's convention
`v ← ρ v + g`, `d = v`). The stacked cohort (`fedhet.training.cohort`) runs the same chain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from fedhet.models.registry import objective, predictions
from fedhet.training.flat import FlatModel
from fedhet.training.steps import GradTransform, LocalStep, SGDConfig, Transform

LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
"""`(module, x, y) -> loss`: replaces `objective(module, module(x), y)` for one mini-batch
(MOON's `CE + μ ℓ_con`). Must return a scalar that can be back-propagated."""

StepHook = Callable[[int, torch.Tensor, torch.Tensor, float], None]
"""`(step, w, g, loss)`: sees the local model and the gradient of each step after weight decay
and the algorithm's transforms, before momentum and the step. `w` and `g` are live buffers:
clone what you keep."""


def stream_seed(*keys: int) -> np.random.Generator:
    """A random stream determined by `keys` alone (seed, round, client, purpose).

    Negative keys (the "whole run" round `-1`, the sampler's `-2`) map to their 64-bit two's
    complement, which `SeedSequence` accepts and no non-negative key below `2**63` can equal."""
    return np.random.default_rng(
        np.random.SeedSequence([int(k) if k >= 0 else (1 << 64) + int(k) for k in keys])
    )


class BatchSchedule(Iterator[torch.Tensor]):
    """`steps` mini-batches of `b = min(batch_size, n)` of the `n` indices `indices`, epoch by
    epoch: an iterator of `(b,)` index tensors, and all of them at once as one `(steps, b)`
    table (`table`), which the stacked executor uploads to the device once a round instead of
    one batch a step.

    `order="reshuffle"` draws a new permutation of the `n` positions from `rng` each epoch;
    `"fixed"` draws one and repeats it every epoch (the non-RR protocol of BHerd §2.8). A
    trailing partial batch is dropped, matching `τ = ⌊E·D_i/B⌋`. The table is drawn on first
    use (a client without samples fails there, as its first mini-batch would)."""

    def __init__(self, indices: torch.Tensor, batch_size: int, steps: int,
                 rng: np.random.Generator, order: str = "reshuffle") -> None:
        self.indices = indices
        self.batch_size = batch_size
        self.steps = steps
        self.rng = rng
        self.order = order
        self.position = 0
        """Batches handed out by iteration so far."""
        self._table: torch.Tensor | None = None

    def table(self) -> torch.Tensor:
        """Every batch of the schedule, `(steps, b)` (drawn once, then kept)."""
        if self._table is None:
            n = len(self.indices)
            b = min(self.batch_size, n)
            per_epoch = n // b
            epochs = []
            made = 0
            perm = self.rng.permutation(n)
            while made < self.steps:
                k = min(per_epoch, self.steps - made)
                epochs.append(perm[: k * b].reshape(k, b))
                made += k
                if self.order == "reshuffle":
                    perm = self.rng.permutation(n)
            positions = np.concatenate(epochs) if epochs else np.zeros((0, b), dtype=np.int64)
            self._table = self.indices[torch.from_numpy(positions)]
        return self._table

    def __iter__(self) -> BatchSchedule:
        return self

    def __next__(self) -> torch.Tensor:
        if self.position >= self.steps:
            raise StopIteration
        batch = self.table()[self.position]
        self.position += 1
        return batch

    def __len__(self) -> int:
        return self.steps - self.position


class LocalTrainer:
    """Trains the shared `FlatModel` on index subsets of `(x, y)`."""

    def __init__(self, model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model = model
        self.x = x
        self.y = y

    # -- data -----------------------------------------------------------------------------
    def batches(
        self, indices: torch.Tensor, batch_size: int, steps: int, rng: np.random.Generator,
        order: str = "reshuffle",
    ) -> BatchSchedule:
        """`steps` mini-batches of `min(batch_size, n)` indices, walking epochs of `indices`
        (`BatchSchedule`)."""
        return BatchSchedule(indices, batch_size, steps, rng, order)

    # -- gradients ------------------------------------------------------------------------
    def gradient(
        self, batch: torch.Tensor, loss_fn: LossFn | None = None
    ) -> tuple[torch.Tensor, float]:
        """Gradient at the model's current parameters, written into `model.grad` (live).

        `loss_fn(module, x, y)` replaces the model's own objective when given. The forward and
        loss run in the model's precision (`FlatModel.passes`); the gradient lands in float32."""
        module = self.model.module
        self.model.grad.zero_()
        x, y = self.x[batch], self.y[batch]
        with self.model.passes():
            loss = loss_fn(module, x, y) if loss_fn is not None else objective(module, module(x), y)
        loss.backward()
        return self.model.grad, float(loss.detach())

    def full_gradient(
        self, params: torch.Tensor, indices: torch.Tensor, chunk: int = 1024,
        max_batches: int = 0,
    ) -> torch.Tensor:
        """`∇F_i(w) = (1/D_i) Σ_j ∇f(w; x_j)` over `indices` in chunks (exact, sample-weighted).

        `max_batches > 0` stops after that many chunks (a subsampled estimate). BatchNorm runs
        in eval mode so the pass leaves the running statistics alone.
        """
        model = self.model
        saved = model.params.clone()
        model.params.copy_(params)
        was_training = model.module.training
        model.module.eval()
        total = torch.zeros_like(model.params)
        seen = 0
        for j, start in enumerate(range(0, len(indices), chunk)):
            if max_batches and j >= max_batches:
                break
            batch = indices[start : start + chunk]
            g, _ = self.gradient(batch)
            total.add_(g, alpha=len(batch))
            seen += len(batch)
        model.module.train(was_training)
        model.params.copy_(saved)
        return total.div_(max(seen, 1))

    # -- SGD ------------------------------------------------------------------------------
    def sgd(
        self, w0: torch.Tensor, batches: Iterable[torch.Tensor], cfg: SGDConfig,
        transforms: Sequence[Transform | GradTransform] = (), on_step: StepHook | None = None,
        loss_fn: LossFn | None = None,
    ) -> tuple[torch.Tensor, int, float]:
        """Run SGD from `w0` over `batches`; return `(w_final, steps, mean_loss)`.

        Each step is `LocalStep.of(cfg, transforms)` (`fedhet.training.steps`): weight decay,
        `transforms` in order, `on_step`, momentum, `w ← w − η d`. `loss_fn` (optional)
        replaces the model's objective on every mini-batch."""
        model = self.model
        model.params.copy_(w0)
        model.module.train()
        w = model.params
        chain = LocalStep.of(cfg, transforms)
        v = chain.init(w)
        steps, loss_sum = 0, 0.0
        for batch in batches:
            g, loss = self.gradient(batch, loss_fn)
            g = chain.gradient(g, w, steps)
            if on_step is not None:
                on_step(steps, w, g, loss)
            chain.update(w, g, v)
            steps += 1
            loss_sum += loss
        return w.clone(), steps, loss_sum / max(steps, 1)


EVAL_BATCH = {"cpu": 256, "cuda": 8192}
"""**[choice]** Samples per evaluation forward. On a CPU a batch whose activations stay near
the cache is fastest (the paper CNNs in channels-last, one core: 128–256 ran 1.3–2× faster than
2,048–10,000, benchmarks/RESULTS.md); on a GPU the largest batch that keeps memory modest: 8,192 MNIST/CIFAR
images need at most ~3 GB of activations for the paper CNNs, a whole MNIST test set in two
forwards. Other devices use the CUDA value."""


def eval_batch(device: torch.device) -> int:
    """`EVAL_BATCH` for `device` (the CUDA value for any device but a CPU)."""
    return EVAL_BATCH.get(device.type, EVAL_BATCH["cuda"])


def evaluate(
    model: FlatModel, params: torch.Tensor, buffers: torch.Tensor | None,
    x: torch.Tensor, y: torch.Tensor, batch: int | None = None,
) -> tuple[float, float]:
    """Mean loss and accuracy of `params` on `(x, y)`, BatchNorm in eval mode.

    Runs under `torch.inference_mode` in float32 whatever the training precision (metrics
    stay comparable across precisions), in the model's memory format (`FlatModel`), and keeps
    its sums on the device (float64 loss, as the per-batch Python sum it replaces) so a GPU
    synchronises once per call, not once per batch. `batch`: samples per forward (None:
    `EVAL_BATCH` for `x`'s device)."""
    batch = batch or eval_batch(x.device)
    model.load(params, buffers)
    module = model.module
    module.eval()
    with torch.inference_mode():
        loss_sum = torch.zeros((), dtype=torch.float64, device=y.device)
        correct = torch.zeros((), dtype=torch.int64, device=y.device)
        for start in range(0, len(y), batch):
            xb, yb = x[start : start + batch], y[start : start + batch]
            out = module(xb)
            loss_sum += objective(module, out, yb).double() * len(yb)
            correct += (predictions(module, out) == yb).sum()
    module.train()
    return float(loss_sum) / len(y), int(correct) / len(y)
