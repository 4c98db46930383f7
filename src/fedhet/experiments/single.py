"""One run from settings to a finished run directory (used by `run`, `compare`, `reproduce`).

The run directory is fedhet's (`fedhet.engine.rundir`): created with a marker, locked for as
long as the run writes it, and cleared by `force` only when it carries the marker.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedhet.engine import rundir
from fedhet.engine.config import RESUMABLE, build, canonical_config, config_of, parse
from fedhet.engine.simulation import Simulation, check_resumable
from fedhet.engine.store import RunStore
from fedhet.errors import FedhetError


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


def prepare_out(out: Path, force: bool, warn: Callable[[str], None] = print) -> None:
    """Clear (with `force`, only what fedhet wrote) and create `out` with fedhet's marker; call
    once the run is known to be valid, while holding the directory's lock."""
    check_out(out, force)
    if rundir.is_ours(out):
        rundir.clear(out, warn)
    rundir.mark(out, "run")


def is_finished(out: Path) -> bool:
    path = out / "summary.json"
    return path.exists() and '"finished": true' in path.read_text()


def execute(
    settings: dict[str, Any] | None, out: Path, *, resume: bool = False, force: bool = False,
    progress: bool = False, log: Callable[[str], None] = print,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run (or continue, with `resume`) one experiment into `out`; returns its summary.

    With `resume`, the settings saved in `out/config.json` are used; `settings`, when given,
    may change only what a resume can change (`RESUMABLE`: more rounds, evaluation and
    checkpoint intervals, data directory, device and executor) and anything else is refused.
    Invalid settings, data or partitions fail before `out` is created or changed.
    """
    if resume:
        return _resume(settings, Path(out), progress, log, on_round)
    check_out(out, force)
    cfg = config_of(settings or {})
    store = RunStore(out)
    sim = Simulation(cfg, store, log=log, on_round=on_round)
    with rundir.exclusive(out, "run"):
        prepare_out(out, force, log)
        store.write_config(cfg.to_dict())
        return sim.run(progress=progress)


def _resume(
    changes: dict[str, Any] | None, out: Path, progress: bool, log: Callable[[str], None],
    on_round: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    store = RunStore(out)
    if not (out / "config.json").is_file():
        raise FedhetError(f"{out} has no config.json: it is not a fedhet run directory")
    with rundir.exclusive(out, "run"):
        saved = canonical_config(store.read_config())
        cfg = build(parse(saved, "config.json"), parse(changes or {}, "--resume"))
        if changes:
            check_resumable(saved, cfg.to_dict())
            changed = sorted(k for k, v in cfg.to_dict().items() if saved.get(k) != v)
            if changed:
                log("resuming with " + ", ".join(f"{k} {saved.get(k)} → {getattr(cfg, k)}"
                                                 for k in changed)
                    + f" (a resume may change only {', '.join(sorted(RESUMABLE))})")
        grown = cfg.rounds > int(saved.get("rounds", cfg.rounds))
        if is_finished(out) and not grown:
            log(f"{out} is already finished; nothing to do")
            return store.read_summary()
        sim = Simulation(cfg, store, log=log, on_round=on_round)
        rundir.mark(out, "run")  # runs made before the marker existed become recognisable
        removed = rundir.remove_temporaries(out)
        if removed:
            log(f"removed {len(removed)} temporary file(s) a killed run left in {out}")
        # config.json changes only once the checkpoint has accepted the new settings
        accepted = (lambda: store.write_config(cfg.to_dict())) if changes else None
        return sim.run(resume=True, progress=progress, accepted=accepted)
