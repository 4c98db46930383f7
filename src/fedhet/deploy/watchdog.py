"""Watching a local Flower federation while a run is in flight (`Watchdog`), and waiting for
the run's result in its run directory (`wait_for_run`): a process whose death ends the run is
one `FedhetError` line naming it; a SuperNode that dies mid-run is one line and a dropped
client.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from fedhet.deploy.process_tree import describe_status, named_descendants, wait_status
from fedhet.errors import FedhetError
from fedhet.procs import stat
from fedhet.rundir import read_summary, rows_saved


class Federation(Protocol):
    """What the watchdog reads of the federation it watches (`launch.LocalFederation`): its
    processes by role, where their logs go, and how a lost SuperNode is started again."""

    superlink: subprocess.Popen | None
    nodes: dict[int, subprocess.Popen]
    workers: dict[int, subprocess.Popen]
    names: dict[int, tuple[str, Path]]
    node_address: dict[int, str]
    auth: bool
    logs: Path
    shown_logs: Path
    events_file: Path

    def track(self) -> None: ...
    def processes(self) -> list[subprocess.Popen]: ...
    def kill_node(self, partition_id: int) -> None: ...
    def restart_command(self, partition_id: int) -> str: ...

REFUSED = "Failed to activate SuperNode"
"""What a SuperNode logs when the SuperLink refuses it (with `--enable-supernode-auth`: its
public key was not registered)."""

SERVERAPP = "flwr-serverapp"
CONNECT_FAILED = ("Connection attempt failed", "ConnectError", "Name or service not known",
                  "Connection refused", "nodename nor servname")


class Watchdog:
    """Watches every process a `Federation` (`launch.LocalFederation`) started while a run is
    in flight.

    `check()` raises a one-line `FedhetError` naming the first process that died (name, PID,
    exit status) whose death ends the run: the SuperLink, `flwr run`, or the `flwr-serverapp`
    process the SuperLink started for this run. A SuperNode (or its ClientApp worker) that
    dies once the run has started is not fatal: it is one line (which node, when, during which
    round, how to start it again) and the server app drops its client from the rounds it
    misses until a SuperNode for the same partition joins again. A SuperNode that dies before
    the nodes joined, or that could not reach its SuperLink, still ends the run: the server
    would only wait for it. `check()` also echoes to `echo`, as they happen: the server app's
    `fedhet:` lines (joins, rounds, dropped and rejoined clients, the result) from
    `flwr run --stream`, and a SuperNode that cannot reach its SuperLink, with the address.
    """

    def __init__(self, fed: Federation, client: subprocess.Popen, echo: Any = print,
                 out: Path | None = None) -> None:
        self.fed = fed
        self.client = client
        self.echo = echo
        self.out = out
        self.joined = False  # the server app said that every SuperNode joined
        self.done = False  # the server app said the run finished
        self.serverapps: dict[int, None] = {}
        self.ignored = set(self._serverapp_pids())  # left over from an earlier run
        self.offsets: dict[Path, int] = {}
        self.warned: set[int] = set()

    def _serverapp_pids(self) -> list[int]:
        """The SuperLink's ServerApp processes (`named_descendants`: taking a process the
        ServerApp forked for it reported a healthy run as dead)."""
        if self.fed.superlink is None:
            return []
        return named_descendants(self.fed.superlink.pid, SERVERAPP)

    def _new_lines(self, path: Path) -> list[str]:
        try:
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # whole lines only
        self.offsets[path] = self.offsets.get(path, 0) + end
        return data[:end].decode(errors="replace").splitlines()

    def echo_news(self) -> None:
        """Print the server app's `fedhet:` lines and unreachable-SuperLink warnings."""
        for line in self._new_lines(self.fed.logs / "flwr-run.log"):
            if "fedhet: " in line:
                line = line[line.index("fedhet: "):].rstrip()
                self.joined = self.joined or "SuperNodes joined" in line
                self.done = self.done or line.startswith("fedhet: finished")
                self.echo(line)
        for i, proc in list(self.fed.nodes.items()):
            lines = self._new_lines(self.fed.logs / f"supernode-{i}.log")
            bad = [ln for ln in lines if any(k in ln for k in CONNECT_FAILED)]
            if bad and i not in self.warned:
                self.warned.add(i)
                self.echo(f"warning: SuperNode {i} (PID {proc.pid}) cannot reach the SuperLink at "
                          f"{self.fed.node_address.get(i, '?')}; retrying (see {self.fed.shown_logs})")

    def check(self) -> None:
        """Raise if a watched process has exited (see the class docstring)."""
        self.echo_news()
        for pid in self._serverapp_pids():
            if pid not in self.ignored:
                self.serverapps.setdefault(pid)
        for pid in self.serverapps:
            fields = stat(pid)
            if fields is None or fields[0] == "Z":
                raise FedhetError(
                    f"the ServerApp ({SERVERAPP}, PID {pid}) died before the run finished "
                    f"({describe_status(wait_status(pid))}); stopped the other processes; "
                    f"see {self.fed.shown_logs}"
                )
        self.fed.track()
        for proc in [*self.fed.processes(), self.client]:
            status = proc.poll()
            if status is None or proc is self.client or proc not in self.fed.processes():
                continue  # alive, or already reported with its SuperNode
            name, log = self.fed.names.get(proc.pid, ("a Flower process", self.fed.shown_logs))
            hint = ""
            if name.startswith(("SuperNode ", "ClientApp worker ")):
                i = int(name.split()[-1])
                unreachable = i in self.warned or _log_mentions(
                    self.fed.logs / f"supernode-{i}.log", CONNECT_FAILED)
                if self.joined and not unreachable:
                    self._node_left(i, name, proc, status)
                    continue
                if unreachable:
                    hint = f"; it could not reach the SuperLink at {self.fed.node_address.get(i)}"
                elif self.fed.auth and _log_mentions(self.fed.logs / f"supernode-{i}.log", (REFUSED,)):
                    hint = "; the SuperLink refused it: its public key is not registered"
            raise FedhetError(f"{name} (PID {proc.pid}) died with {describe_status(status)}{hint}; "
                              f"stopped the other processes; see {log}")

    def _node_left(self, i: int, name: str, proc: subprocess.Popen, status: int | None) -> None:
        """A SuperNode or its worker died mid-run: stop the pair, say so in one line."""
        node = self.fed.nodes.get(i)
        if name.startswith("ClientApp worker ") and node is None:
            self.fed.workers.pop(i, None)  # its SuperNode went first and was reported
            return
        pid = node.pid if node is not None else proc.pid
        with contextlib.suppress(KeyError, subprocess.TimeoutExpired):
            self.fed.kill_node(i)
        with self.fed.events_file.open("a") as f:
            f.write(json.dumps({"partition": i, "time": time.time(), "pid": pid}) + "\n")
        what = "" if name.startswith("SuperNode ") else f" (its ClientApp worker, PID {proc.pid})"
        self.echo(f"fedhet: {time.strftime('%H:%M:%S')} SuperNode {i} (PID {pid}){what} died "
                  f"with {describe_status(status)} during round {self._round()}; client {i} is "
                  "dropped from the rounds it misses; to bring it back: "
                  f"{self.fed.restart_command(i)}")

    def _round(self) -> str:
        """The round in flight, from the rows of OUT/metrics.csv (row 0 is the initial model)."""
        if self.out is None:
            return "?"
        return str(max(rows_saved(self.out) + 1, 1))


def _log_mentions(log: Path, needles: tuple[str, ...]) -> bool:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return any(k in text for k in needles)


def _server_error(out: Path) -> str:
    """One line for the error the server app wrote to OUT/error.txt."""
    text = (out / "error.txt").read_text(errors="replace").strip()
    lines = text.splitlines() or ["(empty)"]
    if len(lines) == 1:
        return lines[0]
    return f"{lines[-1]} (traceback in {out / 'error.txt'})"


def wait_for_run(out: Path, timeout: float, procs: list[subprocess.Popen], logs: Path,
                 watchdog: Watchdog | None = None) -> dict:
    """Poll the run directory until `summary.json` says finished (and `deploy.json` is
    written) or the server app wrote `error.txt`; return the summary.

    `procs[0]` is `flwr run`, `procs[1]` the SuperLink; with a `watchdog`, every process of the
    federation is watched instead and the first that dies ends the wait with its name.
    """

    def finished() -> dict | None:
        path = out / "summary.json"
        if path.exists() and (out / "deploy.json").exists():
            summary = read_summary(out)
            if summary.get("finished"):
                return summary
        return None

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (out / "error.txt").exists():
            raise FedhetError(f"the run failed on the server: {_server_error(out)}")
        if (summary := finished()) is not None:
            if watchdog is not None:  # the last lines may still be on their way through flwr run
                until = time.monotonic() + 3.0
                watchdog.echo_news()
                while not watchdog.done and time.monotonic() < until:
                    time.sleep(0.1)
                    watchdog.echo_news()
            return summary
        try:
            if watchdog is not None:
                watchdog.check()
            elif any(p.poll() is not None for p in procs[1:2]):
                raise FedhetError(f"the SuperLink exited during the run; see {logs}")
        except FedhetError:
            if (summary := finished()) is not None:
                return summary  # it finished just as a process exited
            raise
        if procs[0].poll() is not None:
            time.sleep(2.0)  # the server app may still be writing
            if (out / "error.txt").exists():
                continue
            if (summary := finished()) is not None:
                continue
            raise FedhetError(
                f"flwr run (PID {procs[0].pid}) ended with {describe_status(procs[0].poll())} "
                f"but the server app wrote no result to {out}; see {logs}"
            )
        time.sleep(0.2)
    raise FedhetError(f"the run did not finish within {timeout:.0f} s; see {logs}")
