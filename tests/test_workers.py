"""`--workers N`: the sequential executor over forked processes is bit-identical to one worker,
keeps per-client state, isolates a client that raises and reports divergence as one process
does (engine/workers.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from faulty import make_client_fail
from registered import example, explained, shipped

from fedhet.algorithms.state import Record
from fedhet.cli import main
from fedhet.engine.assembly import assemble
from fedhet.engine.config import config_of
from fedhet.engine.failures import Diverged
from fedhet.engine.simulation import Simulation
from fedhet.engine.workers import ProcessExecutor
from fedhet.errors import FedhetError

BASE = {"dataset": "digits", "partition": "dirichlet", "clients": 6, "rounds": 2, "lr": 0.05,
        "batch_size": 32, "seed": 4, "model": "mlp", "model.hidden": 16, "executor": "sequential"}

WRITTEN = [
    ("fedavg", {}),
    ("fedprox", {"momentum": 0.5}),
    ("scaffold", {"momentum": 0.5}),
    ("fednova", {"epochs_min": 1, "epochs_max": 3}),
    ("fedveca", {}),
    ("fednnnn", {}),
    ("bherd-scaffold", {}),
    ("grab-fedavg", {}),
    ("hierfavg", {"algorithm.clusters": 2, "algorithm.kappa2": 2}),
    ("moon", {"model": "moon-mlp", "model.hidden": 16}),
    ("fedavg", {"client_dropout": 0.3}),
    ("fedavgm", {}),
    ("norm-norm", {}),
    ("central", {}),
    ("bherd", {}),
    ("bherd-fednova", {}),
    ("ring", {}),
    ("fedsr", {"algorithm.clusters": 2, "algorithm.ring_passes": 2}),
    ("fedadam", {"algorithm.server_lr": 0.01}),
    ("fedyogi", {}),
    ("fedadagrad", {}),
    ("fedavg", {"client_optimizer": "adam", "lr": 0.01}),
]
CASES = WRITTEN + [(name, example(name)) for name in shipped() if name not in dict(WRITTEN)]
"""The hand-written cases, and every other registered algorithm with the settings it declared
(its `example`, tests/registered.py)."""


def test_every_registered_algorithm_is_covered():
    assert set(shipped()) <= {algorithm for algorithm, _ in CASES}  # plugins other tests load aside


def simulate(workers: int, log=None, patch=None, **settings) -> tuple[Simulation, dict]:
    cfg = config_of({**BASE, **settings, "workers": workers}, "test")
    sim = assemble(cfg, store=None, log=log or (lambda _: None))
    if patch is not None:
        patch(sim)
    return sim, sim.run()


def same(a, b) -> bool:
    if isinstance(a, Record):  # a typed state: the same class and the same fields
        return type(a) is type(b) and same(a.to_record(), b.to_record())
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, Mapping):  # a dict, or the clients' `ClientStateStore`
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)  # NaN equals NaN here


@pytest.mark.parametrize(("algorithm", "extra"), CASES)
def test_two_workers_are_bit_identical_to_one(algorithm, extra):
    with explained(algorithm, "tests/test_workers.py", dict(WRITTEN)):
        one, s1 = simulate(1, algorithm=algorithm, **extra)
        two, s2 = simulate(2, algorithm=algorithm, **extra)
    assert isinstance(two.side.executor, ProcessExecutor)
    assert not isinstance(one.side.executor, ProcessExecutor)
    assert same(one.final_state, two.final_state)
    assert same(one.side.clients.states, two.side.clients.states)
    assert torch.equal(one.buffers, two.buffers)
    assert s1["final_accuracy"] == s2["final_accuracy"] and s1["final_loss"] == s2["final_loss"]


def test_a_client_that_raises_in_a_worker_is_dropped_and_logged_once():
    def patch(sim):
        make_client_fail(sim, 3, "sensor offline")

    lines: dict[int, list[str]] = {1: [], 2: []}
    sims = {w: simulate(w, log=lines[w].append, patch=patch, algorithm="scaffold") for w in (1, 2)}
    assert same(sims[1][0].final_state, sims[2][0].final_state)
    assert lines[1] == lines[2]
    assert sum("client 3" in line and "sensor offline" in line for line in lines[2]) == 2  # 2 rounds
    assert 3 not in sims[2][0].side.clients.states


def test_divergence_in_a_worker_stops_the_run_at_the_same_round_and_client():
    summaries = {w: simulate(w, algorithm="fedavg", lr=1e6)[1] for w in (1, 2)}
    assert summaries[1]["status"] == summaries[2]["status"] == "diverged"
    assert summaries[1].get("diverged") == summaries[2].get("diverged")


def test_diverged_survives_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(Diverged(3, "train_loss", 7)))
    assert (e.round, e.what, e.client_id) == (3, "train_loss", 7) and "round 4" in str(e)


@pytest.mark.parametrize(("flags", "message"), [
    (["--workers", "0"], "argument --workers: must be auto or a whole number ≥ 1, got '0'"),
    (["--workers", "two"], "argument --workers: must be auto or a whole number ≥ 1, got 'two'"),
    (["--workers", "-1"], "argument --workers: must be auto or a whole number ≥ 1, got '-1'"),
    (["--set", "workers=two"], "--set: workers must be auto or a whole number ≥ 1, got 'two'"),
    (["--set", "workers=-3"], "--workers must be auto or a whole number ≥ 1, got -3"),
    (["--workers", "2", "--executor", "stacked"], "use --executor sequential (or auto) with it"),
])
def test_bad_worker_settings_are_one_line(tmp_path, capsys, flags, message):
    argv = ["run", "-d", "digits", "-n", "3", "-r", "1", "--out", str(tmp_path / "r"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_resume_may_change_the_number_of_workers(tmp_path, capsys):
    out = str(tmp_path / "r")
    base = ["run", "-a", "fedavg", "-d", "digits", "-n", "4", "--out", out, "--quiet"]
    assert main([*base, "-r", "2", "--workers", "2"]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", out, "-r", "3", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "workers 2 → 1" in captured.err + captured.out


def test_shared_downlink_sends_a_common_tensor_once_as_a_slot():
    """The global model that every downlink of a round carries goes through shared memory: the
    pickled task holds a slot number, not the model; a tensor only one client gets is pickled."""
    import pickle

    from fedhet.algorithms.base import Message
    from fedhet.engine import workers

    dim = 10_000
    shared = workers.SharedDownlink(dim, slots=1)
    w, own = torch.randn(dim), torch.randn(dim)
    requests = [(0, Message({"w": w, "c_0": own})), (1, Message({"w": w})), (2, Message({"w": w}))]
    packed = shared.pack(requests)
    assert all(isinstance(m.tensors["w"], workers._Slot) for _, m in packed)
    assert packed[0][1].tensors["c_0"] is own
    assert len(pickle.dumps(packed[1][1])) < 1000 < dim
    workers._SLOTS[:] = shared.slots  # what a forked worker inherits
    try:
        back = workers._unpack(packed[0][1])
    finally:
        workers._SLOTS[:] = []
    assert torch.equal(back.tensors["w"], w) and back.tensors["w"] is not w


def test_reply_slots_carry_model_sized_tensors_and_the_rest_is_pickled():
    from fedhet.algorithms.base import Message
    from fedhet.engine import workers

    dim = 50
    slots = [torch.zeros(dim) for _ in range(2)]
    a, b, c, small = torch.randn(dim), torch.randn(dim), torch.randn(dim), torch.randn(3)
    workers._REPLY_SLOTS[:] = slots
    try:
        sent = workers._to_slots(Message({"a": a, "b": b, "c": c, "s": small}, {"x": 1.0}), (1, 0))
    finally:
        workers._REPLY_SLOTS[:] = []
    assert [type(t).__name__ for t in sent.tensors.values()] == ["_Slot", "_Slot", "Tensor", "Tensor"]
    got = workers._from_slots(sent, slots)
    for name, t in {"a": a, "b": b, "c": c, "s": small}.items():
        assert torch.equal(got.tensors[name], t)
    assert got.scalars == {"x": 1.0}


# -- `--workers auto` (the default) ------------------------------------------------------------
def test_round_work_is_steps_times_batch_times_parameters_plus_a_cost_per_step():
    from fedhet.engine.workers import STEP_COST, round_cost

    # client 0: 2 steps of its 10 samples; client 1: 3 steps of B = 32; 4 clients a round
    per_client = (2 * (10 * 1000 + STEP_COST) + 3 * (32 * 1000 + STEP_COST)) / 2
    assert round_cost(4, [2, 3], [10, 100], 32, 1000) == pytest.approx(4 * per_client)
    assert round_cost(4, [], [], 32, 1000) == 0.0


@pytest.mark.parametrize(("work", "rounds", "per_round", "cores", "device", "executor", "requested", "n"), [
    (0.5, 1000, 10, 2, "cpu", "sequential", "auto", 1),          # a round below the threshold
    (1.0, 1000, 10, 2, "cpu", "sequential", "auto", 2),          # at it: the cores
    (5.0, 1000, 10, 16, "cpu", "sequential", "sequential", 10),  # one process per client at most
    (5.0, 1, 10, 16, "cpu", "sequential", "auto", 1),            # too short a run for a pool
    (5.0, 1000, 1, 16, "cpu", "sequential", "auto", 1),          # one client a round
    (5.0, 1000, 10, 1, "cpu", "sequential", "auto", 1),          # one core
    (5.0, 1000, 10, 16, "cuda", "stacked", "auto", 1),           # a GPU
    (5.0, 1000, 10, 16, "cpu", "stacked", "auto", 1),            # the linear models: stacked
    (5.0, 1000, 10, 16, "cpu", "sequential", "stacked", 1),      # stacked asked, not stackable
])
def test_auto_workers_rule(work, rounds, per_round, cores, device, executor, requested, n):
    from fedhet.engine.workers import AUTO_MIN_RUN_WORK, AUTO_MIN_WORK, auto_workers

    assert 1000 * AUTO_MIN_WORK >= AUTO_MIN_RUN_WORK > 5 * AUTO_MIN_WORK  # what the cases assume
    args = (work * AUTO_MIN_WORK, rounds, per_round, cores, device, executor, requested)
    chosen, why = auto_workers(*args)
    assert chosen == n and "\n" not in (why or "")
    assert (why is None) == (device != "cpu" or "stacked" in (executor, requested)
                             or min(cores, per_round) < 2)  # nothing weighed: nothing said
    assert auto_workers(*args) == (chosen, why)  # deterministic


def test_auto_workers_reasons_name_the_figures():
    from fedhet.engine.workers import auto_workers

    assert auto_workers(1e8, 100, 10, 2, "cpu", "sequential", "auto") == (
        1, "a round's work ~1.0e+08 multiply-adds < 3e+08")
    assert auto_workers(1e9, 5, 10, 2, "cpu", "sequential", "auto") == (
        1, "the run's work ~5.0e+09 multiply-adds (5 rounds) < 1e+10: too little to pay for "
           "starting the workers")
    assert auto_workers(1e9, 30, 10, 4, "cpu", "sequential", "auto") == (
        4, "a round's work ~1.0e+09 multiply-adds ≥ 3e+08, the run's ~3.0e+10 ≥ 1e+10, 4 usable cores")
    assert auto_workers(1e9, 30, 10, 1, "cpu", "sequential", "auto") == (1, None)


def test_grid_jobs_share_the_cores(monkeypatch):
    """`--jobs N` runs N runs at once: each job process gets `cores // N` (`$FEDHET_CORES`), so
    `auto` in 2 jobs on 2 cores is 1 worker each, not 2 × 2 processes."""
    from fedhet.engine.workers import AUTO_MIN_WORK, CORES_ENV, auto_workers, usable_cores
    from fedhet.runs.processes import core_share

    assert [core_share(16, j) for j in (1, 2, 3, 4, 16, 32)] == [16, 8, 5, 4, 1, 1]
    monkeypatch.setenv(CORES_ENV, str(core_share(2, 2)))
    assert usable_cores() == 1
    assert auto_workers(10 * AUTO_MIN_WORK, 1000, 10, usable_cores(), "cpu", "sequential",
                        "auto")[0] == 1
    monkeypatch.setenv(CORES_ENV, "none")
    with pytest.raises(FedhetError, match=f"^{CORES_ENV} must be a whole number ≥ 1, got 'none'$"):
        usable_cores()


def test_a_grid_job_process_sees_its_share_of_the_cores():
    """The runner's job processes start with `$FEDHET_CORES` = their share (forkserver: no
    monkeypatching crosses, so this is the real set-up)."""
    from concurrent.futures import ProcessPoolExecutor

    from fedhet.engine.workers import usable_cores
    from fedhet.runs import processes

    ctx = processes.worker_context()
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=processes.init_worker,
                             initargs=(ctx.Event(), 3)) as pool:
        assert pool.submit(usable_cores).result() == 3


def force_auto(monkeypatch, cores: int = 2) -> None:
    """Make `auto` choose `cores` workers for any CPU run on the sequential executor."""
    from fedhet.engine import workers

    monkeypatch.setattr(workers, "AUTO_MIN_WORK", 0.0)
    monkeypatch.setattr(workers, "AUTO_MIN_RUN_WORK", 0.0)
    monkeypatch.setenv(workers.CORES_ENV, str(cores))


@pytest.mark.parametrize(("algorithm", "extra"), [CASES[2], CASES[3], CASES[8]])
def test_auto_chosen_workers_are_an_explicit_workers_n(monkeypatch, algorithm, extra):
    """A run whose round pays for the cores runs over processes, logs why, and ends bit-identical
    to `--workers 1` and to `--workers 2`."""
    force_auto(monkeypatch)
    lines: list[str] = []
    auto, s0 = simulate(0, log=lines.append, algorithm=algorithm, **extra)
    one, s1 = simulate(1, algorithm=algorithm, **extra)
    two, s2 = simulate(2, algorithm=algorithm, **extra)
    assert isinstance(auto.side.executor, ProcessExecutor)
    assert auto.side.plan.workers == auto.side.executor.workers == 2
    assert [line for line in lines if line.startswith("workers:")] == [
        f"workers: auto → 2 (a round's work ~{auto.side.round_cost:.1e} multiply-adds ≥ 0e+00, the "
        f"run's ~{2 * auto.side.round_cost:.1e} ≥ 0e+00, 2 usable cores)"
    ]
    for sim, summary in ((one, s1), (two, s2)):
        assert same(auto.final_state, sim.final_state)
        assert same(auto.side.clients.states, sim.side.clients.states)
        assert s0["final_accuracy"] == summary["final_accuracy"]
        assert s0["final_loss"] == summary["final_loss"]


def test_auto_below_the_threshold_is_one_process_and_says_why(monkeypatch):
    from fedhet.engine import workers

    monkeypatch.setenv(workers.CORES_ENV, "2")
    lines: list[str] = []
    sim, _ = simulate(0, log=lines.append)  # 6 clients of digits: far below the threshold
    assert sim.side.round_cost < workers.AUTO_MIN_WORK
    assert sim.side.plan.workers == 1 and not isinstance(sim.side.executor, ProcessExecutor)
    assert lines[0].startswith("workers: auto → 1 (a round's work ~") and "< 3e+08)" in lines[0]


@pytest.mark.parametrize(("settings", "executor"), [
    ({"executor": "stacked"}, "stacked"),
    ({"executor": "auto", "model": "logreg"}, "stacked"),  # auto: stacked for the linear models
])
def test_auto_never_spreads_the_stacked_executor(monkeypatch, settings, executor):
    """`--executor stacked` (and runs stepped as a stack, which are stacked) with `auto`: 1,
    silently; only an explicit `--workers N > 1` with them is an error."""
    from fedhet.engine.stacked_runs import can_share

    force_auto(monkeypatch)
    lines: list[str] = []
    base = {k: v for k, v in BASE.items() if k != "model.hidden"}
    sims = [assemble(config_of({**base, **settings, "seed": s, "workers": 0}), store=None,
                       log=lines.append) for s in (1, 2)]
    assert [(s.side.plan.workers, s.side.executor.name) for s in sims] == [(1, executor)] * 2
    assert not any(isinstance(s.side.executor, ProcessExecutor) for s in sims)
    assert can_share(sims) == [0, 1]
    assert not any(line.startswith("workers:") for line in lines)  # silently


def test_cli_workers_auto_is_stored_as_0_and_set_workers_auto_too(tmp_path, capsys):
    import json

    for i, flags in enumerate((["--workers", "auto"], ["--set", "workers=auto"], [])):
        out = tmp_path / f"r{i}"
        argv = ["run", "-d", "digits", "-n", "3", "-r", "1", "--out", str(out), "--quiet", *flags]
        assert main(argv) == 0
        assert json.loads((out / "config.json").read_text())["workers"] == 0
        assert "workers: auto" not in capsys.readouterr().out  # one core (conftest): silent


def test_an_old_run_with_workers_1_resumes_with_1(tmp_path, capsys, monkeypatch):
    """A config.json from before `auto` (`"workers": 1`, the old default) keeps its 1 worker on
    resume; a resume may switch it to auto."""
    import json

    out = tmp_path / "r"
    assert main(["run", "-d", "digits", "-n", "4", "-r", "1", "--out", str(out), "--quiet",
                 "--workers", "1"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["workers"] == 1
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "-r", "2"]) == 0
    captured = capsys.readouterr()
    assert "workers: auto" not in captured.out and json.loads((out / "summary.json").read_text())[
        "rounds_done"] == 2
    monkeypatch.setenv("FEDHET_CORES", "2")
    assert main(["run", "--resume", str(out), "-r", "3", "--workers", "auto"]) == 0
    captured = capsys.readouterr()
    assert "workers 1 → 0" in captured.out + captured.err
    assert "workers: auto → 1 (a round's work ~" in captured.out
    assert json.loads((out / "config.json").read_text())["workers"] == 0


def test_a_flower_server_does_not_weigh_workers(monkeypatch):
    """The deploy server's clients run on SuperNodes: `auto` is 1 there and says nothing (the
    deploy console would otherwise announce processes that never start)."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install fedhet[flower])")
    from fedhet.deploy.server_app import server_run

    force_auto(monkeypatch)
    lines: list[str] = []
    server = server_run(config_of({**BASE, "workers": 0}), None, None, round_timeout=1.0,
                        log=lines.append)
    assert server.side.plan.workers == 1 and not isinstance(server.side.executor, ProcessExecutor)
    assert lines == []
    local, _ = simulate(0, log=lines.append)  # the same settings in one process: 2 workers
    assert local.side.plan.workers == 2
