"""FedVeca (fedveca.txt Algorithms 1–2, docs/spec.md "FedVeca"): eq. 15, the estimators, the update
rule, an end-to-end run, the fair-comparison protocol of §IV-A1, the preset and the plots."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.algorithms.base import ALGORITHMS, ClientContext, Message, Reply, RunInfo
from fedhet.algorithms.fedveca import (
    FedVeca,
    FedVecaParams,
    initial_tau,
    predict_tau,
    smoothness,
)
from fedhet.cli import main
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.papers.fedveca import protocol
from fedhet.papers.fedveca.protocol import FairBudget
from fedhet.runs.single import execute
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig

torch.set_num_threads(1)

DIGITS = {
    "dataset": "digits", "model": "logreg", "partition": "dirichlet", "clients": 5,
    "lr": 0.05, "batch_size": 32,
}


# -- eq. 15 ------------------------------------------------------------------------------------
def test_eq15_matches_hand_computation():
    # min A = 1: ⌊1/0.05⌋ = 20, ⌊1.02/0.07⌋ = ⌊14.57⌋ = 14, ⌊1.1/0.15⌋ = ⌊7.33⌋ = 7,
    # ⌊3/2.05⌋ = 1 → reset to 2.
    assert predict_tau([1.0, 1.02, 1.1, 3.0], 0.95, 50, [5, 5, 5, 5]) == [20, 14, 7, 2]
    # scale-free in A: the same with every A multiplied by η = 0.01
    assert predict_tau([0.01, 0.0102, 0.011, 0.03], 0.95, 50, [5] * 4) == [20, 14, 7, 2]


def test_eq15_cap_and_reset():
    # α = 0.99: ⌊1/0.01⌋ = 100 → 50, ⌊1.001/0.011⌋ = 91 → 50, ⌊5/4.01⌋ = 1 → 2
    assert predict_tau([1.0, 1.001, 5.0], 0.99, 50, [3, 3, 3]) == [50, 50, 2]
    # α = 0.5: ⌊2/1⌋ = 2, ⌊3/2⌋ = 1 → 2; a smaller cap binds
    assert predict_tau([2.0, 3.0], 0.5, 50, [9, 9]) == [2, 2]
    assert predict_tau([1.0, 1.02], 0.95, 10, [3, 3]) == [10, 10]


def test_eq15_guards():
    A = [math.nan, 0.0, -1.0, 1.0, math.inf, 1.1]
    prev = [7, 8, 9, 10, 11, 12]
    # non-finite keeps the previous τ; A ≤ 0 gives τ_max; min runs over the usable A (1.0)
    assert predict_tau(A, 0.95, 50, prev) == [7, 50, 50, 20, 11, 7]
    # a denominator ≤ 0 (only reachable with α ≥ 1, which validation refuses) gives τ_max
    assert predict_tau([1.0, 2.0], 1.0, 50, [4, 4]) == [50, 2]
    # nothing usable at all: everything keeps its τ or goes to τ_max
    assert predict_tau([math.nan, 0.0], 0.95, 40, [6, 6]) == [6, 40]


def test_initial_tau_is_clipped_to_two_and_tau_max():
    assert [initial_tau(t, 50) for t in (0, 1, 2, 37, 50, 375)] == [2, 2, 2, 37, 50, 50]


def test_smoothness_estimate():
    g0, w0 = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 2.0])
    assert smoothness(g0, w0, None, None) == pytest.approx(5.0 / 2.0)  # ‖∇F(w_0)‖/‖w_0‖
    g1, w1 = torch.tensor([0.0, 0.0]), torch.tensor([1.0, 2.0])
    assert smoothness(g1, w1, g0, w0) == pytest.approx(5.0 / 1.0)
    assert math.isnan(smoothness(g1, w0, g0, w0))


# -- the client's estimators on a quadratic -----------------------------------------------------
class Quadratic(nn.Module):
    """Every sample has loss `½ Σ_j h_j (w_j − c_j)²`, so each mini-batch gradient is exact."""

    def __init__(self, h: torch.Tensor, c: torch.Tensor, w0: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w0.clone())
        self.register_buffer("h", h, persistent=False)
        self.register_buffer("c", c, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(len(x), -1)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.h * (out - self.c) ** 2).sum(1).mean()


def quadratic_client(h, c, w0, eta, clients=1):
    module = Quadratic(h, c, w0)
    trainer = LocalTrainer(FlatModel(module), torch.zeros(12, 1), torch.zeros(12, dtype=torch.long))
    info = RunInfo(clients, 5, eta, 0.0, 0.0, 0, len(w0), ())
    algo = FedVeca(FedVecaParams(), info)

    def ctx(round: int = 1, client_id: int = 0) -> ClientContext:
        return ClientContext(client_id, round, torch.arange(12), trainer, 99, 4, SGDConfig(eta), 0)

    return algo, ctx


@pytest.mark.parametrize("h", [[2.0, 2.0, 2.0], [0.5, 2.0, 6.0]])
def test_beta_delta_on_quadratic_match_closed_form(h):
    h = torch.tensor(h)
    c, w0 = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.0, 0.0, 0.0])
    eta, tau = 0.05, 7
    grad_prev = torch.tensor([0.3, -0.4, 1.2])
    algo, ctx = quadratic_client(h, c, w0, eta)
    msg = Message({"w": w0, "grad_prev": grad_prev}, {"tau": float(tau)})
    reply, _ = algo.client_update(msg, ctx(), None)

    # closed form: w^λ − c = (1 − η h)^λ (w0 − c), g^λ = h (w^λ − c), ∇F_i(w_k) = g^0
    hn, cn, wn = h.double().numpy(), c.double().numpy(), w0.double().numpy()
    lam = np.arange(tau)[:, None]
    dev = (1 - eta * hn) ** lam * (wn - cn)
    g = hn * dev
    betas = [np.linalg.norm(g[0] - g[j]) / np.linalg.norm(dev[0] - dev[j]) for j in range(1, tau)]
    sums = np.cumsum(g, axis=0)
    gp2 = float(grad_prev.double().norm()) ** 2
    deltas = [np.linalg.norm(sums[j]) ** 2 / ((j + 1) * gp2) for j in range(1, tau)]

    s = reply.scalars
    assert s["steps"] == tau
    assert s["beta"] == pytest.approx(max(betas), rel=1e-4)
    assert s["delta"] == pytest.approx(max(deltas), rel=1e-4)
    if torch.all(h == h[0]):
        assert s["beta"] == pytest.approx(float(h[0]), rel=1e-4)  # β = h for isotropic H
    np.testing.assert_allclose(reply.tensors["grad"].numpy(), g[0], rtol=1e-5)
    np.testing.assert_allclose(reply.tensors["G"].numpy(), g.mean(0), rtol=1e-5)


def test_weight_decay_is_part_of_the_local_gradient_and_of_beta():
    """Local steps descend `½ h‖w − c‖² + (λ/2)‖w‖²`, so `∇F_i(w_k)` must include `λ w_k` and,
    for an isotropic `h`, `β` is the curvature of that objective, `h + λ` (without `λ w_k` in
    `∇F_i`, β would compare gradients of two different objectives)."""
    h, c, w0 = torch.full((3,), 2.0), torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.4, 1.0, -3.0])
    eta, lam, tau = 0.05, 0.5, 6
    algo, _ = quadratic_client(h, c, w0, eta)
    trainer = LocalTrainer(FlatModel(Quadratic(h, c, w0)), torch.zeros(12, 1),
                           torch.zeros(12, dtype=torch.long))
    ctx = ClientContext(0, 1, torch.arange(12), trainer, 99, 4, SGDConfig(eta, 0.0, lam), 0)
    msg = Message({"w": w0, "grad_prev": torch.ones(3)}, {"tau": float(tau)})
    reply, _ = algo.client_update(msg, ctx, None)
    torch.testing.assert_close(reply.tensors["grad"], h * (w0 - c) + lam * w0)
    assert reply.scalars["beta"] == pytest.approx(2.5, rel=1e-4)


def test_server_step_and_A_use_the_rounds_learning_rate():
    """Under a schedule the clients step with `η_k`; the server's `w − η_k τ_k d_k` and
    `A = η_k β² δ` must use the same `η_k`, not the run's initial `η`."""
    info = RunInfo(2, 5, 0.1, 0.0, 0.0, 0, 2, ())
    algo = FedVeca(FedVecaParams(), info)
    state = dataclasses.replace(
        algo.init(torch.zeros(2)), grad_last=torch.tensor([1.0, 0.0]), w_last=torch.tensor([1.0, 1.0])
    )

    def reply(i: int, g: list[float], tau: int, beta: float) -> Reply:
        scalars = {"num_samples": 1.0, "steps": float(tau), "train_loss": 0.0, "lr": 0.02,
                   "beta": beta, "delta": 1.0}
        return Reply(i, Message({"G": torch.tensor(g), "grad": torch.zeros(2)}, scalars))

    new, diag = algo.aggregate(state, 2, [reply(0, [1.0, 0.0], 2, 1.0), reply(1, [0.0, 2.0], 4, 2.0)])
    # τ_k = 3, d_k = (0.5, 1.0): w = −0.02 · 3 · d_k
    torch.testing.assert_close(new.w, torch.tensor([-0.03, -0.06]))
    assert diag["A_0"] == pytest.approx(0.02 * 1.0) and diag["A_1"] == pytest.approx(0.02 * 4.0)


def test_round_zero_sends_no_estimates_and_uses_initial_tau():
    h, c, w0 = torch.ones(2), torch.ones(2), torch.zeros(2)
    algo, ctx = quadratic_client(h, c, w0, 0.1)
    state = algo.init(w0)
    msg = algo.configure(state, 0, 0)
    assert "tau" not in msg.scalars and "grad_prev" not in msg.tensors
    c0 = dataclasses.replace(ctx(round=0), tau=1)
    reply, _ = algo.client_update(msg, c0, None)
    assert reply.scalars["steps"] == 2 and "beta" not in reply.scalars


# -- the update rule: identical clients, FedNova's rule ----------------------------------------
def _digits_trainer(n: int = 96):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data[:n] / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target[:n], dtype=torch.long)
    torch.manual_seed(0)
    model = FlatModel(nn.Linear(64, 10))
    return LocalTrainer(model, x, y), model.params.clone()


def test_identical_clients_give_fednova_update_and_equal_tau():
    eta, rounds, clients = 0.05, 4, 3
    trainer, w = _digits_trainer()
    info = RunInfo(clients, rounds, eta, 0.0, 0.0, 0, len(w), ())
    algo = FedVeca(FedVecaParams(alpha=0.95), info)
    idx = torch.arange(len(trainer.y))

    def ctx(k: int) -> ClientContext:  # every client sees the same data and the same batches
        return ClientContext(0, k, idx, trainer, 6, 16, SGDConfig(eta), 0)

    state = algo.init(w)
    for k in range(rounds):
        replies, deltas, taus = [], [], []
        for i in range(clients):
            msg = algo.configure(state, i, k)
            reply, _ = algo.client_update(msg, ctx(k), None)
            replies.append(Reply(i, reply))
            tau = int(reply.scalars["steps"])
            w_end, _, _ = trainer.sgd(state.w, ctx(k).batches(tau), ctx(k).sgd)
            deltas.append(w_end - state.w)
            taus.append(tau)
        # FedNova (SPEC): d_i = −Δ_i/(η τ_i), w ← w − η (Σ p_i τ_i) Σ p_i d_i, p_i = 1/3
        tau_eff = sum(taus) / clients
        d = sum(-delta / (eta * t) for delta, t in zip(deltas, taus, strict=True)) / clients
        expected = state.w - eta * tau_eff * d
        state, diag = algo.aggregate(state, k, replies)
        torch.testing.assert_close(state.w, expected, rtol=0, atol=2e-6)
        assert len(set(taus)) == 1
        assert taus[0] == (6 if k < 2 else 20)  # τ_0 = τ_1 = 6, then ⌊1/(1 − 0.95)⌋ = 20
        assert diag["tau_k"] == taus[0] and diag["tau_sum"] == clients * taus[0]


def test_fixed_tau_fedveca_equals_registered_fednova():
    eta, clients = 0.05, 3
    trainer, w = _digits_trainer()
    idx = torch.arange(len(trainer.y))
    info = RunInfo(clients, 2, eta, 0.0, 0.0, 0, len(w), ())
    veca = FedVeca(FedVecaParams(), info)
    nova_entry = ALGORITHMS.get("fednova")
    nova = nova_entry.factory(nova_entry.params(), info)

    def run_round(algo, state):
        replies = []
        for i in range(clients):
            msg = algo.configure(state, i, 0)
            msg.scalars["tau"] = 6.0
            ctx = ClientContext(0, 0, idx, trainer, 6, 16, SGDConfig(eta), 0)
            reply, _ = algo.client_update(msg, ctx, algo.client_init(i))
            replies.append(Reply(i, reply))
        return algo.aggregate(state, 0, replies)[0].w

    torch.testing.assert_close(run_round(veca, veca.init(w)), run_round(nova, nova.init(w)),
                               rtol=0, atol=2e-6)


# -- end to end ------------------------------------------------------------------------------
def test_digits_run_adapts_tau_within_bounds_and_learns(tmp_path):
    settings = {**DIGITS, "algorithm": "fedveca", "rounds": 10}
    summary = execute(settings, tmp_path / "run", log=lambda *_: None)
    rows = protocol.read_metrics(tmp_path / "run")
    taus = np.array([[r[f"tau_{i}"] for i in range(5)] for r in rows[1:]])
    assert np.all((taus >= 2) & (taus <= 50))
    assert len({tuple(t) for t in taus[2:]}) > 1, "τ should change across rounds"
    np.testing.assert_array_equal(taus[0], taus[1])  # τ_(1,i) = τ_(0,i)
    assert all(math.isnan(rows[1][f"A_{i}"]) for i in range(5))
    assert all(r[f"A_{i}"] > 0 for r in rows[2:] for i in range(5))
    assert all(r["eta_tau_L"] > 0 for r in rows[2:])
    assert summary["final_accuracy"] > rows[0]["test_accuracy"] + 0.3


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value", [
    ("alpha", 1.0), ("alpha", 0.0), ("alpha", -0.5), ("alpha_schedule", "0.9,1.2"),
    ("tau_max", 1), ("grad_batches", -1),
])
def test_bad_parameters_fail_before_training(key, value):
    with pytest.raises(FedhetError):
        config_of({"algorithm": "fedveca", f"algorithm.{key}": value})


def test_short_schedule_and_momentum_fail_before_the_run_directory_is_made(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(FedhetError, match="alpha_schedule has 2 values but the run has 3 rounds"):
        execute({**DIGITS, "algorithm": "fedveca", "rounds": 3,
                 "algorithm.alpha_schedule": "0.9,0.9"}, out)
    with pytest.raises(FedhetError, match="momentum"):
        execute({**DIGITS, "algorithm": "fedveca", "rounds": 3, "momentum": 0.9}, out)
    assert not out.exists()
    code = main(["run", "-a", "fedveca", "-d", "digits", "--set", "algorithm.alpha=1.5",
                 "--out", str(out)])
    assert code == 2 and not out.exists()


def test_alpha_schedule_is_used_per_round(tmp_path):
    # α_1 = 0.5 caps every τ_2 at 2; α_2 = 0.99 lets the client with min A reach ⌊1/0.01⌋ → 50
    settings = {**DIGITS, "algorithm": "fedveca", "rounds": 4, "model": "logreg",
                "algorithm.alpha_schedule": "0.9,0.5,0.99,0.9"}
    execute(settings, tmp_path / "run", log=lambda *_: None)
    rows = protocol.read_metrics(tmp_path / "run")
    assert [rows[3][f"tau_{i}"] for i in range(5)] == [2.0] * 5
    assert max(rows[4][f"tau_{i}"] for i in range(5)) == 50.0


# -- the fair-comparison protocol ----------------------------------------------------------------
def test_fair_budget_hand_computed():
    b = FairBudget(tau_all=600, rounds=10, client_sizes=(100, 200, 300), batch_size=10)
    assert b.e_avg == pytest.approx(1.0)  # 600/10 × 10/600
    assert b.baseline_taus() == [10, 20, 30] and b.central_steps == 60
    b = FairBudget(tau_all=605, rounds=10, client_sizes=(100, 200, 300), batch_size=10)
    assert b.e_avg == pytest.approx(60.5 * 10 / 600)
    assert b.baseline_taus() == [10, 20, 30] and b.central_steps == 61


def test_compare_protocol_on_digits_with_fedavg_standing_in(tmp_path):
    out = tmp_path / "cmp"
    settings = {**DIGITS, "rounds": 4, "partition": "iid"}
    table = protocol.compare(settings, out, baselines=("fedavg",), log=lambda *_: None)
    veca = protocol.read_metrics(out / "fedveca")
    tau_all = sum(r[f"tau_{i}"] for r in veca[1:] for i in range(5))
    budget = json.loads((out / "protocol.json").read_text())
    assert budget["tau_all"] == tau_all and budget["total_samples"] == 1347
    central_cfg = json.loads((out / "central" / "config.json").read_text())
    assert central_cfg["local_steps"] == math.floor(tau_all / 4 + 0.5)
    fedavg_cfg = json.loads((out / "fedavg" / "config.json").read_text())
    e_avg = tau_all / 4 * 32 / 1347
    assert fedavg_cfg["local_epochs"] == pytest.approx(e_avg)
    # the engine ran τ_i = ⌊E_avg D_i / B⌋ on every client
    sizes = budget["client_sizes"]
    expected_mean = sum(d / 1347 * math.floor(e_avg * d / 32) for d in sizes)
    fedavg = protocol.read_metrics(out / "fedavg")
    assert fedavg[1]["local_steps_mean"] == pytest.approx(expected_mean)
    assert [r["method"] for r in table] == ["FedVeca", "Centralized SGD", "FedAvg"]
    assert "rounds_to_central_accuracy" in table[0]
    assert (out / "comparison.md").read_text().startswith("| method")
    pngs = sorted((out / "plots").glob("*.png"))
    assert {p.name for p in pngs} == {"cmp_loss_accuracy.png", "cmp_fedveca_traces.png",
                                      "eta_tau_L.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    # a second call reuses the finished runs; other settings in the same --out are refused
    protocol.compare(settings, out, baselines=("fedavg",), plots=False, log=lambda *_: None)
    with pytest.raises(FedhetError, match="other settings"):
        protocol.compare({**settings, "lr": 0.1}, out, baselines=("fedavg",), log=lambda *_: None)


def test_compare_refuses_bad_input_before_running(tmp_path):
    out = tmp_path / "cmp"
    with pytest.raises(FedhetError):
        protocol.compare({**DIGITS, "rounds": 2}, out, baselines=("nosuchalgo",))
    with pytest.raises(FedhetError):
        protocol.compare({**DIGITS, "rounds": 2, "algorithm": "fedavg"}, out)
    with pytest.raises(FedhetError):
        protocol.compare({**DIGITS, "rounds": 2, "algorithm.alpha": 2.0}, out, baselines=("fedavg",))
    assert not out.exists()


def test_fedveca_params_do_not_leak_into_baselines():
    budget = FairBudget(100, 10, (50, 50), 10)
    s = protocol.baseline_settings({**DIGITS, "algorithm.alpha": 0.5, "local_epochs": 3}, budget, "fedavg")
    assert "algorithm.alpha" not in s and s["algorithm"] == "fedavg"
    assert s["local_epochs"] == pytest.approx(1.0) and s["local_steps"] == 0


# -- the preset --------------------------------------------------------------------------------
def test_preset_structure():
    from fedhet.papers.base import PRESETS
    from fedhet.papers.fedveca.preset import groups

    for scale in ("smoke", "small", "paper"):
        preset = PRESETS.get("fedveca").factory(scale)
        specs = preset.stages[0](Path("unused"))
        assert len({s.name for s in specs}) == len(specs)
        assert all(s.settings["algorithm"] == "fedveca" for s in specs)
    paper = groups("paper")
    keys = {g.key for g in paper}
    for case in (1, 2, 3):
        assert f"svm-mnist-even-odd-case{case}-s0" in keys
    assert {"cnn-mnist-mnist-case3-s9", "cnn-cifar-cifar10-case3-s9"} <= keys
    g = next(g for g in paper if g.key == "svm-mnist-even-odd-case3-s0")
    # the default SVM setup is reference [40]'s; `fedhet`: standardised pixels, B = 32
    assert g.settings | {"seed": 0} == {
        "dataset": "mnist-even-odd", "model": "svm", "partition": "half-iid", "clients": 5,
        "rounds": 100, "lr": 0.01, "batch_size": 100, "seed": 0, "train_loss": True,
        "dataset.normalize": False, "model.bias": False, "model.init": "zeros", "model.lam": 0.1,
    }
    g = next(g for g in groups("paper", "fedhet") if g.key == "svm-mnist-even-odd-case3-s0")
    assert g.settings | {"seed": 0} == {
        "dataset": "mnist-even-odd", "model": "svm", "partition": "half-iid", "clients": 5,
        "rounds": 100, "lr": 0.01, "batch_size": 32, "seed": 0, "train_loss": True,
    }
    alpha = next(g for g in paper if g.key == "svm-mnist-even-odd-case3-alpha-s0")
    assert sorted(e["algorithm.alpha"] for e in alpha.fedveca_runs.values()) == [0.5, 0.95, 0.995]
    clients = next(g for g in paper if g.key == "svm-mnist-even-odd-case3-clients-s0")
    assert sorted(e["clients"] for e in clients.fedveca_runs.values()) == [5, 30, 50]
    assert clients.fair_from == "fedveca-n50" and clients.baselines == ("fedavg", "fednova")


def test_preset_stage_two_reads_tau_all_from_stage_one(tmp_path):
    from fedhet.papers.fedveca.preset import baseline_specs, fedveca_specs, groups

    group = next(g for g in groups("smoke") if g.key == "logreg-digits-case1")
    (spec,) = fedveca_specs(group)
    execute(spec.settings, tmp_path / spec.name, log=lambda *_: None)
    tau_all = protocol.read_tau_all(tmp_path / spec.name)
    specs = baseline_specs(group, tmp_path)
    assert [s.name for s in specs] == [f"{group.key}/{m}" for m in ("central", "fedavg", "fednova")]
    by = {s.label: s.settings for s in specs}
    assert by["Centralized SGD"]["local_steps"] == math.floor(tau_all / 8 + 0.5)
    assert by["FedAvg"]["local_epochs"] == pytest.approx(tau_all / 8 * 32 / 1347)
    assert by["FedNova"]["algorithm"] == "fednova"
    assert json.loads((tmp_path / group.key / "protocol.json").read_text())["tau_all"] == tau_all


def test_preset_settings_resolve():
    from fedhet.papers.fedveca.preset import groups

    budget = FairBudget(1000, 100, (100,) * 5, 32)
    for scale in ("smoke", "small", "paper"):
        for g in groups(scale):
            for run in g.fedveca_runs:
                config_of(protocol.fedveca_settings(g.settings_of(run)))
            for method in g.baselines:
                config_of(protocol.baseline_settings(g.settings_of(g.fair_from), budget, method))


def test_fair_protocol_cli(tmp_path, capsys):
    """`fedhet reproduce fedveca --protocol fair` on the user's settings, and one error line for
    each option it does not take."""
    out = tmp_path / "cli"
    assert main(["reproduce", "fedveca", "--protocol", "fair", "-a", "fedavg", "--out", str(out)]) == 2
    assert "drop --algorithm" in capsys.readouterr().err
    assert main(["reproduce", "fedveca", "--protocol", "nope", "--out", str(out)]) == 2
    assert "paper fedveca has no protocol 'nope'; its protocols: fair" in capsys.readouterr().err
    assert main(["reproduce", "fedveca", "--set", "lr=0.1", "--out", str(out)]) == 2
    assert "a preset fixes its own settings" in capsys.readouterr().err
    for flag in (["--scale", "paper"], ["--only", "mnist"], ["--jobs", "2"], ["--stack-runs", "4"]):
        assert main(["reproduce", "fedveca", "--protocol", "fair", *flag, "--out", str(out)]) == 2
        assert f"{flag[0]}: a preset's options; --protocol runs" in capsys.readouterr().err
    assert not out.exists()
    code = main(["reproduce", "fedveca", "--protocol", "fair", "-d", "digits", "-m", "logreg", "-p",
                 "iid", "-r", "2", "--baselines", "fedavg", "--set", "algorithm.alpha=0.9", "-q",
                 "--out", str(out)])
    assert code == 0
    assert "FedVeca" in capsys.readouterr().out
    veca = json.loads((out / "fedveca" / "config.json").read_text())
    assert veca["algorithm_params"]["alpha"] == 0.9 and veca["lr"] == 0.01 and veca["clients"] == 5
    fedavg = json.loads((out / "fedavg" / "config.json").read_text())
    assert fedavg["algorithm"] == "fedavg" and "alpha" not in fedavg["algorithm_params"]
    old = tmp_path / "old-verb"
    assert main(["fedveca-compare", "-d", "digits", "--out", str(old)]) == 2
    assert "invalid choice: 'fedveca-compare'" in capsys.readouterr().err
    assert not old.exists()


def test_resumed_run_matches_uninterrupted(tmp_path):
    from fedhet.engine.assembly import assemble
    from fedhet.rundir.store import RunStore

    settings = {**DIGITS, "algorithm": "fedveca", "rounds": 6}
    execute(settings, tmp_path / "full", log=lambda *_: None)
    out = tmp_path / "cut"
    cfg = config_of(settings)
    store = RunStore(out)
    store.write_config(cfg.to_dict())
    sim = assemble(cfg, store=store, log=lambda *_: None)
    aggregate = sim.side.algorithm.aggregate

    def stop_at_four(state, round, replies):
        if round == 4:
            raise KeyboardInterrupt
        return aggregate(state, round, replies)

    sim.side.algorithm.aggregate = stop_at_four
    with pytest.raises(KeyboardInterrupt):
        sim.run()
    execute(None, out, resume=True, log=lambda *_: None)

    def strip(path: Path) -> list[dict[str, float]]:
        return [{k: v for k, v in r.items() if not k.endswith("time_s")} for r in protocol.read_metrics(path)]

    full, resumed = strip(tmp_path / "full"), strip(out)
    assert len(resumed) == 7
    for a, b in zip(full, resumed, strict=True):
        assert a.keys() == b.keys()
        assert all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_fair_protocol_prints_progress_lines_off_a_terminal(tmp_path, capsys):
    """`reproduce fedveca --protocol fair` into a log file: each method's run says how far it is
    (prefixed by the method), as `fedhet run` does; `-q` keeps it quiet."""
    flags = ["reproduce", "fedveca", "--protocol", "fair", "-d", "digits", "-m", "logreg", "-p", "iid",
             "-r", "2", "--baselines", "fedavg"]
    assert main([*flags, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    for method in ("fedveca", "central", "fedavg"):
        assert f"{method}: round 2/2  acc " in out
    assert main([*flags, "-q", "--out", str(tmp_path / "b")]) == 0
    assert "round 2/2" not in capsys.readouterr().out


def test_a_fair_budget_keeps_its_partition_sizes_beside_the_run_and_reads_them_without_data(
        tmp_path, monkeypatch):
    """The first budget computed from a FedVeca run writes the partition's `D_i` beside it; the
    next reads them there and never loads the data (a plan or page made where MNIST is not)."""
    from fedhet.papers.fedveca.preset import fedveca_specs, groups

    group = next(g for g in groups("smoke") if g.key == "logreg-digits-case1")
    (spec,) = fedveca_specs(group)
    run = tmp_path / spec.name
    execute(spec.settings, run, log=lambda *_: None)
    first = protocol.budget_from_run(run, group.settings_of(group.fair_from))
    saved = json.loads((run / protocol.SIZES_FILE).read_text())
    assert tuple(saved) == first.client_sizes == protocol.client_sizes(group.settings_of(group.fair_from))

    def no_data(settings):
        raise AssertionError("the data was loaded")

    monkeypatch.setattr(protocol, "client_sizes", no_data)
    again = protocol.budget_from_run(run, group.settings_of(group.fair_from))
    assert again == first
    (run / protocol.SIZES_FILE).write_text("[1, 2]\n")  # another partition's: not believed
    with pytest.raises(AssertionError, match="the data was loaded"):
        protocol.budget_from_run(run, group.settings_of(group.fair_from))
