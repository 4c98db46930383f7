"""The run directory: the files fedhet writes for a run or a grid, their one writer, their one
reader each, and who may touch the directory (docs/design.md, "The run directory as a format").
It imports nothing of fedhet but `errors`, and reads without torch (only checkpoints need it).

- who owns a directory: `ownership` (`mark`, `is_ours`, `exclusive`, `clear`, the marker and lock);
- the one writer: `RunStore` (config, metrics, diagnostics, summary, plan, checkpoints);
- the readers: `read_config`, `read_summary`, `read_metrics` (a run's files as Python values,
  `metric_columns` the metrics by column), `read_metric_text` (the cells as fedhet wrote them),
  `read_json`, `read_json_lines`, `read_csv` (any file fedhet writes, damage as one line, with
  the `*_FIX` advice), `rows_saved`, `read_checkpoint` (`SAFE_GLOBALS`: what its states may
  hold); `TIME_COLUMNS`
  (the metrics that vary run to run), `csv_table` and `format_value` (how fedhet writes CSV);
- a directory's life: `check_out`, `prepare_out`, `resume_target`, `is_finished`,
  `metrics_intact`;
- a run as Python values: `open_run`, `RunResult`.
"""

from fedhet.rundir import ownership
from fedhet.rundir.lifecycle import check_out, is_finished, metrics_intact, prepare_out, resume_target
from fedhet.rundir.reading import DamagedFileError, damaged, read_csv, read_json, read_json_lines
from fedhet.rundir.result import RunResult, open_run
from fedhet.rundir.store import (
    CONFIG_FIX,
    SAFE_GLOBALS,
    SUMMARY_FIX,
    TIME_COLUMNS,
    RunStore,
    atomic_write_text,
    csv_table,
    format_value,
    metric_columns,
    read_checkpoint,
    read_config,
    read_metric_text,
    read_metrics,
    read_summary,
    rows_saved,
    to_json,
)

__all__ = [
    "CONFIG_FIX",
    "DamagedFileError",
    "RunResult",
    "RunStore",
    "SAFE_GLOBALS",
    "SUMMARY_FIX",
    "TIME_COLUMNS",
    "atomic_write_text",
    "check_out",
    "csv_table",
    "damaged",
    "format_value",
    "is_finished",
    "metrics_intact",
    "open_run",
    "ownership",
    "prepare_out",
    "metric_columns",
    "read_checkpoint",
    "read_config",
    "read_csv",
    "read_json",
    "read_json_lines",
    "read_metric_text",
    "read_metrics",
    "read_summary",
    "resume_target",
    "rows_saved",
    "to_json",
]
