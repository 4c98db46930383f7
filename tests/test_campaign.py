"""The campaign (papers/campaign): the papers' tables at their own scale, headline cells
first, accumulated across machines through records and travelling checkpoints."""

from __future__ import annotations

import io
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from fedhet.papers import paper_results as pr
from fedhet.papers.campaign import bench, records, tables
from fedhet.papers.campaign import sitting as sitting_module
from fedhet.papers.campaign.plan import cells as plan_cells
from fedhet.papers.campaign.plan import status
from fedhet.papers.campaign.pricing import Pricer, round_load
from fedhet.papers.campaign.records import Store
from fedhet.papers.campaign.sitting import Sitting
from fedhet.papers.campaign.tables import TABLES, Table, plan_runs

ROOT = Path(__file__).resolve().parents[1]

TINY = Table("fednova-smoke", "fednova", "synthetic", "FedNova smoke", ("synthetic",),
             headline=lambda s: s.label == "FedNova", paper_seeds=1)
"""FedNova's smoke preset: 3 runs (FedAvg, FedNova, FedProx) × 15 rounds on Synthetic(1,1)."""


@pytest.fixture(scope="module")
def _forkserver():
    """A fork server that has imported the engine once: a sitting's workers here are forked from
    it, each run still in a process of its own (its budget, stop, nice and exit code as with
    "spawn"), without each importing torch again (seconds a run on a loaded machine). Started
    here, before any test changes the environment it would inherit. `reproduce all` from the
    command line keeps "spawn" (test_sigterm_stops_a_sitting_after_a_saved_round)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["torch", "fedhet.runs.single"])
    multiprocessing.forkserver.ensure_running()


@pytest.fixture(autouse=True)
def _workers_from_the_forkserver(_forkserver, monkeypatch):
    monkeypatch.setattr(sitting_module, "START_METHOD", "forkserver")


def _plan(tmp: Path, scale: str = "paper") -> list[tables.CampaignRun]:
    store = Store(tmp / "results", tmp / "cache", scale)
    return plan_runs(scale, TABLES, store.records)


# -- the order ----------------------------------------------------------------------------------
def test_headline_cells_first_then_their_seeds_then_the_rest(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    head = [(r.table, r.spec.group, r.spec.label, r.seed) for r in plan if r.tier == 0]
    # the campaign's order (papers/campaign/tables.py): each paper's headline pair, seed 0, first
    assert head == [
        ("fednnnn-mnist", "MNIST NonIID-UB", "FedAvg", 0), ("fednnnn-mnist", "MNIST NonIID-UB", "FedNNNN", 0),
        ("fedsr-mnist", "MNIST xi=2", "FedAvg", 0), ("fedsr-mnist", "MNIST xi=2", "FedSR", 0),
        ("fedveca-cnn-mnist", "CNN MNIST Case 3", "FedVeca", 0),
        ("bherd-cnn-mnist", "CNN + MNIST case3", "FedAvg", 0),
        ("bherd-cnn-mnist", "CNN + MNIST case3", "BHerd-FedAvg", 0),
        ("fedsr-fashion-mnist", "Fashion-MNIST xi=2", "FedAvg", 0),
        ("fedsr-fashion-mnist", "Fashion-MNIST xi=2", "FedSR", 0),
    ]
    assert plan[:len(head)] == [r for r in plan if r.tier == 0]
    assert [r.tier for r in plan] == sorted(r.tier for r in plan)
    # the paper's own seed count first: FedNNNN and FedSR ran once, so their seeds 1-2 are extras
    # (tier 3); FedVeca and BHerd averaged 10 runs, so seeds 1-9 of their headline cells are tier 1
    for r in plan:
        if r.table in ("fednnnn-mnist", "fedsr-mnist") and r.seed > 0:
            assert r.tier == 3
    tier1 = {(r.table, r.seed) for r in plan if r.tier == 1 and not r.variant}
    assert tier1 == {(t, s) for t in ("fedveca-cnn-mnist", "bherd-cnn-mnist") for s in range(1, 10)}
    # and after them the headline's other reading (BHerd grab-stale, seeds 0-3)
    beside = {(r.table, r.seed) for r in plan if r.tier == 1 and r.variant}
    assert beside == {("bherd-cnn-mnist", s) for s in range(4)}
    # every table's runs are the preset's at paper scale, on the table's datasets only
    fednnnn = [r for r in plan if r.table == "fednnnn-mnist"]
    preset = [r for r in fednnnn if not r.spec.group.endswith("(cut=label)")]
    assert len(preset) == 4 * 5 * 3 and len(fednnnn) == len(preset) + 4  # + the alternative cells
    assert all(r.rounds == 100 for r in fednnnn)
    assert all(r.spec.settings["precision"] == "bf16" for r in fednnnn)
    assert all(r.spec.settings["dataset"] == "mnist" for r in plan if r.table.endswith("-mnist")
               and "fashion" not in r.table)


def _rounds(run_dir: Path, rounds: int, checkpoint: bool = False) -> None:
    run_dir.mkdir(parents=True)
    lines = ["round,test_accuracy", *(f"{k},0.5" for k in range(rounds + 1))]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    if checkpoint:
        (run_dir / "checkpoint.pt").write_bytes(b"")


def test_a_gpu_sitting_finishes_the_runs_under_way_before_it_starts_new_ones(tmp_path: Path) -> None:
    """On a GPU a run with rounds saved (a travelling checkpoint, or this machine's cache) goes
    before every run not started, whatever its place in the plan; each group keeps the plan's
    order."""
    store = Store(tmp_path / "results", tmp_path / "cache")
    s = Sitting("paper", "cpu", 60.0, store, stream=io.StringIO(), commit="test")
    s.kind, s.device, s.stack_runs = "cuda", "cuda", 1  # the GPU's order, without a GPU here
    plan = s.plan()
    travelling, cached = plan[-1], plan[-5]
    _rounds(store.inflight(travelling.table) / travelling.name, 7, checkpoint=True)
    _rounds(store.run_dir(cached.table, cached.name), 3)
    pricer = Pricer(store, plan)  # no bench record: unpriced, so the two keep the plan's order
    order = s.under_way_first(plan, pricer)
    assert order[:2] == [cached, travelling]
    assert order[2:] == [r for r in plan if r not in (cached, travelling)]
    assert s._next_unit(plan, set(), pricer) == [cached]
    assert s._next_unit(plan, {cached.name}, pricer) == [travelling]
    # priced: the one with the least time left first (here the travelling one, 1 s a round)
    prices = {cached.name: 100.0, travelling.name: 1.0}

    class Priced:
        def price(self, r, kind):  # noqa: ANN001, ANN202
            assert kind == "cuda"
            return types.SimpleNamespace(seconds_per_round=prices.get(r.name, 50.0))

    assert s.under_way_first(plan, Priced())[:2] == [travelling, cached]
    assert s.order(plan, Priced())[:2] == [travelling, cached]
    # none under way: the plan's order (headline cells first)
    fresh = Sitting("paper", "cpu", 60.0, Store(tmp_path / "r2", tmp_path / "c2"),
                    stream=io.StringIO(), commit="test")
    fresh.kind, fresh.device, fresh.stack_runs = "cuda", "cuda", 1
    assert fresh._next_unit(plan, set(), Pricer(fresh.store, plan)) == [plan[0]]


class Hours:
    """A pricer by hand: each run's whole CPU price in core-hours (`hours`, by name; `default`
    otherwise), spread evenly over its rounds; no GPU price."""

    def __init__(self, hours: dict[str, float], default: float = 1.0) -> None:
        self.hours, self.default = hours, default

    def price(self, r: tables.CampaignRun, kind: str) -> types.SimpleNamespace | None:
        if kind != "cpu":
            return None
        h = self.hours.get(r.name, self.default)
        return types.SimpleNamespace(seconds_per_round=h * 3600 / r.rounds, source="measured")


def _pick(plan: list[tables.CampaignRun], table: str, group: str, label: str,
          seed: int) -> tables.CampaignRun:
    return next(r for r in plan
                if (r.table, r.spec.group, r.spec.label, r.seed) == (table, group, label, seed))


def test_a_cpu_sitting_takes_the_most_claim_per_core_hour_first(tmp_path: Path) -> None:
    """On a CPU: a run of many core-hours waits (even under way), the paper's seed count before
    extra seeds, and among one tier the cell with the fewest core-hours left first; within a
    cell the run under way first."""
    store = Store(tmp_path / "results", tmp_path / "cache")
    s = Sitting("paper", "cpu", 600.0, store, stream=io.StringIO(), commit="test")
    plan = s.plan()
    fashion = _pick(plan, "fedsr-fashion-mnist", "Fashion-MNIST xi=2", "FedAvg", 0)  # tier 0
    bherd = _pick(plan, "bherd-cnn-mnist", "CNN + MNIST case3", "FedAvg", 4)  # tier 1
    prox_xi2 = _pick(plan, "fedsr-mnist", "MNIST xi=2", "FedProx", 0)  # tier 2
    avg_iid_b = _pick(plan, "fednnnn-mnist", "MNIST IID-B", "FedAvg", 0)  # tier 2
    prox_iid_b = _pick(plan, "fednnnn-mnist", "MNIST IID-B", "FedProx", 0)  # tier 2
    extra = _pick(plan, "fedsr-mnist", "MNIST xi=4", "FedAvg", 1)  # tier 3
    assert [r.tier for r in (fashion, bherd, prox_xi2, avg_iid_b, prox_iid_b, extra)] == [0, 1, 2, 2, 2, 3]
    # the Fashion-MNIST run is under way (34 rounds travel): 12 core-hours, 11.2 left
    _rounds(store.inflight(fashion.table) / fashion.name, 34, checkpoint=True)
    # FedProx at IID-B is half done here: its cell has 1 + 0.5 core-hours left, xi=2's cell 1
    _rounds(store.run_dir(prox_iid_b.table, prox_iid_b.name), 50)
    pricer = Hours({fashion.name: 12.0, extra.name: 0.5})
    todo = [extra, prox_iid_b, avg_iid_b, prox_xi2, bherd, fashion]
    assert s.order(todo, pricer) == [bherd, prox_xi2, prox_iid_b, avg_iid_b, extra, fashion]
    assert s._next_unit(todo, set(), pricer) == [bherd]
    # nothing cheaper left: the heavy run continues on the CPU
    assert s._next_unit([fashion], set(), pricer) == [fashion]
    # a GPU keeps its order: the runs under way first, the least time left first
    s.kind = "cuda"
    assert s.order(todo, pricer)[:2] == [prox_iid_b, fashion]


def test_the_plan_on_a_cpu_lists_the_cells_in_a_cpu_sittings_order(tmp_path: Path) -> None:
    """`reproduce plan --device cpu`: the cells of cheap runs at the paper's seed count first,
    the cells whose runs cost many core-hours last, even one under way; on a GPU that one first."""
    store = Store(tmp_path / "results", tmp_path / "cache")
    plan = plan_runs("paper", TABLES, store.records)
    heavy = {r.name: 12.0 for r in plan if r.table == "fedsr-fashion-mnist"}
    fashion = _pick(plan, "fedsr-fashion-mnist", "Fashion-MNIST xi=2", "FedAvg", 0)
    _rounds(store.inflight(fashion.table) / fashion.name, 34, checkpoint=True)
    cpu = plan_cells(store, plan, "cpu", Hours(heavy))
    n_fashion = sum(1 for c in cpu if c.table == "fedsr-fashion-mnist")
    assert n_fashion > 1 and {c.table for c in cpu[-n_fashion:]} == {"fedsr-fashion-mnist"}
    # first: the tier-0 cell with the fewest core-hours (FedNNNN NonIID-UB: 5 methods × 1 h)
    assert (cpu[0].table, cpu[0].setting, cpu[0].headline) == ("fednnnn-mnist", "MNIST NonIID-UB", True)
    gpu = plan_cells(store, plan, "cuda", Hours(heavy))
    assert (gpu[0].table, gpu[0].setting) == ("fedsr-fashion-mnist", "Fashion-MNIST xi=2")


def test_bherd_case3_also_runs_under_grab_stale_beside_the_recorded_greedy_runs(tmp_path: Path) -> None:
    """BHerd-FedAvg at CNN + MNIST Case 3 under `criterion=grab-stale`: seeds 0-3 (as many as the
    greedy runs first recorded), at the paper's seed count, each a run of its own: every run
    the preset plans keeps its name and settings."""
    plan = [r for r in _plan(tmp_path) if r.table == "bherd-cnn-mnist"]
    stale = [r for r in plan if r.spec.settings.get("algorithm.criterion") == "grab-stale"]
    assert sorted(r.seed for r in stale) == [0, 1, 2, 3]
    assert {r.name for r in stale} == {"main-cnn-mnist-case3-bherd-grabstale",
                                       *(f"main-cnn-mnist-case3-bherd-grabstale_s{k}" for k in (1, 2, 3))}
    assert all(r.spec.label == "BHerd-FedAvg[criterion=grab-stale]" and r.tier == 1 and r.variant
               and r.spec.group == "CNN + MNIST case3" and r.serves == ("CNN + MNIST case3",)
               for r in stale)
    greedy = {r.seed: r for r in plan if r.spec.label == "BHerd-FedAvg" and r.spec.group.endswith("case3")}
    for r in stale:  # the same run as the greedy one of its seed, but for the criterion
        same = {k: v for k, v in r.spec.settings.items() if k != "algorithm.criterion"}
        assert same == greedy[r.seed].spec.settings
        assert "algorithm.criterion" not in greedy[r.seed].spec.settings
    # the recorded greedy runs keep their names
    recorded = {p.name for p in (ROOT / "results" / "campaign" / "bherd-cnn-mnist").iterdir()}
    assert recorded and recorded <= {r.name for r in plan} - {r.name for r in stale}


def test_the_grab_stale_runs_come_right_after_the_bherd_headline_seeds(tmp_path: Path) -> None:
    """In the plan, in a CPU sitting's order and in `reproduce plan` (CPU and GPU), the four
    grab-stale runs follow the BHerd headline cell's seeds at once, in a line of their own with
    their price."""
    store = Store(tmp_path / "results", tmp_path / "cache")
    plan = plan_runs("paper", TABLES, store.records)

    def bherd_head_then_stale(runs: list[tables.CampaignRun]) -> None:
        head = [i for i, r in enumerate(runs) if r.table == "bherd-cnn-mnist" and r.headline]
        stale = [i for i, r in enumerate(runs) if r.variant]
        assert len(stale) == 4 and stale == list(range(max(head) + 1, max(head) + 5))

    bherd_head_then_stale(plan)
    # a CPU sitting after the tier-0 cells: every run 1 core-hour but Fashion-MNIST's (heavy)
    heavy = {r.name: 12.0 for r in plan if r.table == "fedsr-fashion-mnist"}
    s = Sitting("paper", "cpu", 600.0, store, stream=io.StringIO(), commit="test")
    bherd_head_then_stale(s.order([r for r in plan if r.tier > 0], Hours(heavy)))
    for device in ("cpu", "cuda"):
        rows = plan_cells(store, [r for r in plan if r.tier > 0], device, Hours(heavy))
        at = next(i for i, c in enumerate(rows) if c.variant)
        assert rows[at].labels == ["BHerd-FedAvg[criterion=grab-stale]"] and rows[at].left == 4
        assert rows[at].minutes == {"cpu": 4 * 60.0}
        if device == "cpu":
            assert (rows[at - 1].table, rows[at - 1].headline) == ("bherd-cnn-mnist", True)


def test_another_reading_of_a_partition_runs_after_the_paper_seed_count_cells(tmp_path: Path) -> None:
    """The alternative cells (`cut=label`: FedNNNN NonIID-B and NonIID-UB FedAvg and FedNNNN,
    FedSR xi=2 FedAvg and FedSR, seed 0) are cells of their own, planned after every run at the
    paper's seed count, each the preset's run of its cell but for the partition's cut."""
    plan = _plan(tmp_path)
    alt = [r for r in plan if r.spec.group.endswith("(cut=label)")]
    assert sorted((r.spec.group, r.spec.label) for r in alt) == [
        ("MNIST NonIID-B (cut=label)", "FedAvg"), ("MNIST NonIID-B (cut=label)", "FedNNNN"),
        ("MNIST NonIID-UB (cut=label)", "FedAvg"), ("MNIST NonIID-UB (cut=label)", "FedNNNN"),
        ("MNIST xi=2 (cut=label)", "FedAvg"), ("MNIST xi=2 (cut=label)", "FedSR")]
    last_paper_count = max(r.order for r in plan if r.tier < 3)
    assert all(r.tier == 3 and r.seed == 0 and r.order > last_paper_count for r in alt)
    for r in alt:
        base = next(x for x in plan if x.table == r.table and x.spec.label == r.spec.label
                    and x.seed == 0 and x.spec.group == r.spec.group.removesuffix(" (cut=label)"))
        assert r.spec.settings == {**base.spec.settings, "partition.cut": "label"}
        assert r.name != base.name and r.serves == (r.spec.group,)


def test_the_centralized_reference_runs_once_per_seed_and_serves_every_cell(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    for key, cells in (("bherd-cnn-mnist", 3), ("fedsr-mnist", 5)):
        central = [r for r in plan if r.table == key and r.spec.settings["algorithm"] == "central"]
        seeds = sorted(r.seed for r in central)
        assert seeds == sorted(set(seeds)), "one centralized run per seed"
        assert all(len(r.serves) == cells and r.spec.settings["partition"] == "iid" for r in central)


def test_fedveca_evaluates_on_the_test_set_only(tmp_path: Path) -> None:
    fv = [r for r in _plan(tmp_path) if r.table == "fedveca-cnn-mnist"]
    assert len(fv) == 10 and all(r.spec.settings["train_loss"] is False for r in fv)
    assert "test set only" in tables.table("fedveca-cnn-mnist").deviations


# -- work and prices ----------------------------------------------------------------------------
def test_work_by_hand() -> None:
    """FedNNNN: 100 clients × E = 5 over 60,000 samples, the 10,000 test samples a third each."""
    w = round_load({"algorithm": "fedavg", "dataset": "mnist", "model": "cnn-fednnnn-mnist",
                  "clients": 100, "local_epochs": 5, "rounds": 100})
    assert (w.passes, w.stacked, w.rounds) == (pytest.approx(300_000 + 10_000 / 3), 100, 100)
    base = {"dataset": "mnist", "model": "mlp", "clients": 20, "local_epochs": 1, "rounds": 500,
            "eval_every": 10**9}
    fedsr = round_load({**base, "algorithm": "fedsr", "algorithm.clusters": 5, "algorithm.ring_passes": 5})
    assert fedsr.passes == pytest.approx(5 * 60_000) and fedsr.stacked == 5
    assert round_load({**base, "algorithm": "ring"}).stacked == 1
    assert round_load({**base, "algorithm": "moon"}).passes == pytest.approx(60_000 * 5 / 3)
    assert round_load({**base, "algorithm": "central"}).stacked == 1
    fv = round_load({**base, "algorithm": "fedveca", "clients": 5, "batch_size": 32, "eval_every": 1,
                   "train_loss": True})
    assert fv.passes == pytest.approx(5 * 50 * 32 + 60_000 + 70_000 / 3)
    cut = round_load({**base, "algorithm": "fedavg", "dataset.limit_train": 6000, "dataset.limit_test": 2000,
                    "eval_every": 1})
    assert cut.passes == pytest.approx(6000 + 2000 / 3)


def _bench(store: Store, kind: str, rows: list[dict]) -> None:
    store.bench_dir.mkdir(parents=True, exist_ok=True)
    (store.bench_dir / f"{kind}.json").write_text(json.dumps({"kind": kind, "measurements": rows}))


def test_prices_come_from_measurements_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "results", tmp_path / "cache")
    plan = plan_runs("paper", (tables.table("fednnnn-mnist"),), store.records)
    run = plan[0]
    assert Pricer(store, plan).price(run, "cpu") is None  # nothing measured: not priced
    # the bench record: 2 s for 10,000 sample-passes of the same model and precision
    _bench(store, "cpu", [{"model": "cnn-fednnnn-mnist", "precision": "bf16", "stacked": 100, "runs": 1,
                           "passes": 10_000, "s_per_round": 2.0},
                          {"model": "cnn-fednnnn-mnist", "precision": "fp32", "stacked": 100, "runs": 1,
                           "passes": 10_000, "s_per_round": 50.0}])
    p = Pricer(store, plan).price(run, "cpu")
    assert p is not None and p.source == "bench"
    assert p.seconds_per_round == pytest.approx(2.0 / 10_000 * (300_000 + 10_000 / 3))
    # on a GPU, runs stacked share a round: 8 runs in 4 s cost each 0.5 s of it
    _bench(store, "cuda", [{"model": "cnn-fednnnn-mnist", "precision": "bf16", "stacked": 100,
                            "runs": 8, "passes": 10_000, "s_per_round": 4.0}])
    g = Pricer(store, plan, runs_stacked=8).price(run, "cuda")
    assert g is not None and g.seconds_per_round == pytest.approx(0.5 / 10_000 * (300_000 + 10_000 / 3))
    # a run's own measurement wins over the bench: the same method's runs on the same kind
    pricer = Pricer(store, plan)
    pricer.note(run, [{"kind": "cpu", "rounds": 10, "seconds": 420.0}])
    same = next(r for r in plan if r.spec.label == run.spec.label and r is not run)
    assert pricer.price(same, "cpu").seconds_per_round == pytest.approx(42.0)
    assert pricer.price(same, "cpu").source == "measured"
    # a round of 8 runs stepped together on a GPU costs each run an eighth of it
    pricer.note(run, [{"kind": "cuda", "rounds": 10, "seconds": 80.0, "median_round_s": 8.0,
                       "runs_stacked": 8}])
    assert pricer.price(same, "cuda").seconds_per_round == pytest.approx(1.0)


@pytest.mark.parametrize("key", ["runs_stacked", "runs_batched"])
def test_a_recorded_runs_price_is_its_share_of_the_stacked_round(tmp_path: Path, key: str) -> None:
    """A record whose rounds ran stacked with 7 other runs prices its method at an eighth of
    the round (not the stack's whole round, as its `s_per_round` reads); records written by
    earlier releases name the count `runs_batched`."""
    store = Store(tmp_path / "results", tmp_path / "cache")
    plan = plan_runs("paper", (tables.table("fednnnn-mnist"),), store.records)
    run = plan[0]
    folder = store.root / run.table / run.name
    folder.mkdir(parents=True)
    (folder / "record.json").write_text(json.dumps({
        "table": run.table, "run": run.name, "label": run.spec.label, "s_per_round": {"cuda": 4.0},
        "segments": [{"kind": "cuda", "rounds": 100, "seconds": 400.0, "median_round_s": 4.0,
                      key: 8}]}))
    same = next(r for r in plan if r.spec.label == run.spec.label and r is not run)
    assert Pricer(store, plan).price(same, "cuda").seconds_per_round == pytest.approx(0.5)


# -- sittings -----------------------------------------------------------------------------------
class Stepped(Sitting):
    """A sitting whose clock jumps past the budget's grace once its first run starts: the run
    stops after its first saved round (the stop is set before the worker trains anything)."""

    jump = 0.0

    def _launch(self, unit, stop, ctx, pricer):  # noqa: ANN001, ANN202
        a = super()._launch(unit, stop, ctx, pricer)
        self.offset[0] += self.jump
        return a


def _sitting(tmp: Path, cache: str, cls: type[Sitting] = Sitting, results: str = "results",
             budget: float = 10.0, tables: tuple[Table, ...] = (TINY,), **kw) -> Sitting:  # noqa: ANN003
    offset = [0.0]
    kw.setdefault("nice", 0)  # a test's runs at the test's own priority: a loaded machine
    # (niced neighbours, a busy CI) must not starve them
    s = cls("smoke", "cpu", budget, Store(tmp / results, tmp / cache, "smoke"), tables=tables,
            stream=io.StringIO(), clock=lambda: time.monotonic() + offset[0], commit="test", **kw)
    s.offset = offset
    return s


def _csv(tmp: Path, results: str = "results") -> Path:
    return tmp / results / "campaign-smoke" / "tables" / "fednova" / "synthetic.csv"


def test_a_run_counts_wherever_it_finished(tmp_path: Path) -> None:
    first = _sitting(tmp_path, "cache-a", cores=2)
    first.run()
    assert len(first.finished) == 3
    store = first.store
    for name, rec in store.recorded(TINY.key).items():
        files = sorted(p.name for p in (store.records(TINY) / name).iterdir())
        assert files == ["config.json", "metrics.csv", "record.json", "summary.json"]  # no checkpoint
        assert rec["commits"] == ["test"] and rec["s_per_round"]["cpu"] > 0
        assert rec["segments"][0]["rounds"] == 15
    rows = pr.read_rows(_csv(tmp_path))
    assert len(rows) == 3 * 16
    # another machine (an empty cache), the same repository: nothing is run again
    second = _sitting(tmp_path, "cache-b")
    second.run()
    assert second.finished == [] and second.started == set()
    assert "0 of 3 left" in second.stream.getvalue()
    assert pr.read_rows(_csv(tmp_path)) == rows
    # a record removed: only that run is made again, and the table keeps every other row
    victim = sorted(store.recorded(TINY.key))[0]
    import shutil

    shutil.rmtree(store.records(TINY) / victim)
    third = _sitting(tmp_path, "cache-b")
    third.run()
    assert third.started == {victim}
    assert pr.read_rows(_csv(tmp_path)) == rows  # the same run again: the same numbers


def test_a_result_never_shrinks(tmp_path: Path) -> None:
    _sitting(tmp_path, "cache").run()
    csv_path = _csv(tmp_path)
    extra = "\n".join(f"other,fedavg,0,{k},0.5,1.0," for k in range(3))
    csv_path.write_text(csv_path.read_text() + extra + "\n")
    before = pr.read_rows(csv_path)
    store = Store(tmp_path / "results", tmp_path / "cache", "smoke")
    store.export_table(TINY, plan_runs("smoke", (TINY,), store.records), "cmd")
    after = pr.read_rows(csv_path)
    assert len(after) == len(before)
    assert {r["setting"] for r in after} == {"other", *{r["setting"] for r in before}}


def test_a_run_cut_short_travels_and_continues_on_another_machine(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    # the reference: the three runs uninterrupted
    _sitting(tmp_path, "cache-ref", results="ref").run()
    ref = pr.read_rows(_csv(tmp_path, "ref"))
    # machine A: the budget's grace reached as soon as the first run starts: it stops after
    # round 1 and nothing else starts. Its worker is spawned, as `reproduce all` does: a fresh
    # interpreter takes seconds to import torch, so the stop is set before it trains (forked
    # from the preloaded server, it could finish the 15 rounds before the sitting's next look)
    monkeypatch.setattr(sitting_module, "START_METHOD", "spawn")
    a = _sitting(tmp_path, "cache-a", Stepped, budget=1.0)
    a.jump = 45.0
    a.run()
    monkeypatch.setattr(sitting_module, "START_METHOD", "forkserver")
    assert a.finished == [] and len(a.started) == 1
    name = next(iter(a.started))
    travelling = a.store.inflight(TINY) / name
    assert (travelling / "checkpoint.pt").exists() and not (travelling / "checkpoint.prev.pt").exists()
    assert 1 <= records.rounds_done(travelling) < 15
    line = json.loads(a.store.sittings.read_text().splitlines()[-1])
    assert line["travelling"] == [name] and line["recorded"] == []
    # machine B (a new cache): the checkpoint is restored, the run resumes there and the three
    # runs end exactly as the uninterrupted ones
    b = _sitting(tmp_path, "cache-b")
    b.run()
    assert "resumed after round" in b.stream.getvalue()
    assert not (b.store.inflight(TINY) / name).exists()  # removed once recorded
    rec = b.store.read_record(TINY.key, name)
    assert [s["rounds"] for s in rec["segments"]][0] >= 1 and sum(s["rounds"] for s in rec["segments"]) == 15
    cols = [c for c in pr.BASE_COLUMNS if c not in ("train_loss",)]
    assert [{c: r[c] for c in cols} for r in pr.read_rows(_csv(tmp_path))] == \
        [{c: r[c] for c in cols} for r in ref]


def test_sigterm_stops_a_sitting_after_a_saved_round(tmp_path: Path) -> None:
    """`reproduce all` in the background: SIGTERM stops it cleanly, its records and travelling
    checkpoints ready to commit, exit 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FEDHET_CAMPAIGN_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhet", "reproduce", "all", "--scale", "smoke", "--device", "cpu",
         "--budget", "30", "--tables", "fedsr-mnist", "--results", str(tmp_path / "results"),
         "--nice", "0"],
        stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert proc.stderr is not None
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if "recorded " in line:  # one run done: stop the sitting while the next one runs
                break
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = "".join(seen) + rest
    assert proc.returncode == 0, text
    assert "campaign: stopping" in text and "run the same command again to continue" in text
    root = tmp_path / "results" / "campaign-smoke"
    assert json.loads((root / "sittings.jsonl").read_text().splitlines()[-1])["recorded"]
    assert list((root / "fedsr-mnist").rglob("record.json"))


def test_reproduce_all_runs_the_real_tables_at_smoke_scale(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """`fedhet reproduce all --scale smoke --device cpu`: the real FedNNNN table (20 runs on
    digits), recorded and exported; `reproduce plan` then shows the table done."""
    from fedhet.cli import main

    results = tmp_path / "results"
    argv = ["--scale", "smoke", "--device", "cpu", "--tables", "fednnnn-mnist", "--results", str(results),
            "--cache", str(tmp_path / "cache")]
    assert main(["reproduce", "all", "--budget", "20", "--cores", "2", "--nice", "0", *argv]) == 0
    assert "every run recorded" in capsys.readouterr().err
    curves = pr.read_results(results / "campaign-smoke" / "tables" / "fednnnn" / "table2-mnist.csv")
    assert len(curves) == 4 * 5  # 4 scenarios × 5 methods
    assert all(len(by_seed[0]["round"]) == 11 for by_seed in curves.values())
    assert main(["reproduce", "plan", *argv]) == 0
    out = capsys.readouterr().out
    assert "| fednnnn-mnist | digits NonIID-UB (headline) |" in out and "20 of 20 runs recorded" in out


@pytest.mark.parametrize("argv,said", [
    (["reproduce", "all"], "needs --budget"),
    (["reproduce", "all", "--budget", "5", "--cores", "0"], "--cores must be at least 1"),
    (["reproduce", "all", "--budget", "5", "--tables", "nope"], "unknown campaign table 'nope'"),
    (["reproduce", "all", "--budget", "5", "--out", "x"], "--out: the campaign's run directories"),
    (["reproduce", "plan", "--budget", "5"], "--budget"),
    (["reproduce", "fednova", "--cores", "2"], "--cores goes with the campaign: `fedhet campaign run`"),
])
def test_campaign_flags(argv, said, capsys, tmp_path) -> None:  # noqa: ANN001
    from fedhet.cli import main

    where = ["--results", str(tmp_path / "r"), "--cache", str(tmp_path / "c")]
    assert main([*argv, *where] if argv[1] != "fednova" else argv) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists() and not (tmp_path / "c").exists()


def test_a_damaged_record_is_one_error_naming_it(tmp_path: Path) -> None:
    from fedhet.errors import FedhetError

    _sitting(tmp_path, "cache").run()
    rec = next((tmp_path / "results" / "campaign-smoke").rglob("record.json"))
    rec.write_text("{torn")
    before = rec.read_bytes()
    with pytest.raises(FedhetError, match="record.json") as e:
        _sitting(tmp_path, "cache").run()
    assert "\n" not in str(e.value) and rec.read_bytes() == before


def test_the_committed_bench_and_records_read(tmp_path: Path) -> None:
    """The repository's own campaign files parse, and the page's table status reads them."""
    for st in status(ROOT / "results"):
        assert st.recorded <= st.planned
    cpu = ROOT / "results" / "campaign" / "bench" / "cpu.json"
    if cpu.exists():
        rows = json.loads(cpu.read_text())["measurements"]
        assert {r["workload"] for r in rows} <= {w.name for w in bench.CPU_WORKLOADS}


def test_the_campaign_imports_no_optional_package() -> None:
    """The GPU machine has torch, numpy, sklearn and matplotlib only: planning and pricing the
    campaign, the page's status and a sitting's modules import no flwr, ray or tensorboard."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from fedhet.papers.campaign import plan, sitting, bench\n"
        "plan.status(Path('results'))\n"
        "import fedhet.runs.single\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(top & {'flwr', 'ray', 'tensorboard', 'matplotlib', 'tqdm'}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("[]", "['tqdm']")


def test_a_table_whose_data_is_missing_is_left_out_of_the_whole_sitting(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """One line names the table and its data; none of its runs starts, the others run."""
    import fedhet.papers.reproduce as reproduce
    from fedhet.errors import FedhetError

    other = Table("fednova-smoke-2", "fednova", "synthetic-2", "FedNova smoke again", ("synthetic",),
                  headline=lambda s: True, paper_seeds=1)
    real = reproduce.check_data

    calls = []

    def check(paper, scale, specs):  # noqa: ANN001, ANN202
        calls.append(paper)
        if len(calls) > 1:  # the second table's data
            raise FedhetError("the data is not here")
        return real(paper, scale, specs)

    monkeypatch.setattr(reproduce, "check_data", check)
    s = _sitting(tmp_path, "cache", tables=(TINY, other))
    s.run()
    assert s.no_data == {"fednova-smoke-2"}
    assert "fednova-smoke-2: skipped, its data (synthetic) is not here" in s.stream.getvalue()
    assert len(s.finished) == 3 and not (tmp_path / "cache" / "smoke" / "fednova-smoke-2").exists()


def test_fedveca_baselines_join_once_their_fedveca_run_is_recorded(tmp_path: Path) -> None:
    """FedVeca's fair baselines take their budget (τ_all) from the recorded FedVeca run: the plan
    holds them only after it, and planning writes nothing into the records."""
    fv = tables.table("fedveca-cnn-mnist")
    store = Store(tmp_path / "results", tmp_path / "cache", "smoke")
    before = plan_runs("smoke", (fv,), store.records)
    assert [r.spec.label for r in before] == ["FedVeca"]
    s = _sitting(tmp_path, "cache", tables=(fv,))
    s.run()
    after = plan_runs("smoke", (fv,), store.records)
    assert sorted(r.spec.settings["algorithm"] for r in after) == ["central", "fedavg", "fednova", "fedveca"]
    assert {r.after for r in after if r.spec.label != "FedVeca"} == {before[0].name}
    assert len(s.finished) == 4 and not list(store.records(fv).rglob("protocol.json"))


def test_a_sitting_in_a_session_of_its_own_lowers_the_whole_session(tmp_path: Path) -> None:
    """Where Linux shares CPU between sessions (autogroup), a niced process still takes its
    session's full share: a sitting that leads its own session (setsid) lowers the session's
    priority; one in the caller's session leaves it alone."""
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no autogroup here: a process's nice is all there is")
    probe = ("import sys; from fedhet.papers.campaign.sitting import lower_session_priority; "
             "print(lower_session_priority(7)); "
             "print((open('/proc/self/autogroup').read().split() or ['none'])[-1])")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    own = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         timeout=120, start_new_session=True)
    assert own.stdout.split() == ["True", "7"], own.stderr
    # a process in the default group (never under setsid, as a CI runner's may be) reads nothing
    before = (Path("/proc/self/autogroup").read_text().split() or ["none"])[-1]
    shared = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                            timeout=120)
    assert shared.stdout.split() == ["False", before], shared.stderr


def test_reproduce_plan_without_records_says_where_it_looked(tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    """Outside the checkout there are no campaign records: one line naming the folder it read
    and what it needs, instead of a plan where every run is left; with records, the total line
    never reads `left: ;`."""
    from cli_errors import one_error_line

    from fedhet.cli import main

    monkeypatch.chdir(tmp_path)
    line = one_error_line(capsys, ["reproduce", "plan", "--cache", str(tmp_path / "c")])
    assert str(tmp_path / "results" / "campaign") in line and "--results" in line, line
    line = one_error_line(capsys, ["reproduce", "plan", "--results", str(tmp_path / "r"),
                                   "--scale", "smoke", "--cache", str(tmp_path / "c")])
    assert str(tmp_path / "r" / "campaign-smoke") in line, line
    (tmp_path / "results" / "campaign").mkdir(parents=True)
    assert main(["reproduce", "plan", "--cache", str(tmp_path / "c")]) == 0
    total = next(ln for ln in capsys.readouterr().out.splitlines() if " runs recorded" in ln)
    assert "left: ;" not in total and "run(s) unpriced" in total, total


def test_a_gpu_stack_takes_runs_of_one_chain_shape(tmp_path: Path) -> None:
    """Runs stepped together on a GPU wait for the stack's longest chain each round: a stack
    takes runs of one topology, partition and local work (`chain_shape`), so a FedSR or
    ring-optimization run never holds FedAvg-like runs for its ring's walk."""
    from fedhet.papers.campaign.pricing import chain_shape

    store = Store(tmp_path / "results", tmp_path / "cache")
    s = Sitting("paper", "cpu", 600.0, store, tables=(tables.table("fedsr-mnist"),),
                stream=io.StringIO(), commit="test")
    s.kind, s.device, s.stack_runs = "cuda", "cuda", 8  # the GPU's stacking, without a GPU here
    plan = s.plan()

    class Priced:
        def price(self, r, kind):  # noqa: ANN001, ANN202
            return types.SimpleNamespace(seconds_per_round=1.0 if kind == "cuda" else 100.0,
                                         source="bench")

    def settings(r):  # noqa: ANN001, ANN202
        return r.spec.settings

    fedavg = next(r for r in plan if settings(r)["algorithm"] == "fedavg")
    ring = next(r for r in plan if settings(r)["algorithm"] == "ring"
                and settings(r).get("partition") == settings(fedavg).get("partition"))
    assert chain_shape(settings(fedavg)) != chain_shape(settings(ring))
    assert chain_shape(settings(fedavg)) == chain_shape(
        {**settings(fedavg), "algorithm": "fedprox", "algorithm.mu": 0.01, "seed": 7})
    for first in (fedavg, ring):
        s.order = lambda todo, pricer, first=first: [first, *[r for r in todo if r is not first]]
        unit = s._next_unit(plan, set(), Priced())
        assert unit[0] is first
        assert {chain_shape(settings(r)) for r in unit} == {chain_shape(settings(first))}
    s.order = lambda todo, pricer: [fedavg, *[r for r in todo if r is not fedavg]]
    unit = s._next_unit(plan, set(), Priced())
    assert len(unit) > 1 and not any(settings(r)["algorithm"] in ("ring", "fedsr") for r in unit)


def test_a_gpu_run_checkpoints_about_once_a_minute() -> None:
    from fedhet.papers.campaign.sitting import CHECKPOINT_S, checkpoint_every

    assert CHECKPOINT_S == 60.0
    assert checkpoint_every(0.25) == 240  # a stack's quarter-second rounds: every 240th
    assert checkpoint_every(7.5) == 8
    assert checkpoint_every(90.0) == 1  # rounds longer than a minute: every round
    assert checkpoint_every(0.0) == checkpoint_every(float("nan")) == 1  # unpriced: every round


def test_the_plan_gives_each_tables_time_left_on_one_gpu_and_on_one_core(tmp_path: Path) -> None:
    """`reproduce plan` ends with a line per table: its runs left, all on one GPU (each run's
    share of a stacked round) and all on one CPU core, each the sum of the runs' prices times
    their rounds left (the repository's records and bench prices)."""
    from fedhet.papers.campaign.plan import print_plan
    from fedhet.papers.campaign.records import rounds_done

    results = ROOT / "results"
    stream = io.StringIO()
    print_plan("paper", "cpu", results, tmp_path / "cache", ("fednnnn-mnist",), 8, stream)
    line = next(x for x in stream.getvalue().splitlines() if x.startswith("fednnnn-mnist, "))
    store = Store(results, tmp_path / "cache", "paper")
    plan = plan_runs("paper", (tables.table("fednnnn-mnist"),), store.records)
    pricer = Pricer(store, plan, 1)
    left = [r for r in plan if not store.is_recorded(r)]
    travelling = store.inflight_runs()

    def total(kind: str) -> float:
        return sum(pricer.price(r, kind).seconds_per_round
                   * (r.rounds - max(travelling.get(f"{r.table}/{r.name}", 0),
                                     rounds_done(store.run_dir(r.table, r.name)))) for r in left)

    assert line == (f"fednnnn-mnist, {len(left)} run(s) left, all on one GPU: "
                    f"{total('cuda') / 60:,.0f} GPU-min; all on one CPU core: "
                    f"{total('cpu') / 3600:,.1f} core-hours")


def test_a_bench_measured_again_prices_the_kind_anew(tmp_path: Path) -> None:
    """Segments older than their kind's bench record do not price it (a bench measured again
    after the executor changed); the ones since do."""
    store = Store(tmp_path / "results", tmp_path / "cache")
    plan = plan_runs("paper", (tables.table("fednnnn-mnist"),), store.records)
    run = plan[0]
    same = next(r for r in plan if r.spec.label == run.spec.label and r is not run)
    _bench(store, "cuda", [{"model": "cnn-fednnnn-mnist", "precision": "bf16", "stacked": 100,
                            "runs": 1, "passes": 10_000, "s_per_round": 1.0}])
    record = json.loads((store.bench_dir / "cuda.json").read_text())
    (store.bench_dir / "cuda.json").write_text(json.dumps({**record, "date": "2026-11-28 04:00 UTC"}))
    old = {"kind": "cuda", "rounds": 10, "seconds": 80.0, "median_round_s": 8.0, "runs_stacked": 1,
           "date": "2026-11-27 17:08 UTC"}
    pricer = Pricer(store, plan)
    pricer.note(run, [old])
    assert pricer.price(same, "cuda").source == "bench"  # the old executor's rounds left out
    pricer.note(run, [{**old, "median_round_s": 2.0, "date": "2026-11-28 05:00 UTC"}])
    price = pricer.price(same, "cuda")
    assert price.source == "measured" and price.seconds_per_round == pytest.approx(2.0)
