"""`fedhet reproduce PAPER --scale smoke|small|paper --out DIR`: run a paper's preset.

Stages run in order (a stage may read what earlier ones wrote, e.g. FedVeca's `τ_all`); the
runs of one stage run in parallel. The output directory has the same layout as `compare`'s
(`runs/`, `grid.json`, `results.csv`, `summary.md`) plus `report.md`, which puts the paper's
published numbers beside ours.
"""

from __future__ import annotations

import json
import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Protocol, TextIO, cast

from fedhet.engine import RunConfig, config_of, load
from fedhet.errors import FedhetError
from fedhet.papers.base import PRESETS, SETUPS
from fedhet.registry import did_you_mean
from fedhet.reports import write_report
from fedhet.rundir import atomic_write_text
from fedhet.rundir import ownership as rundir
from fedhet.runs import (
    DEFAULT_STACK_RUNS,
    SCALES,
    Preset,
    RunSpec,
    cell_key,
    cluster_session,
    collect,
    compare_published,
    duplicate_groups,
    plan_jobs,
    published_markdown,
    run_specs,
    run_units,
    uncovered_published,
    with_overrides,
    write_manifest,
)


class _SetupFactory(Protocol):
    """The preset factory of a paper with setups (`SETUPS`): `(scale, setup=None) -> Preset`."""

    def __call__(self, scale: str, setup: str | None = None) -> Preset: ...


def load_preset(paper: str, scale: str, setup: str | None = None) -> Preset:
    """`paper`'s preset at `scale`, in its default setup or in `setup` (`SETUPS[paper]`)."""
    if scale not in SCALES:
        raise FedhetError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
    factory = PRESETS.get(paper).factory
    if setup is None:
        return factory(scale)
    names = SETUPS.get(paper, ())
    if not names:
        have = ", ".join(f"{p} ({'/'.join(n)})" for p, n in sorted(SETUPS.items()))
        raise FedhetError(f"--setup: preset {paper} runs in one setup only; presets with setups: {have}")
    if setup not in names:
        raise FedhetError(f"--setup {setup!r}: preset {paper}'s setups are {', '.join(names)} "
                          f"(default {names[0]}){did_you_mean(setup, names)}")
    # a paper listed in SETUPS registered a factory that takes `setup` too; the registry holds
    # every paper's factory under one type, so it cannot say which do
    return cast(_SetupFactory, factory)(scale, setup=setup)


def default_out(paper: str, scale: str, setup: str | None = None) -> Path:
    """`runs/PAPER-SCALE`, with `-SETUP` for a setup other than the preset's default (so the
    two never share run directories)."""
    names = SETUPS.get(paper, ())
    tail = f"-{setup}" if setup and names and setup != names[0] else ""
    return Path(f"runs/{paper}-{scale}{tail}")


def check_data(paper: str, scale: str, specs: list[RunSpec]) -> None:
    """Load each dataset the runs need once, before any run starts: a missing one is one line
    naming its files (the loader's message) and how to run the parts whose data is here."""
    seen: dict[str, RunConfig] = {}
    for spec in specs:
        cfg = config_of(spec.settings, f"preset {paper}, run {spec.name}")
        seen.setdefault(json.dumps([cfg.dataset, cfg.to_dict()["dataset_params"], cfg.data_dir]), cfg)
    missing, here = [], []
    for cfg in seen.values():
        try:
            load(cfg, cache=True)
        except FedhetError as e:
            missing.append((cfg.dataset, str(e)))
        else:
            here.append(cfg.dataset)
    if missing:
        name, message = missing[0]
        others = sorted(set(here) - {m for m, _ in missing})
        hint = (f"; run the parts whose data is here with --only {','.join(others)}" if others
                else "")
        raise FedhetError(f"preset {paper} ({scale}) needs {name}: {message}{hint}")


def select(specs: list[RunSpec], datasets: tuple[str, ...] | None) -> list[RunSpec]:
    """The runs on `datasets` (all of them when None)."""
    if datasets is None:
        return specs
    return [s for s in specs if s.settings.get("dataset", "digits") in datasets]


def _check_specs(paper: str, specs: list[RunSpec]) -> None:
    names, keys = set(), []
    for spec in specs:
        if spec.name in names:
            raise FedhetError(f"preset {paper}: two runs are named {spec.name!r}")
        names.add(spec.name)
        try:
            cfg = config_of(spec.settings, f"preset {paper}, run {spec.name}")
        except FedhetError as e:
            raise FedhetError(f"preset {paper}, run {spec.name}: {e}") from None
        # the same settings may serve two tables (a sweep's default point is the main run),
        # but twice in one table cell they would be averaged as if they were two seeds
        keys.append(json.dumps([spec.group, spec.label, cell_key(cfg.to_dict())]))
    groups = duplicate_groups(keys)
    if groups:
        cells = "; ".join(" = ".join(specs[i].name for i in ix) for ix in groups)
        raise FedhetError(
            f"preset {paper}: duplicate runs, the same settings twice in one table cell: {cells}"
        )


def reproduce(
    paper: str, scale: str, out: Path, jobs: int | None = None, force: bool = False,
    tensorboard: bool = False, stream: TextIO | None = None, overrides: dict[str, Any] | None = None,
    stack_runs: int = DEFAULT_STACK_RUNS, only: tuple[str, ...] | None = None,
    cluster: Any = None, setup: str | None = None,
) -> Preset:
    """Run `paper`'s preset at `scale` into `out` (marked and locked like `compare`'s); returns
    the preset. Ctrl-C stops it as in `compare` (`runner.Interrupted`); calling again resumes.
    `cluster` (`fedhet.runs.cluster.ClusterOptions`): run on a cluster, not in `jobs`.
    `setup`: one of the preset's setups (`papers.base.SETUPS`; None: its default)."""
    preset = load_preset(paper, scale, setup)
    if tensorboard:
        # optional extra: fedhet[tensorboard]
        from fedhet.runs import require_tensorboard

        require_tensorboard()
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out {out} is a file; choose a directory")
    hint = (f"fedhet reproduce {paper} --scale {scale}" + (f" --setup {setup}" if setup else "")
            + f" --out {shlex.quote(str(out))}")
    if not out.exists() and preset.stages:  # a missing data file stops before `out` is made
        check_data(paper, scale, with_overrides(select(preset.stages[0](out), only), overrides))
    with rundir.exclusive(out, "reproduce"):
        rundir.mark(out, "grid")
        # one Ray connection (one local Ray) for every stage, not one per stage
        with cluster_session() if cluster is not None else nullcontext():
            _run_stages(paper, scale, preset, out, jobs, force, tensorboard, stream, hint,
                        overrides, stack_runs, only, cluster)
    return preset


def _run_stages(
    paper: str, scale: str, preset: Preset, out: Path, jobs: int | None, force: bool,
    tensorboard: bool, stream: TextIO | None, hint: str, overrides: dict[str, Any] | None = None,
    stack_runs: int = DEFAULT_STACK_RUNS, only: tuple[str, ...] | None = None,
    cluster: Any = None,
) -> None:
    """Run the preset's stages in order, then write results, report.md and report.html."""
    title = f"{paper} ({scale})"
    specs: list[RunSpec] = []
    errors: dict[str, str] = {}
    for i, stage in enumerate(preset.stages, 1):
        new = with_overrides(select(stage(out), only), overrides)
        if only is not None and i == 1 and not new:
            raise FedhetError(f"preset {paper} ({scale}) has no runs on {', '.join(only)}")
        _check_specs(paper, specs + new)
        check_data(paper, scale, new)
        plan_jobs(new, out / "runs", force)
        specs += new
        write_manifest(out, title, specs, preset.target_accuracy, paper=paper, scale=scale,
                       published=preset.published, notes=preset.notes)
        if len(preset.stages) > 1:
            (stream or sys.stderr).write(f"stage {i}/{len(preset.stages)}: {len(new)} runs\n")
        errors.update(run_specs(new, out / "runs", jobs, force, tensorboard, stream, hint,
                                stack_runs=stack_runs, cluster=cluster, backend=run_units))
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
        missing = uncovered_published(rows, preset.published)
        if missing:
            text += "\n" + missing + "\n"
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


def _html_report(out: Path, stream: TextIO | None) -> None:
    """Also render report.html; a plotting problem is reported, never fatal to the results."""

    err = stream or sys.stderr

    def warn(message: str) -> None:
        err.write(message + "\n")

    try:
        write_report(out, warn=warn)
    except Exception as e:  # noqa: BLE001
        err.write(f"warning: report.html not written ({type(e).__name__}: {e}); "
                  f"try `fedhet report {out}`\n")
