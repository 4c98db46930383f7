"""The public Python API (`fedhet.run`, `resume`, `open_run`, `compare`, Python objects as
components) against the command line and against itself."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification

import fedhet
from fedhet.cli import main
from fedhet.rundir.store import TIME_COLUMNS

FAST = {"clients": 4, "rounds": 3, "seed": 1}


@pytest.fixture(autouse=True)
def _forget_handed_in_components(own_registrations):
    """What a test hands in is registered for its process: gone after the test."""


def _metrics(path) -> list[dict[str, float]]:
    rows = fedhet.open_run(path).metrics
    return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in rows]


def _settings_only(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("provenance", "plugins")}


def test_the_public_surface_is_importable_and_small():
    names = set(fedhet.__all__)
    for name in ("run", "resume", "open_run", "compare", "assemble", "from_arrays", "Algorithm",
                 "Message", "ServerState", "ClientState", "ClientContext", "register_algorithm",
                 "register_model", "register_dataset", "register_partition", "testing"):
        assert name in names
        assert getattr(fedhet, name) is not None
    assert len(names) < 50


def test_python_and_cli_with_the_same_settings_make_the_same_run(tmp_path):
    settings = {"partition.alpha": 0.3, "lr": 0.05, "local_epochs": 1}
    r = fedhet.run(algorithm="fednova", dataset="digits", partition="dirichlet", **FAST,
                   settings=settings, out=tmp_path / "py", log=lambda _: None)
    argv = ["run", "-a", "fednova", "-d", "digits", "-p", "dirichlet", "-n", "4", "-r", "3",
            "--seed", "1", "--out", str(tmp_path / "cli"), "--quiet"]
    argv += [x for k, v in settings.items() for x in ("--set", f"{k}={v}")]
    assert main(argv) == 0
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert _settings_only(r.config) == _settings_only(cli)
    assert _metrics(r.dir) == _metrics(tmp_path / "cli")
    assert r.summary["final_accuracy"] == r.metrics[-1]["test_accuracy"]
    assert [row["round"] for row in r.metrics] == [0, 1, 2, 3]


def test_precision_is_a_keyword_and_a_flag(tmp_path):
    """`fedhet.run(precision="bf16")` and `fedhet run --precision bf16` make the same bf16 run."""
    r = fedhet.run(algorithm="fedavg", dataset="digits", **FAST, precision="bf16",
                   out=tmp_path / "py", log=lambda _: None)
    argv = ["run", "-a", "fedavg", "-d", "digits", "-n", "4", "-r", "3", "--seed", "1",
            "--precision", "bf16", "--out", str(tmp_path / "cli"), "--quiet"]
    assert main(argv) == 0
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert r.config["precision"] == cli["precision"] == "bf16"
    assert _metrics(r.dir) == _metrics(tmp_path / "cli")
    fp32 = fedhet.run(algorithm="fedavg", dataset="digits", **FAST, out=tmp_path / "fp32",
                      log=lambda _: None)
    assert _metrics(fp32.dir) != _metrics(r.dir)  # bf16 passes round differently


def test_own_arrays_train_and_the_result_reads_into_pandas(tmp_path):
    x, y = make_classification(n_samples=1200, n_features=12, n_informative=8, n_classes=3,
                               random_state=0)
    data = fedhet.from_arrays(x[:1000], y[:1000], x[1000:], y[1000:], name="api-blobs")
    r = fedhet.run(algorithm="fedavg", dataset=data, clients=5, rounds=5, model="logreg",
                   settings={"lr": 0.1}, out=tmp_path / "run", log=lambda _: None)
    assert r.config["dataset"] == "api-blobs"
    assert r.metrics[-1]["test_accuracy"] > 0.6  # three classes: chance is 1/3
    frame = r.to_pandas()
    assert list(frame["round"]) == [0, 1, 2, 3, 4, 5]


def test_a_handed_in_algorithm_class_equals_the_registered_one(tmp_path):
    from fedhet.algorithms.fedavg import FedAvg

    def local_class():  # defined in a function: not importable by name, registered live
        class MyFedAvg(FedAvg):
            name = "my-fedavg-api"

        return MyFedAvg

    mine = fedhet.run(algorithm=local_class(), **FAST, out=tmp_path / "mine", log=lambda _: None)
    ref = fedhet.run(algorithm="fedavg", **FAST, out=tmp_path / "ref", log=lambda _: None)
    assert mine.config["algorithm"] == "my-fedavg-api"
    assert _metrics(mine.dir) == _metrics(ref.dir)


def test_a_handed_in_model_factory_is_used(tmp_path):
    built = []

    def tiny(input_shape, num_classes, params):
        built.append(input_shape)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)),
                                                                       num_classes))

    r = fedhet.run(algorithm="fedavg", model=tiny, **FAST, out=tmp_path / "m", log=lambda _: None)
    assert built and built[0] == (64,)
    assert r.config["model"] == "tiny"
    assert r.metrics[-1]["test_accuracy"] > r.metrics[0]["test_accuracy"]


def test_resume_continues_exactly_and_open_run_reads_it(tmp_path):
    fedhet.run(algorithm="scaffold", **{**FAST, "rounds": 2}, out=tmp_path / "a", log=lambda _: None)
    resumed = fedhet.resume(tmp_path / "a", rounds=4, log=lambda _: None)
    whole = fedhet.run(algorithm="scaffold", **{**FAST, "rounds": 4}, out=tmp_path / "b",
                       log=lambda _: None)
    assert _metrics(resumed.dir) == _metrics(whole.dir)
    assert fedhet.open_run(tmp_path / "a").summary["finished"] is True


def test_a_callback_sees_every_round_and_may_stop_the_run(tmp_path):
    seen = []

    def stop_at_two(row):
        seen.append(row["round"])
        return row["round"] >= 2

    r = fedhet.run(algorithm="fedavg", **{**FAST, "rounds": 5}, out=tmp_path / "s",
                   callbacks=[stop_at_two], log=lambda _: None)
    assert seen == [1, 2]
    assert r.summary["finished"] is False and r.metrics[-1]["round"] == 2


def test_compare_from_python_returns_one_row_per_run(tmp_path):
    rows = fedhet.compare(base={"dataset": "digits", **FAST},
                          sweeps={"algorithm": ["fedavg", "fedprox"], "seed": [0, 1]},
                          out=tmp_path / "g", jobs=1)
    assert len(rows) == 4
    assert {r["algorithm"] for r in rows} == {"fedavg", "fedprox"}
    assert all(0 <= float(r["final_accuracy"]) <= 1 for r in rows)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": 3}, "algorithm must be a name or a subclass of fedhet.Algorithm"),
        ({"dataset": [1, 2]}, "dataset must be a name, a path or a Dataset"),
        ({"model": 5}, "model must be a name"),
        ({"algorithm": "fedavg", "settings": {"learning_rate": 0.1}}, "did you mean 'lr'"),
    ],
)
def test_bad_python_arguments_are_one_clear_error_and_write_nothing(tmp_path, kwargs, message):
    with pytest.raises(fedhet.FedhetError, match=message):
        fedhet.run(**kwargs, out=tmp_path / "x", log=lambda _: None)
    assert not (tmp_path / "x").exists()


def test_a_dataset_name_fedhet_uses_is_refused(tmp_path):
    x = np.random.default_rng(0).normal(size=(40, 3))
    data = fedhet.from_arrays(x, np.arange(40) % 2, name="digits")
    with pytest.raises(fedhet.FedhetError, match="'digits' is taken by fedhet"):
        fedhet.run(dataset=data, out=tmp_path / "x", log=lambda _: None)


def test_the_same_in_memory_name_handed_in_again_is_replaced(tmp_path):
    rng = np.random.default_rng(0)
    first = fedhet.from_arrays(rng.normal(size=(80, 4)), np.arange(80) % 2, name="api-again")
    second = replace(first, x_train=first.x_train * 0)
    a = fedhet.run(dataset=first, rounds=1, clients=2, out=tmp_path / "a", log=lambda _: None)
    b = fedhet.run(dataset=second, rounds=1, clients=2, out=tmp_path / "b", log=lambda _: None)
    assert not math.isclose(a.metrics[-1]["test_loss"], b.metrics[-1]["test_loss"])


def test_a_run_of_in_memory_data_says_how_to_resume_it_in_another_process(tmp_path):
    rng = np.random.default_rng(0)
    data = fedhet.from_arrays(rng.normal(size=(120, 4)), np.arange(120) % 2, name="api-mem")
    r = fedhet.run(dataset=data, rounds=1, clients=2, out=tmp_path / "r", log=lambda _: None)
    assert r.config["provenance"]["in_process"] == {"dataset": "api-mem"}
    other = subprocess.run([sys.executable, "-m", "fedhet", "run", "--resume", str(r.dir), "-r", "2"],
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    (line,) = other.stderr.strip().splitlines()
    assert "'api-mem' was handed in from Python" in line and "fedhet.resume(" in line
    again = fedhet.resume(r.dir, rounds=2, dataset=data, log=lambda _: None)  # the same object
    assert again.metrics[-1]["round"] == 2


API_SCRIPT = """
import sys
import fedhet
loud = {"log": print} if sys.argv[1] == "asked" else {}
fedhet.run("fedavg", "digits", clients=5, rounds=1, workers="auto", out="r", **loud)
fedhet.resume("r", rounds=2, **loud)
fedhet.compare({"dataset": "digits", "clients": 3, "rounds": 1}, {"algorithm": ["fedavg"]},
               out="g")
"""


@pytest.mark.parametrize("asked", [False, True], ids=["default", "log=print"])
def test_api_runs_print_nothing_on_stdout_unless_asked(tmp_path, asked):
    """run, resume and compare from a script: their remarks (`workers: auto → N`, the resume's
    changes) go to stderr, stdout stays the script's own; `log=print` puts them there."""
    import os
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run([sys.executable, "-c", API_SCRIPT, "asked" if asked else "quiet"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1",
                               "FEDHET_CORES": "4"})  # several cores: `workers: auto` weighs them
    assert done.returncode == 0, done.stderr
    if asked:
        assert "workers: auto → " in done.stdout and "resuming with rounds 1 → 2" in done.stdout
    else:
        assert done.stdout == ""
        assert "workers: auto → " in done.stderr and "resuming with rounds 1 → 2" in done.stderr
