"""The grid document (a grid file's TOML as a dict) before it is expanded into runs: changed
on the command line (`GridChanges`, `apply_changes`), its recorded plugins imported
(`load_recorded_plugins`), its paths made absolute (`absolute_paths`), and written back as TOML
(`to_toml`) for the grid directory's `grid.toml`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.data import absolute, is_data_path
from fedhet.engine import REGISTRIES, flatten, path_of
from fedhet.errors import FedhetError


@dataclass(frozen=True)
class GridChanges:
    """A grid changed on the command line (`fedhet compare`), Hydra-style.

    `fixed`: settings every run gets (`--set`, `-r`, ...): each replaces the grid's value and
    any axis or variant list of that setting, so `--set seed=0` runs one seed of a three-seed
    grid. `sweeps`: axes (`--sweep lr=0.01,0.1`), added to the grid's or replacing its axis of
    that setting. `sources`: path → what the user typed (`--set lr`), named in errors."""

    fixed: Mapping[str, Any] = field(default_factory=dict)
    sweeps: Mapping[str, list[Any]] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    title: str | None = None
    """The title of a grid made on the command line alone."""

    def __bool__(self) -> bool:
        return bool(self.fixed or self.sweeps)


def apply_changes(doc: dict[str, Any], changes: GridChanges) -> dict[str, Any]:
    """The grid document with `changes` made (`GridChanges`): a fixed setting goes into `[base]`
    and out of `[axes]` and every variant; a sweep becomes `[axes]`' list of that setting."""
    if not all(isinstance(doc.get(name, {}), dict) for name in ("base", "axes")):
        return doc  # not a grid's shape: `load_grid` says so, naming the line
    doc = dict(doc)
    base = {path_of(k): v for k, v in flatten(doc.get("base", {})).items()}
    axes = {path_of(k): v for k, v in flatten(doc.get("axes", {})).items()}
    variants = [{path_of(k): v for k, v in flatten(v).items()} if isinstance(v, dict) else v
                for v in doc.get("variant", [])] if isinstance(doc.get("variant"), list) else None
    for key, value in changes.fixed.items():
        key = path_of(key)
        axes.pop(key, None)
        for v in variants or []:
            if isinstance(v, dict):
                v.pop(key, None)
        base[key] = value
    for key, values in changes.sweeps.items():
        axes[path_of(key)] = list(values)
    doc["base"], doc["axes"] = base, axes
    if variants is not None:
        doc["variant"] = variants
    return doc


def load_recorded_plugins(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Import the plugins a grid file records (`plugins = ["my_nets.py", "mypkg.algos"]`, a
    file relative to the grid file; fedhet saves them absolute in a grid directory's
    grid.toml), so its components are known; returns `doc` with the files absolute."""
    specs = doc.get("plugins")
    if specs is None:
        return doc
    if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
        raise FedhetError(f"{path}: plugins must be a list of plugin files or modules, e.g. "
                          f'plugins = ["my_algos.py"], got {specs!r}')
    here = path.resolve().parent
    specs = [str(here / Path(s).expanduser()) if plugins.is_file_spec(s) else s for s in specs]
    plugins.ensure(specs, f"grid file {path}")
    return {**doc, "plugins": [plugins.canonical(s) for s in specs]}


PATH_SETTINGS = ("dataset", "dataset.test", "partition.path", "data_dir")
"""Settings whose value may be a file or folder: in a grid file, relative to the file's
directory; on the command line, to the current one."""


def absolute_paths(doc: dict[str, Any], base: Path | None = None) -> dict[str, Any]:
    """The grid document with each path in `PATH_SETTINGS` (in `[base]`, `[axes]` and every
    variant) made absolute, relative to `base` (None: the current directory), as the saved
    `grid.toml` records it: the grid then runs again from any directory, as its runs'
    `config.json` do. `doc` itself when none is relative."""
    moved = False

    def is_path(key: str, value: str) -> bool:
        if key.startswith("dataset"):  # a registered name, or a file
            datasets = REGISTRIES["dataset"]
            beside = base is not None and (base / Path(value).expanduser()).exists()
            return datasets.canonical(value) not in datasets and (is_data_path(value) or beside)
        return bool(value)

    def fix(key: str, value: Any) -> Any:
        nonlocal moved
        if isinstance(value, list):
            return [fix(key, v) for v in value]
        if isinstance(value, str) and is_path(key, value):
            here = Path(value).expanduser()
            whole = absolute(str(here if base is None or here.is_absolute() else base / here))
            moved = moved or whole != value
            return whole
        return value

    def table(section: Any) -> Any:
        if not isinstance(section, dict):
            return section
        flat = flatten(section)
        return {k: fix(path_of(k), v) if path_of(k) in PATH_SETTINGS else v for k, v in flat.items()}

    out = dict(doc)
    for name in ("base", "axes"):
        if name in out:
            out[name] = table(out[name])
    if isinstance(out.get("variant"), list):
        out["variant"] = [table(v) for v in out["variant"]]
    return out if moved else doc


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value), ensure_ascii=False)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def to_toml(doc: Mapping[str, Any], comment: str = "") -> str:
    """A grid document as TOML text that `load_grid` reads back to the same runs (dotted
    setting names quoted, one table per section, `[[variant]]` for each variant)."""
    lines = [f"# {comment}"] if comment else []
    for key, value in doc.items():
        if key not in ("base", "axes", "variant"):
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for name in ("base", "axes"):
        if doc.get(name):
            lines += ["", f"[{name}]"]
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in doc[name].items()]
    for variant in doc.get("variant", []) or []:
        lines += ["", "[[variant]]"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in flatten(variant).items()]
    return "\n".join(lines) + "\n"

