"""Runs many `RunSpec`s in parallel processes: skips finished runs, resumes partial ones.

Each run lives in `out/runs/<name>/` and is a normal run directory (`fedhet run --resume` and
`fedhet report` work on it). Workers are fresh processes (forkserver, else spawn) that import
the parent's plugins, or, for a grid started from Python, forked ones (`_context`); each has
one torch thread and an equal share of the cores for `--workers auto` (`core_share`).
Progress: a live status line (runs done, running accuracies, ETA) when stderr is a terminal,
otherwise one line per finished run and, every `$FEDHET_PROGRESS_SECONDS` (30 s), a status line.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from fedhet import plugins
from fedhet.engine import (
    COMPONENTS,
    CORES_ENV,
    REGISTRIES,
    RESUMABLE,
    RUNTIME,
    StopRun,
    batchable,
    build,
    canonical_config,
    config_of,
    parse,
    usable_cores,
)
from fedhet.errors import FedhetError, quiet
from fedhet.rundir import RunStore, is_finished, metrics_intact, read_config, read_summary, to_json
from fedhet.rundir import ownership as rundir
from fedhet.runs.presets import RunSpec
from fedhet.runs.progress import every_s
from fedhet.runs.single import execute, execute_together

if TYPE_CHECKING:
    from fedhet.engine import ClusterOptions


@dataclass(frozen=True)
class Job:
    name: str
    settings: dict[str, Any]
    out: str
    resume: bool
    tensorboard: bool = False


DEFAULT_BATCH_RUNS = 8
"""[choice] Runs stepped as one cohort at most: enough to fill a GPU with the papers' small
models (8 runs × 100 clients), few enough that one run's failure or a Ctrl-C stops little."""


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Interrupted(KeyboardInterrupt):
    """A grid stopped by Ctrl-C: queued runs cancelled, running ones stopped at a saved round.

    A `KeyboardInterrupt` (so callers treat it as one and exit 130); its message is the line
    already printed to the progress stream (`reported`)."""

    reported = True


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


def _init_worker(stop: Any, cores: int, plugin_files: Mapping[str, str] | None = None) -> None:
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
    every, total = checkpoint_every(job), _rounds(job)

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
    """One job, or a batch of jobs stepped as one cohort (`batch_units`); one result per job."""
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


def batch_key(job: Job, cuda: bool | None = None) -> str | None:
    """Jobs with the same key may step as one batch of runs (`fedhet.engine.batch`): the same
    data, model and device, on the batched executor. None: this job runs on its own (it would
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
    if not batchable(cfg, torch.cuda.is_available() if cuda is None else cuda):
        return None
    d = cfg.to_dict()
    fields = ("dataset", "dataset_params", "data_dir", "validation_fraction", "model",
              "model_params", "device", "executor")
    return json.dumps({f: d[f] for f in fields}, sort_keys=True)


def batch_units(jobs: list[Job], limit: int, cuda: bool | None = None) -> list[list[Job]]:
    """`jobs` as units of work: runs that share a `batch_key` in batches of at most `limit`
    (in grid order), every other run on its own."""
    if limit <= 1:
        return [[job] for job in jobs]
    units: list[list[Job]] = []
    open_units: dict[str, list[Job]] = {}
    for job in jobs:
        key = batch_key(job, cuda)
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


class Progress:
    """Live status line on a terminal; a line per finished run otherwise."""

    def __init__(self, total: int, done: int, jobs: list[Job], stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.total, self.done = total, done
        self.jobs = {j.name: j for j in jobs}
        self.rounds = {j.name: _rounds(j) for j in jobs}
        self.t0 = time.monotonic()
        self.start_rounds = sum(self._status(j)[0] for j in jobs)
        self.finished: set[str] = set()
        self.first: tuple[float, int] | None = None
        self.last = 0.0
        self.where: dict[str, str] = {}
        """The node each running run is on (a cluster backend fills it in)."""
        self.every = every_s()
        self.last_log = time.monotonic()

    def _status(self, job: Job) -> tuple[int, float, float]:
        return status_of(job)

    def note(self, text: str) -> None:
        """A line about the grid itself (a backend's start, a lost node), above the status."""
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(prefix + text + "\n")
        self.stream.flush()
        self.last = 0.0

    def tick(self) -> None:
        if not self.live:
            if self.first is None and time.monotonic() - self.last >= 0.5:
                self.last = time.monotonic()  # until the first round is seen done (the ETA's start)
                self._sample()
            if time.monotonic() - self.last_log >= self.every:  # a log file: a line now and then
                self.last_log = time.monotonic()
                self.stream.write(self._line(log=True) + "\n")
                self.stream.flush()
            return
        if time.monotonic() - self.last < 0.5:
            return
        self.last = time.monotonic()
        line = self._line(log=False)
        width = _width()
        self.stream.write("\r\x1b[K" + line[: width - 1])
        self.stream.flush()

    def _sample(self) -> tuple[dict[str, tuple[int, float, float]], int]:
        """Each run's status and the rounds done of all runs; the first time rounds are seen
        done, that moment starts the rate behind the ETA (not the workers' start-up)."""
        status = {name: self._status(job) for name, job in self.jobs.items()}
        rounds_done = sum(self.rounds[name] if name in self.finished else status[name][0]
                          for name in self.jobs)
        if self.first is None and rounds_done > self.start_rounds:
            self.first = (time.monotonic(), rounds_done)
        return status, rounds_done

    def _line(self, log: bool) -> str:
        """The status: runs done, ETA, the running runs' rounds and accuracies; for a log file
        also the rounds done of all runs, s/round and each running run's loss."""
        running = []
        status, rounds_done = self._sample()
        for name in self.jobs:
            r, acc, loss = status[name]
            if name not in self.finished and r > 0:
                where = f" @{self.where[name]}" if name in self.where else ""
                running.append(
                    f"{_short(name)} round {r}/{self.rounds[name]} acc {acc:.4f} loss {loss:.4f}{where}"
                    if log else f"{_short(name)} r{r} {acc:.3f}{where}"
                )
        total = sum(self.rounds.values())
        eta, rate = "?", 0.0
        if self.first is not None and rounds_done > self.first[1]:
            rate = (rounds_done - self.first[1]) / max(time.monotonic() - self.first[0], 1e-9)
            eta = _clock((total - rounds_done) / rate)
        more = [f"+{len(running) - 4} running"] if len(running) > 4 else []
        if not log:
            return f"[{self.done}/{self.total} runs] ETA {eta} | " + " | ".join(running[:4] + more)
        speed = f"{1 / rate:.2f} s/round, " if rate else ""
        return (f"[{self.done}/{self.total} runs, {rounds_done}/{total} rounds] {speed}ETA {eta}"
                + "".join(f" | {r}" for r in running[:4] + more))

    def finish(self, name: str, result: dict[str, Any], seconds: float) -> None:
        self.done += 1
        self.finished.add(name)
        if "error" in result:
            text = f"[{self.done}/{self.total}] {name} failed: {result['error']}"
        else:
            s = result["summary"]
            seconds = s.get("total_time_s", seconds)
            node = f" on {result['node']}" if result.get("node") else ""
            text = (
                f"[{self.done}/{self.total}] {name}: final {s['final_accuracy']:.4f}, best "
                f"{s['best_accuracy']:.4f} (round {s['best_round']}), {seconds:.1f} s{node}"
            )
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(prefix + text + "\n")
        self.stream.flush()
        self.last = 0.0

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


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


def _rounds(job: Job) -> int:
    if job.resume and "rounds" in job.settings:  # an extended run's new length
        return _setting(dataclasses.replace(job, resume=False), "rounds", 1)
    return _setting(job, "rounds", 30 if not job.resume else 1)


def checkpoint_every(job: Job) -> int:
    """Every how many rounds a job's run saves a checkpoint (its `checkpoint_every`, at least 1)."""
    return max(1, _setting(job, "checkpoint_every", 1))


def _short(name: str, width: int = 32) -> str:
    return name if len(name) <= width else name[: width - 11] + "…" + name[-10:]


def _width() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except OSError:
        return 120


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def run_specs(
    specs: list[RunSpec], runs_dir: Path, jobs: int | None = None, force: bool = False,
    tensorboard: bool = False, stream: TextIO | None = None, resume_hint: str | None = None,
    batch_runs: int = DEFAULT_BATCH_RUNS, cluster: ClusterOptions | None = None,
    backend: Callable[..., None] | None = None, extend: bool = False,
) -> dict[str, str]:
    """Run every spec into `runs_dir/<name>`; returns `{name: error}` for runs that failed.

    Runs that share data, model and device on the batched executor (a GPU, or the linear models)
    step together, up to `batch_runs` at a time (`batch_units`; 1 runs each on its own); each
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
    units = batch_units(todo, batch_runs, cuda)
    n = max(1, min(jobs or default_jobs(), len(units)))
    tally = Outcomes()
    with _graceful_sigint(progress) as (requested, hard):
        global _STOP
        if cluster is not None and backend is not None:
            backend(units, cluster, runs_dir, requested, hard, tally, progress)
        elif n == 1:
            global _TICK
            previous, _STOP, _TICK = _STOP, requested, progress.tick
            left = list(units)
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
            finally:
                _STOP, _TICK = previous, None
        else:
            # workers start with SIGINT blocked (inherited through fork/exec), so none dies from
            # the terminal's Ctrl-C before `_init_worker` makes it ignore SIGINT
            ctx = _context(units)
            stop = ctx.Event()  # set by `_drain`, never in the handler (its lock is not reentrant)
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init_worker,
                                           initargs=(stop, core_share(usable_cores(), n),
                                                     plugins.files()))
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
    progress.close()
    if requested.is_set() or hard:
        line = tally.line(bool(hard), resume_hint)
        progress.stream.write(line + "\n")
        progress.stream.flush()
        raise Interrupted(line)
    return tally.errors


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


class Outcomes:
    """What became of each job: finished, failed, stopped at a round, cancelled."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self.stopped: dict[str, int] = {}
        self.cancelled = 0
        self.unfinished = 0
        """Runs left unfinished by a hard stop (a second Ctrl-C), running or queued."""

    def add(self, result: dict[str, Any], progress: Progress, seconds: float) -> None:
        if result.get("cancelled"):
            self.cancelled += 1
        elif "stopped" in result:
            self.stopped[result["name"]] = result["stopped"]
        else:
            _record(result, self.errors)
            progress.finish(result["name"], result, seconds)

    def line(self, hard: bool, hint: str | None) -> str:
        again = f"`{hint}`" if hint else "the same command"
        if hard:
            return (f"interrupted: stopped at once, {self.unfinished + self.cancelled} run(s) "
                    f"unfinished; run "
                    f"{again} to resume (they continue from their last checkpoint)")
        rounds = ", ".join(f"{name} at round {k}" for name, k in list(self.stopped.items())[:3])
        more = " …" if len(self.stopped) > 3 else ""
        stopped = f" ({rounds}{more})" if self.stopped else ""
        return (f"interrupted: {len(self.stopped)} running run(s) stopped after a saved round"
                f"{stopped}, {self.cancelled} queued run(s) cancelled; run {again} to resume")


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


PRELOAD = ["fedhet.runs.runner", "fedhet.engine.simulation", "sklearn.datasets"]


def _context(units: Sequence[Sequence[Job]] = ()) -> multiprocessing.context.BaseContext:
    """The start method of a grid's worker processes.

    From fedhet's command line, fresh workers that never inherit the parent's torch thread
    pools: `forkserver` (a clean server imports torch and the data libraries once, then forks
    each worker) where the platform has it, else `spawn`; every component comes from fedhet or
    a plugin, which `_init_worker` imports. A grid started from Python (a script, a notebook)
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


def _record(result: dict[str, Any], errors: dict[str, str]) -> None:
    if "error" in result:
        errors[result["name"]] = result["error"]
