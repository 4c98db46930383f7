"""Callbacks: what a run tells the code watching it, and how that code stops it.

A callback is either a plain function of a round's metrics row, `f(row) -> bool | None`, or an
object with any of these methods (`Callback`; the others are simply not called):

- `on_start(run)`: once, before the first round this call trains; `run` is the `Simulation`
  (`run.start_round` is the round it starts after: 0, or a resumed checkpoint's round).
- `on_round(row) -> bool | None`: after each trained round, once its row, diagnostics and
  (when due) checkpoint are saved. A truthy return stops the run after that round: the loop
  checkpoints it and the summary says `status: "stopped"`, `finished: false`, so a resume
  continues exactly there. Every callback sees the row before the run stops.
- `on_end(summary)`: once, when the loop ends: with the summary it returns (finished,
  stopped or diverged), or with None when an exception ends it (an interrupt, an error).

The progress bar of `fedhet run` (`ProgressBar`), TensorBoard
(`fedhet.experiments.tensorboard`) and the grid's stop flag are callbacks; so are a user's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from fedhet.errors import FedhetError

try:  # the progress bar; a checkout run without tqdm (PYTHONPATH=src) prints plain lines
    from tqdm.auto import tqdm
except ImportError:
    tqdm = None

Row = dict[str, Any]
Run = Any
"""The `fedhet.engine.simulation.Simulation` being run (not imported: it imports this module)."""
METHODS = ("on_start", "on_round", "on_end")


@runtime_checkable
class Callback(Protocol):
    """A callback object (module docstring); each method is optional."""

    def on_start(self, run: Run) -> None: ...

    def on_round(self, row: Row) -> bool | None: ...

    def on_end(self, summary: dict[str, Any] | None) -> None: ...


CallbackLike = Callable[[Row], "bool | None"] | Callback
"""What a run's `callbacks` hold: a function of the row, or an object with callback methods."""


class Callbacks:
    """A run's callbacks, each called in the order given."""

    def __init__(self, callbacks: Iterable[Any]) -> None:
        self.items = [_checked(c) for c in callbacks]

    def start(self, run: Run) -> None:
        for c in self.items:
            hook = getattr(c, "on_start", None)
            if hook is not None:
                hook(run)

    def round(self, row: Row) -> bool:
        """Call every callback with `row`; whether any of them asked to stop."""
        stop = False
        for c in self.items:
            hook = getattr(c, "on_round", None) if _has_methods(c) else c
            if hook is not None and hook(row):
                stop = True
        return stop

    def end(self, summary: dict[str, Any] | None) -> None:
        for c in self.items:
            hook = getattr(c, "on_end", None)
            if hook is not None:
                hook(summary)


def _has_methods(c: Any) -> bool:
    return any(callable(getattr(c, m, None)) for m in METHODS)


def _checked(c: Any) -> Any:
    if _has_methods(c) or callable(c):
        return c
    raise FedhetError(
        f"callback {c!r} is neither a function of the metrics row nor an object with "
        f"{', '.join(METHODS)}"
    )


class ProgressBar:
    """tqdm's bar over the run's rounds, with the last accuracy and loss (`fedhet run` on a
    terminal); one plain line per round on stderr where tqdm is not installed."""

    def __init__(self) -> None:
        self.bar: Any = None

    def on_start(self, run: Run) -> None:
        total, initial = run.loop.rounds, run.start_round
        if tqdm is None:
            self.bar = _PlainProgress(total, initial)
        else:
            self.bar = tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True)

    def on_round(self, row: Row) -> None:
        if self.bar is not None:
            self.bar.set_postfix(acc=f"{row['test_accuracy']:.4f}", loss=f"{row['test_loss']:.4f}")
            self.bar.update(1)

    def on_end(self, summary: dict[str, Any] | None) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _PlainProgress:
    """The part of tqdm's interface `ProgressBar` uses, as one line per round on stderr."""

    def __init__(self, total: int, initial: int) -> None:
        self.total, self.n, self.postfix = total, initial, ""

    def set_postfix(self, **values: str) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        print(f"round {self.n}/{self.total} {self.postfix}".rstrip(), file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


__all__ = ["Callback", "CallbackLike", "Callbacks", "ProgressBar"]
