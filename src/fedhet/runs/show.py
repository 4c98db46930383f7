"""`fedhet config show`: the settings a command would use, each with where it came from.

The output is a list of `Section`s (a title and rows of setting, value, source), made by the
functions in `SECTIONS` in order and printed by `render`. A new section (e.g. the execution
plan: device, executor, workers and why) is one function registered with `add_section`; it gets
the `Shown` run (its `RunConfig`, the sources, the layers) and returns a `Section` or None.
Like Hydra's `--cfg job`: nothing is loaded, trained or written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedhet.engine import (
    COMPONENTS,
    ENGINE_FIELDS,
    FIELD_DOCS,
    RUNTIME,
    RunConfig,
    config_sources,
)


@dataclass(frozen=True)
class Row:
    """One line: a setting (or any name), its value, where it came from, an optional note."""

    key: str
    value: Any
    source: str = ""
    note: str = ""


@dataclass(frozen=True)
class Section:
    title: str
    rows: list[Row] = field(default_factory=list)


@dataclass(frozen=True)
class Shown:
    """What a section function gets: the run as built, each setting's source (`config_sources`)
    and the layers it was built from (`(source, {path: value})`, later wins)."""

    cfg: RunConfig
    sources: dict[str, str]
    layers: Sequence[tuple[str, Mapping[str, Any]]]


SectionFn = Callable[[Shown], Section | None]
SECTIONS: list[SectionFn] = []
"""The section functions, in printing order (`add_section` appends)."""


def add_section(fn: SectionFn) -> SectionFn:
    """Register `fn` as the next section of `fedhet config show` (usable as a decorator)."""
    SECTIONS.append(fn)
    return fn


def _rows(shown: Shown, keys: Sequence[str]) -> list[Row]:
    flat = shown.cfg.flat()
    return [Row(k, flat[k], shown.sources[k], FIELD_DOCS.get(k, "")) for k in keys]


@add_section
def _run_section(shown: Shown) -> Section:
    """The components by name, then the engine settings that shape what a run computes."""
    keys = [*COMPONENTS, *(k for k in ENGINE_FIELDS if k not in COMPONENTS and k not in RUNTIME)]
    return Section("run", _rows(shown, keys))


def _component_section(kind: str) -> SectionFn:
    def section(shown: Shown) -> Section | None:
        keys = [k for k in shown.cfg.flat() if k.startswith(f"{kind}.")]
        name = shown.cfg.flat()[kind]
        return Section(f"{kind} {name}", _rows(shown, keys)) if keys else None

    section.__name__ = f"_{kind}_section"
    return section


for _kind in COMPONENTS:
    add_section(_component_section(_kind))


@add_section
def _runtime_section(shown: Shown) -> Section:
    """Where and how the run computes (`RUNTIME`): what `--device`, `--executor` and
    `--workers` set."""
    return Section("runtime", _rows(shown, [k for k in ENGINE_FIELDS if k in RUNTIME]))


def sections(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Section]:
    """Build the run from `layers` (an invalid one raises its `FedhetError`) and make every
    registered section of it."""
    cfg, sources = config_sources(layers)
    shown = Shown(cfg, sources, layers)
    return [s for fn in SECTIONS if (s := fn(shown)) is not None]


def _value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | bool | list) or value is None else str(value)


def render(parts: Sequence[Section]) -> str:
    """The sections as aligned text: a title line, then `  key  value  source  # note`."""
    rows = [r for s in parts for r in s.rows]
    kw = max((len(r.key) for r in rows), default=0)
    vw = min(max((len(_value(r.value)) for r in rows), default=0), 40)
    sw = max((len(r.source) for r in rows), default=0)
    lines: list[str] = []
    for s in parts:
        lines.append(f"{s.title}:")
        for r in s.rows:
            note = f"  # {r.note}" if r.note else ""
            lines.append(f"  {r.key:<{kw}}  {_value(r.value):<{vw}}  {r.source:<{sw}}{note}".rstrip())
    return "\n".join(lines)


def as_json(parts: Sequence[Section]) -> str:
    """The sections as JSON: `{title: {key: {"value", "source", "note"}}}`."""
    return json.dumps({s.title: {r.key: {"value": r.value, "source": r.source, "note": r.note}
                                 for r in s.rows} for s in parts}, indent=2, default=str)


@add_section
def _plan_section(shown: Shown) -> Section:
    """Where the run would compute on this machine and why (`engine.plan`): the device, the
    executor, the worker processes and the backend, each with the rule that chose it."""
    from fedhet.engine import describe_plan  # the plan weighs the run's work: import late

    return Section("plan (on this machine)",
                   [Row(key, value, "", reason) for key, value, reason in describe_plan(shown.cfg)])
