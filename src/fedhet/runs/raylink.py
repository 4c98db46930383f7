"""How a `--cluster ray` driver reaches Ray: a cluster joined at an address, or a private local
Ray started for the grid, every step bounded (docs/cluster.md).

**An address** (`--ray-address`, else `$RAY_ADDRESS`) is checked before Ray is asked: its
form (`fedhet.engine.plan.ray_address`), then a TCP connect to the head's port
(`GCS_PROBE_S`); `auto` is probed at the address Ray would read from its address file. Only
then does `ray.init` run, in a thread of its own that the driver waits on for at most
`JOIN_TIMEOUT_S`, and gives up on (with one line) at Ctrl-C: a head that accepts the
connection but never answers cannot hold the driver.

**No address** starts a private local Ray, every time: `ray.init(address="local")` with a temp
directory of its own, so an address file another Ray left in `/tmp/ray` is never read (and
this Ray leaves none there). The processes it starts are recorded in that directory
(`LocalRay.record`); a driver that was killed (-9) leaves the record, and the next driver that
starts a local Ray ends what is left of the dead driver's one first (`reap`). Ray ties
its GCS and raylet to the thread that started them (`PR_SET_PDEATHSIG`), so that thread lives
as long as the connection (`Link`); it also blocks SIGINT, which every process Ray starts
inherits: a terminal's Ctrl-C reaches the driver alone, which stops the grid its own way.

Errors are one line naming the address and what to check; a cluster with token
authentication (`RAY_AUTH_MODE=token`) that refuses the driver's token says how to pass it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.engine import host_port, ray_address
from fedhet.errors import FedhetError
from fedhet.procs import cmdline, process_table, start_time
from fedhet.rundir import atomic_write_text

GCS_PROBE_S = 5.0
"""How long the TCP connect to a head's port may take before it counts as not answering."""

JOIN_TIMEOUT_S = 45.0
"""**[choice]** How long `ray.init` may take to join a cluster that accepted the TCP connect
(2-4 s on this project's loaded 2-core machine)."""

START_TIMEOUT_S = 180.0
"""**[choice]** How long starting the private local Ray may take (10-20 s on this project's
loaded 2-core machine)."""

STOP_GRACE_S = 5.0
"""How long a process of a dead driver's local Ray has between SIGTERM and SIGKILL."""

RECORD_EVERY_S = 2.0
"""How often the record of a private local Ray is brought up to date (workers come and go)."""

RECORD = "fedhet-driver.json"
"""The record of a private local Ray (its driver and processes), in its temp directory."""

TEMP_PREFIX = "fhray-"

AUTH_HINT = ("the cluster uses Ray's token authentication: give the driver the cluster's token "
             "(RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN or the token file ~/.ray/auth_token; "
             "docs/cluster.md)")


class Stopped(Exception):  # noqa: N818  (a stop, not an error)
    """Ctrl-C came while the driver was still joining Ray."""


@dataclass
class Link:
    """An open connection: `close()` shuts Ray down in this process and lets the thread that
    started it end; for a private local Ray it then ends what is left of that Ray."""

    ray: Any
    release: threading.Event
    local: LocalRay | None = None
    closed: bool = field(default=False, init=False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.ray.shutdown()
        finally:
            self.release.set()
            if self.local is not None:
                self.local.stop()


def first_line(e: BaseException) -> str:
    """The first line of a (Ray) error's message, or its type's name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def chosen_address(flag: str | None) -> tuple[str | None, str]:
    """The address to join and where it came from (`--ray-address`, `RAY_ADDRESS`); `None`
    (and `local`) for a private local Ray."""
    if flag is not None:
        address, source = ray_address(flag, "--ray-address"), "--ray-address"
    elif os.environ.get("RAY_ADDRESS", "").strip():
        address, source = ray_address(os.environ["RAY_ADDRESS"], "RAY_ADDRESS"), "RAY_ADDRESS"
    else:
        return None, "no address"
    return (None if address == "local" else address), source


def connect(ray: Any, flag: str | None, requested: threading.Event | None = None) -> Link:
    """Join the cluster named by `flag` or `$RAY_ADDRESS`, or start a private local Ray (after
    ending what killed drivers left of theirs: `reap`). Raises `Stopped` at Ctrl-C
    (`requested`), and a one-line `FedhetError` for a cluster that cannot be joined."""
    address, source = chosen_address(flag)
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    if address is None:
        reap()
        local = LocalRay()
        try:
            release = bounded(lambda: ray.init(address="local", include_dashboard=False,
                                               _temp_dir=str(local.temp_dir), **quiet),
                              START_TIMEOUT_S, requested,
                              lambda e: f"cannot start a local Ray for the grid: {first_line(e)}",
                              "starting a local Ray for the grid", every=local.remember)
        except BaseException:
            local.remember()  # what it started so far, which `stop` ends
            local.stop()
            raise
        local.remember()
        return Link(ray, release, local)
    target = address
    if address == "auto":
        found = auto_address()
        if found is None:
            raise FedhetError(f"{source} auto: no Ray cluster was started on this machine "
                              f"({address_file()} is missing); start one (`ray start --head`) "
                              "or name its head as HOST:PORT")
        target = found
    named = address if target == address else f"{address} ({target}, from {address_file()})"
    probe_port(target, named, source)

    def why(e: BaseException) -> str:
        text = first_line(e)
        if "authenticat" in str(e).lower() or "authtoken" in str(e).lower():
            return f"the Ray cluster at {named} refused this driver ({text}); {AUTH_HINT}"
        line = (f"cannot join the Ray cluster at {named} ({source}): {text}; check that its head "
                "runs the same Ray version and is healthy")
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            # Ray >= 2.59 turns token authentication on by itself; its error may not say so
            line += "; if it uses token authentication, " + AUTH_HINT.split(": ", 1)[1]
        return line

    release = bounded(lambda: ray.init(address=address, **quiet), JOIN_TIMEOUT_S, requested, why,
                      f"joining the Ray cluster at {named} ({source})")
    return Link(ray, release)


def probe_port(address: str, named: str, source: str) -> None:
    """A bounded TCP connect to the head's port: a closed port, an unreachable host or a name
    that does not resolve is one line at once, before Ray waits on it."""
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=GCS_PROBE_S):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise FedhetError(
            f"no Ray cluster answers at {named} ({source}): {why}; check that the head runs "
            "(`ray start --head`), that the port is its GCS port (6379 unless `--port` said "
            "otherwise) and that no firewall is in the way"
            + ("; or unset RAY_ADDRESS to start a private local Ray" if source == "RAY_ADDRESS" else "")
        ) from None


def address_file() -> Path:
    """Where Ray keeps the address of the last cluster `ray start` began on this machine."""
    root = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(root) / "ray" / "ray_current_cluster"


def auto_address() -> str | None:
    """The address `auto` stands for: the one in Ray's address file, if it holds one."""
    try:
        text = address_file().read_text().strip()
    except OSError:
        return None
    try:
        return ray_address(text, str(address_file()))
    except FedhetError:
        return None


def bounded(init: Callable[[], None], timeout: float, requested: threading.Event | None,
            why: Callable[[BaseException], str], doing: str,
            every: Callable[[], None] | None = None) -> threading.Event:
    """Run `init` (a `ray.init`) in a thread of its own and wait for it at most `timeout`
    seconds; the thread then waits on the returned event, which the caller sets once Ray is
    shut down (Ray ties what it started to this thread), calling `every` each `RECORD_EVERY_S`
    meanwhile. SIGINT is blocked in the thread, and so in every process Ray starts. Raises
    `Stopped` when `requested` is set first, and `FedhetError(why(error))` when `init`
    fails."""
    done, release = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def keep() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            init()
        except BaseException as e:  # noqa: BLE001  (handed to the waiting thread)
            failure.append(e)
            done.set()
            return
        done.set()
        while not release.wait(RECORD_EVERY_S):
            if every is not None:
                every()

    threading.Thread(target=keep, name="fedhet-ray", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not done.wait(0.1):
        if requested is not None and requested.is_set():
            release.set()  # should `init` still return, its thread ends (and with it what Ray started)
            raise Stopped(doing)
        if time.monotonic() > deadline:
            release.set()
            raise FedhetError(f"{doing}: no answer within {timeout:.0f} s; check that the "
                              "cluster is healthy (`ray status` on its head) and reachable "
                              "from here")
    if failure:
        raise FedhetError(why(failure[0])) from None
    return release


# -- the private local Ray -------------------------------------------------------------------
def _started_by(pid: int, temp_dir: Path) -> dict[int, int]:
    """`pid -> start time` of the processes of the local Ray with `temp_dir` that `pid`
    started: its children that name `temp_dir` on their command line (Ray's GCS, raylet,
    monitors) and everything below them (agents and workers, which rename themselves)."""
    table = process_table(live_only=True)
    kids: dict[int, list[int]] = {}
    for child, (parent, _, _) in table.items():
        kids.setdefault(parent, []).append(child)
    found: dict[int, int] = {}
    todo = [k for k in kids.get(pid, []) if str(temp_dir) in cmdline(k)]
    while todo:
        child = todo.pop()
        found[child] = table[child][2]
        todo.extend(kids.get(child, []))
    return found


def _same(pid: int, start: int) -> bool:
    """Is `pid` still the process that started at `start` (not a reused PID)?"""
    return start_time(pid) == start


def end_processes(procs: dict[int, int], grace: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM, then (after `grace` s) SIGKILL, each of `procs` (`pid -> start time`) that is
    still the process recorded; returns those that outlived both."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid, start in procs.items() if _same(pid, start)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [pid for pid in alive if _same(pid, procs[pid])]
        if not alive:
            return []
    return alive


class LocalRay:
    """A private local Ray: its temp directory (`fhray-*` under `$RAY_TMPDIR`, else the system's
    temp directory), its processes, and their record in that directory (`RECORD`)."""

    def __init__(self) -> None:
        # under $RAY_TMPDIR where the user moved Ray's files; short: Ray's socket paths
        self.temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=temp_root()))
        self.record = self.temp_dir / RECORD
        self.procs: dict[int, int] = {}
        self.lock = threading.Lock()  # `remember` runs in the connection's thread too
        self.stopped = False

    def remember(self) -> None:
        """Record the processes of this Ray (with their start times)."""
        with self.lock:
            if self.stopped:
                return
            self.procs.update(_started_by(os.getpid(), self.temp_dir))
            me = os.getpid()
            with contextlib.suppress(OSError):
                atomic_write_text(self.record, json.dumps({
                    "driver": [me, start_time(me) or 0],
                    "processes": {str(p): s for p, s in self.procs.items()}}))

    def stop(self) -> None:
        """After `ray.shutdown`: end any process of this Ray still there (recorded, or found
        now), remove the temp directory with the record."""
        with self.lock:
            self.stopped = True
        end_processes({**self.procs, **_started_by(os.getpid(), self.temp_dir)}, grace=2.0)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def temp_root() -> Path:
    """Where private local Rays keep their temp directories."""
    return Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())


def reap() -> list[int]:
    """End what is left of the private local Rays of drivers that are gone (killed with -9):
    every `fhray-*` directory of this user under `temp_root()` whose record names a driver
    that no longer runs. Its recorded processes still running (same PID and start time) get
    SIGTERM, then SIGKILL; the directory is removed. Returns the PIDs ended. A directory without
    a record yet (a Ray being started) or whose driver still runs is left alone."""
    ended: list[int] = []
    for record in temp_root().glob(f"{TEMP_PREFIX}*/{RECORD}"):
        try:
            if record.stat().st_uid != os.getuid():
                continue
            data = json.loads(record.read_text())
            driver_pid, driver_start = (int(x) for x in data["driver"])
            procs = {int(p): int(s) for p, s in data["processes"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half written, or not ours to read: its driver's own `stop` removes it
        if _same(driver_pid, driver_start):
            continue
        ended += [pid for pid, start in procs.items() if _same(pid, start)]
        end_processes(procs)
        shutil.rmtree(record.parent, ignore_errors=True)
    return ended
