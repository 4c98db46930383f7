"""The processes a grid's runs execute in: a pool worker's set-up (`init_worker`), one unit
of runs (`run_unit`: one run, or a stack stepped as one cohort), and the start method of fresh
workers (`worker_context`, `check_fresh_workers`).

Workers are fresh processes (forkserver, else spawn) that import the parent's plugins, or, for
a grid started from Python, forked ones (`worker_context`); each has one torch thread and an
equal share of the cores for `--workers auto` (`core_share`). A run checks this process's stop
flag between rounds and stops at a saved round once it is set.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from fedhet import plugins
from fedhet.engine import CORES_ENV, RESUMABLE, RUNTIME, StopRun
from fedhet.errors import FedhetError, quiet
from fedhet.runs.jobs import Job, checkpoint_every, components_of, rounds_of
from fedhet.runs.single import execute, execute_together

_STOP: Any = None
"""The stop flag of this process (an `Event`): set by the grid's first Ctrl-C."""

_TICK: Callable[[], None] | None = None
"""Runs in this process (`--jobs 1`): the grid's `Progress.tick`, called after each round."""


def use_stop_flag(flag: Any) -> None:
    """Make `flag` (an object with `is_set()`: an `Event`, a file flag) the stop flag this
    process's runs check between rounds."""
    global _STOP
    _STOP = flag


def limit_threads() -> None:
    """One torch (OpenMP, MKL) thread in this process, as a `--jobs` worker runs (results do not
    depend on the thread count)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def core_share(cores: int, jobs: int) -> int:
    """The cores each of `jobs` parallel runs may use (`$FEDHET_CORES` in its process, read by
    `--workers auto`): an equal share of `cores`, at least one."""
    return max(1, cores // max(1, jobs))


_BROKEN: str | None = None
"""Why this worker process cannot run anything (a plugin of the grid's parent did not import):
each of its runs fails with this line instead of the pool dying."""


def init_worker(stop: Any, cores: int, plugin_files: Mapping[str, str] | None = None) -> None:
    """Pool worker set-up: one torch thread and its share of the cores (`core_share`), and the
    parent's plugins imported (`plugin_files`: spec → file; a fresh process has none of them);
    the terminal's Ctrl-C is the parent's business (it sets `stop`, which the worker checks
    between rounds), so the worker ignores SIGINT."""
    global _STOP, _BROKEN
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while it started
    _STOP = stop
    os.environ[CORES_ENV] = str(cores)
    limit_threads()
    try:
        plugins.ensure(list(plugin_files or {}), "the grid's process", plugin_files)
    except FedhetError as e:
        _BROKEN = str(e)


_quiet = quiet
"""A grid run's log: the grid prints its own line per run, so only what the user must know
(a warning, a file rebuilt from the checkpoint) reaches stderr."""


def _stopper(job: Job, then: Callable[[dict[str, Any]], None] | None) -> Callable[[dict], None]:
    """A callback that raises `StopRun` once the stop flag is set and the round just finished has
    been checkpointed (every round by default), so a resume continues exactly there."""
    every, total = checkpoint_every(job), rounds_of(job)

    def on_round(row: dict[str, Any]) -> None:
        if then is not None:
            then(row)
        if _TICK is not None:
            _TICK()
        k = int(row["round"])
        if _STOP is not None and _STOP.is_set() and k < total and k % every == 0:
            raise StopRun(k)

    return on_round


def run_job(job: Job) -> dict[str, Any]:
    """Execute one job (in a worker or in-process); errors come back as `{"error": ...}`, a job
    that never started because the grid is stopping as `{"cancelled": True}`, one stopped at a
    round boundary as `{"stopped": round}`."""

    if _STOP is not None and _STOP.is_set():
        return {"name": job.name, "cancelled": True}
    if _BROKEN is not None:
        return {"name": job.name, "error": _BROKEN}
    tensorboard = None
    try:
        if job.tensorboard:
            # optional extra: fedhet[tensorboard]
            from fedhet.runs.tensorboard import TensorBoardLogger

            tensorboard = TensorBoardLogger(Path(job.out))
        summary = execute(
            _settings(job), Path(job.out), resume=job.resume, force=True,
            log=_quiet, callbacks=[_stopper(job, tensorboard)],
        )
        return _outcome(job, summary)
    except Exception as e:  # noqa: BLE001  (a crash in one run must not stop the others)
        return _outcome(job, e)
    finally:
        if tensorboard is not None:
            tensorboard.close()


def run_unit(unit: list[Job]) -> list[dict[str, Any]]:
    """One job, or a stack of jobs stepped as one cohort (`stack_units`); one result per job."""
    if len(unit) == 1 or _BROKEN is not None:
        return [run_job(job) for job in unit]
    if _STOP is not None and _STOP.is_set():
        return [{"name": job.name, "cancelled": True} for job in unit]
    items = [(_settings(job), Path(job.out), job.resume) for job in unit]
    loggers: list[Any] = [None] * len(unit)
    try:
        for i, job in enumerate(unit):
            if job.tensorboard:
                # optional extra: fedhet[tensorboard]
                from fedhet.runs.tensorboard import TensorBoardLogger

                loggers[i] = TensorBoardLogger(Path(job.out))
        outcomes = execute_together(
            items, force=True, log=_quiet,
            callbacks=[[_stopper(job, logger)] for job, logger in zip(unit, loggers, strict=True)],
        )
    except FedhetError:  # one run's settings or data are bad: let each run say for itself
        return [run_job(job) for job in unit]
    finally:
        for logger in loggers:
            if logger is not None:
                logger.close()
    return [_outcome(job, o) for job, o in zip(unit, outcomes, strict=True)]


def _settings(job: Job) -> dict[str, Any] | None:
    """What `execute` gets: a resumed run's own config, with this call's device and executor."""
    if job.resume:  # its RESUMABLE settings are its saved ones unless the grid is extended
        return {k: v for k, v in job.settings.items() if k in RUNTIME | RESUMABLE} or None
    return job.settings


def _outcome(job: Job, outcome: dict[str, Any] | BaseException) -> dict[str, Any]:
    """A run's summary, or the exception that ended it, as a result line of the grid."""
    if isinstance(outcome, StopRun):
        return {"name": job.name, "stopped": outcome.args[0]}
    if isinstance(outcome, FedhetError):
        return {"name": job.name, "error": str(outcome)}
    if isinstance(outcome, BaseException):
        return {"name": job.name, "error": f"{type(outcome).__name__}: {outcome}"}
    if outcome.get("status") == "diverged":
        d = outcome["diverged"]
        client = f", client {d['client']}" if d.get("client") is not None else ""
        return {"name": job.name, "error": f"diverged in round {d['round']}{client} "
                                           f"(non-finite {d['what']})"}
    return {"name": job.name, "summary": outcome}


PRELOAD = ["fedhet.runs.processes", "fedhet.engine.simulation", "sklearn.datasets"]


def worker_context(units: Sequence[Sequence[Job]] = ()) -> multiprocessing.context.BaseContext:
    """The start method of a grid's worker processes.

    From fedhet's command line, fresh workers that never inherit the parent's torch thread
    pools: `forkserver` (a clean server imports torch and the data libraries once, then forks
    each worker) where the platform has it, else `spawn`; every component comes from fedhet or
    a plugin, which `init_worker` imports. A grid started from Python (a script, a notebook)
    may use components only its own memory holds (an algorithm defined in the script, data from
    arrays), and a script without an `if __name__ == "__main__":` guard would be re-run by each
    fresh worker: its workers are forked (`fork`, they inherit every registry), unless the
    platform has no `fork` or CUDA is already initialised in this process (a forked child
    cannot use it); then `check_fresh_workers` says in one line what would fail."""
    methods = multiprocessing.get_all_start_methods()
    if not plugins.from_command_line():
        if "fork" in methods and not torch.cuda.is_initialized():
            return multiprocessing.get_context("fork")
        check_fresh_workers(units)
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


def check_fresh_workers(units: Sequence[Sequence[Job]] = ()) -> None:
    """Refuse, in one line, a grid whose fresh worker processes (`spawn`, `forkserver`) would
    die or not know its components: the main module a script without a `__main__` guard (each
    worker would run it again, and start a grid of its own), or a component of the grid defined
    in a notebook or an interactive session (the workers cannot import it)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path and not has_main_guard(Path(path)):
        raise FedhetError(
            f"{path} starts a grid with jobs > 1, and its worker processes would run the script "
            "again: put the script's code under `if __name__ == \"__main__\":`, or move your "
            "components into a plugin module (fedhet.load_plugins), or use jobs=1"
        )
    for job in (job for unit in units for job in unit):
        for kind, name, source in components_of(job):
            # a script's own registrations run again in each worker as it re-imports the
            # script; a notebook's, or an object handed in and registered for this process, not
            if plugins.in_script(source) and (path is None or source != "__main__"):
                raise FedhetError(
                    f"{kind} {name!r} is defined in this session (__main__), which the grid's "
                    "worker processes cannot import: move it into a plugin module (a .py file "
                    "given to fedhet.load_plugins or --plugin), or use jobs=1"
                )


def has_main_guard(path: Path) -> bool:
    """Whether the script at `path` has an `if __name__ == "__main__":` block at its top level
    (unreadable or unparsable: assumed guarded, as Python itself will say what is wrong)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return True
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                isinstance(n, ast.Constant) and n.value == "__main__" for n in names
            ):
                return True
    return False


@contextmanager
def checking(flag: Any, tick: Callable[[], None] | None) -> Iterator[None]:
    """While the body runs, runs in this process (`--jobs 1`) stop at a saved round once `flag`
    is set, and call `tick` (the grid's `Progress.tick`) after each round."""
    global _STOP, _TICK
    previous = _STOP
    _STOP, _TICK = flag, tick
    try:
        yield
    finally:
        _STOP, _TICK = previous, None
