"""Runs many `RunSpec`s in parallel processes: skips finished runs, resumes partial ones.

Each run lives in `out/runs/<name>/` and is a normal run directory (`fedhet run --resume` and
`fedhet report` work on it). The jobs still to do come from `fedhet.runs.jobs`, run in the
worker processes of `fedhet.runs.processes` (or in this one, or on a cluster's nodes), and
report through `fedhet.runs.grid_status`. Ctrl-C stops the grid at saved rounds (`Interrupted`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fedhet import plugins
from fedhet.engine import usable_cores
from fedhet.errors import FedhetError
from fedhet.rundir import ownership as rundir
from fedhet.runs.grid_status import Outcomes, Progress
from fedhet.runs.jobs import DEFAULT_STACK_RUNS, Job, default_jobs, plan_jobs, stack_units
from fedhet.runs.presets import RunSpec
from fedhet.runs.processes import checking, core_share, init_worker, run_unit, worker_context

if TYPE_CHECKING:
    from fedhet.engine import ClusterOptions


class Interrupted(KeyboardInterrupt):
    """A grid stopped by Ctrl-C: queued runs cancelled, running ones stopped at a saved round.

    A `KeyboardInterrupt` (so callers treat it as one and exit 130); its message is the line
    already printed to the progress stream (`reported`)."""

    reported = True


def run_specs(
    specs: list[RunSpec], runs_dir: Path, jobs: int | None = None, force: bool = False,
    tensorboard: bool = False, stream: TextIO | None = None, resume_hint: str | None = None,
    stack_runs: int = DEFAULT_STACK_RUNS, cluster: ClusterOptions | None = None,
    backend: Callable[..., None] | None = None, extend: bool = False,
) -> dict[str, str]:
    """Run every spec into `runs_dir/<name>`; returns `{name: error}` for runs that failed.

    Runs that share data, model and device on the stacked executor (a GPU, or the linear models)
    step together, up to `stack_runs` at a time (`stack_units`; 1 runs each on its own); each
    unit goes to one of `jobs` processes.

    Ctrl-C (SIGINT, in the main thread) stops the grid gracefully: queued runs are cancelled at
    once, running ones stop after their next saved round (so running the grid again resumes
    them exactly); one line says so and `Interrupted` is raised. A second Ctrl-C stops at once
    (the runs then resume from their last checkpoint).

    `cluster`: the units run as tasks on a cluster instead of in `jobs` local processes, with
    the same guarantees, through `backend` (`fedhet.runs.cluster.run_units`, which the
    callers above both modules pass: the cluster backend builds on this module, not the reverse).
    """
    if cluster is not None and backend is None:
        raise FedhetError("a cluster needs its backend: pass backend=fedhet.runs.cluster.run_units")
    todo, done = plan_jobs(specs, runs_dir, force, tensorboard, extend=extend)
    progress = Progress(len(specs), done, todo, stream)
    if not todo:
        return {}
    if force:
        clear_cells([Path(job.out) for job in todo], progress.stream)
    cuda = cluster.gpus_per_run > 0 if cluster is not None else None
    units = stack_units(todo, stack_runs, cuda)
    n = max(1, min(jobs or default_jobs(), len(units)))
    tally = Outcomes()
    with _graceful_sigint(progress) as (requested, hard):
        if cluster is not None and backend is not None:
            backend(units, cluster, runs_dir, requested, hard, tally, progress)
        elif n == 1:
            _run_here(units, requested, hard, tally, progress)
        else:
            _run_in_pool(units, n, requested, hard, tally, progress)
    progress.close()
    if requested.is_set() or hard:
        line = tally.line(bool(hard), resume_hint)
        progress.stream.write(line + "\n")
        progress.stream.flush()
        raise Interrupted(line)
    return tally.errors



def _run_here(units: list[list[Job]], requested: threading.Event, hard: list[bool],
              tally: Outcomes, progress: Progress) -> None:
    """`--jobs 1`: each unit in this process, in order, stopping at a saved round once a stop
    is `requested`; a second Ctrl-C (`KeyboardInterrupt`) stops at once (`hard`)."""
    left = list(units)
    with checking(requested, progress.tick):
        try:
            while left:
                t0 = time.monotonic()
                results = run_unit(left[0])
                left.pop(0)
                for result in results:
                    tally.add(result, progress, time.monotonic() - t0)
        except KeyboardInterrupt:
            hard.append(True)
            tally.unfinished = sum(len(u) for u in left)


def _run_in_pool(units: list[list[Job]], n: int, requested: threading.Event, hard: list[bool],
                 tally: Outcomes, progress: Progress) -> None:
    """Each unit in one of `n` worker processes (`fedhet.runs.processes`); a stop `requested`
    reaches them through a shared event, a second Ctrl-C terminates them (`hard`)."""
    # workers start with SIGINT blocked (inherited through fork/exec), so none dies from
    # the terminal's Ctrl-C before `init_worker` makes it ignore SIGINT
    ctx = worker_context(units)
    stop = ctx.Event()  # set by `_drain`, never in the handler (its lock is not reentrant)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=init_worker,
                                   initargs=(stop, core_share(usable_cores(), n), plugins.files()))
        pending: dict[Future, list[Job]] = {pool.submit(run_unit, u): u for u in units}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        _drain(pending, requested, stop, tally, progress)
    except KeyboardInterrupt:
        hard.append(True)
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        tally.unfinished = sum(len(u) for f, u in pending.items() if not f.done())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def clear_cells(cells: list[Path], stream: TextIO) -> None:
    """`--force`: empty every existing run directory of the grid before any run starts, so a
    grid interrupted part-way never mixes new runs with old results that a plain re-run would
    then take for finished ones. Only what fedhet wrote is removed (`rundir.clear`); a run
    directory from before markers existed (it has a config.json) is recognised as fedhet's, any
    other unmarked one is refused before anything is cleared. Each is cleared under its lock."""

    full = [c for c in cells if c.is_dir() and any(e.name != rundir.LOCK for e in c.iterdir())]
    for cell in full:
        rundir.check_removable(cell)
        if not rundir.is_ours(cell) and not (cell / "config.json").is_file():
            raise FedhetError(
                f"refusing to replace {cell}: it was not created by fedhet (no {rundir.MARKER} "
                "marker); remove it yourself or choose another --out"
            )
    for cell in full:
        with rundir.exclusive(cell, "run"):
            rundir.mark(cell, "run")
            rundir.clear(cell, warn=lambda m: stream.write(m + "\n"))


def _drain(pending: dict[Future, list[Job]], requested: threading.Event, stop: Any, tally: Outcomes,
           progress: Progress) -> None:
    """Collect results as workers finish; once a stop is `requested`, pass it on to the workers
    (`stop`) and cancel what has not started."""
    started = time.monotonic()
    cancelling = False
    while pending:
        if requested.is_set() and not cancelling:
            cancelling = True
            stop.set()
            for fut in list(pending):
                if fut.cancel():
                    tally.cancelled += len(pending.pop(fut))
        finished, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
        for fut in finished:
            unit = pending.pop(fut)
            try:
                results = fut.result()
            except Exception as e:  # noqa: BLE001  (a worker that died, e.g. out of memory)
                results = [{"name": job.name, "error": f"worker process failed: {e}"} for job in unit]
            for result in results:
                tally.add(result, progress, time.monotonic() - started)
        progress.tick()


@contextmanager
def _graceful_sigint(progress: Progress) -> Iterator[tuple[threading.Event, list[bool]]]:
    """While the body runs, the first SIGINT sets the yielded event (and says so); a second
    raises `KeyboardInterrupt` (the body appends to the yielded list when it stopped hard).
    Only in the main thread: elsewhere SIGINT cannot arrive, and nothing is installed.

    The handler only sets a `threading.Event` (whose `is_set` takes no lock, so the handler
    cannot deadlock against the code it interrupts); the body passes it on to the workers."""
    requested = threading.Event()
    hard: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        _acknowledge(progress)

    if threading.current_thread() is not threading.main_thread():
        yield requested, hard
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested, hard
    finally:
        signal.signal(signal.SIGINT, previous)


def _acknowledge(progress: Progress) -> None:
    """Say at once that Ctrl-C was heard, from the signal handler: straight to the file
    descriptor (a buffered stream's `write`, interrupted mid-call, must not be re-entered);
    streams without one (tests) get nothing."""
    try:
        fd = progress.stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    live = "\r\x1b[K" if progress.live else ""
    text = (f"{live}stopping: queued runs are cancelled, running ones stop after their current "
            "round (Ctrl-C again: stop at once)\n")
    with suppress(OSError):
        os.write(fd, text.encode())
