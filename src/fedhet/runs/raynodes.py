"""The nodes of a Ray cluster as a grid's driver sees them (`fedhet.runs.cluster`): which are
alive (`alive_nodes`), what they can hold (`capacity`), and whether each can use the grid
directory.

**The file probe.** At start a probe task on every node must read a marker the driver wrote
into the grid directory, write beside it, find the driver's working directory and run the
driver's fedhet; a node that cannot is refused with one line (`check_nodes`). A node that joins
later is probed the same way when the driver first sees it (`Members`); until its answer comes
runs are kept off it (a Ray label selector on `ray.io/node-id`), and a node that cannot use the
grid gets one line and no run.
"""

from __future__ import annotations

import math
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhet.engine import ClusterOptions
from fedhet.errors import FedhetError
from fedhet.runs import raylink
from fedhet.runs.raylink import first_line
from fedhet.version import __version__

if TYPE_CHECKING:
    import threading


PROBE_TIMEOUT_S = 120.0
"""**[choice]** How long every node has to answer the file probe (a node must start a worker
process for it: seconds on an idle node, longer on a busy one)."""


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

