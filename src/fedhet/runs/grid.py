"""`fedhet compare`: a grid TOML file expanded into `RunSpec`s (format: docs/grids.md).

A grid has `[base]` settings shared by every run, `[axes]` whose lists are crossed, and
optional `[[variant]]` tables, each one method (an algorithm with its own settings; lists in a
variant expand within it). `axes.algorithm` lists plain methods. Every expanded run is resolved
with `fedhet.engine.config_of` before anything runs; an error names the grid file and the
line of the offending key.

The grid's parts, each in its own module: the document before expansion (command-line
changes, plugins, paths, TOML out: `grid_document`), where each key was written
(`grid_lines`), what makes two runs one cell (`grid_cells`) and the grid directory's
`grid.json` (`grid_manifest`).

This module imports no torch at import time, so pool workers can limit threads first.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.algorithms import ALGORITHMS
from fedhet.engine import (
    ENGINE_FIELDS,
    REGISTRIES,
    chosen_components,
    config_of,
    flatten,
    parse,
    path_of,
    read_toml_file,
)
from fedhet.errors import FedhetError
from fedhet.runs.grid_cells import cell_key, check_duplicates
from fedhet.runs.grid_document import (
    GridChanges,
    absolute_paths,
    apply_changes,
    load_recorded_plugins,
    to_toml,
)
from fedhet.runs.grid_lines import Locator, Setting, key_lines
from fedhet.runs.presets import RunSpec

TOP_KEYS = ("title", "target_accuracy", "columns", "plugins", "base", "axes", "variant")
METHOD_PREFIX = "algorithm"


@dataclass
class Grid:
    path: Path
    title: str
    specs: list[RunSpec]
    target_accuracy: float | None = None
    lines: dict[str, dict[str, int]] = field(default_factory=dict)
    text: str = ""
    """The grid as TOML: the file's text, or (with command-line changes) the grid they make."""


def _methods(doc: dict[str, Any], axes: dict[str, Any], loc: Locator) -> list[dict[str, Any]]:
    """Each method: `{"label": str | None, "settings": {key: Setting}, "axes": {key: [...]}}`."""
    variants = doc.get("variant", [])
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise loc.fail("", "variant", "variants are written as [[variant]] tables")
    methods = []
    named = set()
    for i, variant in enumerate(variants):
        section = f"variant#{i}"
        flat = flatten(variant)
        label = flat.pop("label", None)
        if label is not None and not isinstance(label, str):
            raise loc.fail(section, "label", f"label must be a string, got {label!r}")
        fixed = {k: Setting(v, section, k) for k, v in flat.items() if not isinstance(v, list)}
        lists = {k: (v, section) for k, v in flat.items() if isinstance(v, list)}
        for k, (v, _) in lists.items():
            if not v:
                raise loc.fail(section, k, f"{k} is an empty list; give at least one value")
        if "algorithm" in fixed:
            named.add(_canonical("algorithm", fixed["algorithm"].value))
        methods.append({"label": label, "settings": fixed, "axes": lists})
    for name in axes.pop("algorithm", ([], "axes"))[0]:
        if _canonical("algorithm", name) not in named:
            methods.append({
                "label": None, "settings": {"algorithm": Setting(name, "axes", "algorithm")},
                "axes": {},
            })
    return methods or [{"label": None, "settings": {}, "axes": {}}]


def _product(axes: dict[str, tuple[list[Any], str]]) -> list[dict[str, Setting]]:
    """Every combination; an axis value that is a table sets several keys together."""
    keys = list(axes)
    out = []
    for combo in itertools.product(*(axes[k][0] for k in keys)):
        settings: dict[str, Setting] = {}
        for k, v in zip(keys, combo, strict=True):
            bundle = flatten(v) if isinstance(v, dict) else {k: v}
            settings.update({path_of(kk): Setting(vv, axes[k][1], k) for kk, vv in bundle.items()})
        out.append(settings)
    return out


def _canonical(key: str, value: Any) -> Any:
    """A component's name as registered (`FedAvg` → `fedavg`), so names and labels match the
    runs' configs; any other value as it is."""
    if key in REGISTRIES and isinstance(value, str) and value.lower() != "auto":
        return REGISTRIES[key].canonical(value)
    return value


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_") or "run"


def load_grid(path: str | Path | None, changes: GridChanges | None = None) -> Grid:
    """Parse, expand and validate a grid file (or, with `path` None, the grid `changes` alone
    make); raises `FedhetError` naming the line, or the flag, of the culprit."""
    changes = changes or GridChanges()
    file_moved = False
    if path is None:
        text, path = "", Path("command line")
        doc: dict[str, Any] = {}
    else:
        path = Path(path)
        text, raw = read_toml_file(path, "grid file")
        doc = absolute_paths(raw, path.resolve().parent)  # the file's paths: beside it
        file_moved = doc is not raw
        doc = load_recorded_plugins(doc, path)
    recorded = list(doc.get("plugins") or [])
    now = plugins.loaded()
    if now and not set(now) <= set(recorded):  # the saved grid names every plugin its runs use
        doc = {**doc, "plugins": list(dict.fromkeys([*recorded, *now]))}
        file_moved = True
    if changes:
        doc = apply_changes(doc, changes)
    if not text and changes.title:
        doc = {"title": changes.title, **doc}
    loc = Locator(path, key_lines(text), changes.sources)
    grid = _grid(doc, path, loc)
    travelling = absolute_paths(doc)  # the command line's: from the current directory
    moved = ", its data paths made absolute and its plugins recorded" \
        if travelling != doc or file_moved else ""
    if not changes and not moved:
        grid.text = text
    elif text:
        made = f" with {', '.join(changes.sources.values())}" if changes else ""
        grid.text = to_toml(travelling, f"the grid {path}{made}{moved}")
    else:
        grid.text = to_toml(travelling, f"a grid made on the command line{moved}")
    return grid


def _grid(doc: dict[str, Any], path: Path, loc: Locator) -> Grid:
    for key in doc:
        if key not in TOP_KEYS:
            hint = (f" ({path.name} reads like a run file: run it with `fedhet run --config {path}`, "
                    "or put its settings under [base])" if path_of(key) in ENGINE_FIELDS else "")
            raise loc.fail("", key, f"unknown grid key {key!r}{hint}; valid keys: {', '.join(TOP_KEYS)}")
    if not any(doc.get(k) for k in ("base", "axes", "variant")):  # not one default run
        raise FedhetError(f"grid file {path} sets no runs: give [base] settings, [axes] lists or "
                          "[[variant]] tables (docs/grids.md)")
    base_raw = doc.get("base", {})
    axes_raw = doc.get("axes", {})
    for name, table in (("base", base_raw), ("axes", axes_raw)):
        if not isinstance(table, dict):
            raise loc.fail("", name, f"{name} must be a table: [{name}]")
    base = {k: Setting(v, "base", k) for k, v in flatten(base_raw).items()}
    axes: dict[str, tuple[list[Any], str]] = {}
    for key, values in flatten(axes_raw).items():
        if not isinstance(values, list) or not values:
            raise loc.fail(
                "axes", key, f"axes.{key} must be a non-empty list of values, e.g. {key} = [a, b]"
            )
        axes[path_of(key)] = (values, "axes")
    target = doc.get("target_accuracy")
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 1
    ):
        raise loc.fail("", "target_accuracy", f"target_accuracy must be a fraction in (0, 1], got {target!r}")
    title = doc.get("title", path.stem)
    chosen = _grid_components(doc)
    _check_keys(base, axes, loc, chosen)
    methods = _methods(doc, axes, loc)
    runs = _expand(base, axes, methods, loc, chosen)
    keys = [_validate_run(settings, loc) for _, settings in runs]
    columns = doc.get("columns")
    if columns is not None and not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        raise loc.fail("", "columns", "columns must be a list of setting names, e.g. [\"partition\"]")
    if columns is not None:
        used = {k for _, settings in runs for k in settings}
        for c in columns:
            if path_of(c) not in used:
                raise loc.fail("", "columns", f"columns names {c!r}, which no run sets; "
                               f"choose from: {', '.join(sorted(used))}")
        columns = [path_of(c) for c in columns]
    specs = _to_specs(runs, methods, axes, columns, loc)
    check_duplicates(runs, keys, specs, methods, axes, loc)
    return Grid(path, str(title), specs, float(target) if target is not None else None, loc.lines)


def _check_keys(base: dict[str, Setting], axes: dict[str, tuple[list[Any], str]], loc: Locator,
                chosen: Mapping[str, str | tuple[str, ...]] | None = None) -> None:
    """Each setting name and (top-level) value type on its own, so the error has its line;
    `chosen`: the grid's components (`_grid_components`), for the hint of an unknown one."""
    for key, s in base.items():
        parse({key: s.value}, loc.where(s.section, key), chosen)
    for key, (values, section) in axes.items():
        for v in values:
            parse(v if isinstance(v, dict) else {key: v}, loc.where(section, key), chosen)


def _grid_components(doc: Mapping[str, Any]) -> dict[str, str | tuple[str, ...]]:
    """The components a grid's runs use, kind → name (one) or names (several: the methods of
    its axes and variants), the defaults where the grid names none."""
    found: dict[str, list[str]] = {}
    tables = [doc.get("base"), doc.get("axes"), *(doc.get("variant") or [])]
    for table in tables:
        if not isinstance(table, Mapping):
            continue
        for key, value in flatten(table).items():
            kind = path_of(key)
            values = value if isinstance(value, list) else [value]
            if kind in REGISTRIES:
                found.setdefault(kind, []).extend(v for v in values if isinstance(v, str))
    out: dict[str, str | tuple[str, ...]] = dict(chosen_components())
    for kind, names in found.items():
        known = tuple(dict.fromkeys(
            c for c in (chosen_components({kind: n}).get(kind) for n in names) if c))
        if known:
            out[kind] = known[0] if len(known) == 1 else known
    return out


def _expand(base, axes, methods, loc, chosen=None) -> list[tuple[int, dict[str, Setting]]]:
    """`(method index, settings)` for every run: base ← method ← method axes ← grid axes."""
    runs = []
    for m, method in enumerate(methods):
        _check_keys(method["settings"], method["axes"], loc, chosen)
        for inner in _product(method["axes"]):
            for outer in _product(axes):
                settings = {path_of(k): s for k, s in base.items()}
                settings.update({path_of(k): s for k, s in method["settings"].items()})
                settings.update({path_of(k): s for k, s in inner.items()})
                settings.update(outer)
                runs.append((m, settings))
    return runs


def _validate_run(settings: dict[str, Setting], loc: Locator) -> str:
    """Resolve one run (its error names the line of the culprit); returns its `cell_key`."""

    try:
        cfg = config_of({k: s.value for k, s in settings.items()}, "grid")
        return cell_key(cfg.to_dict())
    except FedhetError as e:
        message = str(e).removeprefix("grid: ")
        if re.match(r"unknown (algorithm|model|dataset|partition) ", message):
            head, sep, choices = message.partition("; choose one of")
            message = (f"{head}; one of your own comes from its plugin: name it (fedhet --plugin "
                       'my_file.py compare ...) or record it in the grid file (plugins = '
                       f'["my_file.py"]){sep}{choices}')
        culprit = _culprit(message, settings)
        if culprit is None:
            raise FedhetError(f"{loc.path}: {message}") from None
        raise loc.fail(culprit.section, culprit.key, message) from None


def _names(message: str, key: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message) is not None


def _culprit(message: str, settings: dict[str, Setting]) -> Setting | None:
    """The setting an error message is about: the longest key named in it, else a value."""
    aliases = ALGORITHMS.aliases()  # a setting spelt the old way is named in its current spelling

    def current(key: str) -> str:
        head, _, name = key.rpartition(".")
        return f"{head}.{aliases[name]}" if head and name in aliases else key

    named = [k for k in settings if _names(message, k) or _names(message, current(k))]
    if named:
        return settings[max(named, key=len)]
    for s in settings.values():
        if isinstance(s.value, str) and repr(s.value) in message:
            return s
    return None


def _to_specs(runs, methods, axes, columns, loc) -> list[RunSpec]:
    varying = _varying_keys([s for _, s in runs])
    method_keys = {k for m in methods for k in (*m["settings"], *m["axes"])}
    if columns is None:
        columns = [
            k for k in varying
            if k != "seed" and not k.startswith(METHOD_PREFIX) and k not in method_keys
        ]
    # a column's own parameters are part of it: with columns = ["partition"], α = 0.1 and 0.3
    # are two columns `partition=dirichlet, partition.alpha=0.1` and `…0.3`, not two labels
    columns = [*columns, *(k for k in varying if k not in columns and k.split(".")[0] in columns
                           and k.split(".")[0] != "algorithm")]
    specs, seen = [], set()
    for m, settings in runs:
        values = {k: _canonical(k, s.value) for k, s in settings.items()}
        given = methods[m]["label"]
        label = (
            _auto_label(values, [path_of(k) for k in methods[m]["axes"]], columns, given)
            if given else _auto_label(values, varying, columns)
        )
        group = ", ".join(f"{k}={_fmt(values[k])}" for k in columns if k in values) or "all"
        name = _slug(label) + ("" if group == "all" else "__" + _slug(group.replace(", ", "__")))
        name += f"__seed{values.get('seed', 0)}"
        unique, n = name, 1
        while unique in seen:
            n += 1
            unique = f"{name}-{n}"
        seen.add(unique)
        specs.append(RunSpec(unique, group, label, values))
    return specs


def _varying_keys(runs: list[dict[str, Setting]]) -> list[str]:
    keys: list[str] = []
    for settings in runs:
        keys.extend(k for k in settings if k not in keys)
    def values(k: str) -> set[str]:
        return {json.dumps(r[k].value if k in r else None, sort_keys=True) for r in runs}
    return [k for k in keys if len(values(k)) > 1]


def _auto_label(values: dict[str, Any], varying: list[str], columns: list[str], name: str = "") -> str:
    name = name or str(values.get("algorithm", "fedavg"))
    extra = [
        f"{k.removeprefix('algorithm.')}={_fmt(values[k])}"
        for k in varying if k in values and k not in columns and k not in ("seed", "algorithm")
    ]
    return f"{name} ({', '.join(extra)})" if extra else name
