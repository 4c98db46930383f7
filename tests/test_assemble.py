"""Assemble, then run: parts handed in stand where registered ones would, callbacks see every
saved round and may stop a run that a resume then continues exactly, and the engine reads a
component's traits instead of lists of names."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedhet.algorithms.base import ALGORITHMS, RunInfo
from fedhet.algorithms.fedavg import FedAvg, FedAvgParams
from fedhet.data.embedded import DigitsParams, load_digits
from fedhet.data.registry import DATASETS
from fedhet.engine.assembly import algorithm_params, assemble, assemble_clients
from fedhet.engine.config import config_of
from fedhet.engine.federation import load
from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS
from fedhet.registry import NoParams
from fedhet.rundir.store import TIME_COLUMNS
from fedhet.runs.single import execute

BASE = {"dataset": "digits", "partition": "dirichlet", "clients": 4, "rounds": 2, "lr": 0.1,
        "local_steps": 3, "seed": 5, "device": "cpu"}


def small_mlp(input_shape: tuple[int, ...], num_classes: int, params: Any) -> nn.Module:
    """A model factory of the user's own (randomly initialised: the seed order matters)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 12), nn.Tanh(),
                         nn.Linear(12, num_classes))


def linear_model(input_shape: tuple[int, ...], num_classes: int, params: Any) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


class HalfStepAvg(FedAvg):
    """FedAvg that moves the global model half way along the averaged update."""

    name = "test-half-step"

    def aggregate(self, state, round, replies):
        new, diag = super().aggregate(state, round, replies)
        return replace(new, w=state.w + 0.5 * (new.w - state.w)), diag


def rows_of(sim) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    sim.callbacks.append(rows.append)
    sim.run()
    return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in rows]


def test_handed_in_parts_give_the_rows_of_the_same_parts_registered_by_name():
    with MODELS.added("test-small-mlp", small_mlp), \
            ALGORITHMS.added(HalfStepAvg.name, HalfStepAvg, FedAvgParams):
        by_name = rows_of(assemble(config_of({**BASE, "model": "test-small-mlp",
                                               "algorithm": HalfStepAvg.name}), log=lambda _: None))
    cfg = config_of({**BASE, "model": "mlp", "algorithm": "fedavg"})
    handed = rows_of(assemble(cfg, data=load(cfg), model=small_mlp, algorithm=HalfStepAvg,
                              log=lambda _: None))
    assert handed == by_name
    fedavg = rows_of(assemble(cfg, log=lambda _: None))
    assert fedavg != handed  # the handed-in algorithm and model were used


@dataclass(frozen=True)
class ProxParams:
    mu: float = 0.25
    weighting: str = "samples"


class OwnParams(FedAvg):
    Params = ProxParams


def test_a_handed_in_class_gets_its_own_parameters():
    """Settings built for the named algorithm carry over where the class's own parameter
    dataclass has a field of the same name; the rest keep its defaults."""
    cfg = config_of({**BASE, "algorithm": "fedavg", "algorithm.weighting": "uniform"})
    assert algorithm_params(cfg, FedAvg) is cfg.algorithm_params
    assert algorithm_params(cfg, HalfStepAvg) is cfg.algorithm_params  # declares none of its own
    assert algorithm_params(cfg, OwnParams) == ProxParams(mu=0.25, weighting="uniform")


class Recorder:
    """A callback object: every hook, in order."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[Any] = []
        self.stop_at = stop_at

    def on_start(self, run) -> None:
        self.events.append(("start", run.start_round))

    def on_round(self, row: dict[str, Any]) -> bool:
        self.events.append(("round", int(row["round"])))
        return row["round"] == self.stop_at

    def on_end(self, summary: dict[str, Any] | None) -> None:
        self.events.append(("end", summary["status"] if summary else None))


class ModelCheck:
    """A callback that loads the run's global model (`RunView.state_dict`) into a model of its
    own each round and evaluates it on the test set."""

    def __init__(self, cfg) -> None:
        self.data = load(cfg)
        self.model = MODELS.get(cfg.model_name).factory(
            tuple(self.data.input_shape), self.data.num_classes, cfg.model_params)
        self.seen: list[tuple[float, float]] = []

    def on_start(self, run) -> None:
        self.run = run
        assert (run.rounds, run.start_round, run.round, run.row) == (3, 0, 0, None)
        with pytest.raises(TypeError):
            run.settings["lr"] = 1.0  # read-only: the run is the engine's
        with pytest.raises(AttributeError):
            run.rounds = 5

    def on_round(self, row: dict[str, Any]) -> None:
        assert self.run.round == row["round"] and self.run.row["test_accuracy"] == row["test_accuracy"]
        self.model.load_state_dict(self.run.state_dict())  # strict: every name and shape
        self.model.eval()
        with torch.no_grad():
            guess = self.model(torch.as_tensor(self.data.x_test)).argmax(1)
        acc = (guess == torch.as_tensor(self.data.y_test)).double().mean().item()
        self.seen.append((acc, row["test_accuracy"]))
        flat = torch.cat([p.detach().flatten() for p in self.model.parameters()])
        assert torch.equal(flat, self.run.weights())


def test_a_callback_sees_a_read_only_view_with_the_global_model(tmp_path):
    settings = {**BASE, "rounds": 3}
    check = ModelCheck(config_of(settings, "test"))
    execute(settings, tmp_path / "run", log=lambda _: None, callbacks=[check])
    assert check.run.dir == tmp_path / "run" and check.run.settings["rounds"] == 3
    assert len(check.seen) == 3
    for mine, the_runs in check.seen:  # the model a callback gets is the one the row evaluated
        assert mine == pytest.approx(the_runs, abs=1e-9)


def read_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "metrics.csv") as f:
        return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in csv.DictReader(f)]


def test_callbacks_see_every_round_and_one_stops_a_run_that_resumes_exactly(tmp_path):
    settings = {**BASE, "rounds": 6, "checkpoint_every": 2}
    whole = tmp_path / "whole"
    execute(settings, whole, log=lambda _: None)

    out = tmp_path / "stopped"
    recorder, rows = Recorder(stop_at=3), []
    summary = execute(settings, out, log=lambda _: None, callbacks=[recorder, rows.append])
    assert (summary["status"], summary["finished"], summary["rounds_done"]) == ("stopped", False, 3)
    assert json.loads((out / "summary.json").read_text())["status"] == "stopped"
    assert recorder.events == [("start", 0), ("round", 1), ("round", 2), ("round", 3),
                               ("end", "stopped")]
    assert [r["round"] for r in rows] == [1, 2, 3]  # every callback sees the row that stopped it

    again = Recorder()
    summary = execute(None, out, resume=True, log=lambda _: None, callbacks=[again])
    assert summary["finished"] and summary["status"] == "finished"
    assert again.events == [("start", 3), ("round", 4), ("round", 5), ("round", 6),
                            ("end", "finished")]
    assert read_rows(out) == read_rows(whole)


def test_a_callback_that_is_neither_a_function_nor_an_object_with_hooks_is_refused():
    with pytest.raises(FedhetError, match="callback 3 is neither"):
        assemble(config_of({**BASE, "rounds": 1}), log=lambda _: None, callbacks=[3]).run()


def test_a_dataset_declares_its_default_model():
    with DATASETS.added("test-digits-linear", load_digits, DigitsParams, default_model="logreg"):
        assert config_of({**BASE, "dataset": "test-digits-linear"}).model == "logreg"
    assert config_of(BASE).model == "mlp"
    with DATASETS.added("test-digits-plain", load_digits, DigitsParams):  # declares none
        assert config_of({**BASE, "dataset": "test-digits-plain"}).model == "mlp"


def test_a_model_that_declares_itself_linear_gets_the_stacked_executor_under_auto():
    settings = {**BASE, "executor": "auto", "workers": 1, "rounds": 1}
    with MODELS.added("test-linear", linear_model, NoParams, linear=True):
        sim = assemble(config_of({**settings, "model": "test-linear"}), log=lambda _: None)
        assert sim.side.executor.name == "stacked"
        assert sim.run()["finished"]
        # handed in, the same factory has the traits of its registry entry
        assert assemble(config_of(settings), model=linear_model, log=lambda _: None).side.executor.name \
            == "stacked"
    with MODELS.added("test-not-linear", linear_model, NoParams):
        sim = assemble(config_of({**settings, "model": "test-not-linear"}), log=lambda _: None)
        assert sim.side.executor.name == "sequential"


def test_the_client_half_holds_no_server():
    cfg = config_of(BASE)
    side = assemble_clients(cfg, log=lambda _: None)
    sim = assemble(cfg, log=lambda _: None)
    assert [ix.tolist() for ix in side.client_indices] == [ix.tolist() for ix in sim.side.client_indices]
    assert torch.equal(side.model.params, sim.side.model.params)
    assert isinstance(side.run_info, RunInfo) and not hasattr(side, "evaluator")


def test_a_callback_that_raises_stoprun_ends_the_run_as_it_was_raised_not_as_a_failure(tmp_path):
    """A stopping grid's callback raises `StopRun` after a saved round: the engine lets it through
    (the grid reports the run as stopped, not as failed user code), and the run resumes."""
    from fedhet.engine import StopRun

    def stop_after_2(row: dict[str, Any]) -> None:
        if row["round"] == 2:
            raise StopRun(2)

    out = tmp_path / "run"
    with pytest.raises(StopRun):
        execute({**BASE, "rounds": 4}, out, log=lambda _: None, callbacks=[stop_after_2])
    assert json.loads((out / "summary.json").read_text())["status"] == "running"
    summary = execute({**BASE, "rounds": 4}, out, resume=True, log=lambda _: None)
    assert summary["finished"] and summary["rounds_done"] == 4
