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
grid gets one line and no run. A task that still lands on such a node (it joined between two
looks) checks for itself, and its runs go back to the queue untouched.

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
import math
import os
import socket
import time
import uuid
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet import plugins
from fedhet.engine import CORES_ENV, ClusterOptions
from fedhet.errors import FedhetError
from fedhet.rundir import atomic_write_text
from fedhet.rundir import ownership as rundir
from fedhet.runs import processes, raylink
from fedhet.runs.grid_status import Outcomes, Progress
from fedhet.runs.jobs import Job, checkpoint_every, components_of, status_of
from fedhet.runs.raylink import first_line
from fedhet.version import __version__

if TYPE_CHECKING:
    import threading


MAX_ATTEMPTS = 4
"""**[choice]** Times one unit may be started: the first try and three after lost nodes or
worker processes. A unit lost more often points at a run that kills its worker (memory), not at
bad luck; it is then reported as that run's error."""

PROBE_TIMEOUT_S = 120.0
"""**[choice]** How long every node has to answer the file probe (a node must start a worker
process for it: seconds on an idle node, longer on a busy one)."""

LOCK_WAIT_S = 120.0
"""**[choice]** How long a resubmitted task waits for a straggler of a lost node to let go of a
run directory's lock (a Ray worker whose raylet died exits within seconds)."""

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


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def node_labels(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """A short name for each node id: its host name, with the id's start where hosts repeat."""
    hosts = [n.get("NodeManagerHostname") or n.get("NodeManagerAddress", "?") for n in nodes]
    return {
        n["NodeID"]: h if hosts.count(h) == 1 else f"{h}:{n['NodeID'][:6]}"
        for n, h in zip(nodes, hosts, strict=True)
    }


def capacity(nodes: list[dict[str, Any]], options: ClusterOptions) -> int:
    """Units the alive `nodes` can run at once: per node, its CPUs over `cpus_per_run` (and its
    GPUs over `gpus_per_run` when runs ask for GPUs), summed."""
    total = 0
    for n in nodes:
        res = n.get("Resources", {})
        k = _fits(res.get("CPU", 0), options.cpus_per_run)
        if options.gpus_per_run > 0:
            k = min(k, _fits(res.get("GPU", 0), options.gpus_per_run))
        total += k
    return total


def _fits(have: float, each: float) -> int:
    """How many shares of `each` fit in `have` (`1.0 // 0.1` is 9 in floating point; Ray counts
    resources to 1e-4, so ten 0.1-GPU tasks fit one GPU)."""
    return int(math.floor(have / each + 1e-6))


def check_resources(nodes: list[dict[str, Any]], options: ClusterOptions) -> None:
    if capacity(nodes, options) < 1:
        have = "; ".join(f"{n.get('NodeManagerHostname', '?')}: {n.get('Resources', {}).get('CPU', 0):g} "
                         f"CPU, {n.get('Resources', {}).get('GPU', 0):g} GPU" for n in nodes)
        raise FedhetError(
            f"no node of the Ray cluster has the {options.cpus_per_run:g} CPU and "
            f"{options.gpus_per_run:g} GPU a run asks for ({have or 'no nodes'}); lower "
            "--cpus-per-run/--gpus-per-run or add nodes"
        )


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


# -- the shared-filesystem probe -----------------------------------------------------------
def probe(marker: str, token: str, cwd: str, version: str) -> dict[str, Any]:
    """On one node: can it read the driver's marker, write beside it, and enter the driver's
    working directory, with the same fedhet? Returns what it found (`ok` and, if not, why)."""
    import ray  # optional extra: fedhet[cluster]

    node = ray.get_runtime_context().get_node_id()
    path = Path(marker)
    try:
        if path.read_text().strip() != token:
            return {"node": node, "ok": False, "why": f"{path} holds another grid's marker"}
    except OSError as e:
        return {"node": node, "ok": False, "why": f"cannot read {path} ({e.strerror or e})"}
    mine = path.parent / f"probe-{node}-{uuid.uuid4().hex[:8]}"  # tasks on one node run at once
    try:
        mine.write_text(token)
        mine.unlink()
    except OSError as e:
        return {"node": node, "ok": False, "why": f"cannot write in {path.parent} ({e.strerror or e})"}
    if not Path(cwd).is_dir():
        return {"node": node, "ok": False, "why": f"the driver's working directory {cwd} is missing"}
    if __version__ != version:
        return {"node": node, "ok": False,
                "why": f"fedhet {__version__} is installed there, the driver runs {version}"}
    return {"node": node, "ok": True, "host": socket.gethostname()}


def write_marker(control: Path) -> str:
    """A fresh token in `control/probe`, which every node's probe must read; returns it. It
    stays while the grid runs: late nodes and every task read it too."""
    token = uuid.uuid4().hex
    (control / "probe").write_text(token + "\n")
    return token


def send_probes(ray: Any, node_ids: list[str], control: Path, token: str, cwd: str) -> dict[Any, str]:
    """`probe` on each of `node_ids`, pinned to it, no CPU asked: object ref → node id."""
    # optional extra: fedhet[cluster]
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not node_ids:
        return {}
    task = ray.remote(probe)
    return {
        task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            node, soft=False)).remote(str(control / "probe"), token, cwd, __version__): node
        for node in node_ids
    }


def check_nodes(ray: Any, nodes: list[dict[str, Any]], control: Path, cwd: str,
                requested: threading.Event | None = None) -> str:
    """Run `probe` on every alive node; refuse the cluster, in one line, when a node cannot see
    the grid directory or does not answer in time. Returns the marker's token; raises
    `raylink.Stopped` when Ctrl-C (`requested`) comes first."""
    token = write_marker(control)
    labels = node_labels(nodes)
    refs = send_probes(ray, [n["NodeID"] for n in nodes], control, token, cwd)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    ready, missing = [], list(refs)
    while missing and time.monotonic() < deadline:  # in slices: Ctrl-C must not wait for a node
        if requested is not None and requested.is_set():
            for r in missing:
                ray.cancel(r, force=True)
            raise raylink.Stopped("probing the nodes")
        done, missing = ray.wait(missing, num_returns=len(missing), timeout=0.5)
        ready += done
    if missing:
        late = ", ".join(labels[refs[r]] for r in missing)
        for r in missing:
            ray.cancel(r, force=True)
        raise FedhetError(f"Ray node(s) {late} did not answer the file probe within "
                          f"{PROBE_TIMEOUT_S:.0f} s; check that they are healthy (docs/cluster.md)")
    for ref in ready:
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayError as e:
            raise FedhetError(f"Ray node {labels[refs[ref]]} cannot run fedhet: {first_line(e)}") from None
        if not answer["ok"]:
            raise FedhetError(
                f"Ray node {labels[refs[ref]]} cannot use the grid directory: {answer['why']}; "
                "every node must mount it at the same path (a shared filesystem, docs/cluster.md)"
            )
    return token


class Members:
    """The nodes runs may go to: those probed at the start, and each node that joins later
    once its probe said it can use the grid directory. A joining node is probed when `look`
    first sees it; until it answers — and for good if it cannot use the grid or does not answer
    within `PROBE_TIMEOUT_S` — `selector()` keeps runs off it."""

    def __init__(self, ray: Any, nodes: list[dict[str, Any]], control: Path, token: str,
                 cwd: str, note: Any) -> None:
        self.ray, self.control, self.token, self.cwd, self.note = ray, control, token, cwd, note
        self.usable = {n["NodeID"] for n in nodes}
        self.refused: dict[str, str] = {}
        self.probing: dict[Any, tuple[str, float]] = {}  # probe ref → (node id, sent at)
        self.alive = list(nodes)
        self.labels = node_labels(nodes)

    def look(self) -> list[dict[str, Any]]:
        """Re-read the alive nodes, probe the new ones, take in the answers that came; returns
        the alive nodes runs may go to."""
        self.alive = alive_nodes(self.ray)
        for node, label in node_labels(self.alive).items():
            self.labels.setdefault(node, label)  # a node keeps its name in every line
        known = self.usable | set(self.refused) | {node for node, _ in self.probing.values()}
        new = [n["NodeID"] for n in self.alive if n["NodeID"] not in known]
        now = time.monotonic()
        for ref, node in send_probes(self.ray, new, self.control, self.token, self.cwd).items():
            self.probing[ref] = (node, now)
        if self.probing:
            ready, _ = self.ray.wait(list(self.probing), num_returns=len(self.probing), timeout=0)
            for ref in ready:
                node, _ = self.probing.pop(ref)
                try:
                    answer = self.ray.get(ref)
                except self.ray.exceptions.RayError as e:
                    answer = {"ok": False, "why": f"it cannot run fedhet ({first_line(e)})"}
                self._answered(node, answer)
            for ref, (node, sent) in list(self.probing.items()):
                if now - sent > PROBE_TIMEOUT_S:
                    del self.probing[ref]
                    self.ray.cancel(ref, force=True)
                    self.refuse(node, f"it did not answer the file probe within {PROBE_TIMEOUT_S:.0f} s")
        return [n for n in self.alive if n["NodeID"] in self.usable]

    def _answered(self, node: str, answer: dict[str, Any]) -> None:
        if node in self.refused:
            return  # a task of its own found it unusable before its probe answered
        if answer.get("ok"):
            self.usable.add(node)
            self.note(f"cluster: node {self.labels.get(node, node[:8])} joined; runs go there too")
        else:
            self.refuse(node, answer.get("why", "?"))

    def refuse(self, node: str, why: str) -> None:
        """Keep runs off `node` from now on, saying why once."""
        if node in self.refused:
            return
        self.usable.discard(node)
        self.refused[node] = why
        self.note(f"cluster: no run goes to node {self.labels.get(node, node[:8])}: {why}; "
                  "every node must mount the grid directory at the same path (docs/cluster.md)")

    def nowhere(self) -> bool:
        """Nodes are alive but no run may go to any of them."""
        return bool(self.alive) and not any(n["NodeID"] in self.usable for n in self.alive)

    def selector(self) -> dict[str, str] | None:
        """Task options that keep runs on usable nodes: none while every alive node is usable
        (Ray places runs as it likes), else a label selector listing the usable ones."""
        alive = [n["NodeID"] for n in self.alive]
        if all(node in self.usable for node in alive):
            return None
        return {"ray.io/node-id": "in(" + ",".join(sorted(n for n in alive if n in self.usable)) + ")"}


# -- the task --------------------------------------------------------------------------------
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
    nodes = alive_nodes(ray)
    check_resources(nodes, options)
    control = _control(runs_dir.resolve())
    cwd = os.getcwd()
    token = check_nodes(ray, nodes, control, cwd, requested)
    members = Members(ray, nodes, control, token, cwd, progress.note)
    labels = members.labels
    cores = max(1, int(options.cpus_per_run))
    plugin_files = plugins.files()
    task = ray.remote(run_task)
    where = {"num_cpus": options.cpus_per_run, "num_gpus": options.gpus_per_run, "max_retries": 0}
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
                (control / "stop").write_text("stop\n")
                tally.cancelled += sum(len(u) for u in queue)
                queue.clear()
            if time.monotonic() - checked > CAPACITY_EVERY_S:
                nodes = members.look()
                room, checked = capacity(nodes, options), time.monotonic()
                if room < 1 and not waiting:
                    progress.note("cluster: no alive node has room for a run; waiting for nodes "
                                  "to join (Ctrl-C stops the grid)")
                waiting = room < 1
            if queue and len(inflight) < max(1, throttle.room(room)) and not members.nowhere():
                selector = members.selector()  # keeps runs off nodes not (yet) probed
                placed = task.options(**where, **({"label_selector": selector} if selector else {}))
                while queue and len(inflight) < max(1, throttle.room(room)):
                    unit = queue.popleft()
                    attempts[id(unit)] = attempts.get(id(unit), 0) + 1
                    ref = placed.remote([dataclasses.replace(j, out=str(Path(j.out).resolve()))
                                         for j in unit], str(control), cwd, cores,
                                        options.gpus_per_run, token, plugin_files)
                    inflight[ref] = unit
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
            _where(progress, control, labels)
            progress.tick()
    except KeyboardInterrupt:
        hard.append(True)
        for ref in inflight:
            ray.cancel(ref, force=True)
        tally.unfinished = sum(len(u) for u in queue) + sum(len(u) for u in inflight.values())
    finally:
        _clear(control)


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
