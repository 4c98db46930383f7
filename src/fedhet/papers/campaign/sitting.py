"""One sitting of the campaign: run the plan's next runs on the cores (or GPU) given, within a budget.

`fedhet campaign run --device cpu --cores 2 --budget 120` keeps `cores` worker processes busy
(one torch thread each, at low priority: `nice`), each running the next run of the plan
(`tables.plan_runs`) that is neither recorded nor running, the most claim per core-hour first
(`order.cpu_order`: cheap cells at the paper's seed count first, runs of many core-hours last);
on a GPU the runs under way first, then the plan's order, and a worker steps a stack of
up to `--stack-runs` runs that share data and model. A run starts only when one of its rounds
fits in what is left of the budget. A little before the budget ends (one round of the slowest
running run, at least 30 s) and on SIGTERM or Ctrl-C the workers stop after their next saved
round; a second signal, or the budget's end, stops them at once (a run then resumes from its
last saved round). Each finished run is recorded at once (`records.Store.record`) and its table
exported; at the end every unfinished run's checkpoint travels into the repository, and a line
is added to `RESULTS/campaign/sittings.jsonl`. Everything it leaves in `RESULTS` is meant to be
committed.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fedhet.errors import FedhetError, quiet
from fedhet.papers.campaign.bench import CPU_WORKLOADS, GPU_WORKLOADS, device_name, measure
from fedhet.papers.campaign.bench import record as record_bench
from fedhet.papers.campaign.order import cpu_order
from fedhet.papers.campaign.pricing import Pricer, chain_shape, kind_of, where
from fedhet.papers.campaign.records import (
    Store,
    add_segment,
    default_cache,
    now,
    round_seconds,
    rounds_done,
)
from fedhet.papers.campaign.tables import FASHION_MNIST, TABLES, CampaignRun, Table, plan_runs
from fedhet.procs import handling

MAX_BUDGET_MIN = 7 * 24 * 60
"""The longest sitting: a week (longer timers overflow; run again to continue)."""
GRACE_MIN_S = 30.0
POLL_S = 1.0
PROGRESS_S = 300.0
"""A progress line per running run every five minutes."""
START_METHOD = "spawn"
"""How a worker process starts (`multiprocessing`): each run (or stack) in a fresh interpreter.
The tests use "forkserver" with the engine preloaded, each run still a process of its own but
without importing torch again (tests/test_campaign.py)."""


def command(scale: str = "paper", device: str = "cpu", budget: float = 60, cores: int = 1,
            tables: str = "") -> str:
    """The command line of a sitting (from the checkout)."""
    cmd = (f"PYTHONPATH=src python -m fedhet campaign run --scale {scale} --device {device} "
           f"--budget {budget:g}" + (f" --cores {cores}" if cores != 1 else ""))
    return cmd + (f" --tables {tables}" if tables else "")


CHECKPOINT_S = 60.0
"""**[choice]** On a GPU a run saves a checkpoint about once a minute, not every round: a
round of a stack there takes a fraction of a second, and a checkpoint's writes and `fsync`s
would cost as much. A sitting stopped by a signal or its budget still saves the round it
stops after; killed outright, a run loses at most about a minute and resumes exactly from its
last checkpoint."""


def checkpoint_every(s_round: float) -> int:
    """Rounds between checkpoints for rounds of `s_round` seconds: about `CHECKPOINT_S` apart
    (every round when a round takes longer, or when it is unpriced)."""
    if not (s_round > 0 and math.isfinite(s_round)):
        return 1
    return max(1, int(CHECKPOINT_S // s_round))


def lower_session_priority(nice: int) -> bool:
    """Lower the priority of this process's whole session by `nice`, where Linux shares CPU time
    between sessions first (autogroup, `/proc/self/autogroup`): there a process's own nice counts
    only against its session's other processes, so a sitting's niced runs took a full share
    from the user's tests and builds in other sessions. Only a sitting that leads its own
    session (started with `setsid`) does so; one in the user's terminal session leaves the
    terminal's priority alone. Returns whether the session's priority was lowered."""
    path = Path("/proc/self/autogroup")
    if nice <= 0 or os.getsid(0) != os.getpid() or not path.exists():
        return False
    try:
        path.write_text(str(nice))
    except OSError:
        return False
    return True


def _worker(items: list[tuple[dict[str, Any], str, bool]], stop: Any, nice: int, out: Any) -> None:
    """A worker process: one run (or a stack of runs stepped together), stopped by `stop` after
    a saved round; puts `{"outcomes": [...]}` on `out`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the sitting decides when a worker stops
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FEDHET_CORES": "1"})
    if nice:
        os.nice(nice)
    # lazy: the engine (torch) loads in the worker only
    import torch

    from fedhet.runs import execute, execute_together  # lazy, as torch above

    torch.set_num_threads(1)
    outcomes: list[dict[str, Any]] = []

    def stopper(row: dict[str, Any]) -> bool:
        return bool(stop.is_set())

    try:
        if len(items) == 1:
            settings, path, resume = items[0]
            results: list[Any] = [execute(settings, Path(path), resume=resume, log=quiet,
                                          callbacks=[stopper])]
        else:
            results = execute_together([(s, Path(p), r) for s, p, r in items], log=quiet,
                                       callbacks=[[stopper] for _ in items])
        for r in results:
            if isinstance(r, BaseException):
                outcomes.append({"error": f"{type(r).__name__}: {r}"})
            else:
                outcomes.append({"status": r.get("status", "")})
    except Exception as e:  # noqa: BLE001  (reported to the sitting, which goes on with others)
        outcomes = [{"error": f"{type(e).__name__}: {e}"} for _ in items]
    out.put({"outcomes": outcomes})


@dataclass
class Active:
    runs: list[CampaignRun]
    proc: Any
    queue: Any
    start: float
    before: dict[str, int]
    s_round: float
    shown: float = 0.0


@dataclass
class Sitting:
    """One sitting (module doc)."""

    scale: str
    device: str
    budget_min: float
    store: Store
    cores: int = 1
    tables: tuple[Table, ...] = TABLES
    stack_runs: int = 8
    nice: int = 10
    data_dir: str | None = None
    bench: bool = True
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    commit: str = ""
    stopping: bool = False
    hard: bool = False
    failed: dict[str, str] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    started: set[str] = field(default_factory=set)
    no_data: set[str] = field(default_factory=set)
    """Tables whose data is not on this machine (left out of this sitting's plan)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget_min) and 0 < self.budget_min <= MAX_BUDGET_MIN):
            raise FedhetError(f"--budget must be a number of minutes in (0, {MAX_BUDGET_MIN}] (a "
                              f"sitting of at most a week; run again to continue), got {self.budget_min:g}")
        if self.cores < 1:
            raise FedhetError(f"--cores must be at least 1, got {self.cores}")
        if self.device.startswith("cuda"):
            # lazy: torch loads only when the device is checked
            import torch

            if not torch.cuda.is_available():
                raise FedhetError(f"--device {self.device}: torch sees no CUDA device here; "
                                  "run the campaign on the CPU with --device cpu")
        self.kind = kind_of(self.device)
        self.start = self.clock()
        self.end = self.start + self.budget_min * 60

    def say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def left(self) -> float:
        return self.end - self.clock()

    # the plan -------------------------------------------------------------------------------
    def plan(self) -> list[CampaignRun]:
        """The plan's runs of the tables whose data is here."""
        tables = tuple(t for t in self.tables if t.key not in self.no_data)
        return plan_runs(self.scale, tables, self.store.records, self.data_dir)

    def _check_data(self, plan: list[CampaignRun]) -> list[CampaignRun]:
        """Leave out the tables whose data is not here (`no_data`, one line each)."""
        # lazy: the loaders (torch) load only when a sitting starts
        from fedhet.papers.reproduce import check_data

        for t in self.tables:
            specs = [r.spec for r in plan if r.table == t.key]
            if not specs:
                continue
            try:
                check_data(t.paper, self.scale, specs)
            except FedhetError:
                self.no_data.add(t.key)
                datasets = sorted({str(s.settings.get("dataset")) for s in specs})
                hint = f" ({FASHION_MNIST})" if "fashion-mnist" in datasets else ""
                self.say(f"{t.key}: skipped, its data ({', '.join(datasets)}) is not here{hint}")
        return [r for r in plan if r.table not in self.no_data]

    # a sitting ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        # lazy: results imports the engine's store (torch)
        from fedhet.rundir import ownership as rundir
        from fedhet.runs import git_commit

        self.commit = self.commit or git_commit()
        lower_session_priority(self.nice)
        cache = self.store.cache / self.scale
        cache.mkdir(parents=True, exist_ok=True)
        with rundir.exclusive(cache, "campaign", "--cache"), self._signals():
            plan = self._check_data(self.plan())
            self._recover(plan)
            if self.bench and self.scale == "paper" and \
                    not (self.store.bench_dir / f"{self.kind}.json").exists():
                self._bench()
            self._loop()
            plan = self.plan()
            travelled = [r.name for r in plan if r.name in self.started and self.store.travel(r)]
            for t in self.tables:
                if any(r.table == t.key for r in plan):
                    self.store.export_table(t, plan, command(self.scale, self.device, self.budget_min,
                                                             self.cores))
            line = {"date": now(), "commit": self.commit, "device": device_name(self.device),
                    "kind": self.kind, "cores": self.cores, "budget_min": self.budget_min,
                    "minutes": round((self.clock() - self.start) / 60, 2), "recorded": self.finished,
                    "travelling": travelled, "failed": sorted(self.failed)}
            self.store.sittings.parent.mkdir(parents=True, exist_ok=True)
            with self.store.sittings.open("a") as f:
                f.write(json.dumps(line) + "\n")
        left = [r for r in plan if not self.store.is_recorded(r)]
        self.say(f"campaign: recorded {len(self.finished)} run(s) this sitting; {len(left)} of "
                 f"{len(plan)} left" + (f"; {len(travelled)} checkpoint(s) travel in "
                                        f"{self.store.root / 'inflight'}" if travelled else "")
                 + ("; run the same command again to continue" if left else "; every run recorded"))
        if self.failed:
            name, error = next(iter(self.failed.items()))
            raise FedhetError(f"{len(self.failed)} run(s) failed; first: {name}: {error}")
        return line

    def _recover(self, plan: list[CampaignRun]) -> None:
        """Record runs that finished in the cache but were not recorded (a sitting killed then)."""
        # lazy: paper_results reads run directories
        from fedhet.papers import paper_results

        for r in plan:
            if not self.store.is_recorded(r) and \
                    paper_results.has_result(self.store.run_dir(r.table, r.name)):
                self.store.record(r, device_name(self.device))
                self.finished.append(r.name)
                self.say(f"{r.table}: recorded {r.name} (it had finished in the cache)")

    def _bench(self) -> None:
        workloads = GPU_WORKLOADS if self.kind == "cuda" else CPU_WORKLOADS
        self.say(f"bench: no {self.kind} record yet; measuring {len(workloads)} workloads first "
                 f"(once per kind of device; {self.store.bench_dir / (self.kind + '.json')})")
        rows = measure(self.device, workloads, self.data_dir, self.say)
        record_bench(self.store, self.device, rows, self.commit)

    def _next_unit(self, plan: list[CampaignRun], busy: set[str], pricer: Pricer) -> list[CampaignRun]:
        # lazy: the runner's stacking rule
        from fedhet.runs import Job, stack_key

        todo = [r for r in plan if r.name not in busy and r.name not in self.failed
                and not self.store.is_recorded(r)]
        if self.kind == "cuda":  # a GPU leaves to the CPUs what they run cheaper (FedSR's rings)
            todo = [r for r in todo if where(pricer, r, self.device) == "cuda"]
        if not todo:
            return []
        todo = self.order(todo, pricer)
        first = todo[0]
        price = pricer.price(first, self.kind)
        s_round = price.seconds_per_round if price else 0.0
        if s_round > self.left() - GRACE_MIN_S:
            return []
        unit = [first]
        if self.kind == "cuda" and self.stack_runs > 1:
            def key(r: CampaignRun) -> str | None:
                return stack_key(Job(r.name, self._settings(r), "", False), cuda=True)
            k, shape = key(first), chain_shape(first.spec.settings)
            if k is not None:
                unit += [r for r in todo[1:] if r.table == first.table and key(r) == k
                         and chain_shape(r.spec.settings) == shape][: self.stack_runs - 1]
        return unit

    def order(self, todo: list[CampaignRun], pricer: Pricer) -> list[CampaignRun]:
        """`todo` in the order this sitting takes it: on a CPU the most claim per core-hour first
        (`order.cpu_order`), on a GPU the runs under way first (`under_way_first`)."""
        if self.kind == "cpu":
            travelling = self.store.inflight_runs()
            return cpu_order(todo, pricer, lambda r: self._saved(r, travelling))
        return self.under_way_first(todo, pricer)

    def _saved(self, r: CampaignRun, travelling: dict[str, int]) -> int:
        """Rounds `r` holds here or in its travelling checkpoint (`travelling`: `inflight_runs`)."""
        return max(travelling.get(f"{r.table}/{r.name}", 0), rounds_done(self.store.run_dir(r.table, r.name)))

    def under_way_first(self, todo: list[CampaignRun], pricer: Pricer) -> list[CampaignRun]:
        """`todo` with the runs under way (rounds saved in this machine's cache or in a
        travelling checkpoint) first, the one with the least time left on this kind of device
        first (unpriced last), the runs not started after them in plan order **[choice]**: a
        sitting finishes what an earlier one started before it starts anything new, so saved
        rounds become records, and the nearest records come first."""
        travelling = self.store.inflight_runs()

        def key(r: CampaignRun) -> tuple[bool, float]:
            done = self._saved(r, travelling)
            if not done:
                return True, 0.0
            price = pricer.price(r, self.kind)
            return False, price.seconds_per_round * (r.rounds - done) if price else math.inf

        return sorted(todo, key=key)

    def _settings(self, r: CampaignRun) -> dict[str, Any]:
        settings = {**r.spec.settings, "device": self.device}
        if self.kind == "cpu":
            settings["workers"] = 1
        return settings

    def _launch(self, unit: list[CampaignRun], stop: Any, ctx: Any, pricer: Pricer) -> Active | None:
        # lazy: the runner's check that a cached run has the plan's settings
        from fedhet.runs import plan_jobs

        items = []
        prices = [pricer.price(r, self.kind) for r in unit]
        every = checkpoint_every(sum(p.seconds_per_round for p in prices if p)) \
            if self.kind == "cuda" else 1
        for r in unit:
            self.store.restore(r)
            out = self.store.run_dir(r.table, r.name)
            try:
                plan_jobs([r.spec], out.parent, force=False)
            except FedhetError as e:
                self.failed[r.name] = str(e)
                self.say(f"{r.table}: {r.name} not started: {e}")
                return None
            items.append(({**self._settings(r), "checkpoint_every": every}, str(out),
                          (out / "config.json").exists()))
        queue = ctx.SimpleQueue()
        proc = ctx.Process(target=_worker, args=(items, stop, self.nice, queue), daemon=True)
        proc.start()
        before = {r.name: rounds_done(self.store.run_dir(r.table, r.name)) for r in unit}
        s_round = sum(p.seconds_per_round for p in prices if p)  # the runs' shares of one round
        for r, p in zip(unit, prices, strict=True):
            self.started.add(r.name)
            est = (f", ≈{p.seconds_per_round * (r.rounds - before[r.name]) / 60:.0f} min ({p.source})"
                   if p else "")
            self.say(f"{r.table}: start {r.name} [{r.spec.group}, {r.spec.label}, seed {r.seed}] "
                     f"on {self.kind}" + (f", resumed after round {before[r.name]}" if before[r.name] else "")
                     + est)
        return Active(unit, proc, queue, self.clock(), before, s_round, self.clock())

    def _loop(self) -> None:
        ctx = multiprocessing.get_context(START_METHOD)
        stop = ctx.Event()
        active: list[Active] = []
        plan = self.plan()
        pricer = Pricer(self.store, plan, self.stack_runs if self.kind == "cuda" else 1)
        slots = self.cores if self.kind == "cpu" else 1
        try:
            while True:
                grace = max(GRACE_MIN_S, 1.2 * max((a.s_round for a in active), default=0.0))
                if (self.stopping or self.left() <= grace) and not stop.is_set():
                    stop.set()
                    why = "asked to stop" if self.stopping else "the budget's end is near"
                    then = ("each running run stops after its next saved round" if active
                            else "no run is running")
                    self.say(f"campaign: stopping ({why}); {then}")
                if not stop.is_set():
                    while len(active) < slots:
                        unit = self._next_unit(plan, {r.name for a in active for r in a.runs}, pricer)
                        if not unit:
                            break
                        a = self._launch(unit, stop, ctx, pricer)
                        if a is not None:
                            active.append(a)
                if not active:
                    return
                if self.hard or self.left() <= 0:
                    for a in active:
                        a.proc.kill()
                for a in list(active):
                    a.proc.join(timeout=POLL_S / max(1, len(active)))
                    if a.proc.is_alive():
                        self._progress(a)
                        continue
                    active.remove(a)
                    changed = self._done(a, pricer)
                    if changed:
                        plan = self.plan()  # FedVeca's baselines join once their FedVeca run is recorded
        finally:
            for a in active:
                if a.proc.is_alive():
                    a.proc.kill()
                    a.proc.join()

    def _progress(self, a: Active) -> None:
        if self.clock() - a.shown < PROGRESS_S:
            return
        a.shown = self.clock()
        for r in a.runs:
            done = rounds_done(self.store.run_dir(r.table, r.name))
            self.say(f"{r.table}: {r.name} at round {done}/{r.rounds}")

    def _done(self, a: Active, pricer: Pricer) -> bool:
        """Note a worker's runs: a segment each, a record for each finished one."""
        # lazy: paper_results reads run directories
        from fedhet.papers import paper_results

        result = a.queue.get() if not a.queue.empty() else {}
        outcomes = result.get("outcomes") or [{"error": f"the worker ended with exit code "
                                                        f"{a.proc.exitcode}"}] * len(a.runs)
        recorded = False
        for r, outcome in zip(a.runs, outcomes, strict=True):
            out = self.store.run_dir(r.table, r.name)
            after = rounds_done(out)
            each = round_seconds(out, a.before[r.name] + 1)
            seconds = sum(each)
            if (out / "config.json").exists() and after > a.before[r.name]:
                segment = {"kind": self.kind, "device": device_name(self.device),
                           "commit": self.commit, "date": now(),
                           "rounds_from": a.before[r.name], "rounds": after - a.before[r.name],
                           "seconds": round(seconds, 2),
                           "median_round_s": round(statistics.median(each), 3) if each else None,
                           "wall_s": round(self.clock() - a.start, 1),
                           "runs_stacked": len(a.runs)}
                add_segment(out, segment)
                pricer.note(r, [segment])
            if paper_results.has_result(out):
                self.store.record(r, device_name(self.device))
                self.finished.append(r.name)
                recorded = True
                t = next(t for t in self.tables if t.key == r.table)
                self.store.export_table(t, self.plan(), command(self.scale, self.device,
                                                                self.budget_min, self.cores))
                self.say(f"{r.table}: recorded {r.name} ({after} rounds, "
                         f"{seconds / max(1, after - a.before[r.name]):.1f} s a round here)")
            elif "error" in outcome:
                self.failed[r.name] = outcome["error"]
                self.say(f"{r.table}: {r.name} failed: {outcome['error']}")
            else:
                self.say(f"{r.table}: {r.name} stopped after round {after}/{r.rounds} (it continues "
                         "next sitting)")
        return recorded

    @contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT: stop gracefully; a second one: stop at once."""
        def handler(signum: int, frame: Any) -> None:
            if self.stopping:
                self.hard = True
            self.stopping = True

        with handling((signal.SIGTERM, signal.SIGINT), handler):
            yield


def run_campaign(scale: str, device: str, budget: float, results: Path, cache: Path | None = None,
                 cores: int = 1, tables: tuple[str, ...] | None = None, stack_runs: int = 8,
                 data_dir: str | None = None, nice: int = 10, stream: TextIO | None = None) -> dict[str, Any]:
    """`fedhet campaign run`: one sitting of the campaign (module doc)."""
    # lazy: tables by name
    from fedhet.papers.campaign.tables import table

    chosen = tuple(table(k) for k in tables) if tables else default_tables(scale)
    store = Store(results, cache or default_cache(), scale)
    return Sitting(scale, device, budget, store, cores, chosen, stack_runs, nice, data_dir,
                   stream=stream or sys.stderr).run()


def default_tables(scale: str) -> tuple[Table, ...]:
    """Every table at `paper` scale; below it the presets run on digits, so a table whose data
    differs from MNIST only would repeat another's runs: the MNIST tables alone."""
    return TABLES if scale == "paper" else tuple(t for t in TABLES if "mnist" in t.only)
