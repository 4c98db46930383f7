"""A Flower federation on this machine: one SuperLink and N SuperNodes on 127.0.0.1.

`LocalFederation` starts `flower-superlink` and one `flower-supernode` per client as
subprocesses (insecure HTTP on loopback only, runtime dependency installation, telemetry and
update checks off, all state under a private `FLWR_HOME`), submits a fedhet run with
`flwr run` and stops every process it started when it exits, even on error. By default
(`warm=True`) each SuperNode runs in process-isolation mode with a warm ClientApp worker next
to it (`fedhet.deploy.worker`, `fedhet.deploy.node`). `Watchdog` (`fedhet.deploy.watchdog`)
ends a run as soon as the SuperLink, the ServerApp or `flwr run` dies, and turns a SuperNode
that dies mid-run into one line and a dropped client (recorded in `events_file` for the server
app); `fedhet.deploy.process_tree` reads and stops the processes. It is what
`fedhet deploy local` and the tests use; docs/deploy.md shows the same commands by hand and
with TLS across machines.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import fedhet
from fedhet.deploy.auth import make_loopback_certificates, make_node_keys
from fedhet.deploy.process_tree import alive, children, stop_tree
from fedhet.deploy.watchdog import Watchdog, wait_for_run
from fedhet.errors import FedhetError
from fedhet.procs import process_table

HOST = "127.0.0.1"
CONNECTION = "fedhet-local"
AUTH_SIMULATION = ("--auth admits registered SuperNodes only, and --simulation starts none (its "
                   "nodes are virtual, inside the SuperLink): leave out one of the two")


def _parent_death_signal() -> Any:
    """A `preexec_fn` that makes the child get SIGTERM when the thread that started it ends
    (Linux `prctl(PR_SET_PDEATHSIG)`), or None where that is not available. `prctl` is looked
    up here, in the parent, so the child only calls it between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG


_DIE_WITH_PARENT = _parent_death_signal()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


RAY_PROBE_S = 5.0
"""How long `probe_ray_address` waits for a Ray head to answer."""

RAY_PROBE_RPC = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""A call every Ray head's GCS (a gRPC server) answers, with an empty request."""


def probe_ray_address(address: str, flag: str = "--ray-address", timeout: float = RAY_PROBE_S) -> None:
    """Fail fast, in one line, when no Ray head answers at `HOST:PORT`, before any Flower
    process starts: one call to the head's GCS, at most `timeout` s (a port that merely accepts
    connections, as a firewall or another server may, is no cluster). `local` (a private Ray),
    `auto` (Ray looks for a cluster on this machine) and `ray://` (a Ray Client server, not the
    GCS) are left to Ray; a head that refuses the call for want of a token (`RAY_AUTH_MODE=token`,
    docs/cluster.md) answers. Needs grpcio (Flower's dependency)."""
    if address in ("local", "auto") or "://" in address:
        return
    import grpc  # with fedhet[flower]

    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit():
        raise FedhetError(f"{flag} {address}: give HOST:PORT of the Ray cluster's head (`ray start "
                          "--head` prints it), or auto")
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            channel.unary_unary(RAY_PROBE_RPC)(b"", timeout=timeout)
            return
        except grpc.RpcError as e:
            code = e.code()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return  # a head with Ray's token authentication on: Ray's own connection sends the token
    why = {grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer within {timeout:g} s",
           grpc.StatusCode.UNAVAILABLE: "nothing listens there",
           grpc.StatusCode.UNIMPLEMENTED: "a server answers, but not Ray's"}.get(code, code.name.lower())
    raise FedhetError(
        f"{flag} {address}: no Ray cluster answers there ({why}); start its head with "
        f"`ray start --head --port {port}` on {host}, or leave {flag} out for a private one-node Ray")


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


def flower_env(flwr_home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower processes: private home, no telemetry, fedhet importable."""

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
    `n` nodes itself and no SuperNode is started. Each virtual node's ClientApp runs in a Ray
    actor holding `cpus_per_node` CPUs and `gpus_per_node` GPUs (Flower's backend config
    `client_resources`; the actor pool is as large as the cluster's nodes can hold).
    `ray_address` joins an existing Ray cluster (`ray start --head` on one machine, `ray start
    --address HEAD:6379` on the others; Ray's own `RAY_ADDRESS` otherwise); without one,
    Flower starts a private one-node Ray instance (`RAY_ADDRESS=local`), never a stray one.

    Every process started here gets its own session, and every process they start is
    tracked (`track`), so `stop` also ends what a dead parent left behind (the SuperLink's
    `flwr-superexec` and `flwr-serverapp` when the SuperLink itself was killed). On Linux the
    processes started from the main thread also get SIGTERM if this process dies without
    stopping them (`kill -9`): `PR_SET_PDEATHSIG`.
    `tls=(ca.crt, server.pem, server.key)` replaces `--insecure` on every connection.
    `node_config` adds node-config entries per partition id (e.g. `data-dir`).
    """

    def __init__(self, num_nodes: int, workdir: Path | None = None, start_timeout: float = 60.0,
                 node_config: dict[int, dict[str, Any]] | None = None, simulation: bool = False,
                 cpus_per_node: int = 1, tls: tuple[Path, Path, Path] | None = None,
                 warm: bool = True, node_max_wait: float = 60.0, gpus_per_node: float = 0.0,
                 ray_address: str | None = None, logs_to: Path | None = None,
                 auth: bool = False, register_timeout: float = 60.0) -> None:
        if auth and simulation:
            raise FedhetError(AUTH_SIMULATION)
        self.num_nodes = num_nodes
        self.auth = auth
        self.register_timeout = register_timeout
        self.node_keys: dict[int, tuple[Path, Path]] = {}
        self.registered: dict[int, str] = {}
        """Partition id -> the node id the SuperLink gave its registered public key."""
        self.warm = warm and not simulation
        self.node_max_wait = node_max_wait
        self.tls = tuple(Path(p).resolve() for p in tls) if tls else None
        self.simulation = simulation
        self.cpus_per_node = cpus_per_node
        self.gpus_per_node = gpus_per_node
        self.ray_address = ray_address
        self.start_timeout = start_timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir:
            self.workdir = Path(workdir)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="fedhet-flower-")
            self.workdir = Path(self._tmp.name)
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.logs_to = Path(logs_to) if logs_to else None
        """Where the logs are copied when the federation stops (messages name it)."""
        self.shown_logs = self.logs_to or self.logs
        self.events_file = self.workdir / "node-events.jsonl"
        """SuperNodes seen dying (`Watchdog`), for the server app (`project.app_pyproject`)."""
        self.env = flower_env(self.flwr_home)
        if simulation:
            self.env["RAY_ADDRESS"] = ray_address or os.environ.get("RAY_ADDRESS") or "local"
        self.port = free_port()
        self.superlink: subprocess.Popen | None = None
        self.nodes: dict[int, subprocess.Popen] = {}
        self.workers: dict[int, subprocess.Popen] = {}
        self.node_address: dict[int, str] = {}
        self.names: dict[int, tuple[str, Path]] = {}
        self.node_config = node_config or {}
        self.spawned: list[subprocess.Popen] = []
        self.tracked: dict[int, int] = {}  # PID -> start time, every process of the federation
        self.sessions: set[int] = set()

    # -- processes ------------------------------------------------------------------------
    def _spawn(self, log_name: str, args: list[str], name: str) -> subprocess.Popen:
        """Start one process, its output in logs/LOG_NAME.log; `name` is how errors call it."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{log_name}.log", "ab")  # noqa: SIM115 (closed with the process)
        try:
            # the signal goes when the starting *thread* ends: only ask for it from the main
            # thread, which lives as long as the process
            main = threading.current_thread() is threading.main_thread()
            proc = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.workdir,
                                    start_new_session=True,
                                    preexec_fn=_DIE_WITH_PARENT if main else None)
        finally:
            log.close()
        self.names[proc.pid] = (name, self.shown_logs / f"{log_name}.log")
        self.spawned.append(proc)
        self.track()
        return proc

    def track(self) -> None:
        """Remember every live descendant of the started processes (PID, start time, session),
        so that `stop` finds them even after their parent died."""
        table = process_table()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            kids.setdefault(ppid, []).append(pid)
        todo = [p.pid for p in self.spawned if p.poll() is None]
        while todo:
            pid = todo.pop()
            if pid in table:
                self.tracked[pid] = table[pid][2]
                self.sessions.add(table[pid][1])
            todo.extend(kids.get(pid, []))
        self.sessions.discard(os.getsid(0))

    def leftovers(self) -> list[int]:
        """Live processes of this federation: tracked PIDs (same start time) and any process in
        a session that one of them led."""
        own = os.getsid(0)
        table = process_table()
        return [pid for pid, (_, sid, start) in table.items()
                if pid != os.getpid() and alive(pid)
                and (self.tracked.get(pid) == start or (sid in self.sessions and sid != own))]

    def start(self) -> LocalFederation:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        if self.auth and self.tls is None:  # Flower authenticates SuperNodes over TLS only
            self.tls = make_loopback_certificates(self.workdir / "tls")
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
            *(["--enable-supernode-auth"] * self.auth),
        ], "SuperLink")
        _wait_port(self.port, self.start_timeout, self.superlink, self.shown_logs / "superlink.log")
        for i in range(0 if self.simulation else self.num_nodes):
            self.start_node(i)
        return self

    def start_node(self, partition_id: int, superlink: str | None = None,
                   register: bool = True) -> subprocess.Popen:
        """Start the SuperNode of `partition_id` (and, with `warm`, its ClientApp worker).

        `superlink` overrides the address it connects to (tests use a wrong one). The node
        gives up (and exits) after `node_max_wait` s without reaching the SuperLink, which the
        run's watchdog then reports with the address. With `auth`, the node signs its requests
        with its own key pair (made here once, under `keys/`), whose public key is registered
        with the SuperLink first unless `register` is False (a node the SuperLink must refuse).
        """
        items = {"partition-id": partition_id, "num-partitions": self.num_nodes,
                 **self.node_config.get(partition_id, {})}
        config = " ".join(f"{k}={_config_value(v)}" for k, v in items.items())
        address = superlink or f"{HOST}:{self.port}"
        runtime_port = free_port()
        self.node_address[partition_id] = address
        name = f"SuperNode {partition_id}"
        args = [
            *(_fast_node_command() if self.warm else ["flower-supernode"]),
            *(["--root-certificates", str(self.tls[0])] if self.tls else ["--insecure"]),
            "--superlink", address, "--max-wait-time", str(self.node_max_wait),
            "--node-config", config, "--host", HOST, "--port", str(runtime_port),
            *(["--isolation", "process"] if self.warm else []),
            *(["--auth-supernode-private-key", str(self._node_key(partition_id, register))]
              if self.auth else []),
        ]
        self.nodes[partition_id] = self._spawn(f"supernode-{partition_id}", args, name)
        if self.warm:
            self.workers[partition_id] = self._spawn(f"clientapp-{partition_id}", [
                sys.executable, "-m", "fedhet.deploy.worker", "--insecure",
                "--runtime-api-address", f"{HOST}:{runtime_port}",
                "--node-pid", str(self.nodes[partition_id].pid),  # lives as long as its node
            ], f"ClientApp worker {partition_id}")
        return self.nodes[partition_id]

    def _node_key(self, partition_id: int, register: bool) -> Path:
        """The private key of `partition_id`'s SuperNode, made (and registered) once."""
        if partition_id not in self.node_keys:
            self.node_keys[partition_id] = make_node_keys(self.workdir / "keys",
                                                          f"supernode-{partition_id}")
        if register and partition_id not in self.registered:
            self.registered[partition_id] = self.register(self.node_keys[partition_id][1])
        return self.node_keys[partition_id][0]

    def register(self, public_key: Path) -> str:
        """`flwr supernode register PUBLIC_KEY`: let the SuperNode holding its private key
        join; returns the node id the SuperLink gave it."""
        args = ["flwr", "supernode", "register", str(public_key), CONNECTION, "--format", "json"]
        try:
            done = subprocess.run(args, env=self.env, cwd=self.workdir, capture_output=True,
                                  text=True, timeout=self.register_timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise FedhetError(f"`{' '.join(args)}` did not answer within "
                              f"{self.register_timeout:.0f} s; see {self.shown_logs}") from None
        try:
            answer = json.loads(done.stdout[done.stdout.index("{"):])
        except ValueError:
            answer = {}
        if done.returncode != 0 or not answer.get("success"):
            why = (done.stdout + done.stderr).strip().splitlines()
            raise FedhetError(f"could not register {public_key} with the SuperLink: "
                              f"{why[-1] if why else f'exit code {done.returncode}'}")
        return str(answer["node-id"])

    def kill_node(self, partition_id: int) -> None:
        """Stop one SuperNode (and its ClientApp processes) without notice: SIGKILL."""
        procs = [self.nodes.pop(partition_id)]
        if partition_id in self.workers:
            procs.append(self.workers.pop(partition_id))
        for proc in procs:
            self.names.pop(proc.pid, None)
            for pid in [proc.pid, *children(proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart_command(self, partition_id: int) -> str:
        """The command that starts the SuperNode of `partition_id` again, by hand."""
        items = {"partition-id": partition_id, "num-partitions": self.num_nodes,
                 **self.node_config.get(partition_id, {})}
        config = " ".join(f"{k}={_config_value(v)}" for k, v in items.items())
        security = f"--root-certificates {self.tls[0]}" if self.tls else "--insecure"
        if partition_id in self.node_keys:
            security += f" --auth-supernode-private-key {self.node_keys[partition_id][0]}"
        return (f"FLWR_HOME={self.flwr_home} flower-supernode {security} --superlink "
                f"{self.node_address.get(partition_id, f'{HOST}:{self.port}')} "
                f"--node-config '{config}'")

    def processes(self) -> list[subprocess.Popen]:
        return [p for p in (self.superlink, *self.nodes.values(), *self.workers.values())
                if p is not None]

    def all_pids(self) -> list[int]:
        return [pid for p in self.processes() for pid in (p.pid, *children(p.pid))]

    def stop(self, grace: float = 5.0) -> None:
        """Stop every process of the federation: SIGTERM, then SIGKILL what is left after
        `grace` s, orphans included (`leftovers`)."""
        self.track()
        for proc in reversed(self.processes()):
            stop_tree(proc, grace=grace)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = self.leftovers()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while left and time.monotonic() < deadline and any(alive(p) for p in left):
                time.sleep(0.1)
        for proc in self.spawned:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        self.nodes.clear()
        self.workers.clear()
        self.superlink = None

    def __enter__(self) -> LocalFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self.logs_to is not None and self.logs.is_dir():
            shutil.copytree(self.logs, self.logs_to, dirs_exist_ok=True)
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
                     f"num-supernodes={self.num_nodes} client-resources-num-cpus={self.cpus_per_node} "
                     f"client-resources-num-gpus={float(self.gpus_per_node)!r}"]
        return self._spawn("flwr-run", args, "flwr run")

    def run(self, app_dir: Path, out: Path, timeout: float = 3600.0,
            run_config: list[str] | None = None, echo: Any = print) -> dict[str, Any]:
        """Submit the run, wait until the server app finishes it, return its summary.

        Every started process is watched (`Watchdog`): if one dies the wait ends at once with
        a `FedhetError` naming it, and the caller's `with` stops the others.
        """
        client = self.submit(app_dir, run_config)
        watchdog = Watchdog(self, client, echo=echo, out=Path(out))
        try:
            return wait_for_run(Path(out), timeout, [client, *self.processes()], self.shown_logs,
                                watchdog=watchdog)
        finally:
            stop_tree(client, grace=2.0)


def _fast_node_command() -> list[str]:
    """`flower-supernode` with its idle polls shortened (see `fedhet.deploy.node`)."""
    return [sys.executable, "-m", "fedhet.deploy.node"]


def _config_value(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
