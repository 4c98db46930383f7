"""A Flower federation on this machine: one SuperLink and N SuperNodes on 127.0.0.1.

`LocalFederation` starts `flower-superlink` and one `flower-supernode` per client as
subprocesses (insecure HTTP on loopback only, runtime dependency installation, telemetry and
update checks off, all state under a private `FLWR_HOME`), submits a fedhet run with
`flwr run` and stops every process it started when it exits, even on error. It is what
`fedhet deploy local` and the tests use; docs/deploy.md shows the same commands by hand and
with TLS across machines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedhet.errors import FedhetError

HOST = "127.0.0.1"
CONNECTION = "fedhet-local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FedhetError(f"flower-superlink exited at start; see {log}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise FedhetError(f"flower-superlink did not listen on {HOST}:{port} within {timeout:.0f} s")


def _children(pid: int) -> list[int]:
    """Descendants of `pid` (read from /proc), deepest last."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM `proc` and everything it started, SIGKILL what is left after `grace` s."""
    pids = [proc.pid, *_children(proc.pid)] if proc.poll() is None else _children(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        if not any(_alive(p) for p in pids):
            return


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def flower_env(flwr_home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: private home, no telemetry, fedhet importable."""
    import fedhet

    env = dict(os.environ)
    src = str(Path(fedhet.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.update({
        "FLWR_HOME": str(flwr_home), "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
    })
    env.update(extra or {})
    return env


class LocalFederation:
    """`with LocalFederation(n) as fed: fed.run(app_dir, out)` — see the module docstring.

    `simulation=True` uses Flower's simulation runtime (Ray) instead: the SuperLink runs the
    `n` nodes itself (`cpus_per_node` CPUs each) and no SuperNode is started.
    `tls=(ca.crt, server.pem, server.key)` replaces `--insecure` on every connection.
    `node_config` adds node-config entries per partition id (e.g. `data-dir`).
    """

    def __init__(self, num_nodes: int, workdir: Path | None = None, start_timeout: float = 60.0,
                 node_config: dict[int, dict[str, Any]] | None = None, simulation: bool = False,
                 cpus_per_node: int = 1, tls: tuple[Path, Path, Path] | None = None) -> None:
        self.num_nodes = num_nodes
        self.tls = tuple(Path(p).resolve() for p in tls) if tls else None
        self.simulation = simulation
        self.cpus_per_node = cpus_per_node
        self.start_timeout = start_timeout
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="fedhet-flower-")
        self.workdir = Path(workdir or self._tmp.name)
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.env = flower_env(self.flwr_home)
        self.port = free_port()
        self.superlink: subprocess.Popen | None = None
        self.nodes: dict[int, subprocess.Popen] = {}
        self.node_config = node_config or {}

    # -- processes ------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        try:
            return subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.workdir)
        finally:
            log.close()

    def start(self) -> LocalFederation:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        security = f'root-certificates = "{self.tls[0]}"' if self.tls else "insecure = true"
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{HOST}:{self.port}"\n{security}\n'
        )
        ca, cert, key = self.tls or ("", "", "")
        tls_args = ["--ssl-ca-certfile", str(ca), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
        self.superlink = self._spawn("superlink", [
            "flower-superlink", *(tls_args if self.tls else ["--insecure"]),
            "--host", HOST, "--port", str(self.port),
            "--disable-runtime-dependency-installation", *(["--simulation"] * self.simulation),
        ])
        _wait_port(self.port, self.start_timeout, self.superlink, self.logs / "superlink.log")
        for i in range(0 if self.simulation else self.num_nodes):
            self.start_node(i)
        return self

    def start_node(self, partition_id: int) -> subprocess.Popen:
        items = {"partition-id": partition_id, "num-partitions": self.num_nodes,
                 **self.node_config.get(partition_id, {})}
        config = " ".join(f"{k}={_config_value(v)}" for k, v in items.items())
        self.nodes[partition_id] = self._spawn(f"supernode-{partition_id}", [
            "flower-supernode",
            *(["--root-certificates", str(self.tls[0])] if self.tls else ["--insecure"]),
            "--superlink", f"{HOST}:{self.port}",
            "--node-config", config, "--host", HOST, "--port", str(free_port()),
        ])
        return self.nodes[partition_id]

    def kill_node(self, partition_id: int) -> None:
        """Stop one SuperNode (and its ClientApp processes) without notice: SIGKILL."""
        proc = self.nodes.pop(partition_id)
        for pid in [proc.pid, *_children(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def processes(self) -> list[subprocess.Popen]:
        return [p for p in (self.superlink, *self.nodes.values()) if p is not None]

    def all_pids(self) -> list[int]:
        return [pid for p in self.processes() for pid in (p.pid, *_children(p.pid))]

    def stop(self) -> None:
        for proc in reversed(self.processes()):
            stop_tree(proc)
        self.nodes.clear()
        self.superlink = None

    def __enter__(self) -> LocalFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    # -- runs -----------------------------------------------------------------------------
    def submit(self, app_dir: Path, run_config: list[str] | None = None) -> subprocess.Popen:
        """`flwr run APP --stream` in the background; its output goes to logs/flwr-run.log."""
        args = ["flwr", "run", str(Path(app_dir).resolve()), CONNECTION, "--stream"]
        for item in run_config or []:
            args += ["--run-config", item]
        if self.simulation:
            args += ["--federation-config",
                     f"num-supernodes={self.num_nodes} client-resources-num-cpus={self.cpus_per_node}"]
        return self._spawn("flwr-run", args)

    def run(self, app_dir: Path, out: Path, timeout: float = 3600.0,
            run_config: list[str] | None = None) -> dict[str, Any]:
        """Submit the run, wait until the server app finishes it, return its summary."""
        client = self.submit(app_dir, run_config)
        try:
            return wait_for_run(Path(out), timeout, [client, *self.processes()], self.logs)
        finally:
            stop_tree(client, grace=2.0)


def _config_value(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def wait_for_run(out: Path, timeout: float, procs: list[subprocess.Popen], logs: Path) -> dict:
    """Poll the run directory until `summary.json` says finished or the server app failed."""
    import json

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (out / "error.txt").exists():
            raise FedhetError(f"the run failed on the server: {(out / 'error.txt').read_text()}")
        path = out / "summary.json"
        if path.exists():
            summary = json.loads(path.read_text())
            if summary.get("finished") and (out / "deploy.json").exists():
                return summary
        if procs[0].poll() is not None and not (out / "summary.json").exists():
            time.sleep(1.0)  # the server app may still be writing
            if not (out / "summary.json").exists() and not (out / "error.txt").exists():
                raise FedhetError(f"`flwr run` exited before the run started; see {logs}")
        if any(p.poll() is not None for p in procs[1:2]):
            raise FedhetError(f"the SuperLink exited during the run; see {logs}")
        time.sleep(0.5)
    raise FedhetError(f"the run did not finish within {timeout:.0f} s; see {logs}")
