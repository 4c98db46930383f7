"""`precision`: fp32 is today's arithmetic, bf16 runs the local passes under autocast while
every stored vector stays float32, tf32 is refused off CUDA (one line)."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.stacked_runs import run_together
from fedhet.errors import FedhetError
from fedhet.models.registry import build_model
from fedhet.registry import NoParams
from fedhet.training.flat import FlatModel
from fedhet.training.local import LocalTrainer
from fedhet.training.precision import passes

BASE = {"dataset": "digits", "model": "mlp", "clients": 4, "rounds": 2, "batch_size": 16,
        "local_steps": 4, "lr": 0.1, "partition": "iid", "device": "cpu", "train_loss": True}


def _sim(**settings):
    return assemble(config_of({**BASE, **settings}), log=lambda _: None)


def _run(**settings):
    rows = []
    sim = assemble(config_of({**BASE, **settings}), log=lambda _: None,
                   callbacks=[lambda row: rows.append(dict(row))])
    sim.run()
    return sim, rows


def test_unknown_precision_is_one_line():
    with pytest.raises(FedhetError, match="precision must be one of fp32, bf16, tf32, got 'fp16'"):
        config_of({"precision": "fp16"})


def test_tf32_off_cuda_is_one_line():
    with pytest.raises(FedhetError, match="precision=tf32 needs a CUDA GPU") as e:
        _sim(precision="tf32")
    assert "\n" not in str(e.value)


def test_fp32_is_the_default_and_adds_nothing():
    sim_default, rows_default = _run(algorithm="scaffold")
    sim_fp32, rows_fp32 = _run(algorithm="scaffold", precision="fp32")
    assert sim_default.side.model.precision == "fp32"
    assert sim_fp32.final_state.w.equal(sim_default.final_state.w)
    for a, b in zip(rows_default, rows_fp32, strict=True):
        assert a["test_loss"] == b["test_loss"] and a["train_loss"] == b["train_loss"]


def test_bf16_forward_runs_in_bfloat16_and_the_gradient_lands_in_float32():
    torch.manual_seed(0)
    flat = FlatModel(build_model("cnn-fednnnn-mnist", (28, 28), 10, NoParams()), precision="bf16")
    seen = []
    flat.module.classifier[0].register_forward_hook(lambda _m, _a, out: seen.append(out.dtype))
    x, y = torch.rand(8, 28, 28), torch.randint(0, 10, (8,))
    g, loss = LocalTrainer(flat, x, y).gradient(torch.arange(8))
    assert seen == [torch.bfloat16]
    assert g.dtype == flat.params.dtype == torch.float32 and g.abs().sum() > 0

    torch.manual_seed(0)
    ref = FlatModel(build_model("cnn-fednnnn-mnist", (28, 28), 10, NoParams()))
    g32, loss32 = LocalTrainer(ref, x, y).gradient(torch.arange(8))
    assert not g.equal(g32)  # the bf16 pass is really another computation ...
    assert float((g - g32).norm() / g32.norm()) < 0.1  # ... of the same gradient
    assert loss == pytest.approx(loss32, rel=0.02)


@pytest.mark.parametrize("algorithm", ["fedavg", "fednova", "scaffold"])
def test_bf16_keeps_weights_and_server_state_in_float32(algorithm):
    """A bf16 run trains (close to fp32, not equal) and every tensor of the server's state,
    SCAFFOLD's control variates included, and every client's state stays float32."""
    sim32, rows32 = _run(algorithm=algorithm)
    sim16, rows16 = _run(algorithm=algorithm, precision="bf16")
    state = sim16.final_state
    tensors = [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
    if algorithm == "scaffold":
        c_i = [sim16.side.clients.state_of(i).c_i for i in range(4)]
        assert len(c_i) == 4 and all(isinstance(c, torch.Tensor) for c in c_i)
        tensors += c_i
    assert tensors and all(t.dtype == torch.float32 for t in tensors)
    assert not state.w.equal(sim32.final_state.w)
    assert float((state.w - sim32.final_state.w).norm() / sim32.final_state.w.norm()) < 0.02
    assert rows16[-1]["test_loss"] == pytest.approx(rows32[-1]["test_loss"], rel=0.05)


def test_bf16_stacked_executor_and_runs_as_a_stack_match_sequential():
    """Both executors and a stack of runs compute the same bf16 trajectories (to bf16 rounding
    of the differently ordered passes)."""
    seq, _ = _run(algorithm="scaffold", precision="bf16", executor="sequential")
    bat, _ = _run(algorithm="scaffold", precision="bf16", executor="stacked")
    assert bat.side.executor.name == "stacked"
    w = seq.final_state.w
    assert float((bat.final_state.w - w).norm() / w.norm()) < 5e-3

    sims = [_sim(algorithm="scaffold", precision="bf16", executor="stacked", seed=s) for s in (0, 1)]
    results = run_together(sims)
    assert not any(isinstance(r, BaseException) for r in results)
    assert float((sims[0].final_state.w - bat.final_state.w).norm() / w.norm()) < 5e-3


def test_runs_of_different_precision_do_not_share_a_cohort():
    from fedhet.engine.stacked_runs import can_share

    sims = [_sim(executor="stacked"), _sim(executor="stacked", precision="bf16"),
            _sim(executor="stacked", seed=3)]
    assert can_share(sims) == [0, 2]


def test_passes_context():
    assert passes("fp32", "cpu")() is not None
    with passes("bf16", "cpu")():
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(FedhetError, match="precision must be one of"):
        passes("int8", "cpu")
