"""Synthetic(α, β), the FedProx generator used in FedNova's logistic-regression experiment.

docs/spec.md: 60 features, 10 classes, `n_k = ⌊LogNormal(4, 2)⌋ + 50` samples for user k,
`u_k ~ N(0, α)`, `B_k ~ N(0, β)`, `W_k, b_k ~ N(u_k, 1)`, `v_k ~ N(B_k, 1)`,
`x ~ N(v_k, diag(j^(−1.2)))`, `y = argmax(softmax(W_k x + b_k))`. α and β are standard
deviations. Each user is one client (the natural partition); each user's samples are split
into train and test by `test_fraction`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.data.base import Dataset
from fedhet.data.registry import DATASETS
from fedhet.errors import FedhetError


@dataclass(frozen=True)
class SyntheticParams:
    alpha: float = 1.0
    beta: float = 1.0
    users: int = 30
    features: int = 60
    classes: int = 10
    test_fraction: float = 0.2
    max_samples: int = 0
    """Cap on samples per user (0: no cap); LogNormal(4, 2) has a heavy tail."""
    seed: int = 0

    def validate(self) -> None:
        if self.alpha < 0 or self.beta < 0:
            raise FedhetError("dataset.alpha and dataset.beta must be ≥ 0 (standard deviations)")
        if self.users < 1:
            raise FedhetError("dataset.users must be ≥ 1")
        if not 0.0 < self.test_fraction < 1.0:
            raise FedhetError("dataset.test_fraction must be in (0, 1)")
        if self.max_samples < 0:
            raise FedhetError("dataset.max_samples must be ≥ 0")


def generate_users(p: SyntheticParams) -> list[tuple[np.ndarray, np.ndarray]]:
    """One `(x, y)` pair per user, drawn as the module docstring says."""
    rng = np.random.default_rng(p.seed)
    sizes = rng.lognormal(4, 2, p.users).astype(np.int64) + 50
    if p.max_samples:
        sizes = np.minimum(sizes, p.max_samples)
    cov_diag = np.arange(1, p.features + 1, dtype=np.float64) ** -1.2
    users = []
    for n_k in sizes:
        u_k = rng.normal(0, p.alpha)
        b_shift = rng.normal(0, p.beta)
        W = rng.normal(u_k, 1, (p.classes, p.features))
        b = rng.normal(u_k, 1, p.classes)
        v = rng.normal(b_shift, 1, p.features)
        x = rng.normal(v, np.sqrt(cov_diag), (int(n_k), p.features))
        y = np.argmax(x @ W.T + b, axis=1)
        users.append((x.astype(np.float32), y.astype(np.int64)))
    return users


@DATASETS.register("synthetic", SyntheticParams, "Synthetic(α, β) of FedProx; one client per user",
                   default_model="logreg")
def load_synthetic(params: SyntheticParams, data_dir: Path) -> Dataset:
    users = generate_users(params)
    rng = np.random.default_rng(params.seed + 1)
    xs_tr, ys_tr, xs_te, ys_te, parts = [], [], [], [], []
    offset = 0
    for x, y in users:
        perm = rng.permutation(len(y))
        n_test = max(1, int(round(params.test_fraction * len(y))))
        te, tr = perm[:n_test], perm[n_test:]
        xs_tr.append(x[tr])
        ys_tr.append(y[tr])
        xs_te.append(x[te])
        ys_te.append(y[te])
        parts.append(np.arange(offset, offset + len(tr)))
        offset += len(tr)
    return Dataset(
        f"synthetic({params.alpha:g},{params.beta:g})",
        torch.from_numpy(np.concatenate(xs_tr)),
        torch.from_numpy(np.concatenate(ys_tr)),
        torch.from_numpy(np.concatenate(xs_te)),
        torch.from_numpy(np.concatenate(ys_te)),
        num_classes=params.classes,
        natural_partition=parts,
    )
