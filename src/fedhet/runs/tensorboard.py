"""Optional TensorBoard logging (`--tensorboard`): each round's metrics as scalars.

Needs the `tensorboard` package (`pip install 'fedhet[tensorboard]'`); the rest of fedhet never
imports it. Events go to `<run dir>/tensorboard/`; point `tensorboard --logdir` at a run or grid
directory to watch runs live.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError

SKIP = ("round",)


def require_tensorboard() -> None:
    """Fail early, before any run starts, when the flag is used without the package."""
    if importlib.util.find_spec("tensorboard") is None:
        raise FedhetError(
            "--tensorboard needs the tensorboard package: pip install 'fedhet[tensorboard]' "
            "(or drop --tensorboard)"
        )


class TensorBoardLogger:
    """A run's callback (`fedhet.engine.callbacks`): writes every finite numeric column of each
    round's row; closes its writer when the run ends. Calling it is `on_round` (a callback that
    passes rows on to it)."""

    def __init__(self, run_dir: Path) -> None:
        require_tensorboard()
        self.log_dir = Path(run_dir) / "tensorboard"
        self.writer: Any = None

    def on_round(self, row: dict[str, Any]) -> None:
        step = int(row["round"])
        if self.writer is None:  # created at the first round: the run directory exists by then
            # optional extra: fedhet[tensorboard]
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run drops what a killed one logged after its last checkpoint
            self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step)
        for key, value in row.items():
            if key in SKIP or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    __call__ = on_round

    def on_end(self, summary: dict[str, Any] | None) -> None:
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
