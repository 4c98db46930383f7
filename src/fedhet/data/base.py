"""The in-memory dataset every layer above works on.

A dataset is loaded once into tensors; a client is an index array into `x_train`/`y_train`
(docs/design.md, "Engine habits"). No per-client copies are made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Dataset:
    """Train and test tensors plus what a model needs to know about them.

    `x_*` are float32 with shape `(n, *input_shape)`; `y_*` are int64 class ids in
    `[0, num_classes)`. Binary tasks (MNIST even/odd) use classes {0, 1}; the squared SVM maps
    them to ±1 itself. `natural_partition` is set by generators whose samples already belong to
    users (Synthetic(α, β)); it lists each user's train indices.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    natural_partition: list[np.ndarray] | None = None
    meta: dict = field(default_factory=dict)
    partition_labels: np.ndarray | None = None
    """Train labels the partitioners split on, when they differ from the targets: MNIST
    even/odd is partitioned by digit, so FedVeca/BHerd's Cases 2 and 3 give each client one
    digit (Case 2) and half the digits IID (Case 3) **[choice]**."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def train_labels(self) -> np.ndarray:
        return self.y_train.numpy()

    @property
    def split_labels(self) -> np.ndarray:
        """The labels partitioners use (`partition_labels`, else the train targets)."""
        return self.partition_labels if self.partition_labels is not None else self.train_labels

    @property
    def split_classes(self) -> int:
        return int(self.split_labels.max()) + 1 if self.partition_labels is not None else self.num_classes

    def __post_init__(self) -> None:
        if self.x_train.shape[0] != self.y_train.shape[0]:
            raise ValueError("x_train and y_train differ in length")
        if self.x_test.shape[0] != self.y_test.shape[0]:
            raise ValueError("x_test and y_test differ in length")
