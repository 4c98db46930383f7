"""`RunConfig`: everything one run needs, resolved and validated before any work starts.

Top-level fields are the engine's; `algorithm_params`, `dataset_params`, `partition_params`
and `model_params` hold the named component's own parameters, checked against its parameter
dataclass. From the CLI, `--set lr=0.1` sets a top-level field and `--set algorithm.mu=0.01`
(or `algorithm_params.mu`) a component parameter; a TOML `--config` file uses the same names,
with `[algorithm_params]` etc. as tables.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from fedhet.errors import FedhetError
from fedhet.registry import _coerce, build_params, params_dict

DEFAULT_MODEL = {
    "digits": "mlp",
    "synthetic": "logreg",
    "mnist": "mlp",
    "fashion-mnist": "cnn-mnist",
    "mnist-even-odd": "svm",
    "cifar10": "cnn-cifar",
    "cifar100": "cnn-cifar",
}

COMPONENTS = ("algorithm", "dataset", "partition", "model")

RUNTIME = {"device", "executor", "cohort_chunk", "workers", "data_dir", "checkpoint_every"}
"""Settings that say where and how a run computes, not what: a grid may change them between
calls, and `--device`/`--executor` set them for every run of a grid."""

RESUMABLE = {"rounds", "eval_every", "checkpoint_every", "data_dir", "device", "executor",
             "cohort_chunk", "workers"}
"""Settings a resumed run may change: they do not alter the rounds already done."""


@dataclass
class RunConfig:
    algorithm: str = "fedavg"
    dataset: str = "digits"
    partition: str = "dirichlet"
    model: str = "auto"
    clients: int = 10
    rounds: int = 30
    seed: int = 0
    lr: float = 0.05
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_min: float = 1e-5
    batch_size: int = 32
    local_epochs: float = 1.0
    local_steps: int = 0
    """Explicit τ for every client (overrides `local_epochs` when > 0)."""
    client_steps: list[int] = field(default_factory=list)
    """Explicit τ_i per client, one entry per client (overrides `local_steps` and epochs):
    heterogeneous local work as in FedNova's objective-inconsistency example."""
    epochs_min: int = 0
    epochs_max: int = 0
    """When `epochs_max > 0`: each client draws `E_i ~ U{epochs_min..epochs_max}` each round
    (FedNova's straggler setting, `E_i ~ U[2, E_max]`)."""
    momentum: float = 0.0
    weight_decay: float = 0.0
    sample_fraction: float = 1.0
    batch_order: Literal["reshuffle", "fixed"] = "reshuffle"
    eval_every: int = 1
    train_loss: bool = False
    """Also evaluate the global model's loss on the whole training set each evaluated round."""
    checkpoint_every: int = 1
    validation_fraction: float = 0.0
    """When > 0: hold out this fraction of the training set and evaluate on it instead of the
    test set (hyperparameter tuning, FedNNNN appendix)."""
    data_dir: str = "data"
    # -- simulated faults (engine/faults.py, docs/faults.md) --------------------------------
    client_dropout: float = 0.0
    """Probability that a sampled client is offline for a round and returns nothing."""
    straggler_fraction: float = 0.0
    """Probability that a sampled client is slow in a round and misses the deadline."""
    straggler_policy: Literal["drop"] = "drop"
    """What happens to a straggler's late work: `drop` (discarded; partial participation)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model, the data and the algorithm state live: `auto` = CUDA when available."""
    executor: Literal["sequential", "batched", "auto"] = "auto"
    """How a round's clients run (`fedhet.engine.executors`): one after another, or stacked;
    `auto` = batched on CUDA or for the linear models, else sequential (docs/gpu.md)."""
    cohort_chunk: int = 0
    """Batched executor: clients stacked at a time (0 = as many as fit ~1 GiB of stacked state)."""
    workers: int = 1
    """Sequential executor on CPU: processes a round's clients are spread over
    (`fedhet.engine.workers`; bit-identical to 1 with equal threads per process)."""
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    dataset_params: dict[str, Any] = field(default_factory=dict)
    partition_params: dict[str, Any] = field(default_factory=dict)
    model_params: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        checks = [
            (self.clients >= 1, "--clients must be ≥ 1"),
            (self.rounds >= 1, "--rounds must be ≥ 1"),
            (0 <= self.seed < 2**32, f"--seed must be a whole number in [0, 2^32), got {self.seed}"),
            (self.lr > 0 and math.isfinite(self.lr), f"lr must be a positive number, got {self.lr}"),
            (self.lr_min >= 0, "lr_min must be ≥ 0"),
            (self.batch_size >= 1, "batch_size must be ≥ 1"),
            (self.local_epochs > 0, f"local_epochs must be > 0, got {self.local_epochs}"),
            (self.local_steps >= 0, "local_steps must be ≥ 0"),
            (
                not self.client_steps or len(self.client_steps) == self.clients,
                f"client_steps needs one entry per client ({self.clients}), got {len(self.client_steps)}",
            ),
            (all(s >= 1 for s in self.client_steps), "every entry of client_steps must be ≥ 1"),
            (
                self.epochs_max == 0 or 1 <= self.epochs_min <= self.epochs_max,
                "random local epochs need 1 ≤ epochs_min ≤ epochs_max",
            ),
            (0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}"),
            (self.weight_decay >= 0, "weight_decay must be ≥ 0"),
            (
                0 < self.sample_fraction <= 1,
                f"sample_fraction must be in (0, 1], got {self.sample_fraction}",
            ),
            (self.eval_every >= 1, "eval_every must be ≥ 1"),
            (
                self.device in ("auto", "cpu", "cuda"),
                f"device must be auto, cpu or cuda, got {self.device!r}",
            ),
            (
                self.executor in ("sequential", "batched", "auto"),
                f"executor must be sequential, batched or auto, got {self.executor!r}",
            ),
            (self.cohort_chunk >= 0, f"cohort_chunk must be ≥ 0, got {self.cohort_chunk}"),
            (self.workers >= 1, f"--workers must be ≥ 1, got {self.workers}"),
            (self.checkpoint_every >= 1, "checkpoint_every must be ≥ 1"),
            (
                0 <= self.validation_fraction < 1,
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}",
            ),
            (
                0 <= self.client_dropout <= 1,
                f"client_dropout must be a probability in [0, 1], got {self.client_dropout}",
            ),
            (
                0 <= self.straggler_fraction <= 1,
                f"straggler_fraction must be a probability in [0, 1], got {self.straggler_fraction}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise FedhetError(message)

    @property
    def model_name(self) -> str:
        if self.model != "auto":
            return self.model
        return DEFAULT_MODEL.get(self.dataset, "mlp")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _field_hints() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)


def apply_settings(values: dict[str, Any], settings: dict[str, Any], where: str) -> dict[str, Any]:
    """Merge `settings` (TOML tables or `key=value` pairs) into the raw `values` mapping."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    hints = _field_hints()
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
    for key, value in settings.items():
        head, _, rest = key.partition(".")
        table = head if head.endswith("_params") else f"{head}_params"
        if rest and head.removesuffix("_params") in COMPONENTS:
            out.setdefault(table, {})[rest] = value
        elif key.endswith("_params") and key.removesuffix("_params") in COMPONENTS:
            if not isinstance(value, dict):
                raise FedhetError(f"{where}: {key} must be a table of parameters")
            out.setdefault(key, {}).update(value)
        elif key in names:
            out[key] = _coerce(value, hints[key], f"{where}: {key}")
        else:
            valid = ", ".join(sorted(names - {f"{c}_params" for c in COMPONENTS}))
            raise FedhetError(
                f"{where}: unknown setting {key!r}; valid settings: {valid}, "
                "or algorithm.<param>, dataset.<param>, partition.<param>, model.<param>"
            )
    return out


def resolve(values: dict[str, Any]) -> tuple[RunConfig, dict[str, Any]]:
    """Build and validate a `RunConfig` and its component parameter objects.

    Returns the config (with every component parameter filled with its default) and the
    parameter dataclass instances by component.
    """
    from fedhet.algorithms.base import ALGORITHMS
    from fedhet.data.partition import PARTITIONS
    from fedhet.data.registry import DATASETS
    from fedhet.models.registry import MODELS

    cfg = RunConfig(**values)
    cfg.validate()
    registries = {
        "algorithm": (ALGORITHMS, cfg.algorithm),
        "dataset": (DATASETS, cfg.dataset),
        "partition": (PARTITIONS, cfg.partition),
        "model": (MODELS, cfg.model_name),
    }
    params = {}
    for kind, (registry, name) in registries.items():
        entry = registry.get(name)
        raw = getattr(cfg, f"{kind}_params")
        params[kind] = build_params(entry.params, raw, kind)
        setattr(cfg, f"{kind}_params", params_dict(params[kind]))
    cfg.model = cfg.model_name
    return cfg, params


def canonical_config(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved `config.json` as this version writes it: old parameter names mapped to the
    current ones (`ALIASES`) and defaults added, so it compares equal to a fresh resolve of the
    same settings. Returned unchanged when it no longer resolves (the caller reports that)."""
    try:
        return resolve(dict(saved))[0].to_dict()
    except (FedhetError, TypeError, ValueError):
        return saved
