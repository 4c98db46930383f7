"""The rows of docs/paper-scale.md and the claims they read, for the papers' page sections.

A paper folder declares its sections (`folder.Paper.sections`), each a `Section` whose rows come
from one function of the results (`page_cells.Results`):
- `number_rows`: one row per published number (a preset's `published`) beside ours;
- `table_claim_rows`: a paper's `TableClaim`s (`claims.TableClaim`) read from the recorded cells;
- `claim_rows`: a claim about curves, a `Check` (the cells → a `Verdict` per place it is read),
  as `faster` (A's early loss below B's, outside the noise) and `order_claim` build them;
- `campaign_left`, `missing_cell`, `no_data`: what a row not recorded yet says (the campaign
  table and command that fill it, or why no machine here can).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fedhet.papers.claims import TableClaim
from fedhet.papers.page_cells import (
    WITHIN,
    Cell,
    Experiment,
    Results,
    by_exp,
    by_setup,
    cells,
    diverged,
    early_loss,
    final,
    pick,
    pm,
    rounds_to,
    where,
)
from fedhet.reports import mean_std
from fedhet.reports import paired_seeds as paired


# -- rows ----------------------------------------------------------------------------------
@dataclass
class Row:
    setting: str
    published: str
    ours: str = "not run"
    diff: str = "—"
    within: str = "—"
    holds: str = "—"
    run: str = "—"


@dataclass
class Verdict:
    ours: str
    holds: bool | None
    exp: Experiment


Check = Callable[[list["Cell"]], list[tuple[str, "Verdict"]]]
"""A claim: the cells of a paper → (setting detail, verdict) per place the claim is tested."""


def yes(b: bool | None) -> str:
    return "—" if b is None else ("**yes**" if b else "**no**")


@dataclass
class Section:
    """A table of the page: rows from one function of the results, and what to run when empty."""

    paper: str
    title: str
    build: Callable[[Results], list[Row]]
    note: Callable[[Results], str] | None = None
    """A line under the title (the protocol, and what the campaign has left of its rows)."""


# -- published numbers (a preset's `published`) --------------------------------------------
def number_rows(res: Results, paper: str, published: list[dict[str, Any]],
                missing: Callable[[str, str], str],
                targets: dict[str, float] | None = None) -> list[Row]:
    """One row per published number: ours is the final test accuracy (or the model transfers up
    to the target accuracy) over seeds, found by the preset's group and label."""
    cs = cells(res.of(paper))
    rows = []
    for p in published:
        metric = p["metric"]
        value = float(p["value"])
        is_acc = "accuracy" in metric
        value_pct = value * 100 if is_acc and value <= 1 else value
        text = f"{value_pct:.2f}%" if is_acc else f"{value:g} transfers"
        row = Row(f"{p['group']}, {p['label']}", f"{text} ({p.get('source', '')})")
        found = [c for c in cs if c.setting == p["group"] and c.algorithm == p["label"]]
        if not found:
            row.ours = missing(p["group"], p["label"])
            rows.append(row)
            continue
        c = found[0]
        if is_acc:
            ours = [final(cols, "test_accuracy") * 100 for cols in c.by_seed.values()]
            row.ours = mean_std(ours, 2, count=True)
            fin = [v for v in ours if math.isfinite(v)]
            if fin:
                d = statistics.fmean(fin) - value_pct
                row.diff = f"{d:+.2f} pts"
                row.within = yes(abs(d) <= WITHIN)
        else:
            target = (targets or {}).get(p["group"].split()[0], 0.9)
            ours = []
            for cols in c.by_seed.values():
                r = rounds_to(cols, cols.get("test_accuracy", []), target, True)
                rounds = cols["round"]
                cum = cols.get("cum_model_transfers", [])
                ours.append(cum[rounds.index(r)] if r in rounds and cum else math.nan)
            row.ours = mean_std(ours, 0, count=True) + f" (target {target:.0%})"
            fin = [v for v in ours if math.isfinite(v)]
            if fin:
                row.diff = f"{(statistics.fmean(fin) - value) / value:+.0%}"
        row.run = c.exp.run_info()
        rows.append(row)
    return rows


# -- comparative claims about a table (`<paper>/claims.py`) --------------------------------------
def _claim_values(c: Cell, claim: TableClaim) -> dict[int, float]:
    """Per seed: the final test accuracy (%), or the model transfers up to the first round at
    the claim's target (inf: never reached)."""
    out = {}
    for seed, cols in c.by_seed.items():
        if claim.metric != "transfers":
            out[seed] = final(cols, "test_accuracy") * 100
            continue
        r = rounds_to(cols, cols.get("test_accuracy", []), claim.target, True)
        rounds, cum = cols["round"], cols.get("cum_model_transfers", [])
        out[seed] = cum[rounds.index(r)] if r in rounds and cum else math.inf
    return out


def _towards(claim: TableClaim, a: float, b: float) -> float:
    """`a` − `b` in the claim's direction: positive when `a` is better (more accuracy, fewer
    transfers); ±inf when one of them never reached the target."""
    if claim.metric == "accuracy":
        return a - b
    if math.isinf(a) and math.isinf(b):
        return 0.0
    return b - a


def _value(claim: TableClaim, v: float) -> str:
    if claim.metric == "accuracy":
        return f"{v:.2f}"
    return "never" if math.isinf(v) else f"{v:.0f}"


def beats(claim: TableClaim, a: dict[int, float], b: dict[int, float]) -> tuple[bool, str, int]:
    """Whether `a` beats `b` over their common seeds, the difference as text, and the seeds:
    one seed (a single run) by the sign of its difference; more by the noise rule of the other
    tables (paired over seeds, `|mean Δ| > 2·std(Δ)/√n`, `*` when outside), a difference that
    is infinite in some seed (one never reached the target) only when every seed agrees."""
    seeds = sorted(set(a) & set(b))
    d = [_towards(claim, a[s], b[s]) for s in seeds]
    if not d:
        return False, "no common seed", 0
    unit, fmt = (" pts", "{:+.2f}") if claim.metric == "accuracy" else ("", "{:+.0f}")
    if len(d) == 1:
        return d[0] > 0, f"Δ {fmt.format(d[0])}{unit}", 1
    if not all(math.isfinite(x) for x in d):
        return all(x > 0 for x in d), "Δ per seed " + ", ".join(fmt.format(x) for x in d), len(d)
    mean, sd, n, outside = paired(dict(enumerate(d)), dict.fromkeys(range(len(d)), 0.0))
    return outside and mean > 0, f"Δ {pm(mean, sd, fmt)}{unit}{' *' if outside else ''}", n


def _paper_reading(claim: TableClaim, group: str) -> str:
    """What the paper's own table says of the claim in `group`."""
    values = claim.paper.get(group, {})
    if not values or any(m not in values for m in (*claim.winners, *claim.others)):
        return ""
    sign = 1 if claim.metric == "accuracy" else -1
    best = max(claim.winners, key=lambda m: sign * values[m])
    against = [m for m in claim.others if sign * (values[best] - values[m]) <= 0]
    unit = "%" if claim.metric == "accuracy" else " transfers"
    text = f"paper: {best} {values[best]:g}{unit}"
    if claim.reference and claim.reference in values:
        text += f", {sign * (values[best] - values[claim.reference]):+.2f} over {claim.reference}"
    return text + ("; holds in its table" if not against else
                   f"; not in its own table ({', '.join(f'{m} {values[m]:g}' for m in against)})")


@dataclass
class ClaimCell:
    """One cell's reading of a `TableClaim`: `holds` True, False or None (not yet)."""

    group: str
    holds: bool | None
    row: Row


def _drops(claim: TableClaim, values: dict[str, float]) -> dict[str, bool]:
    """`drop`: per method, whether it keeps to its side of `tolerance` (winners lose at most it,
    others more); `values`: each method's loss in points (not finite: it keeps to neither)."""
    return {m: math.isfinite(d) and (d <= claim.tolerance) == (m in claim.winners)
            for m, d in values.items()}


def _paper_drop(claim: TableClaim, group: str) -> str:
    """What the paper's own table says of a `drop` claim in `group`."""
    here, there = claim.paper.get(group, {}), claim.paper.get(claim.beside.get(group, ""), {})
    methods = (*claim.winners, *claim.others)
    if any(m not in here or m not in there for m in methods):
        return ""
    lost = {m: there[m] - here[m] for m in methods}
    against = [m for m, ok in _drops(claim, lost).items() if not ok]
    text = "paper: loses " + ", ".join(f"{m} {lost[m]:.2f}" for m in methods)
    return text + ("; holds in its table" if not against else
                   f"; not in its own table ({', '.join(against)})")


def read_drop_claim(claim: TableClaim, cs: list[Cell],
                    missing: Callable[[str, tuple[str, ...]], str]) -> list[ClaimCell]:
    """A `drop` claim per group: each method's final test accuracy (%) against its own in the
    group's `beside` cell, the loss the mean over their common seeds; a winner holds when it loses
    at most `tolerance` points, an other when it loses more. Not yet while a method of either
    cell is not recorded."""
    out = []
    for group in claim.groups:
        ref = claim.beside[group]
        row = Row(group, f"{claim.quote} ({claim.source}); read against {ref}, "
                  f"threshold {claim.tolerance:g} point **[choice]**")
        paper = _paper_drop(claim, group)
        row.published += f"; {paper}" if paper else ""
        methods = (*claim.winners, *claim.others)
        found = {(g, m): next((c for c in cs if c.setting == g and c.algorithm == m), None)
                 for g in (group, ref) for m in methods}
        lost: dict[str, float] = {}
        seeds = 0
        for m in methods:
            here, there = found[(group, m)], found[(ref, m)]
            if here is None or there is None:
                continue
            a, b = _claim_values(here, claim), _claim_values(there, claim)
            common = sorted(set(a) & set(b))
            if common:
                lost[m] = statistics.fmean(b[s] - a[s] for s in common)
                seeds = max(seeds, len(common))
        ours = "loses " + ", ".join(f"{m} {d:+.2f}" for m, d in lost.items()) if lost else ""
        absent = {g: tuple(m for m in methods if found[(g, m)] is None) for g in (group, ref)}
        if any(absent.values()):
            why = "; ".join(f"{g}: {', '.join(ms)} not recorded "
                            f"({missing(g, ms).removeprefix('not run yet: ')})"
                            for g, ms in absent.items() if ms)
            row.ours = f"not yet: {why}" + (f"; so far: {ours}" if ours else "")
            row.holds = "not yet"
            out.append(ClaimCell(group, None, row))
            continue
        verdicts = _drops(claim, lost)
        row.ours = ours + ("; single run (seed 0)" if seeds == 1 else f"; mean over {seeds} seeds")
        holds = bool(verdicts) and all(verdicts.values())
        against = [m for m, ok in verdicts.items() if not ok]
        row.diff = f"against it: {', '.join(against)}" if against else ""
        row.holds = yes(holds) + (" (single run)" if seeds == 1 else "")
        row.run = next(c for (g, m), c in found.items() if g == group and m == claim.winners[0]
                       and c is not None).exp.run_info()
        out.append(ClaimCell(group, holds, row))
    return out


def read_claim(claim: TableClaim, cs: list[Cell], missing: Callable[[str, tuple[str, ...]], str]
               ) -> list[ClaimCell]:
    """Every cell of `claim` read from the recorded cells `cs`: the best of its winners against
    each of its others (`beats`); not yet while a method of the cell is not recorded, `missing`
    saying why (`(group, labels)` → text). A `drop` claim: `read_drop_claim`."""
    if claim.metric == "drop":
        return read_drop_claim(claim, cs, missing)
    out = []
    for group in claim.groups:
        row = Row(group, f"{claim.quote} ({claim.source})")
        paper = _paper_reading(claim, group)
        row.published += f"; {paper}" if paper else ""
        found = {m: next((c for c in cs if c.setting == group and c.algorithm == m), None)
                 for m in (*claim.winners, *claim.others)}
        absent = tuple(m for m, c in found.items() if c is None)
        values = {m: _claim_values(c, claim) for m, c in found.items() if c is not None}
        sign = 1 if claim.metric == "accuracy" else -1
        mean = {m: math.inf if any(math.isinf(x) for x in v.values()) else statistics.fmean(v.values())
                for m, v in values.items()}  # transfers: a seed that never reaches makes it worst
        winners = [m for m in claim.winners if m in values]
        best = max(winners, key=lambda m: sign * mean[m]) if winners else ""
        verdicts = {m: beats(claim, values[best], values[m]) for m in claim.others if m in values and best}
        ours = ""
        if verdicts:
            n = max(v[2] for v in verdicts.values())
            ours = f"{best} {_value(claim, mean[best])}" + (f" (target {claim.target:.0%})"
                                                              if claim.metric == "transfers" else "")
            ours += "; " + ", ".join(f"{m} {_value(claim, mean[m])} ({v[1]})" for m, v in verdicts.items())
            ours += (f"; single run (seed {min(values[best])})" if n == 1 else f"; paired over {n} seeds")
        if absent:
            left = missing(group, absent).removeprefix("not run yet: ")
            row.ours = (f"not yet: {', '.join(absent)} not recorded ({left})"
                        + (f"; so far: {ours}" if ours else ""))
            row.holds = "not yet"
            out.append(ClaimCell(group, None, row))
            continue
        row.ours = ours
        if claim.reference and claim.reference in values and claim.reference not in claim.winners:
            row.diff = f"over {claim.reference}: {beats(claim, values[best], values[claim.reference])[1]}"
        holds = all(v[0] for v in verdicts.values())
        row.holds = yes(holds) + (" (single run)" if n == 1 else "")
        best_cell = found[best]
        row.run = best_cell.exp.run_info() if best_cell is not None else "—"
        out.append(ClaimCell(group, holds, row))
    return out


def table_claim_rows(res: Results, paper: str, claims: Sequence[TableClaim],
                     missing: Callable[[str, tuple[str, ...]], str],
                     no_data: Callable[[str], str] = lambda g: "") -> list[Row]:
    """The rows of a paper's `TableClaim`s: one per cell (the cells whose data no machine here
    has, one row per claim and reason), and for a claim "in most cases" one counting its cells."""
    cs = cells(res.of(paper))
    rows: list[Row] = []
    for claim in claims:
        read = read_claim(claim, cs, missing)
        away: dict[str, list[str]] = {}
        for cell in read:
            why = no_data(cell.group)
            if why and cell.holds is None:
                away.setdefault(why, []).append(cell.group)
            else:
                rows.append(cell.row)
        for why, groups in away.items():
            rows.append(Row(", ".join(groups), f"{claim.quote} ({claim.source})",
                            f"not yet: {why}", holds="not yet"))
        if claim.most:
            held = sum(1 for c in read if c.holds)
            failed = sum(1 for c in read if c.holds is False)
            n = len(read)
            holds = True if held > n / 2 else False if n - failed <= n / 2 else None
            paper_held = sum(1 for g in claim.groups
                             if _paper_reading(claim, g).endswith("holds in its table"))
            rows.append(Row(f"all {n} cells", f"{claim.quote} ({claim.source}); paper: holds in "
                            f"{paper_held} of {n} of its cells",
                            f"holds in {held}, does not in {failed}, not yet in {n - held - failed} "
                            f"of {n} cells", holds="not yet" if holds is None else yes(holds)))
    return rows


# -- claims about curves --------------------------------------------------------------------
def claim_rows(res: Results, paper: str, setting: str, claim: str,
               check: Check,
               experiments: Callable[[Experiment], bool] = lambda e: True,
               missing: str = "not run") -> list[Row]:
    """Rows of one claim: `check` gets the paper's cells and returns (setting detail, verdict)s."""
    found = check(cells(e for e in res.of(paper) if experiments(e)))
    if not found:
        return [Row(setting, claim, ours=missing)]
    return [Row(f"{setting} {detail}".strip(), claim, v.ours, holds=yes(v.holds), run=v.exp.run_info())
            for detail, v in found]


def faster(a_sel: Callable[[list[Cell]], list[Cell]], b_sel: Callable[[list[Cell], Cell], list[Cell]],
           describe: Callable[[Cell], str] = lambda c: c.algorithm) -> Check:
    """A converges faster than B (early loss, paired over seeds, outside the noise), for every
    cell A that `a_sel` picks and its partner `b_sel(cells of the same experiment and case, A)`;
    `describe(A)` names A in the row."""

    def check(cs: list[Cell]) -> list[tuple[str, Verdict]]:
        out = []
        for name, ecs in by_exp(cs).items():
            for a in a_sel(ecs):
                partners = b_sel([c for c in ecs if c.case == a.case and c.setting == a.setting]
                                 or [c for c in ecs if c.case == a.case], a)
                if not partners:
                    continue
                b = partners[0]
                ea = {s: early_loss(c) for s, c in a.by_seed.items()}
                eb = {s: early_loss(c) for s, c in b.by_seed.items()}
                mean, sd, n, outside = paired(ea, eb)
                fa = {s: final(c, "test_accuracy") * 100 for s, c in a.by_seed.items()}
                fb = {s: final(c, "test_accuracy") * 100 for s, c in b.by_seed.items()}
                acc_mean, acc_sd, _, acc_out = paired(fa, fb)
                acc = pm(acc_mean, acc_sd, "{:+.2f}")
                ours = (f"Δ early loss {pm(mean, sd)}{' *' if outside else ''}; "
                        f"Δ final acc {acc} pts{' *' if acc_out else ''} (n={n})")
                where = f"Case {a.case}" if a.case else a.setting
                out.append((f"{where}: {describe(a)} vs {b.algorithm} [{name}]",
                            Verdict(ours, outside and mean < 0, a.exp)))
        return out

    return check


def order_claim(base: str, key: str, values: tuple[str, ...]) -> Check:
    """Early loss strictly increasing along `values` of variant `key` (fastest first)."""

    def check(cs: list[Cell]) -> list[tuple[str, Verdict]]:
        out = []
        for name, ecs in by_exp(cs).items():
            for setup, scs in by_setup(ecs, (key,)).items():
                for case in sorted({c.case for c in scs if c.case}):
                    got = [pick(scs, base, case, **{key: v}) for v in values]
                    if not all(got):
                        continue
                    means = [statistics.fmean([early_loss(c) for c in g[0].by_seed.values()])
                             for g in got]
                    holds = all(a < b for a, b in zip(means, means[1:], strict=False))
                    ours = "early loss " + ", ".join(
                        f"{key}={v}: {m:.4f}{diverged(g[0])}"
                        for v, m, g in zip(values, means, got, strict=True))
                    out.append((where(case, setup, name), Verdict(ours, holds, got[0][0].exp)))
        return out

    return check


def negate(check: Check) -> Check:
    """The claim that `check`'s claim does not hold ("falls short": not faster)."""
    def inner(cs: list[Cell]) -> list[tuple[str, Verdict]]:
        return [(d, Verdict(v.ours, None if v.holds is None else not v.holds, v.exp)) for d, v in check(cs)]

    return inner


# -- what a row not recorded yet says --------------------------------------------------------
def campaign_left(res: Results, key: str) -> str:
    """A row the campaign has not measured yet: its table, the command, and what is left."""
    # lazy: the campaign (its plan and prices) loads only for the rows it has not measured
    from fedhet.papers.campaign import command
    from fedhet.papers.campaign.plan import status

    st = next(s for s in status(res.root) if s.key == key)
    left = []
    if st.core_hours is not None:
        left.append(f"≈{st.core_hours:,.0f} core-hours")
    left.append(f"≈{st.gpu_minutes:,.0f} GPU-min" if st.gpu_minutes is not None else "GPU unmeasured")
    return (f"not run yet: campaign table `{key}`, {st.planned - st.recorded} of {st.planned} runs left "
            f"({', '.join(left)}): `{command(budget=60, tables=key)}`")


def cell_left(res: Results, key: str, group: str, labels: str | tuple[str, ...] | None = None) -> str:
    """What the campaign has left of a cell of table `key` (`campaign.plan.cell_left`)."""
    # lazy: the campaign's plan loads only for the page
    from fedhet.papers.campaign.plan import cell_left as left

    return left(res.root, key, group, labels)


def not_run(cmd: str, then: str = "") -> str:
    return f"not run: `{cmd}`" + (f" (then {then})" if then else "")


EXPORT = "`python -m fedhet.papers.{0}.export ...` into results/{0}/"
"""The step after a study: export its runs into the paper's result files."""


def no_data(group: str) -> str:
    """Why no machine here has a cell's data ('' when one has): CIFAR is on no registry."""
    # lazy: the campaign's tables load only for the page
    from fedhet.papers.campaign.tables import NO_DATA

    if group.startswith("CIFAR-100"):
        return NO_DATA["cifar100"]
    return NO_DATA["cifar10"] if group.startswith("CIFAR") else ""


def table_key(paper: str, group: str) -> str:
    """The campaign table of a paper's cell: `<paper>-fashion-mnist` or `<paper>-mnist`."""
    return f"{paper}-{'fashion-mnist' if group.startswith('Fashion') else 'mnist'}"


def missing_cell(res: Results, paper: str) -> Callable[[str, str], str]:
    """`(group, label)` → what a published number's row says while it is not recorded."""
    def inner(group: str, label: str) -> str:
        why = no_data(group)
        return "not run: " + why if why else cell_left(res, table_key(paper, group), group, label)

    return inner


def missing_labels(res: Results, paper: str) -> Callable[[str, tuple[str, ...]], str]:
    """`(group, labels)` → what a claim's row says while some of its methods are not recorded."""
    def inner(group: str, labels: tuple[str, ...]) -> str:
        return no_data(group) or cell_left(res, table_key(paper, group), group, labels)

    return inner


def svm_files(e: Experiment) -> bool:
    return not e.name.startswith("cnn")


def cnn_mnist(e: Experiment) -> bool:
    return e.name == "cnn-mnist"


CLAIMS_NOTE = (
    "Each claim in the paper's words (declared in `src/fedhet/papers/<paper>/claims.py`), with "
    "what the paper's own table says of it; ours: the best of the methods it favours against "
    "each other method it names, by final test accuracy (or model transfers to the target). A "
    "single run (one seed, as the paper ran) is read by the sign of the difference and named as "
    "such; with more seeds, paired over seeds and outside the noise (`*`), as the other tables. "
    "A claim that methods stay close to another cell while others degrade (FedSR at ξ = 4 against "
    "IID) reads each method's final test accuracy against its own in that cell: close when it "
    "loses at most the row's threshold, degrading when it loses more (**[choice]**: the paper "
    "gives no number; declared with the claim). "
    "**not yet**: a method of the cell is not recorded (what is left is named).")
"""The note under a paper's section of `TableClaim`s."""
