"""A grid's jobs: which runs are still to do (`plan_jobs`), which step as one stack
(`stack_units`), and what a job's saved files say (`status_of`, `rounds_of`, `checkpoint_every`,
`components_of`).

A `Job` is one run of a grid: its name, settings, run directory and whether it resumes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedhet.engine import (
    COMPONENTS,
    REGISTRIES,
    RESUMABLE,
    RUNTIME,
    build,
    canonical_config,
    config_of,
    parse,
    would_stack,
)
from fedhet.errors import FedhetError
from fedhet.rundir import RunStore, is_finished, metrics_intact, read_config, read_summary, to_json
from fedhet.runs.presets import RunSpec


@dataclass(frozen=True)
class Job:
    name: str
    settings: dict[str, Any]
    out: str
    resume: bool
    tensorboard: bool = False


DEFAULT_STACK_RUNS = 8
"""[choice] Runs stepped as one cohort at most: enough to fill a GPU with the papers' small
models (8 runs × 100 clients), few enough that one run's failure or a Ctrl-C stops little."""


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def stack_key(job: Job, cuda: bool | None = None) -> str | None:
    """Jobs with the same key may step as one stack of runs (`fedhet.engine.stacked_runs`): the same
    data, model and device, on the stacked executor. None: this job runs on its own (it would
    use the sequential executor, or its settings do not build; it then reports that itself).
    `cuda`: whether `device = auto` finds a GPU where the job runs (None: on this machine)."""
    try:
        if job.resume:
            saved = canonical_config(read_config(job.out))
            runtime = {k: v for k, v in job.settings.items() if k in RUNTIME}
            cfg = build(parse(saved, "config.json"), parse(runtime, "settings"))
        else:
            cfg = config_of(job.settings)
    except (FedhetError, OSError, ValueError):
        return None
    if not would_stack(cfg, torch.cuda.is_available() if cuda is None else cuda):
        return None
    d = cfg.to_dict()
    fields = ("dataset", "dataset_params", "data_dir", "validation_fraction", "model",
              "model_params", "device", "executor")
    return json.dumps({f: d[f] for f in fields}, sort_keys=True)


def stack_units(jobs: list[Job], limit: int, cuda: bool | None = None) -> list[list[Job]]:
    """`jobs` as units of work: runs that share a `stack_key` in stacks of at most `limit`
    (in grid order), every other run on its own."""
    if limit <= 1:
        return [[job] for job in jobs]
    units: list[list[Job]] = []
    open_units: dict[str, list[Job]] = {}
    for job in jobs:
        key = stack_key(job, cuda)
        if key is None:
            units.append([job])
            continue
        unit = open_units.get(key)
        if unit is None or len(unit) >= limit:
            unit = open_units[key] = []
            units.append(unit)
        unit.append(job)
    return units


def with_overrides(specs: list[RunSpec], overrides: dict[str, Any] | None) -> list[RunSpec]:
    """`specs` with `overrides` (e.g. `--device cuda`) set in every run's settings."""
    if not overrides:
        return specs
    return [dataclasses.replace(s, settings={**s.settings, **overrides}) for s in specs]


def plan_jobs(
    specs: list[RunSpec], runs_dir: Path, force: bool, tensorboard: bool = False,
    extend: bool = False, resume_hint: str | None = None,
) -> tuple[list[Job], int]:
    """Jobs still to do (fresh or resumed) and the number of runs already finished.

    A run directory whose saved config differs from the spec's is an error (unless `force`,
    which starts every run again), so a changed grid never silently mixes settings. With
    `extend` (`compare --resume`), a run that differs only in what a resume may change
    (`RESUMABLE`: more rounds, evaluation and checkpoint intervals) is resumed with them, as
    `run --resume -r N` is; `resume_hint` is that command, named when the difference is refused.
    """

    jobs, done = [], 0
    for spec in specs:
        out = runs_dir / spec.name
        config_path = out / "config.json"
        resume = False
        results = [n for n in ("metrics.csv", "summary.json", "checkpoint.pt", "checkpoint.prev.pt")
                   if (out / n).exists()]
        if not force and results and not config_path.exists():
            raise FedhetError(
                f"{out} holds a run's {', '.join(results)} but no config.json (deleted or lost); "
                "restore it (the checkpoint holds the settings), or use --force to run the grid "
                "again from scratch"
            )
        if not force and config_path.exists():
            cfg = config_of(spec.settings)
            wanted = json.loads(to_json(cfg.to_dict()))
            # a damaged config.json is one line, before anything runs (--force starts it again)
            saved = json.loads(to_json(canonical_config(RunStore(out).read_config())))
            diff = sorted(k for k in wanted if saved.get(k) != wanted[k] and k not in RUNTIME)
            if diff and not (extend and set(diff) <= RESUMABLE):
                flags = " ".join(f"-r {wanted[k]}" if k == "rounds" else f"--set {k}={wanted[k]}"
                                 for k in diff)
                extending = f", or `{resume_hint} {flags}` to continue its runs" \
                    if resume_hint and set(diff) <= RESUMABLE else ""
                raise FedhetError(
                    f"{out} holds a run with other settings ({', '.join(diff)}); use --force to "
                    f"run the grid again from scratch, or another --out{extending}"
                )
            if not diff and is_finished(out) and metrics_intact(out):
                done += 1
                continue
            resume = True  # a damaged summary.json or metrics.csv is written again from the checkpoint
        jobs.append(Job(spec.name, spec.settings, str(out), resume, tensorboard))
    return jobs, done


def status_of(job: Job) -> tuple[int, float, float]:
    """A run's rounds done, latest accuracy and loss, from its summary.json (0, nan, nan: none yet)."""
    try:
        s = read_summary(job.out, missing_ok=True)
        return (int(s.get("rounds_done", 0)), float(s.get("final_accuracy", float("nan"))),
                float(s.get("final_loss", float("nan"))))
    except (FedhetError, ValueError, TypeError):  # damaged: the run rewrites it
        return 0, float("nan"), float("nan")


def _setting(job: Job, key: str, default: int) -> int:
    """An integer setting of a job: from the saved config when it resumes."""
    if job.resume:
        try:
            return int(read_config(job.out)[key])
        except (FedhetError, ValueError, KeyError, TypeError):
            return default
    try:
        return int(job.settings.get(key, default))
    except (TypeError, ValueError):
        return default


def rounds_of(job: Job) -> int:
    """How many rounds a job's run has (an extended run: its new length)."""
    if job.resume and "rounds" in job.settings:  # an extended run's new length
        return _setting(dataclasses.replace(job, resume=False), "rounds", 1)
    return _setting(job, "rounds", 30 if not job.resume else 1)


def checkpoint_every(job: Job) -> int:
    """Every how many rounds a job's run saves a checkpoint (its `checkpoint_every`, at least 1)."""
    return max(1, _setting(job, "checkpoint_every", 1))


def components_of(job: Job) -> list[tuple[str, str, str]]:
    """`(kind, name, source)` of each component a job's run uses that is registered here (a
    resumed run: those its config.json names)."""
    settings: Mapping[str, Any] = job.settings
    if job.resume:
        try:
            settings = read_config(job.out)
        except FedhetError:
            return []
    out = []
    for kind in COMPONENTS:
        name = settings.get(kind)
        if isinstance(name, str) and name != "auto":
            try:
                out.append((kind, name, REGISTRIES[kind].get(name).source))
            except FedhetError:
                continue  # the run will say so itself
    return out
