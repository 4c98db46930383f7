"""One run from settings to a finished run directory (used by `run`, `compare`, `reproduce`).

The run directory is fedhet's (`fedhet.rundir.ownership`): created with a marker, locked for as
long as the run writes it, and cleared by `force` only when it carries the marker. The run
`force` replaces is kept aside until the new run has saved a round (`replacing`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet import plugins, provenance
from fedhet.engine import (
    RESUMABLE,
    CallbackLike,
    RunConfig,
    Simulation,
    UserCodeFailed,
    assemble,
    build,
    canonical_config,
    check_resumable,
    chosen_components,
    config_of,
    load,
    parse,
    run_together,
)
from fedhet.errors import FedhetError
from fedhet.rundir import (
    SUMMARY_FIX,
    RunStore,
    check_out,
    is_finished,
    metrics_intact,
    prepare_out,
    read_json,
)
from fedhet.rundir import ownership as rundir


@dataclass
class ReadyRun:
    """A run ready to go: its simulation and `Simulation.run` arguments, or (`summary` set) a
    resumed run that is already finished."""

    sim: Simulation | None
    kwargs: dict[str, Any]
    summary: dict[str, Any] | None = None


def execute(
    settings: dict[str, Any] | None, out: Path, *, resume: bool = False, force: bool = False,
    progress: bool = False, log: Callable[[str], None] = print,
    callbacks: Sequence[CallbackLike] = (),
    on_round: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """Run (or continue, with `resume`) one experiment into `out`; returns its summary.

    `callbacks` are told of each saved round (`fedhet.engine.callbacks`; one may stop the run);
    `on_round` is one more, last.

    With `resume`, the settings saved in `out/config.json` are used; `settings`, when given,
    may change only what a resume can change (`RESUMABLE`: more rounds, evaluation and
    checkpoint intervals, data directory, device and executor) and anything else is refused.
    Invalid settings, data or partitions fail before `out` is created or changed.
    """
    callbacks = [*callbacks, *([on_round] if on_round is not None else [])]
    with opened(settings, Path(out), resume=resume, force=force, log=log, callbacks=callbacks) as run:
        if run.summary is not None:
            return run.summary
        assert run.sim is not None
        return run.sim.run(progress=progress, **run.kwargs)


def execute_together(
    items: Sequence[tuple[dict[str, Any] | None, Path, bool]], *, force: bool = False,
    log: Callable[[str], None] = print,
    callbacks: Sequence[Sequence[CallbackLike]] | None = None,
    on_step: Callable[[], None] | None = None,
) -> list[dict[str, Any] | BaseException]:
    """`execute` for several runs `(settings, out, resume)` at once, stepping as one stack those
    that can (`fedhet.engine.stacked_runs.run_together`): each run directory ends up as if its run had
    been executed alone (to float32 rounding, docs/gpu.md). Returns each run's summary, or the
    error that ended it; a run whose settings are invalid fails before any of the others start.
    `callbacks`: each run's own."""
    hooks = list(callbacks or [()] * len(items))
    with contextlib.ExitStack() as stack:
        runs = [
            stack.enter_context(opened(settings, Path(out), resume=resume, force=force, log=log,
                                       callbacks=hook, data_cache=True))
            for (settings, out, resume), hook in zip(items, hooks, strict=True)
        ]
        live = [r for r in runs if r.summary is None]
        results = iter(run_together([_simulation(r) for r in live], [r.kwargs for r in live], on_step))
        return [r.summary if r.summary is not None else next(results) for r in runs]


@contextlib.contextmanager
def opened(
    settings: dict[str, Any] | None, out: Path, *, resume: bool = False, force: bool = False,
    log: Callable[[str], None] = print, callbacks: Sequence[CallbackLike] = (),
    data_cache: bool = False,
) -> Iterator[ReadyRun]:
    """The run directory locked and ready, and the run's simulation: a fresh run's directory is
    checked before anything is built and prepared (`prepare_out`) once the settings, data and
    partition are known to be valid; a resumed run's saved settings are read under the lock."""
    if resume:
        with _resumed(settings, out, log, callbacks, data_cache) as run:
            yield run
        return
    check_out(out, force)
    cfg = config_of(settings or {})
    store = RunStore(out, provenance.of_run)
    data = load(cfg, cache=True) if data_cache else None
    sim = assemble(cfg, store=store, data=data, log=log, callbacks=callbacks)
    with rundir.exclusive(out, "run"):
        prepare_out(out, force, log, keep_replaced=True)
        store.write_config(cfg.to_dict())
        with replacing(out, sim):
            yield ReadyRun(sim, {})


def _simulation(run: ReadyRun) -> Simulation:
    """The simulation of a run that is not finished yet (`ReadyRun.summary` is None)."""
    assert run.sim is not None, "`opened` gives every run that is not finished its simulation"
    return run.sim


@contextlib.contextmanager
def replacing(out: Path, sim: Simulation) -> Iterator[None]:
    """The run `--force` set aside in `out` (`ownership.set_aside`) is removed once the new run
    has saved a round, and put back when the new run ends before it saved one without a result
    of its own **[choice]**: it raised (its code failed in round 1, it was interrupted), or
    returned a failed one (a stack of runs hands errors back; `execute_together`). A run that
    diverged or was stopped in round 1 has its result and replaces the old one."""
    aside = out / rundir.REPLACED
    if not aside.is_dir():
        yield
        return

    def saved(row: dict[str, Any]) -> None:
        rundir.drop_replaced(out)

    sim.callbacks.append(saved)
    try:
        yield
    except UserCodeFailed as e:
        if not aside.is_dir():
            raise
        rundir.put_back(out)
        raise FedhetError(
            f"{e}; the new run saved no round, so the run that was in {out} is back as it was: "
            "fix it and run again (--debug shows the traceback)"
        ) from e
    except BaseException:
        if aside.is_dir():
            rundir.put_back(out)
        raise
    if aside.is_dir():
        try:
            failed = read_json(out / "summary.json", SUMMARY_FIX).get("status") == "failed"
        except FedhetError:
            failed = True
        (rundir.put_back if failed else rundir.drop_replaced)(out)


def resume_settings(
    out: Path, changes: dict[str, Any] | None, log: Callable[[str], None] = print,
    checkpoint: bool = True,
) -> tuple[RunStore, dict[str, Any], RunConfig]:
    """What `fedhet run --resume` would continue the run in `out` with: its store, its saved
    settings and the `RunConfig` with `changes` applied. Raises the resume's own error for a
    missing or damaged config.json, a change a resume may not make (`check_resumable`: only
    `RESUMABLE` settings, rounds only upwards) and a config.json edited since the newest
    checkpoint (with `checkpoint`; the resume itself checks it as it loads the checkpoint).
    Nothing is written (`fedhet config show --resume` says the same)."""
    store = RunStore(out, provenance.of_run)
    if not (out / "config.json").is_file():
        raise FedhetError(f"{out} has no config.json: it is not a fedhet run directory")
    record = store.read_config()
    plugins.ensure_recorded(record, out / "config.json")
    saved = canonical_config(record)
    try:
        cfg = build(parse(saved, "config.json"),
                    parse(changes or {}, "--resume", chosen_components(saved, changes or {})))
    except FedhetError as e:
        raise _handed_in(out, record, e) from None
    if changes:
        check_resumable(saved, cfg.to_dict())
    ckpt = store.load_checkpoint(warn=log) if checkpoint else None
    if ckpt is not None:
        check_resumable(ckpt.get("config"), cfg.to_dict())
    return store, saved, cfg


def _handed_in(out: Path, record: dict[str, Any], error: FedhetError) -> FedhetError:
    """The resume's error for a run whose component was handed in from a script or notebook
    (its provenance's `in_process`), or whose metric a script registered (`script_metrics`),
    and is unknown here; else `error` itself."""
    prov = record.get("provenance")
    for name in (prov.get("script_metrics") or []) if isinstance(prov, dict) else []:
        if str(error).startswith(f"unknown metric {name!r}"):
            return FedhetError(
                f"{out}: its metric {name!r} was registered by the script or notebook that made "
                "the run, and exists only there: register it again (fedhet.register_metric) "
                f"before fedhet.resume({str(out)!r}) in Python, or put it in a plugin module "
                "(--plugin FILE.py)"
            )
    handed = prov.get("in_process") if isinstance(prov, dict) else None
    for kind, name in (handed or {}).items():
        if str(error).startswith(f"unknown {kind} {name!r}"):
            return FedhetError(
                f"{out}: its {kind} {name!r} was handed in from Python by the script or notebook "
                f"that made the run, and exists only there: resume it from Python with "
                f"fedhet.resume({str(out)!r}, {kind}=<the same object>), or put it in a plugin "
                "module (--plugin FILE.py)" + (" or save the data as .npz (docs/data.md)"
                                               if kind == "dataset" else "")
            )
    return error


@contextlib.contextmanager
def _resumed(
    changes: dict[str, Any] | None, out: Path, log: Callable[[str], None],
    callbacks: Sequence[CallbackLike], data_cache: bool,
) -> Iterator[ReadyRun]:
    if not (out / "config.json").is_file():
        raise FedhetError(f"{out} has no config.json: it is not a fedhet run directory")
    with rundir.exclusive(out, "run"):
        store, saved, cfg = resume_settings(out, changes, log, checkpoint=False)
        if changes:
            changed = sorted(k for k, v in cfg.to_dict().items() if saved.get(k) != v)
            if changed:
                log("resuming with " + ", ".join(f"{k} {saved.get(k)} → {getattr(cfg, k)}"
                                                 for k in changed)
                    + f" (a resume may change only {', '.join(sorted(RESUMABLE))})")
        _say_damaged(out, log)
        grown = cfg.rounds > int(saved.get("rounds", cfg.rounds))
        if is_finished(out) and not grown and metrics_intact(out):
            # compare first: an edited config.json is refused as it is for an unfinished run
            ckpt = store.load_checkpoint(warn=log)
            if ckpt is not None:
                check_resumable(ckpt.get("config"), cfg.to_dict())
            if ckpt is None or int(ckpt["round"]) >= cfg.rounds:
                log(f"{out} is already finished; nothing to do")
                yield ReadyRun(None, {}, store.read_summary())
                return
        data = load(cfg, cache=True) if data_cache else None
        sim = assemble(cfg, store=store, data=data, log=log, callbacks=callbacks)
        rundir.mark(out, "run")  # runs made before the marker existed become recognisable
        removed = rundir.remove_temporaries(out)
        if removed:
            log(f"removed {len(removed)} temporary file(s) a killed run left in {out}")
        # config.json changes only once the checkpoint has accepted the new settings
        accepted = (lambda: store.write_config(cfg.to_dict())) if changes else None
        with replacing(out, sim):  # a replacement killed before it saved a round, resumed
            yield ReadyRun(sim, {"resume": True, "accepted": accepted})


def _say_damaged(out: Path, log: Callable[[str], None]) -> None:
    """Name the run files a resume writes again from the checkpoint because they are damaged
    (summary.json; metrics.csv is rebuilt and named by `RunStore.restore_rows`)."""
    path = out / "summary.json"
    if path.exists():
        try:
            read_json(path, SUMMARY_FIX)
        except FedhetError as e:
            log(f"warning: {str(e).split(';')[0]}; the resume writes it again from the checkpoint")
