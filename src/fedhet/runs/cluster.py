"""`--cluster ray`: a grid's runs as Ray tasks over a cluster's nodes (docs/cluster.md).

The driver (`fedhet compare|reproduce`) keeps everything the local runner does: the grid lock,
finished runs skipped, partial runs resumed, duplicate cells refused (all before this module is
entered, `fedhet.runs.runner.run_specs`). What changes is where a unit of work — one
run, or a stack of runs stepped as one cohort — executes: each is one Ray task asking for
`--cpus-per-run` CPUs and `--gpus-per-run` GPUs (fractions allowed).

**Files [choice].** Workers write the run directories themselves, on a filesystem that every
node mounts at the same path (NFS, Lustre, CephFS, GPFS, or one machine's disk). Nothing is
streamed back: a run directory written by a task is byte-for-byte what `--jobs` writes, its
checkpoint outlives the node that wrote it, and the one-writer `flock` of each run directory
(`fedhet.rundir.ownership`) keeps a straggler of a lost node and its replacement apart. At start,
a probe task on every node must read a marker the driver wrote into the grid directory and
write beside it; a node that cannot is refused with one line (`check_nodes`). A node that joins
later is probed the same way when the driver first sees it (`Members`); until its answer comes
runs are kept off it (a Ray label selector on `ray.io/node-id`), and a node that cannot use the
grid gets one line and no run (`fedhet.runs.raynodes`). A task that still lands on such a node
(it joined between two looks) checks for itself, and its runs go back to the queue untouched
(`fedhet.runs.raytask`).

**Control files.** `GRID/.cluster/` holds what the driver and its tasks tell each other: `probe`
(the marker above), `stop` (the driver's Ctrl-C: running runs stop after their next saved round,
as with `--jobs`) and `where/<run>` (the node a run runs on, for the progress display). It is
cleared when a driver starts.

**A lost node loses nothing.** A task whose node (or worker process) dies fails with a Ray
system error; the driver resubmits its unit (`MAX_ATTEMPTS`), and the new task resumes each run
from its last checkpoint (`refreshed`: a job is idempotent). Application errors are a run's own
(`{"error": ...}`), never retried. A driver killed with -9 takes its tasks with it (Ray ends a
dead driver's job); started again it resumes the grid as `--jobs` does, after ending what is
left of the private local Ray the killed driver had started, if any (`raylink.reap`).

**Joining.** Without `--ray-address` or `$RAY_ADDRESS` the driver starts a private local Ray,
never one it finds on the machine; every connect is bounded and fails in one line
(`fedhet.runs.raylink`).

`import ray` happens only here, and only when a grid asks for a cluster.
"""


from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet import plugins
from fedhet.engine import ClusterOptions
from fedhet.errors import FedhetError
from fedhet.runs import raylink
from fedhet.runs.grid_status import Outcomes, Progress
from fedhet.runs.jobs import Job, checkpoint_every, components_of, status_of
from fedhet.runs.raynodes import Members, alive_nodes, capacity, check_nodes, check_resources
from fedhet.runs.raytask import run_task

if TYPE_CHECKING:
    import threading


MAX_ATTEMPTS = 4
"""**[choice]** Times one unit may be started: the first try and three after lost nodes or
worker processes. A unit lost more often points at a run that kills its worker (memory), not at
bad luck; it is then reported as that run's error."""


CAPACITY_EVERY_S = 2.0
"""How often the driver re-reads the cluster's nodes (nodes lost or joined)."""

CONTROL = ".cluster"


@dataclasses.dataclass
class Throttle:
    """How many units run at once once Ray's memory monitor killed some (`OutOfMemoryError`).

    **[choice]** Each kill lowers the limit to one fewer than were running when it came, down
    to one unit; a unit killed so is resubmitted without counting against its `MAX_ATTEMPTS`
    (memory pressure is the grid's doing, not the run's). Killed while it runs alone, it counts
    as any lost task, so a run too big for the node still ends in one error line."""

    limit: int | None = None

    def room(self, room: int) -> int:
        return room if self.limit is None else min(room, self.limit)

    def lower(self, running: int) -> bool:
        """After a kill among `running` units: run fewer at once; False when one already ran
        alone (nothing left to lower)."""
        now = running if self.limit is None else min(self.limit, running)
        if now <= 1:
            return False
        self.limit = now - 1
        return True


def killed_for_memory(ray: Any, error: BaseException) -> bool:
    """Whether Ray's memory monitor killed the task (`ray.exceptions.OutOfMemoryError`)."""
    kind = getattr(ray.exceptions, "OutOfMemoryError", None)
    return kind is not None and isinstance(error, kind)


def import_ray() -> Any:
    """Ray, or one line saying how to get it."""
    try:
        import ray  # optional extra: fedhet[cluster]
    except ImportError:
        raise FedhetError(
            "--cluster ray needs Ray, which is not installed: pip install 'fedhet[cluster]'"
        ) from None
    return ray


def connect(options: ClusterOptions, requested: threading.Event | None = None) -> raylink.Link:
    """Join the cluster of `options` (or `$RAY_ADDRESS`), or start a private local Ray
    (`fedhet.runs.raylink`: every step bounded, one line when it fails)."""
    ray = import_ray()
    # Ray's hint about accelerator variables on tasks without GPUs is not the user's business
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\..*")
    return raylink.connect(ray, options.address, requested)


def check_gpus(units: list[list[Job]], options: ClusterOptions) -> None:
    """Runs set to `device = cuda` need a GPU share: Ray hides the GPUs from a task that asks
    for none (every such run would fail on its node)."""
    if options.gpus_per_run > 0:
        return
    cuda = [job.name for unit in units for job in unit if job.settings.get("device") == "cuda"]
    if cuda:
        raise FedhetError(
            f"{len(cuda)} run(s) ask for device=cuda ({cuda[0]}, …) but --gpus-per-run is 0, "
            "and Ray hides the GPUs from tasks that ask for none; give each run a share, e.g. "
            "--gpus-per-run 1 (or 0.25 to put four on a GPU)"
        )


def check_importable(units: list[list[Job]]) -> None:
    """Refuse, in one line, a grid with a component defined in the driver's script or notebook
    (`__main__`): a Ray worker imports components from modules, and cannot import that one."""
    for job in (job for unit in units for job in unit):
        for kind, name, source in components_of(job):
            if plugins.in_script(source):
                raise FedhetError(
                    f"{kind} {name!r} is defined in the script or notebook that started the grid "
                    "(__main__), and Ray workers import components from modules: move it into a "
                    "plugin module (--plugin FILE.py, $FEDHET_PLUGINS or fedhet.load_plugins)"
                )


# -- the driver ------------------------------------------------------------------------------
_SESSIONS: list[list[raylink.Link]] = []
"""Open `session()`s, innermost last; each holds the connection a `run_units` inside it
opened (and must close), if any."""


@contextmanager
def session() -> Iterator[None]:
    """One Ray connection for several grids (a preset's stages): the first `run_units` inside
    joins the cluster (or starts the local Ray) and the later ones reuse it; the session closes
    what it opened when it ends. Ray is not touched when no grid runs on it."""
    opened: list[raylink.Link] = []
    _SESSIONS.append(opened)
    try:
        yield
    finally:
        _SESSIONS.pop()
        for link in opened:
            link.close()


def run_units(
    units: list[list[Job]], options: ClusterOptions, runs_dir: Path,
    requested: threading.Event, hard: list[bool], tally: Outcomes, progress: Progress,
) -> None:
    """Run `units` on the cluster until done, stopped (`requested`: Ctrl-C) or interrupted
    (a second Ctrl-C: `KeyboardInterrupt`; `hard` gets `True`); results go to `tally`. Inside
    a `session()` the connection outlives this call; a connection this process already had
    (a user's `ray.init`) is used and left open."""
    check_gpus(units, options)
    check_importable(units)
    raylink.chosen_address(options.address)  # a bad $RAY_ADDRESS: one line before Ray is touched
    ray = import_ray()
    link = None
    if not ray.is_initialized():
        try:
            link = connect(options, requested)
        except raylink.Stopped:
            tally.cancelled += sum(len(u) for u in units)
            return
        ray = link.ray
        if _SESSIONS:
            _SESSIONS[-1].append(link)
    try:
        _drive(ray, units, options, runs_dir, requested, hard, tally, progress)
    except raylink.Stopped:  # Ctrl-C before any unit was sent
        tally.cancelled += sum(len(u) for u in units)
        _clear(runs_dir.resolve().parent / CONTROL)
    finally:
        if link is not None and not _SESSIONS:
            link.close()


def _control(runs_dir: Path) -> Path:
    control = runs_dir.parent / CONTROL
    (control / "where").mkdir(parents=True, exist_ok=True)
    for stale in [control / "stop", *(control / "where").iterdir()]:
        stale.unlink(missing_ok=True)
    return control


def _drive(ray: Any, units, options, runs_dir, requested, hard, tally, progress) -> None:
    """Send `units` to the usable nodes, as many at a time as they hold (fewer after kills for
    memory: `Throttle`), and take in what each finished task means (`_results`) until none is
    left; Ctrl-C (`requested`) stops the running ones at their next saved round."""
    nodes, control, members, args = _join(ray, options, runs_dir, requested, progress)
    task = ray.remote(run_task)
    resources = {"num_cpus": options.cpus_per_run, "num_gpus": options.gpus_per_run, "max_retries": 0}
    queue: deque[list[Job]] = deque(units)
    attempts: dict[int, int] = {}
    inflight: dict[Any, list[Job]] = {}
    room, checked = capacity(nodes, options), time.monotonic()
    throttle = Throttle()
    stopping = waiting = False
    progress.note(f"cluster: {len(nodes)} Ray node(s), {room} unit(s) at a time "
                  f"({options.cpus_per_run:g} CPU, {options.gpus_per_run:g} GPU each)")
    try:
        while queue or inflight:
            if requested.is_set() and not stopping:
                stopping = True
                tally.cancelled += _stop(control, queue)
            if time.monotonic() - checked > CAPACITY_EVERY_S:
                room, checked = capacity(members.look(), options), time.monotonic()
                if room < 1 and not waiting:
                    progress.note("cluster: no alive node has room for a run; waiting for nodes "
                                  "to join (Ctrl-C stops the grid)")
                waiting = room < 1
            limit = max(1, throttle.room(room))
            if queue and len(inflight) < limit and not members.nowhere():
                # the selector keeps runs off nodes not (yet) probed
                _send(task, resources, members.selector(), args, queue, inflight, attempts, limit)
            if not inflight:  # every alive node refused: wait for one that can take runs
                time.sleep(0.2)
            ready, _ = (ray.wait(list(inflight), num_returns=len(inflight), timeout=0.2)
                        if inflight else ([], []))
            running = len(inflight)
            for ref in ready:
                unit = inflight.pop(ref)
                for result in _results(ray, ref, unit, attempts, queue, stopping, progress,
                                       members, control, throttle, running):
                    tally.add(result, progress, 0.0)
            _where(progress, control, members.labels)
            progress.tick()
    except KeyboardInterrupt:
        hard.append(True)
        for ref in inflight:
            ray.cancel(ref, force=True)
        tally.unfinished = sum(len(u) for u in queue) + sum(len(u) for u in inflight.values())
    finally:
        _clear(control)


def _join(ray: Any, options: ClusterOptions, runs_dir: Path, requested: threading.Event,
          progress: Progress) -> tuple[list[dict[str, Any]], Path, Members, tuple[Any, ...]]:
    """The grid's place on the cluster, refused in one line when no node can hold a run or a
    node cannot use the grid directory: the alive nodes, the control directory, the nodes runs
    may go to (`Members`) and what every task is handed after its unit (`run_task`'s control
    directory, working directory, cores, GPU share, probe token and plugin files)."""
    nodes = alive_nodes(ray)
    check_resources(nodes, options)
    control = _control(runs_dir.resolve())
    cwd = os.getcwd()
    token = check_nodes(ray, nodes, control, cwd, requested)
    members = Members(ray, nodes, control, token, cwd, progress.note)
    cores = max(1, int(options.cpus_per_run))
    args = (str(control), cwd, cores, options.gpus_per_run, token, plugins.files())
    return nodes, control, members, args


def _send(task: Any, resources: dict[str, Any], selector: dict[str, str] | None,
          args: tuple[Any, ...], queue: deque[list[Job]], inflight: dict[Any, list[Job]],
          attempts: dict[int, int], limit: int) -> None:
    """Start queued units until `limit` are in flight: each one `task` asking for `resources`,
    kept to the nodes of `selector` (None: anywhere), handed its jobs with their run directories
    absolute and then `args`; each start counts as a try of its unit (`attempts`)."""
    placed = task.options(**resources, **({"label_selector": selector} if selector else {}))
    while queue and len(inflight) < limit:
        unit = queue.popleft()
        attempts[id(unit)] = attempts.get(id(unit), 0) + 1
        jobs = [dataclasses.replace(j, out=str(Path(j.out).resolve())) for j in unit]
        inflight[placed.remote(jobs, *args)] = unit


def _stop(control: Path, queue: deque[list[Job]]) -> int:
    """Ctrl-C: the running tasks stop after their next saved round (the `stop` file) and the
    queued units are not sent; returns how many runs were never sent."""
    (control / "stop").write_text("stop\n")
    never_sent = sum(len(u) for u in queue)
    queue.clear()
    return never_sent


def _clear(control: Path) -> None:
    """Remove the driver's control files, and the directory once nothing else is in it."""
    (control / "stop").unlink(missing_ok=True)
    where = list((control / "where").iterdir()) if (control / "where").is_dir() else []
    for entry in [control / "probe", *control.glob("probe-*"), *where]:
        entry.unlink(missing_ok=True)
    with suppress(OSError):
        (control / "where").rmdir()
        control.rmdir()


def _results(ray, ref, unit, attempts, queue, stopping, progress, members, control,
             throttle: Throttle | None = None, running: int = 1) -> list[dict]:
    """What a finished task means for its runs: their results, or (its node or worker lost)
    a resubmission that resumes them, or (stopping) runs stopped at their last checkpoint, or
    (a node that cannot use the grid) the unit back in the queue, that node refused. A task
    killed for memory among `running` units lowers `throttle` and is resubmitted (one line)."""
    labels = members.labels
    try:
        results = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return [{"name": job.name, "cancelled": True} for job in unit]
    except ray.exceptions.RayTaskError as e:  # a bug outside a run's own error handling
        return [{"name": job.name, "error": f"task failed: {str(e).strip().splitlines()[-1]}"}
                for job in unit]
    except ray.exceptions.RayError as e:  # the node or the worker process was lost
        where = _where_of(unit, control, labels)
        why = type(e).__name__
        if stopping:
            return [{"name": job.name, "stopped": _saved_round(job)} for job in unit]
        runs = ", ".join(f"{job.name} (from round {_saved_round(job)})" for job in unit)
        if throttle is not None and killed_for_memory(ray, e) and throttle.lower(running):
            attempts[id(unit)] -= 1  # the grid ran too much at once: not the run's try
            progress.note(f"lost on {where} ({why}: Ray's memory monitor killed it); at most "
                          f"{throttle.limit} unit(s) at a time from now on; resubmitted: {runs}")
            queue.appendleft(unit)
            return []
        if attempts[id(unit)] >= MAX_ATTEMPTS:
            return [{"name": job.name, "error": f"lost {attempts[id(unit)]} times ({why}, last on "
                                                f"{where}); see docs/cluster.md"} for job in unit]
        progress.note(f"lost on {where} ({why}); resubmitted: {runs}")
        queue.appendleft(unit)
        return []
    misplaced = [r for r in results if "misplaced" in r]
    if misplaced:
        members.refuse(misplaced[0]["at"], misplaced[0]["misplaced"])
        attempts[id(unit)] -= 1  # it never started: not a try
        if stopping:
            return [{"name": job.name, "stopped": _saved_round(job)} for job in unit]
        queue.appendleft(unit)
        return []
    where = _where_of(unit, control, labels)
    for job in unit:
        progress.where.pop(job.name, None)
    return [{**r, "node": where} for r in results]


def _saved_round(job: Job) -> int:
    """The round a run resumes from: its last checkpointed round (0: none yet)."""
    done = status_of(job)[0]
    return done - done % checkpoint_every(job)


def _where_of(unit: list[Job], control: Path, labels: dict[str, str]) -> str:
    try:
        node = (control / "where" / unit[0].name).read_text().strip()
    except OSError:
        return "an unknown node"
    return labels.get(node, node[:8])


def _where(progress: Progress, control: Path, labels: dict[str, str]) -> None:
    """Which node each running run is on, for the progress display."""
    if not progress.live:
        return
    for entry in (control / "where").iterdir():
        name = entry.name
        if name in progress.finished:
            continue
        try:
            node = entry.read_text().strip()
        except OSError:
            continue
        progress.where[name] = labels.get(node, node[:8])


__all__ = ["ClusterOptions", "check_importable", "check_nodes", "connect", "run_task",
           "run_units"]
