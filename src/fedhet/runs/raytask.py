"""One unit of a grid's work as a Ray task on a node (`run_task`), started by the driver in
`fedhet.runs.cluster`: the local runner's `run_unit` with the driver's stop flag read from the
shared filesystem (`FileFlag`), partial runs resumed (`refreshed`), and a straggler of a lost
node waited out (`wait_unlocked`). A task that lands on a node that cannot use the grid (it
joined between two looks of the driver) checks for itself with the file probe
(`fedhet.runs.raynodes.probe`), and its runs go back to the queue untouched.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from fedhet import plugins
from fedhet.engine import CORES_ENV
from fedhet.errors import FedhetError
from fedhet.rundir import atomic_write_text
from fedhet.rundir import ownership as rundir
from fedhet.runs import processes
from fedhet.runs.jobs import Job
from fedhet.runs.raynodes import probe
from fedhet.version import __version__

LOCK_WAIT_S = 120.0
"""**[choice]** How long a resubmitted task waits for a straggler of a lost node to let go of a
run directory's lock (a Ray worker whose raylet died exits within seconds)."""


class FileFlag:
    """The driver's stop flag as a file on the shared filesystem (`is_set` like an `Event`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def is_set(self) -> bool:
        return self.path.exists()


def refreshed(job: Job) -> Job:
    """`job` as it must run now: a run directory that already holds a config (a task of a lost
    node got that far) is resumed from its last checkpoint instead of started over."""
    if not job.resume and (Path(job.out) / "config.json").is_file():
        return dataclasses.replace(job, resume=True)
    return job


def wait_unlocked(out: Path, timeout: float) -> None:
    """Wait (bounded) until no process holds `out`'s run lock: a straggler of a lost node."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with rundir.exclusive(out, "run"):
                return
        except FedhetError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_task(
    unit: list[Job], control: str, cwd: str, cores: int, gpus: float, token: str,
    plugin_files: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One unit on a node: the local runner's `run_unit` (`fedhet.runs.processes`), with the
    driver's stop flag read from the shared filesystem, each run's node written for the
    progress display, and partial runs resumed (`refreshed`). The driver's plugins
    (`plugin_files`: spec → file) are imported first; one that does not import fails the
    unit's runs with its line. A task that asked for no GPU sees none (`device = auto` is the
    CPU), whatever Ray's default for such tasks. A node that cannot use the grid (`probe` with
    the driver's `token`) touches nothing: each run comes
    back as `{"misplaced": why}`."""
    import ray  # optional extra: fedhet[cluster]

    answer = probe(str(Path(control) / "probe"), token, cwd, __version__)
    if not answer["ok"]:
        return [{"name": job.name, "misplaced": answer["why"], "at": answer["node"]}
                for job in unit]
    os.chdir(cwd)  # relative data and run paths mean what they mean to the driver
    try:
        plugins.ensure(list(plugin_files or {}), "the grid's driver", plugin_files)
    except FedhetError as e:
        return [{"name": job.name, "error": str(e)} for job in unit]
    os.environ[CORES_ENV] = str(cores)
    if gpus == 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    processes.limit_threads()  # one torch thread, as in a --jobs process (same results)
    ctl = Path(control)
    processes.use_stop_flag(FileFlag(ctl / "stop"))
    node = ray.get_runtime_context().get_node_id()
    unit = [refreshed(job) for job in unit]
    for job in unit:
        atomic_write_text(ctl / "where" / job.name, node)
    try:
        for job in unit:
            if Path(job.out).is_dir():
                wait_unlocked(Path(job.out), LOCK_WAIT_S)
    except FedhetError as e:
        return [{"name": job.name, "error": str(e)} for job in unit]
    return processes.run_unit(unit)

