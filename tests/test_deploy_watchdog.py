"""`fedhet deploy local` notices what goes wrong: a process of the federation that dies (the
ServerApp killed with SIGKILL, a SuperNode that cannot reach its SuperLink), an error the
server app wrote, and clients dropped during the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install fedhet[flower])")

from fedhet.deploy.launch import LocalFederation  # noqa: E402
from fedhet.deploy.process_tree import (  # noqa: E402
    alive,
    children,
    describe_status,
    named_descendants,
    stop_tree,
    wait_status,
)
from fedhet.deploy.watchdog import Watchdog, wait_for_run  # noqa: E402
from fedhet.errors import FedhetError  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_exit_status_of_a_killed_process_that_is_not_our_child():
    """The ServerApp is the SuperLink's grandchild: its status is read from the zombie."""
    code = ("import subprocess, time\n"
            "p = subprocess.Popen(['sleep', '60'])\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while wait_status(pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert describe_status(wait_status(pid)) == "killed by SIGKILL"
    finally:
        parent.kill()
        parent.wait()
    assert describe_status(3) == "exit code 3" and describe_status(None) == "exit code unknown"


def test_a_process_the_server_app_forks_is_not_taken_for_the_server_app(tmp_path):
    """Flower's ServerApp runs `uname -p` and `file -b`: between fork and exec the child has
    the ServerApp's command line, then it exits. A healthy run went on being reported as "the
    ServerApp died" when the watchdog looked in that window (CI, stop 28). Here the window is
    stretched: the stand-in ServerApp forks a child that keeps its command line for 1 s and
    then stays a zombie; only the stand-in's own death ends the run."""
    app = ("import os, sys, time\n"
           "child = os.fork()\n"
           "if child == 0:\n"
           "    time.sleep(1.0)\n"
           "    os._exit(0)\n"
           "print('fork', child, flush=True)\n"
           "time.sleep(60)\n")  # never reaps the child
    superlink = ("import subprocess, sys, time\n"
                 f"p = subprocess.Popen([sys.executable, '-c', {app!r}, 'flwr-' + 'serverapp'])\n"
                 "print('app', p.pid, flush=True)\n"
                 "time.sleep(60)\n")
    fed = LocalFederation(1, workdir=tmp_path)
    fed.logs.mkdir(parents=True)
    idle = subprocess.Popen(["sleep", "60"])
    watchdog = Watchdog(fed, idle, echo=lambda _: None)
    fed.superlink = subprocess.Popen([sys.executable, "-c", superlink], stdout=subprocess.PIPE,
                                     text=True)
    try:
        pids = dict(fed.superlink.stdout.readline().split() for _ in range(2))  # either order
        server, forked = int(pids["app"]), int(pids["fork"])
        saw_the_fork = False
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            saw_the_fork |= "flwr-serverapp" in _cmdline(forked)
            watchdog.check()  # the fork lives, then exits: no error
            time.sleep(0.05)
        assert saw_the_fork and not alive(forked)
        assert list(watchdog.serverapps) == [server]
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(FedhetError, match=rf"the ServerApp \(flwr-serverapp, PID {server}\) died"):
            watchdog.check()
    finally:
        for proc in (fed.superlink, idle):
            stop_tree(proc)
        fed.superlink = None


def test_server_error_ends_the_wait_with_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "error.txt").write_text("Traceback (most recent call last):\n  ...\nValueError: boom\n")
    idle = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(FedhetError) as e:
            wait_for_run(out, 5, [idle, idle], tmp_path)
    finally:
        idle.kill()
        idle.wait()
    assert "\n" not in str(e.value)
    assert "ValueError: boom" in str(e.value) and str(out / "error.txt") in str(e.value)


def test_flwr_run_that_ends_without_a_result_is_an_error(tmp_path):
    done = subprocess.Popen(["true"])
    done.wait()
    idle = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(FedhetError, match=rf"flwr run \(PID {done.pid}\) ended with exit code 0"):
            wait_for_run(tmp_path, 10, [done, idle], tmp_path)
    finally:
        idle.kill()
        idle.wait()


def test_server_app_lines_are_echoed_as_they_happen(tmp_path):
    fed = LocalFederation(2, workdir=tmp_path)
    fed.logs.mkdir(parents=True)
    log = fed.logs / "flwr-run.log"
    log.write_text("INFO : Start `flwr-serverapp` process\nfedhet: 2 SuperNodes joined in 1.0 s\n")
    seen: list[str] = []
    idle = subprocess.Popen(["sleep", "30"])
    try:
        watchdog = Watchdog(fed, idle, echo=seen.append)
        watchdog.check()
        with log.open("a") as f:
            f.write("fedhet: round 2: dropped client 1 (SuperNode 7): no reply within 5 s; left out")
        watchdog.check()  # a partial line waits for its end
        with log.open("a") as f:
            f.write(" of the rest of the run\n")
        watchdog.check()
    finally:
        idle.kill()
        idle.wait()
    assert seen == ["fedhet: 2 SuperNodes joined in 1.0 s",
                    "fedhet: round 2: dropped client 1 (SuperNode 7): no reply within 5 s; left out "
                    "of the rest of the run"]


@pytest.mark.parametrize("address", ["127.0.0.1:1", "no-such-host.invalid:9093"])
def test_supernode_that_cannot_reach_the_superlink_is_named_with_its_address(tmp_path, address):
    """A real `flower-supernode` pointed at a closed port / an unresolvable host: a warning
    with the address while it retries, then the error when it gives up."""
    fed = LocalFederation(1, workdir=tmp_path, node_max_wait=3)
    seen: list[str] = []
    idle = subprocess.Popen(["sleep", "300"])  # stands in for `flwr run`
    try:
        node = fed.start_node(0, superlink=address)
        watchdog = Watchdog(fed, idle, echo=seen.append)
        deadline = time.monotonic() + 120
        with pytest.raises(FedhetError) as e:
            while time.monotonic() < deadline:
                watchdog.check()
                time.sleep(0.2)
    finally:
        fed.stop()
        idle.kill()
        idle.wait()
    message = str(e.value)
    assert "\n" not in message
    assert f"SuperNode 0 (PID {node.pid}) died with exit code" in message
    assert f"could not reach the SuperLink at {address}" in message
    assert any(f"SuperNode 0 (PID {node.pid}) cannot reach the SuperLink at {address}" in s
               for s in seen), seen


def test_killing_the_server_app_ends_deploy_local_at_once(tmp_path):
    """`kill -9` of the ServerApp mid-run: `fedhet deploy local` exits non-zero within seconds
    with one line naming it, and leaves no process behind."""
    cmd = [sys.executable, "-m", "fedhet", "deploy", "local", "-a", "fedavg", "-d", "digits",
           "-n", "2", "-r", "200", "--set", "lr=0.1", "--out", str(tmp_path / "out"),
           "--keep-logs", str(tmp_path / "fed")]
    env = {**os.environ, "PYTHONPATH": SRC, "FLWR_TELEMETRY_ENABLED": "0"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 300
        server = None
        while server is None and time.monotonic() < deadline and proc.poll() is None:
            metrics = tmp_path / "out" / "metrics.csv"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # round 1 done
                started = children(proc.pid)
                apps = named_descendants(proc.pid, "flwr-serverapp")  # not a fork of it
                server = apps[0] if apps else None
            time.sleep(0.2)
        assert server is not None, f"the run did not start: {proc.stderr.read() if proc.poll() else ''}"
        os.kill(server, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            stop_tree(proc)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: the ServerApp (flwr-serverapp, PID {server}) died")
    # its status is read from the zombie; "unknown" if its parent reaped it first
    assert ("killed by SIGKILL" in lines[0] or "exit code unknown" in lines[0]) and "Traceback" not in err
    assert elapsed < 30, elapsed
    time.sleep(0.5)
    assert not [p for p in started if alive(p) and p != server], "Flower processes left running"
    assert not json.loads((tmp_path / "out" / "summary.json").read_text()).get("finished") \
        if (tmp_path / "out" / "summary.json").exists() else True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_supernode_dying_mid_run_is_a_line_not_the_end_of_the_run(tmp_path):
    """Before the server app said the nodes joined, a dead SuperNode ends the run (the server
    would only wait for it); after, it is one line, its worker is stopped with it and the
    death is recorded for the server app. A dead worker takes its SuperNode out the same way."""
    fed = LocalFederation(2, workdir=tmp_path)
    fed.logs.mkdir(parents=True)
    (fed.logs / "flwr-run.log").write_text("")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.csv").write_text("round\n0\n1\n")  # round 2 in flight
    for i in (0, 1):
        fed.nodes[i] = fed._spawn(f"supernode-{i}", ["sleep", "60"], f"SuperNode {i}")
        fed.workers[i] = fed._spawn(f"clientapp-{i}", ["sleep", "60"], f"ClientApp worker {i}")
    idle = subprocess.Popen(["sleep", "60"])
    seen: list[str] = []
    try:
        watchdog = Watchdog(fed, idle, echo=seen.append, out=tmp_path / "out")
        early = fed.nodes[0].pid
        os.kill(early, signal.SIGKILL)
        fed.nodes[0].wait(timeout=10)
        with pytest.raises(FedhetError, match=rf"SuperNode 0 \(PID {early}\) died with killed by SIGKILL"):
            watchdog.check()

        with (fed.logs / "flwr-run.log").open("a") as f:
            f.write("fedhet: 2 SuperNodes joined in 1.0 s\n")
        watchdog.echo_news()
        worker, node = fed.workers[0].pid, fed.nodes[0].pid
        watchdog.check()  # the joined line: from now on a node's death is not fatal
        assert seen[-1].startswith("fedhet: ") and f"SuperNode 0 (PID {node}) died with killed by " \
            "SIGKILL during round 2; client 0 is dropped from the rounds it misses" in seen[-1]
        assert 0 not in fed.nodes and 0 not in fed.workers and not alive(worker)

        node1, worker1 = fed.nodes[1].pid, fed.workers[1].pid
        os.kill(worker1, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while fed.workers.get(1) is not None and fed.workers[1].poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        watchdog.check()
        assert f"SuperNode 1 (PID {node1}) (its ClientApp worker, PID {worker1}) died" in seen[-1]
        assert not fed.nodes and not fed.workers and not alive(node1)
        events = [json.loads(line) for line in fed.events_file.read_text().splitlines()]
        assert [(e["partition"], e["pid"]) for e in events] == [(0, node), (1, node1)]
    finally:
        fed.stop(grace=1.0)
        idle.kill()
        idle.wait()
