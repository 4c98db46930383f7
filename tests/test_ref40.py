"""The setup of the papers' reference [40]: the squared SVM without a bias
and from zero weights (`model.bias=false`, `model.init=zeros`), on the closed-form stacked path
and through the engine."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.errors import FedhetError
from fedhet.models.registry import MODELS, build_model
from fedhet.rundir.store import RunStore, read_metrics
from fedhet.training.flat import FlatModel


def svm(**params) -> torch.nn.Module:
    return build_model("svm", (12,), 2, MODELS.params("svm", params))


def test_no_bias_and_zero_init():
    m = svm(bias=False, init="zeros")
    assert m.fc.bias is None and FlatModel(m).dim == 12
    assert float(FlatModel(m).params.abs().sum()) == 0.0
    torch.manual_seed(0)
    assert float(FlatModel(svm()).params.abs().sum()) > 0  # default: PyTorch's init, with bias
    x = torch.tensor([[1.0] * 12, [-2.0] * 12])
    # w = 0: every score is 0, so every hinge term is 1 and the loss is 1/2 (λ‖w‖² = 0)
    with torch.no_grad():
        assert float(m.loss(m(x), torch.tensor([1, 0]))) == pytest.approx(0.5)
    with pytest.raises(FedhetError, match="init"):
        MODELS.params("svm", {"init": "ones"})


def even_odd_digits():
    from fedhet.data.base import Dataset
    from fedhet.data.registry import DATASETS

    d = DATASETS.get("digits").factory(DATASETS.params("digits"), None)
    return Dataset("digits-even-odd", d.x_train, (d.y_train % 2 == 0).long(), d.x_test,
                   (d.y_test % 2 == 0).long(), num_classes=2)


@pytest.mark.parametrize("algorithm", ["fedavg", "bherd"])
def test_ref40_svm_learns_on_both_executors_alike(algorithm, tmp_path):
    """No bias, zero start, `B = 100`, `η = 0.01` scaled up for 8 rounds of digits: the run learns,
    the stacked executor (closed form without a bias) matches the sequential one, and the
    training loss over the whole training set is logged (`train_loss`)."""
    data = even_odd_digits()
    settings = {"algorithm": algorithm, "dataset": "digits", "partition": "half-iid",
                "model": "svm", "model.bias": False, "model.init": "zeros", "clients": 3,
                "rounds": 8, "lr": 0.05, "batch_size": 100, "train_loss": True}
    out = {}
    for executor in ("stacked", "sequential"):
        sim = assemble(config_of({**settings, "executor": executor}),
                         store=RunStore(tmp_path / executor), data=data, log=lambda _: None)
        summary = sim.run()
        out[executor] = (sim.final_state.w, summary)
    (w_b, s_b), (w_s, _) = out["stacked"], out["sequential"]
    assert w_b.shape == (64,)
    assert torch.allclose(w_b, w_s, rtol=1e-4, atol=1e-5)
    assert s_b["final_accuracy"] > 0.75
    rows = read_metrics(tmp_path / "stacked" / "metrics.csv")
    train = [r["train_loss"] for r in rows]
    assert len(train) == 9 and all(math.isfinite(v) for v in train) and train[-1] < train[0]
