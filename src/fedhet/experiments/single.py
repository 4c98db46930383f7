"""One run from settings to a finished run directory (used by `run`, `compare`, `reproduce`)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedhet.engine.config import RunConfig, apply_settings, resolve
from fedhet.engine.simulation import Simulation
from fedhet.engine.store import RunStore
from fedhet.errors import FedhetError


def check_out(out: Path, force: bool) -> None:
    """Refuse a non-empty run directory unless `force` (nothing is touched here)."""
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out {out} is a file; choose a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FedhetError(
            f"--out {out} is not empty; use --resume to continue that run, --force to "
            "replace it, or another --out"
        )


def prepare_out(out: Path, force: bool) -> None:
    """Empty (with `force`) and create `out`; call once the run is known to be valid."""
    check_out(out, force)
    if out.is_dir() and any(out.iterdir()):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def resolve_settings(settings: dict[str, Any], where: str = "settings") -> tuple[RunConfig, dict]:
    """Settings (`{"algorithm": "fedprox", "algorithm.mu": 0.1, "lr": 0.05, ...}`) → config."""
    return resolve(apply_settings({}, settings, where))


def is_finished(out: Path) -> bool:
    path = out / "summary.json"
    return path.exists() and '"finished": true' in path.read_text()


def execute(
    settings: dict[str, Any] | None, out: Path, *, resume: bool = False, force: bool = False,
    progress: bool = False, log: Callable[[str], None] = print,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run (or continue, with `resume`) one experiment into `out`; returns its summary.

    With `resume`, the settings saved in `out/config.json` are used and `settings` is ignored.
    Invalid settings, data or partitions fail before `out` is created or changed.
    """
    store = RunStore(out)
    if resume:
        cfg, params = resolve(store.read_config())
        if is_finished(out):
            log(f"{out} is already finished; nothing to do")
            return store.read_summary()
    else:
        check_out(out, force)
        cfg, params = resolve_settings(settings or {})
    sim = Simulation(cfg, params, store, log=log, on_round=on_round)
    if not resume:
        prepare_out(out, force)
        store.write_config(cfg.to_dict())
    return sim.run(resume=resume, progress=progress)
