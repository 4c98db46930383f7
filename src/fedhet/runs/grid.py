"""`fedhet compare`: a grid TOML file expanded into `RunSpec`s (format: docs/grids.md).

A grid has `[base]` settings shared by every run, `[axes]` whose lists are crossed, and
optional `[[variant]]` tables, each one method (an algorithm with its own settings; lists in a
variant expand within it). `axes.algorithm` lists plain methods. Every expanded run is resolved
with `fedhet.engine.config.resolve` before anything runs; an error names the grid file and the
line of the offending key.

This module imports no torch at import time, so pool workers can limit threads first.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.algorithms import ALGORITHMS
from fedhet.data import absolute, is_data_path
from fedhet.engine import (
    ENGINE_FIELDS,
    REGISTRIES,
    RUNTIME,
    chosen_components,
    config_of,
    flatten,
    parse,
    path_of,
    read_toml_file,
)
from fedhet.errors import FedhetError
from fedhet.rundir import atomic_write_text, damaged, read_json, to_json
from fedhet.rundir import ownership as rundir
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


@dataclass(frozen=True)
class Changes:
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


# -- locating keys in the TOML text --------------------------------------------------------
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_.\-]+)\s*=""")


def _unquote(key: str) -> str:
    parts = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[^.\s]+', key)
    return ".".join(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def key_lines(text: str) -> dict[str, dict[str, int]]:
    """`{section: {flat key: line}}`; sections are `""`, `base`, `axes`, `variant#0`, ...

    Sub-tables (`[base.algorithm_params]`) fold into their section with a dotted key prefix.
    """
    out: dict[str, dict[str, int]] = {"": {}}
    section, prefix, variants = "", "", 0
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _HEADER.match(line)
        if m and not _KEY.match(line):
            name = _unquote(m.group(2))
            head, _, rest = name.partition(".")
            if m.group(1) == "[[" and head == "variant":
                section, variants = f"variant#{variants}", variants + 1
            else:
                section = head
            prefix = f"{rest}." if rest else ""
            out.setdefault(section, {}).setdefault(rest, lineno)
            continue
        k = _KEY.match(line)
        if k:
            out.setdefault(section, {}).setdefault(prefix + _unquote(k.group(1)), lineno)
    return out


# -- parsing and expansion -----------------------------------------------------------------
class _Locator:
    def __init__(self, path: Path, lines: dict[str, dict[str, int]],
                 given: Mapping[str, str] | None = None) -> None:
        self.path, self.lines, self.given = path, lines, dict(given or {})

    def line(self, section: str, key: str) -> int | None:
        table = self.lines.get(section, {})
        for k in (key, path_of(key)):
            if k in table:
                return table[k]
        for k, n in table.items():
            if path_of(k) == path_of(key):
                return n
        return None

    def where(self, section: str, key: str = "") -> str:
        if key and section in ("base", "axes") and path_of(key) in self.given:
            return self.given[path_of(key)]  # a setting typed on the command line
        n = self.line(section, key) if key else None
        if n is None and not section and key:  # a top-level table: its [header] line
            n = self.lines.get(key, {}).get("") or self.lines.get(f"{key}#0", {}).get("")
        if n is None and section:
            n = self.lines.get(section, {}).get("")
        return f"{self.path}:{n}" if n else str(self.path)

    def fail(self, section: str, key: str, message: str) -> FedhetError:
        return FedhetError(f"{self.where(section, key)}: {message}")


@dataclass
class _Setting:
    value: Any
    section: str
    key: str


def _methods(doc: dict[str, Any], axes: dict[str, Any], loc: _Locator) -> list[dict[str, Any]]:
    """Each method: `{"label": str | None, "settings": {key: _Setting}, "axes": {key: [...]}}`."""
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
        fixed = {k: _Setting(v, section, k) for k, v in flat.items() if not isinstance(v, list)}
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
                "label": None, "settings": {"algorithm": _Setting(name, "axes", "algorithm")},
                "axes": {},
            })
    return methods or [{"label": None, "settings": {}, "axes": {}}]


def _product(axes: dict[str, tuple[list[Any], str]]) -> list[dict[str, _Setting]]:
    """Every combination; an axis value that is a table sets several keys together."""
    keys = list(axes)
    out = []
    for combo in itertools.product(*(axes[k][0] for k in keys)):
        settings: dict[str, _Setting] = {}
        for k, v in zip(keys, combo, strict=True):
            bundle = flatten(v) if isinstance(v, dict) else {k: v}
            settings.update({path_of(kk): _Setting(vv, axes[k][1], k) for kk, vv in bundle.items()})
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


def load_grid(path: str | Path | None, changes: Changes | None = None) -> Grid:
    """Parse, expand and validate a grid file (or, with `path` None, the grid `changes` alone
    make); raises `FedhetError` naming the line, or the flag, of the culprit."""
    changes = changes or Changes()
    file_moved = False
    if path is None:
        text, path = "", Path("command line")
        doc: dict[str, Any] = {}
    else:
        path = Path(path)
        text, raw = read_toml_file(path, "grid file")
        doc = absolute_paths(raw, path.resolve().parent)  # the file's paths: beside it
        file_moved = doc is not raw
        doc = _load_recorded_plugins(doc, path)
    recorded = list(doc.get("plugins") or [])
    now = plugins.loaded()
    if now and not set(now) <= set(recorded):  # the saved grid names every plugin its runs use
        doc = {**doc, "plugins": list(dict.fromkeys([*recorded, *now]))}
        file_moved = True
    if changes:
        doc = apply_changes(doc, changes)
    if not text and changes.title:
        doc = {"title": changes.title, **doc}
    loc = _Locator(path, key_lines(text), changes.sources)
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


def _load_recorded_plugins(doc: dict[str, Any], path: Path) -> dict[str, Any]:
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


def _grid(doc: dict[str, Any], path: Path, loc: _Locator) -> Grid:
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
    base = {k: _Setting(v, "base", k) for k, v in flatten(base_raw).items()}
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
    _check_duplicates(runs, keys, specs, methods, axes, loc)
    return Grid(path, str(title), specs, float(target) if target is not None else None, loc.lines)


def apply_changes(doc: dict[str, Any], changes: Changes) -> dict[str, Any]:
    """The grid document with `changes` made (`Changes`): a fixed setting goes into `[base]`
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


def _check_keys(base: dict[str, _Setting], axes: dict[str, tuple[list[Any], str]], loc: _Locator,
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


def _expand(base, axes, methods, loc, chosen=None) -> list[tuple[int, dict[str, _Setting]]]:
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


def _validate_run(settings: dict[str, _Setting], loc: _Locator) -> str:
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


def _culprit(message: str, settings: dict[str, _Setting]) -> _Setting | None:
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


# -- duplicate cells ---------------------------------------------------------------------------
NOT_A_CELL = frozenset(RUNTIME)
"""Settings that do not change what a run computes; two runs that differ only here are one cell."""


def cell_key(config: dict[str, Any]) -> str:
    """What makes a run distinct: its resolved config (defaults filled in, values coerced, so
    `lr = 1` and `lr = 1.0`, or a parameter given at its default and left out, are the same),
    less `NOT_A_CELL`."""
    return json.dumps({k: v for k, v in config.items() if k not in NOT_A_CELL}, sort_keys=True,
                      default=str)


def duplicate_groups(keys: list[str]) -> list[list[int]]:
    """Indices of the runs that share a key, one list per key that occurs more than once."""
    where: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        where.setdefault(key, []).append(i)
    return [ix for ix in where.values() if len(ix) > 1]


def _check_duplicates(runs, keys, specs, methods, axes, loc) -> None:
    """Refuse a grid in which two runs are the same cell (it would run it twice and report the
    seeds' spread as ± 0): repeated axis values, a method listed twice, a bundle or variant that
    repeats another one, or two spellings of one value."""
    groups = duplicate_groups(keys)
    if not groups:
        return
    cells = "; ".join(" = ".join(specs[i].name for i in ix) for ix in groups[:3])
    more = f" (and {len(groups) - 3} more)" if len(groups) > 3 else ""
    first = groups[0]
    a, b = runs[first[0]][1], runs[first[1]][1]
    differ = sorted(k for k in set(a) | set(b)
                    if k not in a or k not in b or _same(a[k].value) != _same(b[k].value))
    if differ:
        # e.g. `lr = [1, 1.0]`, or a value that only restates the default
        k = differ[0]
        s = a.get(k) or b[k]
        shown = ", ".join(f"{d}: {_show(a, d)} vs {_show(b, d)}" for d in differ[:3])
        why = f"their settings differ only in spelling or defaults ({shown})"
    else:
        s, why = _repeated(methods, axes, a)
    where = loc.where(s.section, s.key) if s is not None else str(loc.path)
    raise FedhetError(
        f"{where}: duplicate runs, the same cell twice: {cells}{more}; {why}; remove the repeat"
    )


def _same(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _show(settings: dict[str, _Setting], key: str) -> str:
    return repr(settings[key].value) if key in settings else "(default)"


def _repeated(methods, axes, settings: dict[str, _Setting]) -> tuple[_Setting | None, str]:
    """Where two identical runs come from, and why: an axis (grid or method) whose list holds
    one value twice, two axes that set the same setting, or a method listed twice."""
    tables = [(k, v) for k, (v, _) in axes.items()]
    for m in methods:
        tables += [(k, v) for k, (v, _) in m["axes"].items()]
    setters: dict[str, list[str]] = {}
    for key, values in tables:
        bundles = [{path_of(kk): vv for kk, vv in
                    (flatten(v) if isinstance(v, dict) else {key: v}).items()} for v in values]
        seen = [_same(b) for b in bundles]
        if len(set(seen)) < len(seen):
            return settings.get(path_of(key)) or _Setting(None, "axes", key), (
                f"{key} lists one value twice")
        for k in {k for b in bundles for k in b}:
            setters.setdefault(k, []).append(key)
    for k, keys in setters.items():
        if len(keys) > 1:
            return settings.get(k), f"{' and '.join(keys)} both set {k}, so one hides the other"
    return settings.get("algorithm"), "a method is listed twice"


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


def _varying_keys(runs: list[dict[str, _Setting]]) -> list[str]:
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


def write_manifest(out: Path, title: str, specs: list[RunSpec], target: float | None, **extra: Any) -> None:
    """`DIR/grid.json`: what `report` and re-runs need to rebuild the tables."""

    atomic_write_text(out / "grid.json", to_json({
        "title": title, "target_accuracy": target, **extra,
        "runs": [{"name": s.name, "group": s.group, "label": s.label, "settings": s.settings} for s in specs],
    }))


MANIFEST_FIX = ("fedhet writes it as {\"title\", \"runs\": [{\"name\", \"group\", \"label\", "
                "\"settings\"}, ...]}; run the grid again (`fedhet compare --config GRID.toml --out "
                "DIR`, or `fedhet reproduce`) to write it anew")


def read_manifest(out: Path) -> dict[str, Any] | None:
    """`DIR/grid.json` checked (`MANIFEST_FIX`'s shape: each run a plain directory name under
    `DIR/runs/`), or None when there is none; a damaged one, or a grid directory (its marker
    says so) without one, is one `FedhetError`."""
    path = out / "grid.json"
    if not path.exists():
        if rundir.kind(out) == "grid":
            raise damaged(path, "is missing", MANIFEST_FIX)
        return None
    manifest = read_json(path, MANIFEST_FIX)
    runs = manifest.get("runs")
    if not isinstance(runs, list):
        raise damaged(path, "has no list of runs", MANIFEST_FIX)
    for i, run in enumerate(runs):
        fields = [run.get(k) for k in ("name", "group", "label")] if isinstance(run, dict) else [None]
        if not all(isinstance(f, str) for f in fields) or not _plain_name(run["name"]):
            raise damaged(path, f"run {i} is not {{\"name\", \"group\", \"label\"}} with a plain "
                          "directory name", MANIFEST_FIX)
    return manifest


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name \
        and "\x00" not in name
