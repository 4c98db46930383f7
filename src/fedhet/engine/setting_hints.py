"""The hint an unknown setting is answered with: a parameter of that name of the run's
components, the setting researchers mean by another name (`SYNONYMS`), or a close spelling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from fedhet.components import REGISTRIES
from fedhet.registry import did_you_mean

SYNONYMS = {
    "learning_rate": "lr", "learningrate": "lr", "eta": "lr", "step_size": "lr",
    "batch": "batch_size", "batchsize": "batch_size", "bs": "batch_size",
    "epochs": "local_epochs", "num_epochs": "local_epochs", "e": "local_epochs",
    "steps": "local_steps", "tau": "local_steps", "num_steps": "local_steps",
    "num_clients": "clients", "n_clients": "clients", "nodes": "clients",
    "num_rounds": "rounds", "n_rounds": "rounds", "iterations": "rounds",
    "fraction": "sample_fraction", "client_fraction": "sample_fraction", "frac": "sample_fraction",
    "wd": "weight_decay", "random_seed": "seed", "dropout": "client_dropout",
    "algo": "algorithm", "method": "algorithm", "data": "dataset", "split": "partition",
    "net": "model", "arch": "model", "gpu": "device", "jobs": "workers",
}
"""Other names researchers use for a setting: an unknown setting spelt so is answered
with the setting's own name (never accepted silently)."""


def suggest_setting(key: str, chosen: Mapping[str, str | tuple[str, ...]],
                    engine_fields: Sequence[str]) -> str:
    """The hint of an unknown setting: a parameter of that name of the run's chosen components
    (`mu` → `algorithm.mu` for fedprox; a grid's kind may name several, a tuple), a synonym
    (`learning_rate` → `lr`) or a close spelling of one of `engine_fields`; a parameter only
    other components have is named with them, not suggested."""
    def has(kind: str, name: str) -> bool:
        return key in {f.name for f in dataclasses.fields(REGISTRIES[kind].get(name).params)}

    names = {kind: (v,) if isinstance(v, str) else tuple(v) for kind, v in chosen.items()}
    owners = [kind for kind, these in names.items() if any(has(kind, n) for n in these)]
    if owners:
        return " (did you mean " + " or ".join(repr(f"{kind}.{key}") for kind in owners) + "?)"
    near = did_you_mean(key, engine_fields, SYNONYMS)
    if near:
        return near
    for kind, these in names.items():
        others = [entry.name for entry in REGISTRIES[kind] if entry.name not in these
                  and key in {f.name for f in dataclasses.fields(entry.params)}]
        if others and these:
            shown = ", ".join(others[:4]) + (", …" if len(others) > 4 else "")
            return (f" ({' and '.join(these)} {'has' if len(these) == 1 else 'have'} no parameter "
                    f"{key}; {kind}.{key} is a parameter of {shown})")
    return ""

