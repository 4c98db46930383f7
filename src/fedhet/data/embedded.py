"""scikit-learn's `load_digits`: 1,797 real 8×8 digit images that ship with the package."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedhet.data.base import Dataset
from fedhet.data.registry import DATASETS
from fedhet.errors import FedhetError


@dataclass(frozen=True)
class DigitsParams:
    test_fraction: float = 0.25
    split_seed: int = 0

    def validate(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise FedhetError("dataset.test_fraction must be in (0, 1)")


@DATASETS.register("digits", DigitsParams, "scikit-learn digits, 8×8 images, 10 classes (embedded)",
                   default_model="mlp")
def load_digits(params: DigitsParams, data_dir: Path) -> Dataset:
    # slow import (scikit-learn): only when the digits are loaded
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=params.test_fraction, random_state=params.split_seed, stratify=y
    )
    return Dataset(
        "digits",
        torch.from_numpy(x_tr),
        torch.from_numpy(y_tr),
        torch.from_numpy(x_te),
        torch.from_numpy(y_te),
        num_classes=10,
    )
