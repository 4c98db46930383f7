"""FedVeca's fair-comparison protocol (§IV-A1): `fedhet reproduce fedveca --protocol fair` and the preset.

1. Run FedVeca and read `τ_all = Σ_k Σ_i τ_(k,i)` from its `metrics.csv` (`tau_sum` column).
2. Centralized SGD trains `τ_all` iterations of batch `B` on the pooled data: `K` rounds of
   `round(τ_all / K)` steps **[choice]** (so the total is within `K/2` of `τ_all`), shown as a
   flat line at its final value.
3. FedAvg and FedNova use the fixed `τ_(k,i) = ⌊E_avg D_i / B⌋` with
   `E_avg = τ_all / K × B / D`, set through `local_epochs = E_avg`.

A comparison group is one directory holding a run directory per method (`fedveca`, `central`,
`fedavg`, `fednova`) plus `protocol.json` (the budget) and `comparison.csv`/`comparison.md`
(final accuracy and loss, and the first round each method reaches the centralized accuracy and
loss).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedhet.engine import RECORD_KEYS, config_of, current_record, federate
from fedhet.errors import FedhetError
from fedhet.papers.base import Protocol, register_protocol
from fedhet.papers.fedveca.runs import CENTRAL, FEDVECA, LABELS
from fedhet.rundir import RunStore, atomic_write_text, csv_table, is_finished, read_metrics, to_json
from fedhet.runs import RoundLines, execute

DEFAULT_BASELINES = ("fedavg", "fednova")
PAPER_DEFAULTS: dict[str, Any] = {"clients": 5, "rounds": 100, "lr": 0.01}
"""§IV-A4: five clients, `K = 100`, `η = 0.01` (`α = 0.95`, `τ_max = 50` are FedVeca's defaults)."""


@dataclass(frozen=True)
class FairBudget:
    """What FedVeca spent and what the baselines get for the same local work."""

    tau_all: int
    rounds: int
    client_sizes: tuple[int, ...]
    batch_size: int

    @property
    def total_samples(self) -> int:
        return sum(self.client_sizes)

    @property
    def e_avg(self) -> float:
        """`E_avg = τ_all / K × B / D` (§IV-A1)."""
        return self.tau_all / self.rounds * self.batch_size / self.total_samples

    @property
    def central_steps(self) -> int:
        return max(1, math.floor(self.tau_all / self.rounds + 0.5))

    def baseline_taus(self) -> list[int]:
        """`τ_(k,i) = ⌊E_avg D_i / B⌋` as the engine computes it from `local_epochs = E_avg`."""
        return [
            max(1, math.floor(self.e_avg * d / min(self.batch_size, d))) for d in self.client_sizes
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self), "total_samples": self.total_samples, "e_avg": self.e_avg,
            "central_steps": self.central_steps,
            "central_total_steps": self.central_steps * self.rounds,
            "baseline_taus": self.baseline_taus(),
            "baseline_total_steps": sum(self.baseline_taus()) * self.rounds,
        }


# -- settings ---------------------------------------------------------------------------------
def _is_algorithm_key(key: str) -> bool:
    return key.startswith(("algorithm.", "algorithm_params"))


def common_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings every method shares (FedVeca's own parameters removed)."""
    return {k: v for k, v in settings.items() if k != "algorithm" and not _is_algorithm_key(k)}


def fedveca_settings(settings: dict[str, Any]) -> dict[str, Any]:
    algorithm = settings.get("algorithm", FEDVECA)
    if algorithm != FEDVECA:
        raise FedhetError(
            f"the FedVeca protocol runs fedveca first; drop algorithm={algorithm!r} from its settings"
        )
    return {**settings, "algorithm": FEDVECA}


def baseline_settings(settings: dict[str, Any], budget: FairBudget, method: str) -> dict[str, Any]:
    """Settings for `central` (`τ_all / K` steps per round) or a fixed-τ baseline (`E_avg`)."""
    base = {**common_settings(settings), "algorithm": method}
    base.pop("epochs_min", None)
    base.pop("epochs_max", None)
    if method == CENTRAL:
        return {**base, "local_steps": budget.central_steps}
    return {**base, "local_steps": 0, "local_epochs": budget.e_avg}


def client_sizes(settings: dict[str, Any]) -> tuple[int, ...]:
    """`D_i` of the partition these settings describe (loads the data, as the run itself does)."""

    cfg = config_of(settings)
    fields = ("dataset", "dataset_params", "partition", "partition_params", "clients", "seed", "data_dir",
              "validation_fraction")
    saved = cfg.to_dict()
    key = json.dumps({f: saved[f] for f in fields}, sort_keys=True)
    if key not in _SIZES:
        parts = federate(cfg, cache=True).parts
        _SIZES[key] = tuple(len(p) for p in parts)
    return _SIZES[key]


_SIZES: dict[str, tuple[int, ...]] = {}
"""Partition sizes by data settings: a preset asks for the same partition several times."""


# -- reading runs ----------------------------------------------------------------------------
def read_tau_all(run_dir: Path) -> int:
    """`τ_all = Σ_k Σ_i τ_(k,i)` of a finished FedVeca run."""
    if not is_finished(Path(run_dir)):
        raise FedhetError(
            f"the FedVeca run in {run_dir} is not finished; finish it (fedhet run --resume "
            f"{run_dir}) before running the fair baselines"
        )
    rows = read_metrics(run_dir)
    if not rows or "tau_sum" not in rows[-1]:
        raise FedhetError(f"{run_dir}/metrics.csv has no tau_sum column: it is not a FedVeca run")
    return int(sum(r["tau_sum"] for r in rows if r["round"] >= 1 and math.isfinite(r["tau_sum"])))


SIZES_FILE = "client_sizes.json"
"""Beside a finished FedVeca run: the `D_i` of its partition, so that its fair budget is known
where its data is not (a plan made, or a page rendered, on a machine without MNIST)."""


def budget_from_run(fedveca_dir: Path, settings: dict[str, Any]) -> FairBudget:
    """The fair budget of §IV-A1 from a finished FedVeca run and the group's settings. The
    partition's sizes come from the run's `client_sizes.json` when it has one (written here the
    first time they are computed from the data), else from the data."""

    cfg = config_of(fedveca_settings(settings))
    tau_all = read_tau_all(fedveca_dir)
    saved = Path(fedveca_dir) / SIZES_FILE
    sizes: tuple[int, ...] | None = None
    if saved.exists():
        try:
            sizes = tuple(int(n) for n in json.loads(saved.read_text()))
        except (ValueError, TypeError):
            sizes = None  # damaged: computed again below, and rewritten
        if sizes is not None and len(sizes) != cfg.clients:
            sizes = None
    if sizes is None:
        sizes = client_sizes(settings)
        with contextlib.suppress(OSError):  # a read-only copy of the records: nothing kept
            atomic_write_text(saved, json.dumps(list(sizes)) + "\n")
    return FairBudget(tau_all, cfg.rounds, sizes, cfg.batch_size)


def first_round(rows: Sequence[dict[str, float]], key: str, target: float, above: bool) -> int | None:
    """First round `≥ 1` whose `key` reaches `target` (`≥` when `above`, else `≤`)."""
    for r in rows:
        v = r.get(key, math.nan)
        if r["round"] >= 1 and math.isfinite(v) and (v >= target if above else v <= target):
            return int(r["round"])
    return None


def comparison_table(group_dir: Path, methods: Sequence[str]) -> list[dict[str, Any]]:
    """Final accuracy/loss per method and rounds to reach the centralized final accuracy/loss."""
    group_dir = Path(group_dir)
    central = read_metrics(group_dir / CENTRAL) if (group_dir / CENTRAL).exists() else None
    target_acc = central[-1]["test_accuracy"] if central else math.nan
    target_loss = central[-1]["test_loss"] if central else math.nan
    table = []
    for method in methods:
        rows = read_metrics(group_dir / method)
        evaluated = [r for r in rows if math.isfinite(r.get("test_accuracy", math.nan))]
        last = evaluated[-1]
        row = {
            "method": LABELS.get(method, method), "final_accuracy": last["test_accuracy"],
            "final_loss": last["test_loss"],
            "best_accuracy": max(r["test_accuracy"] for r in evaluated),
        }
        if method != CENTRAL and central:
            row["rounds_to_central_accuracy"] = first_round(rows, "test_accuracy", target_acc, True)
            row["rounds_to_central_loss"] = first_round(rows, "test_loss", target_loss, False)
        table.append(row)
    return table


def write_table(table: list[dict[str, Any]], group_dir: Path) -> str:
    """Write `comparison.csv` and `comparison.md`; return the Markdown."""
    text, columns = csv_table(table, _cell, _ABSENT)
    atomic_write_text(Path(group_dir) / "comparison.csv", text)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, _ABSENT), md=True) for c in columns) + " |" for row in table]
    text = "\n".join(lines) + "\n"
    atomic_write_text(Path(group_dir) / "comparison.md", text)
    return text


_ABSENT = object()


def _cell(v: Any, md: bool = False) -> str:
    if v is _ABSENT:
        return "–" if md else ""
    if v is None:
        return "not reached" if md else ""
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


# -- running -----------------------------------------------------------------------------------
def _same_config(run_dir: Path, settings: dict[str, Any]) -> bool:
    cfg = config_of(settings)
    wanted = json.loads(to_json(cfg.to_dict()))
    saved = current_record(RunStore(run_dir).read_config())
    return {k: v for k, v in saved.items() if k not in RECORD_KEYS} == wanted


def run_method(
    settings: dict[str, Any], run_dir: Path, force: bool, progress: bool, log: Callable[[str], None],
    log_lines: bool = False,
) -> None:
    """Run one method into `run_dir`: skip it when finished, resume it when partial. With
    `log_lines` (off a terminal: a log file, a batch job) it prints a progress line now and then."""

    lines = None
    if log_lines:
        rounds = config_of(settings, "fair protocol").rounds
        lines = RoundLines(rounds, sys.stdout, prefix=f"{run_dir.name}: ")
    hooks = [lines] if lines is not None else []
    has_run = (run_dir / "config.json").exists()
    if has_run and not force:
        if not _same_config(run_dir, settings):
            raise FedhetError(
                f"{run_dir} holds a run with other settings; use --force to replace it or "
                "choose another --out"
            )
        if is_finished(run_dir):
            log(f"{run_dir} is already finished; reusing it")
            return
        execute(None, run_dir, resume=True, progress=progress, log=log, callbacks=hooks)
        return
    execute(settings, run_dir, force=True, progress=progress, log=log, callbacks=hooks)


def check_settings(settings: dict[str, Any], methods: Sequence[str]) -> None:
    """Resolve every method's settings (with a stand-in budget) so bad input fails up front."""

    config_of(fedveca_settings(settings), "fedveca settings")
    stand_in = FairBudget(1, 1, (1,), 1)
    for method in methods:
        config_of(baseline_settings(settings, stand_in, method), f"{method} settings")


def compare(
    settings: dict[str, Any], out: Path, baselines: Sequence[str] = DEFAULT_BASELINES, *,
    force: bool = False, progress: bool = False, plots: bool = True,
    log: Callable[[str], None] = print, lines: bool = False,
) -> list[dict[str, Any]]:
    """The whole §IV-A1 protocol into `out`: FedVeca, then centralized SGD and the fixed-τ
    baselines with FedVeca's budget. Returns the comparison table (also written to `out`, with
    the figures in `out/plots`)."""
    out = Path(out)
    settings = fedveca_settings(settings)
    methods = [CENTRAL, *[b for b in baselines if b not in (CENTRAL, FEDVECA)]]
    check_settings(settings, methods)
    if out.exists() and not out.is_dir():
        raise FedhetError(f"--out {out} is a file; choose a directory")
    sizes = client_sizes(settings)
    out.mkdir(parents=True, exist_ok=True)
    run_method(settings, out / FEDVECA, force, progress, log, lines)
    budget = budget_from_run(out / FEDVECA, settings)
    if budget.client_sizes != sizes:
        raise FedhetError("the partition changed between runs; rerun with --force")
    atomic_write_text(out / "protocol.json", json.dumps(budget.to_dict(), indent=2))
    log(
        f"τ_all = {budget.tau_all}: centralized SGD runs {budget.central_steps} steps per round, "
        f"the baselines E_avg = {budget.e_avg:.4f} epochs (τ_i = {budget.baseline_taus()})"
    )
    for method in methods:
        run_method(baseline_settings(settings, budget, method), out / method, force, progress, log,
                   lines)
    table = comparison_table(out, [FEDVECA, *methods])
    write_table(table, out)
    if plots:
        # slow import (matplotlib): only when drawing
        from fedhet.papers.fedveca.plots import plot_fedveca

        plot_fedveca(out, out / "plots")
    return table


def _run_fair(settings: dict[str, Any], out: Path, *, baselines: Sequence[str] | None = None,
              force: bool = False, progress: bool = False, lines: bool = False) -> list[str]:
    """`fedhet reproduce fedveca --protocol fair`: `compare`, then the table as lines."""
    if settings.get("algorithm", FEDVECA) != FEDVECA:
        raise FedhetError("the fair protocol runs fedveca, central and the baselines; drop --algorithm "
                          "(and name baselines with --baselines)")
    table = compare(settings, out, list(baselines or DEFAULT_BASELINES), force=force, progress=progress,
                    lines=lines)
    said = []
    for row in table:
        reach = row.get("rounds_to_central_accuracy", "-")
        said.append(f"{row['method']:<16} final accuracy {row['final_accuracy']:.4f}  final loss "
                    f"{row['final_loss']:.4f}  rounds to centralized accuracy: {reach or 'not reached'}")
    return [*said, f"table in {out / 'comparison.md'}"]


register_protocol("fedveca", "fair", Protocol(
    help="FedVeca's fair comparison (§IV-A1): FedVeca, then centralized SGD and fixed-τ baselines "
         "(default fedavg,fednova) with its total local steps; algorithm.* settings go to FedVeca",
    defaults=PAPER_DEFAULTS, run=_run_fair,
))


__all__ = [
    "DEFAULT_BASELINES",
    "FairBudget",
    "PAPER_DEFAULTS",
    "baseline_settings",
    "budget_from_run",
    "compare",
    "comparison_table",
    "fedveca_settings",
    "read_tau_all",
]
