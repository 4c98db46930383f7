"""Models: parameter counts against the papers, forward shapes, the squared SVM's loss.

Expected counts are computed from the papers' layer tables with `conv(c_in, c_out, k)` =
`c_out (c_in k² + 1)` and `fc(n_in, n_out)` = `n_out (n_in + 1)`; FedSR states its totals.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS, build_model, num_parameters, objective, predictions
from fedhet.training.flat import FlatModel

MNIST, CIFAR, DIGITS = (1, 28, 28), (3, 32, 32), (64,)


def conv(c_in: int, c_out: int, k: int) -> int:
    return c_out * (c_in * k * k + 1)


def fc(n_in: int, n_out: int) -> int:
    return n_out * (n_in + 1)


def bn(c: int) -> int:
    return 2 * c


def model(name: str, shape: tuple[int, ...], classes: int = 10, **params) -> nn.Module:
    return build_model(name, shape, classes, MODELS.params(name, params))


def first_fc_inputs(m: nn.Module) -> int:
    return next(layer for layer in m.modules() if isinstance(layer, nn.Linear)).in_features


def test_fedsr_mlp_has_199210_parameters():
    assert num_parameters(model("mlp", MNIST)) == 199_210


def test_fedsr_cnn_has_128420_parameters_on_cifar100():
    """FedSR §IV: "3 convolutional layers and two fully connected layers, with 128420 parameters"."""
    m = model("cnn-cifar", CIFAR, classes=100)
    assert num_parameters(m) == 128_420
    expected = conv(3, 32, 3) + conv(32, 64, 3) + conv(64, 64, 3) + fc(1024, 64) + fc(64, 100)
    assert expected == 128_420
    assert sum(isinstance(x, nn.Conv2d) for x in m.modules()) == 3
    assert sum(isinstance(x, nn.Linear) for x in m.modules()) == 2


def test_fedveca_cnn_matches_the_papers_layers():
    """FedVeca §IV-A2: two 5×5×32 conv, two 2×2 max-pool, fc 1568×256, fc 256×10."""
    m = model("cnn-mnist", MNIST)
    assert first_fc_inputs(m) == 1568
    assert num_parameters(m) == conv(1, 32, 5) + conv(32, 32, 5) + fc(1568, 256) + fc(256, 10)


def test_fednnnn_mnist_cnn_matches_table_3():
    m = model("cnn-fednnnn-mnist", MNIST)
    assert first_fc_inputs(m) == 50 * 4 * 4
    assert num_parameters(m) == conv(1, 20, 5) + conv(20, 50, 5) + fc(800, 500) + fc(500, 10)


def test_fednnnn_cifar_cnn_matches_table_4():
    m = model("cnn-fednnnn-cifar", CIFAR)
    assert first_fc_inputs(m) == 128 * 4 * 4
    convs = [(3, 32), (32, 32), (32, 64), (64, 64), (64, 128), (128, 128)]
    expected = sum(conv(a, b, 3) + bn(b) for a, b in convs) + fc(2048, 382) + fc(382, 192) + fc(192, 10)
    assert num_parameters(m) == expected
    kinds = {layer.kind for layer in FlatModel(m).layers}
    assert kinds == {"conv", "norm", "fc"}


@pytest.mark.parametrize(
    ("name", "shape", "classes"),
    [
        ("mlp", MNIST, 10), ("mlp", DIGITS, 10), ("logreg", (60,), 10),
        ("cnn-mnist", MNIST, 10), ("cnn-mnist", DIGITS, 10),
        ("cnn-fednnnn-mnist", MNIST, 10), ("cnn-fednnnn-cifar", CIFAR, 10),
        ("cnn-fednnnn-cifar", MNIST, 10), ("cnn-cifar", CIFAR, 10), ("cnn-cifar", MNIST, 10),
        ("cnn-cifar", CIFAR, 100),
    ],
)
def test_forward_shapes(name, shape, classes):
    m = model(name, shape, classes)
    out = m(torch.randn(5, *shape))
    assert out.shape == (5, classes)
    y = torch.randint(0, classes, (5,))
    loss = objective(m, out, y)
    loss.backward()
    assert torch.isfinite(loss)
    assert predictions(m, out).shape == (5,)


@pytest.mark.parametrize(
    ("name", "shape"),
    [("cnn-mnist", (60,)), ("cnn-cifar", DIGITS), ("cnn-fednnnn-mnist", DIGITS), ("cnn-cifar", (5, 5, 5, 5))],
)
def test_convolutional_models_reject_unsuitable_inputs(name, shape):
    with pytest.raises(FedhetError, match=name):
        model(name, shape)


# -- squared SVM ------------------------------------------------------------------------------
def svm_with(w: list[float], b: float, lam: float = 0.1) -> nn.Module:
    m = model("svm", (len(w),), classes=2, lam=lam)
    with torch.no_grad():
        m.fc.weight.copy_(torch.tensor([w]))
        m.fc.bias.fill_(b)
    return m


def test_svm_loss_matches_hand_computation():
    """w = (1, −2), b = 0.5, λ = 0.1; scores (−0.5, −1.5, 2.5, 1.0) for labels (1, 0, 1, 0):
    hinge terms max(0, 1 − y s) = (1.5, 0, 0, 2), so the loss is
    (0.1/2)·5 + (1/(2·4))·(2.25 + 4) = 0.25 + 0.78125 = 1.03125."""
    m = svm_with([1.0, -2.0], 0.5)
    x = torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, 0.0], [0.5, 0.0]])
    y = torch.tensor([1, 0, 1, 0])
    score = m(x)
    assert torch.allclose(score, torch.tensor([-0.5, -1.5, 2.5, 1.0]))
    assert objective(m, score, y).item() == pytest.approx(1.03125)
    assert predictions(m, score).tolist() == [0, 0, 1, 1]


def test_svm_gradient_matches_hand_computation():
    """∂/∂w = λw + (1/|B|) Σ −y max(0, 1 − y s) x; ∂/∂b = (1/|B|) Σ −y max(0, 1 − y s)."""
    m = svm_with([1.0, -2.0], 0.5)
    x = torch.tensor([[1.0, 1.0], [0.5, 0.0]])
    y = torch.tensor([1, 0])
    objective(m, m(x), y).backward()
    # sample 1: y = +1, s = −0.5, hinge 1.5 → −1.5·(1, 1); sample 2: y = −1, s = 1, hinge 2 → +2·(0.5, 0)
    grad_w = torch.tensor([0.1, -0.2]) + (torch.tensor([-1.5, -1.5]) + torch.tensor([1.0, 0.0])) / 2
    assert torch.allclose(m.fc.weight.grad[0], grad_w)
    assert m.fc.bias.grad.item() == pytest.approx((-1.5 + 2.0) / 2)


def test_svm_needs_binary_labels_and_valid_lambda():
    with pytest.raises(FedhetError, match="binary"):
        model("svm", (5,), classes=10)
    with pytest.raises(FedhetError, match="lam"):
        MODELS.params("svm", {"lam": -1})


def test_svm_learns_even_odd_digits_through_the_engine():
    from fedhet.data.base import Dataset
    from fedhet.data.registry import DATASETS
    from fedhet.engine.assembly import assemble
    from fedhet.engine.config import config_of

    digits = DATASETS.get("digits").factory(DATASETS.params("digits"), None)
    binary = Dataset(
        "digits-even-odd", digits.x_train, (digits.y_train % 2 == 0).long(), digits.x_test,
        (digits.y_test % 2 == 0).long(), num_classes=2,
    )
    cfg = config_of({
        "algorithm": "fedavg", "dataset": "digits", "partition": "iid", "model": "svm",
        "clients": 4, "rounds": 10, "lr": 0.1, "local_epochs": 1,
    })
    summary = assemble(cfg, store=None, data=binary, log=lambda _: None).run()
    assert summary["final_accuracy"] > 0.8
