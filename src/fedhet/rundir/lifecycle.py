"""The life of an output directory: check it before a run, prepare it once the run is valid,
find a resume's target, and say whether a run in it finished and its metrics read whole."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import fedhet.rundir.ownership as rundir
from fedhet.errors import FedhetError
from fedhet.rundir.store import read_metrics, read_summary


def check_out(out: Path, force: bool) -> None:
    """Refuse a non-empty run directory unless `force` and fedhet made it (nothing is touched)."""
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out {out} is a file; choose a directory")
    entries = [e for e in out.iterdir() if e.name not in (rundir.LOCK, rundir.MARKER)] \
        if out.is_dir() else []
    if entries and not force:
        raise FedhetError(
            f"--out {out} is not empty; use --resume to continue that run, --force to "
            "replace it, or another --out"
        )
    if entries:
        rundir.check_removable(out)
        if not rundir.is_ours(out):
            raise FedhetError(
                f"refusing to replace {out}: it was not created by fedhet (no {rundir.MARKER} "
                "marker); remove it yourself or choose another --out"
            )


def prepare_out(out: Path, force: bool, warn: Callable[[str], object] = print,
                keep_replaced: bool = False) -> None:
    """Clear (with `force`, only what fedhet wrote) and create `out` with fedhet's marker; call
    once the run is known to be valid, while holding the directory's lock. With `keep_replaced`
    the run that was there is set aside, not removed (`ownership.set_aside`): the caller removes
    it once the new run has saved a round, or puts it back (`fedhet.runs.single.replacing`)."""
    check_out(out, force)
    if rundir.is_ours(out):
        (rundir.set_aside if keep_replaced else rundir.clear)(out, warn)
    rundir.mark(out, "run")


def resume_target(resume: str | bool | None, out: str | None, force: bool) -> Path:
    """The run directory of `fedhet run --resume [DIR]` (DIR, or `--out` when DIR is left out).

    `--force` (which starts a run afresh) and an `--out` other than DIR contradict a resume: each
    is one line, instead of being ignored."""
    if force:
        raise FedhetError("--resume continues a run and --force starts it again: use one of them "
                          "(fedhet run --force --out DIR ... to start again)")
    if isinstance(resume, str) and out and Path(out).resolve() != Path(resume).resolve():
        raise FedhetError(f"--resume {resume} --out {out}: a resumed run writes into its own "
                          "directory; leave out --out (copy the directory first to branch a run)")
    target = resume if isinstance(resume, str) else out
    if not target:
        raise FedhetError("--resume needs the run directory: --resume DIR")
    return Path(target)


def is_finished(out: Path) -> bool:
    """Whether the run's summary.json says it ran all its rounds (a missing or damaged one:
    not finished, so that a resume writes it again from the checkpoint)."""
    try:
        return read_summary(out).get("finished") is True
    except FedhetError:
        return False


def metrics_intact(out: Path) -> bool:
    """Whether the run's metrics.csv reads whole (`fedhet.rundir.reading.read_csv`); a resume
    rebuilds one that does not from the checkpoint."""
    try:
        read_metrics(out / "metrics.csv")
    except FedhetError:
        return False
    return True
