"""FedNNNN, Norm-Norm and the NWDA diagnostics (seed fednnnn.txt, eqs. 4–13)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedhet.algorithms.base import ALGORITHMS, Message, Reply, RunInfo
from fedhet.algorithms.nwda import LayerIndex, nwda
from fedhet.errors import FedhetError
from fedhet.runs.single import execute
from fedhet.training.flat import FlatModel, Layer


def run_info(dim: int, layers=()) -> RunInfo:
    return RunInfo(
        num_clients=4, rounds=3, lr=0.1, momentum=0.0, weight_decay=0.0, seed=0, dim=dim,
        layers=tuple(layers),
    )


def replies(deltas, sizes=None) -> list[Reply]:
    sizes = sizes or [1.0] * len(deltas)
    return [
        Reply(i, Message({"delta": torch.as_tensor(d, dtype=torch.float32)}, {"num_samples": n}))
        for i, (d, n) in enumerate(zip(deltas, sizes, strict=True))
    ]


def build(name: str, dim: int, layers=(), **values):
    cls = ALGORITHMS.get(name).factory
    return cls(ALGORITHMS.params(name, values), run_info(dim, layers))


def conv_fc_layers():
    """A small conv + fc model's layer table (conv weight/bias, then fc weight/bias)."""
    module = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3))
    return FlatModel(module).layers


# -- NWDA ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 6),
    dim=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(1e-3, 1e3),
    uniform=st.booleans(),
)
def test_n_never_exceeds_e(m: int, dim: int, seed: int, scale: float, uniform: bool) -> None:
    """Proposition 1: `N ≤ E` for any updates and any convex weights, also per layer kind."""
    rng = np.random.default_rng(seed)
    deltas = [torch.from_numpy(scale * rng.standard_normal(dim)).float() for _ in range(m)]
    if uniform:
        p = torch.full((m,), 1.0 / m, dtype=torch.float64)
    else:
        raw = torch.from_numpy(rng.uniform(0.01, 1.0, m))
        p = raw / raw.sum()
    half = max(1, dim // 2)
    layers = [Layer("a.weight", 0, half, (half,), "conv")]
    if dim > half:
        layers.append(Layer("b.weight", half, dim, (dim - half,), "fc"))
    index = LayerIndex(layers, dim)
    stats = nwda(p, deltas, index)
    for group in [index.all, *index.kinds.values()]:
        assert stats.N(group) <= stats.E(group) * (1 + 1e-6) + 1e-12


def test_nwda_matches_hand_computation_per_kind() -> None:
    layers = conv_fc_layers()
    dim = layers[-1].stop
    rng = np.random.default_rng(1)
    deltas = [torch.from_numpy(rng.standard_normal(dim)).float() for _ in range(3)]
    sizes = [10.0, 30.0, 60.0]
    algo = build("fedavg", dim, layers, nwda=True)
    w0 = torch.zeros(dim)
    state, diag = algo.aggregate(algo.init(w0), 0, replies(deltas, sizes))
    p = np.array(sizes) / sum(sizes)
    conv = slice(layers[0].start, layers[1].stop)
    fc = slice(layers[2].start, layers[3].stop)
    for key, part in (("", slice(0, dim)), ("_conv", conv), ("_fc", fc)):
        d = [x[part].double().numpy() for x in deltas]
        bar = sum(pi * di for pi, di in zip(p, d, strict=True))
        assert diag[f"N{key}"] == pytest.approx(np.linalg.norm(bar), rel=1e-6)
        E = sum(pi * np.linalg.norm(di) for pi, di in zip(p, d, strict=True))
        assert diag[f"E{key}"] == pytest.approx(E, rel=1e-6)
        # FedAvg moves the server by exactly Δ̄, so its movement is N.
        assert diag[f"move{key}"] == pytest.approx(diag[f"N{key}"], rel=1e-6)
    assert diag["cum_move"] == pytest.approx(diag["move"])
    _, diag2 = algo.aggregate(state, 1, replies(deltas, sizes))
    assert diag2["cum_move"] == pytest.approx(2 * diag["move"], rel=1e-6)


def test_fedavg_without_nwda_logs_no_norms() -> None:
    algo = build("fedavg", 3)
    _, diag = algo.aggregate(algo.init(torch.zeros(3)), 0, replies([[1, 0, 0], [0, 1, 0]]))
    assert "N" not in diag and "E" not in diag


# -- Norm-Norm (eq. 8) ---------------------------------------------------------------------
@pytest.mark.parametrize("beta", [0.3, 1.0, 2.5])
def test_norm_norm_moves_server_by_beta_e(beta: float) -> None:
    """Eq. 9: with `γ = 0`, `‖w_(k+1) − w_k‖ = β E`."""
    rng = np.random.default_rng(2)
    deltas = [rng.standard_normal(20) for _ in range(5)]
    sizes = [5.0, 1.0, 2.0, 8.0, 3.0]
    algo = build("norm-norm", 20, beta=beta, gamma=0.0)
    w0 = torch.from_numpy(rng.standard_normal(20)).float()
    state, diag = algo.aggregate(algo.init(w0), 0, replies(deltas, sizes))
    p = np.array(sizes) / sum(sizes)
    E = sum(pi * np.linalg.norm(d) for pi, d in zip(p, deltas, strict=True))
    assert float((state.w - w0).norm()) == pytest.approx(beta * E, rel=1e-5)
    assert diag["move"] == pytest.approx(beta * E, rel=1e-5)
    assert diag["E"] == pytest.approx(E, rel=1e-6)


def test_norm_norm_with_beta_n_over_e_is_fedavg() -> None:
    rng = np.random.default_rng(3)
    deltas = [rng.standard_normal(15) for _ in range(4)]
    sizes = [3.0, 7.0, 1.0, 9.0]
    w0 = torch.from_numpy(rng.standard_normal(15)).float()
    fedavg = build("fedavg", 15)
    want, _ = fedavg.aggregate(fedavg.init(w0), 0, replies(deltas, sizes))
    probe = build("norm-norm", 15)
    _, diag = probe.aggregate(probe.init(w0), 0, replies(deltas, sizes))
    algo = build("norm-norm", 15, beta=diag["N"] / diag["E"], gamma=0.0)
    got, _ = algo.aggregate(algo.init(w0), 0, replies(deltas, sizes))
    torch.testing.assert_close(got.w, want.w, rtol=1e-5, atol=1e-6)


# -- momentum (eqs. 10 and 12) -------------------------------------------------------------
ROUNDS = [
    [[1.0, 0.0], [0.0, 1.0]],  # Δ̄ = (0.5, 0.5), N = √0.5, E = 1
    [[2.0, 0.0], [2.0, 0.0]],  # Δ̄ = (2, 0),     N = 2,    E = 2
    [[0.0, 3.0], [0.0, -1.0]],  # Δ̄ = (0, 1),     N = 1,    E = 2
]


def test_fedavgm_accumulates_as_eq_10() -> None:
    """`d_(k+1) = γ d_k + Δ̄`, `w_(k+1) = w_k + d_(k+1)`, by hand for γ = 0.5 over 3 rounds."""
    algo = build("fedavgm", 2, gamma=0.5, weighting="uniform")
    state = algo.init(torch.tensor([1.0, 1.0]))
    want_d = [[0.5, 0.5], [2.25, 0.25], [1.125, 1.125]]
    want_w = [[1.5, 1.5], [3.75, 1.75], [4.875, 2.875]]
    for k, (deltas, d, w) in enumerate(zip(ROUNDS, want_d, want_w, strict=True)):
        state, _ = algo.aggregate(state, k, replies(deltas))
        torch.testing.assert_close(state.d, torch.tensor(d))
        torch.testing.assert_close(state.w, torch.tensor(w))


def test_fednnnn_accumulates_as_eq_12() -> None:
    """`d_(k+1) = γ d_k + β (E/N) Δ̄` by hand for β = 0.5, γ = 0.5 over 3 rounds."""
    algo = build("fednnnn", 2, beta=0.5, gamma=0.5, weighting="uniform")
    state = algo.init(torch.zeros(2))
    r = math.sqrt(0.5)
    # round 1: β E/N = 0.5/√0.5 = √0.5, so the new term is (√0.5·0.5, √0.5·0.5) = (r/2, r/2)
    # round 2: β E/N = 0.5, new term (1, 0);  round 3: β E/N = 1, new term (0, 1)
    d1 = [r / 2, r / 2]
    d2 = [0.5 * d1[0] + 1.0, 0.5 * d1[1]]
    d3 = [0.5 * d2[0], 0.5 * d2[1] + 1.0]
    w = [0.0, 0.0]
    for k, (deltas, d) in enumerate(zip(ROUNDS, [d1, d2, d3], strict=True)):
        state, diag = algo.aggregate(state, k, replies(deltas))
        w = [w[0] + d[0], w[1] + d[1]]
        torch.testing.assert_close(state.d, torch.tensor(d))
        torch.testing.assert_close(state.w, torch.tensor(w))
    assert diag["cum_move"] == pytest.approx(
        math.hypot(*d1) + math.hypot(*d2) + math.hypot(*d3), rel=1e-6
    )


# -- the N ≈ 0 rule and the evaluation model ------------------------------------------------
def test_zero_n_returns_w_unchanged() -> None:
    algo = build("fednnnn", 3, weighting="uniform")
    state = algo.init(torch.tensor([1.0, 2.0, 3.0]))
    state, _ = algo.aggregate(state, 0, replies([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    w1, d1 = state.w.clone(), state.d.clone()
    assert float(d1.norm()) > 0
    for deltas in ([[1.0, 2.0, 0.0], [-1.0, -2.0, 0.0]], [[1.0, 2.0, 0.0], [-1.0, -2.0, 1e-6]]):
        new, diag = algo.aggregate(state, 1, replies(deltas))
        torch.testing.assert_close(new.w, w1)
        torch.testing.assert_close(new.d, d1)
        assert diag["skipped"] == 1.0 and diag["move"] == 0.0


def test_separate_evaluation_model() -> None:
    """§4.1: the normalised model is carried on; the plain average `w_k + Δ̄` is evaluated."""
    w0 = torch.tensor([1.0, -1.0])
    deltas = [[1.0, 0.0], [0.0, 1.0]]
    algo = build("fednnnn", 2, weighting="uniform")
    state, _ = algo.aggregate(algo.init(w0), 0, replies(deltas))
    avg = torch.tensor([1.5, -0.5])
    torch.testing.assert_close(algo.eval_params(state), avg)
    torch.testing.assert_close(algo.extra_eval_params(state)["norm"], state.w)
    assert not torch.allclose(state.w, avg)
    swapped = build("fednnnn", 2, weighting="uniform", eval_model="normalized")
    state, _ = swapped.aggregate(swapped.init(w0), 0, replies(deltas))
    torch.testing.assert_close(swapped.eval_params(state), state.w)
    torch.testing.assert_close(swapped.extra_eval_params(state)["avg"], avg)


# -- per-layer normalisation ---------------------------------------------------------------
def test_layer_scope_normalises_each_layer() -> None:
    """`scope=layer`: every module moves by `β E_layer` in its own Δ̄ direction."""
    layers = conv_fc_layers()
    dim = layers[-1].stop
    rng = np.random.default_rng(4)
    deltas = [rng.standard_normal(dim) for _ in range(3)]
    deltas[0][layers[2].start :] *= 10.0  # very different scales per layer
    beta = 0.8
    algo = build("norm-norm", dim, layers, beta=beta, scope="layer", weighting="uniform")
    w0 = torch.zeros(dim)
    state, diag = algo.aggregate(algo.init(w0), 0, replies(deltas))
    bar = np.mean(deltas, axis=0)
    for part in (slice(layers[0].start, layers[1].stop), slice(layers[2].start, layers[3].stop)):
        E = np.mean([np.linalg.norm(d[part]) for d in deltas])
        step = state.w[part].double().numpy()
        assert np.linalg.norm(step) == pytest.approx(beta * E, rel=1e-5)
        cos = step @ bar[part] / (np.linalg.norm(step) * np.linalg.norm(bar[part]))
        assert cos == pytest.approx(1.0, abs=1e-6)
    whole = build("norm-norm", dim, layers, beta=beta, weighting="uniform")
    other, _ = whole.aggregate(whole.init(w0), 0, replies(deltas))
    assert not torch.allclose(other.w, state.w)
    assert {"N_conv", "E_conv", "N_fc", "E_fc", "move_conv", "move_fc"} <= set(diag)


def test_layer_scope_skips_only_the_zero_layer() -> None:
    layers = conv_fc_layers()
    dim = layers[-1].stop
    conv = slice(layers[0].start, layers[1].stop)
    a, b = np.ones(dim), np.ones(dim)
    b[conv] = -1.0  # conv updates cancel: N_conv = 0
    algo = build("norm-norm", dim, layers, scope="layer", weighting="uniform")
    state, diag = algo.aggregate(algo.init(torch.zeros(dim)), 0, replies([a, b]))
    assert float(state.w[conv].abs().max()) == 0.0
    assert float(state.w[layers[2].start :].abs().min()) > 0.0
    assert diag["skipped"] == 1.0


# -- parameters and an end-to-end run -------------------------------------------------------
@pytest.mark.parametrize(
    "name, values",
    [("fednnnn", {"beta": 0.0}), ("fednnnn", {"gamma": 1.0}), ("norm-norm", {"eps": -1.0}),
     ("fednnnn", {"scope": "block"})],
)
def test_bad_parameters_are_rejected(name: str, values: dict) -> None:
    with pytest.raises(FedhetError, match="algorithm"):
        ALGORITHMS.params(name, values)


def test_fednnnn_learns_on_digits(tmp_path) -> None:
    settings_ = {
        "algorithm": "fednnnn", "dataset": "digits", "partition": "dirichlet",
        "partition.alpha": 0.5, "clients": 8, "rounds": 12, "lr": 0.1, "batch_size": 32,
        "local_epochs": 1, "algorithm.beta": 0.7, "algorithm.gamma": 0.5,
    }
    summary = execute(settings_, tmp_path / "run", log=lambda _: None)
    assert summary["final_accuracy"] > 0.85
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))[1:]
    assert all(float(r["N"]) <= float(r["E"]) + 1e-9 for r in rows)
    assert float(rows[0]["move"]) == pytest.approx(0.7 * float(rows[0]["E"]), rel=1e-5)  # d_0 = 0
    assert float(rows[-1]["test_accuracy_norm"]) > 0.5
    assert float(rows[-1]["cum_move"]) == pytest.approx(sum(float(r["move"]) for r in rows), rel=1e-6)


# -- the preset and the figures -------------------------------------------------------------
def test_preset_follows_tables_1_2_and_5() -> None:
    from fedhet.papers.base import PRESETS

    smoke = PRESETS.get("fednnnn").factory("smoke")
    specs = smoke.stages[0](Path("."))
    assert len(specs) == 20 and len({s.name for s in specs}) == 20
    paper_specs = PRESETS.get("fednnnn").factory("paper").stages[0](Path("."))
    paper = {(s.group, s.label): s.settings for s in paper_specs}
    assert len(paper) == 40 and len(paper_specs) == 120  # every cell over seeds 0, 1, 2
    cell = [s.settings["seed"] for s in paper_specs if (s.group, s.label) == ("MNIST IID-B", "FedAvg")]
    assert sorted(cell) == [0, 1, 2]
    assert len({s.name for s in paper_specs}) == 120
    ub = paper[("MNIST NonIID-UB", "FedNNNN")]
    assert (ub["algorithm"], ub["algorithm.beta"], ub["algorithm.server_momentum"]) == ("fednnnn", 0.7, 0.8)
    assert ub["algorithm.weighting"] == "uniform" and ub["partition"] == "unbalanced"
    assert paper[("MNIST NonIID-B", "FedNNNN")]["algorithm.weighting"] == "samples"
    assert paper[("CIFAR10 IID-UB", "FedProx")]["algorithm.mu"] == 0.005
    assert paper[("CIFAR10 NonIID-B", "Momentum")]["algorithm.server_momentum"] == 0.9
    cifar = paper[("CIFAR10 IID-B", "FedAvg")]
    assert (cifar["rounds"], cifar["weight_decay"], cifar["model"]) == (250, 5e-4, "cnn-fednnnn-cifar")
    mnist = paper[("MNIST IID-B", "Norm-Norm")]
    assert (mnist["clients"], mnist["batch_size"], mnist["local_epochs"], mnist["lr"]) == (100, 50, 5, 0.05)
    published = {(r["group"], r["label"]): r["value"] for r in smoke.published}
    assert published[("MNIST NonIID-UB", "FedNNNN")] == 0.989
    assert published[("CIFAR10 NonIID-UB", "Momentum")] == 0.62
    assert set(published) == set(paper)


def test_preset_settings_are_valid() -> None:
    """Every run's settings resolve, with the weighting each scenario asks for."""
    from fedhet.engine.config import config_of
    from fedhet.papers.fednnnn.preset import run_specs

    for scale in ("smoke", "small", "paper"):
        for spec in run_specs(scale):
            cfg = config_of(spec.settings)
            assert cfg.algorithm_params.weighting == spec.settings["algorithm.weighting"]


def test_plots_render(tmp_path) -> None:
    from fedhet.papers.fednnnn.plots import plot_study

    base = {"dataset": "digits", "partition": "iid", "clients": 4, "rounds": 3, "lr": 0.1,
            "model.hidden": 16}
    for algo in ("fedavg", "fednnnn"):
        execute({**base, "algorithm": algo, "algorithm.nwda": True}, tmp_path / algo, log=lambda _: None)
    made = plot_study(tmp_path)
    names = sorted(p.name for p in made)
    assert names == ["digits_iid-b_accuracy.png", "digits_iid-b_cumulative.png", "digits_iid-b_norms_fc.png"]
    assert all(p.stat().st_size > 5000 for p in made)
