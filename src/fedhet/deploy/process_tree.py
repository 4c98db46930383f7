"""The processes a local Flower federation starts, read from /proc: a process's descendants
(`children`, `named_descendants`), whether it lives (`alive`), its exit status as `Popen`
reports it, also for a zombie that is not our child (`wait_status`, `describe_status`), and a
process tree stopped (`stop_tree`: SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from fedhet.procs import cmdline, stat


def children(pid: int) -> list[int]:
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
    pids = [proc.pid, *children(proc.pid)] if proc.poll() is None else children(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        if not any(alive(p) for p in pids):
            return


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def parent_of(pid: int) -> int:
    """The parent PID of `pid` (0 once it is gone)."""
    fields = stat(pid)
    return int(fields[1]) if fields else 0


def named_descendants(pid: int, name: str) -> list[int]:
    """Descendants of `pid` whose command line names `name` and whose parent's does not. A
    process forked by one of them carries its command line until it execs (Flower's processes
    run `uname -p` and `file -b` for Python's `platform`), then exits: it is not one of them."""
    return [p for p in children(pid) if name in cmdline(p) and name not in cmdline(parent_of(p))]


def describe_status(status: int | None) -> str:
    """'exit code N' or 'killed by SIGKILL' for a Popen return code (negative = signal)."""
    if status is None:
        return "exit code unknown"
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-status).name}"
        return f"killed by signal {-status}"
    return f"exit code {status}"


def wait_status(pid: int) -> int | None:
    """Exit status of a zombie that is not our child (/proc stat field 52), as Popen reports it."""
    fields = stat(pid)
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    raw = int(fields[49])
    return -(raw & 0x7F) if raw & 0x7F else raw >> 8
