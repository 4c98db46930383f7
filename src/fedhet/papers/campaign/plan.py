"""`fedhet campaign plan`: every cell of the campaign, what is done, what is left, where and how long.

One line per table cell in the order the campaign runs them on the device kind given: on a GPU
the cells with a run under way first, then by the cell of its first run left; on a CPU by the
first of their runs a CPU sitting takes (`order.cpu_order`: the most claim per core-hour first).
Each line:
runs done / in progress / left, rounds, the device kind it is cheapest on, the minutes left
there (`measured` from its own runs, `bench` from the kind's bench record, `?` unpriced), and
the dates its runs were recorded. In progress: a run with saved rounds in the cache or a
travelling checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from fedhet.errors import FedhetError
from fedhet.papers.campaign.order import cpu_order
from fedhet.papers.campaign.pricing import Pricer, kind_of, where
from fedhet.papers.campaign.records import Store, default_cache, rounds_done
from fedhet.papers.campaign.sitting import default_tables
from fedhet.papers.campaign.tables import NO_DATA, CampaignRun, plan_runs, table


@dataclass
class Cell:
    table: str
    setting: str
    headline: bool
    first: int
    variant: bool = False
    """The runs of another reading beside a preset run (`Table.variants`), a line of their own."""
    labels: list[str] = field(default_factory=list)
    done: int = 0
    running: int = 0
    left: int = 0
    rounds: set[int] = field(default_factory=set)
    minutes: dict[str, float] = field(default_factory=dict)
    unpriced: int = 0
    source: set[str] = field(default_factory=set)
    dates: list[str] = field(default_factory=list)
    seeds: set[int] = field(default_factory=set)


def rounds_saved(store: Store, travelling: dict[str, int], r: CampaignRun) -> int:
    """Rounds a run already holds: in this machine's cache or in its travelling checkpoint
    (`travelling`: `Store.inflight_runs()`)."""
    return max(rounds_done(store.run_dir(r.table, r.name)), travelling.get(f"{r.table}/{r.name}", 0))


def cells(store: Store, plan: list[CampaignRun], device: str, pricer: Pricer) -> list[Cell]:
    """The plan's runs gathered into cells, with their state and price (module doc)."""
    out: dict[tuple[str, str, bool, bool], Cell] = {}
    travelling = store.inflight_runs()
    for r in plan:
        cell = out.setdefault((r.table, r.spec.group, r.headline, r.variant),
                              Cell(r.table, r.spec.group, r.headline, r.order, r.variant))
        if r.spec.label not in cell.labels:
            cell.labels.append(r.spec.label)
        cell.rounds.add(r.rounds)
        cell.seeds.add(r.seed)
        if store.is_recorded(r):
            cell.done += 1
            cell.dates.append(str(store.read_record(r.table, r.name).get("finished", "")))
            continue
        done = rounds_saved(store, travelling, r)
        cell.first = min(cell.first, r.order) if cell.left + cell.running else r.order
        if done:
            cell.running += 1
        else:
            cell.left += 1
        kind = where(pricer, r, device)
        price = pricer.price(r, kind)
        if price is None:
            cell.unpriced += 1
            continue
        cell.minutes[kind] = cell.minutes.get(kind, 0.0) + price.seconds_per_round * (r.rounds - done) / 60
        cell.source.add(price.source)
    rows = list(out.values())
    if kind_of(device) == "cpu":
        left = [r for r in plan if not store.is_recorded(r)]
        taken = cpu_order(left, pricer, lambda r: rounds_saved(store, travelling, r))
        first: dict[tuple[str, str, bool, bool], int] = {}
        for i, r in enumerate(taken):
            first.setdefault((r.table, r.spec.group, r.headline, r.variant), i)
        return sorted(rows, key=lambda c: (not (c.left + c.running),
                                           first.get((c.table, c.setting, c.headline, c.variant), 0),
                                           c.first))
    return sorted(rows, key=lambda c: (c.done and not (c.left + c.running), not c.running, c.first))


def _minutes(c: Cell) -> str:
    if not (c.left + c.running):
        return "—"
    parts = [f"{m:,.0f} {'core-' if k == 'cpu' else 'GPU-'}min" for k, m in sorted(c.minutes.items())]
    if c.unpriced:
        parts.append(f"{c.unpriced} run(s) unpriced")
    return ", ".join(parts) + (f" ({'/'.join(sorted(c.source))})" if c.source else "")


def print_plan(scale: str, device: str, results: Path, cache: Path | None, tables: tuple[str, ...] | None,
               stack_runs: int, stream: TextIO) -> None:
    chosen = tuple(table(k) for k in tables) if tables else default_tables(scale)
    store = Store(results, cache or default_cache(), scale)
    if not store.root.is_dir():
        raise FedhetError(
            f"no campaign records in {store.root.resolve()}: `fedhet campaign plan` reads what "
            f"`fedhet campaign run` recorded there (a fedhet checkout holds them under "
            f"results/); run it in the checkout, or give --results DIR of the folder that holds "
            f"{store.root.name}/")
    plan = plan_runs(scale, chosen, store.records)
    pricer = Pricer(store, plan, stack_runs if device.startswith("cuda") else 1)
    rows = cells(store, plan, device, pricer)
    stream.write(f"campaign plan ({scale} scale; records in {store.root}, cache {store.cache}):\n")
    stream.write("| # | table | cell | methods | seeds | done | in progress | left | rounds | "
                 "device | left to run | recorded |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for i, c in enumerate(rows, 1):
        kinds = "/".join(sorted(c.minutes)) or "—"
        dates = sorted(d for d in c.dates if d)
        when = (dates[0][:10] + (f" – {dates[-1][:10]}" if dates[-1][:10] != dates[0][:10] else "")) \
            if dates else "—"
        tag = " (headline)" if c.headline else " (another reading)" if c.variant else ""
        stream.write(f"| {i} | {c.table} | {c.setting}{tag} | "
                     f"{', '.join(c.labels)} | {len(c.seeds)} | {c.done} | {c.running} | {c.left} | "
                     f"{'/'.join(str(k) for k in sorted(c.rounds))} | {kinds} | {_minutes(c)} | {when} |\n")
    total = {k: sum(c.minutes.get(k, 0.0) for c in rows) for k in ("cpu", "cuda")}
    done = sum(c.done for c in rows)
    runs = sum(c.done + c.running + c.left for c in rows)
    priced = ", ".join(f"{m / 60:,.1f} {'core-hours' if k == 'cpu' else 'GPU-hours'}"
                       for k, m in total.items() if m)
    stream.write(f"\n{done} of {runs} runs recorded; left: {priced or 'not priced yet'}"
                 + (f"; {sum(c.unpriced for c in rows)} run(s) unpriced (no bench record for the "
                    "kind: the first sitting measures it)" if any(c.unpriced for c in rows) else "")
                 + ". FedVeca's baselines join a group once its FedVeca run is recorded.\n")
    travelling = store.inflight_runs()
    for t in chosen:
        left = [r for r in plan if r.table == t.key and not store.is_recorded(r)]
        if not left:
            continue
        each = {kind: seconds_left(store, travelling, pricer, left, kind) for kind in ("cpu", "cuda")}
        stream.write(f"{t.key}, {len(left)} run(s) left, all on one GPU: "
                     + (f"{each['cuda'] / 60:,.0f} GPU-min" if each["cuda"] is not None else "unpriced")
                     + "; all on one CPU core: "
                     + (f"{each['cpu'] / 3600:,.1f} core-hours" if each["cpu"] is not None else "unpriced")
                     + "\n")
    for why in NO_DATA.values():
        stream.write(f"not planned: {why}\n")


@dataclass(frozen=True)
class TableStatus:
    """One table's progress for the paper-scale page."""

    key: str
    title: str
    result: str
    recorded: int
    in_progress: int
    planned: int
    core_hours: float | None
    """Left on one CPU core, from measured prices; None when some run is unpriced there."""
    gpu_minutes: float | None
    """Left on one GPU; None when the GPU is unmeasured (no bench record)."""


def seconds_left(store: Store, travelling: dict[str, int], pricer: Pricer, left: list[CampaignRun],
                 kind: str) -> float | None:
    """Seconds the runs `left` still take, all on one device of `kind` (each run's share of a
    stacked round on a GPU); None when one of them is unpriced there."""
    total = 0.0
    for r in left:
        p = pricer.price(r, kind)
        if p is None:
            return None
        total += p.seconds_per_round * (r.rounds - rounds_saved(store, travelling, r))
    return total


def status(results: Path, scale: str = "paper") -> list[TableStatus]:
    """Every default table's progress from the repository alone (records, travelling
    checkpoints, bench records; no cache), for the page (`paper_scale`)."""
    store = Store(results, Path("/nonexistent-campaign-cache"), scale)
    chosen = default_tables(scale)
    plan = plan_runs(scale, chosen, store.records)
    pricer = Pricer(store, plan, 8)
    travelling = store.inflight_runs()
    out = []
    for t in chosen:
        runs = [r for r in plan if r.table == t.key]
        left = [r for r in runs if not store.is_recorded(r)]
        # FedVeca's baselines join once its run is recorded: until then three per run, each
        # priced as that run [choice] (they train its τ_all steps)
        waiting = [r for r in left if r.spec.settings.get("algorithm") == "fedveca"
                   and not any(x.after == r.name for x in runs)]
        runs += waiting * 3
        left += waiting * 3
        cpu, gpu = (seconds_left(store, travelling, pricer, left, kind) for kind in ("cpu", "cuda"))
        out.append(TableStatus(t.key, t.title, f"results/{t.paper}/{t.experiment}.csv",
                               len(runs) - len(left),
                               sum(1 for r in left if f"{t.key}/{r.name}" in travelling),
                               len(runs), None if cpu is None else cpu / 3600,
                               None if gpu is None else gpu / 60))
    return out


def cell_left(results: Path, table_key: str, setting: str,
              label: str | tuple[str, ...] | None = None) -> str:
    """What is left of one cell's method (or methods; None: all of them), for a page row not yet
    measured: runs and priced time."""
    labels = (label,) if isinstance(label, str) else label
    store = Store(results, Path("/nonexistent-campaign-cache"))
    t = table(table_key)
    plan = [r for r in plan_runs("paper", (t,), store.records)
            if setting in r.serves and (labels is None or r.spec.label in labels)]
    pricer = Pricer(store, plan, 8)
    left = [r for r in plan if not store.is_recorded(r)]
    travelling = store.inflight_runs()
    cpu = [pricer.price(r, "cpu") for r in left]
    seconds = sum(p.seconds_per_round * (r.rounds - rounds_saved(store, travelling, r))
                  for p, r in zip(cpu, left, strict=True) if p is not None)
    hours = f", ≈{seconds / 3600:.1f} core-hours" if cpu and all(cpu) else ""
    first = sum(1 for r in left if r.tier < 3)
    return (f"not run yet: {len(left)} run(s) left in the campaign ({first} at the paper's seed "
            f"count; `--tables {table_key}`{hours})")
