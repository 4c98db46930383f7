"""Per-client evaluation: the global model scored on every client's held-out share at once.

With `client_eval_fraction > 0` each client holds a share of its partition out
(`fedhet.data.split.hold_out_per_client`). Every `client_eval_every` rounds (and at the last
round) the global model `w_k` is scored on all shares in one pass: the shares' indices are
concatenated client by client (`HeldOut`), the model's outputs on them are computed in
evaluation-sized batches (`model_outputs`), and client `i`'s accuracy is the segment sum

    acc_i = (1 / h_i) Σ_{j ∈ share_i} 1[ŷ_j = y_j]

(`torch.index_add_` over each sample's client position), not a loop of small evaluations. The
metrics row gets the statistics of `acc_i` over the clients (`fedhet.metrics.
client_statistics`: mean, std, worst and best decile), and the same for each of the run's
`metrics`, scored on each client's share of the same predictions.

With `client_eval_finetune_steps = k > 0`, each client with a share also fine-tunes the global
model for `k` local SGD steps on its own training samples and is scored on its share
(`personalised_scores`): the personalised accuracy `pacc_i` after `k` local steps, written as
`client_pacc_mean`, `_std`, `_worst10`, `_best10`.

The passes here run one model at a time in this process, also when the stacked executor stacks
the test-set evaluation of several runs (`SharedCohort.evaluate_many`): per-client evaluation
and the extra `metrics` are scored unstacked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from fedhet.metrics import Metric, client_statistics
from fedhet.models.registry import predictions
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig, eval_batch, stream_seed

FINETUNE_STREAM = 41
"""Random-stream purpose of a client's fine-tuning batches (0–13, 31, 37 and 100·p are
taken)."""


@dataclass(frozen=True)
class HeldOut:
    """The clients' held-out shares as one index array, client by client."""

    indices: torch.Tensor
    """`(n,)` indices into the training set: the shares of `clients`, one after another."""
    segments: torch.Tensor
    """`(n,)` each sample's position in `clients`."""
    clients: tuple[int, ...]
    """The clients that hold a share (a client of one sample holds none), in client order."""
    counts: np.ndarray
    """`(m,)` the size `h_i` of each of their shares."""

    @classmethod
    def of(cls, shares: Sequence[np.ndarray], device: torch.device) -> HeldOut | None:
        """The shares of `federate` (one array per client; None when there are none)."""
        kept = [(i, np.asarray(s, dtype=np.int64)) for i, s in enumerate(shares) if len(s)]
        if not kept:
            return None
        counts = np.array([len(s) for _, s in kept], dtype=np.int64)
        indices = torch.from_numpy(np.concatenate([s for _, s in kept])).to(device)
        segments = torch.repeat_interleave(torch.arange(len(kept)), torch.from_numpy(counts))
        return cls(indices, segments.to(device), tuple(i for i, _ in kept), counts)

    def split(self, values: np.ndarray) -> list[np.ndarray]:
        """`values` (one per held-out sample, in `indices` order) cut into the clients' shares."""
        return np.split(values, np.cumsum(self.counts)[:-1])


def model_outputs(
    model: FlatModel, params: torch.Tensor, buffers: torch.Tensor | None, x: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The model's float32 outputs at `params` (BatchNorm statistics `buffers`, eval mode) on
    `x`, or on `x[rows]`, in batches of `eval_batch` samples, as `evaluate` runs its passes."""
    n = len(x) if rows is None else len(rows)
    batch = eval_batch(x.device)
    model.load(params, buffers)
    module = model.module
    module.eval()
    outs = []
    with torch.inference_mode():
        for start in range(0, n, batch):
            xb = x[start : start + batch] if rows is None else x[rows[start : start + batch]]
            outs.append(module(xb).float())
    module.train()
    return torch.cat(outs)


def scored(model: FlatModel, outputs: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """The predicted labels (`predictions`, on the outputs' device) and the scores a metric
    with `scores=True` receives, as NumPy: class probabilities `softmax(outputs)` of shape
    `(n, C)`, or the raw output `(n,)` of a one-output model."""
    pred = predictions(model.module, outputs)
    if outputs.ndim == 2 and outputs.shape[1] > 1:
        scores = F.softmax(outputs.double(), dim=1)
    else:
        scores = outputs.double().reshape(len(outputs))
    return pred, scores.cpu().numpy()


def test_metrics(
    model: FlatModel, params: torch.Tensor, buffers: torch.Tensor | None, x: torch.Tensor,
    y: torch.Tensor, metrics: Sequence[Metric],
) -> dict[str, float]:
    """`test_<name>` of each of `metrics` on `(x, y)`."""
    pred, scores = scored(model, model_outputs(model, params, buffers, x))
    labels, predicted = y.cpu().numpy(), pred.cpu().numpy()
    return {f"test_{m.name}": m(labels, predicted, scores) for m in metrics}


def client_scores(
    model: FlatModel, params: torch.Tensor, buffers: torch.Tensor | None, x: torch.Tensor,
    y: torch.Tensor, held: HeldOut, metrics: Sequence[Metric] = (),
) -> dict[str, float]:
    """The statistics over clients of each client's accuracy on its share (module docstring),
    then of each of `metrics`: `client_acc_mean`, …, `client_<name>_mean`, …"""
    pred, scores = scored(model, model_outputs(model, params, buffers, x, held.indices))
    labels = y[held.indices]
    row = client_statistics(_accuracies(pred, labels, held), "client_acc")
    if metrics:
        ys, preds, ss = (held.split(a) for a in (labels.cpu().numpy(), pred.cpu().numpy(), scores))
        for m in metrics:
            values = [m(yi, pi, si) for yi, pi, si in zip(ys, preds, ss, strict=True)]
            row.update(client_statistics(values, f"client_{m.name}"))
    return row


@dataclass(frozen=True)
class FineTune:
    """How each client fine-tunes the global model before its personalised score."""

    trainer: LocalTrainer
    client_indices: Sequence[torch.Tensor]
    """Each client's training indices (what it trains on in the run)."""
    steps: int
    """`k`, the local SGD steps."""
    batch_size: int
    seed: int


def personalised_scores(
    model: FlatModel, params: torch.Tensor, buffers: torch.Tensor | None, x: torch.Tensor,
    y: torch.Tensor, held: HeldOut, tune: FineTune, sgd: SGDConfig, round: int,
) -> dict[str, float]:
    """`client_pacc_*`: the statistics over clients of `pacc_i`, client `i`'s accuracy on its
    share after `tune.steps` local SGD steps from `params` (the BatchNorm statistics `buffers`
    updated by those steps, as a client's own training updates them) on its training samples,
    in mini-batches of `tune.batch_size` drawn from the stream `(seed, round, i, 41)`
    **[choice]**: plain SGD with the round's client step `sgd` (η, momentum, weight decay),
    whatever the algorithm adds to its local steps."""
    shares = held.split(np.arange(len(held.indices)))
    accuracies = []
    for client, rows in zip(held.clients, shares, strict=True):
        rng = stream_seed(tune.seed, round, client, FINETUNE_STREAM)
        torch.default_generator.manual_seed(int(rng.integers(2**62)))
        model.load(params, buffers)
        batches = tune.trainer.batches(tune.client_indices[client], tune.batch_size, tune.steps, rng)
        w, _, _ = tune.trainer.sgd(params, batches, sgd)
        share = held.indices[torch.from_numpy(rows).to(held.indices.device)]
        pred, _ = scored(model, model_outputs(model, w, None, x, share))
        accuracies.append(float((pred == y[share]).double().mean()))
    return client_statistics(accuracies, "client_pacc")


def client_accuracies(
    model: FlatModel, params: torch.Tensor, buffers: torch.Tensor | None, x: torch.Tensor,
    y: torch.Tensor, held: HeldOut,
) -> dict[int, float]:
    """Each client's accuracy on its own share, by client id (what `client_scores` condenses)."""
    pred, _ = scored(model, model_outputs(model, params, buffers, x, held.indices))
    return dict(zip(held.clients, _accuracies(pred, y[held.indices], held).tolist(), strict=True))


def _accuracies(pred: torch.Tensor, labels: torch.Tensor, held: HeldOut) -> np.ndarray:
    """`acc_i` of each client of `held`: the segment sums of the correct predictions over
    `h_i` (module docstring)."""
    correct = (pred == labels).to(torch.float64)
    sums = torch.zeros(len(held.clients), dtype=torch.float64, device=correct.device)
    sums.index_add_(0, held.segments, correct)
    return sums.cpu().numpy() / held.counts


__all__ = ["FINETUNE_STREAM", "FineTune", "HeldOut", "client_accuracies", "client_scores",
           "model_outputs", "personalised_scores", "scored", "test_metrics"]
