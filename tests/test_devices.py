"""Every algorithm keeps its tensors on the run's device, checked without a GPU.

The rounds run with torch's default device set to `meta` (on the engine's thread and on every
client's, also the stacked executor's client threads): a tensor that algorithm or engine code
creates without naming a device then lands on `meta`, and the first operation that mixes it
with the run's CPU tensors fails. On a GPU the same tensor would have been created on the CPU
and failed (or silently moved) against the CUDA tensors of the run.
"""

from __future__ import annotations

import pytest
import torch
from registered import explained
from test_executors import BASE, CASES, WRITTEN

from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of

EXTRA = {
    "fedavg-nwda": {"algorithm": "fedavg", "algorithm_params": {"nwda": True}},
    "fednnnn-layer": {"algorithm": "fednnnn", "algorithm_params": {"scope": "layer"}},
    "grab-crop": {"algorithm": "grab-fedavg", "client_steps": [], "local_steps": 4,
                  "algorithm_params": {"alpha": 0.5}},
    "fedveca-sampled": {**CASES["fedveca"], "algorithm": "fedveca",
                        "algorithm_params": {"grad_batches": 2}},
    "fednova-momentum": {"algorithm": "fednova", "algorithm_params": {"server_momentum": 0.5}},
}
"""Options with code paths of their own."""


def _on_meta(fn):
    def wrapped(*args, **kwargs):
        with torch.device("meta"):
            return fn(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("executor", ["sequential", "stacked"])
@pytest.mark.parametrize("case", sorted(CASES) + sorted(EXTRA))
def test_no_tensor_is_created_off_the_run_device(case, executor):
    settings = EXTRA.get(case) or {"algorithm": case, **CASES[case]}
    values = {**BASE, **settings, "executor": executor, "rounds": 1}
    lines: list[str] = []
    with explained(case, "tests/test_executors.py", {**WRITTEN, **EXTRA}):
        sim = assemble(config_of(values), log=lines.append)
        sim.parts.runner = _on_meta(sim.parts.runner)
        sim.side.algorithm.init = _on_meta(sim.side.algorithm.init)
        sim.side.clients.run_client = _on_meta(sim.side.clients.run_client)
        sim.run()
    assert lines == []  # no client failed (a failure is logged and the round goes on)
