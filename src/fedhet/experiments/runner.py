"""Runs many `RunSpec`s in parallel processes: skips finished runs, resumes partial ones.

Each run lives in `out/runs/<name>/` and is a normal run directory (`fedhet run --resume` and
`fedhet report` work on it). Workers are fresh processes (forkserver, else spawn) with one
torch thread each. Progress: a live status line (runs done, running accuracies, ETA) when
stderr is a terminal, otherwise one line per finished run.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fedhet.errors import FedhetError
from fedhet.experiments.presets import RunSpec


@dataclass(frozen=True)
class Job:
    name: str
    settings: dict[str, Any]
    out: str
    resume: bool
    tensorboard: bool = False


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _limit_threads() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def _quiet(_: str) -> None:
    return None


def run_job(job: Job) -> dict[str, Any]:
    """Execute one job (in a worker or in-process); errors come back as `{"error": ...}`."""
    from fedhet.experiments.single import execute

    on_round = None
    try:
        if job.tensorboard:
            from fedhet.experiments.tensorboard import TensorBoardLogger

            on_round = TensorBoardLogger(Path(job.out))
        summary = execute(
            None if job.resume else job.settings, Path(job.out), resume=job.resume, force=True,
            log=_quiet, on_round=on_round,
        )
        return {"name": job.name, "summary": summary}
    except FedhetError as e:
        return {"name": job.name, "error": str(e)}
    except Exception as e:  # noqa: BLE001  (a crash in one run must not stop the others)
        return {"name": job.name, "error": f"{type(e).__name__}: {e}"}
    finally:
        if on_round is not None:
            on_round.close()


def plan_jobs(
    specs: list[RunSpec], runs_dir: Path, force: bool, tensorboard: bool = False
) -> tuple[list[Job], int]:
    """Jobs still to do (fresh or resumed) and the number of runs already finished.

    A run directory whose saved config differs from the spec's is an error (unless `force`,
    which starts every run again), so a changed grid never silently mixes settings.
    """
    from fedhet.engine.store import to_json
    from fedhet.experiments.single import is_finished, resolve_settings

    jobs, done = [], 0
    for spec in specs:
        out = runs_dir / spec.name
        config_path = out / "config.json"
        resume = False
        if not force and config_path.exists():
            cfg, _ = resolve_settings(spec.settings)
            wanted = json.loads(to_json(cfg.to_dict()))
            try:
                saved = json.loads(config_path.read_text())
            except json.JSONDecodeError:
                saved = None
            if saved is not None and saved != wanted:
                diff = sorted(k for k in wanted if saved.get(k) != wanted[k])
                raise FedhetError(
                    f"{out} holds a run with other settings ({', '.join(diff)}); use --force to "
                    "run the grid again from scratch, or another --out"
                )
            if saved is not None and is_finished(out):
                done += 1
                continue
            resume = saved is not None
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

    def _status(self, job: Job) -> tuple[int, float]:
        try:
            s = json.loads((Path(job.out) / "summary.json").read_text())
            return int(s.get("rounds_done", 0)), float(s.get("final_accuracy", float("nan")))
        except (OSError, ValueError):
            return 0, float("nan")

    def tick(self) -> None:
        if not self.live or time.monotonic() - self.last < 0.5:
            return
        self.last = time.monotonic()
        running, rounds_done = [], 0
        for name, job in self.jobs.items():
            r, acc = self._status(job)
            rounds_done += self.rounds[name] if name in self.finished else r
            if name not in self.finished and r > 0:
                running.append(f"{_short(name)} r{r} {acc:.3f}")
        if self.first is None and rounds_done > self.start_rounds:
            # the rate is measured from the first finished round on, not from worker start-up
            self.first = (time.monotonic(), rounds_done)
        left = sum(self.rounds.values()) - rounds_done
        eta = "?"
        if self.first is not None and rounds_done > self.first[1]:
            rate = (rounds_done - self.first[1]) / max(time.monotonic() - self.first[0], 1e-9)
            eta = _clock(left / rate)
        line = f"[{self.done}/{self.total} runs] ETA {eta} | " + " | ".join(running[:4])
        width = _width()
        self.stream.write("\r\x1b[K" + line[: width - 1])
        self.stream.flush()

    def finish(self, name: str, result: dict[str, Any], seconds: float) -> None:
        self.done += 1
        self.finished.add(name)
        if "error" in result:
            text = f"[{self.done}/{self.total}] {name} failed: {result['error']}"
        else:
            s = result["summary"]
            seconds = s.get("total_time_s", seconds)
            text = (
                f"[{self.done}/{self.total}] {name}: final {s['final_accuracy']:.4f}, best "
                f"{s['best_accuracy']:.4f} (round {s['best_round']}), {seconds:.1f} s"
            )
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(prefix + text + "\n")
        self.stream.flush()
        self.last = 0.0

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _rounds(job: Job) -> int:
    if job.resume:
        try:
            return int(json.loads((Path(job.out) / "config.json").read_text())["rounds"])
        except (OSError, ValueError, KeyError):
            return 1
    return int(job.settings.get("rounds", 30))


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
    tensorboard: bool = False, stream: TextIO | None = None,
) -> dict[str, str]:
    """Run every spec into `runs_dir/<name>`; returns `{name: error}` for runs that failed."""
    todo, done = plan_jobs(specs, runs_dir, force, tensorboard)
    progress = Progress(len(specs), done, todo, stream)
    errors: dict[str, str] = {}
    if not todo:
        return errors
    n = max(1, min(jobs or default_jobs(), len(todo)))
    if n == 1:
        for job in todo:
            t0 = time.monotonic()
            result = run_job(job)
            _record(result, errors)
            progress.finish(job.name, result, time.monotonic() - t0)
        return errors
    pool = ProcessPoolExecutor(max_workers=n, mp_context=_context(), initializer=_limit_threads)
    try:
        started = time.monotonic()
        pending: dict[Future, Job] = {pool.submit(run_job, job): job for job in todo}
        while pending:
            finished, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for fut in finished:
                job = pending.pop(fut)
                try:
                    result = fut.result()
                except Exception as e:  # noqa: BLE001  (a worker that died, e.g. out of memory)
                    result = {"name": job.name, "error": f"worker process failed: {e}"}
                _record(result, errors)
                progress.finish(job.name, result, time.monotonic() - started)
            progress.tick()
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        progress.close()
        raise FedhetError("interrupted; run the same command again to resume the unfinished runs") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    progress.close()
    return errors


PRELOAD = ["fedhet.experiments.runner", "fedhet.engine.simulation", "sklearn.datasets"]


def _context() -> multiprocessing.context.BaseContext:
    """Fresh workers that never inherit the parent's torch thread pools: `forkserver` (a clean
    server imports torch and the data libraries once, then forks each worker) where the
    platform has it, else `spawn`."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


def _record(result: dict[str, Any], errors: dict[str, str]) -> None:
    if "error" in result:
        errors[result["name"]] = result["error"]
