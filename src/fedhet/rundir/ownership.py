"""Ownership and exclusive use of the directories fedhet writes (run and grid directories).

Three rules keep a user's files safe:

- **A marker.** Every directory fedhet creates for a run or a grid gets a `.fedhet` file naming
  its kind. `--force` only ever clears a directory that carries the marker, and then removes only
  the entries fedhet writes there (`OWNED_NAMES`, its temporary files, and the subdirectories it
  makes); anything else is left in place and named in a warning. A run replaced with `--force`
  is first set aside in the directory (`set_aside`) and removed only once the new run has saved
  a round; a new run that fails before puts it back (`put_back`).
- **No dangerous targets.** `/`, the home directory, the current directory and any of its
  ancestors are refused outright, marker or not.
- **One writer.** A process that writes a directory holds an exclusive `flock` on
  `.fedhet.lock` inside it for as long as it writes; a second process gets one line naming the
  holder's PID. The kernel releases the lock when the holder dies (kill -9 included), so a
  stale lock file never blocks a resume.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fedhet.errors import FedhetError

MARKER = ".fedhet"
LOCK = ".fedhet.lock"

OWNED_NAMES = frozenset({
    MARKER, LOCK, "config.json", "metrics.csv", "diagnostics.jsonl", "summary.json",
    "checkpoint.pt", "checkpoint.prev.pt", "report.html", "report.md", "results.csv",
    "summary.md", "comparison.md", "grid.toml", "grid.json", "errors.txt", "deploy.json", "plan.json",
    ".fedhet-report.json",
})
"""Files fedhet writes into a run or grid directory (removed by `--force`)."""

REPLACED = ".fedhet-replaced"
"""Where `fedhet run --force` keeps the run it replaces until the new run saves a round."""

OWNED_DIRS = frozenset({"tensorboard", "runs", "figures", "flower-logs", "client_states", REPLACED})
"""Subdirectories fedhet creates inside a run or grid directory (removed by `--force`)."""

OWNED_SUFFIXES = (".png",)
"""Plots `fedhet report` writes next to the results."""


def is_ours(path: Path) -> bool:
    """True when `path` is a directory fedhet created (it holds the marker)."""
    return (Path(path) / MARKER).is_file()


def kind(path: Path) -> str | None:
    """The kind the marker of `path` names (`run`, `grid`), or None (no marker, or one that does
    not say)."""
    try:
        record = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    value = record.get("kind") if isinstance(record, dict) else None
    return value if isinstance(value, str) else None


def _owned(entry: Path) -> bool:
    name = entry.name
    if name in OWNED_NAMES or (entry.is_dir() and name in OWNED_DIRS):
        return True
    if name.endswith(OWNED_SUFFIXES) and entry.is_file():
        return True
    # temporary files of atomic writes: `.<owned name>.<random>`
    return name.startswith(".") and any(name.startswith(f".{n}.") for n in OWNED_NAMES)


def check_removable(path: Path) -> None:
    """Refuse to clear `/`, the home directory, the current directory or one of its ancestors."""
    target = Path(path).resolve()
    cwd = Path.cwd().resolve()
    home = Path.home().resolve()
    if target == Path(target.anchor) or target in (home, cwd) or target in cwd.parents:
        what = "the root directory" if target == Path(target.anchor) else (
            "your home directory" if target == home else
            "the current directory" if target == cwd else "a parent of the current directory"
        )
        raise FedhetError(
            f"refusing to clear {path} ({what}); choose a new directory for --out"
        )


def clear(path: Path, warn: Callable[[str], object] = print) -> None:
    """Remove what fedhet wrote in the fedhet directory `path` (for `--force`).

    Raises when `path` is not a directory fedhet made or is a dangerous target; entries fedhet
    did not write stay and are named in a warning. The lock file stays: its holder keeps it.
    """
    for entry in _written(path, warn, keep=()):
        _remove(entry)


def set_aside(path: Path, warn: Callable[[str], object] = print) -> None:
    """`clear`, except that what fedhet wrote moves into `path/REPLACED` (renames, on the same
    disk) until the new run saves a round (`drop_replaced`) or fails first (`put_back`). When
    `REPLACED` is already there (a replacement killed before it saved a round), it keeps the run
    it holds and that attempt's files are removed."""
    aside = Path(path) / REPLACED
    fresh = not aside.is_dir()
    entries = list(_written(path, warn, keep=(REPLACED,)))
    aside.mkdir(exist_ok=True)
    for entry in entries:
        if fresh:
            os.replace(entry, aside / entry.name)
        else:
            _remove(entry)
    fsync_dir(Path(path))


def put_back(path: Path) -> None:
    """The run `set_aside` kept, back in `path` in place of what the new run wrote."""
    aside = Path(path) / REPLACED
    for entry in _written(path, lambda _: None, keep=(REPLACED,)):  # warned when set aside
        _remove(entry)
    for entry in aside.iterdir():
        os.replace(entry, Path(path) / entry.name)
    aside.rmdir()
    fsync_dir(Path(path))


def drop_replaced(path: Path) -> None:
    """Remove the run `set_aside` kept (the new run has saved a round)."""
    aside = Path(path) / REPLACED
    if aside.is_dir():
        shutil.rmtree(aside)


def _written(path: Path, warn: Callable[[str], object], keep: tuple[str, ...]) -> list[Path]:
    """The entries fedhet wrote in its directory `path`, but the lock, the marker and `keep`;
    refuses a directory fedhet did not make or a dangerous one, and warns of foreign entries."""
    path = Path(path)
    check_removable(path)
    if not is_ours(path):
        raise FedhetError(
            f"refusing to clear {path}: it was not created by fedhet (no {MARKER} marker); "
            "remove it yourself or choose another --out"
        )
    foreign: list[Path] = []
    out: list[Path] = []
    for entry in path.iterdir():
        if entry.name in (LOCK, MARKER, *keep):
            continue
        (out if _owned(entry) else foreign).append(entry)
    if foreign:
        names = sorted(e.name for e in foreign)
        warn(f"warning: left {len(names)} file(s) fedhet did not write in {path}: "
             f"{', '.join(names[:5])}{' …' if len(names) > 5 else ''}")
    return out


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def remove_temporaries(path: Path) -> list[str]:
    """Delete temporary files that a killed writer left (`.<owned name>.<random>`) in `path`."""
    removed: list[str] = []
    if not Path(path).is_dir():
        return removed
    for entry in Path(path).iterdir():
        # fedhet's own dot-files (the marker, the lock, a report's record) are no temporaries
        if entry.name.startswith(".") and entry.name not in OWNED_NAMES and _owned(entry) \
                and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


def mark(path: Path, kind: str) -> None:
    """Create `path` if needed and write the marker that says fedhet made it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    marker = path / MARKER
    if not marker.exists():
        marker.write_text(json.dumps({"kind": kind, "version": 1}) + "\n")


def _holder(lock_path: Path) -> str:
    try:
        pid = lock_path.read_text().strip()
    except OSError:
        pid = ""
    return f"process {pid}" if pid.isdigit() else "another process"


@contextmanager
def exclusive(path: Path, what: str = "run", flag: str = "--out") -> Iterator[None]:
    """Hold an exclusive lock on directory `path` (created if missing) while the body runs;
    `flag`: the option that chooses another directory, named when the lock is held."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    lock_path = path / LOCK
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FedhetError(
                f"{path} is in use by {_holder(lock_path)} (another fedhet {what}); wait for it "
                f"to finish or choose another {flag}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def fsync_dir(path: Path) -> None:
    """Make renames inside `path` durable (after `os.replace`)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
