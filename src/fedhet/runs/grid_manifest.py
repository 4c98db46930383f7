"""A grid directory's manifest, `DIR/grid.json`: the title, target and runs (name, group,
label, settings) that `report` and re-runs rebuild the tables from; written, and read back
checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedhet.rundir import atomic_write_text, damaged, read_json, to_json
from fedhet.rundir import ownership as rundir
from fedhet.runs.presets import RunSpec


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
