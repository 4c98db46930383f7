"""What makes two runs of a grid the same cell, and the refusal of a grid that holds one cell
twice (it would run it twice and report the seeds' spread as ± 0), naming where the repeat
comes from.
"""

from __future__ import annotations

import json
from typing import Any

from fedhet.engine import RUNTIME, flatten, path_of
from fedhet.errors import FedhetError
from fedhet.runs.grid_lines import Locator, Setting
from fedhet.runs.presets import RunSpec

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


def check_duplicates(runs: list[tuple[int, dict[str, Setting]]], keys: list[str], specs: list[RunSpec],
                     methods: list[dict[str, Any]], axes: dict[str, tuple[list[Any], str]],
                     loc: Locator) -> None:
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
    s: Setting | None
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


def _show(settings: dict[str, Setting], key: str) -> str:
    return repr(settings[key].value) if key in settings else "(default)"


def _repeated(methods, axes, settings: dict[str, Setting]) -> tuple[Setting | None, str]:
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
            return settings.get(path_of(key)) or Setting(None, "axes", key), (
                f"{key} lists one value twice")
        for k in {k for b in bundles for k in b}:
            setters.setdefault(k, []).append(key)
    for k, keys in setters.items():
        if len(keys) > 1:
            return settings.get(k), f"{' and '.join(keys)} both set {k}, so one hides the other"
    return settings.get("algorithm"), "a method is listed twice"


