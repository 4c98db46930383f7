"""Callbacks: what a run tells the code watching it, and how that code stops it.

A callback is either a plain function of a round's metrics row, `f(row) -> bool | None`, or an
object with any of these methods (`Callback`; the others are simply not called):

- `on_start(run)`: once, before the first round this call trains; `run` is a read-only
  `RunView` of the run: its directory, settings, rounds, `start_round` (0, or a resumed
  checkpoint's round), the last `round` and metrics `row`, and on request its current global
  model (`weights()`, `state_dict()`). Keep it to look again in `on_round`.
- `on_round(row) -> bool | None`: after each trained round, once its row, diagnostics and
  (when due) checkpoint are saved. A truthy return stops the run after that round: the loop
  checkpoints it and the summary says `status: "stopped"`, `finished: false`, so a resume
  continues exactly there. Every callback sees the row before the run stops.
- `on_end(summary)`: once, when the loop ends: with the summary it returns (finished,
  stopped or diverged), or with None when an exception ends it (an interrupt, an error).

The progress bar of `fedhet run` (`ProgressBar`), TensorBoard
(`fedhet.runs.tensorboard`) and the grid's stop flag are callbacks; so are a user's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch

from fedhet.errors import FedhetError

try:  # the progress bar; a checkout run without tqdm (PYTHONPATH=src) prints plain lines
    from tqdm.auto import tqdm
except ImportError:
    tqdm = None

Row = dict[str, Any]
METHODS = ("on_start", "on_round", "on_end")


class StopRun(Exception):  # noqa: N818  (a signal, not an error)
    """Raised from a callback, after a saved round, to end the run at once (a grid that is
    stopping): it passes through the engine as it was raised, never reported as the run's
    failure; the run resumes from its last checkpoint."""


class RunView:
    """What a callback sees of a run, read-only: the engine keeps the run itself.

    `dir` (None for a run that writes nowhere), `settings` (the resolved config, as
    `config.json` holds it), `rounds` (the rounds it runs to), `start_round` (the round this
    call started after), `round` and `row` (the last saved round and its metrics row; 0 and None
    before the first), and the current global model on request: `weights()` (a flat float32
    copy, the model the round's row evaluated) and `state_dict()` (the same, by parameter name,
    with the model's buffers)."""

    def __init__(
        self, dir: Path | None, settings: Mapping[str, Any], rounds: int, start_round: int,
        weights: Callable[[], torch.Tensor], state_dict: Callable[[], dict[str, torch.Tensor]],
    ) -> None:
        self._dir, self._settings = dir, MappingProxyType(dict(settings))
        self._rounds, self._start_round = rounds, start_round
        self._weights, self._state_dict = weights, state_dict
        self._row: Row | None = None

    @property
    def dir(self) -> Path | None:
        return self._dir

    @property
    def settings(self) -> Mapping[str, Any]:
        return self._settings

    @property
    def rounds(self) -> int:
        return self._rounds

    @property
    def start_round(self) -> int:
        return self._start_round

    @property
    def round(self) -> int:
        return int(self._row["round"]) if self._row is not None else self._start_round

    @property
    def row(self) -> Mapping[str, Any] | None:
        return MappingProxyType(self._row) if self._row is not None else None

    def weights(self) -> torch.Tensor:
        """The current global model as one flat float32 vector (a copy)."""
        return self._weights().detach().clone()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The current global model by parameter and buffer name (copies), for `load_state_dict`
        into a model built by the run's factory."""
        return self._state_dict()

    def saw(self, row: Row) -> None:
        """The engine's: the round `row` is saved (callbacks see it next)."""
        self._row = row

    def __repr__(self) -> str:
        return f"RunView(dir={self._dir}, round={self.round}/{self._rounds})"


Run = RunView
"""What `on_start` is given."""


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
        self.view: RunView | None = None

    def start(self, run: RunView) -> None:
        self.view = run
        for c in self.items:
            hook = getattr(c, "on_start", None)
            if hook is not None:
                hook(run)

    def round(self, row: Row) -> bool:
        """Call every callback with `row`; whether any of them asked to stop."""
        if self.view is not None:
            self.view.saw(row)
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

    def on_start(self, run: RunView) -> None:
        total, initial = run.rounds, run.start_round
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


__all__ = ["Callback", "CallbackLike", "Callbacks", "ProgressBar", "RunView", "StopRun"]
