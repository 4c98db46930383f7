"""The stacked executor follows the sequential executor's trajectory for every algorithm.

Tiny digits runs (4 clients, 2 rounds, a few local steps): final parameters within 1e-5
(relative) and every metrics row equal to 4 decimals. Unequal τ, momentum and weight decay are
switched on where the algorithm allows them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from faulty import make_client_fail
from registered import every_algorithm, explained, shipped

from fedhet.algorithms.base import ALGORITHMS
from fedhet.algorithms.fedavg import FedAvg, FedAvgParams
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.failures import ClientFailure
from fedhet.engine.simulation import Simulation
from fedhet.errors import FedhetError
from fedhet.training.cohort import CohortTrainer, GradJob, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig

BASE = {
    "dataset": "digits", "clients": 4, "rounds": 2, "batch_size": 16, "lr": 0.05,
    "client_steps": [3, 5, 2, 4], "momentum": 0.5, "weight_decay": 1e-3,
    "model_params": {"hidden": 32}, "partition": "iid",
}

WRITTEN = {
    "fedavg": {},
    "fedavgm": {},
    "fedprox": {"algorithm_params": {"mu": 0.1}},
    "scaffold": {"momentum": 0.0},
    "scaffold-I": {"algorithm": "scaffold", "momentum": 0.0, "algorithm_params": {"option": "I"}},
    "fednova": {"algorithm_params": {"mu": 0.1}},
    "norm-norm": {},
    "fednnnn": {},
    "central": {"client_steps": [], "local_steps": 4},
    "moon": {"model": "moon-mlp", "model_params": {}},
    "fedveca": {"client_steps": [], "local_steps": 3, "momentum": 0.0, "weight_decay": 0.0},
    "bherd": {"momentum": 0.0},
    "bherd-fednova": {"momentum": 0.0},
    "bherd-scaffold": {"momentum": 0.0},
    "grab-fedavg": {"client_steps": [], "local_steps": 4},
    "ring": {},
    "fedsr": {"algorithm_params": {"clusters": 2, "ring_passes": 2}},
    "hierfavg": {"algorithm_params": {"clusters": 2, "kappa2": 2}},
    "fedavg-logreg": {"algorithm": "fedavg", "model": "logreg", "model_params": {}},
    "fedavg-equal-tau": {"algorithm": "fedavg", "client_steps": [], "local_steps": 3, "momentum": 0.0},
    "fedadam": {"algorithm_params": {"server_lr": 0.01}},
    "fedyogi": {"algorithm_params": {"mu": 0.1}},
    "fedadagrad": {"algorithm_params": {"server_lr": 0.03, "beta1": 0.5}},
    "fedavg-adam": {"algorithm": "fedavg", "client_optimizer": "adam", "momentum": 0.0, "lr": 0.01},
    "fedprox-adamw": {"algorithm": "fedprox", "client_optimizer": "adamw", "momentum": 0.0,
                      "lr": 0.01, "weight_decay": 0.05, "adam_beta1": 0.8, "adam_eps": 1e-6},
    "fedadam-adam": {"algorithm": "fedadam", "client_optimizer": "adam", "momentum": 0.0,
                     "lr": 0.01, "algorithm_params": {"server_lr": 0.01}},
    # Adam steps by m/(√v + ε): a coordinate whose gradient is near ε turns the stacked
    # contrastive gradient's last-bit differences into whole steps; a larger ε keeps the
    # comparison about the executors
    "moon-adam": {"algorithm": "moon", "model": "moon-mlp", "model_params": {},
                  "client_optimizer": "adam", "momentum": 0.0, "lr": 0.01, "adam_eps": 1e-4},
    "fedsr-adam": {"algorithm": "fedsr", "algorithm_params": {"clusters": 2, "ring_passes": 2},
                   "client_optimizer": "adam", "momentum": 0.0, "lr": 0.01, "adam_eps": 1e-4},
}
"""The hand-written cases: options with code paths of their own, and what BASE's momentum and
unequal τ need for the algorithms whose rule assumes plain SGD or equal local work."""

CASES = every_algorithm(WRITTEN)
"""`WRITTEN`, and for every other registered algorithm the case its registered `example`
settings give (tests/registered.py): a new algorithm is covered without a line here."""


SEQUENTIAL_ANYWAY: set[str] = set()
"""Every algorithm reaches the stacked cohort (MOON's contrastive loss included). Rings go
through it as chains: a round's hops of every ring train in one stacked call, each hop taking
the row its predecessor left (Adam hops, which count the stack's steps, wait for the next call)."""


def _run(case: str, executor: str, cases: dict[str, dict] = CASES) -> tuple[Simulation, list[dict]]:
    values = {**BASE, "algorithm": case, **cases[case], "executor": executor}
    with explained(case, "tests/test_executors.py", WRITTEN):
        cfg = config_of(values)
        return _simulate(cfg, executor)


def _simulate(cfg, executor: str) -> tuple[Simulation, list[dict]]:
    rows: list[dict] = []
    sim = assemble(cfg, log=lambda _: None, callbacks=[rows.append])
    sim.stacked_jobs = 0
    if executor == "stacked":
        stacked = sim.side.executor.cohort.sgd_many

        def counting(jobs, *rest):
            sim.stacked_jobs += len(jobs)
            return stacked(jobs, *rest)

        sim.side.executor.cohort.sgd_many = counting
    sim.run()
    return sim, rows


def test_every_registered_algorithm_is_covered():
    algorithms = {CASES[c].get("algorithm", c) for c in CASES}
    assert set(shipped()) <= algorithms


class HalfStep(FedAvg):
    """A throw-away algorithm: FedAvg taking half the mean client change, which only runs
    with plain local SGD (as BHerd or FedVeca)."""

    name = "half-step"

    def __init__(self, params, run):
        super().__init__(params, run)
        if run.momentum:
            raise FedhetError(f"half-step takes plain SGD steps; set momentum=0 (got {run.momentum})")

    def aggregate(self, state, round, replies):
        new, diagnostics = super().aggregate(state, round, replies)
        return replace(new, w=(state.w + new.w) / 2), diagnostics


def test_an_algorithm_registered_with_its_example_is_covered_without_a_case():
    """An algorithm registered (here for the length of a block) with the settings a small run
    of it needs gets its case from the registry, and the executors' check runs on it."""
    with ALGORITHMS.added("half-step", HalfStep, FedAvgParams, "test only", example={"momentum": 0.0}):
        cases = every_algorithm(WRITTEN, names=ALGORITHMS.names)
        assert cases["half-step"] == {"algorithm": "half-step", "momentum": 0.0}
        check_stacked_follows_sequential("half-step", cases)


def test_an_algorithm_whose_case_fails_says_what_to_add_and_where():
    with ALGORITHMS.added("half-step", HalfStep, FedAvgParams, "test only"):
        cases = every_algorithm(WRITTEN, names=ALGORITHMS.names)
        with pytest.raises(pytest.fail.Exception) as failed:
            _run("half-step", "sequential", cases)
    message = str(failed.value)
    assert message.startswith(
        "algorithm 'half-step' has no case of its own in tests/test_executors.py, so it ran with "
        "the test's BASE settings and its registered example {}, and failed: FedhetError: "
        "half-step takes plain SGD steps; set momentum=0 (got 0.5). Declare the settings a "
        "small run of it needs when it registers (`@ALGORITHMS.register('half-step', Params, "
        "doc, example={'model': ...})`), or add a case for it to tests/test_executors.py")


@pytest.mark.parametrize("case", sorted(CASES))
def test_stacked_follows_sequential(case):
    check_stacked_follows_sequential(case, CASES)


def check_stacked_follows_sequential(case: str, cases: dict[str, dict]) -> None:
    seq, seq_rows = _run(case, "sequential", cases)
    bat, bat_rows = _run(case, "stacked", cases)
    assert seq.side.executor.name == "sequential" and bat.side.executor.name == "stacked"
    assert (bat.stacked_jobs == 0) == (case in SEQUENTIAL_ANYWAY)
    w_seq = seq.side.algorithm.eval_params(seq.final_state)
    w_bat = bat.side.algorithm.eval_params(bat.final_state)
    assert float((w_bat - w_seq).norm() / w_seq.norm()) < 1e-5
    assert len(seq_rows) == len(bat_rows)
    for a, b in zip(seq_rows, bat_rows, strict=True):
        for key, value in a.items():
            if key.endswith("_time_s") or not isinstance(value, int | float):
                continue
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(b[key]), key
            else:
                assert b[key] == pytest.approx(value, abs=5e-5, rel=1e-4), key


def test_batchnorm_statistics_per_client():
    """Stacked SGD on a BatchNorm CNN: parameters and per-client running statistics match the
    sequential loop, with unequal τ and unequal batch sizes in one cohort."""
    from fedhet.models.registry import build_model

    torch.manual_seed(0)
    model = FlatModel(build_model("cnn-fednnnn-cifar", (3, 32, 32), 10, None))
    assert model.buffers.numel()
    x, y = torch.randn(120, 3, 32, 32), torch.randint(0, 10, (120,))
    seq, stacked = LocalTrainer(model, x, y), CohortTrainer(model, x, y)
    cfg = SGDConfig(0.01, 0.5, 1e-3)
    plans = [(torch.arange(0, 40), 3), (torch.arange(40, 60), 2), (torch.arange(60, 120), 1)]
    w0, b0 = model.params.clone(), model.buffers.clone()
    expected = []
    for ix, tau in plans:
        model.buffers.copy_(b0)
        w, steps, loss = seq.sgd(w0, seq.batches(ix, 32, tau, np.random.default_rng(tau)), cfg)
        expected.append((w, steps, loss, model.buffers.clone()))
    jobs = [SGDJob(w0, seq.batches(ix, 32, tau, np.random.default_rng(tau)), cfg, buffers=b0)
            for ix, tau in plans]
    stacked.sgd_many(jobs)
    for job, (w, steps, loss, bufs) in zip(jobs, expected, strict=True):
        assert job.error is None
        w_b, steps_b, loss_b = job.result
        assert steps_b == steps
        # [note] float32 BatchNorm backward is itself ~1e-4 off float64 on random data
        assert float((w_b - w).norm() / w.norm()) < 1e-4
        assert loss_b == pytest.approx(loss, rel=1e-5)
        assert torch.allclose(job.buffers_out, bufs, atol=1e-5)


@pytest.mark.parametrize(("model", "params", "dim"), [
    ("logreg", {}, 65), ("svm", {}, 13),
    ("svm", {"bias": False}, 12),  # reference [40]'s SVM: the closed form without a bias
])
def test_closed_form_linear_gradients(model, params, dim):
    from fedhet.models.registry import MODELS, build_model

    torch.manual_seed(1)
    classes = 2 if model == "svm" else 5
    flat = FlatModel(build_model(model, (12,), classes, MODELS.params(model, params)))
    assert flat.dim == dim
    x, y = torch.randn(50, 12), torch.randint(0, classes, (50,))
    stacked = CohortTrainer(flat, x, y)
    assert stacked.linear
    w = flat.params + 0.1 * torch.randn(3, flat.dim)
    batch = torch.stack([torch.arange(0, 10), torch.arange(10, 20), torch.arange(30, 40)])
    g, loss, _ = stacked.gradients(w, torch.zeros(3, 0), batch)
    assert g.shape == (3, dim)
    seq = LocalTrainer(flat, x, y)
    for c in range(3):
        flat.params.copy_(w[c])
        g_ref, loss_ref = seq.gradient(batch[c])
        assert torch.allclose(g[c], g_ref, atol=1e-6)
        assert float(loss[c]) == pytest.approx(loss_ref, rel=1e-6)


@pytest.mark.parametrize("model", ["mlp", "logreg"])
def test_full_gradients_stacked_equal_the_sequential_pass(model, monkeypatch):
    """`∇F_i(w_i)` of clients with unequal sizes (a last partial chunk, a client smaller than a
    chunk) and a subsampled estimate (`max_batches`), stacked, equals each client's own pass;
    stacked calls hold at most `FULL_GRADIENT_SAMPLES` samples."""
    from fedhet.models.registry import MODELS, build_model
    from fedhet.training import cohort

    torch.manual_seed(2)
    flat = FlatModel(build_model(model, (12,), 4, MODELS.get(model).params()))
    x, y = torch.randn(200, 12), torch.randint(0, 4, (200,))
    monkeypatch.setattr(cohort, "FULL_GRADIENT_SAMPLES", 64)
    plans = [(torch.arange(0, 90), 32, 0), (torch.arange(90, 110), 32, 0),
             (torch.arange(110, 200), 32, 2), (torch.arange(20, 60), 16, 0)]
    w = flat.params + 0.1 * torch.randn(len(plans), flat.dim)
    seq = LocalTrainer(flat, x, y)
    expected = [seq.full_gradient(w[c], ix, chunk, mb) for c, (ix, chunk, mb) in enumerate(plans)]
    stacked = CohortTrainer(flat, x, y)
    sizes: list[int] = []
    gradients = stacked.gradients
    stacked.gradients = lambda w_, b_, idx: sizes.append(idx.numel()) or gradients(w_, b_, idx)
    jobs = [GradJob(w[c], ix, chunk, mb) for c, (ix, chunk, mb) in enumerate(plans)]
    stacked.full_gradients(jobs)
    for job, g in zip(jobs, expected, strict=True):
        assert job.error is None
        assert torch.allclose(job.result, g, atol=1e-6, rtol=1e-5)
    assert max(sizes) <= 64 and max(sizes) > 32  # stacked, and within the cap


@pytest.mark.parametrize("case", ["fedveca", "scaffold-I"])
def test_full_gradients_are_stacked_across_clients(case):
    """FedVeca's `∇F_i(w_k)` and SCAFFOLD option I's `c_i = ∇F_i(x)` reach the cohort together."""
    values = {**BASE, "algorithm": case, **CASES[case], "executor": "stacked"}
    sim = assemble(config_of(values), log=lambda _: None)
    calls: list[int] = []
    full = sim.side.executor.cohort.full_gradients

    def counting(jobs):
        if jobs:
            calls.append(len(jobs))
        return full(jobs)

    sim.side.executor.cohort.full_gradients = counting
    sim.run()
    assert calls and max(calls) == BASE["clients"]


@pytest.mark.parametrize("executor", ["sequential", "stacked"])
def test_a_failing_client_is_reported_not_fatal(executor):
    cfg = config_of({**BASE, "algorithm": "fedavg", "executor": executor})
    sim = assemble(cfg, log=lambda _: None)
    make_client_fail(sim, 2, "disk on fire")
    state = sim.side.algorithm.init(sim.w0)
    requests = [(i, sim.configure(state, i, 0)) for i in range(4)]
    out = list(sim.client_updates(0, requests))
    assert [cid for cid, _ in out] == [0, 1, 2, 3]
    failure = out[2][1]
    assert isinstance(failure, ClientFailure) and failure.client_id == 2
    assert failure.error == "RuntimeError: disk on fire"
    assert all("delta" in reply.tensors for cid, reply in out if cid != 2)


def test_settings_are_validated():
    with pytest.raises(FedhetError, match="executor must be"):
        config_of({"executor": "fast"})
    with pytest.raises(FedhetError, match="device must be"):
        config_of({"device": "tpu"})
    with pytest.raises(FedhetError, match="cohort_chunk"):
        config_of({"cohort_chunk": -1})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_one_clear_error():
    cfg = config_of({**BASE, "device": "cuda"})
    with pytest.raises(FedhetError, match="device=cuda"):
        assemble(cfg, log=lambda _: None)


def test_auto_rule_and_chunks():
    cfg = config_of({**BASE, "algorithm": "fedavg"})
    assert assemble(cfg, log=lambda _: None).side.executor.name == "sequential"
    cfg = config_of({**BASE, "algorithm": "fedavg", "model": "logreg", "model_params": {}})
    assert assemble(cfg, log=lambda _: None).side.executor.name == "stacked"
    # chunks of 3 clients give the same trajectory as one chunk
    one, _ = _run("fedavg", "stacked")
    cfg = config_of({**BASE, "algorithm": "fedavg", "executor": "stacked", "cohort_chunk": 3})
    sim = assemble(cfg, log=lambda _: None)
    sim.run()
    assert torch.allclose(sim.final_state.w, one.final_state.w, atol=1e-6)


def test_batchnorm_model_end_to_end():
    """The engine's BatchNorm message key: per-client statistics in, per-client out, averaged."""
    from fedhet.data.base import Dataset

    gen = torch.Generator().manual_seed(0)
    data = Dataset(
        "random", torch.randn(90, 3, 32, 32, generator=gen), torch.randint(0, 10, (90,), generator=gen),
        torch.randn(30, 3, 32, 32, generator=gen), torch.randint(0, 10, (30,), generator=gen), 10,
    )
    sims = {}
    for executor in ("sequential", "stacked"):
        cfg = config_of({
            "algorithm": "fedavg", "model": "cnn-fednnnn-cifar", "clients": 3, "rounds": 2,
            "batch_size": 16, "client_steps": [2, 1, 3], "lr": 0.01, "partition": "iid",
            "executor": executor,
        })
        sims[executor] = sim = assemble(cfg, data=data, log=lambda _: None)
        sim.run()
    seq, bat = sims["sequential"], sims["stacked"]
    assert seq.buffers.numel() and bat.side.executor.name == "stacked"
    assert float((bat.final_state.w - seq.final_state.w).norm() / seq.final_state.w.norm()) < 1e-4
    assert torch.allclose(bat.buffers, seq.buffers, atol=1e-4, rtol=1e-4)


def test_out_of_memory_halves_the_chunk():
    """A CUDA out-of-memory error in a chunk's first step retries it with half the clients."""
    from fedhet.models.registry import MODELS, build_model

    torch.manual_seed(0)
    flat = FlatModel(build_model("mlp", (1, 8, 8), 10, MODELS.get("mlp").params()))
    x, y = torch.randn(80, 1, 8, 8), torch.randint(0, 10, (80,))
    seq, logged = LocalTrainer(flat, x, y), []
    stacked = CohortTrainer(flat, x, y, log=logged.append)
    real = stacked.gradients

    def small_gpu(w, bufs, batch):
        if w.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(w, bufs, batch)

    stacked.gradients = small_gpu
    cfg = SGDConfig(0.05)
    plans = [torch.arange(20 * i, 20 * i + 20) for i in range(4)]

    def jobs():
        return [SGDJob(flat.params.clone(), seq.batches(ix, 8, 3, np.random.default_rng(i)), cfg)
                for i, ix in enumerate(plans)]

    got = jobs()
    stacked.sgd_many(got)
    assert logged == ["cohort: CUDA out of memory with 4 clients stacked; retrying with 2"]
    stacked.gradients = real
    want = jobs()
    stacked.sgd_many(want)
    for a, b in zip(got, want, strict=True):
        assert a.error is None and a.result[1] == 3
        assert torch.equal(a.result[0], b.result[0])
