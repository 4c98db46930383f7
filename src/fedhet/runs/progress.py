"""Progress for a log file: a line every few rounds or seconds when no terminal shows a bar.

On a terminal, `fedhet run` draws tqdm's bar and `compare` a live status line; in a log file
(a batch job, `> run.log 2>&1`) both would say nothing until the end. `RoundLines` is an
`on_round` callback that writes `round k/K  acc …  loss …  s/round  ETA` at the first round,
the last, every tenth of the run, and whenever `every_s` seconds have passed since the last line.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

EVERY_S_ENV = "FEDHET_PROGRESS_SECONDS"
DEFAULT_EVERY_S = 30.0
"""[choice] Seconds between two progress lines at most (unless a line is due sooner by rounds):
a slow run still shows life twice a minute; `$FEDHET_PROGRESS_SECONDS` changes it."""


def every_s() -> float:
    """The line interval in seconds: `$FEDHET_PROGRESS_SECONDS`, else `DEFAULT_EVERY_S`."""
    try:
        return max(0.0, float(os.environ.get(EVERY_S_ENV, DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


def clock(seconds: float) -> str:
    """`1h02m`, `3m05s` or `12s`."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class RoundLines:
    """`on_round` callback: progress lines of one run of `total` rounds on `stream`."""

    def __init__(self, total: int, stream: TextIO | None = None, every: float | None = None,
                 then: Callable[[dict[str, Any]], None] | None = None, prefix: str = "") -> None:
        self.total, self.stream, self.then, self.prefix = total, stream or sys.stderr, then, prefix
        self.every = every_s() if every is None else every
        self.step = max(1, math.ceil(total / 10))
        self.last_line = -math.inf
        self.first: tuple[int, float] | None = None  # (round, wall time) at the first callback
        self.acc = self.loss = math.nan

    def __call__(self, row: dict[str, Any]) -> None:
        if self.then is not None:
            self.then(row)
        k, wall = int(row["round"]), float(row.get("wall_time_s", math.nan))
        if math.isfinite(row.get("test_accuracy", math.nan)):
            self.acc, self.loss = float(row["test_accuracy"]), float(row["test_loss"])
        if self.first is None:
            self.first = (k, wall)
            per_round = float(row.get("round_time_s", 0.0)) + float(row.get("eval_time_s", 0.0))
        else:
            per_round = (wall - self.first[1]) / max(1, k - self.first[0])
        now = time.monotonic()
        due = (k == self.first[0] or k == self.total or k % self.step == 0
               or now - self.last_line >= self.every)
        if not due:
            return
        self.last_line = now
        eta = clock(per_round * (self.total - k))
        self.stream.write(
            f"{self.prefix}round {k}/{self.total}  acc {self.acc:.4f}  loss {self.loss:.4f}  "
            f"{per_round:.2f} s/round  ETA {eta}\n"
        )
        self.stream.flush()
