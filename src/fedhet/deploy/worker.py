"""A warm ClientApp runner for a SuperNode started with `--isolation process`.

Flower 1.41 runs every message a SuperNode receives in a fresh `flwr-clientapp` process. For
fedhet that process imports torch and rebuilds the node's data partition each time, which
costs seconds per message on a small machine. This runner is a drop-in for the SuperExec that
the SuperNode would otherwise start itself: it asks the SuperNode's Runtime API for ClientApp
tasks and runs each one in a child forked from a parent that has already imported torch,
Flower and fedhet and that holds the node's partition in memory (`client_app._worlds`). The
child runs Flower's own `run_clientapp` for the task token and exits, so every task still gets
a separate process (Flower's isolation contract) without paying for the imports again.

    flower-supernode --isolation process --port 9100 ...
    python -m fedhet.deploy.worker --runtime-api-address 127.0.0.1:9100 --insecure

The first task on a node announces its run settings to the parent through a pipe; the parent
then builds the same partition so that later children inherit it (a partition cached per
process). The runner exits when the SuperNode's Runtime API has been unreachable for
`--max-wait` seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flwr.proto.runtime_pb2 import AcquireTaskResponse
    from flwr.supercore.runtime import RuntimeHttpClient

POLL_S = float(os.environ.get("FEDHET_WORKER_POLL_S", "0.1"))
"""Seconds between two requests for a task (each is an HTTP call to the SuperNode)."""


def _run_task(address: str, token: str, insecure: bool, announce_fd: int) -> int:
    """In the forked child: run one ClientApp task with Flower's own task runner."""
    # optional extra: fedhet[flower]
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    # needs the optional extra fedhet[flower]
    from fedhet.deploy import client_app

    client_app.announce = lambda settings: os.write(announce_fd, (json.dumps(settings) + "\n").encode())
    profile_dir = os.environ.get("FEDHET_WORKER_PROFILE", "")  # a directory: one profile per task
    profiler = None
    if profile_dir:
        # opt-in profiling only
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        run_clientapp(runtime_api_address=address, token=token, insecure=insecure,
                      certificates=None, parent_pid=None, runtime_dependency_install=False)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, f"task-{os.getpid()}.prof"))
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(address: str, insecure: bool = True, max_wait: float = 60.0,
          node_pid: int | None = None) -> int:
    """Poll `address` (a SuperNode's Runtime API) for ClientApp tasks, one forked child each.

    While the Runtime API does not answer, wait as long as the SuperNode process `node_pid`
    lives (it may still be starting or reconnecting), else at most `max_wait` s.
    """
    import torch  # noqa: F401  (imported once here, inherited by every child)
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType

    # needs the optional extra fedhet[flower]
    from fedhet.deploy import client_app
    from fedhet.deploy.node import shorten_pull_backoff

    shorten_pull_backoff()
    client = _runtime_client(address, insecure)
    read_fd, write_fd = os.pipe()
    pending = b""
    last_ok = time.monotonic()
    while True:
        try:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            last_ok = time.monotonic()
        except Exception as e:  # noqa: BLE001 - any transport error means "not reachable now"
            node_gone = node_pid is not None and not _alive(node_pid)
            if node_gone or (node_pid is None and time.monotonic() - last_ok > max_wait):
                why = f"its SuperNode (PID {node_pid}) exited" if node_gone else \
                    f"unreachable for {max_wait:.0f} s"
                print(f"fedhet worker: the SuperNode's Runtime API at {address}: {why} "
                      f"({type(e).__name__}); exiting", file=sys.stderr)
                return 1
            time.sleep(0.5)
            continue
        if res.HasField("task") and res.token:
            _fork_task(address, res, insecure, read_fd, write_fd)
        pending = _learn_worlds(read_fd, pending, client_app.build_world)
        time.sleep(POLL_S)


def _runtime_client(address: str, insecure: bool) -> RuntimeHttpClient:
    """A client of the SuperNode's Runtime API at `address` that tries each call once (the
    poll loop of `serve` is the retry)."""
    # needs the optional extra fedhet[flower]
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    invoker = make_simple_http_retry_invoker()
    invoker.max_tries = 1
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure, root_certificates=None, retry_invoker=invoker,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
    )


def _fork_task(address: str, res: AcquireTaskResponse, insecure: bool, read_fd: int, write_fd: int) -> None:
    """Run the task `res` acquired in a child forked from this warm parent (`_run_task`: Flower's
    own `run_clientapp`), wait for it and say how long it ran."""
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        code = 1
        try:
            code = _run_task(address, res.token, insecure, write_fd)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    t0 = time.monotonic()
    _, status = os.waitpid(pid, 0)
    print(f"fedhet worker: task {res.task.task_id} ran in PID {pid} for "
          f"{time.monotonic() - t0:.2f} s (wait status {status})", file=sys.stderr, flush=True)


def _learn_worlds(read_fd: int, pending: bytes, build_world: Callable[[Any], Any]) -> bytes:
    """The parent learns the settings of new runs that children announced on the pipe and
    builds their partition once (`build_world`), so later children inherit it; returns the
    start of a line not yet complete."""
    while select.select([read_fd], [], [], 0)[0]:
        pending += os.read(read_fd, 65536)
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        with contextlib.suppress(Exception):  # a bad world fails in the task, not here
            build_world(json.loads(line))
    return pending


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedhet.deploy.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--runtime-api-address", required=True, help="the SuperNode's --host:--port")
    ap.add_argument("--insecure", action="store_true", help="plain HTTP to the Runtime API")
    ap.add_argument("--max-wait", type=float, default=60.0,
                    help="exit after the Runtime API was unreachable this many seconds")
    ap.add_argument("--node-pid", type=int,
                    help="the SuperNode's PID: wait for its Runtime API while it lives, exit when it ends")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # after OMP_NUM_THREADS is set: torch reads it when first imported
    import torch

    torch.set_num_threads(1)
    return serve(args.runtime_api_address, insecure=args.insecure, max_wait=args.max_wait,
                 node_pid=args.node_pid)


if __name__ == "__main__":
    sys.exit(main())
