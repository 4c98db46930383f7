"""What a report compared: the settings its runs share and the ones that vary.

Every report page states them: a run's `config.json` is read as a flat list of
settings, a component with its parameters written in full (`partition = dirichlet(alpha=0.1)`,
`model = mlp(hidden=200)`), each algorithm's parameters apart (they exist only for its runs).
Settings that only say how a run was executed (device, executor, workers, checkpoints, data
directory) are left out: they do not change what was compared. Where other settings decide a
value, the block says so (`setting_notes`): local work drawn per client and round shows as
`local_epochs = 1–4` decided by `epochs_min`/`epochs_max`, a `local_epochs` that `local_steps`
or `client_steps` overrides is not listed as if it counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fedhet.engine import RECORD_KEYS

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
    if key == "local_epochs":
        return _overridden_epochs(config) != ""
    if key in ("epochs_min", "epochs_max"):
        return True  # shown as local_epochs' range when they apply
    if key == "local_steps":
        return value in (0, None) or _all_clients_stepped(config)
    if key == "client_steps":
        return not value
    if key == "lr_min":
        return config.get("lr_schedule", "constant") == "constant"
    if key == "straggler_policy":
        return not config.get("straggler_fraction")
    return False


def _all_clients_stepped(config: dict[str, Any]) -> bool:
    steps = config.get("client_steps") or []
    return bool(steps) and len(steps) >= int(config.get("clients") or 0)


def _overridden_epochs(config: dict[str, Any]) -> str:
    """The setting that decides local work instead of `local_epochs`, or ""."""
    if config.get("client_steps"):
        return "client_steps"
    if config.get("local_steps"):
        return "local_steps"
    return ""


def _local_epochs(config: dict[str, Any]) -> str:
    """`local_epochs` as it decided the local work: `1–4` when each client draws its epochs."""
    if config.get("epochs_max"):
        return f"{config.get('epochs_min')}–{config.get('epochs_max')}"
    return _text(config.get("local_epochs"))


def setting_notes(config: dict[str, Any]) -> dict[str, str]:
    """Setting → what decided its value, where that is not the setting alone."""
    notes = {}
    if config.get("epochs_max") and not _overridden_epochs(config):
        notes["local_epochs"] = ("epochs_min–epochs_max: each client draws its epochs E_i every "
                                 "round (local_epochs itself is not used)")
    if config.get("client_steps"):
        notes["client_steps"] = "τ_i per client; overrides local_steps and local_epochs"
    elif config.get("local_steps"):
        notes["local_steps"] = "steps per round for every client; overrides local_epochs"
    if config.get("lr_schedule", "constant") != "constant":
        notes["lr"] = f"the first round's; {config.get('lr_schedule')} schedule down to lr_min"
    return notes


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
        if key == "local_epochs":
            by = _overridden_epochs(config)
            out[key] = f"not used ({by} decides)" if by else _local_epochs(config)
        elif key in COMPONENTS:
            out[key] = component(value, config.get(COMPONENTS[key]))
        else:
            out[key] = _text(value)
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
    notes: dict[str, str] = field(default_factory=dict)
    """Setting → what decided its value (`setting_notes`), several joined by ` | `."""


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
    notes: dict[str, list[str]] = {}
    for c in configs:
        algorithms.setdefault(str(c.get("algorithm", "")), []).append(algorithm_params(c))
        for key, note in setting_notes(c).items():
            notes.setdefault(key, []).append(note)
    return SettingsSummary(
        shared, varying,
        {a: " | ".join(dict.fromkeys(v)) for a, v in algorithms.items()}, len(configs),
        {k: " | ".join(dict.fromkeys(v)) for k, v in notes.items()},
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
