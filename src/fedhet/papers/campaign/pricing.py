"""What a campaign run costs on a device kind, from measurements only.

A run's **load** per round (`round_load`) is counted in sample-passes: the samples its clients
train (a forward and backward pass each; FedSR's ring passes, HierFAVG's edge rounds, MOON's
two extra forward passes, FedVeca's full local gradient included) plus a third of each sample
it evaluates (a forward pass). Its **price** on a device kind (`cpu`: one core; `cuda`: one
GPU) is its rounds left times a measured seconds per round, the first of:

1. **measured**: the median seconds per round of the same table's runs of the same method on
   that kind (from the records and the cached and travelling runs' segments, those since the
   kind's bench record was measured), each segment's round divided among the runs stacked in
   it (`runs_stacked`): a run's share of the device;
2. **bench**: the device kind's committed bench record (`RESULTS/campaign/bench/<kind>.json`,
   `bench.py`): the seconds per sample-pass measured on the same model, with the nearest count
   of clients stepping at once (clients stacked × runs stacked; on a CPU one at a time), times
   the run's work;
3. none: the kind is not priced, and no cell is planned on it.

A sitting replaces these with its own measurements as its runs save rounds. No small-batch
penalty is assumed: on a GPU the bench record measures the stacks the plan uses (`bench.py`'s
GPU workloads), and on a CPU clients run one at a time.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from fedhet.papers.campaign.records import Store, read_segments, segment_runs, segment_s_per_round
from fedhet.papers.campaign.tables import CampaignRun

DATA_SIZES: dict[str, tuple[int, int]] = {
    "mnist": (60_000, 10_000), "mnist-even-odd": (60_000, 10_000),
    "fashion-mnist": (60_000, 10_000), "cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000),
    "digits": (1_347, 450),
}
"""`(train, test)` samples of the campaign's datasets (digits: scikit-learn's 1,797 split 3:1)."""
ALGORITHM_PASSES: dict[str, float] = {"moon": 5 / 3}
"""Training cost of a sample relative to one forward and backward pass: MOON adds two forward
passes (the global and the previous model, each a third of a step)."""
KINDS = ("cpu", "cuda")


def kind_of(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


@dataclass(frozen=True)
class RoundLoad:
    """What one run computes per round, in samples (the unit a price is measured in)."""

    model: str
    trained: float
    """Samples through a forward and backward pass per round (× `ALGORITHM_PASSES`)."""
    evaluated: float
    """Samples through a forward pass per round."""
    stacked: int
    """Clients that step at once on the stacked executor (every sampled one on a star; one per
    ring on a ring topology)."""
    rounds: int

    @property
    def passes(self) -> float:
        """Sample-passes per round: samples trained plus a third of the samples evaluated."""
        return self.trained + self.evaluated / 3


def _rings(clients: int, settings: dict[str, Any]) -> int:
    q = int(settings.get("algorithm.cluster_size", 0))
    return max(1, clients // q) if q else int(settings.get("algorithm.clusters", 1))


def round_load(settings: dict[str, Any]) -> RoundLoad:
    """One run's `RoundLoad` from its settings: `E·D·p` samples trained a round (× FedSR's ring
    passes, × HierFAVG's κ₂; FedVeca: at most `τ_max` steps per client plus its full local
    gradient; the centralized baseline: one client holding all `D`), the test set (and with
    `train_loss` the training set) evaluated every `eval_every` rounds."""
    # lazy: the registries load only when a run is priced
    from fedhet.algorithms import ALGORITHMS

    algorithm = str(settings.get("algorithm", "fedavg"))
    train, test = DATA_SIZES.get(str(settings.get("dataset", "mnist")), DATA_SIZES["mnist"])
    limit, limit_test = (int(settings.get(f"dataset.limit_{k}", 0) or 0) for k in ("train", "test"))
    train = min(train, limit) if limit else train
    test = min(test, limit_test) if limit_test else test
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
    stacked = _rings(sampled, settings) if topology == "edge-ring" else 1 if topology == "ring" \
        else sampled
    evals = test / int(settings.get("eval_every", 1)) + (train if settings.get("train_loss") else 0)
    return RoundLoad(str(settings.get("model", "mlp")), samples * ALGORITHM_PASSES.get(algorithm, 1.0),
                evals, stacked, int(settings.get("rounds", 1)))


CHAIN_SETTINGS = ("clients", "sample_fraction", "local_epochs", "local_steps", "client_steps",
                  "batch_size", "algorithm.ring_passes", "algorithm.cluster_size",
                  "algorithm.clusters", "algorithm.kappa2", "algorithm.tau_max")
"""Settings besides the partition that set how long a round's chain of local steps is."""


def chain_shape(settings: dict[str, Any]) -> str:
    """What sets the longest chain of sequential local steps in a run's round: the topology
    (a ring's hops follow one another; a centralized run is one client over all the data), the
    partition (its largest client), the local epochs or steps and the mini-batch. Runs stacked
    on a GPU step together until the longest chain ends, so a stack takes runs of one shape
    (`Sitting._next_unit`): a FedSR ring run beside FedAvg runs would hold each round of theirs
    for its ring's whole walk."""
    # lazy: the registries load only when a run is priced
    from fedhet.algorithms import ALGORITHMS

    algorithm = ALGORITHMS.get(str(settings.get("algorithm", "fedavg"))).factory
    shape = {k: v for k, v in settings.items() if k.startswith("partition") or k in CHAIN_SETTINGS}
    return json.dumps({"topology": algorithm.topology, "centralized": algorithm.centralized,
                       **shape}, sort_keys=True, default=str)


def read_bench(store: Store, kind: str) -> dict[str, Any]:
    path = store.bench_dir / f"{kind}.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Price:
    seconds_per_round: float
    source: str
    """`measured` (this method's runs on the kind), `bench` (the kind's bench record)."""


class Pricer:
    """Prices of runs on each device kind, from the records, the cache and the bench records."""

    def __init__(self, store: Store, runs: list[CampaignRun], runs_stacked: int = 1) -> None:
        self.store = store
        self.runs_stacked = runs_stacked
        self.bench = {k: read_bench(store, k) for k in KINDS}
        self.measured: dict[tuple[str, str, str], list[float]] = {}
        seen: set[tuple[str, str]] = set()
        for table in {r.table for r in runs}:
            for name, rec in store.recorded(table).items():
                seen.add((table, name))
                label = str(rec.get("label", ""))
                if rec.get("segments"):
                    self._add(table, label, rec["segments"])
                    continue
                for kind, s in (rec.get("s_per_round") or {}).items():
                    self.measured.setdefault((table, label, kind), []).append(float(s))
        for r in runs:
            if (r.table, r.name) in seen:
                continue
            for d in (store.run_dir(r.table, r.name), store.inflight(r.table) / r.name):
                segs = read_segments(d)
                if segs:
                    self.note(r, segs)
                    break

    def note(self, run: CampaignRun, segments: list[dict[str, Any]]) -> None:
        """Add a run's measured segments (a sitting's own measurement)."""
        self._add(run.table, run.spec.label, segments)

    def _add(self, table: str, label: str, segments: list[dict[str, Any]]) -> None:
        """Each segment's seconds per round as this run's share: a round of `runs_stacked` runs
        stepped together is counted once among them, so its time divided by them. A segment
        older than its kind's bench record is left out **[choice]**: a bench measured again
        (`gpu_campaign.py --remeasure`, after the executor changed) prices the kind anew, and
        the runs' own rounds count again from then on."""
        for s in segments:
            since = str(self.bench.get(s.get("kind", ""), {}).get("date", ""))
            if since and str(s.get("date", "")) < since:
                continue
            v = segment_s_per_round(s)
            if v is not None:
                share = v / segment_runs(s)
                self.measured.setdefault((table, label, s["kind"]), []).append(share)

    def price(self, run: CampaignRun, kind: str) -> Price | None:
        m = self.measured.get((run.table, run.spec.label, kind))
        if m:
            return Price(statistics.median(m), "measured")
        per_pass = self._per_pass(run, kind)
        if per_pass is None:
            return None
        return Price(per_pass * round_load(run.spec.settings).passes, "bench")

    def _per_pass(self, run: CampaignRun, kind: str) -> float | None:
        rows = self.bench.get(kind, {}).get("measurements", [])
        w = round_load(run.spec.settings)
        model = {"moon-mlp": "mlp", "moon-cnn": "cnn-cifar"}.get(w.model, w.model)
        precision = str(run.spec.settings.get("precision", "fp32"))
        same = [r for r in rows if r.get("model") == model and r.get("passes", 0) > 0
                and r.get("s_per_round", 0) > 0 and r.get("precision", "fp32") == precision]
        if not same:
            return None
        stack = w.stacked * (self.runs_stacked if kind == "cuda" else 1)
        best = min(same, key=lambda r: abs(math.log(max(1, r.get("stacked", 1) * r.get("runs", 1))
                                                    / max(1, stack))))
        # runs stacked share one round's time: each run's share of it
        return best["s_per_round"] / (best["passes"] * max(1, best.get("runs", 1)))

    def minutes(self, run: CampaignRun, kind: str, rounds: int) -> float | None:
        p = self.price(run, kind)
        return None if p is None else p.seconds_per_round * rounds / 60


def where(pricer: Pricer, run: CampaignRun, device: str) -> str:
    """The kind a run is cheapest on among those priced, `device`'s kind when it alone is."""
    prices = {k: pricer.price(run, k) for k in KINDS}
    priced = {k: p.seconds_per_round for k, p in prices.items() if p is not None}
    if not priced:
        return kind_of(device)
    return min(priced, key=lambda k: priced[k])

