"""`fedhet reproduce all --scale paper --device cuda --budget MINUTES`: the GPU campaign.

One command spends a sitting's device time on the papers' GPU tables in a fixed priority order:

1. `bench`: the cohort benchmark rows (`benchmarks/bench_cohort.py --full`, a subprocess); its
   table goes to `RESULTS/bench/cohort-<device>.md`;
2. then the tables by published claims per GPU-minute (`value`): `fednnnn-mnist` (FedNNNN
   Table 2, MNIST: the Table 3 CNN, 100 clients, 100 rounds; in bf16), `fedveca-cnn-mnist`,
   `bherd-cnn-mnist` (FedVeca's and BHerd's CNN + MNIST cases), `fedsr-mnist` (FedSR Tables
   II–III, MNIST: MLP, 20 devices, 500 rounds, most of them ring hops).

Each table is priced from its own work (`gpu_minutes`): its model's FLOPs per sample (counted
by torch's FLOP counter), the samples its clients train per round and those its evaluation
reads, its rounds and runs, at the GPU FLOP rate of a measured floor (`GPU_FLOORS`) or, for a
model without one, the floor CNN's scaled by what the CPU benchmark measured of both
(`CPU_SAMPLES_S`); a round whose steps stack fewer clients than the floor's (rings, 5-client
cases) is slowed in proportion.

Each table is its paper's preset restricted to MNIST (`reproduce --only mnist`), run into
`OUT/<table>/runs/<name>` in chunks of `--batch-runs` runs (a preset lists a cell's seeds one
after another, so a chunk is a cell's seeds stepping as one batch). Before a chunk starts, its
time is estimated as (rounds left) × (seconds per run-round); a chunk that cannot finish inside
what is left of the budget is cut to the runs that can, and when not even one run can, it is
not started and the sitting ends there. The seconds per
run-round start from the table's price (`gpu_minutes` / run-rounds) and are
replaced by what this campaign measured once a chunk has run (kept in `OUT/campaign.json`). A
timer stops the runs at the budget's end whatever the estimate said (the runner's graceful
stop: each run stops after its next saved round), so a run cut short resumes from its
checkpoint in the next sitting; finished runs are never redone. The same command continues
where the last sitting stopped.

When a table's runs have all finished, its results CSV and json (docs/paper-scale.md's
contract, `fedhet.experiments.paper_results`) are written to `RESULTS/<paper>/<experiment>.*`.

It needs only torch, numpy and the standard library at run time (no tqdm, flwr, ray).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fedhet.engine.interface import rundir
from fedhet.errors import FedhetError
from fedhet.experiments import paper_results
from fedhet.experiments.presets import SCALES, RunSpec

CNN_ROUND_S = 0.68
"""One FedNNNN CNN round over 100 clients (E = 5, B = 50, 60,000 MNIST samples: 300,000
samples trained), batched executor, one H100 (a measured floor, `bench_cohort.py --full`)."""
MLP_ROUND_S = 0.17
"""One MLP round (100 clients, E = 1, B = 32, 60,000 samples), batched executor, one H100."""
GPU_FLOORS: dict[str, tuple[float, int]] = {
    "cnn-fednnnn-mnist": (CNN_ROUND_S, 300_000),
    "mlp": (MLP_ROUND_S, 60_000),
}
"""Measured GPU rounds, `model: (seconds, samples trained)`, each with 100 clients stacked."""
FLOOR_STACK = 100
"""Clients stacked in the floors' rounds."""
CPU_SAMPLES_S: dict[str, float] = {"cnn-fednnnn-mnist": 3303.0, "cnn-mnist": 2174.0, "cnn-cifar": 1769.0}
"""What `benchmarks/bench_cnn.py` measured of each CNN on one CPU core (fedhet, sequential,
fp32, channels-last; samples trained per second in one run, `--bf16 --no-bare --steps 20`;
`cnn-cifar` scaled from another run through `cnn-mnist`; benchmarks/RESULTS.md). A model without a GPU
floor is priced at the floor CNN's GPU FLOP rate scaled by how its FLOP rate on the CPU compares
with the floor CNN's there **[choice]**: the same relative efficiency on both devices."""
ALGORITHM_PASSES: dict[str, float] = {"moon": 5 / 3}
"""Training FLOPs of a sample relative to one forward and backward pass: MOON adds two
forward passes (the global and the previous model, each a third of a step)."""
CLAIMS: dict[str, int] = {
    "fednnnn-mnist": 20, "fedsr-mnist": 35, "fedveca-cnn-mnist": 3, "bherd-cnn-mnist": 9,
}
"""**[choice]** Published claims a table settles (the paper-scale page's rows): FedNNNN Table 2
MNIST, 4 settings × 5 methods' accuracies; FedSR Tables II–III MNIST, 5 settings × 7 methods;
FedVeca Fig. 3 CNN, FedVeca first to the loss target against 3 baselines; BHerd Fig. 2a CNN,
3 cases × BHerd-{FedAvg, FedNova, SCAFFOLD} against their bases."""
DATA_SIZES: dict[str, tuple[int, int]] = {
    "mnist": (60_000, 10_000), "mnist-even-odd": (60_000, 10_000),
    "fashion-mnist": (60_000, 10_000), "cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000),
}
"""`(train, test)` samples of the campaign's datasets."""
INPUT_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "mnist": ((28, 28), 10), "mnist-even-odd": ((28, 28), 2), "fashion-mnist": ((28, 28), 10),
    "cifar10": ((3, 32, 32), 10), "cifar100": ((3, 32, 32), 100),
}
STACK_TOPOLOGY = {"ring": lambda clients, p: 1,
                  "edge-ring": lambda clients, p: _rings(clients, p)}
"""Clients stacked per step of a ring topology (its hops run in order): one ring, or one per
edge (`algorithm.clusters`, or the sampled devices / `cluster_size`). Star topologies stack
every sampled client."""
BF16_SAFE: frozenset[str] = frozenset({"fednnnn-mnist"})
"""Tables whose runs use `precision=bf16` on a GPU: those whose model and algorithms
`benchmarks/bench_precision.py` found to lose no accuracy in bf16 (FedNNNN's MNIST CNN with
FedAvg and FedNova, whose local work Table 2's five methods share; benchmarks/RESULTS.md). The
others keep fp32: their CNN or algorithms (FedVeca's gradient-norm steps, BHerd's herding)
were not measured in bf16, and SCAFFOLD is safe in bf16 only where it is stable in fp32.
Every table is priced at fp32 (no bf16 speed-up is assumed on the GPU until measured there)."""
PRICING = (
    "GPU-minutes: each table priced from its own work (its model's FLOPs per sample, the samples "
    "its clients train and its evaluation reads per round, its rounds and runs) at the GPU FLOP "
    f"rate of a measured floor (one FedNNNN CNN round over 100 clients: {CNN_ROUND_S} s on one "
    f"H100; one MLP round: {MLP_ROUND_S} s) or, for another CNN, the floor CNN's scaled by the "
    "CPU benchmark's measure of both; rounds whose steps stack fewer clients than the floors' "
    "100 (ring hops, 5-client cases; 8 runs batched) are slowed in proportion. Estimates, not "
    "measurements: a sitting replaces them with its own seconds per run-round."
)
"""The paper-scale page's sentence on how the GPU-minute column is priced."""
CPU_FACTOR = 30.0
"""[choice] Prior slow-down of a paper-scale CNN/MLP round on a CPU against one H100 (used only
until the first chunk has been measured)."""
BENCH_MINUTES = {"paper": 6.0, "small": 1.0, "smoke": 1.0}
"""Prior wall minutes of the benchmark step (`--full` on a GPU; small sizes otherwise)."""
MARGIN = 0.03
"""Fraction of the budget kept back (at least 10 s) so the sitting ends before the budget does."""
MAX_BUDGET_MIN = 7 * 24 * 60
"""The longest sitting, in minutes: a week (timers and subprocess time-outs hold far longer
ones badly: 100000 minutes overflowed a poll time-out, 1e308 made the deadline NaN)."""


@dataclass(frozen=True)
class Table:
    """One GPU table of the campaign: a preset restricted to some datasets."""

    key: str
    paper: str
    experiment: str
    """Result file stem: `RESULTS/<paper>/<experiment>.csv`."""
    title: str
    only: tuple[str, ...]
    """Datasets of the preset's runs at `paper` scale (`reproduce --only`)."""
    s_per_round: float = 0.0
    """Prior GPU seconds per run-round; 0: priced from the table's work (`price`)."""
    keep: Callable[[RunSpec], bool] | None = None
    setting_of: Callable[[paper_results.Run], str] | None = None
    algorithm_of: Callable[[paper_results.Run], str] | None = None
    extra_columns: tuple[paper_results.ExtraColumn, ...] = ()
    fan_out: int = 1
    """Runs a later stage adds per first-stage run (FedVeca: centralized SGD, FedAvg, FedNova)."""


TABLES: tuple[Table, ...] = (
    Table("fednnnn-mnist", "fednnnn", "table2-mnist", "FedNNNN Table 2, MNIST", ("mnist",)),
    Table("fedveca-cnn-mnist", "fedveca", "cnn-mnist", "FedVeca Fig. 3, CNN + MNIST Case 3",
          ("mnist",), extra_columns=("tau_k",), fan_out=4),
    Table("bherd-cnn-mnist", "bherd", "cnn-mnist", "BHerd Fig. 2, CNN + MNIST Cases 1-3",
          ("mnist",), keep=lambda s: s.name.startswith("main-")),
    Table("fedsr-mnist", "fedsr", "table2-mnist", "FedSR Tables II-III, MNIST", ("mnist",),
          extra_columns=("cum_model_transfers",)),
)
"""The CNN/MLP tables in the campaign's priority order (after the benchmark): most published
claims per priced GPU-minute first (`value`; a test keeps the order sorted). A result row's
setting and algorithm are the preset's group and label (`CNN MNIST Case 3`, `FedVeca`;
`CNN + MNIST case1`, `BHerd-FedAvg`), which docs/paper-scale.md reads."""
STEPS = ("bench",) + tuple(t.key for t in TABLES)


def table(key: str) -> Table:
    for t in TABLES:
        if t.key == key:
            return t
    raise FedhetError(f"unknown campaign table {key!r}; choose from: {', '.join(STEPS)}")


# -- the specs of a table ------------------------------------------------------------------
def _select(specs: list[RunSpec], t: Table, scale: str) -> list[RunSpec]:
    # below `paper` the presets run on the embedded digits: every run of the preset is the table
    if scale == "paper":
        specs = [s for s in specs if s.settings.get("dataset", "digits") in t.only]
    return [s for s in specs if t.keep is None or t.keep(s)]


def table_specs(t: Table, scale: str, out: Path, stage: int) -> list[RunSpec]:
    """The runs of stage `stage` (0-based) of table `t`'s preset at `scale`."""
    # lazy: the presets and the runner (torch) load only when a step runs; the campaign imports light
    from fedhet.experiments.reproduce import load_preset

    if t.paper == "fedveca" and stage == 1:
        return _fedveca_baselines(t, scale, out)
    preset = load_preset(t.paper, scale)
    return _select(preset.stages[stage](out), t, scale)


def _fedveca_baselines(t: Table, scale: str, out: Path) -> list[RunSpec]:
    """FedVeca's stage 2 for the table's groups only (the preset's stage reads every group's
    FedVeca run, including those of datasets the table leaves out)."""
    # lazy: the presets and the runner (torch) load only when a step runs; the campaign imports light
    from fedhet.experiments.papers.fedveca import preset as fv

    groups = [g for g in fv.groups(scale) if scale != "paper" or g.settings.get("dataset") in t.only]
    return _select([s for g in groups for s in fv.baseline_specs(g, out / "runs")], t, scale)


def stages_of(t: Table, scale: str) -> int:
    # lazy: the presets and the runner (torch) load only when a step runs; the campaign imports light
    from fedhet.experiments.reproduce import load_preset

    return len(load_preset(t.paper, scale).stages)


def estimate_run_rounds(t: Table, scale: str) -> int:
    """Run-rounds of the whole table (later stages estimated with `fan_out`), from its specs."""
    first = table_specs(t, scale, Path("/nonexistent-campaign-estimate"), 0)
    return sum(int(s.settings.get("rounds", 1)) for s in first) * t.fan_out


# -- pricing: GPU minutes from each table's own work -----------------------------------------
@dataclass(frozen=True)
class RunWork:
    """What one run of a table computes per round (module `price`)."""

    model: str
    train_samples: float
    """Samples through a forward and backward pass per round (× `ALGORITHM_PASSES`)."""
    eval_samples: float
    """Samples through a forward pass per round (test set every `eval_every`, the training set
    with `train_loss`)."""
    stacked: int
    """Clients stacked in one step of the batched executor (all sampled ones on a star)."""
    rounds: int


def _rings(clients: int, params: dict[str, Any]) -> int:
    q = int(params.get("algorithm.cluster_size", 0))
    return max(1, clients // q) if q else int(params.get("algorithm.clusters", 1))


def run_work(settings: dict[str, Any]) -> RunWork:
    """One run's `RunWork` from its settings (a paper-scale spec's): `E·D·p` samples trained a
    round (times the ring passes of FedSR, the edge iterations κ₂ of HierFAVG; FedVeca: at most
    `τ_max` steps per client plus its full local gradient; the centralized baseline: one
    client holding all `D`), the test set (and with `train_loss` the training set) evaluated."""
    # lazy: the registries load only when a table is priced
    from fedhet.algorithms.interface import ALGORITHMS

    algorithm = str(settings.get("algorithm", "fedavg"))
    train, test = DATA_SIZES[str(settings.get("dataset", "mnist"))]
    clients = 1 if algorithm == "central" else int(settings.get("clients", 10))
    sampled = max(1, round(float(settings.get("sample_fraction", 1.0)) * clients))
    epochs = float(settings.get("local_epochs", 1.0)) * (sampled / clients)
    epochs *= int(settings.get("algorithm.ring_passes", 1)) if algorithm == "fedsr" else 1
    epochs *= int(settings.get("algorithm.kappa2", 1)) if algorithm == "hierfavg" else 1
    samples = epochs * train
    if algorithm == "fedveca":
        tau_max = int(settings.get("algorithm.tau_max", 50))
        samples = min(samples, sampled * tau_max * int(settings.get("batch_size", 32))) + train
    topology = ALGORITHMS.get(algorithm).factory.topology
    stack = STACK_TOPOLOGY.get(topology, lambda n, p: n)(sampled, settings)
    evals = test / int(settings.get("eval_every", 1)) + (train if settings.get("train_loss") else 0)
    return RunWork(str(settings.get("model", "mlp")), samples * ALGORITHM_PASSES.get(algorithm, 1.0),
                   evals, stack, int(settings.get("rounds", 1)))


_FLOPS: dict[tuple[str, str], float] = {}


def train_flops(model: str, dataset: str = "mnist") -> float:
    """FLOPs of one sample's forward and backward pass through `model` on `dataset`'s inputs,
    counted by `torch.utils.flop_counter.FlopCounterMode` (matrix products and convolutions;
    a forward is a third of it)."""
    key = (model, dataset)
    if key not in _FLOPS:
        # lazy: torch and the model registry load only when a table is priced
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        from fedhet.models.interface import MODELS, build_model  # lazy: it imports torch

        shape, classes = INPUT_SHAPES[dataset]
        net = build_model(model, shape, classes, MODELS.get(model).params())
        x, y = torch.rand(2, *shape), torch.randint(0, classes, (2,))
        with FlopCounterMode(display=False) as counter:
            torch.nn.functional.cross_entropy(net(x), y).backward()
        _FLOPS[key] = counter.get_total_flops() / 2
    return _FLOPS[key]


def gpu_flop_rate(model: str, dataset: str = "mnist") -> float:
    """Training FLOP/s the batched executor reaches on one H100 with `FLOOR_STACK` clients
    stacked: a measured floor's (`GPU_FLOORS`), else the floor CNN's scaled by the model's CPU
    FLOP rate against the floor CNN's (`CPU_SAMPLES_S`); the MOON variants are their base's."""
    model = {"moon-mlp": "mlp", "moon-cnn": "cnn-cifar"}.get(model, model)
    if model in GPU_FLOORS:
        seconds, samples = GPU_FLOORS[model]
        return samples * train_flops(model) / seconds
    ref = "cnn-fednnnn-mnist"
    if model not in CPU_SAMPLES_S:
        raise FedhetError(f"no CPU measurement of model {model!r} to price it (benchmarks/bench_cnn.py)")
    cpu = CPU_SAMPLES_S[model] * train_flops(model, dataset)
    return gpu_flop_rate(ref) * cpu / (CPU_SAMPLES_S[ref] * train_flops(ref))


def run_round_seconds(settings: dict[str, Any], runs_stacked: int = 8) -> float:
    """GPU seconds of one round of a run: its training and evaluation FLOPs at the model's
    `gpu_flop_rate`, the training slowed by `FLOOR_STACK / stacked` when fewer clients than
    the floor's (the run's own, times `runs_stacked` runs of a batch) share a step: a small
    stack leaves the GPU waiting on kernel launches, as an MLP step does **[choice]**."""
    w = run_work(settings)
    dataset = str(settings.get("dataset", "mnist"))
    f_train = train_flops(w.model, dataset)
    rate = gpu_flop_rate(w.model, dataset)
    fill = min(1.0, w.stacked * runs_stacked / FLOOR_STACK)
    return w.train_samples * f_train / (rate * fill) + w.eval_samples * (f_train / 3) / rate


def gpu_minutes(t: Table, scale: str = "paper", runs_stacked: int = 8) -> float:
    """GPU minutes of the whole table: `s_per_round × run-rounds` when the table gives a prior,
    else the sum over its runs of rounds × `run_round_seconds` (later stages, FedVeca's
    baselines, priced as `fan_out` times the first stage's)."""
    if t.s_per_round:
        return estimate_run_rounds(t, scale) * t.s_per_round / 60.0
    first = table_specs(t, scale, Path("/nonexistent-campaign-estimate"), 0)
    seconds = sum(int(s.settings.get("rounds", 1)) * run_round_seconds(s.settings, runs_stacked)
                  for s in first)
    return seconds * t.fan_out / 60.0


def value(t: Table, scale: str = "paper") -> float:
    """Published claims per GPU-minute (`CLAIMS` / `gpu_minutes`): the campaign's order."""
    return CLAIMS.get(t.key, 0) / max(gpu_minutes(t, scale), 1e-9)


def overrides_for(t: Table, device: str) -> dict[str, Any]:
    """Settings the campaign adds to every run of `t`: the device, and `precision=bf16` on a
    GPU for the tables in `BF16_SAFE`."""
    out: dict[str, Any] = {"device": device}
    if device.startswith("cuda") and t.key in BF16_SAFE:
        out["precision"] = "bf16"
    return out


def command(scale: str = "paper", device: str = "cuda", budget: float = 30, tables: str = "") -> str:
    """The exact command line of a sitting (from the checkout)."""
    cmd = (f"PYTHONPATH=src python -m fedhet reproduce all --scale {scale} --device {device} "
           f"--budget {budget:g}")
    return cmd + (f" --tables {tables}" if tables else "")


# -- the campaign --------------------------------------------------------------------------
@dataclass
class Campaign:
    """One sitting of the campaign (see the module doc)."""

    scale: str
    device: str
    budget_min: float
    out: Path = Path("runs/campaign")
    results: Path = Path("results")
    batch_runs: int = 8
    steps: tuple[str, ...] = STEPS
    tables: tuple[Table, ...] = TABLES
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    repo: Path = field(default_factory=lambda: Path(__file__).resolve().parents[3])
    clock: Callable[[], float] = time.monotonic
    state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise FedhetError(f"unknown scale {self.scale!r}; choose one of: {', '.join(SCALES)}")
        if not (math.isfinite(self.budget_min) and 0 < self.budget_min <= MAX_BUDGET_MIN):
            raise FedhetError(f"--budget must be a number of minutes in (0, {MAX_BUDGET_MIN}] (a "
                              f"sitting of at most a week; run again to continue), got "
                              f"{self.budget_min:g}")
        known = {"bench"} | {t.key for t in self.tables}
        for s in self.steps:
            if s not in known:
                raise FedhetError(f"unknown campaign step {s!r}; choose from: {', '.join(sorted(known))}")
        if self.device.startswith("cuda"):
            # lazy: torch loads only when the device is checked
            import torch

            if not torch.cuda.is_available():
                raise FedhetError(f"--device {self.device}: torch sees no CUDA device here; the "
                                  "campaign is for a GPU machine (--device cpu to try it at smoke scale)")
        self.start = self.clock()
        margin = max(10.0, MARGIN * self.budget_min * 60)
        self.deadline = self.start + self.budget_min * 60 - margin

    # state ------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.out / "campaign.json"

    def load_state(self) -> None:
        if self.state_path.exists():
            # lazy, as the campaign's other imports
            from fedhet.engine.interface import read_json

            self.state = read_json(self.state_path, "remove it to start over (finished runs are "
                                   "kept and not redone)")
            steps, sittings = self.state.get("steps", {}), self.state.get("sittings", [])
            if not (isinstance(steps, dict) and all(isinstance(v, dict) for v in steps.values())
                    and isinstance(sittings, list) and all(isinstance(v, dict) for v in sittings)):
                raise FedhetError(f"{self.state_path} is damaged (its steps or sittings are not "
                                  "what fedhet writes); remove it to start over (finished runs "
                                  "are kept and not redone)")
        self.state.setdefault("steps", {})
        self.state.setdefault("sittings", [])

    def save_state(self) -> None:
        # lazy: engine.store imports torch; only a finished step writes
        from fedhet.engine.interface import atomic_write_text

        atomic_write_text(self.state_path, json.dumps(self.state, indent=2) + "\n")

    def step_state(self, key: str) -> dict[str, Any]:
        return self.state["steps"].setdefault(key, {"status": "pending", "minutes": 0.0})

    def left_s(self) -> float:
        return self.deadline - self.clock()

    def say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    # a sitting ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run one sitting; returns the state (also in `OUT/campaign.json`)."""
        self.out.mkdir(parents=True, exist_ok=True)
        with rundir.exclusive(self.out, "campaign"):
            rundir.mark(self.out, "grid")
            self.load_state()
            # lazy: results imports engine.store (torch); only the metadata needs the commit
            from fedhet.experiments.results import git_commit

            sitting = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                       "commit": git_commit(),
                       "budget_min": self.budget_min, "device": self.device, "scale": self.scale,
                       "stopped": ""}
            self.state["sittings"].append(sitting)
            for key in self.steps:
                st = self.step_state(key)
                if st["status"] == "done":
                    continue
                t0 = self._step_t0 = self.clock()
                try:
                    finished = self.bench() if key == "bench" else self.table(self._table(key))
                finally:
                    st["minutes"] = round(st["minutes"] + (self.clock() - t0) / 60, 3)
                    self.save_state()
                if not finished:
                    sitting["stopped"] = f"before the budget ended, in {key}"
                    break
                st["status"] = "done"
                self.save_state()
            done = [k for k in self.steps if self.step_state(k)["status"] == "done"]
            sitting["done"] = done
            sitting["minutes"] = round((self.clock() - self.start) / 60, 3)
            self.save_state()
            left = [k for k in self.steps if k not in done]
            self.say(f"campaign: done {', '.join(done) or 'nothing'}; "
                     + (f"left {', '.join(left)} (run the same command again to continue)"
                        if left else "every step finished"))
        return self.state

    def _table(self, key: str) -> Table:
        return next(t for t in self.tables if t.key == key)

    # the benchmark -----------------------------------------------------------------------
    def bench(self) -> bool:
        est = BENCH_MINUTES[self.scale] * 60
        if self.device == "cpu" and self.scale == "paper":
            est *= CPU_FACTOR
        if est > self.left_s():
            self.say(f"bench: needs about {est / 60:.1f} min, {max(0, self.left_s()) / 60:.1f} left; "
                     "stopping here")
            return False
        script = self.repo / "benchmarks" / "bench_cohort.py"
        if not script.exists():
            raise FedhetError(f"{script} not found: run the campaign from a checkout")
        target = self.results / "bench" / f"cohort-{_device_slug(self.device)}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, str(script), "--rounds", "3", "--devices", _bench_devices(self.device),
                "--out", str(target.resolve())]
        if self.scale == "paper":
            args.append("--full")
        else:
            args += ["--only", "svm"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(self.repo / "src"), *filter(None, [os.environ.get("PYTHONPATH", "")])])}
        self.say("bench: " + " ".join(shlex.quote(a) for a in args))
        try:
            proc = subprocess.run(args, env=env, cwd=self.repo, timeout=max(1.0, self.left_s()),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except subprocess.TimeoutExpired:
            self.say("bench: stopped at the budget's end (it starts again next sitting)")
            return False
        if proc.returncode != 0:
            raise FedhetError(f"bench_cohort.py failed (exit {proc.returncode}): "
                              f"{proc.stdout.strip().splitlines()[-1:] or ''}")
        self.say(f"bench: table in {target}")
        return True

    # a table -----------------------------------------------------------------------------
    def s_per_round(self, t: Table) -> float:
        measured = self.step_state(t.key).get("s_per_run_round")
        if measured:
            return float(measured)
        prior = t.s_per_round
        if not prior:
            rr = estimate_run_rounds(t, self.scale)
            prior = gpu_minutes(t, self.scale, self.batch_runs) * 60 / max(rr, 1)
        return prior * (CPU_FACTOR if self.device == "cpu" and self.scale == "paper" else 1.0)

    def table(self, t: Table) -> bool:
        """Run what is left of table `t` inside the budget; True when all its runs finished."""
        # lazy: the grid, presets and runner (torch) load only when a table runs
        from fedhet.experiments.grid import write_manifest
        from fedhet.experiments.reproduce import _check_specs, check_data
        from fedhet.experiments.runner import plan_jobs, with_overrides

        out = self.out / t.key
        runs_dir = out / "runs"
        overrides = overrides_for(t, self.device)
        all_specs: list[RunSpec] = []
        for stage in range(stages_of(t, self.scale)):
            specs = with_overrides(table_specs(t, self.scale, out, stage), overrides)
            _check_specs(t.paper, all_specs + specs)
            all_specs += specs
            write_manifest(out, f"{t.paper} ({self.scale}): {t.title}", all_specs, None,
                           paper=t.paper, scale=self.scale)
            todo, _ = plan_jobs(specs, runs_dir, force=False)
            names = {j.name for j in todo}
            left = [s for s in specs if s.name in names]
            if left:
                check_data(t.paper, self.scale, left)
            i = 0
            while i < len(left):
                # a batch of up to `batch_runs` runs, cut to what fits in the time left
                chunk = left[i:i + self.batch_runs]
                while True:
                    rounds = sum(_rounds_left(runs_dir / s.name, s) for s in chunk)
                    est = rounds * self.s_per_round(t)
                    if est <= self.left_s() or len(chunk) == 1:
                        break
                    chunk = chunk[:-1]
                if est > self.left_s():
                    self.say(f"{t.key}: next {len(chunk)} run(s) need about {est / 60:.1f} min, "
                             f"{max(0, self.left_s()) / 60:.1f} left; stopping here")
                    self._export(t, out, all_specs, complete=False)
                    return False
                self.say(f"{t.key}: stage {stage + 1}, runs {i + 1}-{i + len(chunk)} of {len(left)} "
                         f"(about {est / 60:.1f} min)")
                t0 = self.clock()
                try:
                    errors = self._run_chunk(chunk, runs_dir)
                except KeyboardInterrupt:  # the budget's alarm (runner.Interrupted) or Ctrl-C
                    self.say(f"{t.key}: stopped at the budget's end (or Ctrl-C); the next sitting "
                             "resumes its runs from their last saved round")
                    self._measure(t, chunk, runs_dir, rounds, self.clock() - t0)
                    self._export(t, out, all_specs, complete=False)
                    return False
                if errors:
                    raise FedhetError(f"{t.key}: {len(errors)} run(s) failed; first: "
                                      f"{next(iter(errors.items()))}")
                self._measure(t, chunk, runs_dir, rounds, self.clock() - t0)
                i += len(chunk)
        self._export(t, out, all_specs, complete=True)
        return True

    def _run_chunk(self, chunk: list[RunSpec], runs_dir: Path) -> dict[str, str]:
        """Run `chunk` (one process, seeds batched), stopped gracefully at the budget's end."""
        # lazy: the runner (torch) loads only when a table runs
        from fedhet.experiments.runner import run_specs

        with _alarm(self.left_s()):
            return run_specs(chunk, runs_dir, jobs=1, stream=self.stream, batch_runs=self.batch_runs,
                             resume_hint=command(self.scale, self.device, self.budget_min))

    def _measure(self, t: Table, chunk: list[RunSpec], runs_dir: Path, rounds_before: int,
                 seconds: float) -> None:
        done = rounds_before - sum(_rounds_left(runs_dir / s.name, s) for s in chunk)
        if done > 0 and seconds > 0:
            self.step_state(t.key)["s_per_run_round"] = seconds / done
            self.save_state()

    def _export(self, t: Table, out: Path, specs: list[RunSpec], complete: bool) -> None:
        finished = [paper_results.Run(out / "runs" / s.name, s.name, s.group, s.label,
                                      _config(out / "runs" / s.name), s.settings)
                    for s in specs if paper_results.is_finished(out / "runs" / s.name)]
        if not finished:
            return
        csv_path = self.results / t.paper / f"{t.experiment}.csv"
        paper_results.export_runs(finished, csv_path, t.setting_of, t.algorithm_of, t.extra_columns,
                                  digits=7)
        seeds = sorted({r.seed for r in finished})
        paper_results.write_meta(
            csv_path.with_suffix(".json"), t.experiment, t.paper,
            command(self.scale, self.device, self.budget_min, t.key), _device_name(self.device),
            self.step_state(t.key)["minutes"] + (self.clock() - self._step_t0) / 60, seeds,
            commit=" ".join(dict.fromkeys(s.get("commit", "?") for s in self.state["sittings"])),
            scale=self.scale, complete=complete, runs=len(finished), runs_planned=len(specs), table=t.title,
        )
        self.say(f"{t.key}: {len(finished)}/{len(specs)} runs in {csv_path}")


def _config(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _rounds_left(run_dir: Path, spec: RunSpec) -> int:
    """Rounds the run still has to do (from its metrics.csv when it has started)."""
    rounds = int(spec.settings.get("rounds", 1))
    if paper_results.is_finished(run_dir):
        return 0
    path = run_dir / "metrics.csv"
    if not path.exists():
        return rounds
    try:
        done = sum(1 for _ in path.open()) - 2  # header and round 0
    except OSError:
        return rounds
    return max(0, rounds - max(0, done))


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """SIGINT to this process after `seconds` (the runner's graceful stop), cancelled on exit."""
    timer = threading.Timer(max(0.0, seconds), os.kill, (os.getpid(), signal.SIGINT))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _device_slug(device: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in device)


def _bench_devices(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def _device_name(device: str) -> str:
    # lazy: torch loads only when the device is checked
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device}: {torch.cuda.get_device_name(0)}; torch {torch.__version__}"
    return f"{device}: {os.cpu_count()}-core machine; torch {torch.__version__}"


def run_campaign(scale: str, device: str, budget: float, out: Path, results: Path,
                 batch_runs: int = 8, tables: tuple[str, ...] | None = None,
                 stream: TextIO | None = None) -> dict[str, Any]:
    """`fedhet reproduce all`: one sitting of the campaign."""
    return Campaign(scale, device, budget, out, results, batch_runs, steps=tables or STEPS,
                    stream=stream or sys.stderr).run()
