"""`fedhet list`: the settings, the registered components and the shipped settings files."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from fedhet.configs import is_grid, shipped


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    ls = sub.add_parser("list", help="settings, algorithms, datasets, partitions, models and "
                        "shipped settings files; a component of a plugin is marked [plugin SPEC]")
    ls.set_defaults(func=command)
    return ls


def command(args: argparse.Namespace) -> int:
    _settings()
    _components()
    _metrics()
    files = shipped()
    print("shipped settings files (--config NAME):")
    print(f"  run files: {', '.join(n for n, p in files.items() if not is_grid(p))}")
    print(f"  grids (fedhet compare): {', '.join(n for n, p in files.items() if is_grid(p))}")
    return 0


def _settings() -> None:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import ENGINE_FIELDS, FIELD_DOCS, REGISTRIES, engine_defaults

    defaults = engine_defaults()
    print("settings (--set KEY=VALUE, or KEY = VALUE in a run file; default, meaning):")
    for key in ENGINE_FIELDS:
        if key in REGISTRIES:
            continue
        shown = f"{key}={_shown(defaults[key])}"
        print(f"  {shown:<26} {FIELD_DOCS.get(key, '')}".rstrip())


def _components() -> None:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.engine import REGISTRIES, engine_defaults

    defaults = engine_defaults()
    for kind in ("algorithm", "dataset", "partition", "model"):
        registry = REGISTRIES[kind]
        print(f"{kind}s (--{kind}, default {defaults[kind]}; parameters: --set {kind}.NAME=VALUE):")
        for entry in registry:
            fields = dataclasses.fields(entry.params)
            old = {new: name for name, new in getattr(entry.params, "ALIASES", {}).items()}
            ps = ", ".join(
                f"{f.name}={_default(f)}" + (f" (formerly {old[f.name]})" if f.name in old else "")
                for f in fields
            )
            origin = "" if entry.source == "fedhet" else f" [{entry.source}]"
            print(f"  {entry.name:<16} {entry.doc}{origin}")
            if ps:
                print(f"  {'':<16} params: {ps}")


def _metrics() -> None:
    # lazy: a command imports torch only when it runs (fast --help and flag errors)
    from fedhet.metrics import METRICS

    print("metrics (--set metrics=NAME,...; registered with fedhet.register_metric, or any "
          "scikit-learn scorer name: f1_macro, balanced_accuracy, roc_auc_ovr, ...):")
    for entry in METRICS:
        origin = "" if entry.source == "fedhet" else f" [{entry.source}]"
        print(f"  {entry.name:<16} {entry.doc}{origin}")


def _shown(value: Any) -> str:
    return "()" if value == () else str(value)


def _default(f: Any) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "?"
