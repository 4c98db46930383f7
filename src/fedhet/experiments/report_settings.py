"""What a report compared: the settings its runs share and the ones that vary.

Every report page states them (issue 24): a run's `config.json` is read as a flat list of
settings, a component with its parameters written in full (`partition = dirichlet(alpha=0.1)`,
`model = mlp(hidden=200)`), each algorithm's parameters apart (they exist only for its runs).
Settings that only say how a run was executed (device, executor, workers, checkpoints, data
directory) are left out: they do not change what was compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fedhet.engine.config import RECORD_KEYS

ORDER = (
    "algorithm", "model", "dataset", "partition", "clients", "sample_fraction", "rounds", "lr",
    "lr_schedule", "lr_min", "batch_size", "local_epochs", "local_steps", "client_steps",
    "epochs_min", "epochs_max", "momentum", "weight_decay", "batch_order", "eval_every",
    "validation_fraction", "client_dropout", "straggler_fraction", "straggler_policy", "seed",
)
"""The order settings are listed in; keys not named here follow in the config's order."""

EXECUTION = {"device", "executor", "cohort_chunk", "workers", "checkpoint_every", "data_dir",
             "train_loss", *RECORD_KEYS}
"""Settings that change how a run executes, not what it computes (left out of the block), and
those switched off (`_inert`) are not listed; nor is the record of what made a run
(`RECORD_KEYS`: its plugins and provenance), which is no setting."""

COMPONENTS = {"model": "model_params", "dataset": "dataset_params", "partition": "partition_params"}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if value == "":
        return '""'
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def component(name: Any, params: dict[str, Any] | None) -> str:
    """`dirichlet(alpha=0.1)`: a component with its parameters in full (`iid` when it has none)."""
    inner = ", ".join(f"{k}={_text(v)}" for k, v in sorted((params or {}).items()))
    return f"{name}({inner})" if inner else str(name)


def _inert(key: str, config: dict[str, Any]) -> bool:
    """Settings whose value switches their feature off (`local_steps = 0`: epochs are used),
    or that only matter when another is on (`lr_min` without a schedule): not listed."""
    value = config.get(key)
    if key in ("local_steps", "epochs_min", "epochs_max"):
        return value in (0, None)
    if key == "client_steps":
        return not value
    if key == "lr_min":
        return config.get("lr_schedule", "constant") == "constant"
    if key == "straggler_policy":
        return not config.get("straggler_fraction")
    return False


def flat_settings(config: dict[str, Any], keep: frozenset[str] = frozenset()) -> dict[str, str]:
    """The run's settings as `name → text`, components with their parameters, in `ORDER`.

    The algorithm's parameters are not here (see `algorithm_params`): each algorithm has its own.
    """
    out: dict[str, str] = {}
    params = set(COMPONENTS.values()) | {"algorithm_params"}
    keys = [k for k in ORDER if k in config] + [k for k in config if k not in ORDER]
    for key in keys:
        if key in EXECUTION or key in params or (_inert(key, config) and key not in keep):
            continue
        value = config[key]
        out[key] = component(value, config.get(COMPONENTS[key])) if key in COMPONENTS else _text(value)
    return out


def algorithm_params(config: dict[str, Any]) -> str:
    """`fedprox(mu=0.01, nwda=false, weighting=samples)`: the algorithm with its parameters."""
    return component(config.get("algorithm", ""), config.get("algorithm_params"))


@dataclass
class SettingsSummary:
    """What the runs of a page share and what differs between them."""

    shared: dict[str, str]
    """Setting → its value in every run."""
    varying: dict[str, list[str]]
    """Setting → its distinct values, in order of first appearance."""
    algorithms: dict[str, str]
    """Algorithm → its parameters (`fedprox(mu=0.01, …)`); several values joined by ` | `."""
    n_runs: int


def summarize(configs: list[dict[str, Any]]) -> SettingsSummary:
    """Split the settings of `configs` into those every run shares and those that vary.

    A setting missing from some run's config counts as a value of its own (`(unset)`), so a
    key only some runs have is listed as varying, never as shared.
    """
    # a setting switched off in some runs but on in others is listed with every run's value
    active = frozenset(k for c in configs for k in flat_settings(c))
    flats = [flat_settings(c, active) for c in configs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    shared: dict[str, str] = {}
    varying: dict[str, list[str]] = {}
    for key in keys:
        values = list(dict.fromkeys(f.get(key, "(unset)") for f in flats))
        if len(values) == 1:
            shared[key] = values[0]
        else:
            varying[key] = values
    algorithms: dict[str, list[str]] = {}
    for c in configs:
        algorithms.setdefault(str(c.get("algorithm", "")), []).append(algorithm_params(c))
    return SettingsSummary(
        shared, varying,
        {a: " | ".join(dict.fromkeys(v)) for a, v in algorithms.items()}, len(configs),
    )


def group_header(configs: list[dict[str, Any]], all_configs: list[dict[str, Any]]) -> str:
    """A column's settings in full: the settings that vary across the page (`all_configs`)
    and that every run of the column (`configs`) shares, with that value.

    The algorithm and the seed are rows and bands, never columns. Empty when the column's runs
    share no varying setting.
    """
    mine = summarize(configs)
    every = summarize(all_configs)
    parts = [f"{k}={v}" for k, v in mine.shared.items()
             if k in every.varying and k not in ("algorithm", "seed")]
    return ", ".join(parts)
