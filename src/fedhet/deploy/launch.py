"""A Flower federation on this machine: one SuperLink and N SuperNodes on 127.0.0.1.

`LocalFederation` starts `flower-superlink` and one `flower-supernode` per client as
subprocesses (insecure HTTP on loopback only, runtime dependency installation, telemetry and
update checks off, all state under a private `FLWR_HOME`), submits a fedhet run with
`flwr run` and stops every process it started when it exits, even on error. By default
(`warm=True`) each SuperNode runs in process-isolation mode with a warm ClientApp worker next
to it (`fedhet.deploy.worker`, `fedhet.deploy.node`). `Watchdog` ends a run as soon as the
SuperLink, the ServerApp or `flwr run` dies, and turns a SuperNode that dies mid-run into one
line and a dropped client (recorded in `events_file` for the server app). It is what
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
from fedhet.errors import FedhetError
from fedhet.procs import cmdline as _cmdline
from fedhet.procs import process_table as _process_table
from fedhet.procs import stat as _stat
from fedhet.rundir import read_summary, rows_saved

HOST = "127.0.0.1"
CONNECTION = "fedhet-local"
AUTH_SIMULATION = ("--auth admits registered SuperNodes only, and --simulation starts none (its "
                   "nodes are virtual, inside the SuperLink): leave out one of the two")
REFUSED = "Failed to activate SuperNode"
"""What a SuperNode logs when the SuperLink refuses it (with `--enable-supernode-auth`: its
public key was not registered)."""


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
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="fedhet-flower-")
        self.workdir = Path(workdir or self._tmp.name)
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
        table = _process_table()
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
        table = _process_table()
        return [pid for pid, (_, sid, start) in table.items()
                if pid != os.getpid() and _alive(pid)
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
            for pid in [proc.pid, *_children(proc.pid)]:
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
        return [pid for p in self.processes() for pid in (p.pid, *_children(p.pid))]

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
            while left and time.monotonic() < deadline and any(_alive(p) for p in left):
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


def _parent(pid: int) -> int:
    """The parent PID of `pid` (0 once it is gone)."""
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def named_descendants(pid: int, name: str) -> list[int]:
    """Descendants of `pid` whose command line names `name` and whose parent's does not. A
    process forked by one of them carries its command line until it execs (Flower's processes
    run `uname -p` and `file -b` for Python's `platform`), then exits: it is not one of them."""
    return [p for p in _children(pid) if name in _cmdline(p) and name not in _cmdline(_parent(p))]


def describe_status(status: int | None) -> str:
    """'exit code N' or 'killed by SIGKILL' for a Popen return code (negative = signal)."""
    if status is None:
        return "exit code unknown"
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-status).name}"
        return f"killed by signal {-status}"
    return f"exit code {status}"


def _wait_status(pid: int) -> int | None:
    """Exit status of a zombie that is not our child (/proc stat field 52), as Popen reports it."""
    fields = _stat(pid)
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    raw = int(fields[49])
    return -(raw & 0x7F) if raw & 0x7F else raw >> 8


SERVERAPP = "flwr-serverapp"
CONNECT_FAILED = ("Connection attempt failed", "ConnectError", "Name or service not known",
                  "Connection refused", "nodename nor servname")


class Watchdog:
    """Watches every process a `LocalFederation` started while a run is in flight.

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

    def __init__(self, fed: LocalFederation, client: subprocess.Popen, echo: Any = print,
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
            fields = _stat(pid)
            if fields is None or fields[0] == "Z":
                raise FedhetError(
                    f"the ServerApp ({SERVERAPP}, PID {pid}) died before the run finished "
                    f"({describe_status(_wait_status(pid))}); stopped the other processes; "
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
