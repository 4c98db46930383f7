"""The stacked program (`fedhet.training.program`): a model's forward as a few stacked
operations gives every row the gradient that row's own model gives alone, and it is used only
where it is the model's forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.models.registry import MODELS, build_model
from fedhet.models.sequence import ImageView
from fedhet.training.cohort import CohortTrainer, SGDJob
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer
from fedhet.training.program import StackedProgram, layer_sequence
from fedhet.training.steps import Proximal, SGDConfig

SHAPES = {"mlp": (1, 28, 28), "cnn-mnist": (1, 28, 28), "cnn-fednnnn-mnist": (1, 28, 28),
          "cnn-cifar": (3, 32, 32)}


def _model(name: str, shape: tuple[int, ...], seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    module = build_model(name, shape, 10, MODELS.get(name).params())
    return FlatModel(module, channels_last=bool(MODELS.get(name).trait("channels_last")))


def _data(shape: tuple[int, ...], n: int = 64, flat: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(n, *shape, generator=g)
    return (x.reshape(n, -1) if flat else x), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("flat_input", [False, True])
def test_each_row_gets_its_own_models_gradient(name, flat_input):
    """Rows with different weights and batches: row r's gradient and loss equal the plain
    autograd gradient of model r alone on batch r (`LocalTrainer.gradient`)."""
    shape = SHAPES[name]
    model = _model(name, shape)
    x, y = _data(shape, flat=flat_input)
    program = StackedProgram.of(model, tuple(x.shape[1:]))
    assert program is not None
    rows = 3
    w = torch.stack([_model(name, shape, seed=s).params for s in range(rows)])
    batch = torch.stack([torch.randperm(len(y), generator=torch.Generator().manual_seed(s))[:5]
                         for s in range(rows)])
    g, losses = program.gradients(w, x, y, batch)
    alone = LocalTrainer(model, x, y)
    for r in range(rows):
        model.params.copy_(w[r])
        ref, loss = alone.gradient(batch[r])
        assert torch.allclose(g[r], ref, rtol=1e-4, atol=1e-6), r
        assert losses[r].item() == pytest.approx(loss, rel=1e-5)


def test_the_sequence_is_read_from_the_model():
    mlp = build_model("mlp", (64,), 10, MODELS.get("mlp").params())
    kinds = [type(s).__name__ for s in layer_sequence(mlp)]
    assert kinds == ["Flatten", "Linear", "ReLU", "Linear", "ReLU", "Linear"]
    cnn = build_model("cnn-mnist", (64,), 10, MODELS.get("cnn-mnist").params())
    steps = layer_sequence(cnn)
    assert steps[0] == ImageView((1, 8, 8))
    assert [type(s).__name__ for s in steps[1:4]] == ["Conv2d", "ReLU", "MaxPool2d"]


class Lying(nn.Module):
    """Lists a sequence its forward does not follow (it doubles the logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return 2 * self.fc(x)

    def stacked_layers(self):
        return [self.fc]


class Unlisted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x)


def test_only_a_sequence_that_is_the_forward_becomes_a_program():
    x = (8,)
    assert StackedProgram.of(FlatModel(nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 3))), x)
    assert StackedProgram.of(FlatModel(Lying()), x) is None  # the probe disagrees
    assert StackedProgram.of(FlatModel(Unlisted()), x) is None  # no sequence to read
    assert StackedProgram.of(FlatModel(nn.Sequential(nn.Linear(8, 4), nn.Softmax(1))), x) is None
    bn = build_model("cnn-fednnnn-cifar", (3, 32, 32), 10, MODELS.get("cnn-fednnnn-cifar").params())
    assert StackedProgram.of(FlatModel(bn), (3, 32, 32)) is None  # BatchNorm: the vmap path


@pytest.mark.parametrize(("name", "shape"), [("moon-mlp", (64,)), ("moon-cnn", (1, 20, 20))])
def test_moon_models_tap_z_after_the_projection(name, shape):
    """MOON's models are programs whose tap is the projection's output: the tapped `(R, 256, B)`
    equals `forward(x, with_z=True)`'s `z` of each row's model."""
    model = _model(name, shape)
    program = StackedProgram.of(model, shape)
    assert program is not None and program.tap is not None
    x = torch.rand(4, *shape, generator=torch.Generator().manual_seed(2))
    w = torch.stack([_model(name, shape, seed=s).params for s in range(2)])
    samples = x.unsqueeze(1).expand(4, 2, *shape) if program.image_input \
        else x.unsqueeze(0).expand(2, *x.shape)
    logits, z = program.forward_tapped(program.leaves(w), samples)
    assert z is not None
    for r in range(2):
        model.params.copy_(w[r])
        out, z_ref = model.module(x, with_z=True)
        assert torch.allclose(z[r].t(), z_ref, rtol=1e-4, atol=1e-5)
        assert torch.allclose(logits[r].t(), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("name", "shape"), [("moon-mlp", (64,)), ("moon-cnn", (1, 20, 20))])
def test_moons_objective_on_the_program_equals_vmap(name, shape):
    """MOON's `CE + μ ℓ_con` with each row's own frozen global and previous models: the
    program's gradients and losses equal the vmap path's (the loss's per-client form)."""
    from fedhet.algorithms.moon import ContrastiveLoss

    model = _model(name, shape)
    x, y = _data(shape, n=48)
    cohort = CohortTrainer(model, x, y, log=lambda s: None)
    assert cohort.program is not None
    rows = 3
    w = torch.stack([_model(name, shape, seed=s).params for s in range(rows)])
    glob = torch.stack([_model(name, shape, seed=10 + s).params for s in range(rows)])
    prev = torch.stack([_model(name, shape, seed=20 + s).params for s in range(rows)])
    loss = ContrastiveLoss(model.layers, glob[0], prev[0], mu=2.0, temperature=0.5)
    assert cohort.program.runs(loss)
    batch = torch.stack([torch.randperm(48, generator=torch.Generator().manual_seed(s))[:6]
                         for s in range(rows)])
    bufs = torch.zeros(rows, 0)
    g_program, l_program, _ = cohort.gradients(w, bufs, batch, loss, (glob, prev))
    program, cohort.program = cohort.program, None  # the general path, same inputs
    g_vmap, l_vmap, _ = cohort.gradients(w, bufs, batch, loss, (glob, prev))
    cohort.program = program
    assert torch.allclose(g_program, g_vmap, rtol=1e-4, atol=1e-6)
    assert torch.allclose(l_program, l_vmap, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["mlp", "cnn-mnist"])
def test_stacked_sgd_is_the_same_on_the_program_and_on_vmap(name):
    """`sgd_many` with unequal τ, momentum, weight decay and a proximal term gives the same
    models, step counts and mean losses through the program as through `vmap`."""
    shape = (1, 12, 12)
    x, y = _data(shape, n=96)
    results = {}
    for path in ("program", "vmap"):
        model = _model(name, shape)
        cohort = CohortTrainer(model, x, y, log=lambda _: None)
        assert cohort.program is not None
        if path == "vmap":
            cohort.program = None
        jobs = []
        for c, steps in enumerate((3, 5, 1)):
            rng = np.random.default_rng(c)
            batches = iter([torch.from_numpy(rng.integers(0, len(y), 8)) for _ in range(steps)])
            cfg = SGDConfig(lr=0.05, momentum=0.5, weight_decay=1e-3)
            jobs.append(SGDJob(model.params.clone(), batches, cfg,
                               (Proximal(0.1, model.params.clone()),)))
        cohort.sgd_many(jobs)
        results[path] = [j.result for j in jobs]
        assert all(j.error is None for j in jobs)
    for (wp, tp, lp), (wv, tv, lv) in zip(results["program"], results["vmap"], strict=True):
        assert tp == tv
        assert torch.allclose(wp, wv, rtol=1e-5, atol=1e-6)
        assert lp == pytest.approx(lv, rel=1e-5)


def test_bf16_passes_stay_close_to_fp32():
    """Under `precision = "bf16"` the program's passes run in bfloat16 (autocast) and its
    gradients come back float32, near the float32 ones."""
    shape = SHAPES["cnn-mnist"]
    x, y = _data(shape)
    batch = torch.arange(8).reshape(2, 4)
    grads = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        module = build_model("cnn-mnist", shape, 10, MODELS.get("cnn-mnist").params())
        model = FlatModel(module, channels_last=True, precision=precision)
        program = StackedProgram.of(model, shape)
        w = model.params.unsqueeze(0).repeat(2, 1)
        g, _ = program.gradients(w, x, y, batch)
        assert g.dtype == torch.float32
        grads[precision] = g
    cos = torch.nn.functional.cosine_similarity(grads["fp32"], grads["bf16"], dim=1)
    assert bool((cos > 0.99).all()) and not torch.equal(grads["fp32"], grads["bf16"])


@pytest.mark.parametrize("name", ["mlp", "cnn-mnist"])
def test_stacked_evaluation_through_the_program_scores_every_model_as_alone(name):
    """`evaluate_many` on a program model: each model's loss and accuracy as `evaluate` gives
    them one by one, the models differing, jobs on two datasets."""
    from fedhet.training.cohort import EvalJob
    from fedhet.training.local import evaluate

    shape = (1, 12, 12)
    model = _model(name, shape)
    data = [_data(shape, n=40), _data(shape, n=40, flat=True)]
    cohort = CohortTrainer(model, *data[0], log=lambda _: None)
    assert cohort.program is not None
    torch.manual_seed(3)
    jobs = [EvalJob(model.params + 0.1 * torch.randn(model.dim), None, *data[i % 2]) for i in range(4)]
    alone = [evaluate(model, j.params, None, j.x, j.y) for j in jobs]
    assert len({round(loss, 6) for loss, _ in alone}) == 4
    cohort.evaluate_many(jobs)
    for job, (loss, acc) in zip(jobs, alone, strict=True):
        assert job.error is None
        assert job.result[0] == pytest.approx(loss, rel=1e-5) and job.result[1] == acc
