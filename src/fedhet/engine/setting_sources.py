"""Where each setting of a run came from (`fedhet config show`): the source of the last layer
of settings that set it, or the default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedhet.engine.config import REGISTRIES, RunConfig, build

DEFAULT = "default"


def config_sources(layers: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[RunConfig, dict[str, str]]:
    """The run `build` makes of `layers` (`(source, parse(...))` pairs, later wins) and, for
    each of its settings (`RunConfig.flat`'s paths), where its value came from: the source of
    the last layer that set it, else `DEFAULT` (`model` left at `auto` is `default (auto)`).

    Old parameter names (`ALIASES`) count as their current name."""
    cfg = build(*(values for _, values in layers))
    sources: dict[str, str] = {}
    for source, values in layers:
        for key in values:
            head, dot, name = key.partition(".")
            if dot and head in REGISTRIES:
                name = REGISTRIES[head].aliases().get(name, name)
                key = f"{head}.{name}"
            sources[key] = source
    out = {path: sources.get(path, DEFAULT) for path in cfg.flat()}
    if out["model"] == DEFAULT:
        out["model"] = f"{DEFAULT} (auto for {cfg.dataset})"
    return cfg, out
