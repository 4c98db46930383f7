"""`RunConfig`: everything one run needs, typed, validated and immutable (docs/design.md).

One representation, one parser, one serialiser:

- A **setting** is a config path and a value: `lr` (an engine field), `algorithm` (a
  component's name) or `algorithm.mu` (a component parameter). `parse` turns every source
  into `{path: value}`: `--set key=value` pairs, CLI flags, TOML run files, grid cells,
  presets and a saved `config.json`. Nested tables are the same paths
  (`[algorithm] name = "fedprox", mu = 0.01`, or the older `[algorithm_params] mu = 0.01`).
- `build(*layers)` merges layers of settings (later wins), coerces each value to its field's
  type, builds each component's frozen parameter dataclass and validates everything: the
  result is a frozen `RunConfig` whose `algorithm_params` etc. are those typed objects.
- `RunConfig.to_dict()` is `config.json`; `RunConfig.flat()` is the same as paths, which is
  what grids vary, tables print and `build` reads back (`build(cfg.flat()) == cfg`).

Beside it: settings files read as TOML (`toml_files`), the hint an unknown setting gets
(`setting_hints`) and where each setting of a run came from (`setting_sources`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

from fedhet.components import COMPONENTS, REGISTRIES
from fedhet.data.files import absolute, is_data_path
from fedhet.engine.setting_hints import suggest_setting
from fedhet.engine.spellings import RENAMED, current_record, current_value
from fedhet.errors import FedhetError
from fedhet.metrics import check_metrics
from fedhet.registry import build_params, coerce, params_dict
from fedhet.rundir.store import RECORD_KEYS

RUNTIME = {"device", "executor", "cohort_chunk", "workers", "data_dir", "checkpoint_every",
           "client_state_memory_mb"}
"""Settings that say where and how a run computes, not what: a grid may change them between
calls, and `--device`/`--executor` set them for every run of a grid."""

RESUMABLE = {"rounds", "eval_every", "client_eval_every", "checkpoint_every", "data_dir", "device",
             "executor", "cohort_chunk", "workers", "client_state_memory_mb"}
"""Settings a resumed run may change: they do not alter the rounds already done."""


MAX_ROUNDS = 1_000_000
"""The most rounds a run may ask for. The papers' longest studies take a few hundred; each
round appends a metrics row and writes a checkpoint, so a million rounds is already a
metrics.csv of hundreds of MB and, at a millisecond a round (the smallest model), 17 minutes of
bookkeeping alone. Above it is a typo (`-r 1e23`), which would otherwise run for ever."""

MAX_LOCAL_STEPS = 10_000_000
"""The most local steps a client may take in a round (`local_steps`, each `client_steps` entry);
`MAX_LOCAL_EPOCHS` bounds epochs likewise (the papers use at most 5)."""
MAX_LOCAL_EPOCHS = 10_000


class ConfigFields:
    """A frozen dataclass of the settings one part of the engine reads (its fields are named as
    the `RunConfig` fields they copy): `LocalWork`, `EvalSettings`, `LoopSettings`,
    `FaultModel`. `from_config` builds one from a `RunConfig`, so a part never holds the whole
    config and its settings are listed once, as its fields."""

    @classmethod
    def from_config(cls, cfg: RunConfig) -> Self:
        """The fields of `cls`, each the `RunConfig` field of the same name."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # (each subclass is a dataclass)
        return cls(**{f.name: getattr(cfg, f.name) for f in fields})


@dataclass(frozen=True)
class RunConfig:
    """Engine fields, then each component's name and typed parameters (after `build`)."""

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
    client_steps: tuple[int, ...] = ()
    """Explicit τ_i per client, one entry per client (overrides `local_steps` and epochs):
    heterogeneous local work as in FedNova's objective-inconsistency example."""
    epochs_min: int = 0
    epochs_max: int = 0
    """When `epochs_max > 0`: each client draws `E_i ~ U{epochs_min..epochs_max}` each round
    (FedNova's straggler setting, `E_i ~ U[2, E_max]`)."""
    momentum: float = 0.0
    weight_decay: float = 0.0
    client_optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    """The clients' local optimizer (`fedhet.training.steps`): SGD with `momentum`, Adam
    (`weight_decay` added to the gradient, as `torch.optim.Adam`) or AdamW (`weight_decay`
    decoupled, as `torch.optim.AdamW`). Its state (momentum buffer, Adam's moments and step
    count) starts at zero in every round."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    """Adam's `β1, β2, ε` (`client_optimizer = adam | adamw`; torch's defaults)."""
    sample_fraction: float = 1.0
    batch_order: Literal["reshuffle", "fixed"] = "reshuffle"
    eval_every: int = 1
    train_loss: bool = False
    """Also evaluate the global model's loss on the whole training set each evaluated round."""
    checkpoint_every: int = 1
    validation_fraction: float = 0.0
    """When > 0: hold out this fraction of the training set and evaluate on it instead of the
    test set (hyperparameter tuning, FedNNNN appendix)."""
    client_eval_fraction: float = 0.0
    """When > 0: hold out this fraction of each client's partition as its own held-out share
    (`fedhet.data.split.hold_out_per_client`) and score the global model on every client's
    share every `client_eval_every` rounds (`client_acc_mean`, `_std`, `_worst10`, `_best10`
    in metrics.csv). 0 (off): the clients train on their whole partitions. `train_loss` still
    covers the whole training set, shares included."""
    client_eval_every: int = 1
    """Per-client evaluation every this many rounds (and at the last round)."""
    client_eval_finetune_steps: int = 0
    """When > 0 (and `client_eval_fraction > 0`): also each client's personalised accuracy, the
    global model fine-tuned for this many local SGD steps on the client's training samples and
    scored on its share (`client_pacc_*`)."""
    metrics: tuple[str, ...] = ()
    """Metrics recorded beside accuracy (`fedhet.metrics`): names registered with
    `fedhet.register_metric`, or scikit-learn scorer names (`f1_macro`, `roc_auc_ovr`)."""
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
    executor: Literal["sequential", "stacked", "auto"] = "auto"
    """How a round's clients run (`fedhet.engine.executors`): one after another, or stacked;
    `auto` = stacked on CUDA or for the linear models, else sequential (docs/gpu.md)."""
    cohort_chunk: int = 0
    """Stacked executor: clients stacked at a time (0 = as many as fit half the free GPU memory, or
    ~1 GiB of stacked state on a CPU: `fedhet.training.rows.rows_that_fit`)."""
    precision: Literal["fp32", "bf16", "tf32"] = "fp32"
    """Arithmetic of the local forward and backward passes (`fedhet.training.precision`): `fp32`,
    `bf16` (autocast; the flat weights, the local step, aggregation and the server stay float32)
    or `tf32` (CUDA only). docs/gpu.md says where bf16 is safe."""
    workers: int = 0
    """Sequential executor on CPU: processes a round's clients are spread over
    (`fedhet.engine.workers`; bit-identical to 1 with equal threads per process). 0 = `auto`
    (spelt `auto` or 0 in settings): the usable cores when a round's work pays for them, else 1
    (`fedhet.engine.workers.auto_workers`)."""
    client_state_memory_mb: float = 1024.0
    """MiB of the clients' own states (SCAFFOLD's `c_i`, …) kept in memory; the least recently
    used beyond it wait in files in the run directory (`fedhet.engine.client_store`). The
    results do not depend on it."""
    algorithm_params: Any = None
    dataset_params: Any = None
    partition_params: Any = None
    model_params: Any = None
    """The components' frozen parameter dataclasses (`None` until `build` fills them)."""

    def __post_init__(self) -> None:
        for key in RENAMED:  # an earlier release's spelling, read as today's (`spellings`)
            object.__setattr__(self, key, current_value(key, getattr(self, key)))

    def validate(self) -> None:
        """Refuse settings no run can have, in one line (`FedhetError`): the first check that
        fails, in the order of `_checks`, then an unknown metric."""
        for ok, message in self._checks():
            if not ok:
                raise FedhetError(message)
        if self.metrics:
            check_metrics(self.metrics)

    def _checks(self) -> list[tuple[bool, str]]:
        """Every check as `(holds, what to change)`, in the order they are reported."""
        return [*self._size_checks(), *self._local_work_checks(), *self._optimizer_checks(),
                *self._cadence_checks(), *self._execution_checks(), *self._evaluation_checks(),
                *self._fault_checks()]

    def _size_checks(self) -> list[tuple[bool, str]]:
        """Clients, rounds, seed, learning rate and batch size."""
        return [
            (self.clients >= 1, "--clients must be ≥ 1"),
            (self.rounds >= 1, "--rounds must be ≥ 1"),
            (
                self.rounds <= MAX_ROUNDS,
                f"--rounds must be at most {MAX_ROUNDS:,} (a typo otherwise runs for ever), "
                f"got {self.rounds:.3g}",
            ),
            (0 <= self.seed < 2**32, f"--seed must be a whole number in [0, 2^32), got {self.seed}"),
            (self.lr > 0 and math.isfinite(self.lr), f"lr must be a positive number, got {self.lr}"),
            (self.lr_min >= 0, "lr_min must be ≥ 0"),
            (self.batch_size >= 1, "batch_size must be ≥ 1"),
        ]

    def _local_work_checks(self) -> list[tuple[bool, str]]:
        """Local epochs and steps: positive, bounded, one `client_steps` entry per client."""
        return [
            (self.local_epochs > 0, f"local_epochs must be > 0, got {self.local_epochs}"),
            (
                self.local_epochs <= MAX_LOCAL_EPOCHS and self.epochs_max <= MAX_LOCAL_EPOCHS,
                f"local_epochs and epochs_max must be at most {MAX_LOCAL_EPOCHS:,}, got "
                f"{max(self.local_epochs, self.epochs_max):.3g}",
            ),
            (self.local_steps >= 0, "local_steps must be ≥ 0"),
            (
                max([self.local_steps, *self.client_steps]) <= MAX_LOCAL_STEPS,
                f"local_steps and client_steps must be at most {MAX_LOCAL_STEPS:,} per round, got "
                f"{max([self.local_steps, *self.client_steps]):.3g}",
            ),
            (
                not self.client_steps or len(self.client_steps) == self.clients,
                f"client_steps needs one entry per client ({self.clients}), got {len(self.client_steps)}",
            ),
            (all(s >= 1 for s in self.client_steps), "every entry of client_steps must be ≥ 1"),
            (
                self.epochs_max == 0 or 1 <= self.epochs_min <= self.epochs_max,
                "random local epochs need 1 ≤ epochs_min ≤ epochs_max",
            ),
        ]

    def _optimizer_checks(self) -> list[tuple[bool, str]]:
        """The clients' optimizer: momentum, weight decay, Adam's β and ε."""
        return [
            (0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}"),
            (self.weight_decay >= 0, "weight_decay must be ≥ 0"),
            (
                self.client_optimizer in ("sgd", "adam", "adamw"),
                f"client_optimizer must be sgd, adam or adamw, got {self.client_optimizer!r}",
            ),
            (
                0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1,
                f"adam_beta1 and adam_beta2 must be in [0, 1), got {self.adam_beta1} and "
                f"{self.adam_beta2}",
            ),
            (
                self.adam_eps > 0 and math.isfinite(self.adam_eps),
                f"adam_eps must be a positive number, got {self.adam_eps}",
            ),
            (
                self.client_optimizer == "sgd" or self.momentum == 0,
                f"momentum is SGD's heavy ball; client_optimizer={self.client_optimizer} has its "
                f"own (adam_beta1): set momentum=0 (got {self.momentum})",
            ),
        ]

    def _cadence_checks(self) -> list[tuple[bool, str]]:
        """The share of clients sampled each round, and how often the model is evaluated."""
        return [
            (
                0 < self.sample_fraction <= 1,
                f"sample_fraction must be in (0, 1], got {self.sample_fraction}",
            ),
            (self.eval_every >= 1, "eval_every must be ≥ 1"),
        ]

    def _execution_checks(self) -> list[tuple[bool, str]]:
        """Where and how a run computes (device, executor, precision, workers, checkpoints)."""
        return [
            (
                self.device in ("auto", "cpu", "cuda"),
                f"device must be auto, cpu or cuda, got {self.device!r}",
            ),
            (
                self.executor in ("sequential", "stacked", "auto"),
                f"executor must be sequential, stacked or auto, got {self.executor!r}",
            ),
            (
                self.precision in ("fp32", "bf16", "tf32"),
                f"precision must be fp32, bf16 or tf32, got {self.precision!r}",
            ),
            (self.cohort_chunk >= 0, f"cohort_chunk must be ≥ 0, got {self.cohort_chunk}"),
            (self.workers >= 0, f"--workers must be auto or a whole number ≥ 1, got {self.workers}"),
            (self.checkpoint_every >= 1, "checkpoint_every must be ≥ 1"),
            (
                0 <= self.client_state_memory_mb < math.inf,
                "client_state_memory_mb must be a number of MiB ≥ 0 (0: keep no client state in "
                f"memory between updates), got {self.client_state_memory_mb}",
            ),
        ]

    def _evaluation_checks(self) -> list[tuple[bool, str]]:
        """The validation hold-out and the per-client evaluation."""
        return [
            (
                0 <= self.validation_fraction < 1,
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}",
            ),
            (
                0 <= self.client_eval_fraction < 1,
                f"client_eval_fraction must be in [0, 1) (0: no per-client evaluation), got "
                f"{self.client_eval_fraction}",
            ),
            (self.client_eval_every >= 1, "client_eval_every must be ≥ 1"),
            (
                self.client_eval_finetune_steps >= 0,
                f"client_eval_finetune_steps must be ≥ 0, got {self.client_eval_finetune_steps}",
            ),
            (
                not self.client_eval_finetune_steps or self.client_eval_fraction > 0,
                "client_eval_finetune_steps scores each client on its held-out share: set "
                "client_eval_fraction too (e.g. 0.2)",
            ),
        ]

    def _fault_checks(self) -> list[tuple[bool, str]]:
        """The simulated faults: dropout and stragglers, each a probability."""
        return [
            (
                0 <= self.client_dropout <= 1,
                f"client_dropout must be a probability in [0, 1], got {self.client_dropout}",
            ),
            (
                0 <= self.straggler_fraction <= 1,
                f"straggler_fraction must be a probability in [0, 1], got {self.straggler_fraction}",
            ),
        ]

    @property
    def model_name(self) -> str:
        """The model: `model`, or under `auto` the one the dataset declares where it registers
        (its `default_model` trait; `mlp` when it declares none, or is not a known dataset, which
        `build` then reports)."""
        if self.model != "auto":
            return self.model
        try:
            entry = REGISTRIES["dataset"].get(self.dataset)
        except FedhetError:
            return "mlp"
        return entry.trait("default_model", "mlp")

    def to_dict(self) -> dict[str, Any]:
        """The serialised form (`config.json`): engine fields, component names, and each
        component's parameters as a table under `<component>_params`."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_params"):
                out[f.name] = {} if value is None else params_dict(value)
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def flat(self) -> dict[str, Any]:
        """Every setting as `{path: value}` (`lr`, `algorithm`, `algorithm.mu`, ...)."""
        out: dict[str, Any] = {}
        for key, value in self.to_dict().items():
            if key.endswith("_params"):
                out.update({f"{key.removesuffix('_params')}.{k}": v for k, v in value.items()})
            else:
                out[key] = value
        return out


ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig) if not f.name.endswith("_params"))
_HINTS = typing.get_type_hints(RunConfig)


def path_of(key: str) -> str:
    """The one spelling of a config path: `algorithm_params.mu` and `algorithm.mu` are
    `algorithm.mu`; `algorithm.name` is `algorithm`; kebab case is snake case
    (`local-epochs` is `local_epochs`)."""
    head, dot, rest = key.replace("-", "_").partition(".")
    head = head.removesuffix("_params") if head.removesuffix("_params") in COMPONENTS else head
    if head in COMPONENTS and rest == "name":
        return head
    return f"{head}{dot}{rest}"


def flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables → dotted keys in their one spelling
    (`{"algorithm_params": {"mu": 1}}` → `{"algorithm.mu": 1}`); lists are values."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[path_of(f"{prefix}{key}")] = value
    return out


def parse(source: Mapping[str, Any] | Sequence[str], where: str,
          chosen: Mapping[str, str | tuple[str, ...]] | None = None) -> dict[str, Any]:
    """Settings from any source → `{path: value}`, engine fields already typed.

    `source` is a mapping (TOML, a preset, a grid cell, a saved `config.json`; nested or
    dotted) or a sequence of `key=value` strings (`--set`). An unknown path or a value of the
    wrong type is one `FedhetError` naming `where`. Component parameters are checked by `build`,
    once the component they belong to is known. `chosen` names the run's components where the
    caller knows them (`chosen_components`; else this source's own, or the defaults), so that an
    unknown setting is only answered with a parameter those components have.
    """
    if isinstance(source, Mapping):
        flat = flatten({k: v for k, v in source.items() if k not in RECORD_KEYS})
    else:
        flat = {}
        for pair in source:
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise FedhetError(f"{where} expects key=value, got {pair!r}")
            flat[path_of(key.strip())] = value.strip()
    out: dict[str, Any] = {}
    if chosen is None:
        chosen = chosen_components(flat)
    for key, value in flat.items():
        head, dot, rest = key.partition(".")
        if dot and head in COMPONENTS and rest:
            out[key] = value
        elif key in COMPONENTS and isinstance(value, str):
            # `FedAvg` is `fedavg`, `Auto` is `auto`
            out[key] = "auto" if value.lower() == "auto" else REGISTRIES[key].canonical(value)
            if key == "dataset" and out[key] not in REGISTRIES["dataset"] and is_data_path(value):
                out[key] = absolute(value)  # a data file: found again by --resume from anywhere
        elif key in ENGINE_FIELDS:
            out[key] = _engine_value(key, value, f"{where}: {key}")
        else:
            hint = suggest_setting(key, chosen, ENGINE_FIELDS)
            raise FedhetError(
                f"{where}: unknown setting {key!r}{hint}; valid settings: "
                f"{', '.join(sorted(ENGINE_FIELDS))}, "
                "or algorithm.<param>, dataset.<param>, partition.<param>, model.<param>"
            )
    return out


def chosen_components(*sources: Mapping[str, Any]) -> dict[str, str]:
    """The components a run's settings name (`{"algorithm": "fedprox", ...}`), later sources
    winning, `RunConfig`'s defaults for the others; a name no registry knows, a Python object
    or `model = "auto"` leaves that kind out."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    out: dict[str, Any] = {kind: defaults.get(kind) for kind in REGISTRIES}
    for source in sources:
        for kind in REGISTRIES:
            value = source.get(kind)
            if isinstance(value, Mapping):
                value = value.get("name")
            if value is not None:
                out[kind] = value
    return {kind: REGISTRIES[kind].canonical(v) for kind, v in out.items()
            if isinstance(v, str) and REGISTRIES[kind].canonical(v) in REGISTRIES[kind]}


AUTO = {"workers": 0}
"""Engine fields that also take the word `auto`, and the number that stands for it."""


def _engine_value(key: str, value: Any, where: str) -> Any:
    """An engine field's value typed (`coerce`), `auto` read as its number (`AUTO`), an earlier
    release's spelling as today's (`spellings.current_value`)."""
    value = current_value(key, value)
    if key not in AUTO:
        return coerce(value, _HINTS[key], where)
    if isinstance(value, str) and value.strip().lower() == "auto":
        return AUTO[key]
    try:
        return coerce(value, _HINTS[key], where)
    except FedhetError:
        raise FedhetError(f"{where} must be auto or a whole number ≥ 1, got {value!r}") from None


def build(*layers: Mapping[str, Any], only: Sequence[str] = COMPONENTS) -> RunConfig:
    """Merge `parse`d layers (later wins), then type, build and validate: the one way a
    `RunConfig` is made. `only` limits the components built (a partition report needs no
    algorithm); the others keep `None` parameters and their settings are not read."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    engine = {k: v for k, v in merged.items() if "." not in k}
    unknown = sorted(set(engine) - set(ENGINE_FIELDS))
    if unknown:
        raise FedhetError(f"unknown setting {unknown[0]!r}; settings are read with parse() first")
    cfg = RunConfig(**{k: _engine_value(k, v, k) for k, v in engine.items()})
    cfg.validate()
    names = {"algorithm": cfg.algorithm, "dataset": cfg.dataset, "partition": cfg.partition,
             "model": cfg.model_name}
    built: dict[str, Any] = {}
    for kind in only:
        raw = {k.partition(".")[2]: v for k, v in merged.items() if k.startswith(f"{kind}.")}
        built[f"{kind}_params"] = build_params(REGISTRIES[kind].get(names[kind]).params, raw, kind)
    return dataclasses.replace(cfg, model=cfg.model_name, **built)


def config_of(settings: Mapping[str, Any], where: str = "settings") -> RunConfig:
    """One source of settings (`{"algorithm": "fedprox", "algorithm.mu": 0.1, "lr": 0.05}`, or
    nested tables) → its `RunConfig`: `build(parse(settings, where))`."""
    return build(parse(settings, where))


def canonical_config(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved `config.json` as this version writes it: old parameter names mapped to the
    current ones (`ALIASES`) and defaults added, so it compares equal to a fresh build of the
    same settings; the record keys (`RECORD_KEYS`) are left out. Returned otherwise unchanged
    when it no longer builds (the caller reports that). Values an earlier release spelt
    otherwise read as today's (`spellings.current_record`)."""
    saved = current_record(saved)
    try:
        return build(parse(saved, "config.json")).to_dict()
    except (FedhetError, TypeError, ValueError):
        return {k: v for k, v in saved.items() if k not in RECORD_KEYS}


FIELD_DOCS: dict[str, str] = {
    "algorithm": "the federated method (fedhet list: algorithms)",
    "dataset": "the data (fedhet list: datasets)",
    "partition": "how the training set is split over the clients",
    "model": "the network; auto: the dataset's usual model",
    "clients": "number of clients N",
    "rounds": "communication rounds K",
    "seed": "seed of the split, the initial model, sampling and batches",
    "lr": "client learning rate η",
    "lr_schedule": "constant, or cosine from lr down to lr_min over the rounds",
    "lr_min": "the cosine schedule's last learning rate",
    "batch_size": "client minibatch size B",
    "local_epochs": "local epochs E per round (fractions allowed)",
    "local_steps": "local steps τ per round for every client (> 0 overrides local_epochs)",
    "client_steps": "τ_i per client, one entry each (overrides local_steps)",
    "epochs_min": "random local epochs: E_i drawn from epochs_min..epochs_max",
    "epochs_max": "random local epochs when > 0 (FedNova's stragglers)",
    "momentum": "client SGD momentum",
    "weight_decay": "client weight decay λ (adamw: decoupled)",
    "client_optimizer": "local optimizer: sgd (with momentum), adam or adamw; reset every round",
    "adam_beta1": "client Adam's β1 (adam, adamw)",
    "adam_beta2": "client Adam's β2 (adam, adamw)",
    "adam_eps": "client Adam's ε (adam, adamw)",
    "sample_fraction": "fraction of clients sampled each round",
    "batch_order": "reshuffle the minibatches every epoch, or keep one fixed order",
    "eval_every": "evaluate the global model every this many rounds",
    "train_loss": "also evaluate the loss on the whole training set",
    "checkpoint_every": "save a checkpoint every this many rounds",
    "validation_fraction": "hold this fraction of the training set out and evaluate on it",
    "client_eval_fraction": "hold this fraction of each client's data out and score every client on it",
    "client_eval_every": "per-client evaluation every this many rounds",
    "client_eval_finetune_steps": "per-client evaluation also after this many local steps (personalised)",
    "metrics": "more metrics per round: registered names or scikit-learn scorers (f1_macro)",
    "data_dir": "where dataset files are read from",
    "client_dropout": "probability that a sampled client is offline for a round",
    "straggler_fraction": "probability that a sampled client misses a round's deadline",
    "straggler_policy": "what happens to a straggler's work (drop)",
    "device": "auto (CUDA when present), cpu or cuda",
    "executor": "auto, sequential (one client after another) or stacked (all as one computation)",
    "cohort_chunk": "stacked executor: clients stacked at a time (0: fit the memory)",
    "precision": "fp32, bf16 (autocast local passes; float32 weights) or tf32 (CUDA only)",
    "workers": "CPU processes a round's clients are spread over (0: auto)",
    "client_state_memory_mb": "MiB of client states (SCAFFOLD's c_i, …) in memory; the rest wait on disk",
}
"""One line per engine setting: what `fedhet list` and `fedhet config show` print."""


def engine_defaults() -> dict[str, Any]:
    """Each engine setting's default (`RunConfig`'s field defaults)."""
    return {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in ENGINE_FIELDS}
