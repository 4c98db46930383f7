"""Per-client evaluation and the run's own metrics (`client_eval_fraction`, `metrics`).

Each client's held-out share against its partition; the statistics over clients and the
per-client segment sums against hand computations; a registered metric and scikit-learn scorers
against their definitions on the same predictions; exact resume; one line for every bad name."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

import fedhet
from fedhet.data.split import hold_out_per_client
from fedhet.engine.client_eval import (
    FineTune,
    HeldOut,
    client_accuracies,
    client_scores,
    model_outputs,
    personalised_scores,
)
from fedhet.engine.federation import federate
from fedhet.errors import FedhetError
from fedhet.metrics import METRICS, client_statistics, resolve
from fedhet.rundir.store import TIME_COLUMNS
from fedhet.training.flat import FlatModel
from fedhet.training.local import SGDConfig
from tests.cli_errors import one_error_line

SRC = Path(__file__).resolve().parents[1] / "src"
pytestmark = pytest.mark.usefixtures("own_registrations")
"""Each test's metrics, and the plugins a resume of its runs loads (this module, which
registered them), are gone after it: a later test in the same process would otherwise record
this module as a plugin of its own runs."""
BASE = {"algorithm": "fedavg", "dataset": "digits", "clients": 6, "rounds": 4, "lr": 0.1,
        "partition.alpha": 0.5}


def error_rate(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """A user's metric: the share of wrong predictions."""
    return float(np.mean(y_true != y_pred))


def top_probability(y_true: np.ndarray, scores: np.ndarray) -> float:
    """A user's metric of the scores: the mean probability given to the true class."""
    return float(np.mean(scores[np.arange(len(y_true)), y_true]))


# -- the held-out shares ------------------------------------------------------------------------
def test_each_client_holds_out_its_rounded_share_disjoint_from_what_it_trains_on():
    parts = [np.arange(0, 10), np.arange(10, 13), np.array([13]), np.arange(14, 34)[::-1]]
    train, held = hold_out_per_client(parts, 0.25, seed=3)
    # h_i = ⌊0.25·D_i + ½⌋ clipped to [1, D_i − 1]; a client of one sample holds out none
    assert [len(h) for h in held] == [3, 1, 0, 5]
    for part, t, h in zip(parts, train, held, strict=True):
        assert sorted([*t, *h]) == sorted(part) and not set(t) & set(h)
        assert list(t) == [i for i in part if i not in set(h)]  # training order kept
    again = hold_out_per_client(parts, 0.25, seed=3)[1]
    other = hold_out_per_client(parts, 0.25, seed=4)[1]
    assert all(np.array_equal(a, b) for a, b in zip(held, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(held, other, strict=True))


def test_off_the_clients_train_on_their_whole_partitions():
    cfg = fedhet.config_of(BASE)
    off, on = federate(cfg), federate(fedhet.config_of({**BASE, "client_eval_fraction": 0.2}))
    assert off.held_out == []
    for whole, t, h in zip(off.parts, on.parts, on.held_out, strict=True):
        assert np.array_equal(np.sort(np.concatenate([t, h])), np.sort(whole))


def test_the_central_baseline_trains_on_the_clients_training_shares_and_is_scored_on_theirs():
    settings = {**BASE, "client_eval_fraction": 0.2}
    federated = federate(fedhet.config_of(settings))
    central = federate(fedhet.config_of({**settings, "algorithm": "central"}), centralized=True)
    assert len(central.parts) == 1
    assert np.array_equal(central.parts[0], np.sort(np.concatenate(federated.parts)))
    assert all(np.array_equal(a, b) for a, b in zip(central.held_out, federated.held_out, strict=True))
    # each client fine-tunes on its own training share, not on the central union
    last = fedhet.run(settings={**settings, "algorithm": "central", "rounds": 1,
                                "client_eval_finetune_steps": 2}, log=lambda _: None).metrics[-1]
    assert 0 <= last["client_pacc_worst10"] <= last["client_pacc_mean"] <= 1


# -- statistics and segment sums ------------------------------------------------------------
def test_client_statistics_against_a_hand_computation():
    values = [0.5, 0.2, 0.9, math.nan, 0.7]
    got = client_statistics(values, "client_acc")
    finite = [0.5, 0.2, 0.9, 0.7]
    mean = sum(finite) / 4
    assert got["client_acc_mean"] == pytest.approx(mean)
    assert got["client_acc_std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in finite) / 4))
    # ⌈0.1·4⌉ = 1 client: the worst and the best one
    assert got["client_acc_worst10"] == 0.2 and got["client_acc_best10"] == 0.9
    eleven = [i / 10 for i in range(11)]  # ⌈1.1⌉ = 2 clients in each tail
    got = client_statistics(eleven, "x")
    assert got["x_worst10"] == pytest.approx(0.05) and got["x_best10"] == pytest.approx(0.95)
    assert all(math.isnan(v) for v in client_statistics([math.nan], "y").values())


def test_per_client_accuracy_is_each_clients_share_counted_by_hand():
    # a linear model that predicts argmax(x): the identity weights, no bias
    module = torch.nn.Linear(2, 2)
    with torch.no_grad():
        module.weight.copy_(torch.eye(2))
        module.bias.zero_()
    model = FlatModel(module)
    x = torch.tensor([[1.0, 0], [0, 1], [1, 0], [0, 1], [1, 0], [1, 0], [0, 1]])
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1])  # predictions 0 1 0 1 0 0 1
    shares = [np.array([0, 1]), np.array([], dtype=np.int64), np.array([2, 3, 4]), np.array([5, 6])]
    held = HeldOut.of(shares, torch.device("cpu"))
    assert held is not None and held.clients == (0, 2, 3)
    by_hand = {0: 1 / 2, 2: 2 / 3, 3: 1 / 2}
    got = client_accuracies(model, model.params, None, x, y, held)
    assert got == pytest.approx(by_hand)
    row = client_scores(model, model.params, None, x, y, held, [resolve("balanced_accuracy", 2)])
    assert row["client_acc_mean"] == pytest.approx(np.mean(list(by_hand.values())))
    assert row["client_acc_worst10"] == pytest.approx(1 / 2)
    assert row["client_acc_best10"] == pytest.approx(2 / 3)
    # balanced accuracy per client by hand: client 0 has one class (recall 1/2), client 2
    # recalls 1/1 and 1/2, client 3 has one class (recall 1/2)
    assert row["client_balanced_accuracy_mean"] == pytest.approx((0.5 + 0.75 + 0.5) / 3)


# -- personalised accuracy ----------------------------------------------------------------
def test_fine_tuning_with_a_zero_step_scores_the_global_model_itself():
    sim = fedhet.assemble(fedhet.config_of({**BASE, "rounds": 1, "client_eval_fraction": 0.3}),
                          log=lambda _: None)
    sim.run()
    side, held = sim.side, sim.parts.evaluator.held_out
    w = side.algorithm.eval_params(sim.final_state)
    tune = FineTune(side.trainer, side.client_indices, 5, 8, 0)
    frozen = personalised_scores(side.model, w, sim.buffers, side.data.x_train, side.data.y_train,
                                 held, tune, SGDConfig(0.0), 1)
    plain = client_scores(side.model, w, sim.buffers, side.data.x_train, side.data.y_train, held)
    assert frozen == pytest.approx({k.replace("acc", "pacc"): v for k, v in plain.items()})


def test_a_few_local_steps_personalise_clients_that_hold_two_classes_each():
    settings = {**{k: v for k, v in BASE.items() if k != "partition.alpha"}, "partition": "shards",
                "partition.xi": 2, "rounds": 3, "client_eval_fraction": 0.3,
                "client_eval_finetune_steps": 20}
    last = fedhet.run(settings=settings, log=lambda _: None).metrics[-1]
    # a client's own two classes are quickly learnt: personalised beats global on every statistic
    assert last["client_pacc_mean"] > last["client_acc_mean"] + 0.1
    assert last["client_pacc_worst10"] > last["client_acc_worst10"]


# -- metrics --------------------------------------------------------------------------------
def test_scikit_learn_scorers_score_as_sklearn_metrics_on_the_same_predictions():
    rng = np.random.default_rng(0)
    scores = rng.dirichlet(np.ones(4), size=200)
    y = rng.integers(0, 4, 200)
    pred = scores.argmax(1)
    assert resolve("f1_macro", 4)(y, pred, scores) == pytest.approx(f1_score(y, pred, average="macro"))
    assert resolve("balanced_accuracy", 4)(y, pred, scores) == pytest.approx(
        balanced_accuracy_score(y, pred))
    assert resolve("roc_auc_ovr", 4)(y, pred, scores) == pytest.approx(
        roc_auc_score(y, scores, multi_class="ovr"))
    # undefined on a share that lacks a class: NaN, not an error
    assert math.isnan(resolve("roc_auc_ovr", 4)(y[:3] * 0, pred[:3], scores[:3]))
    # a one-output model's decision values (the squared SVM)
    decision = rng.normal(size=50)
    y2 = (decision + rng.normal(size=50) > 0).astype(int)
    assert resolve("roc_auc", 2)(y2, (decision > 0).astype(int), decision) == pytest.approx(
        roc_auc_score(y2, decision))


def test_a_run_records_its_metrics_on_the_test_set_and_per_client():
    rows: list[dict] = []
    with METRICS.added("error-rate", error_rate), \
            METRICS.added("true-class-probability", top_probability, scores=True):
        cfg = fedhet.config_of({**BASE, "rounds": 2, "client_eval_fraction": 0.25,
                                "metrics": ["error-rate", "true-class-probability", "f1_macro"]})
        sim = fedhet.assemble(cfg, log=lambda _: None, callbacks=[rows.append])
        sim.run()
    row = rows[-1]
    # the global model's own predictions, computed here
    side = sim.side
    w = side.algorithm.eval_params(sim.final_state)
    out = model_outputs(side.model, w, sim.buffers, side.data.x_test)
    y, pred = side.data.y_test.numpy(), out.argmax(1).numpy()
    probs = torch.softmax(out.double(), 1).numpy()
    assert row["test_error-rate"] == pytest.approx(1 - row["test_accuracy"])
    assert row["test_error-rate"] == pytest.approx(np.mean(y != pred))
    assert row["test_true-class-probability"] == pytest.approx(np.mean(probs[np.arange(len(y)), y]))
    assert row["test_f1_macro"] == pytest.approx(f1_score(y, pred, average="macro"))
    # per client, a loop of small evaluations by hand
    accs, f1s = [], []
    for share in side.held_out:
        rows = torch.from_numpy(share)
        o = model_outputs(side.model, w, sim.buffers, side.data.x_train, rows)
        yi, pi = side.data.y_train[rows].numpy(), o.argmax(1).numpy()
        accs.append(np.mean(yi == pi))
        f1s.append(f1_score(yi, pi, average="macro"))
    for name, values in (("acc", accs), ("f1_macro", f1s), ("error-rate", [1 - a for a in accs])):
        for key, value in client_statistics(values, f"client_{name}").items():
            assert row[key] == pytest.approx(value), key


def metrics_without_time(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in csv.DictReader(f)]


def test_a_resumed_run_writes_the_metrics_an_uninterrupted_one_does(tmp_path):
    settings = {**BASE, "client_eval_fraction": 0.3, "client_eval_every": 2,
                "client_eval_finetune_steps": 3, "metrics": ["error-rate", "balanced_accuracy"]}
    with METRICS.added("error-rate", error_rate):
        whole = fedhet.run(settings=settings, out=tmp_path / "whole", log=lambda _: None)
        stopped = fedhet.run(settings=settings, out=tmp_path / "cut", log=lambda _: None,
                             callbacks=[lambda row: row["round"] >= 1])
        assert stopped.summary["status"] == "stopped" and stopped.summary["rounds_done"] == 1
        resumed = fedhet.resume(tmp_path / "cut", log=lambda _: None)
    assert resumed.summary["finished"]
    got, want = (metrics_without_time(tmp_path / d / "metrics.csv") for d in ("cut", "whole"))
    assert got == want
    columns = list(want[0])
    assert {"test_error-rate", "test_balanced_accuracy", "client_acc_mean", "client_acc_worst10",
            "client_error-rate_best10", "client_balanced_accuracy_std", "client_pacc_worst10"
            } <= set(columns)
    # every 2 rounds and the last: rounds 0, 2, 4 carry per-client columns, 1 and 3 are empty
    assert [r["client_acc_mean"] != "" for r in want] == [True, False, True, False, True]
    assert whole.summary["final_client_acc_mean"] == pytest.approx(float(want[-1]["client_acc_mean"]))


# -- bad input: one line --------------------------------------------------------------------
@pytest.mark.parametrize(("settings", "words"), [
    ({"metrics": ["f1macro"]}, "unknown metric 'f1macro' (did you mean 'f1_macro'"),
    ({"metrics": ["accuracy"]}, "would overwrite a column fedhet always records"),
    ({"metrics": ["f1_macro", "f1_macro"]}, "'f1_macro' is given twice"),
    ({"client_eval_fraction": 1.0}, "client_eval_fraction must be in [0, 1)"),
    ({"client_eval_every": 0}, "client_eval_every must be ≥ 1"),
    ({"client_eval_finetune_steps": 5}, "set client_eval_fraction too"),
])
def test_bad_settings_are_one_line(settings, words):
    with pytest.raises(FedhetError) as e:
        fedhet.config_of({**BASE, **settings})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_metric_on_the_command_line_is_one_line(capsys, tmp_path):
    line = one_error_line(capsys, ["run", "-d", "digits", "-r", "1", "--set", "metrics=f1_macro, nope",
                                   "--out", str(tmp_path / "r"), "-q"])
    assert "unknown metric 'nope'" in line and "register_metric" in line
    assert not (tmp_path / "r").exists()


PLUGIN = '''
import numpy as np
import fedhet

@fedhet.register_metric("error-rate", doc="share of wrong predictions")
def error_rate(y_true, y_pred):
    return float(np.mean(y_true != y_pred))
'''


def fedhet_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command line in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "FEDHET_PLUGINS"}
    env.update(PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "fedhet", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_a_plugin_metric_resumes_and_its_loss_is_one_line(tmp_path):
    plugin = tmp_path / "my_metrics.py"
    plugin.write_text(PLUGIN)
    out = tmp_path / "run"
    made = fedhet_cli("run", "--plugin", str(plugin), "-d", "digits", "-n", "4", "-r", "1",
                      "--set", "metrics=error-rate", "--set", "client_eval_fraction=0.2",
                      "--out", str(out), "-q", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    listed = fedhet_cli("--plugin", str(plugin), "list", cwd=tmp_path)
    assert f"error-rate       share of wrong predictions [plugin {plugin}]" in listed.stdout
    resumed = fedhet_cli("run", "--resume", str(out), "-r", "2", "-q", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    rows = metrics_without_time(out / "metrics.csv")
    assert [r["round"] for r in rows] == ["0", "1", "2"]
    assert all(float(r["test_error-rate"]) == pytest.approx(1 - float(r["test_accuracy"]))
               for r in rows)
    plugin.unlink()
    lost = fedhet_cli("run", "--resume", str(out), "-r", "3", "-q", cwd=tmp_path)
    err = lost.stderr.strip().splitlines()
    assert lost.returncode == 2 and len(err) == 1, lost.stderr
    assert f"plugin {plugin}" in err[0] and "can no longer be imported" in err[0]


SCRIPT = '''
import sys
import numpy as np
import fedhet

@fedhet.register_metric("error-rate")
def error_rate(y_true, y_pred):
    return float(np.mean(y_true != y_pred))

fedhet.run(algorithm="fedavg", dataset="digits", clients=4, rounds=1, out=sys.argv[1],
           settings={"metrics": ["error-rate"], "client_eval_fraction": 0.2}, log=lambda _: None)
'''


def test_a_metric_only_a_script_registered_is_named_by_resume_and_report_still_draws(tmp_path):
    script, out = tmp_path / "experiment.py", tmp_path / "run"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    made = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    resumed = fedhet_cli("run", "--resume", str(out), "-r", "2", cwd=tmp_path)
    err = resumed.stderr.strip().splitlines()
    assert resumed.returncode == 2 and len(err) == 1, resumed.stderr
    assert "its metric 'error-rate' was registered by the script" in err[0]
    assert "--plugin" in err[0] and "fedhet.register_metric" in err[0]
    report = fedhet_cli("report", str(out), cwd=tmp_path)
    assert report.returncode == 0 and "warning" not in report.stderr, report.stderr
    page = (out / "report.html").read_text()
    assert "Per-client accuracy and metrics" in page and "fig_partition" in page


def test_per_client_and_metric_columns_are_drawn_apart_from_the_diagnostics():
    from fedhet.reports.diagnostics import diagnostic_families

    families = diagnostic_families(["round", "test_accuracy", "test_accuracy_plain", "test_f1_macro",
                                    "client_acc_mean", "client_f1_macro_worst10", "tau_0", "tau_1"])
    assert families == {"test_accuracy (extra models)": ["test_accuracy", "test_accuracy_plain"],
                        "tau_*": ["tau_0", "tau_1"]}


def test_a_registered_metric_that_raises_is_one_line_naming_it(capsys, tmp_path):
    def broken(y_true, y_pred):
        raise ValueError("my metric broke")

    with METRICS.added("broken", broken):
        line = one_error_line(capsys, ["run", "-d", "digits", "-n", "4", "-r", "1", "-q",
                                       "--set", "metrics=broken", "--out", str(tmp_path / "r")])
    assert "metric 'broken' failed: ValueError: my metric broke" in line
    assert f"{Path(__file__).name}, line" in line
