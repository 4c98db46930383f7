"""A grid from the command line (`fedhet compare`), as Hydra's multirun writes one.

`changes` turns the setting flags, `--set` and `--sweep` into a `GridChanges`
(`fedhet.runs.grid_document`): a flag or `--set` fixes a setting in every run, a comma list in
`-a/-d/-p/-m` or a `--sweep KEY=V1,V2` is an axis. `dir_name` names the directory of a grid
without `--out`, and `dry_run` lists what a grid would run. The grid machinery itself
(expansion, duplicate cells, lock, resume) is `fedhet.runs.grid` and `compare`'s, unchanged.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from fedhet.engine import REGISTRIES, path_of
from fedhet.errors import FedhetError
from fedhet.runs.grid import Grid
from fedhet.runs.grid_document import GridChanges

AXIS_FLAGS = ("algorithm", "dataset", "partition", "model")
"""Flags whose value may be a comma list: one axis value each (`-a fedavg,fedprox`)."""


def literal(text: str) -> Any:
    """A value typed on the command line as TOML reads it (`0.1` a number, `true` a bool,
    `[1, 2]` a list); anything else (a name, a path) is the string."""
    text = text.strip()
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return value if isinstance(value, bool | int | float | list) else text


def _pair(pair: str, flag: str, example: str) -> tuple[str, str]:
    key, eq, value = pair.partition("=")
    if not eq or not key.strip():
        raise FedhetError(f"{flag} expects {example}, got {pair!r}")
    return path_of(key.strip()), value


def changes(flags: Mapping[str, Any], sets: Sequence[str], sweeps: Sequence[str],
            title: bool = False) -> GridChanges:
    """The command line's grid changes: `flags` (`{"algorithm": "fedavg,fedprox", "rounds": 5}`,
    given flags only), `--set` pairs and `--sweep` pairs. Component names are registered
    spellings (`-a FedAvg` names its runs as `-a fedavg`); with `title`, the grid (made on the
    command line alone) gets one from its methods and data."""
    fixed: dict[str, Any] = {}
    axes: dict[str, list[Any]] = {}
    sources: dict[str, str] = {}
    for k, value in flags.items():
        flag = f"--{k.replace('_', '-')}"
        if k in AXIS_FLAGS and isinstance(value, str) and "," in value:
            axes[k] = [v.strip() for v in value.split(",")]
            if not all(axes[k]):
                raise FedhetError(f"{flag} expects a name or a comma-separated list of names, got "
                                  f"{value!r} (an empty name)")
        else:
            fixed[k] = value
        sources[k] = flag
    for pair in sets:
        key, value = _pair(pair, "--set", "key=value")
        fixed[key], sources[key] = literal(value), f"--set {key}"
        axes.pop(key, None)
    for pair in sweeps:
        key, value = _pair(pair, "--sweep", "key=value1,value2,...")
        texts = [v.strip() for v in value.split(",")]
        if not any(texts):
            raise FedhetError(f"--sweep expects key=value1,value2,..., got {pair!r}")
        if not all(texts):
            raise FedhetError(f"--sweep {pair!r} has an empty value (two commas, or one at an "
                              f"end); give each value once, e.g. {key}={','.join(t for t in texts if t)}")
        values = [literal(v) for v in texts]
        if key in fixed:
            raise FedhetError(f"--sweep {key} and {sources[key]} both set {key}; give one")
        if key in axes:
            twice = "is given twice" if sources[key].startswith("--sweep") else \
                f"and {sources[key]} both list values of {key}"
            raise FedhetError(f"--sweep {key} {twice}; give all its values once, e.g. --sweep "
                              f"{key}={','.join(dict.fromkeys(map(str, [*axes[key], *values])))}")
        axes[key], sources[key] = values, f"--sweep {key}"
    for k, registry in REGISTRIES.items():
        if isinstance(fixed.get(k), str):
            fixed[k] = registry.canonical(fixed[k])
        if k in axes:
            axes[k] = [registry.canonical(v) if isinstance(v, str) else v for v in axes[k]]
    named = None
    if title:
        methods = axes.get("algorithm") or [fixed.get("algorithm", "fedavg")]
        data = axes.get("dataset") or [fixed.get("dataset", "digits")]
        named = f"{' vs '.join(map(str, methods))} on {', '.join(map(str, data))}"
    return GridChanges(fixed, axes, sources, named)


def dir_name(grid: GridChanges) -> str:
    """A command-line grid's directory name from its methods and data (`fedavg+fedprox-digits`)."""
    methods = "+".join(map(str, grid.sweeps.get("algorithm") or [grid.fixed.get("algorithm", "fedavg")]))
    data = "+".join(map(str, grid.sweeps.get("dataset") or [grid.fixed.get("dataset", "digits")]))
    return f"{methods[:60]}-{data[:40]}".replace("/", "_")


def dry_run(grid: Grid) -> list[str]:
    """`compare --dry-run`'s lines: the title and run count, each run with the settings that
    tell it apart, then the settings every run shares."""
    keys = list(dict.fromkeys(k for spec in grid.specs for k in spec.settings))

    def shown(settings: dict[str, Any], k: str) -> str:
        return json.dumps(settings.get(k), sort_keys=True)

    varying = [k for k in keys if len({shown(s.settings, k) for s in grid.specs}) > 1]
    width = max(len(s.name) for s in grid.specs)
    lines = [f"{grid.title}: {len(grid.specs)} runs (dry run: nothing is run or written)"]
    for spec in grid.specs:
        differ = " ".join(f"{k}={spec.settings[k]}" for k in varying if k in spec.settings)
        lines.append(f"  {spec.name:<{width}}  {differ}".rstrip())
    shared = [f"{k}={grid.specs[0].settings[k]}" for k in keys if k not in varying]
    lines.append(f"shared: {' '.join(shared)}; every other setting at its default (fedhet list)"
                 if shared else "shared: every setting not named above at its default (fedhet list)")
    return lines
