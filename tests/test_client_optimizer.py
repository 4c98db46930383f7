"""`client_optimizer = sgd | adam | adamw`: the local step against torch.optim, a stack equal to
its rows, the algorithms that refuse it in one line, and runs that learn.

Sequential = stacked for FedAvg, FedProx, FedAdam, MOON and FedSR with Adam or AdamW clients,
and two workers = one, are cases of tests/test_executors.py and tests/test_workers.py.
"""

from __future__ import annotations

import pytest
import torch
from cli_errors import one_error_line

from fedhet.cli import main
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS, build_model, objective
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig
from fedhet.training.steps import LocalStep, Proximal


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", (20,), 5, MODELS.get("mlp").params(hidden=16))


@pytest.mark.parametrize(("optimizer", "reference"), [
    ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW),
])
def test_local_steps_equal_torch_optim(optimizer, reference):
    """Six local steps on the same model and batches: fedhet's chain and torch's optimizer
    (coupled weight decay for Adam, decoupled for AdamW; non-default β, ε)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 20, generator=gen), torch.randint(0, 5, (96,), generator=gen)
    batches = [torch.randperm(96, generator=gen)[:16] for _ in range(6)]
    flat = FlatModel(_mlp(1))
    cfg = SGDConfig(0.01, 0.0, 0.05, optimizer, (0.8, 0.95), 1e-6)
    w, steps, _ = LocalTrainer(flat, x, y).sgd(flat.params.clone(), iter(batches), cfg)
    module = _mlp(1)
    opt = reference(module.parameters(), lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)
    for b in batches:
        opt.zero_grad()
        objective(module, module(x[b]), y[b]).backward()
        opt.step()
    expected = torch.cat([p.detach().flatten() for p in module.parameters()])
    assert steps == 6
    assert torch.allclose(w, expected, rtol=1e-5, atol=1e-7)
    sgd, _, _ = LocalTrainer(flat, x, y).sgd(flat.params.clone(), iter(batches), SGDConfig(0.01))
    assert (sgd - expected).abs().max() > 1e-3  # Adam's steps are not SGD's


def _alone(chain: LocalStep, w: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    w = w.clone()
    state = chain.init(w)
    for t, g in enumerate(grads):
        chain.update(w, chain.gradient(g.clone(), w, t), state)
    return w


def _chains(anchor: torch.Tensor) -> list[LocalStep]:
    """Adam, AdamW and SGD rows with their own coefficients (a stack of runs that differ)."""
    return [
        LocalStep.of(SGDConfig(0.01, 0.0, 1e-3, "adam", (0.9, 0.999), 1e-8)),
        LocalStep.of(SGDConfig(0.02, 0.0, 0.1, "adamw", (0.8, 0.99), 1e-6), (Proximal(0.1, anchor),)),
        LocalStep.of(SGDConfig(0.1, 0.5, 1e-3)),
        LocalStep.of(SGDConfig(0.01, 0.0, 1e-3, "adam", (0.9, 0.999), 1e-8)),
        LocalStep.of(SGDConfig(0.05)),
    ]


def test_a_stack_of_adam_and_sgd_rows_equals_each_row_alone():
    gen = torch.Generator().manual_seed(4)
    w0, anchor = torch.randn(5, 37, generator=gen), torch.randn(37, generator=gen)
    grads = [torch.randn(5, 37, generator=gen) for _ in range(5)]
    stacked = _alone(LocalStep.stack(_chains(anchor)), w0, grads)
    for r, chain in enumerate(_chains(anchor)):
        assert torch.equal(stacked[r], _alone(chain, w0[r], [g[r] for g in grads])), r


def test_rows_leaving_a_stack_keep_their_moments_and_step_count():
    """`select` mid-run (clients whose batches ran out): the rows that stay go on with their own
    `m`, `v` and `t` (the bias corrections), equal to running alone."""
    gen = torch.Generator().manual_seed(5)
    w0, anchor = torch.randn(5, 37, generator=gen), torch.randn(37, generator=gen)
    grads = [torch.randn(5, 37, generator=gen) for _ in range(6)]
    chain = LocalStep.stack(_chains(anchor))
    w, state, rows = w0.clone(), chain.init(w0), [0, 1, 2, 3, 4]
    for t, g in enumerate(grads):
        if t == 3:
            rows = [1, 3]
            w, state, chain = w[[1, 3]], state[[1, 3]], chain.select([1, 3])
        chain.update(w, chain.gradient(g[rows].clone(), w, t), state)
    for k, r in enumerate(rows):
        alone = _alone(_chains(anchor)[r], w0[r], [g[r] for g in grads])
        assert torch.equal(w[k], alone), r


SMALL = ["-d", "digits", "-n", "4", "-r", "1", "--set", "client_optimizer=adam"]


@pytest.mark.parametrize(("algorithm", "extra", "why"), [
    ("fednova", [], "normaliser a_i"),
    ("fedveca", [], "plain local SGD (eq. 1)"),
    ("bherd", [], "herds the raw mini-batch gradients"),
    ("bherd-fednova", [], "herds the raw mini-batch gradients"),
    ("bherd-scaffold", [], "herds the raw mini-batch gradients"),
    ("scaffold", [], "control variates"),
    ("grab-fedavg", ["--set", "algorithm.alpha=0.5"], "kept raw gradients"),
])
def test_algorithms_that_assume_sgd_refuse_adam_in_one_line(capsys, tmp_path, algorithm, extra, why):
    out = tmp_path / "run"
    line = one_error_line(capsys, ["run", "-a", algorithm, *SMALL, *extra, "--out", str(out)])
    assert "client_optimizer=sgd" in line and "adam" in line and why in line, line
    assert not out.exists()


def test_adam_with_sgd_momentum_is_refused_and_grab_at_alpha_1_takes_adam(capsys, tmp_path):
    out = tmp_path / "run"
    line = one_error_line(capsys, ["run", *SMALL, "--set", "momentum=0.9", "--out", str(out)])
    assert "set momentum=0" in line and "adam_beta1" in line
    line = one_error_line(capsys, ["run", "-d", "digits", "--set", "client_optimizer=rmsprop",
                                   "--out", str(out)])
    assert "sgd, adam, adamw" in line
    assert not out.exists()
    with pytest.raises(FedhetError, match="adam_beta2"):
        config_of({"client_optimizer": "adam", "adam_beta2": 1.0})
    assemble(config_of({"algorithm": "grab-fedavg", "client_optimizer": "adam"}), log=lambda _: None)


@pytest.mark.parametrize(("optimizer", "extra"), [("adam", {}), ("adamw", {"weight_decay": 0.01})])
def test_adam_clients_learn_digits(optimizer, extra):
    """10 clients, Dirichlet α = 0.5, 10 rounds of FedAvg: SGD at η = 0.05 reaches ~0.3
    (measured); Adam clients at η = 0.003 well above it."""
    settings = {"dataset": "digits", "clients": 10, "rounds": 10, "seed": 0,
                "partition.alpha": 0.5, "executor": "sequential", "workers": 1}
    sgd = assemble(config_of(settings), log=lambda _: None).run()["final_accuracy"]
    adam = assemble(config_of({**settings, "client_optimizer": optimizer, "lr": 0.003, **extra}),
                    log=lambda _: None).run()["final_accuracy"]
    assert adam > 0.8 and adam > sgd + 0.3, (adam, sgd)


def test_fedhet_list_shows_the_client_optimizer_and_server_optimizer_settings(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for text in ("client_optimizer=sgd", "adam_beta1=0.9", "adam_beta2=0.999", "adam_eps=1e-08",
                 "fedadam", "fedyogi", "fedadagrad", "server_lr=0.1, beta1=0.9, beta2=0.99"):
        assert text in out, text


def test_a_batch_of_runs_with_sgd_adam_and_adamw_clients_steps_together(tmp_path):
    """A grid over `client_optimizer` (and a FedAdam server) as one stack of runs: SGD rows with
    momentum and Adam rows in one stack, each run as it is alone (tests/test_stacked_runs.py)."""
    from test_stacked_runs import _alone_and_together, same

    variants = [
        {"algorithm": "fedavg", "momentum": 0.5},
        {"algorithm": "fedavg", "client_optimizer": "adam", "lr": 0.01},
        {"algorithm": "fedprox", "client_optimizer": "adamw", "lr": 0.01, "weight_decay": 0.05},
        {"algorithm": "fedadam", "client_optimizer": "adam", "lr": 0.01,
         "algorithm.server_lr": 0.01},
    ]
    alone, together, outcomes = _alone_and_together(tmp_path, [{**v, "seed": 4} for v in variants])
    assert all(o["finished"] for o in outcomes)
    assert same(together, alone)
    assert len({tuple(c) for c in alone}) == 4


def test_the_testing_kit_builds_the_refusal_too():
    """A user's unit test of an algorithm meets the same line (`fedhet.testing.run_info`)."""
    from fedhet import testing

    with pytest.raises(FedhetError, match="scaffold needs client_optimizer=sgd, got adamw"):
        testing.make("scaffold", run=testing.run_info(dim=3, client_optimizer="adamw"))
    testing.make("fedprox", run=testing.run_info(dim=3, client_optimizer="adamw"))
