"""What a grid shows while it runs: a live status line on a terminal, a line per finished run
and a status line every `$FEDHET_PROGRESS_SECONDS` (30 s) in a log file (`Progress`), and
what became of each run (`Outcomes`: finished, failed, stopped, cancelled).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from fedhet.runs.jobs import Job, rounds_of, status_of
from fedhet.runs.progress import every_s


class Progress:
    """Live status line on a terminal; a line per finished run otherwise."""

    def __init__(self, total: int, done: int, jobs: list[Job], stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.total, self.done = total, done
        self.jobs = {j.name: j for j in jobs}
        self.rounds = {j.name: rounds_of(j) for j in jobs}
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


def _record(result: dict[str, Any], errors: dict[str, str]) -> None:
    if "error" in result:
        errors[result["name"]] = result["error"]
