"""One settings shape: every source of settings goes through `parse` and `build`, a path means
the same thing everywhere, and the result is typed and frozen."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from fedhet.cli import main
from fedhet.engine.config import RunConfig, build, config_of, parse
from fedhet.engine.simulation import Simulation
from fedhet.errors import FedhetError
from fedhet.runs.grid import load_grid

BASE = ["dataset=digits", "partition=iid", "clients=3", "rounds=1", "model=logreg",
        "local_steps=1"]


def test_every_spelling_of_a_setting_is_one_path():
    """`--set`, dotted and nested TOML, the older `_params` tables and `.name` give one config."""
    pairs = parse([*BASE, "algorithm=fedprox", "algorithm.mu=0.25", "lr=0.2"], "--set")
    dotted = parse(tomllib.loads(
        'dataset="digits"\npartition="iid"\nclients=3\nrounds=1\nmodel="logreg"\nlocal_steps=1\n'
        'lr=0.2\nalgorithm="fedprox"\n"algorithm.mu"=0.25\n'), "a.toml")
    nested = parse(tomllib.loads(
        'dataset="digits"\npartition="iid"\nclients=3\nrounds=1\nmodel="logreg"\nlocal_steps=1\n'
        'lr=0.2\n[algorithm]\nname="fedprox"\nmu=0.25\n'), "b.toml")
    older = parse(tomllib.loads(
        'dataset="digits"\npartition="iid"\nclients=3\nrounds=1\nmodel="logreg"\nlocal_steps=1\n'
        'lr=0.2\nalgorithm="fedprox"\n[algorithm_params]\nmu=0.25\n'), "c.toml")
    cfg = build(pairs)
    assert build(dotted) == build(nested) == build(older) == cfg
    assert cfg.algorithm == "fedprox" and cfg.algorithm_params.mu == 0.25 and cfg.lr == 0.2
    assert isinstance(cfg.lr, float) and isinstance(cfg.clients, int)  # typed at parse


def test_config_is_frozen_and_round_trips_through_its_serialised_forms():
    cfg = build(parse([*BASE, "algorithm=fedavgm", "algorithm.server_momentum=0.5",
                       "client_steps=[1,2,3]"], "--set"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.algorithm_params.server_momentum = 0.1
    assert cfg.client_steps == (1, 2, 3)
    assert build(cfg.flat()) == cfg
    saved = json.loads(json.dumps(cfg.to_dict()))  # what config.json holds
    assert config_of(saved, "config.json") == cfg
    assert saved["algorithm_params"]["server_momentum"] == 0.5
    assert cfg.flat()["algorithm.server_momentum"] == 0.5


def test_later_layers_win_and_bad_paths_are_one_line():
    cfg = build(parse(BASE, "--config"), parse(["lr=0.3"], "--set"), parse({"lr": 0.4}, "flags"))
    assert cfg.lr == 0.4
    with pytest.raises(FedhetError, match=r"^--set: unknown setting 'learning_rate' "
                                          r"\(did you mean 'lr'\?\); valid settings"):
        parse(["learning_rate=0.1"], "--set")
    with pytest.raises(FedhetError, match=r"^a.toml: lr must be a number"):
        parse({"lr": "fast"}, "a.toml")
    with pytest.raises(FedhetError, match=r"unknown parameter algorithm.gamma_prime"):
        build(parse(["algorithm=fedavgm", "algorithm.gamma_prime=1"], "--set"))


def test_one_setting_walks_from_the_command_line_to_the_algorithm(tmp_path: Path, monkeypatch):
    """`--set algorithm.mu=0.125` arrives as the float the FedProx step reads, through the CLI,
    the run's config.json and the algorithm object; a grid axis over the same path does too."""
    seen: list[float] = []
    original = Simulation.__init__

    def spy(self, cfg, *a, **kw):
        original(self, cfg, *a, **kw)
        seen.append(self.side.algorithm.params.mu)

    monkeypatch.setattr(Simulation, "__init__", spy)
    out = tmp_path / "run"
    sets = [x for pair in BASE for x in ("--set", pair)]
    assert main(["run", "-a", "fedprox", *sets, "--set", "algorithm.mu=0.125", "-q",
                 "--out", str(out)]) == 0
    assert seen == [0.125]
    assert json.loads((out / "config.json").read_text())["algorithm_params"]["mu"] == 0.125
    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[base]\nalgorithm = "fedprox"\ndataset = "digits"\npartition = "iid"\nclients = 3\n'
        'rounds = 1\nmodel = "logreg"\nlocal_steps = 1\n[axes]\n"algorithm.mu" = [0.5, 0.75]\n'
    )
    specs = load_grid(grid).specs
    assert [config_of(s.settings).algorithm_params.mu for s in specs] == [0.5, 0.75]


def test_runconfig_made_directly_has_no_components_until_built():
    cfg = RunConfig(lr=0.1)
    assert cfg.algorithm_params is None
    assert build(cfg.flat()).algorithm_params is not None


def test_every_engine_setting_has_a_one_line_meaning():
    """`fedhet list` and `fedhet config show` print one line per setting (`FIELD_DOCS`)."""
    from fedhet.engine.config import ENGINE_FIELDS, FIELD_DOCS

    assert set(FIELD_DOCS) == set(ENGINE_FIELDS)
    assert all(doc and "\n" not in doc and len(doc) <= 80 for doc in FIELD_DOCS.values())
