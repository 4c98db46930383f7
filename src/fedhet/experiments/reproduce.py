"""`fedhet reproduce PAPER --scale smoke|small|paper --out DIR`: run a paper's preset.

Stages run in order (a stage may read what earlier ones wrote, e.g. FedVeca's `τ_all`); the
runs of one stage run in parallel. The output directory has the same layout as `compare`'s
(`runs/`, `grid.json`, `results.csv`, `summary.md`) plus `report.md`, which puts the paper's
published numbers beside ours.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from fedhet.engine.store import atomic_write_text
from fedhet.errors import FedhetError
from fedhet.experiments.grid import write_manifest
from fedhet.experiments.presets import PRESETS, SCALES, Preset, RunSpec
from fedhet.experiments.results import collect, compare_published, published_markdown
from fedhet.experiments.runner import plan_jobs, run_specs


def load_preset(paper: str, scale: str) -> Preset:
    if scale not in SCALES:
        raise FedhetError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
    return PRESETS.get(paper).factory(scale)


def _check_specs(paper: str, specs: list[RunSpec]) -> None:
    from fedhet.experiments.single import resolve_settings

    names = set()
    for spec in specs:
        if spec.name in names:
            raise FedhetError(f"preset {paper}: two runs are named {spec.name!r}")
        names.add(spec.name)
        try:
            resolve_settings(spec.settings, f"preset {paper}, run {spec.name}")
        except FedhetError as e:
            raise FedhetError(f"preset {paper}, run {spec.name}: {e}") from None


def reproduce(
    paper: str, scale: str, out: Path, jobs: int | None = None, force: bool = False,
    tensorboard: bool = False, stream: TextIO | None = None,
) -> Preset:
    preset = load_preset(paper, scale)
    if tensorboard:
        from fedhet.experiments.tensorboard import require_tensorboard

        require_tensorboard()
    out.mkdir(parents=True, exist_ok=True)
    title = f"{paper} ({scale})"
    specs: list[RunSpec] = []
    errors: dict[str, str] = {}
    for i, stage in enumerate(preset.stages, 1):
        new = stage(out)
        _check_specs(paper, specs + new)
        plan_jobs(new, out / "runs", force)
        specs += new
        write_manifest(out, title, specs, preset.target_accuracy, paper=paper, scale=scale,
                       published=preset.published, notes=preset.notes)
        if len(preset.stages) > 1:
            (stream or sys.stderr).write(f"stage {i}/{len(preset.stages)}: {len(new)} runs\n")
        errors.update(run_specs(new, out / "runs", jobs, force, tensorboard, stream))
        if errors:
            break
    rows = collect(out, title, specs, preset.target_accuracy, errors)
    text = f"# {paper}: ours vs published ({scale} scale)\n\n"
    if preset.notes:
        text += preset.notes.strip() + "\n\n"
    if scale != "paper":
        text += (f"Scale `{scale}` is smaller than the paper's setting: expect the trends, not "
                 "the numbers.\n\n")
    if preset.published:
        text += published_markdown(compare_published(rows, preset.published))
    else:
        text += "The paper gives no numbers to compare with (its results are figures).\n"
    text += "\nFull tables: summary.md; per run: results.csv; plots: `fedhet report " + str(out) + "`.\n"
    atomic_write_text(out / "report.md", text)
    _html_report(out, stream)
    if errors:
        raise FedhetError(
            f"{len(errors)} run(s) failed ({', '.join(sorted(errors))}); first error: "
            f"{next(iter(errors.values()))}"
        )
    return preset


def _html_report(out: Path, stream: TextIO | None) -> None:
    """Also render report.html; a plotting problem is reported, never fatal to the results."""
    from fedhet.experiments.report import write_report

    err = stream or sys.stderr
    try:
        write_report(out, warn=lambda m: err.write(m + "\n"))
    except Exception as e:  # noqa: BLE001
        err.write(f"warning: report.html not written ({type(e).__name__}: {e}); "
                  f"try `fedhet report {out}`\n")
