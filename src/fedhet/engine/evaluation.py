"""Evaluation of the global model and the run's summary.

`Evaluator.row` is one metrics row: the algorithm's evaluated model (`eval_params`, plus any
`extra_eval_params` under a suffix, FedNNNN's plain average) on the test (or validation) split,
and on the training set with `train_loss`, every `eval_every` rounds and at the last round
(other rounds carry NaN accuracies), with each of the run's `metrics` on the same set
(`test_<name>`, `fedhet.metrics`), and, with per-client evaluation on, the statistics of
the global model's accuracy on the clients' held-out shares every `client_eval_every` rounds
(`fedhet.engine.client_eval`) with their personalised accuracy after
`client_eval_finetune_steps` local steps; `check_finite` raises `Diverged` for a model or loss
that is not finite. `summary` condenses the rows into `summary.json`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fedhet.algorithms.base import Algorithm
from fedhet.data.base import Dataset
from fedhet.engine.client_eval import (
    FineTune,
    HeldOut,
    client_scores,
    personalised_scores,
    test_metrics,
)
from fedhet.engine.clients import LocalWork, learning_rate
from fedhet.engine.config import ConfigFields
from fedhet.engine.failures import Diverged
from fedhet.metrics import client_columns, resolve
from fedhet.training.cohort import EvalJob
from fedhet.training.flat import FlatModel
from fedhet.training.local import SGDConfig, evaluate


@dataclass(frozen=True)
class EvalSettings(ConfigFields):
    """The settings evaluation reads (the `RunConfig` fields of the same names)."""

    eval_every: int
    rounds: int
    train_loss: bool
    client_eval_every: int = 1
    client_eval_finetune_steps: int = 0
    metrics: tuple[str, ...] = ()


class Evaluator:
    """The global model's metrics rows for one run; `local` gives each row's learning rate."""

    def __init__(
        self, settings: EvalSettings, model: FlatModel, data: Dataset, algorithm: Algorithm,
        local: LocalWork, held_out: HeldOut | None = None, finetune: FineTune | None = None,
    ) -> None:
        self.settings = settings
        self.model = model
        self.data = data
        self.algorithm = algorithm
        self.local = local
        self.held_out = held_out
        """The clients' held-out shares (None: no per-client evaluation)."""
        self.finetune = finetune
        """How clients fine-tune for their personalised accuracy (None: not scored)."""
        self.metrics = [resolve(name, data.num_classes) for name in settings.metrics]
        self.stacked: Callable[[list[EvalJob]], None] | None = None
        """Scores a row's models together with other runs' (`SharedCohort.evaluate_many`, set
        while the run steps in a stack that `stacks_evaluation`); None: one by one here."""

    def evaluated(self, round: int) -> bool:
        """Whether round `round` (0 = before training) is evaluated."""
        return round % self.settings.eval_every == 0 or round == self.settings.rounds

    def clients_evaluated(self, round: int) -> bool:
        """Whether round `round` scores the global model on the clients' held-out shares."""
        every = self.settings.client_eval_every
        return self.held_out is not None and (round % every == 0 or round == self.settings.rounds)

    def row(
        self, state: Any, round: int, diag: dict[str, float], buffers: torch.Tensor
    ) -> dict[str, Any]:
        """Round `round`'s metrics: test loss/accuracy of every evaluated model (BatchNorm
        statistics `buffers`), the run's metrics, the per-client statistics, the learning rate
        `η_(k−1)` the round trained with, and `diag`."""
        data = self.data
        row: dict[str, Any] = {"round": round}
        if self.evaluated(round):
            models = {"": self.algorithm.eval_params(state)}
            models.update({f"_{s}": w for s, w in self.algorithm.extra_eval_params(state).items()})
            jobs = {
                (f"test_loss{s}", f"test_accuracy{s}"): EvalJob(w, buffers, data.x_test, data.y_test)
                for s, w in models.items()
            }
            if self.settings.train_loss:
                jobs["train_loss", "train_accuracy"] = EvalJob(
                    models[""], buffers, data.x_train, data.y_train
                )
            self._score(list(jobs.values()))
            for (loss, accuracy), job in jobs.items():
                assert job.result is not None, "_score sets every result or raises"
                row[loss], row[accuracy] = job.result
            if self.metrics:
                row.update(test_metrics(self.model, models[""], buffers, data.x_test,
                                        data.y_test, self.metrics))
        else:
            row["test_loss"], row["test_accuracy"] = float("nan"), float("nan")
            row.update({f"test_{m.name}": float("nan") for m in self.metrics})
        if self.clients_evaluated(round):
            assert self.held_out is not None
            w = self.algorithm.eval_params(state)
            row.update(client_scores(self.model, w, buffers, data.x_train, data.y_train,
                                     self.held_out, self.metrics))
            if self.finetune is not None:
                local = self.local
                sgd = SGDConfig(learning_rate(local, max(round - 1, 0)), local.momentum,
                                local.weight_decay)
                row.update(personalised_scores(self.model, w, buffers, data.x_train, data.y_train,
                                               self.held_out, self.finetune, sgd, round))
        elif self.held_out is not None:
            names = [m.name for m in self.metrics]
            row.update(dict.fromkeys(client_columns(names, self.finetune is not None), float("nan")))
        row["lr"] = learning_rate(self.local, max(round - 1, 0))
        row.update(diag)
        return row

    def _score(self, jobs: list[EvalJob]) -> None:
        """Each job's `(loss, accuracy)`, stacked with other runs' where `stacked` is set."""
        if self.stacked is None:
            for job in jobs:
                job.result = evaluate(self.model, job.params, job.buffers, job.x, job.y)
            return
        self.stacked(jobs)
        for job in jobs:
            if job.error is not None:
                raise job.error

    def check_finite(self, state: Any, row: dict[str, Any], round: int) -> None:
        """Raise `Diverged` when the global model or its evaluated loss is not finite."""
        if not bool(torch.isfinite(self.algorithm.eval_params(state)).all()):
            raise Diverged(round, "global model parameters")
        if self.evaluated(row["round"]) and not math.isfinite(row["test_loss"]):
            raise Diverged(round, "test loss")


def summary(
    config: Mapping[str, Any], num_clients: int, rows: list[dict[str, Any]], finished: bool
) -> dict[str, Any]:
    """Final and best accuracy, time and traffic; rows may hold numbers or saved text cells.
    `config` is the run's `config.json` (`RunConfig.to_dict`)."""
    rows = [{k: _number(v) for k, v in r.items()} for r in rows]
    evaluated = [r for r in rows if not math.isnan(r.get("test_accuracy", float("nan")))]
    best = max(evaluated, key=lambda r: r["test_accuracy"]) if evaluated else {}
    last = evaluated[-1] if evaluated else {}
    nan = float("nan")
    return {
        "algorithm": config["algorithm"], "dataset": config["dataset"],
        "partition": config["partition"], "model": config["model"], "seed": config["seed"],
        "clients": num_clients, "rounds": config["rounds"],
        "rounds_done": int(rows[-1]["round"]), "finished": finished,
        "status": "finished" if finished else "running",
        "final_accuracy": last.get("test_accuracy", nan), "final_loss": last.get("test_loss", nan),
        "best_accuracy": best.get("test_accuracy", nan), "best_round": int(best.get("round", 0)),
        "total_time_s": rows[-1].get("wall_time_s", 0.0),
        "cum_bytes": int(rows[-1].get("cum_bytes", 0)),
        "cum_model_transfers": int(rows[-1].get("cum_model_transfers", 0)),
        **_finals(rows, config),
    }


def _finals(rows: list[dict[str, Any]], config: Mapping[str, Any]) -> dict[str, float]:
    """`final_<column>`: the last evaluated value of each metric column (`test_<name>` of the
    run's `metrics`) and of each per-client statistic (`client_*`); none without them."""
    named = {f"test_{m}" for m in config.get("metrics") or ()}
    columns = dict.fromkeys(c for r in rows for c in r if c in named or c.startswith("client_"))
    out = {}
    for column in columns:
        values = [r[column] for r in rows if isinstance(r.get(column), float | int)
                  and not math.isnan(r[column])]
        out[f"final_{column}"] = values[-1] if values else float("nan")
    return out


def _number(value: Any) -> Any:
    """A saved metrics cell (text) as a number; numbers pass through."""
    if not isinstance(value, str):
        return value
    try:
        return float(value) if value else float("nan")
    except ValueError:
        return value


__all__ = ["EvalSettings", "Evaluator", "summary"]
