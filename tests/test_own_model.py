"""Your own model: `model = "package.module:factory"` (`fedhet.models.imported`), or a factory a
plugin registers, runs with every executor; what cannot work is one line.

The factories live in a module written to a temporary folder put on `sys.path` (and on
`PYTHONPATH` for the CLI subprocess), as a user's own file would be.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from cli_errors import one_error_line

from fedhet.cli import main
from fedhet.engine.assembly import assemble
from fedhet.engine.config import build, config_of, parse
from fedhet.engine.simulation import Simulation
from fedhet.engine.workers import ProcessExecutor
from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS, build_model
from fedhet.registry import OpenParams, build_params, params_dict

SRC = Path(__file__).resolve().parents[1] / "src"
MODULE = "fedhet_test_own_models"

SOURCE = '''
"""Models of a user's own: what the tests import by `module:factory`."""
import math
from pathlib import Path

import torch
from torch import nn

CALLS = []


def mlp(input_shape, num_classes, hidden: int = 32, depth=1):
    """A small MLP of the user's own."""
    CALLS.append({"hidden": hidden, "depth": depth})
    with open(Path(__file__).with_name("calls.txt"), "a") as f:
        f.write(f"{hidden!r} {depth!r}\\n")
    layers, width = [nn.Flatten()], math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def open_ended(input_shape, num_classes, width, **kwargs):
    CALLS.append({"width": width, **kwargs})
    return nn.Linear(math.prod(input_shape), num_classes)


class Scaled(nn.Module):
    """Divides its input by its largest entry, read with `.item()`: fine alone, not under vmap."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc(x / (1.0 + x.abs().max().item()))


class Branching(Scaled):
    def forward(self, x):
        x = x.flatten(1)
        if x.mean() > 0:  # data-dependent Python control flow
            x = 0.5 * x
        return self.fc(x)


def raises(input_shape, num_classes):
    raise ValueError("hidden size must be even")


def not_a_module(input_shape, num_classes):
    return "a string"


def one_argument(input_shape):
    return nn.Linear(4, 2)


NUMBER = 3
'''


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """The folder holding the user's module, on `sys.path`; the module's `CALLS` list."""
    folder = tmp_path_factory.mktemp("own")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(MODULE, None)


def calls() -> list[dict]:
    return sys.modules[MODULE].CALLS


BASE = {
    "dataset": "digits", "partition": "iid", "clients": 4, "rounds": 3, "batch_size": 16,
    "lr": 0.1, "local_epochs": 1.0, "momentum": 0.5,
}


def simulate(**settings) -> tuple[Simulation, list[dict]]:
    rows: list[dict] = []
    sim = assemble(config_of({**BASE, **settings}), log=lambda _: None, callbacks=[rows.append])
    sim.run()
    return sim, rows


# -- module:factory -------------------------------------------------------------------------
def test_set_model_parameters_reach_the_factory_typed_by_its_signature(own):
    cfg = config_of({"model": f"{MODULE}:mlp", "model.hidden": "16", "model.depth": "2"})
    assert (cfg.model_params.hidden, cfg.model_params.depth) == (16, 2)
    module = build_model(cfg.model, (64,), 10, cfg.model_params)
    assert calls()[-1] == {"hidden": 16, "depth": 2}
    assert sum(p.numel() for p in module.parameters()) == 64 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10
    assert cfg.to_dict()["model_params"] == {"hidden": 16, "depth": 2}
    assert build(parse(cfg.to_dict(), "config.json")) == cfg  # what --resume reads back
    entry = MODELS.get(f"{MODULE}:mlp")
    assert (entry.doc, entry.source) == ("A small MLP of the user's own.", MODULE)


def test_a_factory_with_kwargs_takes_any_name_and_reads_numbers(own):
    cfg = config_of({"model": f"{MODULE}:open_ended", "model.width": "3", "model.depth": "2",
                     "model.act": "gelu", "model.rate": "0.5"})
    assert isinstance(cfg.model_params, OpenParams)
    build_model(cfg.model, (8,), 3, cfg.model_params)
    assert calls()[-1] == {"width": 3, "act": "gelu", "depth": 2, "rate": 0.5}
    saved = cfg.to_dict()["model_params"]
    assert saved == {"width": 3, "act": "gelu", "depth": 2, "rate": 0.5}
    assert build(parse(json.loads(json.dumps(cfg.to_dict())), "config.json")) == cfg


def test_open_params_keep_undeclared_names_beside_the_declared_ones():
    @dataclass(frozen=True)
    class Some(OpenParams):
        size: int = 4

    params = build_params(Some, {"size": "8", "flag": "true", "name": "x", "sizes": [1, 2]}, "model")
    assert params.size == 8
    assert params.kwargs() == {"size": 8, "flag": True, "name": "x", "sizes": (1, 2)}
    assert params_dict(params) == {"size": 8, "flag": True, "name": "x", "sizes": [1, 2]}
    assert build_params(Some, params_dict(params), "model") == params


@pytest.mark.parametrize(("spec", "settings", "message"), [
    ("no_such_module_xyz:mlp", {}, "model 'no_such_module_xyz:mlp': no module named "
     "'no_such_module_xyz'; run from the folder that holds it, put that folder on PYTHONPATH, "
     "or install its package"),
    (f"{MODULE}:mpl", {}, f"model '{MODULE}:mpl': {MODULE} ("),
    (f"{MODULE}:NUMBER", {}, f"model '{MODULE}:NUMBER': {MODULE}.NUMBER is not callable (an "
     "object of type int)"),
    (f"{MODULE}:", {}, f"model '{MODULE}:': write package.module:factory"),
    (f"{MODULE}:one_argument", {}, f"model '{MODULE}:one_argument': the factory takes "
     "(input_shape); a model factory is called factory(input_shape, num_classes, params), or "
     "with its settings as keywords"),
    (f"{MODULE}:mlp", {"model.hiden": 3}, "unknown parameter model.hiden (did you mean 'hidden'?)"),
    (f"{MODULE}:mlp", {"model.hidden": "wide"}, "model.hidden must be an integer, got 'wide'"),
    (f"{MODULE}:open_ended", {}, f"model '{MODULE}:open_ended' needs model.width (the factory's "
     "keyword without a default): give --set model.width=VALUE"),
])
def test_a_bad_spec_is_one_line_when_the_settings_are_read(own, spec, settings, message):
    with pytest.raises(FedhetError) as e:
        config_of({"model": spec, **settings})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    if spec.endswith(":mpl"):
        assert str(e.value).endswith("has no attribute 'mpl' (did you mean 'mlp'?)")


@pytest.mark.parametrize(("factory", "message"), [
    ("raises", "the factory raised ValueError: hidden size must be even (input_shape (64,), "
     "num_classes 10, no keyword arguments)"),
    ("not_a_module", "the factory returned an object of type str, not a torch.nn.Module"),
])
def test_a_factory_that_fails_is_one_line_when_the_run_is_built(own, capsys, factory, message):
    line = one_error_line(capsys, ["run", "-d", "digits", "-m", f"{MODULE}:{factory}", "-r", "1",
                                   "-q", "--out", str(own / f"run-{factory}")])
    assert line == f"error: model '{MODULE}:{factory}': {message}"
    assert not (own / f"run-{factory}" / "metrics.csv").exists()


# -- every executor --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sequential(own):
    return simulate(model=f"{MODULE}:mlp", executor="sequential")


def test_an_own_model_learns_with_the_sequential_executor(sequential):
    sim, rows = sequential  # rows: rounds 1-3 (ten digits: chance is 0.1)
    assert rows[0]["test_accuracy"] < rows[-1]["test_accuracy"] and rows[-1]["test_accuracy"] > 0.8


def test_two_worker_processes_give_the_sequential_run_bit_for_bit(sequential):
    seq, seq_rows = sequential
    two, rows = simulate(model=f"{MODULE}:mlp", executor="sequential", workers=2)
    assert isinstance(two.side.executor, ProcessExecutor)
    assert torch.equal(two.final_state.w, seq.final_state.w)
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in seq_rows]


def test_the_stacked_executor_follows_the_sequential_one(sequential):
    seq, seq_rows = sequential
    bat, rows = simulate(model=f"{MODULE}:mlp", executor="stacked")
    assert bat.side.executor.name == "stacked"
    w_seq, w_bat = seq.final_state.w, bat.final_state.w
    assert float((w_bat - w_seq).norm() / w_seq.norm()) < 1e-5
    for a, b in zip(seq_rows, rows, strict=True):
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-4)
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-4)


@pytest.mark.parametrize("model", ["Scaled", "Branching"])
def test_a_model_torch_func_cannot_run_is_refused_stacked_and_runs_sequentially(own, capsys, model):
    spec = f"{MODULE}:{model}"
    line = one_error_line(capsys, ["run", "-d", "digits", "-m", spec, "-r", "1", "-q",
                                   "--executor", "stacked", "--out", str(own / f"run-{model}")])
    assert line.startswith(f"error: the model ({model}) cannot run stacked: torch.func raised ")
    assert line.endswith("run it with executor=sequential (--executor sequential, or executor = "
                         '"sequential" in a settings file)')
    sim, rows = simulate(model=spec, executor="sequential", rounds=2)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]


def test_a_registered_factory_gets_its_params_object_with_every_executor(own):
    """A plugin's `MODELS.register(name, Params)`: `factory(input_shape, num_classes, params)`."""

    @dataclass(frozen=True)
    class TinyParams:
        hidden: int = 8

    def tiny(input_shape, num_classes, params: TinyParams) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(math.prod(input_shape), params.hidden),
                                   torch.nn.Tanh(), torch.nn.Linear(params.hidden, num_classes))

    with MODELS.added("test-own-tiny", tiny, TinyParams):
        settings = {"model": "test-own-tiny", "model.hidden": "12", "rounds": 2}
        seq, _ = simulate(executor="sequential", **settings)
        bat, _ = simulate(executor="stacked", **settings)
        assert seq.side.model.dim == 64 * 12 + 12 + 12 * 10 + 10
        assert torch.allclose(bat.final_state.w, seq.final_state.w, rtol=1e-5, atol=1e-6)


# -- the command line ---------------------------------------------------------------------------
def test_the_cli_runs_and_resumes_a_module_factory_with_set_parameters(own, tmp_path):
    """`-m module:factory --set model.hidden=16` in a subprocess with the module's folder on
    PYTHONPATH; `--resume` (in this process) builds the same model from `config.json`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(own), str(SRC)]), "OMP_NUM_THREADS": "1"}
    (own / "calls.txt").unlink(missing_ok=True)
    out = tmp_path / "run"

    def fedhet(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fedhet", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    done = fedhet("run", "-d", "digits", "-m", f"{MODULE}:mlp", "--set", "model.hidden=16",
                  "-r", "1", "-n", "3", "-q", "--out", str(out))
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == f"{MODULE}:mlp"
    assert config["model_params"] == {"hidden": 16, "depth": 1}
    assert main(["run", "--resume", str(out), "-r", "2", "-q"]) == 0  # here: the module on sys.path
    assert (own / "calls.txt").read_text().split("\n")[:2] == ["16 1", "16 1"]
    assert json.loads((out / "summary.json").read_text())["rounds_done"] == 2
