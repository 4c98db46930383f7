"""Convolutional models run channels-last (their `channels_last` registry trait) and train the
trajectories of the channels-first path to float rounding; evaluation is exact whatever its
batch and memory format."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fedhet.data.base import Dataset
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.models.cnn import cnn_cifar, cnn_fednnnn_mnist
from fedhet.models.registry import MODELS, build_model
from fedhet.registry import NoParams
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer, SGDConfig, evaluate


def _images(shape: tuple[int, ...], n: int = 96, seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    return Dataset("random", torch.rand(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g),
                   torch.rand(40, *shape, generator=g), torch.randint(0, 10, (40,), generator=g), 10)


def test_the_paper_cnns_declare_channels_last():
    for name in ("cnn-mnist", "cnn-fednnnn-mnist", "cnn-fednnnn-cifar", "cnn-cifar"):
        assert MODELS.get(name).trait("channels_last", False) is True, name
    for name in ("mlp", "logreg"):
        assert not MODELS.get(name).trait("channels_last", False), name


@pytest.mark.parametrize("shape", [(28, 28), (3, 32, 32)])
def test_convolutions_see_channels_last_inputs(shape):
    """Every 2-D convolution's input is channels-last (one channel included), the flat vector's
    layout is the module's own, and the forward equals the channels-first one to rounding."""
    name = "cnn-fednnnn-mnist" if len(shape) == 2 else "cnn-cifar"
    torch.manual_seed(0)
    plain = build_model(name, shape, 10, NoParams())
    torch.manual_seed(0)
    flat = FlatModel(build_model(name, shape, 10, NoParams()), channels_last=True)
    seen = []
    for m in flat.module.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    x = torch.rand(5, *shape)
    out = flat.module(x)
    assert seen and all(t.stride(1) == 1 for t in seen)  # channels innermost
    assert all(t.is_contiguous(memory_format=torch.channels_last) for t in seen)
    assert flat.params.equal(torch.cat([p.detach().flatten() for p in plain.parameters()]))
    assert torch.allclose(out, plain(x), rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_the_stacked_programs_convolutions_see_channels_last_inputs(shape, rows, monkeypatch):
    """The stacked program of a channels-last model hands every convolution channels-last
    strides, also where one input channel and one row make the first layer's input contiguous
    in both orders (the convolution picks its output's order from them, and the layers after it
    would run channels-first); its gradients stay those of the model."""
    from fedhet.training.program import StackedProgram

    name = "cnn-fednnnn-mnist" if shape[0] == 1 else "cnn-cifar"
    torch.manual_seed(0)
    flat = FlatModel(build_model(name, shape, 10, NoParams()), channels_last=True)
    program = StackedProgram.of(flat, shape)
    assert program is not None
    seen: list[torch.Tensor] = []
    conv2d = F.conv2d

    def spy(x, *args, **kwargs):
        seen.append(x)
        return conv2d(x, *args, **kwargs)

    monkeypatch.setattr(F, "conv2d", spy)
    x, y = torch.rand(20, *shape), torch.randint(0, 10, (20,))
    w = flat.params.unsqueeze(0).repeat(rows, 1)
    batch = torch.arange(rows * 4).reshape(rows, 4)
    g, _ = program.gradients(w, x, y, batch)
    assert len(seen) >= 2 and all(t.stride(1) == 1 for t in seen)  # channels innermost
    monkeypatch.undo()
    ref, _ = LocalTrainer(flat, x, y).gradient(batch[0])
    assert torch.allclose(g[0], ref, rtol=1e-4, atol=1e-6)

def _run(model_factory, data: Dataset, executor: str = "sequential", **extra):
    cfg = config_of({"algorithm": "fedavg", "clients": 4, "rounds": 3, "batch_size": 12,
                     "local_steps": 3, "lr": 0.05, "partition": "iid", "momentum": 0.5,
                     "executor": executor, "train_loss": True, **extra})
    rows = []
    sim = assemble(cfg, data=data, model=model_factory, log=lambda _: None,
                   callbacks=[lambda row: rows.append(dict(row))])
    sim.run()
    return sim, rows


def _unregistered(factory):
    """The same model, handed in as an unregistered factory: no trait, channels-first."""
    return lambda shape, k, p: factory(shape, k, p)


@pytest.mark.parametrize("factory,shape,executor", [
    (cnn_fednnnn_mnist, (28, 28), "sequential"),
    (cnn_cifar, (3, 32, 32), "sequential"),
    (cnn_fednnnn_mnist, (28, 28), "stacked"),
])
def test_trajectory_equals_the_channels_first_path(factory, shape, executor):
    """A few rounds of a CNN run: every metric within 1e-5 relative of the channels-first run,
    and the final global model too."""
    data = _images(shape)
    sim_cl, rows_cl = _run(factory, data, executor)
    sim_cf, rows_cf = _run(_unregistered(factory), data, executor)
    assert sim_cl.side.model.channels_last and not sim_cf.side.model.channels_last
    assert len(rows_cl) == len(rows_cf) == 3
    for a, b in zip(rows_cl, rows_cf, strict=True):
        for key in ("test_loss", "test_accuracy", "train_loss", "train_accuracy"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    w_cl, w_cf = sim_cl.final_state.w, sim_cf.final_state.w
    assert float((w_cl - w_cf).norm() / w_cf.norm()) < 1e-5


def test_evaluate_is_exact_for_any_batch_and_format():
    """`evaluate` = the mean cross-entropy and accuracy over all samples, computed by hand."""
    torch.manual_seed(0)
    data = _images((3, 32, 32), n=10)
    x, y = data.x_test, data.y_test
    plain = build_model("cnn-cifar", (3, 32, 32), 10, NoParams())
    with torch.no_grad():
        out = plain(x)
    want_loss = float(F.cross_entropy(out, y, reduction="sum")) / len(y)
    want_acc = float((out.argmax(1) == y).float().mean())
    torch.manual_seed(0)
    for cl in (False, True):
        torch.manual_seed(0)
        flat = FlatModel(build_model("cnn-cifar", (3, 32, 32), 10, NoParams()), channels_last=cl)
        for batch in (7, 40, None):
            loss, acc = evaluate(flat, flat.params, None, x, y, batch)
            assert loss == pytest.approx(want_loss, rel=1e-5) and acc == pytest.approx(want_acc)
    assert flat.module.training  # left in training mode


def test_local_sgd_is_unchanged_by_memory_format_up_to_rounding():
    """`LocalTrainer.sgd` on one client, channels-last vs channels-first: same steps, loss and
    weights to float rounding (the flat vector keeps the module's layout)."""
    data = _images((28, 28))
    results = []
    for cl in (False, True):
        torch.manual_seed(0)
        flat = FlatModel(build_model("cnn-fednnnn-mnist", (28, 28), 10, NoParams()), channels_last=cl)
        trainer = LocalTrainer(flat, data.x_train, data.y_train)
        batches = trainer.batches(torch.arange(60), 20, 4, np.random.default_rng(0))
        results.append(trainer.sgd(flat.params.clone(), batches, SGDConfig(0.1, 0.9)))
    (w0, s0, l0), (w1, s1, l1) = results
    assert s0 == s1 == 4 and math.isclose(l0, l1, rel_tol=1e-5)
    assert float((w1 - w0).norm() / w0.norm()) < 1e-5
