"""Processes as Linux's /proc shows them: what the Flower launcher's watchdog
(`fedhet.deploy.launch`) and the private local Ray's clean-up (`fedhet.runs.raylink`)
read to find the processes they started, and to recognise them again by their start time (a
reused PID has another); and the signals a long command handles while it runs."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def handling(signals: Iterable[signal.Signals], handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """`handler` for each of `signals` for the length of the block, the previous handlers back
    after it (also when it raises)."""
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)

GONE = ("Z", "X")
"""Process states of a process that has ended (a zombie not yet reaped, or dead)."""


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cmdline(pid: int) -> str:
    """The command line of `pid`, its arguments joined by spaces ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot; None once it has ended (zombies too)."""
    fields = stat(pid)
    return int(fields[19]) if fields and fields[0] not in GONE else None


def process_table(live_only: bool = False) -> dict[int, tuple[int, int, int]]:
    """Every process as PID -> (parent PID, session id, start time in clock ticks); with
    `live_only`, those that have ended (zombies) left out."""
    table: dict[int, tuple[int, int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat(int(entry.name))
        if fields is None or (live_only and fields[0] in GONE):
            continue
        try:
            table[int(entry.name)] = (int(fields[1]), int(fields[3]), int(fields[19]))
        except (IndexError, ValueError):
            continue
    return table
