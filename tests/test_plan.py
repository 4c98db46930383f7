"""`fedhet.engine.plan`: where a run's work runs is decided once, with its reasons."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fedhet.engine import plan as plans
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.plan import RunShape, describe_plan, plan, would_stack
from fedhet.errors import FedhetError

BASE = {"dataset": "digits", "clients": 4, "rounds": 2, "model": "mlp", "model.hidden": 8}


def cfg(**settings):
    base = {k: v for k, v in BASE.items() if "model" not in settings or not k.startswith("model")}
    return config_of({**base, **settings}, "test")


def shape(module=None, round_cost=1e3, per_round=4) -> RunShape:
    return RunShape(module if module is not None else nn.Linear(3, 2), round_cost, per_round)


def test_auto_on_the_cpu_by_model():
    p = plan(cfg(), cores=1, shape=shape())
    assert (p.device, p.executor, p.workers, p.backend) == (torch.device("cpu"), "sequential", 1,
                                                             "local")
    assert p.reasons["executor"] == "auto: on the CPU, not a linear model"
    linear = plan(cfg(model="logreg"), cores=1, shape=shape())
    assert linear.executor == "stacked"
    assert linear.reasons["executor"] == "auto: a linear model (closed-form gradients)"


def test_a_model_that_cannot_be_stacked_runs_sequentially_and_says_why():
    dropout = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    p = plan(cfg(executor="stacked"), cores=1, shape=shape(dropout))
    assert p.executor == "sequential"
    assert p.reasons["executor"] == "the model cannot be stacked (Dropout draws per-client randomness)"


def test_workers_auto_follows_the_measured_rule(monkeypatch):
    from fedhet.engine import workers

    heavy = shape(round_cost=2 * workers.AUTO_MIN_WORK, per_round=4)
    p = plan(cfg(rounds=10**6), cores=3, shape=heavy)
    assert p.workers == 3 and p.workers_note is not None
    assert p.reasons["workers"] == f"auto: {p.workers_note}"
    light = plan(cfg(), cores=3, shape=shape(round_cost=1.0))
    assert light.workers == 1 and "< 3e+08" in light.reasons["workers"]
    # a GPU, the stacked executor or one core: nothing weighed, nothing logged
    assert plan(cfg(model="logreg"), cores=3, shape=heavy).workers_note is None
    assert plan(cfg(rounds=10**6), cores=1, shape=heavy).workers_note is None
    # the clients of a Flower server run on SuperNodes
    server = plan(cfg(rounds=10**6), cores=3, shape=heavy, clients_here=False)
    assert server.workers == 1 and "SuperNodes" in server.reasons["workers"]
    # set: as set
    assert plan(cfg(workers=2), cores=1, shape=heavy).workers == 2


def test_the_hint_of_a_gpu_elsewhere_decides_device_and_batching():
    p = plan(cfg(), cores=1, shape=shape(), cuda=True)
    assert p.device.type == "cuda" and p.executor == "stacked"
    assert p.reasons["device"] == "auto: the runs ask for GPUs"
    assert would_stack(cfg(), cuda=True) and not would_stack(cfg(), cuda=False)
    assert would_stack(cfg(model="logreg"), cuda=False)
    assert not would_stack(cfg(model="logreg", executor="sequential"), cuda=True)
    assert not would_stack(cfg(workers=2), cuda=False)


def test_bad_combinations_are_one_line():
    with pytest.raises(FedhetError, match="--workers 2 runs the sequential executor"):
        plan(cfg(workers=2, executor="stacked"), cores=2, shape=shape())
    with pytest.raises(FedhetError, match="spreads clients over CPU processes"):
        plan(cfg(workers=2, device="cuda"), cores=2, shape=shape(), cuda=True)


def test_describe_plan_before_anything_is_built():
    rows = describe_plan(cfg(model="logreg"))
    assert [r[0] for r in rows] == ["device", "executor", "workers", "backend"]
    values = {k: v for k, v, _ in rows}
    assert values["workers"] == "auto" and values["backend"] == "local"
    assert "dropout" in dict((k, r) for k, _, r in rows)["executor"]  # the model is not built
    if not torch.cuda.is_available():
        device = describe_plan(cfg(device="cuda"))[0]
        assert device[:2] == ("device", "cuda") and device[2].startswith("not possible here:")


def test_a_simulation_decides_once(monkeypatch):
    """Assembling a run enters the plan once; each rule it composes is asked once."""
    calls = {"plan": 0, "executor": 0, "workers": 0}
    real_plan, real_executor, real_workers = plans.plan, plans.executor_choice, plans.auto_workers

    def counted(name, f):
        def wrapper(*a, **k):
            calls[name] += 1
            return f(*a, **k)
        return wrapper

    import fedhet.engine.assembly as assembly

    monkeypatch.setattr(assembly, "plan", counted("plan", real_plan))
    monkeypatch.setattr(plans, "executor_choice", counted("executor", real_executor))
    monkeypatch.setattr(plans, "auto_workers", counted("workers", real_workers))
    lines: list[str] = []
    sim = assemble(cfg(), log=lines.append)
    assert calls == {"plan": 1, "executor": 1, "workers": 1}
    assert sim.side.executor.name == sim.side.plan.executor  # the executor the plan chose
    assert sum(line.startswith("workers:") for line in lines) <= 1


def test_config_show_prints_the_plan_with_its_reasons(capsys):
    """`fedhet config show` ends with where the run would compute and why: a linear model on
    the CPU is stacked, an MLP sequential, each with the rule that chose it."""
    from fedhet.cli import main

    for model, executor in (("svm", "stacked"), ("mlp", "sequential")):
        assert main(["config", "show", "-a", "fedavg", "-d", "digits", "-m", model, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        section = next(v for k, v in shown.items() if k.startswith("plan"))
        assert section["device"]["value"] == "cpu"
        assert section["executor"]["value"] == executor
        assert section["executor"]["note"].startswith("auto:")
        assert section["backend"]["value"] == "local"


def test_a_run_writes_its_plan_once_into_its_directory(tmp_path):
    """`plan.json` beside `config.json`: the device, executor, workers and backend the run used,
    each with its reason (the plan is logged once per run, not re-derived per round)."""
    from fedhet.cli import main

    out = tmp_path / "r"
    assert main(["run", "-a", "fedavg", "-d", "digits", "-m", "logreg", "-n", "3", "-r", "1",
                 "--out", str(out), "-q"]) == 0
    written = json.loads((out / "plan.json").read_text())
    assert list(written) == ["device", "executor", "workers", "backend"]
    assert written["device"]["value"] == "cpu" and written["executor"]["value"] == "stacked"
    assert all(row["reason"] for row in written.values())
