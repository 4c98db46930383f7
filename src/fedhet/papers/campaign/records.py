"""Where the campaign keeps what it made: records in the repository, run directories in a cache.

- **A record** (`RESULTS/campaign/<table>/<run>/`): a finished run's `config.json`,
  `summary.json` and `metrics.csv`, and `record.json` (the cells it fills, and per sitting the
  device, rounds, seconds and commit). No checkpoints: a few KiB a run, committed. A recorded run
  is done on every machine; the tables are exported from the records (`export_table`).
- **The cache** (`$FEDHET_CAMPAIGN_CACHE`, default `~/.cache/fedhet/campaign`, `--cache`): run
  directories while they run, outside the work tree. A run cut short continues there when the
  same machine comes back.
- **A travelling checkpoint** (`RESULTS/campaign/inflight/<table>/<run>/`): at the end of a
  sitting each unfinished run's resumable files (its latest checkpoint, config, metrics,
  summary, client states; not `checkpoint.prev.pt`) are copied here, so a run longer than one
  sitting continues on the next machine; restored into the cache when the cache is behind it,
  removed when the run is recorded.

Below `paper` scale the same layout lives under `RESULTS/campaign-<scale>/`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError
from fedhet.papers import paper_results
from fedhet.papers.campaign.tables import CampaignRun, Table
from fedhet.rundir import read_metric_text, rows_saved

CACHE_ENV = "FEDHET_CAMPAIGN_CACHE"
RECORD = "record.json"
KEPT = ("config.json", "summary.json", "metrics.csv")
"""A record's copies of the run directory's files."""
SEGMENTS = "campaign.json"
"""In a cached run directory: the sittings that advanced it (`{"segments": [...]}`)."""
NOT_TRAVELLING = frozenset({"checkpoint.prev.pt", ".fedhet.lock"})
RECORD_FIX = ("the campaign writes it as a JSON object; restore it (`git checkout results/`) or "
              "remove the run's record directory to run it again")


def default_cache() -> Path:
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedhet" / "campaign"


def now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def rounds_done(run_dir: Path) -> int:
    """Rounds a run directory holds (its metrics.csv's rows after round 0; `rows_saved`)."""
    return rows_saved(run_dir)


def round_seconds(run_dir: Path, first: int = 1) -> list[float]:
    """Seconds each round from `first` on took (training and evaluation), from metrics.csv."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return []
    out = []
    for row in read_metric_text(path):
        try:
            k = int(float(row["round"]))
            s = float(row.get("round_time_s") or "nan") + float(row.get("eval_time_s") or 0.0)
        except ValueError:
            continue
        if k >= first and math.isfinite(s):
            out.append(s)
    return out


@dataclass(frozen=True)
class Store:
    """The campaign's records (in `results`) and run directories (in `cache`) at one scale."""

    results: Path
    cache: Path
    scale: str = "paper"

    @property
    def root(self) -> Path:
        return self.results / ("campaign" if self.scale == "paper" else f"campaign-{self.scale}")

    def records(self, t: Table | str) -> Path:
        return self.root / (t if isinstance(t, str) else t.key)

    def inflight(self, t: Table | str) -> Path:
        return self.root / "inflight" / (t if isinstance(t, str) else t.key)

    def run_dir(self, t: Table | str, name: str) -> Path:
        return self.cache / self.scale / (t if isinstance(t, str) else t.key) / name

    @property
    def bench_dir(self) -> Path:
        return self.root / "bench"

    @property
    def sittings(self) -> Path:
        return self.root / "sittings.jsonl"

    # records ------------------------------------------------------------------------------
    def is_recorded(self, run: CampaignRun) -> bool:
        return (self.records(run.table) / run.name / RECORD).exists()

    def read_record(self, table: str, name: str) -> dict[str, Any]:
        return paper_results.read_object(self.records(table) / name / RECORD, RECORD_FIX)

    def recorded(self, table: str) -> dict[str, dict[str, Any]]:
        """`{run name: record}` of a table (names may hold `/`: FedVeca's groups)."""
        base = self.records(table)
        if not base.is_dir():
            return {}
        names = [p.parent.relative_to(base).as_posix() for p in sorted(base.rglob(RECORD))]
        return {name: self.read_record(table, name) for name in names}

    def record(self, run: CampaignRun, device: str) -> Path:
        """Copy a finished run's small files into its record and drop its travelling copy."""
        src = self.run_dir(run.table, run.name)
        if not paper_results.has_result(src):
            raise FedhetError(f"{src} is not a finished run; the campaign records finished runs only")
        dst = self.records(run.table) / run.name
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in KEPT:
            shutil.copy2(src / name, tmp / name)
        segments = read_segments(src)
        record = {
            "table": run.table, "run": run.name, "settings": list(run.serves), "label": run.spec.label,
            "seed": run.seed, "rounds": run.rounds, "finished": now(),
            "segments": segments,
            "s_per_round": s_per_round_by_kind(segments),
            "device": ", ".join(dict.fromkeys(s["device"] for s in segments)) or device,
            "commits": list(dict.fromkeys(s["commit"] for s in segments)),
        }
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
        shutil.rmtree(self.inflight(run.table) / run.name, ignore_errors=True)
        _prune(self.inflight(run.table) / run.name, self.root)
        return dst

    # travelling checkpoints -----------------------------------------------------------------
    def travel(self, run: CampaignRun) -> Path | None:
        """Copy an unfinished run's resumable files from the cache into the repository."""
        src = self.run_dir(run.table, run.name)
        if not (src / "checkpoint.pt").exists() or paper_results.has_result(src):
            return None
        dst = self.inflight(run.table) / run.name
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, ignore=lambda d, names: [n for n in names if n in NOT_TRAVELLING])
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
        return dst

    def restore(self, run: CampaignRun) -> bool:
        """Put the travelling copy into the cache when the cache holds fewer rounds; True if so."""
        src = self.inflight(run.table) / run.name
        dst = self.run_dir(run.table, run.name)
        if not (src / "checkpoint.pt").exists() or rounds_done(dst) >= rounds_done(src):
            return False
        if dst.exists():
            shutil.rmtree(dst)  # the campaign's own cached copy, behind the travelling one
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst)
        return True

    def inflight_runs(self) -> dict[str, int]:
        """`{table/run: rounds}` of every travelling checkpoint."""
        base = self.root / "inflight"
        if not base.is_dir():
            return {}
        return {p.parent.relative_to(base).as_posix(): rounds_done(p.parent)
                for p in sorted(base.rglob("checkpoint.pt"))}

    # tables -------------------------------------------------------------------------------
    def export_table(self, t: Table, runs: Iterable[CampaignRun], command: str) -> Path | None:
        """Write `RESULTS/<paper>/<experiment>.csv` and its json from the table's records, keeping
        every row already there that no record gives (a result never shrinks)."""
        records = self.recorded(t.key)
        if not records:
            return None
        by_name = {r.name: r for r in runs}
        exported = []
        for name, rec in records.items():
            run_dir = self.records(t.key) / name
            config = paper_results.read_object(run_dir / "config.json")
            label = rec.get("label") or (by_name[name].spec.label if name in by_name else name)
            for setting in rec.get("settings") or [name]:
                exported.append(paper_results.Run(run_dir, name, setting, label, config))
        csv_path = self.results / t.paper / f"{t.experiment}.csv"
        if self.scale != "paper":
            csv_path = self.root / "tables" / t.paper / f"{t.experiment}.csv"
        paper_results.export_runs(exported, csv_path, extra_columns=t.extra_columns, merge=True,
                                  digits=7)
        planned = [r for r in runs if r.table == t.key]
        segments = [s for rec in records.values() for s in rec.get("segments", [])]
        paper_results.write_meta(
            csv_path.with_suffix(".json"), t.experiment, t.paper, command,
            ", ".join(sorted({s["device"] for s in segments})) or "?",
            sum(float(s.get("seconds", 0.0)) for s in segments) / 60,
            sorted({int(rec.get("seed", 0)) for rec in records.values()}),
            scale=self.scale, commit=" ".join(dict.fromkeys(c for rec in records.values()
                                                            for c in rec.get("commits", []))),
            complete=len(records) >= len(planned), runs=len(records), runs_planned=len(planned),
            table=t.title, records=self.records(t.key).as_posix(),
        )
        return csv_path


def _prune(path: Path, stop: Path) -> None:
    """Remove empty parent directories of `path` up to (not including) `stop`."""
    p = path.parent
    while p != stop and stop in p.parents:
        try:
            p.rmdir()
        except OSError:
            return
        p = p.parent


def read_segments(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / SEGMENTS
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    segs = data.get("segments") if isinstance(data, dict) else None
    return [s for s in segs if isinstance(s, dict)] if isinstance(segs, list) else []


def add_segment(run_dir: Path, segment: dict[str, Any]) -> None:
    """Append one sitting's share of a run (device kind and name, rounds, seconds, commit)."""
    segments = read_segments(run_dir) + [segment]
    tmp = run_dir / f".{SEGMENTS}.tmp"
    tmp.write_text(json.dumps({"segments": segments}, indent=2) + "\n")
    tmp.replace(run_dir / SEGMENTS)


def segment_s_per_round(segment: dict[str, Any]) -> float | None:
    """A segment's seconds per round: the median round (robust to a round the machine paused
    or shared), else its mean."""
    median = segment.get("median_round_s")
    if isinstance(median, int | float) and median > 0:
        return float(median)
    if segment.get("rounds", 0) > 0 and segment.get("seconds", 0) > 0:
        return float(segment["seconds"]) / float(segment["rounds"])
    return None


def segment_runs(segment: dict[str, Any]) -> int:
    """The runs a segment's rounds stepped with, itself included (at least 1): its
    `runs_stacked`, which segments written by earlier releases name `runs_batched`."""
    n = segment.get("runs_stacked", segment.get("runs_batched", 1))
    return max(1, int(n or 1))


def s_per_round_by_kind(segments: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per round on each device kind (`cpu`, `cuda`) over the segments that ran rounds."""
    out: dict[str, list[float]] = {}
    for s in segments:
        v = segment_s_per_round(s)
        if v is not None:
            out.setdefault(s["kind"], []).append(v)
    return {k: round(statistics.median(v), 4) for k, v in out.items()}
