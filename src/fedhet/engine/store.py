"""A run directory: config, metrics, diagnostics, summary and checkpoints, written as the run goes.

Every file is replaced atomically (write to a temporary file, then `os.replace`), so a run
killed at any moment leaves either the old or the new version of each file. `checkpoint.pt`
and the previous good one, `checkpoint.prev.pt`, let a run resume; a checkpoint that fails to
load (truncated, corrupt) is reported and the previous one is used.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedhet.errors import FedhetError

_UMASK = os.umask(0o022)
os.umask(_UMASK)

TIME_COLUMNS = ("wall_time_s", "round_time_s", "eval_time_s")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes files 0600; give them the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _json_default(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=_json_default, allow_nan=True)


def _cell(text: str | None) -> float:
    try:
        return float(text) if text not in ("", None) else math.nan
    except ValueError:
        return math.nan


def read_metric_rows(path: Path | str) -> list[dict[str, float]]:
    """`metrics.csv` (or the run directory holding it) as rows of floats; blank cells are NaN."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.csv"
    with path.open(newline="") as f:
        return [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def read_metric_columns(path: Path | str) -> dict[str, list[float]]:
    """`metrics.csv` (or the run directory holding it) as columns of floats; blank cells are NaN."""
    rows = read_metric_rows(path)
    names = list(rows[0]) if rows else []
    return {n: [r.get(n, math.nan) for r in rows] for n in names}


def format_value(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return str(v)


class RunStore:
    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.metrics_path = self.out / "metrics.csv"
        self.diag_path = self.out / "diagnostics.jsonl"
        self.ckpt_path = self.out / "checkpoint.pt"
        self.prev_ckpt_path = self.out / "checkpoint.prev.pt"

    # -- plain files ----------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.out / "config.json", to_json(config))

    def read_config(self) -> dict[str, Any]:
        path = self.out / "config.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise FedhetError(f"{self.out} has no config.json: it is not a fedhet run directory") from None
        except json.JSONDecodeError as e:
            raise FedhetError(f"{path} is corrupt ({e}); start the run again with --force") from None

    def write_metrics(self, rows: list[dict[str, Any]]) -> None:
        """Rewrite `metrics.csv` with all rows; columns are the union, in order of appearance."""
        columns: list[str] = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([format_value(row.get(c, float("nan"))) for c in columns])
        atomic_write_text(self.metrics_path, buf.getvalue())

    def write_diagnostics(self, records: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(r, default=_json_default) + "\n" for r in records)
        atomic_write_text(self.diag_path, text)

    def read_summary(self) -> dict[str, Any]:
        return json.loads((self.out / "summary.json").read_text())

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.out / "summary.json", to_json(summary))

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, payload: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save(payload, buf)
        if self.ckpt_path.exists():
            os.replace(self.ckpt_path, self.prev_ckpt_path)
        atomic_write_bytes(self.ckpt_path, buf.getvalue())

    def load_checkpoint(self, warn: Any = print) -> dict[str, Any] | None:
        """The newest checkpoint that loads, or None when there is none at all."""
        problems = []
        for path in (self.ckpt_path, self.prev_ckpt_path):
            if not path.exists():
                continue
            try:
                payload = torch.load(path, map_location="cpu", weights_only=False)
                if not isinstance(payload, dict) or "round" not in payload:
                    raise ValueError("not a fedhet checkpoint")
            except Exception as e:  # noqa: BLE001  (any unreadable file is reported the same)
                problems.append(f"{path.name} is unreadable ({type(e).__name__})")
                continue
            if problems:
                warn(f"warning: {'; '.join(problems)}; resuming from {path.name}")
            return payload
        if problems:
            raise FedhetError(
                f"no usable checkpoint in {self.out}: {'; '.join(problems)}; "
                "start the run again with --force"
            )
        return None
