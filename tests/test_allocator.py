"""The allocator settings of a CPU run (`fedhet.training.allocator`): a step's
activations reuse the previous step's pages instead of fresh zero-filled ones, and
`FEDHET_MALLOC` chooses, with one clear line for a wrong value. Each case runs in a process of
its own, as the settings are per process and set once."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parent.parent / "src")

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's mallopt",
)

# Four clients × 10 steps of FedNNNN's MNIST CNN on random data; prints each round's minor
# page faults (the kernel zero-filling a fresh page) and whether the settings were applied.
ROUNDS = r"""
import json, resource, torch
torch.set_num_threads(1)
import fedhet
from fedhet.data.base import Dataset
from fedhet.engine.simulation import sample_clients
from fedhet.training import allocator
g = torch.Generator().manual_seed(0)
x, y = torch.rand(2000, 28, 28, generator=g), torch.randint(0, 10, (2000,), generator=g)
cfg = fedhet.config_of({"algorithm": "fedavg", "model": "cnn-fednnnn-mnist", "partition": "iid",
      "clients": 4, "rounds": 10, "batch_size": 50, "lr": 0.01, "eval_every": 100,
      "workers": 1, "device": "cpu"})
sim = fedhet.assemble(cfg, data=Dataset("random", x, y, x[:100], y[:100], 10), log=lambda _: None)
state, faults = sim.side.algorithm.init(sim.w0), []
for k in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    state, _ = sim.parts.runner(sim.round_context(), state, k, sample_clients(sim.parts.loop, 4, k))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults": faults, "kept": allocator.keep_freed_memory()}))
"""


def _rounds(setting: str, **malloc_env: str) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "FEDHET_MALLOC": setting,
           **malloc_env}
    r = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@glibc
def test_a_cpu_run_reuses_its_freed_pages():
    # the baseline is glibc's own thresholds held at their starting values: left dynamic they
    # rise as blocks are freed, and in about one process in ten (by its allocation order) that
    # alone reaches the reuse (measured at 43,663 / 842 / 0 / 0 faults), so the comparison
    # would measure glibc's luck rather than the setting
    system = _rounds("system", MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    tuned = _rounds("tuned")
    assert system["kept"] is False and tuned["kept"] is True
    # after the first round (model, data and pools built), measured: 177,000–188,000 faults a
    # round under glibc's starting thresholds held fixed (13,800–92,100 left dynamic, and once
    # 842 in three rounds), 0–1,550 under fedhet's
    assert sum(tuned["faults"][1:]) * 10 < sum(system["faults"][1:]), (system, tuned)


def test_a_wrong_setting_is_one_line_and_nothing_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "FEDHET_MALLOC": "jemalloc"}
    r = subprocess.run([sys.executable, "-m", "fedhet", "run", "-d", "digits", "-n", "3", "-r", "1",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "FEDHET_MALLOC must be 'tuned' or 'system', got 'jemalloc'" in lines[0]
    assert not (tmp_path / "run").exists()


def test_the_setting_reads_case_and_blanks(monkeypatch):
    from fedhet.errors import FedhetError
    from fedhet.training.allocator import malloc_setting

    monkeypatch.delenv("FEDHET_MALLOC", raising=False)
    assert malloc_setting() == "tuned"
    monkeypatch.setenv("FEDHET_MALLOC", " System ")
    assert malloc_setting() == "system"
    monkeypatch.setenv("FEDHET_MALLOC", "")
    assert malloc_setting() == "tuned"
    monkeypatch.setenv("FEDHET_MALLOC", "off")
    with pytest.raises(FedhetError, match="got 'off'"):
        malloc_setting()
